"""Read MXNet RecordIO datasets (.rec/.idx) with the standard library and numpy only.

    ds = open_dataset("out/faces", decode="rgb")  # manifest, prefix, .rec, [shards] or folder
    image, label = ds[0]                            # HWC uint8 array, float label

rectool reads every record through this module, and `rectool reader` copies it verbatim into
training code. It never writes a file. Decoding imports OpenCV (else Pillow) on first use.
"""

from __future__ import annotations

import bisect
import glob
import json
import mmap
import operator
import os
import stat
import struct
import threading
import zlib
from collections import namedtuple

__all__ = [
    "Header", "IndexFormatError", "RecordDataset", "RecordFile", "RecordFormatError",
    "RectoolError", "decode_image", "load_index", "open_dataset", "unpack_header",
]  # fmt: skip


class _LazyNumpy:
    """numpy, imported on first use: `rectool list` loads this module for its errors only."""

    def __getattr__(self, name):
        global np
        import numpy

        np = numpy
        return getattr(numpy, name)


np = _LazyNumpy()

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
# The .idx sidecar cache (written by rectool, only read here): magic, .idx size, mtime_ns,
# record count, CRC-32 of the .idx, padding; then int64 keys, then int64 offsets.
INDEX_CACHE_SUFFIX = ".rtc"
INDEX_CACHE_MAGIC = b"RTIDXC02"
INDEX_CACHE_HEADER = struct.Struct("<8sQqQI4x")
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "rectool-manifest"
MANIFEST_VERSION = 1
DATASET_LAYOUTS = ("images", "insightface")
DECODE_MODES = ("bgr", "rgb", "gray")
_RECORD_HEAD = struct.Struct("<IIIf")  # magic, lrec, flag, label: the fast path's one unpack
_IMAGE_START = PART_HEADER.size + IMAGE_HEADER_SIZE
Header = namedtuple("Header", "flag label id id2")


class RectoolError(Exception):
    """Base class of every error rectool raises on purpose."""


class RecordFormatError(RectoolError):
    """Bytes on disk are not what the format says: names the file, key and byte offset."""

    def __init__(self, message, path=None, offset=None, key=None):
        self.reason, self.offset, self.key = message, offset, key
        self.path = None if path is None else os.fspath(path)
        where = [self.path] if self.path is not None else []
        where += [f"key {key}"] * (key is not None) + [f"byte offset {offset}"] * (
            offset is not None
        )
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class IndexFormatError(RecordFormatError):
    """An .idx file cannot be parsed: names the file and line."""

    def __init__(self, message, path=None, line=None):
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message, path)


class SampleIndexError(RectoolError, IndexError):
    """A sample index outside the dataset (an `IndexError`, so iteration protocols stop)."""


