"""Read MXNet RecordIO datasets (.rec/.idx) with the standard library and numpy only.

    ds = open_dataset("out/faces", decode="rgb")  # manifest, prefix, .rec, [shards] or folder
    image, label = ds[0]                            # HWC uint8 array, float label

rectool reads every record through this module, and `rectool reader` copies it verbatim into
training code. It never writes a file. Decoding imports OpenCV on first use, and reads each
image's size from its header first: one over `max_pixels` (default 50 million) is refused,
never decoded (`admit_image`, `ImageTooLargeError`).
"""

from __future__ import annotations

import bisect
import errno
import glob
import json
import mmap
import operator
import os
import re
import stat
import struct
import threading
import zlib
from collections import namedtuple
from itertools import accumulate, pairwise
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the checker's names: standard library and numpy only
    from collections.abc import Callable, Iterable, Iterator

    import numpy as np
    from numpy.typing import NDArray

    StrPath = str | os.PathLike[str]
    Ints = NDArray[np.int64]  # .idx keys, offsets
    Data = bytes | bytearray | memoryview  # image bytes
    Source = StrPath | list[StrPath] | tuple[StrPath, ...]  # see resolve_source
    Decode = str | Callable[[bytes], Any] | None

__all__ = [
    "Header", "ImageTooLargeError", "IndexFormatError", "RecordDataset", "RecordFile",
    "RecordFormatError", "RectoolError", "decode_image", "insightface_header", "load_index",
    "open_dataset", "unpack_header",
]  # fmt: skip


class _LazyNumpy:
    """numpy, imported on first use: the CLI loads this module for its errors only."""

    def __getattr__(self, name: str) -> Any:
        global np
        import numpy as np

        return getattr(np, name)


np = _LazyNumpy()  # type: ignore[assignment]  # a stand-in: numpy is imported on first use

FORMAT_VERSION = 1
# dmlc-core recordio.h: parts of magic:u32, lrec:u32 = cflag << 29 | length, data, padding.
MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
PART_HEADER = struct.Struct("<II")
LENGTH_BITS = 29
LENGTH_MASK = MAX_RECORD_BYTES = (1 << LENGTH_BITS) - 1
CFLAG_WHOLE, CFLAG_FIRST, CFLAG_MIDDLE, CFLAG_LAST = 0, 1, 2, 3
# MXNet recordio.py image header IRHeader(flag, label, id, id2); flag > 0: float32 labels follow.
IMAGE_HEADER = struct.Struct("<IfQQ")
IMAGE_HEADER_SIZE = IMAGE_HEADER.size
# The .idx cache `<idx>.rtc` (rectool writes it, this module only reads it): magic, .idx size,
# mtime_ns, record count, CRC-32 of the .idx, CRC-32 of its sample (version 2: 0); then int64
# keys, then int64 offsets, 8-byte aligned: mapped in place, never copied. Version 3 is checked
# against a sample of the .idx (`index_sample_crc`), version 2 against all of it.
INDEX_CACHE_MAGIC, INDEX_CACHE_MAGIC_V2 = b"RTIDXC03", b"RTIDXC02"
INDEX_CACHE_HEADER = struct.Struct("<8sQqQII")
INDEX_SAMPLE_BLOCKS, INDEX_SAMPLE_BYTES = 64, 1 << 14  # 1 MiB: all of a small .idx
# A pack of several shards has one cache of them all, `PREFIX.idx.rtc`: magic, shard count,
# record count; per shard its .idx size, mtime_ns, record count and sample CRC-32 (padded to
# 32 bytes); then all keys, then all offsets, in manifest order (one mapping for all workers).
DATASET_CACHE_MAGIC = b"RTIDXD01"
DATASET_CACHE_HEADER, DATASET_CACHE_SHARD = struct.Struct("<8sQQ"), struct.Struct("<QqQI4x")
INDEX_BLOCK_BYTES = 1 << 25  # the .idx text is parsed a block at a time
# Manifest version 2 gives each file's xxh3-128 (SHA-256 optional); version 1, SHA-256 only.
MANIFEST_SUFFIX, MANIFEST_FORMAT, MANIFEST_VERSION = ".manifest.json", "rectool-manifest", 2
# An unfinished pack's state file, and the journal of a replacement not yet finished: a prefix
# with either is not a dataset to read (rectool's output module writes them).
STATE_SUFFIX, JOURNAL_SUFFIX = ".pack-state.json", ".commit-journal.json"
DATASET_LAYOUTS = ("images", "insightface")
DECODE_MODES = ("bgr", "rgb", "gray")
_RECORD_HEAD = struct.Struct("<IIIf")  # magic, lrec, flag, label: the fast path's one unpack
Header = namedtuple("Header", "flag label id id2")


class RectoolError(Exception):
    """Base class of every error rectool raises on purpose."""


class RecordFormatError(RectoolError):
    """Bytes on disk are not what the format says: names the file, key and byte offset."""

    def __init__(
        self, message: str, path: StrPath | None = None, offset: int | None = None, key: Any = None
    ) -> None:
        self.reason, self.offset, self.key = message, offset, key
        self.path = None if path is None else os.fspath(path)
        pairs = zip((self.path or "", f"key {key}", f"byte offset {offset}"), (path, key, offset))
        where = ", ".join(text for text, value in pairs if value is not None)
        super().__init__(f"{where}: {message}" if where else message)


class IndexFormatError(RecordFormatError):
    """An .idx file cannot be parsed: names the file and line."""

    def __init__(self, message: str, path: StrPath | None = None, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message, path)


class InputError(RectoolError):
    """An input that cannot be used at all: missing, not a regular file, not a dataset, or a
    manifest that cannot be read (the command line exits 2, as for a usage error)."""


class SampleIndexError(RectoolError, IndexError):
    """A sample index outside the dataset (an `IndexError`, so iteration protocols stop)."""


