"""Tar archives: their headers walked once into a `MemberIndex`, members read by offset.

The walk reads 512-byte headers as POSIX (ustar, pax) and GNU tar write them: a pax header's
`path`, `linkpath` and `size`, GNU's long names (`L`, `K`), base-256 sizes. Every header's
checksum is checked, so a file that is no tar, or is damaged, is refused at the member where
it goes wrong; pax and long-name data are bounded (`MAX_META_BYTES`). An archive must end with
its end-of-archive block: one that stops short (a member's data past the end of the file, or
no end block) is truncated, and refused naming the last member.

`walk_tar` works over any `Blocks`: the archive file itself read with `pread` (`FileBlocks`:
headers only, random access to the data), or a decompressed stream read once
(`compressed.py`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from .members import (
    DEVICE,
    FIFO,
    FILE,
    FOLDER,
    HARDLINK,
    OTHER,
    SPARSE,
    SYMLINK,
    ArchiveError,
    MemberIndex,
)

BLOCK = 512
# A pax header or GNU long name holds a path (PATH_MAX is 4096 bytes) and a few numbers.
MAX_META_BYTES = 1 << 20
# No file is a pebibyte; sizes past it (base-256 fields, pax) are damage, and would overflow
# the index's 64-bit offsets.
MAX_MEMBER_BYTES = 1 << 50
_KINDS = {
    b"0": FILE,
    b"\0": FILE,
    b"7": FILE,  # contiguous file
    b"1": HARDLINK,
    b"2": SYMLINK,
    b"3": DEVICE,
    b"4": DEVICE,
    b"5": FOLDER,
    b"6": FIFO,
    b"S": SPARSE,  # GNU's old sparse format
}
_ZERO = bytes(BLOCK)


class Blocks(Protocol):
    """Where a tar's bytes come from: `read(n)` at the position (short only at the end),
    `seek(pos)` forward, `pos`, and what to name in errors."""

    name: str
    pos: int

    def read(self, n: int) -> bytes: ...

    def seek(self, pos: int) -> None: ...


class FileBlocks:
    """A tar file's bytes by `pread`, a window at a time: small members' headers lie a few KB
    apart, and one read of `WINDOW` bytes costs less than a system call per header."""

    WINDOW = 256 << 10

    def __init__(self, fd: int, size: int, name: str) -> None:
        self.fd, self.size, self.name, self.pos = fd, size, name, 0
        self._at, self._buffer = 0, b""

    def read(self, n: int) -> bytes:
        start = self.pos - self._at
        if start < 0 or start + n > len(self._buffer):
            self._at, start = self.pos, 0
            self._buffer = os.pread(self.fd, max(n, self.WINDOW), self.pos)
        data = self._buffer[start : start + n]
        self.pos += len(data)
        return data

    def seek(self, pos: int) -> None:
        self.pos = pos


def _number(field: bytes, where: str) -> int:
    """Return a header's numeric field: octal text, or base-256 (GNU) when its high bit is set."""
    if field[:1] and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:  # negative
            raise ArchiveError(f"{where}: a negative size")
        return value | ((field[0] & 0x3F) << (8 * (len(field) - 1)))
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ArchiveError(f"{where}: damaged, or no tar (a field holds {text[:20]!r})") from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax(data: bytes, where: str) -> dict[str, str]:
    """Return a pax extended header's records (`LEN KEY=VALUE\\n` each)."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ArchiveError(f"{where}: a damaged pax header") from None
        record = data[space + 1 : pos + length]
        if length <= 0 or space < 0 or not record.endswith(b"\n") or b"=" not in record:
            raise ArchiveError(f"{where}: a damaged pax header")
        key, _, value = record[:-1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


class HeaderChecks:
    """Header checksums, checked a batch at a time with numpy (per header in Python, the sum
    would cost more than the rest of the walk). `check()` raises for the first header in the
    batch whose checksum does not match; the walk calls it before any other error it raises,
    and at the end, and a caller before an error of its own about a member met since."""

    BATCH = 4096

    def __init__(self, name: str) -> None:
        self.name = name
        self._blocks = bytearray()
        self._places: list[tuple[int, str]] = []  # (header's byte, the member before it)

    def add(self, block: bytes, header_at: int, last: str) -> None:
        self._blocks += block
        self._places.append((header_at, last))
        if len(self._places) >= self.BATCH:
            self.check()

    def check(self) -> None:
        """Raise `ArchiveError` for the first header added whose checksum does not match."""
        if not self._places:
            return
        heads = np.frombuffer(self._blocks, np.uint8).reshape(-1, BLOCK)
        field = heads[:, 148:156].astype(np.int64)
        sums = heads.sum(1, dtype=np.int64) - field.sum(1) + 8 * 32
        stored = np.zeros(len(heads), np.int64)
        started = np.zeros(len(heads), bool)
        stopped = np.zeros(len(heads), bool)
        for i in range(8):  # octal digits, after spaces, up to a NUL or space
            digit = (field[:, i] >= 48) & (field[:, i] <= 55)
            stopped |= started & ~digit
            take = digit & ~stopped
            stored = np.where(take, stored * 8 + field[:, i] - 48, stored)
            started |= digit
        bad = np.flatnonzero((stored != sums) | ~started)
        places, self._places, self._blocks = self._places, [], bytearray()
        if len(bad):
            header_at, last = places[int(bad[0])]
            raise ArchiveError(
                f"{self.name}: header at byte {header_at}{_after(last)}: its checksum does not "
                "match: damaged, or no tar"
            )


def _after(last: str) -> str:
    return f" (after member {last!r})" if last else ""


def walk_tar(
    blocks: Blocks, end: int | None = None, checks: HeaderChecks | None = None
) -> Iterator[tuple[str, int, int, int]]:
    """Yield `(name, kind, offset, size)` for each member, in archive order.

    `offset` is where the member's data starts. Between yields the caller may read the data
    from `blocks`; the walk then moves on past it. `end`, when known (a file's size), is
    checked against every member's data: past it, the archive is truncated. Headers'
    checksums are checked by `checks` (see `HeaderChecks`), a batch at a time.
    """
    checks = checks or HeaderChecks(blocks.name)
    try:
        yield from _walk(blocks, end, checks)
    except ArchiveError:
        checks.check()  # a damaged header explains what followed
        raise
    checks.check()


def _walk(
    blocks: Blocks, end: int | None, checks: HeaderChecks
) -> Iterator[tuple[str, int, int, int]]:
    long_name: str | None = None
    pax: dict[str, str] = {}
    last = ""  # the last member met, for errors
    read, seek, kinds, zero = blocks.read, blocks.seek, _KINDS, _ZERO
    while True:
        header_at = blocks.pos
        block = read(BLOCK)
        if len(block) < BLOCK:
            raise ArchiveError(
                f"{blocks.name}: truncated {f'after member {last!r}' if last else 'at its start'}"
                ": the archive ends without its end-of-archive block (a copy cut short?)"
            )
        if block == zero:
            return
        checks.add(block, header_at, last)
        field = block[124:136]
        if field[0] & 0x80:
            size = _number(field, f"{blocks.name}: header at byte {header_at}{_after(last)}")
        else:
            try:
                size = int(field.split(b"\0", 1)[0] or b"0", 8)
            except ValueError:
                checks.check()
                raise ArchiveError(
                    f"{blocks.name}: header at byte {header_at}{_after(last)}: damaged, or no "
                    f"tar (its size field holds {field!r})"
                ) from None
        flag = block[156:157]
        name = block[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        if block[257:263] == b"ustar\0" and block[345] != 0:  # POSIX: the head of long names
            name = f"{_text(block[345:500])}/{name}"
        if flag in (b"x", b"g", b"L", b"K"):
            where = f"{blocks.name}: header at byte {header_at}{_after(last)}"
            if size > MAX_META_BYTES:
                checks.check()
                raise ArchiveError(f"{where}: an extended header of {size:,} bytes; refused")
            data = read(size)
            if len(data) < size:
                raise ArchiveError(f"{blocks.name}: truncated inside the header at {header_at}")
            seek(header_at + BLOCK + _padded(size))
            if flag == b"x":
                pax = _pax(data, where)
            elif flag == b"L":
                long_name = _text(data)
            continue  # a global header (g) and a long link name (K) name no member
        if long_name is not None:
            name, long_name = long_name, None
        sparse = False
        if pax:
            name = pax.get("path", name)
            # GNU's pax sparse formats: the data lacks the holes (and, in 1.0, starts with the
            # map), and the real name is GNU.sparse.name, `path` a placeholder.
            sparse = any(key.startswith("GNU.sparse.") for key in pax)
            name = pax.get("GNU.sparse.name", name)
            if "size" in pax:
                # Decimal digits only: int() also takes "-1536", "+5", " 5" and "1_0", and a
                # negative size read the stream backwards (a .tar.gz packed other bytes).
                text = pax["size"]
                if not (text.isascii() and text.isdigit()):
                    checks.check()
                    raise ArchiveError(
                        f"{blocks.name}: member {name!r}: a damaged pax size ({text[:20]!r})"
                    )
                size = int(text)
            pax = {}
        kind = SPARSE if sparse else kinds.get(flag, OTHER)
        if kind != FILE and kind != OTHER and kind != SPARSE:
            size = 0  # as tar reads them: no data follows a link's, folder's or device's header
        offset = header_at + BLOCK
        if flag == b"S" and block[482]:  # the map goes on in extension blocks before the data
            offset = _skip_sparse_map(blocks, name, offset)
        if end is not None and offset + size > end:
            raise ArchiveError(
                f"{blocks.name}: member {name!r} is truncated: its {size:,} bytes run past the "
                f"end of the archive ({end:,} bytes)"
            )
        if size > MAX_MEMBER_BYTES:  # where no file size bounds it (a stream), damage does
            checks.check()
            raise ArchiveError(
                f"{blocks.name}: member {name!r} declares {size:,} bytes: damaged; refused"
            )
        last = name
        yield name, kind, offset, size
        seek(offset + (size + BLOCK - 1) // BLOCK * BLOCK)


def _skip_sparse_map(blocks: Blocks, name: str, offset: int) -> int:
    """Return where an old GNU sparse member's data starts, after its map's extension blocks
    (each says, at byte 504, whether another follows)."""
    blocks.seek(offset)
    while True:
        block = blocks.read(BLOCK)
        if len(block) < BLOCK:
            raise ArchiveError(f"{blocks.name}: member {name!r} is truncated in its sparse map")
        offset += BLOCK
        if not block[504]:
            return offset


def _padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def index_tar(fd: int, size: int, name: str) -> MemberIndex:
    """Return the index of the tar file open as `fd` (`size` bytes, named `name` in errors)."""
    index = MemberIndex(name)
    checks = HeaderChecks(name)
    try:
        for member, kind, offset, length in walk_tar(FileBlocks(fd, size, name), size, checks):
            index.add(member, kind, offset, length)
    except ArchiveError:
        checks.check()  # a damaged header explains a bad name
        raise
    return index.finish()
