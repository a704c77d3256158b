"""Read a rectool pack (MXNet RecordIO shards, a manifest, a binary index) with numpy only.

    ds = open_dataset("out/faces", decode="rgb")  # the pack's prefix or its manifest's path
    image, label = ds[0]  # HWC uint8 array, float label (or vector); ds.labels: every label

The `.npy` index is mapped: 42M records open in milliseconds. Reads are bounded and checked; an
image over `max_pixels` is refused from its header before OpenCV allocates. A pack without
that index is refused (`NotIndexedError`): `rectool index` writes one.
"""

from __future__ import annotations

import bisect
import errno
import io
import json
import math
import mmap
import operator
import os
import re
import stat
import struct
from typing import TYPE_CHECKING, Any

Data = bytes | bytearray | memoryview  # image bytes, as annotations name them
if TYPE_CHECKING:
    import numpy as np
    from _typeshed import StrPath
else:  # numpy imported on first use: the command line loads this module for its errors
    _kept = lambda s, n: vars(s).setdefault(n, getattr(__import__("numpy"), n))  # noqa: E731
    np = type("LazyNumpy", (), {"__getattr__": _kept})()  # each name looked up once, then kept

__all__ = [
    "ImageTooLargeError", "InputError", "NotIndexedError", "RecordDataset", "RecordFormatError",
    "RectoolError", "SampleIndexError", "decode_image", "image_start", "open_dataset",
]  # fmt: skip
FORMAT_VERSION = MANIFEST_VERSION = 3  # the manifest format this module reads
# dmlc-core recordio.h: parts of magic:u32, lrec:u32 = cflag << 29 | length, data, padding.
MAGIC, LENGTH_BITS, PART_HEADER = 0xCED7230A, 29, struct.Struct("<II")
MAGIC_BYTES, LENGTH_MASK = struct.pack("<I", MAGIC), (1 << LENGTH_BITS) - 1
MAX_RECORD_BYTES, (CFLAG_WHOLE, CFLAG_FIRST, CFLAG_MIDDLE, CFLAG_LAST) = LENGTH_MASK, range(4)
# MXNet's image header: flag, label, id, id2 (<IfQQ); flag > 0: that many float32 labels follow.
IMAGE_HEADER_SIZE, _RECORD_HEAD = 24, struct.Struct("<III")  # + magic, lrec: a read's one unpack
MANIFEST_SUFFIX, MANIFEST_FORMAT, MAX_MANIFEST_BYTES = ".manifest.json", "rectool-manifest", 1 << 28
MAX_JSON_VALUES = 1 << 24  # 2 a name of 8M identities (format 1, 2); see docs/format.md
# A prefix with either is an unfinished pack or a replacement not yet finished: not readable.
STATE_SUFFIX, JOURNAL_SUFFIX = ".pack-state.json", ".commit-journal.json"
DATASET_LAYOUTS, DECODE_MODES = ("images", "insightface"), ("bgr", "rgb", "gray")
INDEX_ARRAYS = {"offsets": ("<i8", (1,)), "keys": ("<i8", (1,)), "labels": ("<f4", (1, 2))}
_NOT_IN_NAMES = re.compile("[/\\\\\0\ud800-\udfff]")  # + half a UTF-16 pair: not in a name
DEFAULT_MAX_PIXELS = 50_000_000  # over a 45-megapixel camera's; 150 MB decoded in 8-bit colour
file_identity = operator.attrgetter("st_dev", "st_ino", "st_size", "st_mtime_ns")  # of a stat


class RectoolError(Exception):
    """Base class of every error rectool raises on purpose."""


class RecordFormatError(RectoolError):
    """Bytes on disk are not what the format says: names the file, key and byte offset."""

    def __init__(self, why: str, path: Any = None, offset: Any = None, key: Any = None) -> None:
        self.reason, self.offset, self.key, self.path = why, offset, key, path and os.fspath(path)
        pairs = zip((self.path or "", f"key {key}", f"byte offset {offset}"), (path, key, offset))
        where = ", ".join(text for text, value in pairs if value is not None)
        super().__init__(f"{where}: {why}" if where else why)


class ImageTooLargeError(RecordFormatError):
    """An image whose header declares more pixels than the decode budget (`max_pixels`)."""


class InputError(RectoolError):
    """An input that cannot be used: missing, not a regular file, not a pack, a bad manifest."""