def open_regular(
    path: StrPath, what: str, max_bytes: int | None = None, follow: bool = True
) -> tuple[int, os.stat_result]:
    """Open `path` read-only and return (fd, stat); refuse anything but a regular file.

    Every file rectool reads is opened here (`rectool.doors.inputs` adds the folder rule). Opened
    non-blocking and checked with fstat first: a FIFO would block, a device never end.
    `max_bytes` bounds the size; `follow=False` refuses a link (`O_NOFOLLOW`).
    """
    nofollow = 0 if follow else getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | nofollow)
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except OSError as exc:
        why = "is a symbolic link" if nofollow and exc.errno == errno.ELOOP else exc.strerror
        raise InputError(f"{path}: cannot open the {what} ({why})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (max_bytes is not None and st.st_size > max_bytes):
        os.close(fd)
        if stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: the {what} is {st.st_size} bytes, over {max_bytes}")
        raise InputError(f"{path}: not a regular file (the {what} must be one)")
    return fd, st


def unpack_header(
    record: bytes, path: StrPath | None = None, offset: int | None = None
) -> tuple[Header, bytes]:
    """Split one record into its `Header` and image bytes, as `mxnet.recordio.unpack` does."""
    found = peek_header(record)
    if found is None:
        raise RecordFormatError(
            f"record of {len(record)} bytes is shorter than the {IMAGE_HEADER_SIZE}-byte "
            "image header", path, offset,
        )  # fmt: skip
    head, start = found
    if start > len(record):
        raise RecordFormatError(
            f"header announces {head.flag} float32 labels but the record has only "
            f"{len(record) - IMAGE_HEADER_SIZE} bytes after the header", path, offset,
        )  # fmt: skip
    if head.flag > 0:
        head = head._replace(label=np.frombuffer(record, np.float32, head.flag, IMAGE_HEADER_SIZE))
    return head, record[start:]


def peek_header(record: bytes) -> tuple[Header, int] | None:
    """Return (`Header` with the header's own float label, where the image starts) of a record.

    Never raises (as `unpack_header` does, for `rectool verify` to report): None when the
    record is shorter than the header, a start past its end when the labels it announces are.
    """
    if len(record) < IMAGE_HEADER_SIZE:
        return None
    head = Header(*IMAGE_HEADER.unpack_from(record, 0))
    return head, IMAGE_HEADER_SIZE + 4 * head.flag


def parse_index(
    data: bytes, path: StrPath | None = None, chunk: int = 1 << 20, first_line: int = 1
) -> tuple[Ints, Ints]:
    """Parse .idx text (`key TAB offset` lines) into int64 arrays (keys, offsets), in file order.

    Repeated keys stay (lookups take the last line, as MXNet does). Runs of equally wide
    lines, as packs write them, are parsed as 2-D byte arrays, the rest by numpy's text parser;
    a line-by-line pass raises `IndexFormatError` naming the first bad line (`data` starting at
    line `first_line` of the file).
    """
    data += b"\n" if data and not data.endswith(b"\n") else b""
    a, pos, keys, offsets, runs = np.frombuffer(data, np.uint8), 0, [], [], 0
    while pos < len(data) and runs < 256:
        runs += 1
        nl = data.find(b"\n", pos, pos + 40)
        k, width = data.find(b"\t", pos, nl) - pos, nl + 1 - pos
        if not (1 <= k <= 18 and 3 <= width - k <= 20):  # <= 18 digits: no int64 overflow
            break
        grid = a[pos : pos + (len(data) - pos) // width * width].reshape(-1, width)
        low, high = 1, len(grid)  # bisect for a row that does not look like a line
        while low < high:
            mid = (low + high) // 2
            low, high = (mid + 1, high) if grid[mid, k] == 9 and grid[mid, -1] == 10 else (low, mid)
        powers = 10 ** np.arange(width - 3, -1, -1, dtype=np.int64)
        for start in range(0, low, chunk):  # then check every byte of the run
            b = grid[start : min(low, start + chunk)] - 48  # digits 0..9; TAB 217, NL 218
            ok = (b[:, k] == 217) & (b[:, -1] == 218)
            if not ok.all() or np.count_nonzero(b >= 10) != 2 * len(b):
                b = b[: int(np.argmin(ok & ((b < 10).sum(1) == width - 2)))]
            keys.append(np.einsum("ij,j->i", b[:, :k], powers[-k:]))
            offsets.append(np.einsum("ij,j->i", b[:, k + 1 : -1], powers[k - width + 2 :]))
            pos += len(b) * width
            if len(b) < chunk:
                break
        if not len(keys[-1]):
            break
    tail, tail_keys, tail_offsets = data[pos:] if pos else data, [], []
    lines = tail.count(b"\n")
    # The rest (widths varying at random, as in a shuffled im2rec .idx): numpy's whitespace-blind
    # parser pairs each key with its offset once deleting the digits leaves only "\t\n" lines.
    if tail.translate(None, b"0123456789") == b"\t\n" * lines:
        values = np.fromstring(tail, np.int64, sep=" ") if tail else np.empty(0, np.int64)
        if len(values) == 2 * lines and not (values == 2**63 - 1).any():
            tail = b""
            keys.append(values[0::2]), offsets.append(values[1::2])
    for line, raw in enumerate(tail.split(b"\n")[:-1], sum(map(len, keys)) + first_line):
        fields = raw.strip().split(b"\t")
        try:
            key, offset = int(fields[0]), int(fields[1])
        except (ValueError, IndexError):
            why = (
                "expected 'key<TAB>offset'"
                if len(fields) < 2
                else "key and offset must be integers"
            )
            raise IndexFormatError(f"{why}, got {raw[:80]!r}", path, line) from None
        if not (0 <= offset < 2**63 and -(2**63) <= key < 2**63):
            raise IndexFormatError(f"number out of range in {raw[:80]!r}", path, line)
        tail_keys.append(key), tail_offsets.append(offset)
    keys.append(np.array(tail_keys, np.int64)), offsets.append(np.array(tail_offsets, np.int64))
    return np.concatenate(keys), np.concatenate(offsets)


def parse_index_stream(
    f: Any, path: StrPath | None = None, block: int = INDEX_BLOCK_BYTES
) -> tuple[Ints, Ints]:
    """Parse the .idx text of the open file `f` a `block` of bytes at a time, as `parse_index`.

    The temporaries are a block's: the arrays are allocated for the most lines the file's
    size allows (untouched pages cost nothing) and shrunk in place at the end.
    """
    cap = os.fstat(f.fileno()).st_size // 4 + 1  # "0\t0\n": no line is shorter
    keys, offsets, n, pending = np.empty(cap, np.int64), np.empty(cap, np.int64), 0, b""
    while True:
        more = f.read(block)
        data = pending + more if pending else more
        cut = data.rfind(b"\n") + 1 if more else len(data)
        if not cut and more:
            pending = data  # a line longer than a block: read on
            continue
        data, pending = (data[:cut], data[cut:]) if cut < len(data) else (data, b"")
        k, o = parse_index(data, path, first_line=n + 1)
        k, o = k[: cap - n], o[: cap - n]  # a file grown since opened: its size then counts
        keys[n : n + len(k)], offsets[n : n + len(k)] = k, o
        n += len(k)
        if not more:
            break
    keys.resize(n, refcheck=False), offsets.resize(n, refcheck=False)
    return keys, offsets


def index_cache_path(idx_path: StrPath) -> str:
    """Return the path of the binary cache that rectool keeps next to an .idx file."""
    return os.fspath(idx_path) + ".rtc"


def load_index(idx_path: StrPath, cache: bool = True) -> tuple[Ints, Ints]:
    """Read an .idx into int64 arrays (keys, offsets) in file order, from its cache if current.

    From the cache, the arrays are read-only views of its mapping, never copied (a pickled
    `RecordDataset` carries them as their place in the cache, mapped again on arrival).
    """
    idx_path = os.fspath(idx_path)
    fd, st = open_regular(idx_path, "index file")
    with os.fdopen(fd, "rb") as f:
        cached = read_index_cache(idx_path, st, f.fileno()) if cache else None
        return parse_index_stream(f, idx_path) if cached is None else cached


def index_sample_crc(fd: int, size: int) -> int:
    """Return the CRC-32 of the .idx bytes a version-3 cache is checked against.

    All of an .idx up to 1 MiB, else 64 blocks of 16 KiB spread evenly, first and last block
    included: another pack's .idx copied in with its size and time kept (`cp -p`, `rsync -a`)
    differs there. `rectool verify` compares the whole cache with the .idx text.
    """
    blocks, length = INDEX_SAMPLE_BLOCKS, INDEX_SAMPLE_BYTES
    if size <= blocks * length:
        blocks, length = 1, size
    crc = 0
    for i in range(blocks):
        crc = zlib.crc32(os.pread(fd, length, (size - length) * i // max(1, blocks - 1)), crc)
    return crc


def read_index_cache(
    idx_path: StrPath, st: os.stat_result | None = None, idx_fd: int | None = None
) -> tuple[Ints, Ints] | None:
    """Return (keys, offsets) mapped from the .idx cache, or None if missing, stale or damaged."""
    if idx_fd is None:
        with os.fdopen(open_regular(idx_path, "index file")[0], "rb") as f:
            return read_index_cache(idx_path, st, f.fileno())
    path, st = index_cache_path(idx_path), st or os.fstat(idx_fd)
    try:
        fd, cst = open_regular(path, "index cache", follow=False)
    except RectoolError:
        return None
    try:
        head = os.pread(fd, INDEX_CACHE_HEADER.size, 0)
        if len(head) < INDEX_CACHE_HEADER.size:
            return None
        magic, size, mtime_ns, count, crc, sample = INDEX_CACHE_HEADER.unpack(head)
        if magic not in (INDEX_CACHE_MAGIC, INDEX_CACHE_MAGIC_V2):
            return None
        if (size, mtime_ns, cst.st_size) != (st.st_size, st.st_mtime_ns, len(head) + 16 * count):
            return None
        if magic == INDEX_CACHE_MAGIC_V2:  # version 2: the CRC of the whole .idx
            sample = 0
            for start in range(0, size, 1 << 24):
                sample = zlib.crc32(os.pread(idx_fd, 1 << 24, start), sample)
            fresh = sample == crc
        else:
            fresh = index_sample_crc(idx_fd, size) == sample
        return _map_cache(path, fd, cst) if fresh else None
    finally:
        os.close(fd)


class _IndexCacheMap(mmap.mmap):
    """The read-only mapping of one .rtc, with its path and file identity (for pickling)."""

    path: str
    identity: tuple[int, int, int, int]
    head: int  # where the keys start


def _map_cache(
    path: str, fd: int, st: os.stat_result, head: int = INDEX_CACHE_HEADER.size
) -> tuple[Ints, Ints] | None:
    try:
        mm = _IndexCacheMap(fd, 0, access=mmap.ACCESS_READ)
    except OSError:  # ENOMEM under a memory limit: parse the text instead
        return None
    mm.path, mm.identity, mm.head = path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), head
    count = (st.st_size - head) // 16
    body = np.frombuffer(mm, np.int64, 2 * count, head)
    return body[:count], body[count:]


def dataset_cache_path(manifest_path: str) -> str:
    """Return the path of the index cache of a pack of several shards (`PREFIX.idx.rtc`)."""
    return manifest_path[: -len(MANIFEST_SUFFIX)] + ".idx.rtc"


def read_dataset_cache(
    manifest_path: str, idx_paths: list[str]
) -> tuple[Ints, Ints, list[tuple[Ints, Ints]]] | None:
    """Return (keys, offsets, [(keys, offsets) of each shard]), views of a pack's dataset cache
    mapped, or None if missing, stale (any .idx's size, time or sample CRC differs) or damaged."""
    size = DATASET_CACHE_HEADER.size + DATASET_CACHE_SHARD.size * len(idx_paths)
    path = dataset_cache_path(manifest_path)
    try:
        fd, cst = open_regular(path, "index cache", follow=False)
    except RectoolError:
        return None
    try:
        head = os.pread(fd, size, 0).ljust(size, b"\0")  # a file cut short fails the size check
        magic, shards, count = DATASET_CACHE_HEADER.unpack_from(head)
        entries = list(DATASET_CACHE_SHARD.iter_unpack(head[DATASET_CACHE_HEADER.size :]))
        whole = (magic, shards, cst.st_size, sum(e[2] for e in entries))
        if whole != (DATASET_CACHE_MAGIC, len(idx_paths), size + 16 * count, count):
            return None
        if not all(map(_same_index, idx_paths, entries)):
            return None
        arrays, ends = _map_cache(path, fd, cst, size), [0, *accumulate(e[2] for e in entries)]
        if arrays is None:
            return None
        return (*arrays, [(arrays[0][a:b], arrays[1][a:b]) for a, b in pairwise(ends)])
    finally:
        os.close(fd)


def _same_index(idx: str, entry: tuple[int, int, int, int]) -> bool:
    """Whether the .idx has the size, time and sample CRC a dataset cache's entry gives."""
    fd, st = open_regular(idx, "index file")
    try:
        same = (st.st_size, st.st_mtime_ns) == entry[:2]
        return same and index_sample_crc(fd, st.st_size) == entry[3]
    finally:
        os.close(fd)


def _mapping_of(a: object) -> mmap.mmap | None:
    """Return the mmap an array views (np.frombuffer's base is a memoryview of it), or None."""
    while isinstance(a, np.ndarray):
        a = a.base
    a = getattr(a, "obj", a)
    return a if isinstance(a, mmap.mmap) else None


def _cache_place(a: NDArray[Any]) -> tuple[Any, ...] | None:
    """Return ("mapped", path, identity, header size, first item, count) for a contiguous view
    of a cache."""
    mm = _mapping_of(a)
    if not isinstance(mm, _IndexCacheMap) or a.dtype != np.int64 or a.ndim != 1:
        return None
    if len(a) > 1 and a.strides != (8,):
        return None
    start = a.__array_interface__["data"][0] - np.frombuffer(mm, np.uint8).ctypes.data
    return "mapped", mm.path, mm.identity, mm.head, (start - mm.head) // 8, len(a)


def _remap(place: tuple[Any, ...]) -> Ints:
    """Return the array a `_cache_place` names, mapping that same cache again."""
    _, path, identity, head, first, count = place
    fd, st = open_regular(path, "index cache", follow=False)
    try:
        same = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == identity
        arrays = _map_cache(path, fd, st, head) if same else None
    finally:
        os.close(fd)
    if arrays is None:
        raise RectoolError(f"{path} was replaced after the dataset was opened; open it again")
    return arrays[0].base[first : first + count]  # type: ignore[index]  # the whole body


def _release_pages(a: object) -> None:
    """Drop this process's page-table entries of a mapping (its pages stay in the page cache)."""
    mm = _mapping_of(a)
    if mm is not None and len(mm) and hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_DONTNEED)


class RecordFile:
    """A .rec mapped read-only on first use in each process: records by offset, parts rejoined.

    Pickles as its path (for DataLoader workers); a forked child maps the file afresh. The
    file mapped first is the one it reads: mapping again (after `close`, a fork or pickling)
    refuses another file at the path (a pack replaced by `--overwrite`), by one fstat.
    """

    _mm: Any  # the mapping (b"" for an empty file); None while closed

    def __init__(self, path: StrPath, identity: tuple[int, ...] | None = None) -> None:
        self.path, self._mm, self._size, self._generation = os.fspath(path), None, 0, -1
        self._identity = identity  # (st_dev, st_ino, st_size, st_mtime_ns) of the file mapped

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "identity": self._identity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state.get("identity"))  # type: ignore[misc]  # a subclass's

    def __enter__(self) -> RecordFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> mmap.mmap | bytes:
        """Return the mapping of the file in this process, mapping it on first use."""
        if self._generation == _generation:
            return self._mm
        with _map_lock:
            if self._generation != _generation:
                self.close()
                fd, st = open_regular(self.path, "record file")
                identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                if self._identity not in (None, identity):
                    os.close(fd)
                    raise RectoolError(
                        f"{self.path} was replaced after the dataset was opened; open it again"
                    )
                self._identity = identity
                try:  # the mapping keeps its own descriptor
                    self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if st.st_size else b""
                except OSError as exc:  # ENOMEM under a memory limit (ulimit -v)
                    raise RectoolError(f"{self.path}: cannot map the record file ({exc})") from None
                finally:
                    os.close(fd)
                self._size, self._generation = st.st_size, _generation
            return self._mm

    def close(self) -> None:
        """Release the mapping (the next read maps the file again)."""
        mm, self._generation, self._mm = self._mm, -1, None  # readers check the generation
        if isinstance(mm, mmap.mmap):
            mm.close()

    @property
    def size(self) -> int:
        """Return the file size in bytes."""
        return len(self.open())

    def next_offset(self, offset: int, key: int | None = None) -> int:
        """Return the byte offset just past the record starting at `offset` (padding included)."""
        return self.read_parts(offset, key)[1]

    def read_at(self, offset: int, key: int | None = None) -> bytes:
        """Return the record whose first part starts at byte `offset`, split parts rejoined."""
        mm = self.open()
        if offset + 8 <= self._size and not offset & 3 and offset >= 0:
            magic, lrec = PART_HEADER.unpack_from(mm, offset)
            end = offset + 8 + (lrec & LENGTH_MASK)
            if magic == MAGIC and lrec >> LENGTH_BITS == 0 and (end + 3) & ~3 <= self._size:
                return mm[offset + 8 : end]
        return self.read_parts(offset, key)[0]

    def read_parts(self, offset: int, key: int | None = None) -> tuple[bytes, int]:
        """Read the record at `offset` part by part; return (bytes, offset after it)."""
        pieces: list[bytes]
        mm, size, start, pieces = self.open(), self._size, offset, []

        def fail(message: str, at: int | None = None) -> RecordFormatError:
            return RecordFormatError(message, self.path, start if at is None else at, key)

        if offset < 0 or offset & 3:
            raise fail("offset is not a record start (not 4-byte aligned)")
        cflag = None
        while cflag not in (CFLAG_WHOLE, CFLAG_LAST):
            if offset + 8 > size:
                where = "at end of file" if offset == size else "in a truncated part header"
                raise fail(
                    f"expected a record part header, found {where} (file is {size} bytes)", offset
                )
            magic, lrec = PART_HEADER.unpack_from(mm, offset)
            cflag, length = lrec >> LENGTH_BITS, lrec & LENGTH_MASK
            if magic != MAGIC:
                raise fail(
                    f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x}): not a record start", offset
                )
            if not pieces and cflag not in (CFLAG_WHOLE, CFLAG_FIRST):
                raise fail(f"part has continuation flag {cflag}: not a record start", offset)
            if pieces and cflag not in (CFLAG_MIDDLE, CFLAG_LAST):
                raise fail(f"split record continues with flag {cflag}, expected 2 or 3", offset)
            if offset + 8 + ((length + 3) & ~3) > size:
                raise fail(f"part of {length} bytes runs past end of file ({size} bytes)", offset)
            pieces.append(mm[offset + 8 : offset + 8 + length])
            offset += 8 + ((length + 3) & ~3)
        if offset - start - 8 * len(pieces) > MAX_RECORD_BYTES + 4:
            raise fail("split record exceeds 2**29 bytes")
        return (pieces[0] if len(pieces) == 1 else MAGIC_BYTES.join(pieces)), offset


