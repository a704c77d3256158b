"""Read MXNet/dmlc RecordIO files (.rec/.idx) with the standard library and numpy only.

This module owns the on-disk format: the framing constants, the image record header and the
index text. It imports nothing but the standard library and numpy, because `rectool reader`
copies it verbatim into training code; rectool itself reads every record through it.

For training:

    ds = open_dataset("out/faces", decode="rgb")    # manifest, prefix, .rec or [shards]
    image, label = ds[0]                             # HWC uint8 array, float label
    sampler = RankSampler(len(ds), rank, world_size, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=256, sampler=sampler, num_workers=8)
    for batch in prefetch(loader, depth=2): ...

Decoding imports OpenCV (or else Pillow) on first use only.
"""

from __future__ import annotations

import bisect
import glob
import io
import json
import mmap
import operator
import os
import queue
import struct
import threading
import zlib
from collections import namedtuple


class _LazyNumpy:
    """numpy, imported on first use.

    Commands such as `rectool list` load this module only for its error classes and should
    not pay for numpy; the first attribute looked up imports it and puts the real module in
    place of this stand-in.
    """

    def __getattr__(self, name):
        global np
        import numpy

        np = numpy
        return getattr(numpy, name)


np = _LazyNumpy()

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
INDEX_CACHE_MAGIC = b"RTIDXC02"
# magic, .idx size, .idx mtime_ns, record count, CRC-32 of the .idx bytes, padding to 8 bytes.
# The CRC catches an .idx replaced by one of the same size and mtime (cp -p, rsync -a).
INDEX_CACHE_HEADER = struct.Struct("<8sQqQI4x")
# Parsing a small index is instant; caching it would only litter the dataset folder.
INDEX_CACHE_MIN_RECORDS = 100_000

# --- the pack manifest (JSON) written by `rectool pack` --------------------------------------
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "rectool-manifest"
MANIFEST_VERSION = 1

_INT64_MAX = 2**63 - 1

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

    With `cache=True` a binary sidecar (`<idx>.rtc`) is used when its recorded size, mtime
    and CRC-32 match the .idx, and written after parsing a large index when the folder is
    writable.
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
        write_index_cache(idx_path, keys, offsets, st, data)
    return keys, offsets


def read_index_cache(idx_path, st=None):
    """Return (keys, offsets) from the sidecar cache, or None when it is missing or stale."""
    st = st or os.stat(idx_path)
    try:
        with open(index_cache_path(idx_path), "rb") as f:
            head = f.read(INDEX_CACHE_HEADER.size)
            if len(head) != INDEX_CACHE_HEADER.size:
                return None
            magic, size, mtime_ns, count, crc = INDEX_CACHE_HEADER.unpack(head)
            if (magic, size, mtime_ns) != (INDEX_CACHE_MAGIC, st.st_size, st.st_mtime_ns):
                return None
            body = np.fromfile(f, np.int64)
    except FileNotFoundError:
        return None
    if body.size != 2 * count or _file_crc32(idx_path) != crc:
        return None
    return body[:count], body[count:]


def _file_crc32(path, data=None):
    if data is not None:
        return zlib.crc32(data)
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return crc


def write_index_cache(idx_path, keys, offsets, st=None, data=None):
    """Write the sidecar cache for an .idx; return False when the folder is not writable.

    `data`, the .idx bytes when the caller has them, saves reading the file for its CRC.
    """
    st = st or os.stat(idx_path)
    final = index_cache_path(idx_path)
    tmp = f"{final}.tmp{os.getpid()}"
    crc = _file_crc32(idx_path, data)
    head = INDEX_CACHE_HEADER.pack(INDEX_CACHE_MAGIC, st.st_size, st.st_mtime_ns, len(keys), crc)
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
        self._mm = None
        self._size = None
        self._pid = None
        # Threads that read a fresh instance at once must map it once: a second mapping made
        # by one would close the other's under its reader.
        self._lock = threading.Lock()
        self._lock_generation = _fork_generation[0]

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
        if self._lock_generation != _fork_generation[0]:
            # A lock that a parent thread held at a fork stays locked in the child.
            self._lock, self._lock_generation = threading.Lock(), _fork_generation[0]
        with self._lock:
            if self._mm is None or self._pid != os.getpid():
                self._map()

    def _map(self):
        self.close()
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            raise RectoolError(f"{self.path}: record file not found") from None
        # The mapping keeps a descriptor of its own, so the file is closed at once: one
        # descriptor per open .rec, released by close() or when the object is collected.
        with f:
            size = os.fstat(f.fileno()).st_size
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self._size, self._pid = size, os.getpid()

    def close(self):
        """Release the mapping and its file descriptor."""
        mm = self._mm
        self._mm = None
        if isinstance(mm, mmap.mmap):
            mm.close()

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


