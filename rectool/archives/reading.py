"""What `pack` reads from an archive ROOT: a listed member's bytes, or why it is refused.

`open_member_reader(root, remaining)` returns None for a tree (pack reads files as ever), else
a reader with pack's two ways of reading: `read(path)` (worker threads: bytes or a refusal
reason) and `read_into(path, view)` (pass-through: the bytes placed in the block's buffer).

- `.tar`, `.zip` and webdataset shards: random access by the member index, on any thread
  (`pread`: no shared position).
- `.tar.gz`: read once, in archive order (`StreamReader`), with a bounded reorder buffer: a
  listed member met before its turn is kept until asked for, up to `REORDER_BYTES`. A list
  that `rectool list` wrote from the compressed archive is in archive order (see
  `archives/listing.py`), so the buffer stays empty; any other list works while the members it
  asks for out of order fit the buffer, and otherwise stops with an error that says so.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from ..reader import MAX_RECORD_BYTES
from .members import FILE, ArchiveError, MemberIndex, refusal
from .source import TAR_GZ, Archive, archive_kind, open_archive

if TYPE_CHECKING:
    from _typeshed import StrPath

    # (bytes placed in the view, the rest when the member did not fit, the refusal reason)
    ReadInto = tuple[int, bytes | None, str | None]

# Listed members read ahead of their turn from a compressed stream, at most.
REORDER_BYTES = 1 << 30
NOT_FOUND = "file not found (no such member in the archive)"


class MemberReader:
    """Listed members of an archive with random access (`.tar`, `.zip`, webdataset)."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive

    def read(self, path: str) -> bytes | str:
        """Return the bytes of the member at list path `path`, or why it is refused."""
        member = self.archive.index.find(path)
        if member is None:
            return NOT_FOUND
        return self.archive.read(member)

    def read_into(self, path: str, view: memoryview) -> ReadInto:
        """Place the member's bytes at the start of `view` (see the module's docstring)."""
        archive = self.archive
        member = archive.index.find(path)
        why = NOT_FOUND if member is None else refusal(member, MAX_RECORD_BYTES)
        if why is not None or member is None:
            return 0, None, why
        if not archive.in_place:
            return place(archive.read(member), view)
        n, rest = archive.read_into(member, view)
        return n, rest, None

    def close(self) -> None:
        """Close the archive."""
        self.archive.close()


def place(data: bytes | str, view: memoryview) -> ReadInto:
    """Return `data` placed at the start of `view` as `read_into` does (a str: refused)."""
    if isinstance(data, str):
        return 0, None, data
    room = len(view)
    n = min(room, len(data))
    view[:n] = data[:n]
    return n, (data[n:] if n == room else None), None


class StreamReader:
    """Listed members of a compressed tar, read once in archive order (see the module).

    Thread-safe: worker threads take turns on the one stream.
    """

    def __init__(self, archive: Archive, remaining: Iterable[str]) -> None:
        from .compressed import open_blocks
        from .tar import HeaderChecks, walk_tar

        self.archive = archive
        self.blocks = open_blocks(archive.files[0], archive.root)
        self._checks = HeaderChecks(archive.root)
        self._members = walk_tar(self.blocks, None, self._checks)
        self._seen = MemberIndex(archive.root)  # unsafe and repeated names refused as met
        self.wanted = collections.Counter(remaining)
        self._ahead: dict[str, bytes | str] = {}
        self._ahead_bytes = 0
        self._base: str | None = None  # the root folder every member lies in, once known
        self._lock = threading.Lock()

    def read(self, path: str) -> bytes | str:
        """Return the bytes of the member at list path `path`, or why it is refused."""
        with self._lock:
            if path in self._ahead:
                return self._use(path, self._ahead[path])
            for name, data in self._advance():
                if name == path:
                    return self._use(path, data)
                self._keep(name, data)
            return NOT_FOUND

    def _use(self, path: str, data: bytes | str) -> bytes | str:
        """Count one use of a member's bytes; keep them while the list names it again."""
        self.wanted[path] -= 1
        if self.wanted[path] > 0:
            self._keep(path, data)
        elif path in self._ahead:
            del self._ahead[path]
            self._ahead_bytes -= len(data)
        return data

    def _keep(self, name: str, data: bytes | str) -> None:
        if name in self._ahead:
            return
        self._ahead_bytes += len(data)
        if self._ahead_bytes > REORDER_BYTES:
            raise ArchiveError(
                f"{self.archive.root}: member {name!r} is listed long after the archive holds "
                f"it: over {REORDER_BYTES:,} bytes of members read ahead of the list's order. A "
                "compressed tar is read once, in order: list it with `rectool list` without "
                "--shuffle (its list follows the archive's order), or decompress it to a .tar "
                "(random access)"
            )
        self._ahead[name] = data

    def _advance(self) -> Iterator[tuple[str, bytes | str]]:
        """Yield (list path, bytes or refusal) of each listed member met, in archive order."""
        seen = self._seen
        for raw, kind, offset, size in self._members:
            before = len(seen)
            try:
                seen.add(raw, kind, offset, size)
            except ArchiveError:
                self._checks.check()  # a damaged header explains a bad name
                raise
            if len(seen) == before:
                continue  # the archive's own folder, or a folder named again
            name = seen.names[-1]
            self.blocks.where = f"member {raw!r}"
            path = self._listed(name, kind)
            if path is None:
                continue
            why = refusal(seen.member(before), MAX_RECORD_BYTES)
            if why is not None:
                yield path, why
                continue
            data = self.blocks.read(size)
            if len(data) < size:
                raise ArchiveError(f"{self.archive.root}: member {raw!r} is truncated")
            yield path, data

    def _listed(self, name: str, kind: int) -> str | None:
        """Return the list path of a member the list asks for, else None."""
        if self._base is None and kind == FILE:
            # The root folder (as `MemberIndex.finish` finds it): known at the first file
            # member the list names, with its folder or without.
            top, _, rest = name.partition("/")
            if self.wanted[name] > 0:
                self._base = ""
            elif rest and self.wanted[rest] > 0:
                self._base = top + "/"
        if self._base:
            if not name.startswith(self._base):
                return None
            name = name[len(self._base) :]
        return name if self.wanted[name] > 0 else None

    def read_into(self, path: str, view: memoryview) -> ReadInto:
        """Place the member's bytes at the start of `view` (see the module's docstring)."""
        return place(self.read(path), view)

    def close(self) -> None:
        """Close the archive."""
        self.archive.close()


def open_member_reader(
    root: StrPath, remaining: Callable[[], Iterable[str]]
) -> MemberReader | StreamReader | None:
    """Return the reader of an archive ROOT, or None when ROOT is a tree.

    `remaining()` gives the list paths still to pack, in order (a compressed stream keeps
    only the members they name).
    """
    kind = archive_kind(root)
    if kind is None:
        return None
    archive = open_archive(root, kind)
    if kind == TAR_GZ:
        try:
            return StreamReader(archive, remaining())
        except BaseException:
            archive.close()
            raise
    return MemberReader(archive)