def open_regular(path, what):
    """Open `path` read-only and return (fd, stat); refuse anything but a regular file.

    A FIFO would block a plain open and a device would be read without end, so the file is
    opened non-blocking and checked with fstat before a byte is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise RectoolError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise RectoolError(f"{path}: cannot open the {what} ({exc.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise RectoolError(f"{path}: not a regular file (the {what} must be one)")
    return fd, st


def _read_regular(path, what):
    fd, st = open_regular(path, what)
    with os.fdopen(fd, "rb") as f:
        return f.read(), st


def unpack_header(record, path=None, offset=None):
    """Split one record into its `Header` and image bytes, as `mxnet.recordio.unpack` does."""
    if len(record) < IMAGE_HEADER_SIZE:
        raise RecordFormatError(
            f"record of {len(record)} bytes is shorter than the {IMAGE_HEADER_SIZE}-byte "
            "image header", path, offset,
        )  # fmt: skip
    flag, label, id1, id2 = IMAGE_HEADER.unpack_from(record, 0)
    start = IMAGE_HEADER_SIZE + 4 * flag
    if flag > 0:
        if start > len(record):
            raise RecordFormatError(
                f"header announces {flag} float32 labels but the record has only "
                f"{len(record) - IMAGE_HEADER_SIZE} bytes after the header", path, offset,
            )  # fmt: skip
        label = np.frombuffer(record, np.float32, flag, IMAGE_HEADER_SIZE)
    return Header(flag, label, id1, id2), record[start:]


def parse_index(data, path=None):
    """Parse .idx text (`key \\t offset \\n` lines) into int64 arrays (keys, offsets).

    Lines keep file order, repeated keys included (lookups take the last, as MXNet does).
    Raises `IndexFormatError` naming the first bad line.
    """
    if data and not data.endswith(b"\n"):
        data += b"\n"
    parsed = _parse_index_runs(data)
    if parsed is not None:
        return parsed
    # Deleting the digits must leave one tab and one newline per line; only then does the
    # whitespace-blind numpy parser pair each key with its own offset.
    lines = data.count(b"\n")
    if data.translate(None, b"0123456789") == b"\t\n" * lines:
        values = np.fromstring(data, np.int64, sep=" ") if lines else np.empty(0, np.int64)
        if values.size == 2 * lines and not (values == 2**63 - 1).any():
            return values[0::2].copy(), values[1::2].copy()
    keys, offsets = [], []
    for number, raw in enumerate(data.split(b"\n")[:-1], start=1):
        fields = raw.strip().split(b"\t")
        try:
            key, offset = int(fields[0]), int(fields[1])
        except (ValueError, IndexError):
            why = (
                "key and offset must be integers"
                if len(fields) > 1
                else "expected 'key<TAB>offset'"
            )
            raise IndexFormatError(f"{why}, got {raw[:80]!r}", path, number) from None
        if not (0 <= offset < 2**63 and -(2**63) <= key < 2**63):
            raise IndexFormatError(f"number out of range in {raw[:80]!r}", path, number)
        keys.append(key), offsets.append(offset)
    return np.array(keys, np.int64), np.array(offsets, np.int64)


def _parse_index_runs(data, max_runs=256, chunk=1 << 20):
    """Parse runs of equally wide `digits TAB digits NL` lines as 2-D byte arrays, or None.

    The .idx of a pack (keys and offsets rising) is a few such runs; a run ends where the
    line width changes (found by bisection, then every byte of the run is checked).
    """
    a, pos, end, keys, offsets = np.frombuffer(data, np.uint8), 0, len(data), [], []
    while pos < end:
        nl = data.find(b"\n", pos, pos + 40)
        tab = data.find(b"\t", pos, nl)
        if max_runs == 0 or tab <= pos or not 2 <= nl - tab <= 19 or tab - pos > 18:
            return None
        max_runs -= 1
        width, k = nl + 1 - pos, tab - pos
        grid = a[pos : pos + (end - pos) // width * width].reshape(-1, width)
        low, high = 1, len(grid)  # bisect for the first row that does not look like a line
        while low < high:
            mid = (low + high) // 2
            low, high = (mid + 1, high) if grid[mid, k] == 9 and grid[mid, -1] == 10 else (low, mid)
        powers = 10 ** np.arange(width - 3, -1, -1, dtype=np.int64)
        for start in range(0, low, chunk):
            b = grid[start : min(low, start + chunk)] - 48  # digits 0..9; TAB 217, NL 218
            ok = (b[:, k] == 217) & (b[:, -1] == 218)
            if not ok.all() or np.count_nonzero(b >= 10) != 2 * len(b):
                rows = int(np.argmin(ok & ((b < 10).sum(1) == width - 2)))
                if start + rows < max(1, low // 2):
                    return None  # lines of varying widths: the general parser does better
                b, low = b[:rows], start + rows
            keys.append(np.einsum("ij,j->i", b[:, :k], powers[-k:]))
            offsets.append(np.einsum("ij,j->i", b[:, k + 1 : -1], powers[k - width + 2 :]))
            if len(b) < chunk:
                break
        pos += low * width
    empty = [np.empty(0, np.int64)]
    return np.concatenate(keys or empty), np.concatenate(offsets or empty)


def index_cache_path(idx_path):
    """Return the path of the binary sidecar cache kept next to an .idx file."""
    return os.fspath(idx_path) + INDEX_CACHE_SUFFIX


def load_index(idx_path, cache=True):
    """Read an .idx into int64 arrays (keys, offsets), in file order; writes nothing.

    With `cache=True` the sidecar `<idx>.rtc` that rectool writes is used when its recorded
    size, mtime and CRC-32 match the .idx.
    """
    idx_path = os.fspath(idx_path)
    fd, st = open_regular(idx_path, "index file")
    with os.fdopen(fd, "rb") as f:
        cached = read_index_cache(idx_path, st) if cache else None
        if cached is not None:
            return cached
        return parse_index(f.read(), idx_path)


def read_index_cache(idx_path, st=None):
    """Return (keys, offsets) from the sidecar cache, or None when missing, stale or damaged."""
    try:
        data, _ = _read_regular(index_cache_path(idx_path), "index cache")
    except RectoolError:
        return None
    if len(data) < INDEX_CACHE_HEADER.size:
        return None
    st = st or os.stat(idx_path)
    magic, size, mtime_ns, count, crc = INDEX_CACHE_HEADER.unpack_from(data)
    if (magic, size, mtime_ns) != (INDEX_CACHE_MAGIC, st.st_size, st.st_mtime_ns):
        return None
    if len(data) != INDEX_CACHE_HEADER.size + 16 * count:
        return None
    with open(idx_path, "rb") as f:
        crc_now = 0
        while block := f.read(1 << 24):
            crc_now = zlib.crc32(block, crc_now)
    if crc_now != crc:
        return None
    body = np.frombuffer(data, np.int64, 2 * count, INDEX_CACHE_HEADER.size)
    return body[:count].copy(), body[count:].copy()


class RecordFile:
    """A .rec file mapped read-only: records by byte offset, split parts rejoined.

    Maps lazily (again in a forked child), so it pickles for DataLoader workers.
    """

    def __init__(self, path):
        self.path, self._mm, self._size, self._pid = os.fspath(path), None, 0, None
        self._lock, self._owner = threading.Lock(), os.getpid()  # threads map it once

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
        """Map the file now (done on first read, and again after a fork)."""
        if self._mm is not None and self._pid == os.getpid():
            return
        if self._owner != os.getpid():  # a lock a parent thread held at a fork stays held
            self._lock, self._owner = threading.Lock(), os.getpid()
        with self._lock:
            if self._mm is None or self._pid != os.getpid():
                self.close()
                fd, st = open_regular(self.path, "record file")
                try:  # the mapping keeps its own descriptor
                    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if st.st_size else b""
                finally:
                    os.close(fd)
                self._size, self._pid, self._mm = st.st_size, os.getpid(), mm

    def close(self):
        """Release the mapping and its file descriptor."""
        mm, self._mm = self._mm, None
        if isinstance(mm, mmap.mmap):
            mm.close()

    @property
    def size(self):
        """Return the file size in bytes (when mapped)."""
        self.open()
        return self._size

    def read_at(self, offset, key=None):
        """Return the record whose first part starts at byte `offset`, split parts rejoined."""
        self.open()
        if offset + 8 <= self._size and not offset & 3 and offset >= 0:
            magic, lrec = PART_HEADER.unpack_from(self._mm, offset)
            end = offset + 8 + (lrec & LENGTH_MASK)
            if magic == MAGIC and lrec >> LENGTH_BITS == 0 and (end + 3) & ~3 <= self._size:
                return self._mm[offset + 8 : end]
        return self.read_parts(offset, key)[0]

    def next_offset(self, offset, key=None):
        """Return the byte offset just past the record starting at `offset` (padding included)."""
        return self.read_parts(offset, key)[1]

    def read_parts(self, offset, key=None):
        """Read the record at `offset` part by part; return (bytes, offset after it)."""
        self.open()
        mm, size, start, pieces = self._mm, self._size, offset, []

        def fail(message, at=None):
            return RecordFormatError(message, self.path, start if at is None else at, key)

        if offset < 0 or offset & 3:
            raise fail("offset is not a record start (not 4-byte aligned)")
        while True:
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
            padded = offset + 8 + ((length + 3) & ~3)
            if padded > size:
                raise fail(f"part of {length} bytes runs past end of file ({size} bytes)", offset)
            pieces.append(mm[offset + 8 : offset + 8 + length])
            offset = padded
            if cflag in (CFLAG_WHOLE, CFLAG_LAST):
                break
        if offset - start - 8 * len(pieces) > MAX_RECORD_BYTES + 4:
            raise fail("split record exceeds 2**29 bytes")
        return (pieces[0] if len(pieces) == 1 else MAGIC_BYTES.join(pieces)), offset

    def scan(self, start=0):
        """Yield (offset, record) for every record from byte `start` to the end, in file order."""
        self.open()
        while start < self._size:
            record, after = self.read_parts(start)
            yield start, record
            start = after


def read_manifest(path):
    """Read and check a pack manifest; raise `RectoolError` naming the file and field."""
    path = os.fspath(path)
    data, _ = _read_regular(path, "manifest")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RectoolError(f"{path}: not a JSON manifest ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise RectoolError(f'{path}: not a rectool manifest (no "format": "{MANIFEST_FORMAT}")')

    def bad(field, want):
        return RectoolError(f"{path}: manifest field {field!r} must be {want}")

    version = doc.get("format_version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise bad("format_version", "an integer")
    if version > MANIFEST_VERSION:
        raise RectoolError(
            f"{path}: manifest format version {version} is newer than this reader "
            f"understands ({MANIFEST_VERSION}); upgrade rectool"
        )
    if doc.get("layout") not in (None, "plain", *DATASET_LAYOUTS):
        raise bad("layout", f"one of {DATASET_LAYOUTS}")
    if not isinstance(doc.get("identities", {}), (dict, list, type(None))):
        raise bad("identities", "an object or a list")
    if not isinstance(doc.get("shards"), list):
        raise bad("shards", "a list of {rec, idx, ...} objects")
    seen = set()
    for i, shard in enumerate(doc["shards"]):
        if not isinstance(shard, dict):
            raise bad(f"shards[{i}]", "an object")
        for name in ("rec", "idx"):
            value = shard.get(name)
            if (
                not isinstance(value, str)
                or value in ("", ".", "..")
                or "/" in value
                or "\\" in value
            ):
                raise bad(f"shards[{i}].{name}", "a plain file name in the manifest's folder")
            if value in seen:
                raise RectoolError(f"{path}: manifest lists the shard file {value!r} twice")
            seen.add(value)
        for name in ("records", "rec_bytes"):
            value = shard.get(name)
            if value is not None and (type(value) is not int or value < 0):
                raise bad(f"shards[{i}].{name}", "a count (an integer >= 0)")
    return doc


def resolve_source(source):
    """Find a dataset's shards; return (manifest or None, manifest path or None, shards).

    `source` is a manifest (.json), a .rec, a pack prefix (`PREFIX.manifest.json`,
    `PREFIX.rec`, `PREFIX-00000.rec`...), a folder holding `train.rec` (insightface), or a
    list of .rec paths. `shards` lists (rec, idx) path pairs; every one that exists is
    checked to be a regular file.
    """
    manifest = manifest_path = None
    if isinstance(source, (list, tuple)):
        if not source:
            raise RectoolError("no shard paths given")
        recs = [os.fspath(p) for p in source]
    elif os.path.isdir(source := os.fspath(source)):
        if not os.path.exists(os.path.join(source, "train.rec")):
            raise RectoolError(
                f"{source}: a folder without train.rec; give a manifest, .rec or prefix"
            )
        return resolve_source(os.path.join(source, "train.rec"))
    elif source.endswith(".json"):
        manifest, manifest_path = read_manifest(source), source
        folder = os.path.dirname(source)
        pairs = [
            (os.path.join(folder, s["rec"]), os.path.join(folder, s["idx"]))
            for s in manifest["shards"]
        ]
        return manifest, manifest_path, _checked(pairs)
    elif source.endswith(".rec"):
        prefix = source[: -len(".rec")]
        if os.path.exists(prefix + MANIFEST_SUFFIX):
            manifest, path, shards = resolve_source(prefix + MANIFEST_SUFFIX)
            if (
                len(shards) == 1
                and os.path.exists(source)
                and os.path.samefile(shards[0][0], source)
            ):
                return manifest, path, shards
        if not os.path.exists(source):
            raise RectoolError(f"{source}: record file not found")
        recs = [source]
    elif os.path.exists(source + MANIFEST_SUFFIX):
        return resolve_source(source + MANIFEST_SUFFIX)
    elif os.path.exists(source + ".rec"):
        return resolve_source(source + ".rec")
    else:
        recs = sorted(glob.glob(glob.escape(source) + "-[0-9][0-9][0-9][0-9][0-9].rec"))
        if not recs:
            raise RectoolError(
                f"{source}: no dataset here (looked for {source}{MANIFEST_SUFFIX}, {source}.rec, "
                f"{source}-00000.rec)"
            )
    return None, None, _checked([(p, os.path.splitext(p)[0] + ".idx") for p in recs])


def _checked(pairs):
    if len({os.path.realpath(rec) for rec, _ in pairs}) < len(pairs):
        raise RectoolError(f"{pairs[0][0]}: a shard is listed twice")
    for path in (p for pair in pairs for p in pair):
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue  # a missing file is reported by whoever opens it, with its role
        if not stat.S_ISREG(mode):
            raise RectoolError(f"{path}: not a regular file (shard files must be)")
    return pairs


class IndexedRecordFile:
    """A .rec with its .idx: records by key (a repeated key's last line wins, as in MXNet)."""

    def __init__(self, rec_path, idx_path=None, cache=True):
        self.rec = RecordFile(rec_path)
        self.idx_path = os.fspath(idx_path or os.path.splitext(self.rec.path)[0] + ".idx")
        self.keys, self.offsets = load_index(self.idx_path, cache=cache)
        self._lookup = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self):
        return len(self.keys)

    def close(self):
        """Release the mapping of the .rec."""
        self.rec.close()

    def read(self, key):
        """Return the record stored under `key` (bytes)."""
        if self._lookup is None:
            self._lookup = dict(zip(self.keys.tolist(), self.offsets.tolist()))
        if key not in self._lookup:
            raise RectoolError(f"{self.idx_path}: key {key} is not in the index")
        return self.rec.read_at(self._lookup[key], key)

    def read_at_position(self, i):
        """Return the record of the i-th line of the index (bytes)."""
        return self.rec.read_at(int(self.offsets[i]), int(self.keys[i]))