class NotIndexedError(InputError):
    """A pack without a binary index (a bare .rec, an older pack): `rectool index` writes one."""


class SampleIndexError(RectoolError, IndexError):
    """A sample index outside the dataset (an `IndexError`, so iteration protocols stop)."""


def open_regular(path: StrPath, what: str, max_bytes: Any = None, flags: int = 0) -> Any:
    """Open `path` read-only, non-blocking (with `os.open` `flags` added); return (fd, stat) if
    it is a regular file (a FIFO would block, a device never end) of at most `max_bytes`."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | flags)
    except OSError as exc:
        why = f"cannot open the {what} ({exc.strerror})" if exc.errno != errno.ENOENT else ""
        raise InputError(f"{path}: {why or what + ' not found'}") from None
    st = os.fstat(fd)
    why = "" if stat.S_ISREG(st.st_mode) else f"not a regular file (the {what} must be one)"
    if why or (max_bytes is not None and st.st_size > max_bytes):
        os.close(fd)
        why = why or f"the {what} is {st.st_size:,} bytes, over {max_bytes:,}"
        raise InputError(f"{path}: {why}")
    return fd, st


def image_start(record: Data, path: Any = None, offset: Any = None, key: Any = None) -> int:
    """Return where a record's image bytes start: after its image header and float32 labels."""
    flag = int.from_bytes(record[:4], "little") if len(record) >= IMAGE_HEADER_SIZE else None
    if flag is None or IMAGE_HEADER_SIZE + 4 * flag > len(record):
        labels = "" if flag is None else f" and {flag} float32 labels"
        why = f"record of {len(record)} bytes, too short for its 24-byte image header{labels}"
        raise RecordFormatError(why, path, offset, key)
    return IMAGE_HEADER_SIZE + 4 * flag


class PreadFile(io.FileIO):
    """A file of `size` bytes sliced as its mapping is, by `os.pread`: nothing mapped, no page
    faults. A slice the file shrank under or cannot give (EIO) is refused (a mapping: SIGBUS)."""

    def __init__(self, fd: int, size: int, path: str) -> None:
        super().__init__(fd, "rb")
        self.size, self.path = size, path

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, at: slice) -> bytes:
        try:
            data, why = os.pread(self.fileno(), at.stop - at.start, at.start), "the file shrank"
        except OSError as exc:  # a failing disk, a file system gone
            data, why = b"", f"cannot read the record file ({exc.strerror})"
        if len(data) < at.stop - at.start:
            raise RecordFormatError(f"record cut short: {why}", self.path, at.start)
        return data


class RecordFile:
    """A .rec mapped read-only on first use (`mapped = False`: read as a `PreadFile`). Pickles
    as its path and the identity of the file it opened first: another file there is refused."""

    mapped = True

    def __init__(self, path: StrPath, identity: tuple[int, ...] | None = None) -> None:
        self.path, self._identity = os.fspath(path), identity
        self._mm: Any = None  # an mmap, b"" (an empty file) or a PreadFile

    def __reduce__(self) -> Any:
        return type(self), (self.path, self._identity)

    def open(self) -> Any:
        """Return the mapping of the file (or its `PreadFile`), made on first use."""
        if self._mm is None:
            fd, st = open_regular(self.path, "record file")
            try:
                if self._identity not in (None, file_identity(st)):
                    raise RectoolError(f"{self.path} was replaced after it was opened; open again")
                size, mapped = st.st_size, self.mapped
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size and mapped else b""
                self._mm = mm if mapped else PreadFile(os.dup(fd), size, self.path)
                self._identity = file_identity(st)
            except OSError as exc:  # ENOMEM under a memory limit (ulimit -v)
                raise RectoolError(f"{self.path}: cannot map the record file ({exc})") from None
            finally:
                os.close(fd)
        return self._mm

    def close(self) -> None:
        mm, self._mm = self._mm, None
        getattr(mm, "close", bool)()  # an mmap or a PreadFile (not b"" or None)

    def read_parts(self, offset: int, key: Any = None) -> tuple[bytes, int]:
        """Return (the record whose first part is at byte `offset`, split parts rejoined with
        the magic between them; the offset after its padding), or raise `RecordFormatError`."""
        mm, pieces, cflag = self.open(), list[bytes](), None
        while cflag not in (CFLAG_WHOLE, CFLAG_LAST):
            ok = 0 <= offset <= len(mm) - 8 and not offset & 3
            magic, lrec = PART_HEADER.unpack(mm[offset : offset + 8]) if ok else (MAGIC, 0)
            cflag, length, end = lrec >> LENGTH_BITS, lrec & LENGTH_MASK, offset + 8
            if offset < 0 or offset & 3:
                why = "not a record start (a negative or not 4-byte aligned offset)"
            elif end > len(mm):
                found = "the end of the file" if offset >= len(mm) else "a truncated part header"
                why = f"record cut short: expected a part header, found {found}"
            elif magic != MAGIC:
                why = f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})"
            elif (cflag in (CFLAG_MIDDLE, CFLAG_LAST)) != bool(pieces):
                want = "2 or 3: a split record goes on" if pieces else "0 or 1: a record starts"
                why = f"part has continuation flag {cflag} (expected {want})"
            elif end + length + (-length & 3) > len(mm):
                why = f"record cut short: a part of {length} bytes runs past the end of the file"
            else:
                pieces.append(mm[end : end + length])
                offset = end + length + (-length & 3)
                continue
            raise RecordFormatError(why, self.path, offset, key)
        return (pieces[0] if len(pieces) == 1 else MAGIC_BYTES.join(pieces)), offset


