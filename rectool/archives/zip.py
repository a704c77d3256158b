"""Zip archives: the central directory read once into a `MemberIndex`, members read by offset.

The central directory is parsed by the standard library's `zipfile` (zip64 included) from the
file the input door opened; each member's local header is then read to find where its data
starts, and its name checked against the directory's (as `zipfile` checks it). What a zip
bomb relies on is refused while indexing, naming the member: members whose data overlap (one
compressed stream counted many times), a declared size over `MAX_RATIO` times the compressed
size, data that runs past the central directory (a truncated archive). Reading a member
(`read_member`) bounds its decompressed size by the size the directory declares, and checks
its CRC-32.
"""

from __future__ import annotations

import os
import stat
import struct
import zipfile
import zlib
from typing import BinaryIO

from .members import (
    DEVICE,
    ENCRYPTED,
    FIFO,
    FILE,
    FOLDER,
    OTHER,
    SYMLINK,
    ArchiveError,
    Member,
    MemberIndex,
)

STORED, DEFLATED = 0, 8
# No image compresses 100 times; a bomb declares thousands of times its compressed size.
MAX_RATIO = 100
_RATIO_FLOOR = 1 << 20  # small members may compress well (a flat PNG): only bounded above this
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"
_UNIX = 3
_NAME_GUESS = 256  # read with the local header: most names are shorter


def _kind(info: zipfile.ZipInfo) -> int:
    if info.filename.endswith("/"):
        return FOLDER
    if info.flag_bits & 1:
        return ENCRYPTED
    mode = info.external_attr >> 16
    if info.create_system == _UNIX and stat.S_IFMT(mode):  # a file type given
        if stat.S_ISLNK(mode):
            return SYMLINK
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            return DEVICE
        if stat.S_ISFIFO(mode):
            return FIFO
        if stat.S_ISDIR(mode):
            return FOLDER
        if not stat.S_ISREG(mode):
            return OTHER
    return FILE


def _name_bytes(info: zipfile.ZipInfo) -> bytes:
    """Return the member's name as the central directory holds it (as `zipfile` decodes it)."""
    try:
        return info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
    except UnicodeEncodeError:
        return b""  # `zipfile` decoded it otherwise: no local name can match


def index_zip(file: BinaryIO, size: int, name: str) -> MemberIndex:
    """Return the index of the zip `file` (opened by the input door; `size` bytes, named
    `name` in errors)."""
    try:
        infos = zipfile.ZipFile(file).infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError) as exc:
        raise ArchiveError(f"{name}: not a readable zip archive ({exc})") from None
    fd = file.fileno()
    ends: list[tuple[int, int, str]] = []
    # Extractors that read local headers (streaming unzip, Java's) would name a member
    # otherwise than the directory, and a list's path would stand for other bytes. Raised
    # after the overlap check: members pointing at one local header is the likelier story.
    disagree: str | None = None
    index = MemberIndex(name)
    for info in infos:
        where = f"{name}: member {info.filename!r}"
        head = os.pread(fd, _LOCAL.size + _NAME_GUESS, info.header_offset)
        if len(head) < _LOCAL.size or head[:4] != _LOCAL_MAGIC:
            raise ArchiveError(f"{where}: no local header at byte {info.header_offset}")
        fields = _LOCAL.unpack(head[: _LOCAL.size])
        name_length, extra_length = fields[9], fields[10]
        if name_length > _NAME_GUESS:
            head += os.pread(fd, name_length - _NAME_GUESS, info.header_offset + len(head))
        local_name = head[_LOCAL.size : _LOCAL.size + name_length]
        if local_name != _name_bytes(info) and disagree is None:
            disagree = (
                f"{where}: its local header at byte {info.header_offset} names it "
                f"{local_name.decode('utf-8', 'backslashreplace')!r}: the central directory "
                "and the local headers disagree (damaged, or crafted); refused"
            )
        data = info.header_offset + _LOCAL.size + name_length + extra_length
        end = data + info.compress_size
        if end > size:
            raise ArchiveError(
                f"{where}: truncated: its data runs past the end of the archive ({size:,} bytes)"
            )
        kind = _kind(info)
        if (
            kind == FILE
            and info.file_size > _RATIO_FLOOR
            and info.file_size > MAX_RATIO * max(info.compress_size, 1)
        ):
            raise ArchiveError(
                f"{where}: declares {info.file_size:,} bytes from {info.compress_size:,} "
                f"compressed (over {MAX_RATIO} times): a zip bomb; refused"
            )
        ends.append((info.header_offset, end, info.filename))
        index.add(
            info.filename,
            kind,
            data,
            info.file_size,
            info.compress_size,
            info.compress_type,
            info.CRC,
        )
    ends.sort()
    for (_, end, first), (start, _, second) in zip(ends, ends[1:]):
        if start < end:
            raise ArchiveError(
                f"{name}: member {second!r} overlaps member {first!r} (data shared between "
                "members: a zip bomb's trick); refused"
            )
    if disagree is not None:
        raise ArchiveError(disagree)
    return index.finish()


def read_member(fd: int, member: Member) -> bytes | str:
    """Return a zip member's bytes, or why they cannot be read (a refusal reason)."""
    data = os.pread(fd, member.stored, member.offset)
    if len(data) < member.stored:
        return "truncated in the archive"
    if member.method == DEFLATED:
        inflate = zlib.decompressobj(-15)
        try:
            out = inflate.decompress(data, member.size + 1)
        except zlib.error as exc:
            return f"damaged in the archive (cannot inflate: {exc})"
        if len(out) > member.size:
            return "decompresses past the size the archive declares (a zip bomb?)"
        if len(out) < member.size or not inflate.eof:
            return "damaged in the archive (shorter than declared)"
        data = out
    elif member.method != STORED:
        return f"compressed with zip method {member.method}, which rectool does not read"
    elif member.stored != member.size:
        return "damaged in the archive (stored, yet its two sizes differ)"
    if zlib.crc32(data) != member.crc:
        return "damaged in the archive (its CRC-32 does not match)"
    return data
