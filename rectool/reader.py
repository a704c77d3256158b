"""Read MXNet/dmlc RecordIO files (.rec/.idx) with the standard library and numpy only.

This module owns the on-disk format: the framing constants, the image record header and the
index text. It imports nothing but the standard library and numpy, because `rectool reader`
copies it verbatim into training code; rectool itself reads every record through it.
"""

from __future__ import annotations

import glob
import json
import mmap
import os
import struct
from collections import namedtuple

import numpy as np

FORMAT_VERSION = 1

# --- dmlc-core recordio.h framing -------------------------------------------------------------
MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
PART_HEADER = struct.Struct("<II")  # magic, lrec
LENGTH_BITS = 29
LENGTH_MASK = (1 << LENGTH_BITS) - 1
MAX_RECORD_BYTES = LENGTH_MASK  # dmlc requires size < 2**29
CFLAG_WHOLE, CFLAG_FIRST, CFLAG_MIDDLE, CFLAG_LAST = 0, 1, 2, 3

# --- MXNet recordio.py image header: IRHeader(flag, label, id, id2) ----------------------------
IMAGE_HEADER = struct.Struct("<IfQQ")
IMAGE_HEADER_SIZE = IMAGE_HEADER.size  # 24

# --- binary sidecar cache of a parsed .idx ----------------------------------------------------
INDEX_CACHE_SUFFIX = ".rtc"
INDEX_CACHE_MAGIC = b"RTIDXC01"
INDEX_CACHE_HEADER = struct.Struct("<8sQqQ")  # magic, idx size, idx mtime_ns, record count
# Parsing a small index is instant; caching it would only litter the dataset folder.
INDEX_CACHE_MIN_RECORDS = 100_000

# --- the pack manifest (JSON) written by `rectool pack` --------------------------------------
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "rectool-manifest"
MANIFEST_VERSION = 1

_INT64_MAX = np.iinfo(np.int64).max

Header = namedtuple("Header", "flag label id id2")
Header.__doc__ = "The image record header: flag, label (float or float32 vector), id, id2."


class RectoolError(Exception):
    """Base class of every error rectool raises on purpose."""


class RecordFormatError(RectoolError):
    """Bytes on disk are not what the format says: names the file, byte offset and key if known."""

    def __init__(self, message, path=None, offset=None, key=None):
        self.reason = message
        self.path = None if path is None else os.fspath(path)
        self.offset = offset
        self.key = key
        where = []
        if self.path is not None:
            where.append(self.path)
        if key is not None:
            where.append(f"key {key}")
        if offset is not None:
            where.append(f"byte offset {offset}")
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")


class IndexFormatError(RecordFormatError):
    """An .idx file cannot be parsed: names the file and line."""

    def __init__(self, message, path=None, line=None):
        self.line = line
        where = f"line {line}: " if line is not None else ""
        super().__init__(where + message, path=path)


# --- image header -------------------------------------------------------------------------------


def unpack_header(record, path=None, offset=None):
    """Split one record into its `Header` and the image bytes.

    Mirrors `mxnet.recordio.unpack`: with flag > 0 the label is a float32 vector of `flag`
    values read from the start of the payload, else the header's float. Raises
    `RecordFormatError` when the record is too short for what its header announces.
    """
    if len(record) < IMAGE_HEADER_SIZE:
        raise RecordFormatError(
            f"record of {len(record)} bytes is shorter than the "
            f"{IMAGE_HEADER_SIZE}-byte image header",
            path,
            offset,
        )
    flag, label, id1, id2 = IMAGE_HEADER.unpack_from(record, 0)
    start = IMAGE_HEADER_SIZE
    if flag > 0:
        end = start + 4 * flag
        if end > len(record):
            raise RecordFormatError(
                f"header announces {flag} float32 labels but the record has only "
                f"{len(record) - start} bytes after the header",
                path,
                offset,
            )
        label = np.frombuffer(record, np.float32, flag, start)
        start = end
    return Header(flag, label, id1, id2), record[start:]


# --- index --------------------------------------------------------------------------------------