def plain_name(v: object) -> bool:
    """Return whether `v` names a file in the manifest's folder (no folder, NUL, "." or "..")."""
    return isinstance(v, str) and v not in ("", ".", "..") and not _NOT_IN_NAMES.search(v)


def is_count(v: object) -> bool:
    """Return whether `v` is a count: an integer 0 .. 2**63-1 (not a bool)."""
    return type(v) is int and 0 <= v < 1 << 63


def json_values(data: bytes, path: str, what: str) -> bytes:
    """Return JSON `data` unless it may hold over `MAX_JSON_VALUES` values and keys (all but
    the first follow a `[`, `{`, `,` or `:`; one in a string only adds): `InputError` then."""
    if (n := 1 + sum(map(data.count, b"[{,:"))) > MAX_JSON_VALUES:
        why = f"may hold {n:,} JSON values and keys, over the {MAX_JSON_VALUES:,} one may hold"
        raise InputError(f"{path}: not a rectool {what}: its {len(data):,} bytes {why}")
    return data


def read_manifest(path: StrPath) -> dict[str, Any]:
    """Read a pack manifest, checking the fields a reader uses; raise `InputError` if not one."""
    path = os.fspath(path)
    with os.fdopen(open_regular(path, "manifest", MAX_MANIFEST_BYTES)[0], "rb") as f:
        try:
            doc = json.loads(json_values(f.read(), path, "manifest"))
        except (ValueError, RecursionError) as exc:
            why = "JSON nested too deep" if isinstance(exc, RecursionError) else exc
            raise InputError(f"{path}: not a rectool manifest ({why})") from None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        raise InputError(f'{path}: not a rectool manifest (no "format": "{MANIFEST_FORMAT}")')
    version, shards, index = doc.get("format_version", 0), doc.get("shards"), doc.get("index")
    name, count = "a plain file name in its folder", "a count (an integer >= 0)"
    bad = [] if is_count(version) else [("format_version", count)]
    if not bad and version > MANIFEST_VERSION:
        why = f"newer than this reader understands ({MANIFEST_VERSION}); upgrade rectool"
        raise InputError(f"{path}: manifest format version {version} is {why}")
    if not isinstance(shards, list) or not shards:
        bad, shards = [*bad, ("shards", "a list of {rec, idx, ...} objects, one or more")], []
    recs = [s.get("rec") if isinstance(s, dict) else None for s in shards]
    bad += [(f"shards[{i}].rec", name + ", listed once") for i, rec in enumerate(recs)
            if not plain_name(rec) or rec in recs[:i]]  # fmt: skip
    if not bad and version >= 3 and index is not None:
        samples = index.get("samples") if isinstance(index, dict) else None
        if not (isinstance(samples, list) and len(samples) == len(recs)):
            bad, samples = [("index.samples", "a list of counts, one a shard")], []
        bad += [(f"index.samples[{i}]", count) for i, n in enumerate(samples) if not is_count(n)]
        entries = index.items() if samples else ()  # not a dict when samples is not a list
        files = {k: v.get("file") for k, v in entries if isinstance(v, dict)}
        bad += [(f"index.{k}.file", name) for k in INDEX_ARRAYS if not plain_name(files.get(k))]
    if bad:
        raise InputError(f"{path}: manifest field {bad[0][0]!r} must be {bad[0][1]}")
    return doc