_DECODERS = {}


def decode_image(data, mode="bgr"):
    """Decode image bytes into an HWC uint8 array ("bgr", "rgb" or "gray": H x W x 1).

    Uses OpenCV, else Pillow, imported on first use. Raises `RecordFormatError` (without a
    location) when the bytes are empty or cannot be decoded.
    """
    if not len(data):
        raise RecordFormatError("empty image: the record holds a header and no image bytes")
    decoder = _DECODERS.get(mode) or _DECODERS.setdefault(mode, _make_decoder(mode))
    try:
        image = decoder(data)
    except Exception as exc:  # the decoder's own error types (cv2.error, OSError...)
        raise RecordFormatError(f"the {len(data)} image bytes cannot be decoded ({exc})") from None
    if image is None:
        raise RecordFormatError(
            f"the {len(data)} image bytes cannot be decoded (they start with {bytes(data[:8])!r})"
        )
    return image


def _make_decoder(mode):
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {DECODE_MODES}, not {mode!r}")
    try:
        import cv2
    except ImportError:
        cv2 = None
    if cv2 is not None:
        flag = cv2.IMREAD_GRAYSCALE if mode == "gray" else cv2.IMREAD_COLOR

        def decode_cv2(data):
            image = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
            if image is None or mode == "bgr":
                return image
            return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if mode == "rgb" else image[:, :, None]

        return decode_cv2
    try:
        import io

        from PIL import Image
    except ImportError:
        raise RectoolError(
            "decoding images needs OpenCV (opencv-python-headless) or Pillow"
        ) from None

    def decode_pil(data):
        with Image.open(io.BytesIO(data)) as image:
            array = np.asarray(image.convert("L" if mode == "gray" else "RGB"))
        if mode == "gray":
            return array[:, :, None]
        return np.ascontiguousarray(array[:, :, ::-1]) if mode == "bgr" else array

    return decode_pil


