"""What a user-named output may replace: never a pack's file, a folder or a link, and an
existing file only with `overwrite`.

Part of the door out: callers import these from `rectool.doors.output`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import RectoolError, UsageError
from ..format.paths import PACK_FILE_ENDINGS, PackPaths

if TYPE_CHECKING:
    from _typeshed import StrPath


def pack_file_reason(path: str) -> str | None:
    """Return why the existing file at `path` belongs to a pack (None when it does not).

    A `.rec` or `.idx` with its other half beside it is a shard; any file that a manifest in
    the same folder names, or that ends like a pack's files next to a manifest, is a pack's.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        return None
    folder, name = os.path.split(path)
    stem, ext = os.path.splitext(path)
    if ext in (".rec", ".idx") and os.path.exists(stem + (".idx" if ext == ".rec" else ".rec")):
        return f"{name} is a shard of a pack ({os.path.basename(stem)}.rec/.idx)"
    if name.endswith(PACK_FILE_ENDINGS):
        try:
            manifests = [n for n in os.listdir(folder or ".") if PackPaths.is_manifest(n)]
        except OSError:
            manifests = []
        for manifest in manifests[:64]:
            base = PackPaths.of_manifest(manifest).prefix
            if name.startswith(base) and name.endswith(PACK_FILE_ENDINGS):
                return f"{name} belongs to the pack {os.path.join(folder, base)}"
    return None


def check_target(path: StrPath, overwrite: bool = False, what: str = "output") -> str:
    """Refuse to write the user-named `path` over what is there: a file without `overwrite`,
    a pack's file, a folder or a link (never followed). Return the path."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        return path
    if os.path.islink(path):
        raise RectoolError(f"{path}: is a symlink; refusing to write the {what} through it")
    if os.path.isdir(path):
        raise RectoolError(f"{path}: is a folder; give a file name for the {what}")
    reason = pack_file_reason(path)
    if reason is not None:
        raise RectoolError(
            f"{path}: exists and {reason}; refusing to replace it with the {what} "
            "(choose another name)"
        )
    if not overwrite:
        raise RectoolError(f"{path}: exists; use --overwrite to replace it")
    return path


def same_place(path: StrPath) -> str:
    """Return where `path` leads: two names of one output that lead to one place would
    replace each other (`a/./x`, `a/../a/x` and `link-to-a/x` are all `a/x`)."""
    return os.path.realpath(os.fspath(path))


def refuse_twice(path: StrPath, earlier: str, what: str) -> UsageError:
    """Return the error for `path`, a file of an output that leads where `earlier`, the
    `what`, does."""
    return UsageError(
        f"{os.fspath(path)}: is also the {what} ({earlier}); one would replace the other: "
        "give each file its own name"
    )


def claim(
    places: dict[str, tuple[str, str]], path: StrPath, overwrite: bool, what: str, known_as: str
) -> str:
    """Refuse `path` as `check_target` does, and when a file in `places` ({place: (path, what
    it is)}, one output's files so far) leads to the same place; else record it there as
    `known_as` and return it."""
    path = check_target(path, overwrite, what)
    place = same_place(path)
    if place in places:
        raise refuse_twice(path, *places[place])
    places[place] = (path, known_as)
    return path


def check_targets(targets: Iterable[tuple[StrPath, str]], overwrite: bool = False) -> list[str]:
    """Refuse the files of one output, each `(path, what)`, as `check_target` does, and two of
    them at one place (the later would silently replace the earlier). Return the paths."""
    places: dict[str, tuple[str, str]] = {}
    return [claim(places, path, overwrite, what, what) for path, what in targets]