def refuse_unfinished(prefix: str) -> None:
    """Raise when the pack at `prefix` is unfinished or half replaced (never read as whole)."""
    for suffix, why in (
        (JOURNAL_SUFFIX, "a run that was replacing this pack was interrupted after the new pack "
         "was complete ({} lists what is left to move); `rectool verify {}` finishes it"),
        (STATE_SUFFIX, "an unfinished pack ({} is there); continue it: run the command that "
         "wrote it again with --resume"),
    ):  # fmt: skip
        if os.path.lexists(prefix + suffix):
            raise RectoolError(f"{prefix}: " + why.format(prefix + suffix, prefix))


def load_array(path: str, name: str, length: int | None, kind: Any = None) -> Any:
    """Map the index array `name` read-only if it has `length` rows (None: any) of `kind`'s
    (dtype, ndims) (`INDEX_ARRAYS[name]`'s); else raise `InputError`. Never unpickles."""
    (dtype, ndims), fmt = kind or INDEX_ARRAYS[name], np.lib.format
    with os.fdopen(open_regular(path, "index array")[0], "rb") as f:
        try:
            read_header = getattr(fmt, f"read_array_header_{fmt.read_magic(f)[0]}_0")
            shape, fortran, found = read_header(f, max_header_size=1 << 16)
        except Exception as exc:  # numpy parses with ast and tokenize: any of their errors
            raise InputError(f"{path}: not a {name} index array ({exc})") from None
        rows, start, size = shape[0] if shape else -1, f.tell(), os.fstat(f.fileno()).st_size
        wrong = found != dtype or len(shape) not in ndims or fortran or 0 in shape[1:]
        if wrong or length not in (None, rows):
            why = f"must be {length} rows of {np.dtype(dtype)}, not {shape} {found}"
            raise InputError(f"{path}: the {name} index {why}: rebuild it with `rectool index`")
        if min(shape) < 0 or start + math.prod(shape) * found.itemsize != size:
            raise InputError(f"{path}: {size:,} bytes, not the {shape} its header says")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(mm, found, math.prod(shape), start).reshape(shape)


def open_dataset(source: StrPath, decode: Any = None, *, max_pixels: int = 50_000_000) -> Any:
    """Open a pack for training by its prefix (`out/faces`) or manifest; see `RecordDataset`."""
    source = os.fspath(source)
    path = source if source.endswith(MANIFEST_SUFFIX) else source + MANIFEST_SUFFIX
    if path != source and not os.path.exists(path):
        why = "a .rec without one gets its manifest and index from `rectool index`"
        raise NotIndexedError(f"{source}: no rectool pack here (no {path}); {why}")
    return RecordDataset(path, decode, max_pixels)