def _after_fork_in_child() -> None:
    global _generation, _map_lock
    _generation += 1  # every RecordFile maps afresh: no getpid() per read
    _map_lock = threading.Lock()  # one that a parent thread held at the fork stays held


_generation, _map_lock = 0, threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# The manifest: the reader checks the fields it reads; inside rectool, `read_manifest` checks
# every field a command reads as well (rectool/format/manifest.py). 1 GiB holds the names of
# WebFace42M's 2M identities at any length (NAME_MAX), twice over.
MAX_MANIFEST_BYTES = 1 << 30
MAX_MANIFEST_DEPTH = 16  # rectool writes 3 levels (shards[0], options.transform)
_NOT_IN_NAMES = re.compile("[/\\\\\0\ud800-\udfff]")  # + half a UTF-16 pair: no name


def _plain_name(v: object) -> bool:
    return isinstance(v, str) and v not in ("", ".", "..") and not _NOT_IN_NAMES.search(v)


# A field's (test, what it must be); null always means "not recorded".
COUNT_FIELD = (lambda v: type(v) is int and 0 <= v < 1 << 63, "a count (an integer >= 0)")
NAME_FIELD = (_plain_name, "a plain file name in the manifest's folder")
LAYOUT_FIELD = (lambda v: v in DATASET_LAYOUTS, f"one of {DATASET_LAYOUTS}")
_SHARD = {"rec": NAME_FIELD, "idx": NAME_FIELD, "records": COUNT_FIELD, "rec_bytes": COUNT_FIELD}


