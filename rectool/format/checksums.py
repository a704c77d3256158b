"""Per-record checksums: the `.rec.crc` file beside each shard that rectool packs.

A shard's digest in the manifest says *that* a .rec changed; the checksum of each record says
*which* record. `PREFIX.rec.crc` (or `PREFIX-00000.rec.crc`, ...) holds, in file order, each
record's byte offset, framed length (headers, split parts and padding included: the bytes from
its first magic to the next record) and a checksum of those bytes. The manifest records the
file's own digests, so a table that was damaged or tampered with is known as such. The byte
layout is in docs/format.md.

Two versions: version 1 (magic `RTCRC32\n`) holds the zlib CRC-32 of each record, as packs
made before manifest version 2 have it; version 2 (magic `RTXXH64\n`), written today, holds
the xxh3-64 of each record (the `xxhash` package: 100k records of 5.8 KB in 0.05 s here, zlib's
CRC-32 0.17 s; tests/benchmarks/bench_digests.py). Both are read. `RecordChecksums` computes
them as the shard's bytes are written, over whole buffers of records (no Python bytecode per
record).
"""

from __future__ import annotations

import array
import errno
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import xxhash

from ..doors.inputs import open_input
from ..doors.output import write_atomic
from ..errors import RectoolError
from .digest import Digests, digests_of
from .paths import PackPaths
from .window import RecWindow, ascending

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, StrPath

# magic, version, reserved (0), record count.
HEADER = struct.Struct("<8sIIQ")
CRC32, XXH3_64 = "crc32", "xxh3-64"
# Per version: magic, per-record checksum, entry layout (packed: no padding).
FILE_MAGIC = {1: b"RTCRC32\n", 2: b"RTXXH64\n"}
ALGORITHM = {1: CRC32, 2: XXH3_64}
ENTRY = {
    1: np.dtype([("offset", "<u8"), ("length", "<u4"), ("checksum", "<u4")]),
    2: np.dtype([("offset", "<u8"), ("length", "<u4"), ("checksum", "<u8")]),
}
FILE_VERSION = 2  # what `RecordChecksums` writes unless told otherwise
_CHECKSUM = {1: zlib.crc32, 2: xxhash.xxh3_64_intdigest}
_TYPECODE = {1: "I", 2: "Q"}


def version_of(entries: np.ndarray) -> int:
    """Return the file version whose entries `entries` (an ENTRY array) are."""
    return 1 if entries.dtype["checksum"].itemsize == 4 else 2


def algorithm_of(entries: np.ndarray) -> str:
    """Return the name of the per-record checksum of `entries` ("crc32", "xxh3-64")."""
    return ALGORITHM[version_of(entries)]


def show_checksum(entries: np.ndarray, i: int) -> str:
    """Return record `i`'s checksum in `entries` as hex digits (8 for CRC-32, 16 for xxh3-64)."""
    width = 2 * entries.dtype["checksum"].itemsize
    return f"{int(entries['checksum'][i]):0{width}x}"


def _checksums(
    view: memoryview, starts: Sequence[int], ends: Sequence[int], version: int
) -> Iterator[int]:
    """Return an iterator of the checksums of `view[starts[i]:ends[i]]`.

    map() over C callables: no Python bytecode per record (100k records of 6 KB: the
    per-record overhead, not the checksum, was most of the time).
    """
    return map(_CHECKSUM[version], map(view.__getitem__, map(slice, starts, ends)))


class ChecksumFileError(RectoolError):
    """A `.rec.crc` file that cannot be read as one."""


def checksum_path(rec_path: StrPath) -> str:
    """Return the path of the per-record checksum file of `rec_path`."""
    return PackPaths.checksums_of(rec_path)


