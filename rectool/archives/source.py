"""Which ROOT is an archive, and the one opener of archives: `open_archive`.

`archive_kind` tells an archive ROOT from a tree by its name (`.tar`, `.tar.gz`/`.tgz`, `.zip`)
or, for webdataset shards, by being a pattern (`shards/*.tar`, `shards/{000000..000099}.tar`)
or a folder of `.tar` files with no subfolder. `open_archive` opens every file through the
input door (`doors/inputs.open_input`: a regular file, not waited on), indexes it once
(`tar.index_tar`, `zip.index_zip`, `webdataset.index_webdataset`) and reads members by offset:
`Archive.read` returns a member's bytes, or why it is refused, never more than the record
limit. A compressed tar is not indexed: it is read once, in order (`stream.StreamReader`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, BinaryIO

from ..doors.inputs import open_input
from ..errors import InputError
from ..reader import MAX_RECORD_BYTES
from .members import ArchiveError, Member, MemberIndex, refusal

if TYPE_CHECKING:
    from _typeshed import StrPath

TAR, TAR_GZ, ZIP, WEBDATASET = "tar", "tar.gz", "zip", "webdataset"
_SUFFIXES = ((".tar.gz", TAR_GZ), (".tgz", TAR_GZ), (".tar", TAR), (".zip", ZIP))
# Compressions the standard library cannot stream here, and what to do instead.
_UNREAD = (".tar.zst", ".tzst", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".7z", ".rar")
PATTERN_CHARACTERS = "*?[{"
# What pass-through reads ahead of a member when members are read in archive order.
WINDOW = 1 << 20


def archive_kind(root: StrPath) -> str | None:
    """Return the kind of archive ROOT is (`TAR`, `TAR_GZ`, `ZIP`, `WEBDATASET`), or None for
    a tree (a URL too: the command's own door refuses it). Raises `InputError` for an
    archive format rectool cannot read."""
    text = os.fspath(root)
    lower = text.lower()
    if "://" in text:  # a URL's "?" and "*" are no shard pattern
        return None
    if os.path.isdir(text):
        return WEBDATASET if _holds_only_shards(text) else None
    if not os.path.lexists(text) and any(c in text for c in PATTERN_CHARACTERS):
        return WEBDATASET
    for suffix, kind in _SUFFIXES:
        if lower.endswith(suffix):
            return kind
    for suffix in _UNREAD:
        if lower.endswith(suffix):
            raise InputError(
                f"{text}: a {suffix} archive, which rectool cannot read; unpack it to a .tar "
                "first (random access, fastest) or give the extracted tree"
            )
    return None


def _holds_only_shards(folder: str) -> bool:
    """Return whether a folder holds `.tar` files and no folder (webdataset shards)."""
    shards = False
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir():
                    return False  # an identity folder: a tree (stops at the first one)
                shards = shards or entry.name.endswith(".tar")
    except OSError:
        return False
    return shards


# The last archive indexed, by what identifies its bytes (file, size, change time): `pack`
# opens ROOT to check its first items, then to pack, and an index costs a pass of its headers.
_last_index: dict[tuple[object, ...], MemberIndex] = {}


class Archive:
    """An opened archive ROOT: its member index and its files; members read by offset."""

    def __init__(self, root: StrPath, kind: str) -> None:
        self.root, self.kind = os.fspath(root), kind
        self.files: list[BinaryIO] = []
        self.index: MemberIndex
        self.random_access = kind != TAR_GZ
        self._window: tuple[int, int, memoryview] = (0, -1, memoryview(b""))  # see read_into
        try:
            if kind == TAR_GZ:
                self.index = MemberIndex(self.root)  # read once, in order: see reading.py
                self._open(self.root)
            else:
                self.index = self._indexed()
        except BaseException:
            self.close()
            raise

    def _indexed(self) -> MemberIndex:
        """Open the archive's files and return their index (the last one kept, see above)."""
        if self.kind == WEBDATASET:
            from .webdataset import expand_shards

            paths = expand_shards(self.root)[1]
        else:
            paths = [self.root]
        key: tuple[object, ...] = (self.kind, self.root)
        for path in paths:
            st = os.fstat(self._open(path).fileno())
            key += (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        index = _last_index.get(key)
        if index is None:
            if self.kind == WEBDATASET:
                from .webdataset import index_webdataset

                index = index_webdataset(self.root, self.files, paths)
            elif self.kind == ZIP:
                from .zip import index_zip

                index = index_zip(
                    self.files[0], os.fstat(self.files[0].fileno()).st_size, self.root
                )
            else:
                from .tar import index_tar

                file = self.files[0].fileno()
                index = index_tar(file, os.fstat(file).st_size, self.root)
        _last_index.clear()  # one index kept: pack's check of ROOT, then its run
        _last_index[key] = index
        return index

    def _open(self, path: str) -> BinaryIO:
        file = open_input(path, "archive")
        self.files.append(file)
        return file

    def read(self, member: Member, limit: int = MAX_RECORD_BYTES) -> bytes | str:
        """Return a member's bytes (at most `limit`), or why it is refused."""
        why = refusal(member, limit)
        if why is not None:
            return why
        fd = self.files[member.part].fileno()
        if self.kind == ZIP:
            from .zip import read_member

            return read_member(fd, member)
        data = os.pread(fd, member.size, member.offset)
        if len(data) < member.size:
            return "truncated in the archive (it changed since it was indexed?)"
        return data

    def read_into(self, member: Member, view: memoryview) -> tuple[int, bytes | None]:
        """Read a stored member into `view` as pass-through reads a file: return (bytes
        placed, the rest when it did not fit, else None). The caller checked `refusal`.

        One thread's reads (pass-through's): members read in archive order come from a window
        of the file read ahead (`WINDOW`), one system call for many small members; a member
        elsewhere is read on its own.
        """
        fd = self.files[member.part].fileno()
        room = len(view)
        want = min(room, member.size)
        small = member.size <= WINDOW // 4
        n = -1
        part, at, window = self._window
        if small and part == member.part:
            start = member.offset - at
            if 0 <= start and start + want > len(window) and start < len(window) + WINDOW:
                window = memoryview(os.pread(fd, WINDOW, member.offset))  # the next ones ahead
                self._window, start = (part, member.offset, window), 0
            if 0 <= start and start + want <= len(window):
                view[:want] = window[start : start + want]
                n = want
        if n < 0:
            n = os.preadv(fd, [view[:want]], member.offset)
            if small:  # the next member in archive order reads a window ahead
                self._window = (member.part, member.offset, memoryview(b""))
        if n < want:
            raise ArchiveError(
                f"{self.root}: member {member.name!r} is truncated (the archive changed?)"
            )
        if n < room:
            return n, None
        return n, os.pread(fd, member.size - n, member.offset + n)

    @property
    def in_place(self) -> bool:
        """Return whether members are read straight into place (a tar's: no CRC to check;
        a zip's are checked, and inflated, by `read`)."""
        return self.kind != ZIP

    def close(self) -> None:
        """Close the archive's files."""
        for file in self.files:
            file.close()
        self.files.clear()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_archive(root: StrPath, kind: str | None = None) -> Archive:
    """Open and index an archive ROOT (see the module's docstring); raise `InputError`
    (`ArchiveError` for a damaged or hostile one) naming it and the member."""
    kind = kind or archive_kind(root)
    if kind is None:
        raise InputError(f"{os.fspath(root)}: not an archive rectool reads")
    return Archive(root, kind)