class RecordDataset:
    """A pack's samples, read at random through mmap: `ds[i] -> (image, label)`. `decode`: None
    (image bytes), "bgr", "rgb", "gray" (HWC uint8 arrays) or a function of the bytes; a label is
    a float or a float32 vector. Pickles as its manifest path (workers map the files again)."""

    def __init__(self, manifest: StrPath, decode: Any = None, max_pixels: int = 50_000_000):
        if not (decode is None or decode in DECODE_MODES or callable(decode)):
            raise ValueError(f"decode must be None, one of {DECODE_MODES} or a function")
        self.max_pixels, self.decode = check_max_pixels(max_pixels), decode
        self.manifest_path = os.fspath(manifest)
        self._open()

    def _open(self) -> None:
        path, folder = self.manifest_path, os.path.dirname(self.manifest_path)
        refuse_unfinished(path[: -len(MANIFEST_SUFFIX)] if path.endswith(MANIFEST_SUFFIX) else path)
        doc = read_manifest(path)
        if doc.get("format_version", 0) < 3 or doc.get("index") is None:
            why = f"a pack without a binary index (manifest format {doc.get('format_version', 0)})"
            raise NotIndexedError(f"{path}: {why}; write one with `rectool index {path}`")
        index, self.layout = doc["index"], doc.get("layout") or "images"
        self._manifest_id = file_identity(os.stat(path))  # a pack written again: a new manifest
        self._bounds = [0]
        for i, (count, shard) in enumerate(zip(index["samples"], doc["shards"])):
            records = shard.get("records") if is_count(shard.get("records")) else count
            if count > records or (self.layout == "images" and count != records):
                raise InputError(f"{path}: index.samples[{i}] is {count}, the shard {records}")
            self._bounds.append(self._bounds[-1] + count)
        self._count = n = self._bounds[-1]
        arrays = [load_array(os.path.join(folder, index[k]["file"]), k, n) for k in INDEX_ARRAYS]
        self.offsets, self.keys, self._labels = arrays
        self._files = [self._open_shard(os.path.join(folder, s["rec"])) for s in doc["shards"]]
        for rf, shard in zip(self._files, doc["shards"]):  # replaced or cut since it was packed
            if rf._identity and shard.get("rec_bytes") not in (None, rf._identity[2]):
                why = f"{rf._identity[2]:,} bytes, not the {shard['rec_bytes']!r} its manifest says"
                raise InputError(f"{rf.path}: {why}: the shard was replaced or cut after packing")

    def _open_shard(self, path: str) -> RecordFile:
        """Return the `RecordFile` of a shard, which refuses another file at `path` later."""
        fd, st = open_regular(path, "record file")
        os.close(fd)
        return RecordFile(path, file_identity(st))

    def __getstate__(self) -> dict[str, Any]:
        keep = ("manifest_path", "decode", "max_pixels", "_files", "_manifest_id")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        files, was = state.pop("_files"), state.pop("_manifest_id")  # each file as its path and
        self.__dict__.update(state)  # identity: a shard replaced since it was opened is refused
        self._open()
        if self._manifest_id != was or len(files) != len(self._files):
            raise RectoolError(f"{self.manifest_path}: the pack was replaced; open it again")
        self._files = files

    def close(self, mapped: bool = True) -> None:
        """Release the shards' mappings, made again on the next read (`mapped=False`: pread)."""
        for rf in self._files:
            rf.close()
            rf.mapped = mapped

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.manifest_path!r}, {len(self)} samples)"

    def __len__(self) -> int:  # iteration: `__getitem__` up to its `IndexError`
        return self._count

    labels = property(lambda self: self._labels, doc="Every label: (N,) or (N, k) float32, mapped.")

    def _locate(self, i: int) -> tuple[int, int]:
        i = given = operator.index(i)
        i += self._count if i < 0 else 0
        if not 0 <= i < self._count:
            raise SampleIndexError(f"sample {given} is out of range: {self._count} samples")
        return (bisect.bisect_right(self._bounds, i) - 1 if len(self._bounds) > 2 else 0), i

    def location(self, i: int) -> tuple[str, int, int]:
        """Return (rec path, byte offset, key) of sample `i`."""
        s, i = self._locate(i)
        return self._files[s].path, self.offsets.item(i), self.keys.item(i)

    def raw(self, i: int) -> tuple[bytes, Any]:
        """Return sample `i` undecoded: (image bytes, its label in the index)."""
        s, i = self._locate(i)
        rf, offset, labels = self._files[s], self.offsets.item(i), self._labels
        label = labels.item(i) if labels.ndim == 1 else labels[i].copy()
        size = len(mm := rf._mm if rf._mm is not None else rf.open())
        try:
            if 0 <= offset <= size - 32 and not offset & 3:  # one whole part: nearly all
                magic, lrec, flag = _RECORD_HEAD.unpack(mm[offset : offset + 12])
                start, end = offset + 32 + 4 * flag, offset + 8 + lrec  # lrec <= mask: whole
                if magic == MAGIC and lrec <= LENGTH_MASK and start <= end <= size:
                    return mm[start:end], label
            key = self.keys.item(i)  # only here: a worker's reads touch no page of the keys
            record = rf.read_parts(offset, key)[0]
        except RecordFormatError as e:  # a pread fell short (no key): name this record
            raise (e if e.key is not None else type(e)(e.reason, *self.location(i))) from None
        return record[image_start(record, rf.path, offset, key) :], label

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        payload, label = self.raw(i)
        if self.decode is None or callable(self.decode):
            return (payload if self.decode is None else self.decode(payload)), label
        try:
            return decode_image(payload, self.decode, self.max_pixels), label
        except RecordFormatError as exc:
            raise type(exc)(exc.reason, *self.location(i)) from None