def bad_field(path: str, field: str, want: str) -> InputError:
    """Return the `InputError` of a manifest field that is not what it must be."""
    return InputError(f"{path}: manifest field {field!r} must be {want}")


def check_fields(path: str, obj: dict[str, Any], fields: dict[str, Any], where: str = "") -> None:
    """Raise `bad_field` for the first of `fields` ({name: (test, want)}) set in `obj` but wrong."""
    for name, (test, want) in fields.items():
        if obj.get(name) is not None and not test(obj[name]):
            raise bad_field(path, where + name, want)


def read_manifest(path: StrPath, require: Iterable[str] = ()) -> dict[str, Any]:
    """Read and check a pack manifest; raise `InputError` naming the file and field.

    `require`: dotted names ("totals.images") of fields that must be present and not null.
    """
    path = os.fspath(path)
    fd, st = open_regular(path, "manifest")
    with os.fdopen(fd, "rb") as f:
        data = f.read(st.st_size + 1) if st.st_size <= MAX_MANIFEST_BYTES else b""
    if st.st_size > MAX_MANIFEST_BYTES or len(data) > MAX_MANIFEST_BYTES:
        raise InputError(
            f"{path}: {max(st.st_size, len(data)):,} bytes, larger than a manifest can be "
            f"({MAX_MANIFEST_BYTES:,} bytes)"
        )
    try:
        doc, deep = json.loads(data), False
    except RecursionError:  # deeper than json's own limit (rectool checks the depth below it)
        doc, deep = None, True
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a JSON manifest ({exc})") from None
    if deep:
        raise too_deep(path)
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise InputError(f'{path}: not a rectool manifest (no "format": "{MANIFEST_FORMAT}")')
    version = doc.get("format_version", 0)
    if not (type(version) is int and version >= 0):
        raise bad_field(path, "format_version", "an integer >= 0")
    if version > MANIFEST_VERSION:
        raise InputError(
            f"{path}: manifest format version {version} is newer than this reader "
            f"understands ({MANIFEST_VERSION}); upgrade rectool"
        )
    check_fields(path, doc, {"layout": LAYOUT_FIELD})
    shards, seen = doc.get("shards"), set()
    if not isinstance(shards, list) or not shards:
        raise bad_field(path, "shards", "a list of {rec, idx, ...} objects, one or more")
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            raise bad_field(path, f"shards[{i}]", "an object")
        for name in ("rec", "idx"):
            if not _plain_name(shard.get(name)):
                raise bad_field(path, f"shards[{i}].{name}", NAME_FIELD[1])
            if shard[name] in seen:
                raise InputError(f"{path}: manifest lists the shard file {shard[name]!r} twice")
            seen.add(shard[name])
        check_fields(path, shard, _SHARD, f"shards[{i}].")
    if __name__ == "rectool.reader":  # not in the emitted copy, which reads no other field
        from rectool.format.manifest import check_command_fields

        check_command_fields(path, doc, data)
    for field in require:
        value: Any = doc
        for part in field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            raise InputError(f"{path}: manifest field {field!r} is missing (or null)")
    return doc


def too_deep(path: str) -> InputError:
    """Return the `InputError` of a manifest nested deeper than `MAX_MANIFEST_DEPTH`."""
    return InputError(
        f"{path}: not a rectool manifest (JSON nested more than {MAX_MANIFEST_DEPTH} deep)"
    )


def resolve_source(
    source: Source,
) -> tuple[dict[str, Any] | None, str | None, list[tuple[str, str]]]:
    """Find a dataset's shards; return (manifest or None, manifest path or None, shards).

    `source`: a manifest (.json), a .rec, a pack prefix (`PREFIX.manifest.json`, `PREFIX.rec`,
    `PREFIX-00000.rec`...), a folder holding `train.rec` (insightface) or a list of .rec paths.
    `shards` lists (rec, idx) path pairs; each that exists is checked to be a regular file.
    """
    if isinstance(source, (list, tuple)):
        if not source:
            raise InputError("no shard paths given")
        recs = [os.fspath(p) for p in source]
        for prefix in {p for rec in recs for p in source_prefixes(rec)}:
            refuse_unfinished(prefix)
    elif os.path.isdir(source := os.fspath(source)):
        if os.path.exists(os.path.join(source, "train.rec")):
            return resolve_source(os.path.join(source, "train.rec"))
        packs = sorted(n for n in os.listdir(source) if n.endswith(MANIFEST_SUFFIX))
        if len(packs) == 1:  # a folder holding one rectool pack: that pack
            return resolve_source(os.path.join(source, packs[0]))
        some = f" ({len(packs)} manifests: name one)" if packs else ""
        raise InputError(
            f"{source}: a folder without train.rec or one pack{some}; give a manifest, .rec "
            "or prefix"
        )
    elif source.endswith(".json"):
        for prefix in source_prefixes(source):
            refuse_unfinished(prefix)
        manifest, folder = read_manifest(source), os.path.dirname(source)
        shards = [(s["rec"], s["idx"]) for s in manifest["shards"]]
        pairs = [(os.path.join(folder, rec), os.path.join(folder, idx)) for rec, idx in shards]
        return manifest, source, _checked(pairs)
    elif source.endswith(".rec"):
        named = source[:-4] + MANIFEST_SUFFIX
        if os.path.exists(named) and os.path.exists(source):  # a pack of one shard
            found = resolve_source(named)
            if len(found[2]) == 1 and os.path.samefile(found[2][0][0], source):
                return found
        if not os.path.exists(source):
            raise InputError(f"{source}: record file not found")
        for prefix in source_prefixes(source):
            refuse_unfinished(prefix)
        recs = [source]
    elif os.path.exists(source + MANIFEST_SUFFIX):
        return resolve_source(source + MANIFEST_SUFFIX)
    elif os.path.exists(source + ".rec"):
        return resolve_source(source + ".rec")
    else:
        refuse_unfinished(source)
        recs = sorted(glob.glob(glob.escape(source) + "-[0-9][0-9][0-9][0-9][0-9].rec"))
        if not recs:
            raise InputError(
                f"{source}: no dataset here (looked for {source}{MANIFEST_SUFFIX}, {source}.rec, "
                f"{source}-00000.rec)"
            )
    return None, None, _checked([(p, os.path.splitext(p)[0] + ".idx") for p in recs])


def refuse_unfinished(prefix: str) -> None:
    """Raise when the pack at `prefix` is unfinished or half replaced (never read as whole)."""
    if os.path.lexists(prefix + JOURNAL_SUFFIX):
        raise RectoolError(
            f"{prefix}: a run that was replacing this pack was interrupted after the new pack "
            f"was complete ({prefix}{JOURNAL_SUFFIX} lists what is left to move); "
            f"`rectool verify {prefix}` finishes it"
        )
    if os.path.lexists(prefix + STATE_SUFFIX):
        raise RectoolError(
            f"{prefix}: an unfinished pack ({prefix}{STATE_SUFFIX} is there); continue it: run "
            "the command that wrote it again with --resume"
        )