def parse_index(data, path=None):
    """Parse .idx text (`key \\t offset \\n` per line) into int64 arrays (keys, offsets).

    Lines keep their file order; duplicate keys are kept here (lookups take the last one, as
    MXNet does). Raises `IndexFormatError` naming the first bad line.
    """
    if not data:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    if not data.endswith(b"\n"):
        data += b"\n"
    # Deleting the digits must leave exactly one tab and one newline per line; only then is the
    # whitespace-blind numpy parser below guaranteed to pair each key with its own offset.
    skeleton = data.translate(None, b"0123456789")
    lines = len(skeleton) // 2
    if skeleton == b"\t\n" * lines:
        try:
            values = np.fromstring(data, dtype=np.int64, sep=" ")
        except ValueError:
            values = None
        if values is not None and values.size == 2 * lines and not (values == _INT64_MAX).any():
            return values[0::2].copy(), values[1::2].copy()
    return _parse_index_lines(data, path)


def _parse_index_lines(data, path):
    keys, offsets = [], []
    for number, raw in enumerate(data.split(b"\n")[:-1], start=1):
        fields = raw.strip().split(b"\t")
        if len(fields) < 2:
            raise IndexFormatError(
                f"expected 'key<TAB>offset', got {raw[:80]!r}", path=path, line=number
            )
        try:
            key, offset = int(fields[0]), int(fields[1])
        except ValueError:
            raise IndexFormatError(
                f"key and offset must be integers, got {raw[:80]!r}", path=path, line=number
            ) from None
        if offset < 0 or not (-(2**63) <= key < 2**63) or offset >= 2**63:
            raise IndexFormatError(f"number out of range in {raw[:80]!r}", path=path, line=number)
        keys.append(key)
        offsets.append(offset)
    return np.array(keys, np.int64), np.array(offsets, np.int64)


def index_cache_path(idx_path):
    """Return the path of the binary sidecar cache kept next to an .idx file."""
    return os.fspath(idx_path) + INDEX_CACHE_SUFFIX


def load_index(idx_path, cache=True):
    """Read an .idx file into int64 arrays (keys, offsets), in file order.

    With `cache=True` a binary sidecar (`<idx>.rtc`) is used when its recorded size and mtime
    match the .idx, and written after parsing a large index when the folder is writable.
    """
    idx_path = os.fspath(idx_path)
    try:
        st = os.stat(idx_path)
    except FileNotFoundError:
        raise RectoolError(f"{idx_path}: index file not found") from None
    if cache:
        cached = read_index_cache(idx_path, st)
        if cached is not None:
            return cached
    with open(idx_path, "rb") as f:
        data = f.read()
    keys, offsets = parse_index(data, idx_path)
    if cache and len(keys) >= INDEX_CACHE_MIN_RECORDS:
        write_index_cache(idx_path, keys, offsets, st)
    return keys, offsets


def read_index_cache(idx_path, st=None):
    """Return (keys, offsets) from the sidecar cache, or None when it is missing or stale."""
    st = st or os.stat(idx_path)
    try:
        with open(index_cache_path(idx_path), "rb") as f:
            head = f.read(INDEX_CACHE_HEADER.size)
            if len(head) != INDEX_CACHE_HEADER.size:
                return None
            magic, size, mtime_ns, count = INDEX_CACHE_HEADER.unpack(head)
            if (magic, size, mtime_ns) != (INDEX_CACHE_MAGIC, st.st_size, st.st_mtime_ns):
                return None
            body = np.fromfile(f, np.int64)
    except FileNotFoundError:
        return None
    if body.size != 2 * count:
        return None
    return body[:count], body[count:]


def write_index_cache(idx_path, keys, offsets, st=None):
    """Write the sidecar cache for an .idx; return False when the folder is not writable."""
    st = st or os.stat(idx_path)
    final = index_cache_path(idx_path)
    tmp = f"{final}.tmp{os.getpid()}"
    head = INDEX_CACHE_HEADER.pack(INDEX_CACHE_MAGIC, st.st_size, st.st_mtime_ns, len(keys))
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            np.ascontiguousarray(keys, np.int64).tofile(f)
            np.ascontiguousarray(offsets, np.int64).tofile(f)
        os.replace(tmp, final)
    except OSError:
        # A read-only dataset folder is normal; the cache only saves time.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True


# --- framing ------------------------------------------------------------------------------------