# --- decoding, behind one guard: an image's size is read from its header and refused over the
# budget before a decoder allocates (333 bytes of JPEG can ask for 65000^2 pixels). Other
# formats are refused, and so is (unless `whole=False`) a cut JPEG or PNG (libjpeg fills grey).
JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # not DHT, JPG, DAC
JPEG_STANDALONE_MARKERS = frozenset((0x01, *range(0xD0, 0xD8)))  # TEM, RSTn: no length
_NO_LENGTH = JPEG_STANDALONE_MARKERS | {0, 0xFF}  # + no marker (FF 00) and fill bytes
FORMATS, _SIGNATURES = "JPEG, PNG, BMP, GIF, WebP, TIFF", (
    ("jpeg", b"\xff\xd8\xff"), ("png", b"\x89PNG\r\n\x1a\n"), ("bmp", b"BM"),
    ("gif", (b"GIF87a", b"GIF89a")), ("webp", b"RIFF"), ("tiff", (b"II*\0", b"MM\0*")),
)  # fmt: skip


def sniff_format(data: Data) -> str | None:
    """Return 'jpeg', 'png', 'bmp', 'gif', 'webp', 'tiff' or None from the first bytes."""
    head = bytes(data[:12])
    for kind, sig in _SIGNATURES:  # a loop, not next(generator): 0.5 us less a decode
        if head.startswith(sig):
            return None if kind == "webp" and head[8:] != b"WEBP" else kind
    return None


def check_max_pixels(max_pixels: Any) -> int:
    """Return `max_pixels` when it is a pixel budget (an int >= 1); raise ValueError if not."""
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(f"max_pixels must be an int >= 1, not {max_pixels!r}")
    return max_pixels


def admit_image(data: Data, max_pixels: float = DEFAULT_MAX_PIXELS, whole: bool = True) -> Any:
    """Return (format, height, width) of image bytes that may be decoded, from their header;
    raise `RecordFormatError` for an unknown format or a cut header (`whole`: a cut image),
    `ImageTooLargeError` over `max_pixels` pixels. The rule before every decoder."""
    data = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    kind = sniff_format(data)
    if kind is None:
        raise RecordFormatError("not an image (unknown file signature)" if data else "empty file")
    try:
        height, width = _jpeg_size(data, whole) if kind == "jpeg" else _size(kind, data, whole)
    except struct.error:
        raise RecordFormatError(f"truncated {kind.upper()} (ends inside its header)") from None
    if height <= 0 or width <= 0:
        raise RecordFormatError(f"corrupt {kind.upper()} (declares {width}x{height} pixels)")
    if height * width > max_pixels:
        raise ImageTooLargeError(
            f"the image declares {width}x{height} pixels ({height * width / 1e6:,.1f} megapixels)"
            f", over the decode limit of {max_pixels:,} (raise it with --max-pixels or max_pixels=)"
        )
    return kind, height, width


def _jpeg_size(data: Any, whole: bool) -> Any:
    # As libjpeg reads markers (jdmarker.c): bytes before one skipped, the first frame sizes.
    n, i, size = len(data), 2, None
    while i + 4 <= n and (data[i] != 0xFF or (marker := data[i + 1]) != 0xDA):  # DA: the scan
        if data[i] != 0xFF:
            i = n if (i := data.find(b"\xff", i)) < 0 else i
        elif marker in _NO_LENGTH:
            i += 1 if marker == 0xFF else 2  # fill bytes, no marker, or one without length
        elif marker == 0xD9:
            raise RecordFormatError("corrupt JPEG (end-of-image marker before any image data)")
        else:
            if size is None and marker in JPEG_FRAME_MARKERS:
                size = struct.unpack_from(">HH", data, i + 5)
            i += 2 + (data[i + 2] << 8 | data[i + 3])
    if i + 4 > n:
        raise RecordFormatError("truncated JPEG (ends inside its headers)")
    if size is None:
        raise RecordFormatError("corrupt JPEG (image data before any frame header)")
    # Entropy-coded data stuffs every FF with 00: FF D9 after the scan header is the end marker.
    if whole and data.rfind(b"\xff\xd9", i + 2 + (data[i + 2] << 8 | data[i + 3])) < 0:
        raise RecordFormatError("truncated JPEG (no end-of-image marker)")
    return size