_fork_generation = [0]  # bumped in forked children: no getpid() per read


def _after_fork_in_child():
    _fork_generation[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def open_dataset(source, decode=None, *, layout=None, cache=True):
    """Open a packed dataset for training; return a `RecordDataset`.

    `source`: a manifest, pack prefix, .rec, list of .rec paths or insightface folder.
    `decode`: None (image bytes), "bgr", "rgb", "gray" (HWC uint8 arrays) or a function of
    the bytes. `layout` ("images" or "insightface") comes from the manifest or record 0.
    """
    return RecordDataset(source, decode=decode, layout=layout, cache=cache)


class RecordDataset:
    """The samples of a packed dataset, read at random through mmap: `ds[i] -> (image, label)`.

    The label is a float (header flag 0) or a float32 vector. Samples run shard by shard in
    .idx line order; in the insightface layout they are the images at keys 1..N only.
    Pickles without its open files (the parsed index travels along) and maps each .rec
    lazily in each process, after a fork too: ready for DataLoader workers.
    """

    def __init__(self, source, decode=None, layout=None, cache=True):
        if not (decode is None or decode in DECODE_MODES or callable(decode)):
            raise ValueError(f"decode must be None, one of {DECODE_MODES} or a function")
        if layout is not None and layout not in DATASET_LAYOUTS:
            raise ValueError(f"layout must be one of {DATASET_LAYOUTS}, not {layout!r}")
        self.manifest, self.manifest_path, self.shards = resolve_source(source)
        self.decode, self._lock = decode, threading.Lock()
        self._files = [RecordFile(rec) for rec, _ in self.shards]
        self._reset_handles()
        listed = (self.manifest or {}).get("shards") or [None] * len(self.shards)
        try:
            indexes = [
                _check_shard(rf, idx, *load_index(idx, cache=cache), info, self.manifest_path)
                for (_, idx), info, rf in zip(self.shards, listed, self._files)
            ]
            self._build(indexes, layout or (self.manifest or {}).get("layout"))
        finally:
            self.close()
        self._labels = self._identity_ranges = None

    def _build(self, indexes, layout):
        bounds = np.concatenate([[0], np.cumsum([len(k) for k, _ in indexes], dtype=np.int64)])
        keys, offsets = indexes[0] if len(indexes) == 1 else map(np.concatenate, zip(*indexes))
        header = (
            None if layout == "images" else self._insightface_header(keys, offsets, bounds, layout)
        )
        self.layout, self._identities, lines = "insightface" if header else "images", None, None
        if header is not None:
            end, id_end = header
            lines = _positions_of_keys(keys, np.arange(1, end, dtype=np.int64), self.shards)
            ids = _positions_of_keys(keys, np.arange(end, id_end, dtype=np.int64), self.shards)
            self._identities = (np.searchsorted(bounds, ids, "right") - 1, offsets[ids], keys[ids])
            keys, offsets = keys[lines], offsets[lines]
        self.keys, self.offsets, self._count = keys, offsets, len(offsets)
        shard_ids = None if lines is None else np.searchsorted(bounds, lines, "right") - 1
        if shard_ids is None or (np.diff(shard_ids) >= 0).all():
            samples = (
                bounds if shard_ids is None else np.searchsorted(shard_ids, np.arange(len(bounds)))
            )
            self._bounds, self._shard_ids = samples.tolist(), None
        else:  # samples jump between shards: keep each sample's shard
            self._bounds, self._shard_ids = None, shard_ids.astype(np.int32)
        keys.flags.writeable = offsets.flags.writeable = False

    def _insightface_header(self, keys, offsets, bounds, layout):
        """Return (first identity key, identity end) from record 0, or None (images layout)."""
        zero = np.flatnonzero(keys == 0)
        if not len(zero):
            if layout == "insightface":
                raise RectoolError(
                    f"{self.shards[0][1]}: no record 0, so not the insightface layout "
                    "(record 0 holds the image and identity key ranges)"
                )
            return None
        line = int(zero[-1])  # a repeated key: the last one counts, as in MXNet
        rf, offset = (
            self._files[int(np.searchsorted(bounds, line, "right") - 1)],
            int(offsets[line]),
        )
        head, body = unpack_header(rf.read_at(offset, 0), rf.path, offset)
        if head.flag >= 2 and not body and 1 <= head.label[0] <= head.label[1]:
            return int(head.label[0]), int(head.label[1])
        if layout == "insightface":
            raise RecordFormatError(
                "record 0 is not an insightface header (flag >= 2, no image, labels "
                f"[first identity key, end]); found flag {head.flag} and {len(body)} image bytes",
                rf.path, offset, 0,
            )  # fmt: skip
        return None

    def _reset_handles(self):
        self._maps, self._sizes = [None] * len(self._files), [0] * len(self._files)
        self._generation = _fork_generation[0]

    def _open(self, s):
        """Map shard `s` in this process; return its mapping."""
        if self._generation != _fork_generation[0]:
            self._lock = threading.Lock()  # one a parent thread held at the fork stays held
        with self._lock:
            if self._generation != _fork_generation[0]:
                self.close(locked=True)  # the parent's mappings: map afresh
            if self._maps[s] is None:
                rf = self._files[s]
                rf.open()
                self._maps[s], self._sizes[s] = rf._mm, rf._size
            return self._maps[s]

    def close(self, locked=False):
        """Release this process's mappings (they reopen on the next read)."""
        if not locked:
            with self._lock:
                return self.close(locked=True)
        for rf in self._files:
            rf.close()
        self._reset_handles()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("_maps", "_sizes", "_lock")}

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.Lock())
        self._reset_handles()

    def __repr__(self):
        where = self.manifest_path or self.shards[0][0]
        more = f" + {len(self.shards) - 1} shards" if len(self.shards) > 1 else ""
        return (
            f"RecordDataset({where!r}{more}, {self._count} samples, layout={self.layout!r}, "
            f"decode={self.decode!r})"
        )

    def __len__(self):
        return self._count

    def __iter__(self):
        for i in range(self._count):
            yield self[i]

    def _locate(self, i):
        """Return (shard, sample index) of index `i`, negative indices counted from the end."""
        i = given = operator.index(i)
        i += self._count if i < 0 else 0
        if not 0 <= i < self._count:
            raise SampleIndexError(
                f"sample {given} is out of range: the dataset has {self._count} samples"
            )
        return (
            self._shard_ids.item(i)
            if self._bounds is None
            else bisect.bisect_right(self._bounds, i) - 1
        ), i

    def location(self, i):
        """Return (rec path, byte offset, key) of sample `i`."""
        s, i = self._locate(i)
        return self.shards[s][0], self.offsets.item(i), self.keys.item(i)

    def header(self, i):
        """Return the `Header` of sample `i` (flag, label, id, id2)."""
        s, i = self._locate(i)
        rf, offset, key = self._files[s], self.offsets.item(i), self.keys.item(i)
        return unpack_header(rf.read_at(offset, key), rf.path, offset)[0]

    def raw(self, i):
        """Return sample `i` undecoded: (image bytes as a memoryview-able buffer, label)."""
        s, i = self._locate(i)
        mm = self._maps[s]
        if mm is None or self._generation != _fork_generation[0]:
            mm = self._open(s)
        offset = self.offsets.item(i)  # >= 0: checked at open
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
            return mm[offset + _IMAGE_START : offset + 8 + lrec], label
        rf, key = self._files[s], self.keys.item(i)
        try:
            head, payload = unpack_header(rf.read_at(offset, key), rf.path, offset)
        except RecordFormatError as exc:
            raise RecordFormatError(exc.reason, rf.path, offset, key) from None
        return bytes(payload), (head.label if head.flag == 0 else head.label.copy())

    def __getitem__(self, i):
        if self.decode is None:
            return self.raw(i)
        payload, label = self.raw(i)
        if callable(self.decode):
            return self.decode(payload), label
        try:
            return decode_image(payload, self.decode), label
        except RecordFormatError as exc:
            raise RecordFormatError(exc.reason, *self.location(i)) from None

    @property
    def labels(self):
        """Return every sample's label, read from the record headers only (no image bytes).

        float32 (N,) when every header has flag 0, (N, k) when each has k labels, else an
        object array. Read once, then kept.
        """
        if self._labels is None:
            shard_ids = self._shard_ids
            if shard_ids is None:
                shard_ids = np.repeat(np.arange(len(self.shards)), np.diff(self._bounds))
            self._labels = self._gather_labels(shard_ids, self.offsets, self.keys)
        return self._labels

    @property
    def identity_ranges(self):
        """Return the insightface identities as an int64 (K, 2) array [start, end) of samples.

        None in the images layout.
        """
        if self._identities is not None and self._identity_ranges is None:
            shard_ids, offsets, keys = self._identities
            pairs = self._gather_labels(*self._identities)
            if pairs.dtype == object or pairs.ndim != 2 or pairs.shape[1] < 2:
                raise RectoolError(
                    f"{self.shards[0][0]}: identity records must each hold a label pair "
                    "[first key, end key)"
                )
            ranges = pairs[:, :2].astype(np.int64) - 1  # image key k is sample k - 1
            bad = np.flatnonzero(
                (ranges[:, 0] < 0) | (ranges[:, 0] > ranges[:, 1]) | (ranges[:, 1] > len(self))
            )
            if len(bad):
                j = int(bad[0])
                raise RecordFormatError(
                    f"identity record holds the key range {(pairs[j, :2] + 0).tolist()}, "
                    f"outside the image keys 1..{len(self)}",
                    self.shards[int(shard_ids[j])][0], int(offsets[j]), int(keys[j]),
                )  # fmt: skip
            ranges.flags.writeable = False
            self._identity_ranges = ranges
        return self._identity_ranges

    def _gather_labels(self, shard_ids, offsets, keys):
        parts = []
        for s in range(len(self._files)):
            rows = np.flatnonzero(shard_ids == s)
            if len(rows):
                self._open(s)
                parts.append((rows, _header_labels(self._files[s], offsets[rows], keys[rows])))
        shapes = {labels.shape[1:] if labels.dtype != object else None for _, labels in parts}
        if len(shapes) <= 1 and None not in shapes:
            out = np.zeros((len(offsets), *next(iter(shapes), ())), np.float32)
        else:
            out = np.empty(len(offsets), object)
            parts = [
                (rows, [x if np.ndim(x) == 0 else np.array(x, np.float32) for x in labels])
                for rows, labels in parts
            ]
        for rows, labels in parts:
            if out.dtype == object:
                for row, label in zip(rows.tolist(), labels):
                    out[row] = label
            else:
                out[rows] = labels
        out.flags.writeable = False
        return out


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