class RecordFile:
    """A .rec file opened through mmap: random access by byte offset and sequential scans.

    Opens lazily, so an instance can be pickled and used in a forked or spawned worker; call
    `close()` (or use `with`) to release the mapping.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._file = None
        self._mm = None
        self._size = None
        self._pid = None

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"RecordFile({self.path!r})"

    def open(self):
        """Map the file now (done automatically on first read, and again after a fork)."""
        if self._mm is not None and self._pid == os.getpid():
            return
        self.close()
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            raise RectoolError(f"{self.path}: record file not found") from None
        try:
            size = os.fstat(f.fileno()).st_size
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except BaseException:
            f.close()
            raise
        self._file, self._size, self._pid = f, size, os.getpid()

    def close(self):
        """Release the mapping and the file descriptor."""
        mm, f = self._mm, self._file
        self._mm = self._file = None
        if isinstance(mm, mmap.mmap):
            mm.close()
        if f is not None:
            f.close()

    @property
    def size(self):
        """Return the file size in bytes."""
        self.open()
        return self._size

    def read_at(self, offset, key=None):
        """Return the record whose first part starts at byte `offset`, split parts rejoined."""
        if self._pid != os.getpid() or self._mm is None:
            self.open()
        mm = self._mm
        if offset & 3 or offset < 0 or offset + 8 > self._size:
            return self._read_parts(offset, key)[0]
        magic, lrec = PART_HEADER.unpack_from(mm, offset)
        end = offset + 8 + (lrec & LENGTH_MASK)
        # The padding must be there too: dmlc reads it and fails on a file cut inside it.
        if magic == MAGIC and lrec >> LENGTH_BITS == CFLAG_WHOLE and ((end + 3) & ~3) <= self._size:
            return mm[offset + 8 : end]
        return self._read_parts(offset, key)[0]

    def next_offset(self, offset, key=None):
        """Return the byte offset just past the record starting at `offset` (padding included)."""
        self.open()
        return self._read_parts(offset, key)[1]

    def _read_parts(self, offset, key=None):
        """Read the record at `offset` part by part; return (bytes, offset after it)."""
        self.open()
        mm, size, start = self._mm, self._size, offset
        if offset < 0 or offset & 3:
            raise RecordFormatError(
                "offset is not a record start (not 4-byte aligned)", self.path, offset, key
            )
        pieces = []
        expect_first = True
        while True:
            if offset + 8 > size:
                where = "at end of file" if offset == size else "in a truncated part header"
                raise RecordFormatError(
                    f"expected a record part header, found {where} (file is {size} bytes)",
                    self.path,
                    offset,
                    key,
                )
            magic, lrec = PART_HEADER.unpack_from(mm, offset)
            if magic != MAGIC:
                raise RecordFormatError(
                    f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x}): not a record start",
                    self.path,
                    offset,
                    key,
                )
            cflag, length = lrec >> LENGTH_BITS, lrec & LENGTH_MASK
            if expect_first and cflag not in (CFLAG_WHOLE, CFLAG_FIRST):
                raise RecordFormatError(
                    f"part has continuation flag {cflag}: not a record start",
                    self.path,
                    offset,
                    key,
                )
            if not expect_first and cflag not in (CFLAG_MIDDLE, CFLAG_LAST):
                raise RecordFormatError(
                    f"split record continues with flag {cflag}, expected 2 or 3",
                    self.path,
                    offset,
                    key,
                )
            body = offset + 8
            padded = body + ((length + 3) & ~3)
            if padded > size:
                raise RecordFormatError(
                    f"part of {length} bytes runs past end of file ({size} bytes)",
                    self.path,
                    offset,
                    key,
                )
            pieces.append(mm[body : body + length])
            offset = padded
            if cflag in (CFLAG_WHOLE, CFLAG_LAST):
                break
            expect_first = False
        if len(pieces) == 1:
            return pieces[0], offset
        if offset - start - 8 * len(pieces) > MAX_RECORD_BYTES + 4:
            raise RecordFormatError("split record exceeds 2**29 bytes", self.path, start, key)
        return MAGIC_BYTES.join(pieces), offset

    def scan(self, start=0):
        """Yield (offset, record) for every record from byte `start` to the end, in file order."""
        self.open()
        offset = start
        while offset < self._size:
            record, after = self._read_parts(offset)
            yield offset, record
            offset = after


class IndexedRecordFile:
    """A .rec file with its .idx: read records by key, in index order or at random.

    Duplicate keys resolve to the last offset, as in MXNet. Picklable; the index is parsed
    once, in the process that creates the object, and travels with it.
    """

    def __init__(self, rec_path, idx_path=None, cache=True):
        rec_path = os.fspath(rec_path)
        if idx_path is None:
            idx_path = os.path.splitext(rec_path)[0] + ".idx"
        self.rec = RecordFile(rec_path)
        self.idx_path = os.fspath(idx_path)
        self.keys, self.offsets = load_index(self.idx_path, cache=cache)
        self._lookup = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self):
        return len(self.keys)

    def close(self):
        """Release the mapping and file descriptor of the .rec."""
        self.rec.close()

    def _offset_of(self, key):
        if self._lookup is None:
            keys, n = self.keys, len(self.keys)
            # Python ints for the bound check: int64 arithmetic would wrap near 2**63.
            if n and int(keys[0]) + n - 1 <= _INT64_MAX and (keys == keys[0] + np.arange(n)).all():
                self._lookup = int(keys[0])  # keys run first, first+1, ...: no table needed
            else:
                self._lookup = dict(zip(self.keys.tolist(), self.offsets.tolist()))
        if isinstance(self._lookup, int):
            i = key - self._lookup
            if 0 <= i < len(self.offsets):
                return int(self.offsets[i])
        elif key in self._lookup:
            return self._lookup[key]
        raise RectoolError(f"{self.idx_path}: key {key} is not in the index")

    def read(self, key):
        """Return the record stored under `key` (bytes)."""
        offset = self._offset_of(key)
        return self.rec.read_at(offset, key)

    def read_at_position(self, i):
        """Return the record of the i-th line of the index (bytes)."""
        return self.rec.read_at(int(self.offsets[i]), int(self.keys[i]))


# --- finding a dataset's shards -------------------------------------------------------------


def read_manifest(path):
    """Read and check a pack manifest; raise `RectoolError` naming the file when it is not one."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except FileNotFoundError:
        raise RectoolError(f"{path}: manifest not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RectoolError(f"{path}: not a JSON manifest ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
        raise RectoolError(f'{path}: not a rectool manifest (no "format": "{MANIFEST_FORMAT}")')
    if document.get("format_version", 0) > MANIFEST_VERSION:
        raise RectoolError(
            f"{path}: manifest format version {document['format_version']} is newer than this "
            f"reader understands ({MANIFEST_VERSION}); upgrade rectool"
        )
    return document


def _idx_beside(rec_path):
    return os.path.splitext(rec_path)[0] + ".idx"


def resolve_source(source):
    """Find the shards of a dataset; return (manifest or None, manifest path or None, shards).

    `source` is a manifest (.json), a .rec file, a pack prefix (`PREFIX.manifest.json`,
    `PREFIX.rec` or `PREFIX-00000.rec`...), a folder holding `train.rec` (insightface), or a
    list of .rec paths. `shards` is a list of (rec path, idx path) pairs in order.
    """
    if isinstance(source, (list, tuple)):
        if not source:
            raise RectoolError("no shard paths given")
        return None, None, [(os.fspath(p), _idx_beside(os.fspath(p))) for p in source]
    source = os.fspath(source)
    if os.path.isdir(source):
        if os.path.exists(os.path.join(source, "train.rec")):
            return resolve_source(os.path.join(source, "train.rec"))
        raise RectoolError(f"{source}: a folder without train.rec; give a manifest, .rec or prefix")
    if source.endswith(".json"):
        manifest = read_manifest(source)
        folder = os.path.dirname(source)
        shards = [
            (os.path.join(folder, s["rec"]), os.path.join(folder, s["idx"]))
            for s in manifest["shards"]
        ]
        return manifest, source, shards
    if source.endswith(".rec"):
        prefix = source[: -len(".rec")]
        if os.path.exists(prefix + MANIFEST_SUFFIX):
            manifest, path, shards = resolve_source(prefix + MANIFEST_SUFFIX)
            if len(shards) == 1 and os.path.samefile(shards[0][0], source):
                return manifest, path, shards
        if not os.path.exists(source):
            raise RectoolError(f"{source}: record file not found")
        return None, None, [(source, _idx_beside(source))]
    if os.path.exists(source + MANIFEST_SUFFIX):
        return resolve_source(source + MANIFEST_SUFFIX)
    if os.path.exists(source + ".rec"):
        return resolve_source(source + ".rec")
    numbered = sorted(glob.glob(glob.escape(source) + "-[0-9][0-9][0-9][0-9][0-9].rec"))
    if numbered:
        return None, None, [(p, _idx_beside(p)) for p in numbered]
    raise RectoolError(
        f"{source}: no dataset here (looked for {source}{MANIFEST_SUFFIX}, {source}.rec, "
        f"{source}-00000.rec)"
    )