def _size(kind: str, data: Any, whole: bool) -> Any:
    if kind == "png":  # as libpng reads chunks: IHDR first, then each by its length, to IEND
        if data[12:16] != b"IHDR" or data[8:12] != b"\0\0\0\r":
            raise RecordFormatError("corrupt PNG (no valid IHDR chunk first)")
        pos = 8
        while whole and data[pos + 4 : pos + 8] != b"IEND":
            if pos + 12 > len(data):
                raise RecordFormatError("truncated PNG (no IEND chunk)")
            pos += 12 + struct.unpack_from(">I", data, pos)[0]
        return struct.unpack_from(">II", data, 16)[::-1]
    if kind == "gif":
        return struct.unpack_from("<HH", data, 6)[::-1]  # the logical screen
    if kind == "bmp":  # OS/2 1.x: 16-bit sides; else a negative height: rows stored top-down
        os2 = struct.unpack_from("<I", data, 14)[0] == 12
        width, height = struct.unpack_from("<HH" if os2 else "<ii", data, 18)
        return abs(height), width
    chunk = data[12:16] if kind == "webp" else None
    if chunk == b"VP8X":  # the canvas: 24 bits a side, minus one
        return tuple(1 + (struct.unpack_from("<I", data, at)[0] >> 8) for at in (26, 23))
    if chunk == b"VP8L":  # lossless: 14 bits a side, minus one
        bits = struct.unpack_from("<I", data, 21)[0]
        return 1 + (bits >> 14 & 0x3FFF), 1 + (bits & 0x3FFF)
    if chunk == b"VP8 ":  # lossy: after the key frame's start code, 14 bits a side
        return tuple(side & 0x3FFF for side in struct.unpack_from("<HH", data, 26)[::-1])
    if kind == "webp":
        raise RecordFormatError(f"corrupt WEBP (first chunk {bytes(chunk or b'')!r})")
    order, found = "<" if data[:1] == b"I" else ">", {}  # TIFF: its first page, as OpenCV
    ifd = struct.unpack_from(order + "I", data, 4)[0]
    for at in range(ifd + 2, ifd + 2 + 12 * struct.unpack_from(order + "H", data, ifd)[0], 12):
        tag, type_ = struct.unpack_from(order + "HH", data, at)
        if tag in (256, 257) and type_ in (3, 4):  # image width, length: SHORT or LONG
            found[tag] = struct.unpack_from(order + "HI"[type_ - 3], data, at + 8)[0]
    return found.get(257, 0), found.get(256, 0)


def decode_image(data: Data, mode: Any = "bgr", max_pixels: float = DEFAULT_MAX_PIXELS) -> Any:
    """Decode image bytes into an HWC uint8 array ("bgr", "rgb" or "gray": H x W x 1), or into
    OpenCV's own array for `mode` an `IMREAD_*` flag or a function of (format, height, width)
    choosing one. Empty, cut or undecodable bytes are refused, and so is, before anything is
    allocated, an image over `max_pixels` (`admit_image`): rectool's one call of OpenCV."""
    if isinstance(mode, str) and mode not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {DECODE_MODES}, not {mode!r}")
    if not len(data):
        raise RecordFormatError("empty image: the record holds a header and no image bytes")
    try:
        header, cv2, why = admit_image(data, max_pixels), __import__("cv2"), ""
    except ImportError:
        raise RectoolError("decoding images needs OpenCV (opencv-python-headless)") from None
    except ImageTooLargeError:
        raise
    except RecordFormatError as exc:
        why = f": not a format rectool decodes ({FORMATS})" if sniff_format(data) is None else ""
        why = f": {exc.reason}" if not why else f" (they start with {bytes(data[:8])!r}){why}"
        raise RecordFormatError(f"the {len(data)} image bytes cannot be decoded{why}") from None
    flag = int(mode != "gray") if mode in DECODE_MODES else mode  # cv2.IMREAD_COLOR, _GRAYSCALE
    flag = flag(*header) if callable(flag) else flag
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    except cv2.error as exc:
        image, why = None, f" (OpenCV: {str(exc).strip()[-120:]})"
    if image is None or not image.size:
        why = why or f" (they start with {bytes(data[:8])!r})"
        raise RecordFormatError(f"the {len(data)} image bytes cannot be decoded{why}")
    if mode == "rgb":
        return np.ascontiguousarray(image[:, :, ::-1])
    return image[:, :, None] if mode == "gray" else image
