"""One door in: how rectool's commands open the files they read.

Every input is opened by `reader.open_regular` (a regular file only, opened without waiting;
a size bound; `O_NOFOLLOW` where no link is expected). This module adds, for rectool's own
commands, file objects on top of it and the one rule for paths named inside a dataset: they
stay inside its folder, no exceptions (`dataset_path`, and `within=FOLDER`, which checks the
real path of the file actually opened, so a link cannot lead out).
`tests/test_input_door.py` fails when a module opens a file for reading another way.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO, overload

from ..errors import InputError, RectoolError
from ..reader import open_regular

if TYPE_CHECKING:
    from _typeshed import StrPath

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # where no link is expected (ELOOP on one)


def _opened_path(fd: int, path: StrPath) -> str:
    """Return the real path of the file open as `fd` (Linux: where the kernel opened it)."""
    proc = f"/proc/self/fd/{fd}"
    return os.path.realpath(proc if os.path.islink(proc) else path)


def is_inside(real: str, folder: StrPath) -> bool:
    """Return whether the real path `real` is the real path of `folder` or lies below it."""
    folder = os.path.realpath(folder)
    return real == folder or real.startswith(os.path.join(folder, ""))


def open_checked(
    path: StrPath,
    what: str,
    max_bytes: int | None = None,
    follow: bool = True,
    within: StrPath | None = None,
) -> tuple[int, os.stat_result]:
    """Return (fd, stat) as `open_regular` does; with `within`, a folder, refuse a file whose
    real path is outside it."""
    if not follow and os.path.islink(path):
        raise InputError(f"{os.fspath(path)}: cannot open the {what} (is a symbolic link)")
    fd, st = open_regular(os.fspath(path), what, max_bytes, 0 if follow else NOFOLLOW)
    if within is not None:
        real = _opened_path(fd, path)
        if not is_inside(real, within):
            os.close(fd)
            raise RectoolError(
                f"{os.fspath(path)}: the {what} leads outside {os.fspath(within)} (to {real}); "
                "it must be inside that folder"
            )
    return fd, st


@overload
def open_input(
    path: StrPath, what: str, encoding: None = None, newline: str | None = None, **checks: Any
) -> BinaryIO: ...


@overload
def open_input(
    path: StrPath, what: str, encoding: str, newline: str | None = None, **checks: Any
) -> TextIO: ...


def open_input(
    path: StrPath, what: str, encoding: str | None = None, newline: str | None = None, **checks: Any
) -> BinaryIO | TextIO:
    """Return a file object for reading `path`, opened by `open_checked` (`checks`: its
    `max_bytes`, `follow`, `within`): binary, or text in `encoding` (`newline` as `open`'s)."""
    fd, _ = open_checked(path, what, **checks)
    if encoding is None:
        return os.fdopen(fd, "rb")
    return os.fdopen(fd, "r", encoding=encoding, newline=newline)


def read_regular(path: StrPath, what: str, **checks: Any) -> tuple[bytes, os.stat_result]:
    """Return (bytes, stat) of a file opened by `open_checked`: at most the size it had when
    opened, so memory is bounded by `max_bytes`."""
    fd, st = open_checked(path, what, **checks)
    with os.fdopen(fd, "rb") as f:
        return f.read(st.st_size), st


# A state file rectool writes to resume a run holds its options and digests: a few KB.
MAX_STATE_BYTES = 1 << 20


def read_state(path: StrPath, what: str) -> dict[str, Any]:
    """Return the JSON object of a state file an interrupted run left (pack's, repack's):
    a regular file, not a link, at most `MAX_STATE_BYTES`; raise `InputError` naming it when
    it is not UTF-8 JSON or not an object. The caller checks its fields."""
    data, _ = read_regular(path, what, max_bytes=MAX_STATE_BYTES, follow=False)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
        raise InputError(f"{os.fspath(path)}: not a {what}: {exc}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{os.fspath(path)}: not a {what}: not a JSON object")
    return doc


def dataset_path(folder: StrPath, name: StrPath, what: str) -> str:
    """Return the path of a file that a dataset names (`name`, from its manifest or a
    failures file), inside `folder`; raise `RectoolError` for a name that is absolute or
    climbs out with `..`. Open it with `within=folder`, which also refuses a link leading out.
    """
    text = os.fspath(name)
    parts = text.replace(os.sep, "/").split("/")
    if not text or os.path.isabs(text) or ".." in parts or "\0" in text:
        raise RectoolError(
            f"{os.path.join(os.fspath(folder), '')}: the {what} {text!r} is not a path inside "
            "the dataset's folder (it must be, with no .. and not absolute)"
        )
    return os.path.join(os.fspath(folder), text)