# --- datasets: samples for training -----------------------------------------------------------

DATASET_LAYOUTS = ("images", "insightface")
DECODE_MODES = ("bgr", "rgb", "gray")
# What precedes an image's extra labels: part header (magic, lrec) and IRHeader (flag, label,
# id, id2). The fast read path takes magic, lrec, flag and label in one unpack.
_RECORD_HEAD = struct.Struct("<IIIf")
_IMAGE_START = PART_HEADER.size + IMAGE_HEADER_SIZE  # 32

# Bumped in every forked child, so that objects notice a fork without calling getpid() per read.
_fork_generation = [0]


def _after_fork_in_child():
    _fork_generation[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class SampleIndexError(RectoolError, IndexError):
    """A sample index outside the dataset (an `IndexError`, so iteration protocols stop)."""


def open_dataset(source, decode=None, *, layout=None, cache=True):
    """Open a packed dataset for training; return a `RecordDataset`.

    `source` is a manifest, a pack prefix, a .rec path or a list of .rec paths (see
    `resolve_source`). `decode` is None (image bytes), "bgr", "rgb" or "gray" (HWC uint8
    arrays), or a function of the image bytes. `layout` ("images" or "insightface") is read
    from the manifest or detected from record 0 when not given.
    """
    return RecordDataset(source, decode=decode, layout=layout, cache=cache)


class RecordDataset:
    """The samples of a packed dataset, read at random through mmap: `ds[i] -> (image, label)`.

    The image is the record's image bytes, or a decoded HWC uint8 array when `decode` is
    set; the label is a float (header flag 0) or a float32 vector (flag > 0). Samples run
    shard by shard in .idx line order; in the insightface layout they are the images at keys
    1..N only (`identity_ranges` gives each identity's slice of them).

    Ready for `torch.utils.data.DataLoader` without importing torch: the object pickles
    without its open files and maps each .rec lazily in each process, after a fork too; the
    parsed index travels in the pickle (spawn) or is shared copy-on-write (fork), so no
    worker parses the .idx again. `close()` releases the mappings of this process.
    """

    def __init__(self, source, decode=None, layout=None, cache=True):
        if not (decode is None or decode in DECODE_MODES or callable(decode)):
            raise ValueError(f"decode must be None, one of {DECODE_MODES} or a function")
        if layout is not None and layout not in DATASET_LAYOUTS:
            raise ValueError(f"layout must be one of {DATASET_LAYOUTS}, not {layout!r}")
        self.manifest, self.manifest_path, shards = resolve_source(source)
        self.shards = [(os.fspath(rec), os.fspath(idx)) for rec, idx in shards]
        self.decode = decode
        self._files = [RecordFile(rec) for rec, _ in self.shards]
        self._lock = threading.Lock()
        self._reset_handles()
        listed = (self.manifest or {}).get("shards") or [None] * len(self.shards)
        indexes = []
        for (_, idx), info, rf in zip(self.shards, listed, self._files):
            keys, offsets = load_index(idx, cache=cache)
            _check_shard(rf, idx, keys, offsets, info, self.manifest_path)
            indexes.append((keys, offsets))
        try:
            self._build(indexes, layout or (self.manifest or {}).get("layout"))
        finally:
            self.close()
        self._labels = None
        self._identity_ranges = None

    # -- building the sample table ---------------------------------------------------------
    def _build(self, indexes, layout):
        counts = [len(keys) for keys, _ in indexes]
        line_bounds = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        if len(indexes) == 1:  # no copy: 6M lines would take 0.1 s and 96 MB more
            all_keys, all_offsets = indexes[0]
        else:
            all_keys = np.concatenate([k for k, _ in indexes] or [np.empty(0, np.int64)])
            all_offsets = np.concatenate([o for _, o in indexes] or [np.empty(0, np.int64)])
        header = self._insightface_header(all_keys, all_offsets, line_bounds, layout)
        self.layout = "insightface" if header is not None else "images"
        self._identity_lines = None
        if header is None:
            lines = None
        else:
            end, id_start, id_end = header
            lines = _positions_of_keys(all_keys, np.arange(1, end, dtype=np.int64), self.shards)
            if id_end > id_start:
                wanted = np.arange(id_start, id_end, dtype=np.int64)
                self._identity_lines = _positions_of_keys(all_keys, wanted, self.shards)
        if lines is None:
            self._keys, self._offsets = all_keys, all_offsets
            self._bounds, self._shard_ids = line_bounds.tolist(), None
        else:
            self._keys, self._offsets = all_keys[lines], all_offsets[lines]
            shard_ids = np.searchsorted(line_bounds, lines, side="right") - 1
            if len(shard_ids) < 2 or (np.diff(shard_ids) >= 0).all():
                bounds = np.searchsorted(shard_ids, np.arange(len(self.shards) + 1))
                self._bounds, self._shard_ids = bounds.tolist(), None
            else:  # samples jump between shards: keep each sample's shard
                self._bounds, self._shard_ids = None, shard_ids.astype(np.int32)
            if self._identity_lines is not None:
                ids = self._identity_lines
                self._identity_lines = (
                    np.searchsorted(line_bounds, ids, side="right") - 1,
                    all_offsets[ids],
                    all_keys[ids],
                )
        self._count = len(self._offsets)
        for array in (self._keys, self._offsets):
            array.flags.writeable = False

    def _insightface_header(self, keys, offsets, line_bounds, layout):
        """Return (end, identity start, identity end) from record 0, or None (images layout)."""
        if layout == "images":
            return None
        zero = np.flatnonzero(keys == 0)
        if not len(zero):
            if layout == "insightface":
                raise RectoolError(
                    f"{self.shards[0][1]}: no record 0, so not the insightface layout "
                    "(record 0 holds the image and identity key ranges)"
                )
            return None
        line = int(zero[-1])  # duplicate keys: the last one counts, as in MXNet
        s = int(np.searchsorted(line_bounds, line, side="right") - 1)
        rf, offset = self._files[s], int(offsets[line])
        record = rf.read_at(offset, 0)
        head, body = unpack_header(record, rf.path, offset)
        if head.flag >= 2 and not body and 1 <= head.label[0] <= head.label[1]:
            return int(head.label[0]), int(head.label[0]), int(head.label[1])
        if layout == "insightface":
            raise RecordFormatError(
                "record 0 is not an insightface header (flag >= 2, no image, labels "
                f"[first identity key, end]); found flag {head.flag} and {len(body)} image bytes",
                rf.path,
                offset,
                0,
            )
        return None

    # -- files, per process ----------------------------------------------------------------
    def _reset_handles(self):
        self._maps = [None] * len(self._files)
        self._sizes = [0] * len(self._files)
        self._generation = _fork_generation[0]

    def _open(self, s):
        """Map shard `s` in this process; return its mapping."""
        with self._lock:
            if self._generation != _fork_generation[0]:
                self._forget_inherited()
            if self._maps[s] is None:
                rf = self._files[s]
                rf.open()
                self._sizes[s] = rf._size
                self._maps[s] = rf._mm
            return self._maps[s]

    def _forget_inherited(self):
        # In a forked child: the parent's mappings are copies; drop them and map afresh.
        for rf in self._files:
            rf.close()
        self._reset_handles()

    def _after_fork(self):
        # A lock that a parent thread held at the fork stays locked in the child: replace it.
        self._lock = threading.Lock()
        with self._lock:
            if self._generation != _fork_generation[0]:
                self._forget_inherited()

    def close(self):
        """Release this process's mappings (they reopen on the next read)."""
        with self._lock:
            for rf in self._files:
                rf.close()
            self._reset_handles()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        for name in ("_maps", "_sizes", "_generation", "_lock"):
            del state[name]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._reset_handles()

    def __repr__(self):
        where = self.manifest_path or (self.shards[0][0] if self.shards else "")
        more = f" + {len(self.shards) - 1} shards" if len(self.shards) > 1 else ""
        return (
            f"RecordDataset({where!r}{more}, {self._count} samples, layout={self.layout!r}, "
            f"decode={self.decode!r})"
        )

    # -- samples ---------------------------------------------------------------------------
    def __len__(self):
        return self._count

    def _locate(self, i):
        """Return (shard, sample index) of index `i`, negative indices counted from the end."""
        i = given = operator.index(i)
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise SampleIndexError(
                f"sample {given} is out of range: the dataset has {self._count} samples"
            )
        if self._shard_ids is not None:
            return self._shard_ids.item(i), i
        return bisect.bisect_right(self._bounds, i) - 1, i

    def __getitem__(self, i):
        if self._generation != _fork_generation[0]:
            self._after_fork()
        s, i = self._locate(i)
        mm = self._maps[s]
        if mm is None:
            mm = self._open(s)
        offset = self._offsets.item(i)
        try:
            magic, lrec, flag, label = _RECORD_HEAD.unpack_from(mm, offset)
        except struct.error:
            magic = None
        # One whole part with a scalar label, padding included: the record as it nearly always
        # is. Anything else (split parts, label vectors, damage) takes the careful path.
        if (
            magic == MAGIC
            and flag == 0
            and IMAGE_HEADER_SIZE <= lrec <= LENGTH_MASK
            and (offset + 11 + lrec) & ~3 <= self._sizes[s]
        ):
            payload = mm[offset + _IMAGE_START : offset + 8 + lrec]
        else:
            payload, label = self._read_careful(s, i)
        if self.decode is not None:
            payload = self._decode(payload, s, i)
        return payload, label

    def _read_careful(self, s, i):
        rf, offset, key = self._files[s], self._offsets.item(i), self._keys.item(i)
        record = rf.read_at(offset, key)
        try:
            head, payload = unpack_header(record, rf.path, offset)
        except RecordFormatError as exc:
            raise RecordFormatError(exc.reason, rf.path, offset, key) from None
        label = head.label if head.flag == 0 else head.label.copy()
        return bytes(payload), label

    def _decode(self, payload, s, i):
        if callable(self.decode):
            return self.decode(payload)
        image = _image_decoder(self.decode)(payload)
        if image is None:
            raise RecordFormatError(
                f"the {len(payload)} image bytes cannot be decoded "
                f"(they start with {bytes(payload[:8])!r})",
                self._files[s].path,
                self._offsets.item(i),
                self._keys.item(i),
            )
        return image

    def __iter__(self):
        for i in range(self._count):
            yield self[i]

    def location(self, i):
        """Return (rec path, byte offset, key) of sample `i`."""
        s, i = self._locate(i)
        return self._files[s].path, self._offsets.item(i), self._keys.item(i)

    def header(self, i):
        """Return the `Header` of sample `i` (flag, label, id, id2)."""
        s, i = self._locate(i)
        rf, offset, key = self._files[s], self._offsets.item(i), self._keys.item(i)
        return unpack_header(rf.read_at(offset, key), rf.path, offset)[0]

    @property
    def keys(self):
        """Return the record key of every sample (read-only int64 array)."""
        return self._keys

    @property
    def offsets(self):
        """Return the byte offset of every sample in its .rec (read-only int64 array)."""
        return self._offsets

    @property
    def labels(self):
        """Return every sample's label, read from the record headers only (no image bytes).

        float32 of shape (N,) when every header has flag 0, (N, k) when every one has k
        labels, else an object array of floats and vectors. Read once, then kept.
        """
        if self._labels is None:
            self._labels = self._gather_labels(self._sample_shards(), self._offsets, self._keys)
        return self._labels

    @property
    def identity_ranges(self):
        """Return the insightface identities as an int64 (K, 2) array of sample index ranges.

        Row j holds [start, end): samples start..end-1 are identity j. None in the images
        layout.
        """
        if self._identity_lines is None:
            return None
        if self._identity_ranges is None:
            shard_ids, offsets, keys = self._identity_lines
            pairs = self._gather_labels(shard_ids, offsets, keys)
            if pairs.dtype == object or pairs.ndim != 2 or pairs.shape[1] < 2:
                raise RectoolError(
                    f"{self.shards[0][0]}: identity records must each hold a label pair "
                    "[first key, end key)"
                )
            ranges = pairs[:, :2].astype(np.int64) - 1  # image key k is sample k - 1
            bad = (ranges[:, 0] < 0) | (ranges[:, 0] > ranges[:, 1]) | (ranges[:, 1] > len(self))
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                s = int(shard_ids[j])
                raise RecordFormatError(
                    f"identity record holds the key range {(pairs[j, :2] + 0).tolist()}, "
                    f"outside the image keys 1..{len(self)}",
                    self._files[s].path,
                    int(offsets[j]),
                    int(keys[j]),
                )
            ranges.flags.writeable = False
            self._identity_ranges = ranges
        return self._identity_ranges

    def _sample_shards(self):
        if self._shard_ids is not None:
            return self._shard_ids
        return np.repeat(np.arange(len(self.shards)), np.diff(self._bounds))

    def _gather_labels(self, shard_ids, offsets, keys):
        """Return the header labels of records given by shard, offset and key."""
        parts = []
        for s in range(len(self._files)):
            rows = np.flatnonzero(shard_ids == s)
            if len(rows):
                self._open(s)
                labels = _header_labels(self._files[s], offsets[rows], keys[rows])
                parts.append((rows, labels))
        n = len(offsets)
        shapes = {labels.shape[1:] for _, labels in parts if labels.dtype != object}
        if len(shapes) <= 1 and all(labels.dtype != object for _, labels in parts):
            out = np.zeros((n, *next(iter(shapes), ())), np.float32)
            for rows, labels in parts:
                out[rows] = labels
        else:
            out = np.empty(n, object)
            for rows, labels in parts:
                for row, label in zip(rows.tolist(), _label_objects(labels)):
                    out[row] = label
        out.flags.writeable = False
        return out


def _label_objects(labels):
    if labels.dtype == object:
        return list(labels)
    if labels.ndim == 1:
        return labels.tolist()
    return list(labels.copy())


def _check_shard(rf, idx_path, keys, offsets, listed, manifest_path):
    """Refuse a shard whose .idx does not describe its .rec (stale, or another file's)."""
    try:
        size = os.stat(rf.path).st_size
    except FileNotFoundError:
        raise RectoolError(f"{rf.path}: record file not found") from None
    if listed is not None:
        if listed.get("records") is not None and listed["records"] != len(keys):
            raise RectoolError(
                f"{idx_path}: {len(keys)} index lines, but the manifest {manifest_path} lists "
                f"{listed['records']} records for this shard: the .idx or the manifest is stale"
            )
        if listed.get("rec_bytes") is not None and listed["rec_bytes"] != size:
            raise RectoolError(
                f"{rf.path}: {size} bytes, but the manifest {manifest_path} lists "
                f"{listed['rec_bytes']}: the file changed after packing"
            )
    if not len(offsets):
        return
    # A few records, the farthest one included, must start where the index says.
    lines = {0, len(offsets) // 2, len(offsets) - 1, int(np.argmax(offsets))}
    try:
        for line in sorted(lines):
            offset, key = int(offsets[line]), int(keys[line])
            try:
                rf.next_offset(offset, key)
            except RecordFormatError as exc:
                raise RecordFormatError(
                    f"{exc.reason}; the index {idx_path} is stale or belongs to another .rec "
                    "(rebuild it from the .rec)",
                    rf.path,
                    offset,
                    key,
                ) from None
    finally:
        rf.close()


def _positions_of_keys(keys, wanted, shards):
    """Return the .idx line of each wanted key (the last line of a repeated key)."""
    n = len(wanted)
    if not n:
        return np.empty(0, np.int64)
    first = int(wanted[0])
    starts = np.flatnonzero(keys == first)
    if len(starts) == 1 and (wanted == wanted[0] + np.arange(n)).all():
        p = int(starts[0])
        run = keys[p : p + n]
        inside = (keys >= first) & (keys < first + n)
        if len(run) == n and (run == wanted).all() and int(inside.sum()) == n:
            return np.arange(p, p + n, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    found = np.searchsorted(keys, wanted, side="right", sorter=order) - 1
    missing = found < 0
    found[missing] = 0
    lines = order[found]
    missing |= keys[lines] != wanted
    if missing.any():
        key = int(wanted[np.flatnonzero(missing)[0]])
        idx = ", ".join(idx for _, idx in shards)
        raise RectoolError(
            f"{idx}: key {key} is not in the index, but record 0 says keys up to "
            f"{int(wanted[-1])} exist"
        )
    return lines


def _header_labels(rf, offsets, keys):
    """Return the header labels of the records at `offsets` in one .rec, without image bytes.

    The common case (whole, aligned records) is gathered with numpy from the mapping; any
    other record is read and checked one by one, so damage raises a `RecordFormatError`.
    """
    n = len(offsets)
    flags = np.zeros(n, np.int64)
    scalars = np.zeros(n, np.float32)
    fast = np.zeros(n, bool)
    columns = []  # per label position j: (rows, values) of the fast records with flag > j
    rf.open()
    mm, size = rf._mm, rf._size
    if n and isinstance(mm, mmap.mmap) and size >= _IMAGE_START:
        words = np.frombuffer(mm, "<u4", size // 4)
        try:
            rows = np.flatnonzero((offsets & 3 == 0) & (offsets >= 0) & (offsets <= size - 32))
            w = offsets[rows] >> 2
            lrec = words[w + 1].astype(np.int64)
            flag = words[w + 2].astype(np.int64)
            ok = (
                (words[w] == MAGIC)
                & (lrec <= LENGTH_MASK)
                & (lrec >= IMAGE_HEADER_SIZE + 4 * flag)
                & ((offsets[rows] + 11 + lrec) & ~3 <= size)
            )
            rows, w, flag = rows[ok], w[ok], flag[ok]
            fast[rows] = True
            flags[rows] = flag
            scalars[rows] = words[w + 3].view(np.float32)
            for j in range(int(flag.max()) if len(flag) else 0):
                has = flag > j
                columns.append((rows[has], words[w[has] + 8 + j].view(np.float32)))
        finally:
            del words
    slow = []
    for row in np.flatnonzero(~fast).tolist():
        offset, key = int(offsets[row]), int(keys[row])
        try:
            head, _ = unpack_header(rf.read_at(offset, key), rf.path, offset)
        except RecordFormatError as exc:
            raise RecordFormatError(exc.reason, rf.path, offset, key) from None
        flags[row] = head.flag
        if head.flag:
            slow.append((row, head.label))
        else:
            scalars[row] = head.label
    width = int(flags.max()) if n else 0
    if not width:
        return scalars
    vectors = np.zeros((n, width), np.float32)
    for j, (rows, values) in enumerate(columns):
        vectors[rows, j] = values
    for row, label in slow:
        vectors[row, : len(label)] = label
    if (flags == width).all():
        return vectors
    out = np.empty(n, object)
    for row, f in enumerate(flags.tolist()):
        out[row] = vectors[row, :f].copy() if f else float(scalars[row])
    return out


_DECODERS = {}


def _image_decoder(mode):
    """Return a function turning image bytes into an HWC uint8 array (None if undecodable)."""
    decoder = _DECODERS.get(mode)
    if decoder is None:
        decoder = _DECODERS[mode] = _make_decoder(mode)
    return decoder


def _make_decoder(mode):
    try:
        import cv2
    except ImportError:
        cv2 = None
    if cv2 is not None:
        flag = cv2.IMREAD_GRAYSCALE if mode == "gray" else cv2.IMREAD_COLOR

        def decode_cv2(data):
            image = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
            if image is None:
                return None
            if mode == "rgb":
                return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
            return image[:, :, None] if mode == "gray" else image

        return decode_cv2
    try:
        from PIL import Image
    except ImportError:
        raise RectoolError(
            "decoding images needs OpenCV (pip install opencv-python-headless) or Pillow"
        ) from None

    def decode_pil(data):
        try:
            with Image.open(io.BytesIO(data)) as image:
                array = np.asarray(image.convert("L" if mode == "gray" else "RGB"))
        except (OSError, ValueError, SyntaxError):
            return None
        if mode == "gray":
            return array[:, :, None]
        return np.ascontiguousarray(array[:, :, ::-1]) if mode == "bgr" else array

    return decode_pil


def write_dali_index(source, path):
    """Write the one .idx that NVIDIA DALI's `fn.readers.mxnet` needs for a dataset's shards.

    DALI reads its list of .rec files as one stream, so its index holds offsets counted from
    the start of the first file (keys are ignored). Returns the .rec paths to pass as `path`,
    in the same order. DALI treats every record as a sample, so the insightface layout is
    refused: pack for DALI with the images layout.
    """
    ds = RecordDataset(source)
    if ds.layout != "images":
        raise RectoolError(
            f"{ds.shards[0][0]}: DALI reads every record as a sample, including the header and "
            "identity records of the insightface layout; pack with --layout images for DALI"
        )
    base = np.zeros(len(ds), np.int64)
    start = 0
    for s, (rec, _) in enumerate(ds.shards):
        base[ds._bounds[s] : ds._bounds[s + 1]] = start
        start += os.path.getsize(rec)
    pairs = zip(ds.keys.tolist(), (ds.offsets + base).tolist())
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        f.write("".join(f"{key}\t{offset}\n" for key, offset in pairs))
    os.replace(tmp, path)
    return [rec for rec, _ in ds.shards]


# --- sampling: epochs, ranks, resuming ---------------------------------------------------------


def epoch_order(size, epoch=0, seed=0, shuffle=True):
    """Return the order of all `size` samples in one epoch (int64), the same on every rank.

    Shuffled from PCG64 raw bits seeded by (seed, epoch), whose stream numpy keeps stable
    across versions, so a run resumed elsewhere sees the same order.
    """
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    if epoch < 0 or seed < 0:
        raise ValueError("epoch and seed must be >= 0")
    bits = np.random.PCG64([seed, epoch]).random_raw(size)
    return np.argsort(bits, kind="stable").astype(np.int64)


class RankSampler:
    """The samples one rank reads in an epoch: an equal share of one global order.

    Every epoch has one global order (`epoch_order`), independent of the number of ranks,
    cut to a multiple of `world_size` (`drop_last=True`) or padded by repeating its start.
    Rank r reads positions r, r + world_size, ... of it, so every rank gets the same count.
    `state_dict()` says how far the epoch got (`epoch`, `position` in the global order);
    `load_state_dict()` resumes there, on any number of ranks. Use as a DataLoader `sampler`.
    """

    def __init__(self, size, rank=0, world_size=1, shuffle=True, seed=0, drop_last=False):
        size = size if isinstance(size, int) else len(size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.position = 0  # where in the epoch's global order this view starts
        self._yielded = 0

    def __repr__(self):
        return (
            f"RankSampler(size={self.size}, rank={self.rank}, world_size={self.world_size}, "
            f"epoch={self.epoch}, position={self.position})"
        )

    @property
    def total(self):
        """Return the length of an epoch's global order after padding or dropping."""
        w = self.world_size
        return self.size // w * w if self.drop_last else -(-self.size // w) * w

    def set_epoch(self, epoch):
        """Start epoch `epoch` from its beginning."""
        self.epoch, self.position, self._yielded = epoch, 0, 0

    def global_order(self):
        """Return the epoch's global order, padded or cut to `total`."""
        order = epoch_order(self.size, self.epoch, self.seed, self.shuffle)
        if self.total <= self.size:
            return order[: self.total]
        return np.resize(order, self.total)  # repeats the order from its start

    def indices(self):
        """Return the sample indices this rank reads from `position` to the end of the epoch."""
        start = min(self.position, self.total)
        return self.global_order()[start + self.rank :: self.world_size]

    def __len__(self):
        return max(0, self.total - self.position) // self.world_size

    def __iter__(self):
        self._yielded = 0
        return self._count_yielded(self.indices().tolist())

    def _count_yielded(self, indices):
        for i in indices:
            self._yielded += 1
            yield i

    def state_dict(self, consumed=None):
        """Return {epoch, position, ...}: where to resume after `consumed` samples of this rank.

        `consumed` defaults to what the last iteration yielded, exact without DataLoader
        workers; with workers (which read ahead) pass the samples actually trained on.
        """
        consumed = self._yielded if consumed is None else consumed
        return {
            "epoch": self.epoch,
            "position": min(self.position + consumed * self.world_size, self.total),
            "seed": self.seed,
            "size": self.size,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state):
        """Resume at a `state_dict()`: the next iteration reads the rest of that epoch."""
        for name in ("seed", "size", "shuffle"):
            if name in state and state[name] != getattr(self, name):
                raise ValueError(
                    f"state was saved with {name}={state[name]!r}, this sampler has "
                    f"{getattr(self, name)!r}"
                )
        self.epoch, self.position, self._yielded = int(state["epoch"]), int(state["position"]), 0


# --- prefetching on a background thread -------------------------------------------------------

_ITEM, _END, _ERROR = range(3)


def prefetch(iterable, depth=2, fn=None):
    """Iterate `iterable` on a background thread, up to `depth` items ahead; return a `Prefetcher`.

    `fn` (optional) runs on that thread for each item, e.g. a copy to the GPU with
    `non_blocking=True` from pinned memory, so the copy overlaps the training step.
    """
    return Prefetcher(iterable, depth, fn)


class Prefetcher:
    """An iterator that produces items on a background thread into a bounded queue.

    An exception raised by the source (or `fn`) is raised again in the consumer, with its
    traceback. Leaving early (break, an exception, `close()`, garbage collection or `with`)
    stops the thread and closes the source iterator.
    """

    def __init__(self, iterable, depth=2, fn=None):
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self._queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._done = False
        # The thread must not reference self, or an abandoned Prefetcher would never be freed.
        self._thread = threading.Thread(
            target=_produce,
            args=(iterable, fn, self._queue, self._stop),
            name="rectool-prefetch",
            daemon=True,
        )
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == _ITEM:
            return value
        self.close()
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self):
        """Stop the background thread and drop what it produced ahead."""
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # No join here: the thread sees the flag within 50 ms and ends by itself.
        if getattr(self, "_stop", None) is not None:
            self._done = True
            self._stop.set()


def _produce(iterable, fn, out, stop):
    def put(entry):
        while not stop.is_set():
            try:
                out.put(entry, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    iterator = None
    try:
        iterator = iter(iterable)
        for item in iterator:
            if stop.is_set() or not put((_ITEM, fn(item) if fn is not None else item)):
                return
        put((_END, None))
    except BaseException as exc:  # handed to the consumer, which raises it
        put((_ERROR, exc))
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