def source_prefixes(source: str) -> list[str]:
    """Return the pack prefixes a source path may belong to (for `refuse_unfinished`)."""
    if source.endswith(MANIFEST_SUFFIX):
        return [source[: -len(MANIFEST_SUFFIX)]]
    if source.endswith(".rec"):
        stem = source[:-4]
        numbered = len(stem) > 6 and stem[-6] == "-" and stem[-5:].isdigit()
        return [stem, stem[:-6]] if numbered else [stem]
    return [source]


def _checked(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    if len({os.path.realpath(rec) for rec, _ in pairs}) < len(pairs):
        raise InputError(f"{pairs[0][0]}: a shard is listed twice")
    for path in (p for pair in pairs for p in pair):
        if os.path.exists(path) and not os.path.isfile(path):  # a missing file: its opener says
            raise InputError(f"{path}: not a regular file (shard files must be)")
    return pairs


def _check_shard(
    rf: RecordFile,
    idx: str,
    keys: Ints,
    offsets: Ints,
    listed: dict[str, Any],
    manifest_path: str | None,
) -> None:
    """Refuse a shard whose .idx does not describe its .rec (a few records are read)."""
    size = len(rf.open())
    if listed.get("records") not in (None, len(keys)):
        raise RectoolError(
            f"{idx}: {len(keys)} index lines, but the manifest {manifest_path} lists "
            f"{listed['records']} records for this shard: the .idx or the manifest is stale"
        )
    if listed.get("rec_bytes") not in (None, size):
        raise RectoolError(
            f"{rf.path}: {size} bytes, but the manifest {manifest_path} lists "
            f"{listed['rec_bytes']}: the file changed after packing"
        )
    if not len(keys) and size:
        raise RectoolError(
            f"{idx}: empty index beside {rf.path} of {size} bytes "
            "(rebuild it with `rectool reindex`)"
        )
    past = np.flatnonzero((offsets > size - 8) | (offsets < 0))[:1].tolist()  # a crafted cache
    # A few records, the farthest one included, must start where the index says.
    for line in sorted(
        {0, len(keys) // 2, len(keys) - 1, int(np.argmax(offsets)), *past} if len(keys) else ()
    ):
        offset, key = int(offsets[line]), int(keys[line])
        try:
            rf.read_parts(offset, key)
        except RecordFormatError as exc:
            raise RecordFormatError(
                f"{exc.reason}; the index {idx} is stale or belongs to another .rec (rebuild it "
                "from the .rec)", rf.path, offset, key,
            ) from None  # fmt: skip


def insightface_header(
    read: Callable[[int], tuple[Header, bytes]], keys: Ints
) -> tuple[range, range] | None:
    """Return the key ranges (images, identities) that record 0 of an insightface .rec declares.

    Record 0 is that header only with flag 2, no image bytes, and two whole-number labels
    [N + 1, N + 1 + K], 1 <= N + 1 <= N + 1 + K, while key 1 (when N > 0 and it is there) has
    a scalar label: keys 1..N are then the images, N+1..N+K the identity records (FORMAT-NOTES
    §5). Else None. `keys` are the .idx's (a repeated key: its last line counts, as in MXNet);
    `read(line)` returns `unpack_header` of the record on an .idx line.
    """
    zero, one = np.flatnonzero(keys == 0), np.flatnonzero(keys == 1)
    if not len(zero):
        return None
    head, body = read(int(zero[-1]))
    if head.flag != 2 or len(body):
        return None
    first, end = (float(x) for x in head.label)
    if not (first.is_integer() and end.is_integer() and 1 <= first <= end):
        return None
    if first > 1 and len(one) and read(int(one[-1]))[0].flag != 0:
        return None  # images with label vectors: an im2rec --pack-label pack
    return range(1, int(first)), range(int(first), int(end))


def _key_lines(keys: Ints, wanted: range, where: str) -> slice | Ints:
    """Return the .idx line of each key in the range `wanted` (a repeated key: its last line)."""
    if len(wanted) > len(keys):
        raise RectoolError(
            f"{where}: record 0 says keys up to {wanted[-1]} exist, but the index has only "
            f"{len(keys)} lines"
        )
    first = int(np.argmax(keys == wanted.start)) if len(wanted) else 0
    stop = first + len(wanted)
    block, rest = keys[first:stop], (keys[:first], keys[stop:])
    if len(block) == len(wanted) > 0 and (block[0], block[-1]) == (wanted[0], wanted[-1]):
        elsewhere = any(((k >= wanted.start) & (k < wanted.stop)).any() for k in rest)
        if not elsewhere and (block[1:] > block[:-1]).all():
            return slice(first, stop)  # each wanted key once, in order: a view, not a copy
    order = np.argsort(keys, kind="stable")
    want = np.arange(wanted.start, wanted.stop, dtype=np.int64)
    lines = order[np.maximum(np.searchsorted(keys, want, "right", sorter=order) - 1, 0)]
    missing = np.flatnonzero(keys[lines] != want)  # (keys holds key 0: never empty)
    if len(missing):
        raise RectoolError(
            f"{where}: key {int(want[missing[0]])} is not in the index, but record 0 says keys "
            f"up to {int(want[-1])} exist"
        )
    return lines


# --- decoding, behind one guard: the size an image's header declares is read, and refused
# over a budget, before any decoder allocates for it (333 bytes of JPEG can ask for 65000^2).
# The guard reads the formats rectool packs and refuses every other: a size it cannot read is
# a size it cannot bound. A cut JPEG (no end marker after its scan) or PNG (no IEND) is refused
# too: libjpeg would fill the missing rows with grey and return a picture that is not the image.

# 50 megapixels: more than a 45-megapixel full-frame camera (8192x5464) or a 48-megapixel phone
# (8000x6000) writes; 150 MB decoded in 8-bit colour (a progressive JPEG needs ~as much again).
DEFAULT_MAX_PIXELS = 50_000_000
JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # not DHT, JPG, DAC
JPEG_STANDALONE_MARKERS = frozenset((0x01, *range(0xD0, 0xD8)))


class ImageTooLargeError(RecordFormatError):
    """An image whose header declares more pixels than the decode budget (`max_pixels`)."""


def sniff_format(data: Data) -> str | None:
    """Return 'jpeg', 'png', 'bmp', 'gif', 'webp', 'tiff' or None from the first bytes."""
    head = bytes(data[:12])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    for kind, signatures in _SIGNATURES:
        if head.startswith(signatures):
            return kind if kind != "webp" or head[8:] == b"WEBP" else None
    return None


_SIGNATURES = (
    ("jpeg", b"\xff\xd8\xff"), ("png", b"\x89PNG\r\n\x1a\n"), ("bmp", b"BM"),
    ("gif", (b"GIF87a", b"GIF89a")), ("webp", b"RIFF"), ("tiff", (b"II*\0", b"MM\0*")),
)  # fmt: skip


def admit_image(data: Data, max_pixels: float = DEFAULT_MAX_PIXELS) -> tuple[str, int, int]:
    """Return (format, height, width) of image bytes that may be decoded, from their header.

    The one rule before every decoder in rectool. A JPEG's markers are read as libjpeg reads
    them, to its scan, which an end-of-image marker must follow; a PNG's chunks from IHDR to
    IEND; the other formats' headers are read. Raises `RecordFormatError` (without a location)
    for an unknown format or a cut header, and its subclass `ImageTooLargeError` when the
    header declares more than `max_pixels` pixels.
    """
    data = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    kind = sniff_format(data)
    if kind is None:
        raise RecordFormatError("not an image (unknown file signature)" if data else "empty file")
    try:
        height, width = _HEADERS[kind](data)
    except struct.error:
        raise RecordFormatError(f"truncated {kind.upper()} (ends inside its header)") from None
    if height <= 0 or width <= 0:
        raise RecordFormatError(f"corrupt {kind.upper()} (declares {width}x{height} pixels)")
    if height * width > max_pixels:
        raise ImageTooLargeError(
            f"the image declares {width}x{height} pixels ({height * width / 1e6:,.1f} "
            f"megapixels), over the decode limit of {max_pixels:,} (raise it with "
            "--max-pixels, or max_pixels=)"
        )
    return kind, height, width


def check_max_pixels(max_pixels: float) -> int:
    """Return `max_pixels` when it is a pixel budget (an int >= 1); raise ValueError if not."""
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(f"max_pixels must be an int >= 1, not {max_pixels!r}")
    return max_pixels


def _jpeg_size(data: bytes) -> tuple[int, int]:
    # As libjpeg reads markers (jdmarker.c): bytes before a marker are skipped, and the first
    # frame header sizes the image (a second one is an error).
    n, i, size = len(data), 2, None
    while True:
        if i + 4 > n:
            raise RecordFormatError("truncated JPEG (ends inside its headers)")
        if data[i] != 0xFF:
            i = data.find(b"\xff", i)
            i = n if i < 0 else i
            continue
        step = _MARKER_STEP[data[i + 1]]  # FF fill, 00 (no marker), RSTn, TEM: no length
        if step:
            i += step
            continue
        marker, length = data[i + 1], (data[i + 2] << 8) | data[i + 3]
        if marker == 0xDA:
            if size is None:
                raise RecordFormatError("corrupt JPEG (image data before any frame header)")
            break
        if marker in JPEG_FRAME_MARKERS and size is None:
            size = struct.unpack_from(">HH", data, i + 5)
        elif marker == 0xD9:
            raise RecordFormatError("corrupt JPEG (end-of-image marker before any image data)")
        i += 2 + length
    # Entropy-coded data stuffs every 0xFF with 0x00, so FF D9 after the scan header can only
    # be the end marker; bytes may follow it (camera trailers), so search from the end.
    if data.rfind(b"\xff\xd9", i + 2 + length) < 0:
        raise RecordFormatError("truncated JPEG (no end-of-image marker)")
    return size


_MARKER_STEP = bytes(
    1 if m == 0xFF else 2 if m in JPEG_STANDALONE_MARKERS or not m else 0 for m in range(256)
)


def _png_size(data: bytes) -> tuple[int, int]:
    # As libpng reads chunks: IHDR first, then each by its length, to IEND.
    n, pos = len(data), 8
    if data[12:16] != b"IHDR" or data[8:12] != b"\0\0\0\r":
        raise RecordFormatError("corrupt PNG (no valid IHDR chunk first)")
    while pos + 12 <= n:
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"IEND":
            return struct.unpack_from(">II", data, 16)[::-1]
        pos += 12 + length
    raise RecordFormatError("truncated PNG (no IEND chunk)")


def _bmp_size(data: bytes) -> tuple[int, int]:
    if struct.unpack_from("<I", data, 14)[0] == 12:  # OS/2 1.x: 16-bit sides
        return struct.unpack_from("<HH", data, 18)[::-1]
    width, height = struct.unpack_from("<ii", data, 18)
    return abs(height), width  # negative: rows stored top-down


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8X":  # the canvas: 24 bits a side, minus one
        width, height = (struct.unpack_from("<I", data, at)[0] >> 8 for at in (23, 26))
        return 1 + height, 1 + width
    if chunk == b"VP8L":  # lossless: 14 bits a side, minus one
        bits = struct.unpack_from("<I", data, 21)[0]
        return 1 + (bits >> 14 & 0x3FFF), 1 + (bits & 0x3FFF)
    if chunk == b"VP8 ":  # lossy: after the key frame's start code, 14 bits a side
        width, height = struct.unpack_from("<HH", data, 26)
        return height & 0x3FFF, width & 0x3FFF
    raise RecordFormatError(f"corrupt WEBP (first chunk {bytes(chunk)!r})")


def _tiff_size(data: bytes) -> tuple[int, int]:
    order = "<" if data[:1] == b"I" else ">"
    ifd = struct.unpack_from(order + "I", data, 4)[0]  # the first page: what OpenCV decodes
    found = {}
    for at in range(ifd + 2, ifd + 2 + 12 * struct.unpack_from(order + "H", data, ifd)[0], 12):
        tag, kind = struct.unpack_from(order + "HH", data, at)
        if tag in (256, 257) and kind in (3, 4):  # image width, length: SHORT or LONG
            found[tag] = struct.unpack_from(order + "HI"[kind - 3], data, at + 8)[0]
    return found.get(257, 0), found.get(256, 0)


_HEADERS = {
    "jpeg": _jpeg_size, "png": _png_size, "bmp": _bmp_size, "webp": _webp_size, "tiff": _tiff_size,
    "gif": lambda data: struct.unpack_from("<HH", data, 6)[::-1],  # the logical screen
}  # fmt: skip


def imdecode(
    data: Data, flags: int | Callable[[str, int, int], int], max_pixels: float = DEFAULT_MAX_PIXELS
) -> NDArray[np.uint8]:
    """Return `cv2.imdecode(data, flags)` of image bytes that `admit_image` admits.

    The one call of OpenCV's decoder in rectool. `flags` is an `IMREAD_*` flag, or a function
    of the admitted (format, height, width) returning one (to pick a reduced scale). Raises
    `ImageTooLargeError` before decoding an image over `max_pixels`, `RecordFormatError`
    (without a location) for any other refusal.
    """
    try:
        header = admit_image(data, max_pixels)
    except ImageTooLargeError:
        raise
    except RecordFormatError as exc:
        why = f": {exc.reason}"
        if sniff_format(data) is None:
            why = f" (they start with {bytes(data[:8])!r}): not a format rectool decodes"
            why += " (JPEG, PNG, BMP, GIF, WebP, TIFF)"
        raise _undecodable(data, why) from None
    cv2 = _opencv()
    try:
        image = cv2.imdecode(
            np.frombuffer(data, np.uint8), flags(*header) if callable(flags) else flags
        )
    except cv2.error as exc:
        raise _undecodable(data, f" (OpenCV: {str(exc).strip()[-120:]})") from None
    if image is None or not image.size:
        raise _undecodable(data, f" (they start with {bytes(data[:8])!r})")
    return image


def _undecodable(data: Data, why: str) -> RecordFormatError:
    return RecordFormatError(f"the {len(data)} image bytes cannot be decoded{why}")


_cv2 = None


def _opencv() -> Any:
    global _cv2
    if _cv2 is None:
        try:
            import cv2 as _cv2
        except ImportError:
            raise RectoolError(
                "decoding images needs OpenCV (pip install opencv-python-headless)"
            ) from None
    return _cv2


def decode_image(
    data: Data, mode: str = "bgr", max_pixels: float = DEFAULT_MAX_PIXELS
) -> NDArray[np.uint8]:
    """Decode image bytes into an HWC uint8 array ("bgr", "rgb" or "gray": H x W x 1).

    Raises `RecordFormatError` (without a location) when the bytes are empty, cut or
    undecodable, and its `ImageTooLargeError`, before decoding, when their header declares more
    than `max_pixels` pixels (see `admit_image`).
    """
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {DECODE_MODES}, not {mode!r}")
    if not len(data):
        raise RecordFormatError("empty image: the record holds a header and no image bytes")
    cv2 = _opencv()
    image = imdecode(data, cv2.IMREAD_GRAYSCALE if mode == "gray" else cv2.IMREAD_COLOR, max_pixels)
    if mode == "bgr":
        return image
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if mode == "rgb" else image[:, :, None]


def open_dataset(
    source: Source,
    decode: Decode = None,
    *,
    layout: str | None = None,
    cache: bool = True,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    **remote: Any,
) -> RecordDataset:
    """Open a packed dataset for training; return a `RecordDataset`.

    `source`: a manifest, pack prefix, .rec, list of .rec paths or insightface folder; or
    the URL of a manifest (s3://, gs://, https://...), read through a local shard cache by
    `rectool.remote` (`remote`: its `cache_dir=`, `cache_limit=`; docs/remote.md).
    `decode`: None (image bytes), "bgr", "rgb", "gray" (HWC uint8 arrays) or a function of
    the bytes. `layout` ("images" or "insightface") comes from the manifest or record 0.
    `max_pixels`: images whose header declares more pixels are refused before decoding
    (`ImageTooLargeError`); the training module's loaders take it from the dataset.
    """
    options: dict[str, Any] = dict(decode=decode, layout=layout, cache=cache, max_pixels=max_pixels)
    if isinstance(source, str) and re.match(r"(s3|gs|az|abfs|https?)://", source, re.I):
        try:
            from rectool.remote import open_remote
        except ImportError:
            raise RectoolError(
                f"reading {source} needs rectool: pip install 'rectool[remote]'"
            ) from None
        return open_remote(source, **options, **remote)
    if remote:
        raise TypeError(f"open_dataset() got options for a remote pack: {', '.join(remote)}")
    return RecordDataset(source, **options)


class RecordDataset:
    """The samples of a packed dataset, read at random through mmap: `ds[i] -> (image, label)`.

    The label is a float (header flag 0) or a float32 vector. Samples run shard by shard in
    .idx line order; in the insightface layout they are the images at keys 1..N only. Pickles
    without its open files, so it is ready for DataLoader workers (fork or spawn).
    """

    def __init__(
        self,
        source: Source,
        decode: Decode = None,
        layout: str | None = None,
        cache: bool = True,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        if not (decode is None or decode in DECODE_MODES or callable(decode)):
            raise ValueError(f"decode must be None, one of {DECODE_MODES} or a function")
        self.max_pixels = check_max_pixels(max_pixels)
        if layout is not None and layout not in DATASET_LAYOUTS:
            raise ValueError(f"layout must be one of {DATASET_LAYOUTS}, not {layout!r}")
        self.manifest, self.manifest_path, self.shards = resolve_source(source)
        self.decode, self._files = decode, [self._open_shard(rec) for rec, _ in self.shards]
        self._labels: NDArray[Any] | None = None
        self._identity_ranges: Ints | None = None
        self._identities = None
        listed = (self.manifest or {}).get("shards") or [{}] * len(self.shards)
        (keys, offsets), indexes = self._load_indexes(cache)
        try:
            for rf, (_, idx), info, index in zip(self._files, self.shards, listed, indexes):
                self._check_at_open(rf, idx, *index, info)
            shard_of = _shard_numbers([len(k) for k, _ in indexes])
            # An explicit layout= decides; a manifest's claim is checked against record 0.
            claim = layout or (self.manifest or {}).get("layout")
            ranges = None if layout == "images" else self._insightface(keys, offsets, shard_of)
            if ranges is None and claim == "insightface":
                raise RecordFormatError(
                    "record 0 is not an insightface header (flag 2, no image bytes, labels "
                    "[first identity key, end key])", self.shards[0][0], key=0,
                )  # fmt: skip
            if ranges is not None and claim == "images":
                raise RecordFormatError(
                    "the manifest says layout images, but record 0 is an insightface header "
                    "(open with layout='images' to read it as images)", self.shards[0][0], key=0,
                )  # fmt: skip
        finally:
            self.close()
        if ranges is not None:
            ids = _key_lines(keys, ranges[1], self.shards[0][1])
            self._identities = shard_of[ids], offsets[ids], keys[ids]
            lines = _key_lines(keys, ranges[0], self.shards[0][1])
            keys, offsets, shard_of = keys[lines], offsets[lines], shard_of[lines]
        self.layout = "images" if ranges is None else "insightface"
        self.keys, self.offsets, self._count = keys, offsets, len(keys)
        self._shard_table: NDArray[Any] | None = None
        self._bounds = None  # samples shard by shard (every images layout): bisect shard starts
        if len(self.shards) == 1 or (shard_of[1:] >= shard_of[:-1]).all():
            self._bounds = np.searchsorted(shard_of, np.arange(len(self.shards) + 1)).tolist()
        else:
            self._shard_table = shard_of
            shard_of.flags.writeable = False  # read by every read: public as shard_ids
        if keys.flags.writeable:
            keys.flags.writeable = offsets.flags.writeable = False
        for index_keys in {id(_mapping_of(k)): k for k, _ in indexes}.values():
            _release_pages(index_keys)  # checked whole: their pages are the page cache's again

    def __getstate__(self) -> dict[str, Any]:
        # Index arrays mapped from a cache travel as their place in it (mapped again on
        # arrival, shared through the page cache), labels not at all (read again if asked).
        state = {**self.__dict__, "_labels": None}
        if self._bounds is not None:  # the shard numbers follow from the bounds
            state["_shard_table"] = None
        for name in ("keys", "offsets", "_identities"):
            many = name == "_identities" and state[name] is not None
            arrays = state[name] if many else (state[name],)
            arrays = tuple(_cache_place(a) or a for a in arrays)
            state[name] = arrays if many else arrays[0]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        def load(a: Any) -> Any:
            return _remap(a) if isinstance(a, tuple) else a

        state["keys"], state["offsets"] = load(state["keys"]), load(state["offsets"])
        if state["_identities"] is not None:
            state["_identities"] = tuple(map(load, state["_identities"]))
        self.__dict__.update(state)

    @property
    def shard_ids(self) -> NDArray[Any]:
        """Every sample's shard number (an index into `shards`): made on first use where
        samples run shard by shard (1 byte a sample; reads bisect `shard_bounds` instead)."""
        if self._shard_table is None:
            ends = self._bounds or []  # set whenever the table is not
            self._shard_table = _shard_numbers([b - a for a, b in pairwise(ends)])
            self._shard_table.flags.writeable = False
        return self._shard_table

    @property
    def shard_bounds(self) -> list[int] | None:
        """Shard s holds samples `shard_bounds[s]` to `shard_bounds[s + 1] - 1`; None where
        samples do not run shard by shard (insightface images out of shard order). A copy."""
        return None if self._bounds is None else list(self._bounds)

    @property
    def shard_files(self) -> list[RecordFile]:
        """Each shard's `RecordFile`, as `shards` lists them (mapped on first read)."""
        return list(self._files)

    def _load_indexes(self, cache: bool) -> tuple[tuple[Ints, Ints], list[tuple[Ints, Ints]]]:
        """Return (all keys, all offsets), [(keys, offsets) of each shard]: views of one
        mapping when a pack of several shards has a current dataset cache."""
        idx_paths, where = [idx for _, idx in self.shards], self.manifest_path or ""
        if cache and len(idx_paths) > 1 and where.endswith(MANIFEST_SUFFIX):
            mapped = read_dataset_cache(where, idx_paths)
            listed = [s.get("records") for s in (self.manifest or {}).get("shards", [])]
            shards = [] if mapped is None else mapped[2]
            if mapped and all(n in (None, len(k)) for n, (k, _) in zip(listed, shards)):
                return mapped[:2], shards
        indexes = [load_index(idx, cache=cache) for idx in idx_paths]
        if len(indexes) == 1:
            return indexes[0], indexes
        keys, offsets = (np.concatenate(column) for column in zip(*indexes))
        return (keys, offsets), indexes

    def _open_shard(self, rec: str) -> RecordFile:
        """Return the `RecordFile` of a shard (rectool.remote's downloads it on first use)."""
        return RecordFile(rec)

    def _check_at_open(
        self, rf: RecordFile, idx: str, keys: Ints, offsets: Ints, listed: dict[str, Any]
    ) -> None:
        _check_shard(rf, idx, keys, offsets, listed, self.manifest_path)

    def _insightface(
        self, keys: Ints, offsets: Ints, shard_of: NDArray[Any]
    ) -> tuple[range, range] | None:
        def read(line: int) -> tuple[Header, bytes]:
            rf, offset = self._files[int(shard_of[line])], int(offsets[line])
            return unpack_header(rf.read_at(offset, int(keys[line])), rf.path, offset)

        return insightface_header(read, keys)

    def close(self) -> None:
        """Release this process's mappings and index pages (they come back on the next read).

        A loader worker calls it after each batch: else every page it ever read stays mapped
        and counts in its memory (PSS), though the page cache holds it either way.
        """
        for rf in self._files:
            rf.close()
        _release_pages(getattr(self, "offsets", None))

    def __enter__(self) -> RecordDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.manifest_path or self.shards[0][0]
        more = f" + {len(self.shards) - 1} shards" if len(self.shards) > 1 else ""
        return (
            f"RecordDataset({where!r}{more}, {len(self)} samples, layout={self.layout!r}, "
            f"decode={self.decode!r})"
        )

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for i in range(len(self)):
            yield self[i]

    def _locate(self, i: int) -> tuple[int, int]:
        """Return (shard, sample number) of index `i`, negative indices counted from the end."""
        i = given = operator.index(i)
        i += self._count if i < 0 else 0
        if not 0 <= i < self._count:
            raise SampleIndexError(
                f"sample {given} is out of range: the dataset has {self._count} samples"
            )
        if self._bounds is not None:  # no per-sample lookup: a cache miss per random read
            return bisect.bisect_right(self._bounds, i) - 1, i
        return self.shard_ids.item(i), i

    def location(self, i: int) -> tuple[str, int, int]:
        """Return (rec path, byte offset, key) of sample `i`."""
        s, i = self._locate(i)
        return self.shards[s][0], self.offsets.item(i), self.keys.item(i)

    def header(self, i: int) -> Header:
        """Return the `Header` of sample `i` (flag, label, id, id2)."""
        s, i = self._locate(i)
        rf, offset = self._files[s], self.offsets.item(i)
        return unpack_header(rf.read_at(offset, self.keys.item(i)), rf.path, offset)[0]

    def raw(self, i: int) -> tuple[bytes, Any]:
        """Return sample `i` undecoded: (image bytes as a buffer, label)."""
        s, i = self._locate(i)
        rf, offset = self._files[s], self.offsets.item(i)
        mm = rf._mm if rf._generation == _generation else rf.open()
        try:
            magic, lrec, flag, label = _RECORD_HEAD.unpack_from(mm, offset)
        except struct.error:
            magic = None
        # One whole part with a scalar label, padding included: the record as it nearly always
        # is. Anything else (split parts, label vectors, damage) takes the careful path.
        if (
            magic == MAGIC
            and flag == 0
            and 24 <= lrec <= LENGTH_MASK
            and (offset + 11 + lrec) & ~3 <= rf._size
        ):
            return mm[offset + 32 : offset + 8 + lrec], label  # after the part and image headers
        try:
            head, payload = unpack_header(rf.read_at(offset, self.keys.item(i)), rf.path, offset)
        except RecordFormatError as exc:
            raise RecordFormatError(exc.reason, rf.path, offset, self.keys.item(i)) from None
        return bytes(payload), (head.label if head.flag == 0 else head.label.copy())

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        payload, label = self.raw(i)
        if self.decode is None or callable(self.decode):
            return (payload if self.decode is None else self.decode(payload)), label
        try:
            return decode_image(payload, self.decode, self.max_pixels), label
        except RecordFormatError as exc:
            raise type(exc)(exc.reason, *self.location(i)) from None

    @property
    def labels(self) -> NDArray[Any]:
        """Return every sample's label, read from the record headers only (no image bytes).

        float32 (N,) when every header has flag 0, (N, k) when each has k labels, else an
        object array. Read once, then kept.
        """
        if self._labels is None:
            self._labels = _header_labels(self._files, self.shard_ids, self.offsets, self.keys)
        return self._labels

    @property
    def identity_ranges(self) -> Ints | None:
        """Return the insightface identities as an int64 (K, 2) array [start, end) of samples.

        None in the images layout.
        """
        if self._identities is not None and self._identity_ranges is None:
            shard_of, offsets, keys = self._identities
            pairs = _header_labels(self._files, *self._identities)
            if pairs.dtype == object or pairs.ndim != 2 or pairs.shape[1] < 2:
                raise RectoolError(
                    f"{self.shards[0][0]}: identity records must each hold a label pair "
                    "[first key, end key)"
                )
            ranges = pairs[:, :2].astype(np.int64) - 1  # image key k is sample k - 1
            bad = (ranges[:, 0] < 0) | (ranges[:, 0] > ranges[:, 1]) | (ranges[:, 1] > len(self))
            if bad.any():
                j = int(np.argmax(bad))
                raise RecordFormatError(
                    f"identity record holds the key range {(pairs[j, :2] + 0).tolist()}, "
                    f"outside the image keys 1..{len(self)}",
                    self.shards[int(shard_of[j])][0], int(offsets[j]), int(keys[j]),
                )  # fmt: skip
            ranges.flags.writeable = False
            self._identity_ranges = ranges
        return self._identity_ranges


def _shard_numbers(counts: list[int]) -> NDArray[np.unsignedinteger[Any]]:
    """Return each record's shard number (`counts[s]` records in shard s): a broadcast for one."""
    n = len(counts)
    if n == 1:
        return np.broadcast_to(np.zeros(1, np.uint8), (counts[0],))  # no memory a record
    return np.repeat(np.arange(n, dtype=np.min_scalar_type(n)), counts)


def _runs(starts: Ints, counts: Ints) -> Ints:
    """Return the indices of a run of `counts[i]` consecutive items from each `starts[i]`."""
    ends = np.cumsum(counts)
    return np.repeat(starts - ends + counts, counts) + np.arange(ends[-1] if len(ends) else 0)


def record_heads(
    words: NDArray[np.uint32], size: int, offsets: Any
) -> tuple[NDArray[np.bool_], Ints, NDArray[np.uint32]]:
    """Gather the first 4 words (magic, lrec, flag, label) of the records at `offsets` in a
    mapping (`words`: its uint32 words, `size`: its bytes); return (ok, word index, heads).

    `ok`: a whole record (aligned, one part, room for its labels, inside the file): the one
    check of a record read in bulk. A row not `ok` holds the file's first words.
    """
    offsets = np.asarray(offsets, np.int64)
    if size < 32:
        n = len(offsets)
        return np.zeros(n, bool), np.zeros(n, np.int64), np.zeros((n, 4), np.uint32)
    # 16 bytes from any word on as one item, no copy: a record's first 4 words gather as one.
    heads = np.lib.stride_tricks.as_strided(words[:4].view("V16"), (len(words) - 3,), (4,))
    ok = (offsets.view(np.uint64) <= size - 32) & (offsets & 3 == 0)  # negative: huge
    w = np.where(ok, offsets >> 2, 0)
    head = heads[w].view("<u4").reshape(-1, 4)
    lrec, flag = head[:, 1], head[:, 2]
    room = lrec - np.uint32(24)  # uint32: the bytes after the image header, huge if none
    ok &= (head[:, 0] == MAGIC) & (room <= LENGTH_MASK - 24) & (flag <= room >> 2)
    ok &= offsets + ((lrec + 11) & ~np.uint32(3)) <= size
    return ok, w, head


def _header_labels(
    files: list[RecordFile], shard_of: NDArray[Any], offsets: Ints, keys: Ints
) -> NDArray[Any]:
    """Return the header labels of the records at `offsets`, without reading image bytes.

    float32 (N,) when every flag is 0, (N, k) when every record has k labels, else objects.
    Whole, aligned records are gathered with numpy from the mappings; any other is read and
    checked one by one, so damage raises a `RecordFormatError`.
    """
    n, columns = len(offsets), []  # columns: (rows, flags, their labels) of fast records
    flags, scalars, fast = np.zeros(n, np.uint32), np.zeros(n, np.float32), np.zeros(n, bool)
    for s, rf in enumerate(files):
        if len(rf.open()) < 32:
            continue
        words = np.frombuffer(rf.open(), "<u4", rf._size // 4)
        try:
            for start in range(0, n, 1 << 20):  # temporaries of a chunk, not of every record
                end = min(n, start + (1 << 20))
                rows: Any = slice(start, end)
                if len(files) > 1:
                    rows = start + np.flatnonzero(shard_of[rows] == s)
                ok, w, head = record_heads(words, rf._size, offsets[rows])
                flag = head[:, 2].astype(np.int64)
                if not ok.all():
                    rows = (np.arange(start, end) if type(rows) is slice else rows)[ok]
                    w, flag, head = w[ok], flag[ok], head[ok]
                fast[rows], flags[rows], scalars[rows] = True, flag, head[:, 3].view(np.float32)
                v = flag > 0  # label vectors: their labels, gathered flat
                if v.any():
                    rows = np.arange(start, end) if type(rows) is slice else rows
                    labels = words[_runs(w[v] + 8, flag[v])].view(np.float32)
                    columns.append((rows[v], flag[v], labels))
        finally:
            del words
        _release_pages(rf.open())  # read once: the headers' pages are the page cache's again
    _release_pages(offsets)
    slow = []
    for row in np.flatnonzero(~fast).tolist():
        rf, offset, key = files[int(shard_of[row])], int(offsets[row]), int(keys[row])
        try:
            header, _ = unpack_header(rf.read_at(offset, key), rf.path, offset)
        except RecordFormatError as exc:
            raise RecordFormatError(exc.reason, rf.path, offset, key) from None
        flags[row] = header.flag
        if header.flag:
            slow.append((row, header.label))
        else:
            scalars[row] = header.label
    width = int(flags.max()) if n else 0
    if not width:
        scalars.flags.writeable = False
        return scalars
    flags = flags.astype(np.int64)
    starts = np.cumsum(flags) - flags  # every label, row after row: no n x width matrix
    flat = np.zeros(int(flags.sum()), np.float32)
    for rows, counts, values in columns:
        flat[_runs(starts[rows], counts)] = values
    for row, label in slow:
        flat[starts[row] : starts[row] + len(label)] = label
    out = flat.reshape(n, width) if (flags == width).all() else np.empty(n, object)
    for row, f in enumerate(flags.tolist() if out.dtype == object else []):
        out[row] = flat[starts[row] : starts[row] + f].copy() if f else float(scalars[row])
    out.flags.writeable = False
    return out
