"""Multi-file outputs moved into place as one unit, through a journal written first.

After a crash at any instant the old output is whole (no journal yet) or `finish_commit` rolls
the journal forward to the new one. Part of the door out: callers import these from
`rectool.doors.output`.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..errors import RectoolError
from .faults import fault_point
from .files import (
    CLOEXEC,
    NOFOLLOW,
    fsync_folder,
    make_folders,
    remove,
    remove_quietly,
    rename,
    stage_file,
)
from .targets import check_target, claim

if TYPE_CHECKING:
    from _typeshed import StrPath

    from .files import Data


def commit(
    journal: str,
    moves: Iterable[tuple[StrPath, StrPath]],
    removals: Iterable[StrPath] = (),
    last: tuple[StrPath, StrPath] | None = None,
) -> None:
    """Move staged files into place as one unit; old or new output whole after any crash.

    `moves`: (staged, final) pairs; `removals`: old files the new output does not have;
    `last`: a (staged, final) pair moved after everything else (a manifest, which says the
    output is complete). The journal at `journal` is written first: once it exists the new
    output is committed, and `finish_commit` (which every writer of the output, and
    `verify`, runs when it finds the journal) completes what a crash interrupted.
    """
    doc = {
        "moves": [[os.fspath(staged), os.fspath(final)] for staged, final in moves],
        "removals": [os.fspath(r) for r in removals],
        "last": None if last is None else [os.fspath(last[0]), os.fspath(last[1])],
    }
    tmp = stage_file(journal, json.dumps(doc, indent=1) + "\n")
    rename(tmp, journal, "journal")
    fsync_folder(os.path.dirname(journal))
    _roll_forward(journal, doc)


def _roll_forward(journal: str, doc: dict[str, Any]) -> None:
    # Every step is idempotent: a move whose source is gone was done, a removal of a missing
    # file too; so a crash at any instant here is finished by running this again.
    last = doc.get("last")
    if last and os.path.exists(last[0]):
        remove(last[1])  # the old "complete" mark goes first: a half swap never looks whole
    folders: set[str] = set()
    for staged, final in doc["moves"]:
        if os.path.lexists(staged):
            rename(staged, final, "swap")
            folders.add(os.path.dirname(final))
    for old in doc["removals"]:
        fault_point("swap", old)
        remove(old)
    if last and os.path.lexists(last[0]):
        rename(last[0], last[1], "manifest")
        folders.add(os.path.dirname(last[1]))
    for folder in folders:
        fsync_folder(folder)
    remove(journal)
    for staged, _ in doc["moves"] + ([last] if last else []):
        try:
            os.rmdir(os.path.dirname(staged))  # a staging folder, now empty
        except OSError:
            pass


def read_journal(journal: str) -> dict[str, Any] | None:
    """Return the commit journal at `journal`, None when there is none."""
    try:
        fd = os.open(journal, os.O_RDONLY | NOFOLLOW | CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise RectoolError(f"{journal}: cannot read the commit journal ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise RectoolError(f"{journal}: not a regular file (a commit journal must be one)")
        data = f.read(64 << 20)
    try:
        doc = json.loads(data)
        ok = isinstance(doc, dict) and all(
            isinstance(doc.get(k), list) for k in ("moves", "removals")
        )
        ok = ok and all(
            isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m)
            for m in doc["moves"] + ([doc["last"]] if doc.get("last") else [])
        )
        ok = ok and all(isinstance(p, str) for p in doc["removals"])
    except (ValueError, RecursionError):
        ok = False
    if not ok:
        raise RectoolError(f"{journal}: not a rectool commit journal; remove it by hand")
    return doc


def finish_commit(journal: str) -> bool:
    """Complete the commit an interrupted run left at `journal`; return whether there was one.

    Only paths beside the journal (or in the hidden staging folder beside it) are touched.
    """
    doc = read_journal(journal)
    if doc is None:
        return False
    folder = os.path.realpath(os.path.dirname(journal) or ".")
    for path in [p for m in doc["moves"] for p in m] + doc["removals"] + (doc["last"] or []):
        real = os.path.realpath(os.path.dirname(path) or ".")
        if real != folder and os.path.dirname(real) != folder:
            raise RectoolError(f"{journal}: names {path}, outside its folder; remove it by hand")
    _roll_forward(journal, doc)
    return True


class OutputFiles:
    """Several user-named files written as one output (a list, its splits, its label map).

    `add(path, data)` stages each file beside its target; leaving the `with` block without an
    error commits them all through one journal (`commit`); an error removes what was staged
    and leaves the old files as they were. Two files at one place (`same_place`) are refused,
    by `check` before the work and by `add`: the later would replace the earlier.
    """

    def __init__(self, journal: str, overwrite: bool = False, what: str = "output") -> None:
        self.journal, self.overwrite, self.what = os.fspath(journal), overwrite, what
        self.staged: list[tuple[str, str]] = []
        # One output's files by place (`claim`): those checked before the work, those staged.
        self.checked: dict[str, tuple[str, str]] = {}
        self.places: dict[str, tuple[str, str]] = {}

    def __enter__(self) -> OutputFiles:
        finish_commit(self.journal)
        return self

    def check(self, path: StrPath) -> str:
        """Refuse `path` now (before any work) when it may not be written, or when a file
        checked before leads to the same place."""
        return claim(self.checked, path, self.overwrite, self.what, f"{self.what}'s other file")

    def add(self, path: StrPath, data: Data) -> str:
        path = claim(self.places, path, self.overwrite, self.what, f"{self.what}'s other file")
        make_folders(os.path.dirname(path))
        self.staged.append((stage_file(path, data), path))
        return path

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            try:
                if not self.overwrite:
                    for _, path in self.staged:
                        check_target(path, self.overwrite, self.what)  # appeared meanwhile
                commit(self.journal, self.staged)
                return
            except BaseException:
                if not os.path.lexists(self.journal):  # past the commit point: rolled forward
                    self._discard()  # by the next run, so what is staged must stay
                raise
        self._discard()

    def _discard(self) -> None:
        for tmp, _ in self.staged:
            remove_quietly(tmp)
        self.staged = []