class RecordChecksums:
    """Accumulate the checksum of each record of a shard as its records are added, in order.

    `offsets` is the writer's own array of record starts, appended to as records are added;
    `add` takes the same records' bytes. `version`: the `.rec.crc` version to write (2:
    xxh3-64; 1: zlib CRC-32, as packs made before manifest version 2).
    """

    def __init__(
        self,
        offsets: array.array[int],
        sums: array.array[int] | None = None,
        position: int = 0,
        version: int = FILE_VERSION,
    ) -> None:
        self.offsets, self.version = offsets, version
        self.sums = sums if sums is not None else array.array(_TYPECODE[version])
        self.position = position

    @classmethod
    def of_file(
        cls, path: StrPath, offsets: array.array[int], end: int, version: int = FILE_VERSION
    ) -> RecordChecksums:
        """Return the checksums of the records at `offsets` in the first `end` bytes of `path`
        (a resumed shard, cut back to `end`)."""
        sums = array.array(_TYPECODE[version])
        bounds = [*offsets.tolist(), end]
        with open_input(path, "record file") as f:
            for start, stop in zip(bounds, bounds[1:]):
                f.seek(start)
                data = f.read(stop - start)
                if len(data) != stop - start:
                    raise RectoolError(f"{path}: shorter than its index says")
                sums.append(_CHECKSUM[version](data))
        return cls(offsets, sums, end, version)

    def add(self, data: ReadableBuffer, starts: Sequence[int]) -> None:
        """Take records framed back to back in `data` (record i from `starts[i]`), the next
        bytes of the shard.

        `ShardWriter` calls it on its hashing thread, beside the shard's digests, as the
        bytes are written: one call a buffer of records.
        """
        with memoryview(data) as view:
            ends = [*starts[1:], len(view)]
            self.sums.extend(_checksums(view, starts, ends, self.version))
            self.position += len(view)

    def table(self, size: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Return the entries (offset, length, checksum) of a shard of `size` bytes: all of
        them, or those from `start` to `stop`."""
        count = len(self.sums)
        stop = count if stop is None else min(stop, count)
        start = min(start, stop)
        offsets = np.frombuffer(self.offsets, np.int64) if len(self.offsets) else np.zeros(0)
        entries = np.zeros(stop - start, ENTRY[self.version])
        if len(entries):
            entries["offset"] = offsets[start:stop]
            # In place: a table of millions is made as a shard ends, at the peak of a
            # repack's memory (np.diff(np.append(...)) made two more int64 columns of it).
            lengths = entries["length"]
            ends = offsets[start + 1 : stop]
            np.subtract(ends, offsets[start : stop - 1], out=lengths[:-1], casting="unsafe")
            lengths[-1] = (offsets[stop] if stop < count else size) - offsets[stop - 1]
            sums = np.frombuffer(self.sums, entries.dtype["checksum"])
            entries["checksum"] = sums[start:stop]
        return entries

    def write(self, path: StrPath, size: int, algorithms: Iterable[str]) -> dict[str, str]:
        """Write the file for a shard of `size` bytes, whole or absent; return its digests
        ({algorithm: hex}, of `algorithms`: see `digest.Digests`)."""
        if len(self.sums) != len(self.offsets) or self.position != size:
            raise RectoolError(
                f"{path}: {len(self.sums)} checksums for {len(self.offsets)} records "
                f"({self.position} of {size} bytes seen); this is a bug in rectool"
            )
        digests = Digests(algorithms)
        write_atomic(path, self._parts(size, digests))
        return digests.hexdigests()

    def _parts(self, size: int, digests: Digests) -> Iterator[memoryview]:
        """Yield the file's bytes, its header then TABLE_BLOCK_ENTRIES entries at a time
        (never the whole table: 20 bytes a record), each added to `digests` as written."""
        count = len(self.sums)
        head = memoryview(HEADER.pack(FILE_MAGIC[self.version], self.version, 0, count))
        digests.update(head)
        yield head
        for start in range(0, count, TABLE_BLOCK_ENTRIES):
            part = checksum_parts(self.table(size, start, start + TABLE_BLOCK_ENTRIES))[1]
            digests.update(part)
            yield part


def encode_checksums(entries: np.ndarray) -> bytes:
    """Return the bytes of a checksum file holding `entries` (an ENTRY array of a version)."""
    return b"".join(checksum_parts(entries))


def checksum_parts(entries: np.ndarray) -> list[memoryview]:
    """Return the bytes of a checksum file holding `entries` as (its header, a view of the
    entries), the entries not copied when they are an ENTRY array already."""
    version = version_of(entries)
    head = HEADER.pack(FILE_MAGIC[version], version, 0, len(entries))
    table = np.ascontiguousarray(entries.astype(ENTRY[version], copy=False))
    return [memoryview(head), table.data.cast("B")]


def decode_checksums(data: bytes, path: StrPath) -> np.ndarray:
    """Parse checksum file bytes (either version); return the ENTRY array. Raises
    `ChecksumFileError`."""
    if len(data) < HEADER.size:
        raise ChecksumFileError(f"{path}: {len(data)} bytes, too short for a checksum file")
    magic, version, _, count = HEADER.unpack_from(data)
    if magic not in FILE_MAGIC.values():
        raise ChecksumFileError(f"{path}: not a rectool checksum file (magic {magic!r})")
    if version not in FILE_MAGIC or FILE_MAGIC[version] != magic:
        known = ", ".join(map(str, FILE_MAGIC))
        raise ChecksumFileError(
            f"{path}: version {version} (magic {magic!r}); this rectool reads versions {known}"
        )
    entry = ENTRY[version]
    if len(data) != HEADER.size + count * entry.itemsize:
        raise ChecksumFileError(
            f"{path}: {len(data)} bytes, but a header announcing {count} records needs "
            f"{HEADER.size + count * entry.itemsize}"
        )
    entries = np.frombuffer(data, entry, count, HEADER.size)
    offsets = entries["offset"].astype(np.int64)
    ends = offsets + entries["length"]
    if count and (offsets[0] != 0 or (offsets[1:] != ends[:-1]).any()):
        raise ChecksumFileError(f"{path}: its records do not follow each other from byte 0")
    return entries


def _open_checksums(path: StrPath) -> BinaryIO:
    """Open a checksum file for reading. Raises `FileNotFoundError` when it is absent,
    `ChecksumFileError` when it is not a regular file (or cannot be opened)."""
    if not os.path.lexists(path):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
    try:
        # Non-blocking, then fstat: a FIFO in its place must not hang the caller.
        return open_input(path, "checksum file")
    except RectoolError as exc:
        reason = "not a regular file" if "not a regular file" in str(exc) else str(exc)
        raise ChecksumFileError(f"{path}: {reason}" if reason != str(exc) else reason) from None


def load_checksums(
    path: StrPath, algorithms: Iterable[str] = ()
) -> tuple[np.ndarray, dict[str, str]]:
    """Read a checksum file; return (entries, {algorithm: hex digest of its bytes}) for the
    whole-file digests `algorithms` ("xxh3-128", "sha256").

    Raises `FileNotFoundError` when it is absent, `ChecksumFileError` when it is not one.
    (`scan_checksums` reads one a block at a time, holding none of it.)
    """
    with _open_checksums(path) as f:
        try:
            data = f.read()
        except OSError as exc:
            raise ChecksumFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return decode_checksums(data, path), digests_of(data, algorithms)


# Entries a `ChecksumTable` reads, and `RecordChecksums.write` writes, at a time (1.3 MB of
# version 2's).
TABLE_BLOCK_ENTRIES = 1 << 16


@dataclass(frozen=True)
class ChecksumTable:
    """A checksum file found whole and sound by `scan_checksums`, none of it held: its
    `version`, `count` entries, and `end`, where its last record ends (0 for none).
    `blocks()` reads its entries again a block at a time."""

    path: str
    version: int
    count: int
    end: int

    @property
    def algorithm(self) -> str:
        """The name of its per-record checksum ("crc32", "xxh3-64")."""
        return ALGORITHM[self.version]

    def blocks(self, rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (position of its first entry, ENTRY array) of `rows` entries at a time
        (`TABLE_BLOCK_ENTRIES`). Raises `ChecksumFileError` when the file no longer holds
        them."""
        entry, rows = ENTRY[self.version], rows or TABLE_BLOCK_ENTRIES
        with _open_checksums(self.path) as f:
            f.seek(HEADER.size)
            for first in range(0, self.count, rows):
                n = min(rows, self.count - first)
                data = f.read(n * entry.itemsize)
                if len(data) != n * entry.itemsize:
                    raise ChecksumFileError(f"{self.path}: changed while it was read")
                yield first, np.frombuffer(data, entry, n)

    def stale_reason(self, size: int) -> str | None:
        """Return why it cannot describe a .rec of `size` bytes (see `stale_reason`), or None."""
        return _stale(self.count, self.end, size)


def scan_checksums(
    path: StrPath, algorithms: Iterable[str] = ()
) -> tuple[ChecksumTable, dict[str, str]]:
    """Check a checksum file a block at a time, as `load_checksums` (the same errors, in the
    same order); return (its `ChecksumTable`, {algorithm: hex digest of its bytes}).

    What is held is a block of entries: a table of millions is read, never kept. Raises
    `FileNotFoundError` when it is absent, `ChecksumFileError` when it is not one.
    """
    digests = Digests(algorithms)
    with _open_checksums(path) as f:
        try:
            head = f.read(HEADER.size)
            digests.update(head)
            if len(head) < HEADER.size:
                raise ChecksumFileError(f"{path}: {len(head)} bytes, too short for a checksum file")
            magic, version, reserved, count = HEADER.unpack_from(head)
            # Its magic and version, checked as `decode_checksums` checks them.
            decode_checksums(HEADER.pack(magic, version, reserved, 0), path)
            entry = ENTRY[version]
            total, seen, end, chained, pending = HEADER.size, 0, 0, True, b""
            while more := f.read(TABLE_BLOCK_ENTRIES * entry.itemsize):
                digests.update(more)
                total += len(more)
                data = pending + more if pending else more
                whole = min(len(data) // entry.itemsize, count - seen)
                if whole and chained:
                    block = np.frombuffer(data, entry, whole)
                    offsets = block["offset"].astype(np.int64)
                    ends = offsets + block["length"]
                    chained = offsets[0] == end and not (offsets[1:] != ends[:-1]).any()
                    end = int(ends[-1])
                seen += whole
                pending = data[whole * entry.itemsize :] if seen < count else b""
        except OSError as exc:
            raise ChecksumFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if total != HEADER.size + count * entry.itemsize:
        raise ChecksumFileError(
            f"{path}: {total} bytes, but a header announcing {count} records needs "
            f"{HEADER.size + count * entry.itemsize}"
        )
    if not chained:
        raise ChecksumFileError(f"{path}: its records do not follow each other from byte 0")
    return ChecksumTable(os.fspath(path), version, count, end), digests.hexdigests()


def damaged_in_table(window: RecWindow, table: ChecksumTable) -> tuple[list[int], np.ndarray]:
    """Return (positions, entries) of the entries of `table` whose bytes differ from their
    checksum (see `damaged_records`), reading the table a block at a time and the shard
    through `window` (`damaged_in_window`): what is held is a block of entries, and the
    damaged ones."""
    bad: list[int] = []
    found: list[np.ndarray] = []
    for first, block in table.blocks():
        rows = damaged_in_window(window, block)
        if rows:
            bad += [first + k for k in rows]
            found.append(block[rows].copy())
    entries = np.concatenate(found) if found else np.zeros(0, ENTRY[table.version])
    return bad, entries


def damaged_records(buf: ReadableBuffer, size: int, entries: np.ndarray) -> list[int]:
    """Return the positions in `entries` whose bytes in `buf` (`size` bytes) differ from their
    checksum (CRC-32 or xxh3-64, as the file's version says), or that run past its end."""
    offsets = entries["offset"].astype(np.int64)
    ends = offsets + entries["length"]
    inside = ends <= size
    rows = np.flatnonzero(inside)
    version = version_of(entries)
    with memoryview(buf) as view:
        sums = _checksums(view, offsets[rows].tolist(), ends[rows].tolist(), version)
        actual = np.fromiter(sums, entries.dtype["checksum"], len(rows))
    bad = ~inside
    bad[rows] = actual != entries["checksum"][rows]
    return np.flatnonzero(bad).tolist()


def damaged_in_window(window: RecWindow, entries: np.ndarray) -> list[int]:
    """Return the positions in `entries` whose bytes differ from their checksum (see
    `damaged_records`), reading the shard through `window` a batch of records at a time, in
    file order: its pages are handed back as it goes (verify, unpack)."""
    offsets = entries["offset"].astype(np.int64)
    order = ascending(offsets)
    starts = offsets if order is None else offsets[order]
    rows = entries if order is None else entries[order]
    bad: list[int] = []
    try:
        for i, j, lo, hi in window.batches(starts):
            part = rows[i:j]
            window.hold(lo, max(hi, int((starts[i:j] + part["length"]).max())))
            bad += [i + k for k in damaged_records(window.mapping, window.size, part)]
    finally:
        window.drop()
    return bad if order is None else sorted(order[bad].tolist())


def stale_reason(entries: np.ndarray, size: int) -> str | None:
    """Return why `entries` cannot describe a .rec of `size` bytes (their records end
    elsewhere), or None."""
    end = int(entries["offset"][-1]) + int(entries["length"][-1]) if len(entries) else 0
    return _stale(len(entries), end, size)


def _stale(count: int, end: int, size: int) -> str | None:
    if end == size:
        return None
    return (
        f"describes {count} records ending at byte {end}, but the .rec has {size} "
        "bytes: written for another file?"
    )
