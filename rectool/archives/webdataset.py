"""Webdataset shards as ROOT: a folder of `.tar` shards, a glob, or a brace pattern.

`expand_shards` expands ROOT (`shards/`, `shards/*.tar`, `shards/train-{000000..000099}.tar`,
`{a,b}`) into shard files, sorted; `index_webdataset` indexes each (`tar.index_tar`) into one
`MemberIndex` whose names are `SHARD/MEMBER`, SHARD the shard's file name: so the list's
paths name the shard and the member, and the extracted tree (each shard extracted into a
folder of its name) packs from the same list.

Which identity a sample belongs to (`sample_identity`), in this order:

1. the folder part of its key: `n000002/0001_01.jpg` in a shard (key `n000002/0001_01`) is
   identity `n000002`, as in a tree;
2. else its `.cls` member: `000123.jpg` with `000123.cls` holding `n000002` (or `17`) is
   identity `n000002` (`17`); identities are labelled in name order, as folders are;
3. else it belongs to none, and `list` passes it over as `outside_identity`.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Sequence
from typing import BinaryIO

from .members import FILE, ArchiveError, MemberIndex

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")
MAX_SHARDS = 1_000_000
# A `.cls` member holds a class name or number: a few bytes.
MAX_CLASS_BYTES = 4096


def expand_braces(pattern: str) -> list[str]:
    """Return a pattern's brace expansions: `{000..002}` (zero-padded ranges), `{a,b}`.

    Bounded as a whole, not per brace: `{0..999999}{0..999999}` would be 10**12 names, and
    `{a,b}` thirty times 10**9: over `MAX_SHARDS` names, or twice as many patterns made on
    the way, is refused.
    """
    names = 1  # the braces in sight multiply: refuse before making any of them
    for low, high in _RANGE.findall(pattern):
        names *= max(int(high) - int(low) + 1, 0)
    for choice in _CHOICE.findall(pattern):
        names *= choice.count(",") + 1
    if names > MAX_SHARDS:
        raise ArchiveError(f"{pattern}: expands to over {MAX_SHARDS:,} shard names")
    expanded: list[str] = []
    pending, made = [pattern], 1
    while pending:
        current = pending.pop()
        if any(int(high) < int(low) for low, high in _RANGE.findall(current)):
            continue  # a range of none: the pattern names nothing
        match = _RANGE.search(current) or _CHOICE.search(current)
        if match is None:
            expanded.append(current)
            if len(expanded) > MAX_SHARDS:
                raise ArchiveError(f"{pattern}: expands to over {MAX_SHARDS:,} shard names")
            continue
        if match.re is _RANGE:
            low, high = match.group(1), match.group(2)
            if int(high) - int(low) >= MAX_SHARDS:
                raise ArchiveError(f"{pattern}: a range of over {MAX_SHARDS:,} shards")
            count = max(int(high) - int(low) + 1, 0)
        else:
            count = match.group(1).count(",") + 1
        made += count
        if made > 2 * MAX_SHARDS:  # names and the patterns on the way to them
            raise ArchiveError(f"{pattern}: expands to over {MAX_SHARDS:,} shard names")
        if match.re is _RANGE:
            width = len(low) if low.startswith("0") else 0
            values = [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
        else:
            values = match.group(1).split(",")
        head, tail = current[: match.start()], current[match.end() :]
        pending.extend(head + value + tail for value in reversed(values))
    return expanded


def _folder_of(root: str) -> str:
    """Return the folder shard names are relative to: ROOT, or a pattern's fixed folder."""
    if os.path.isdir(root):
        return root
    fixed = root.split("{", 1)[0].split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
    return os.path.dirname(fixed) or "."


def expand_shards(root: str) -> tuple[str, list[str]]:
    """Return (the folder shard names are relative to, the shard paths in name order)."""
    if os.path.isdir(root):
        paths = [entry.path for entry in os.scandir(root) if entry.name.endswith(".tar")]
    else:
        paths = [p for expanded in expand_braces(root) for p in glob.glob(expanded)]
    paths = sorted(set(paths))
    if not paths:
        raise ArchiveError(f"{root}: no webdataset shards (.tar files) match")
    for path in paths:
        if not path.endswith(".tar"):
            raise ArchiveError(f"{path}: a webdataset shard must be an uncompressed .tar")
    return _folder_of(root), paths


def index_webdataset(root: str, files: Sequence[BinaryIO], paths: Sequence[str]) -> MemberIndex:
    """Return one index over the shards `paths` of ROOT (as `expand_shards` gave them), open
    as `files`: member names are `SHARD/MEMBER`, and member i of shard k has part k."""
    from .tar import index_tar

    folder = _folder_of(root)
    index = MemberIndex(root)
    for part, (path, file) in enumerate(zip(paths, files)):
        shard = os.path.relpath(path, folder)
        members = index_tar(file.fileno(), os.fstat(file.fileno()).st_size, path)
        for i in range(len(members)):
            index.add(
                f"{shard}/{members.names[i]}",
                members.kinds[i],
                members.offsets[i],
                members.sizes[i],
                part=part,
            )
    return index  # no root folder: each name starts with its shard's


def sample_key(name: str) -> tuple[str, str]:
    """Return (key, extension) of a member name inside a shard, as webdataset splits them:
    the key runs to the first dot of the file name."""
    folder, _, file = name.rpartition("/")
    stem, _, ext = file.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


def sample_identity(
    index: MemberIndex, shard: str, key: str, read: Callable[[int], bytes]
) -> str | None:
    """Return the identity of sample `key` of `shard` (see the module's docstring), or None.

    `read(i)` returns member i's bytes (a `.cls` member, at most `MAX_CLASS_BYTES`).
    """
    if "/" in key:
        return key.split("/", 1)[0]
    i = index.position(f"{shard}/{key}.cls")
    if i is None or index.kinds[i] != FILE or index.sizes[i] > MAX_CLASS_BYTES:
        return None
    text = read(i).decode("utf-8", "replace").strip()
    return text or None