def _positions_of_keys(keys, wanted, shards):
    """Return the .idx line of each wanted key (the last line of a repeated key)."""
    order = np.argsort(keys, kind="stable")
    found = np.searchsorted(keys, wanted, side="right", sorter=order) - 1
    lines = order[np.maximum(found, 0)]
    missing = (found < 0) | (keys[lines] != wanted)
    if missing.any():
        raise RectoolError(
            f"{', '.join(idx for _, idx in shards)}: key {int(wanted[np.argmax(missing)])} is not "
            f"in the index, but record 0 says keys up to {int(wanted[-1])} exist"
        )
    return lines


def _check_shard(rf, idx_path, keys, offsets, listed, manifest_path):
    """Refuse a shard whose .idx does not describe its .rec; return (keys, offsets)."""
    size = rf.size
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
    if not len(keys):
        if size:
            raise RectoolError(
                f"{idx_path}: empty index beside {rf.path} of {size} bytes "
                "(rebuild it with `rectool reindex`)"
            )
        return keys, offsets
    past = np.flatnonzero((offsets > size - 8) | (offsets < 0))  # from a crafted cache
    # A few records, the farthest one included, must start where the index says.
    for line in sorted(
        {0, len(offsets) // 2, len(offsets) - 1, int(np.argmax(offsets)), *past[:1].tolist()}
    ):
        offset, key = int(offsets[line]), int(keys[line])
        try:
            rf.next_offset(offset, key)
        except RecordFormatError as exc:
            raise RecordFormatError(
                f"{exc.reason}; the index {idx_path} is stale or belongs to another .rec "
                "(rebuild it from the .rec)", rf.path, offset, key,
            ) from None  # fmt: skip
    return keys, offsets
