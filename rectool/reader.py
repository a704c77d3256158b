"""Read a rectool pack (MXNet RecordIO shards, a manifest, a binary index) with numpy only.

    ds = open_dataset("out/faces", decode="rgb")  # the pack's prefix or its manifest's path
    image, label = ds[0]                            # HWC uint8 array, float label (or vector)
    ds.labels                                       # every label: one read-only mapped array

A pack's index is written once, when it is packed, as `.npy` arrays named in its manifest
(format 3): record offsets, keys and labels, mapped read-only, so a pack of 42M records opens in
milliseconds and every worker process shares the same pages. Reads are bounded by the file and
checked; an image's size is read from its header and refused over `max_pixels` before OpenCV
allocates anything. Packs without that index (a bare .rec, im2rec's or insightface's, an older
rectool's) are refused with `NotIndexedError`: `rectool index` writes one for them. rectool
reads every record through this module; `rectool reader` copies it verbatim.
"""

from __future__ import annotations

import bisect
import errno
import json
import mmap
import operator
import os
import re
import stat
import struct
from collections import namedtuple
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    import numpy as np
    from numpy.typing import NDArray

    StrPath = str | os.PathLike[str]
    Data = bytes | bytearray | memoryview
    Decode = str | Callable[[bytes], Any] | None
else:

    class _LazyNumpy:  # numpy imported on first use: the CLI loads this module for its errors
        def __getattr__(self, name: str) -> Any:
            global np
            import numpy as np

            return getattr(np, name)

    np = _LazyNumpy()

__all__ = [
    "ImageTooLargeError", "NotIndexedError", "RecordDataset", "RecordFormatError",
    "RectoolError", "decode_image", "open_dataset", "unpack_header",
]  # fmt: skip

FORMAT_VERSION = 3  # the manifest format this module reads
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
_RECORD_HEAD = struct.Struct("<IIIf")  # magic, lrec, flag, label: the fast path's one unpack
Header = namedtuple("Header", "flag label id id2")
MANIFEST_SUFFIX, MANIFEST_FORMAT, MANIFEST_VERSION = ".manifest.json", "rectool-manifest", 3
# A prefix with either is an unfinished pack or a replacement not yet finished: not readable.
STATE_SUFFIX, JOURNAL_SUFFIX = ".pack-state.json", ".commit-journal.json"
MAX_MANIFEST_BYTES = 1 << 30
DATASET_LAYOUTS = ("images", "insightface")
DECODE_MODES = ("bgr", "rgb", "gray")
# 50 megapixels: more than a 45-megapixel camera writes; 150 MB decoded in 8-bit colour.
DEFAULT_MAX_PIXELS = 50_000_000


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


class ImageTooLargeError(RecordFormatError):
    """An image whose header declares more pixels than the decode budget (`max_pixels`)."""


class InputError(RectoolError):
    """An input that cannot be used at all: missing, not a regular file, not a pack, or a
    manifest or index that is not what it must be (the command line exits 2)."""


class NotIndexedError(InputError):
    """A pack without a binary index (a bare .rec, im2rec's, insightface's, an older rectool's):
    `rectool index` writes one."""


class SampleIndexError(RectoolError, IndexError):
    """A sample index outside the dataset (an `IndexError`, so iteration protocols stop)."""


def open_regular(
    path: StrPath, what: str, max_bytes: int | None = None, follow: bool = True
) -> tuple[int, os.stat_result]:
    """Open `path` read-only and return (fd, stat); refuse anything but a regular file.

    Non-blocking and checked with fstat first: a FIFO would block, a device never end.
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
            raise InputError(f"{path}: the {what} is {st.st_size:,} bytes, over {max_bytes:,}")
        raise InputError(f"{path}: not a regular file (the {what} must be one)")
    return fd, st


def unpack_header(
    record: bytes, path: StrPath | None = None, offset: int | None = None
) -> tuple[Header, bytes]:
    """Split one record into its `Header` and image bytes, as `mxnet.recordio.unpack` does."""
    if len(record) < IMAGE_HEADER_SIZE:
        raise RecordFormatError(
            f"record of {len(record)} bytes is shorter than the {IMAGE_HEADER_SIZE}-byte "
            "image header", path, offset,
        )  # fmt: skip
    head = Header(*IMAGE_HEADER.unpack_from(record, 0))
    if IMAGE_HEADER_SIZE + 4 * head.flag > len(record):
        raise RecordFormatError(
            f"header announces {head.flag} float32 labels but the record has only "
            f"{len(record) - IMAGE_HEADER_SIZE} bytes after the header", path, offset,
        )  # fmt: skip
    if head.flag > 0:
        head = head._replace(label=np.frombuffer(record, np.float32, head.flag, IMAGE_HEADER_SIZE))
    return head, record[IMAGE_HEADER_SIZE + 4 * head.flag :]


class RecordFile:
    """A .rec mapped read-only on first use: records by byte offset, split parts rejoined.

    Pickles as its path and the identity of the file it mapped first: mapping again (after
    `close` or in another process) refuses another file at the path (a pack replaced since).
    """

    def __init__(self, path: StrPath, identity: tuple[int, ...] | None = None) -> None:
        self.path, self._mm, self._size, self._identity = os.fspath(path), None, 0, identity

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "identity": self._identity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["identity"])  # type: ignore[misc]  # a subclass's

    def open(self) -> mmap.mmap | bytes:
        """Return the mapping of the file, mapping it on first use (b"" for an empty file)."""
        if self._mm is None:
            fd, st = open_regular(self.path, "record file")
            try:
                identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                if self._identity not in (None, identity):
                    raise RectoolError(f"{self.path} was replaced after it was opened; open again")
                self._mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if st.st_size else b""
            except OSError as exc:  # ENOMEM under a memory limit (ulimit -v)
                raise RectoolError(f"{self.path}: cannot map the record file ({exc})") from None
            finally:
                os.close(fd)
            self._identity, self._size = identity, st.st_size
        return self._mm

    def close(self) -> None:
        """Release the mapping (the next read maps the file again)."""
        mm, self._mm = self._mm, None
        if isinstance(mm, mmap.mmap):
            mm.close()

    @property
    def size(self) -> int:
        """Return the file size in bytes."""
        return len(self.open())

    def read_at(self, offset: int, key: Any = None) -> bytes:
        """Return the record whose first part starts at byte `offset`, split parts rejoined."""
        return self.read_parts(offset, key)[0]

    def next_offset(self, offset: int, key: Any = None) -> int:
        """Return the byte offset just past the record starting at `offset` (padding included)."""
        return self.read_parts(offset, key)[1]

    def read_parts(self, offset: int, key: Any = None) -> tuple[bytes, int]:
        """Read the record at `offset` part by part; return (bytes, offset after it)."""
        mm, size, start, pieces, cflag = self.open(), self._size, offset, [], None

        def fail(message: str, at: int = start) -> RecordFormatError:
            return RecordFormatError(message, self.path, at, key)

        if offset < 0 or offset & 3:
            raise fail("offset is not a record start (negative or not 4-byte aligned)")
        while cflag not in (CFLAG_WHOLE, CFLAG_LAST):
            if offset + 8 > size:
                where = "at end of file" if offset == size else "in a truncated part header"
                raise fail(f"expected a record part header, found {where} ({size} bytes)", offset)
            magic, lrec = PART_HEADER.unpack_from(mm, offset)
            cflag, length = lrec >> LENGTH_BITS, lrec & LENGTH_MASK
            if magic != MAGIC:
                raise fail(f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})", offset)
            if cflag not in ((CFLAG_MIDDLE, CFLAG_LAST) if pieces else (CFLAG_WHOLE, CFLAG_FIRST)):
                raise fail(f"part with continuation flag {cflag} out of place", offset)
            if offset + 8 + ((length + 3) & ~3) > size:
                raise fail(f"part of {length} bytes runs past end of file ({size} bytes)", offset)
            pieces.append(mm[offset + 8 : offset + 8 + length])
            offset += 8 + ((length + 3) & ~3)
            if offset - start - 8 * len(pieces) > MAX_RECORD_BYTES + 4:
                raise fail("split record exceeds 2**29 bytes")
        return (pieces[0] if len(pieces) == 1 else MAGIC_BYTES.join(pieces)), offset


# --- the manifest: every field this module reads is checked before it is used --------------

_NOT_IN_NAMES = re.compile("[/\\\\\0\ud800-\udfff]")  # + half a UTF-16 pair: no file name


def _plain_name(v: object) -> bool:
    return isinstance(v, str) and v not in ("", ".", "..") and not _NOT_IN_NAMES.search(v)


# A field's (test, what it must be); null always means "not recorded".
COUNT_FIELD = (lambda v: type(v) is int and 0 <= v < 1 << 63, "a count (an integer >= 0)")
NAME_FIELD = (_plain_name, "a plain file name in the manifest's folder")
LAYOUT_FIELD = (lambda v: v in DATASET_LAYOUTS, f"one of {DATASET_LAYOUTS}")
_SHARD = {"rec": NAME_FIELD, "idx": NAME_FIELD, "records": COUNT_FIELD, "rec_bytes": COUNT_FIELD}
INDEX_ARRAYS = {"offsets": ("<i8", (1,)), "keys": ("<i8", (1,)), "labels": ("<f4", (1, 2))}


def bad_field(path: str, field: str, want: str) -> InputError:
    """Return the `InputError` of a manifest field that is not what it must be."""
    return InputError(f"{path}: manifest field {field!r} must be {want}")


def check_fields(path: str, obj: dict[str, Any], fields: dict[str, Any], where: str = "") -> None:
    """Raise `bad_field` for the first of `fields` ({name: (test, want)}) set in `obj` but wrong."""
    for name, (test, want) in fields.items():
        if obj.get(name) is not None and not test(obj[name]):
            raise bad_field(path, where + name, want)


def read_manifest(path: StrPath) -> dict[str, Any]:
    """Read a pack manifest, checking the fields a reader uses; raise `InputError` if not one."""
    path = os.fspath(path)
    fd, st = open_regular(path, "manifest", MAX_MANIFEST_BYTES)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    try:
        doc = json.loads(data)
    except RecursionError:
        raise InputError(f"{path}: not a rectool manifest (JSON nested too deep)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a JSON manifest ({exc})") from None
    if len(data) > MAX_MANIFEST_BYTES or not isinstance(doc, dict):
        raise InputError(f"{path}: not a rectool manifest")
    if doc.get("format") != MANIFEST_FORMAT:
        raise InputError(f'{path}: not a rectool manifest (no "format": "{MANIFEST_FORMAT}")')
    version = doc.get("format_version", 0)
    if not (type(version) is int and version >= 0):
        raise bad_field(path, "format_version", "an integer >= 0")
    if version > MANIFEST_VERSION:
        raise InputError(
            f"{path}: manifest format version {version} is newer than this reader understands "
            f"({MANIFEST_VERSION}); upgrade rectool"
        )
    check_fields(path, doc, {"layout": LAYOUT_FIELD})
    shards, seen = doc.get("shards"), set()
    if not isinstance(shards, list) or not shards:
        raise bad_field(path, "shards", "a list of {rec, idx, ...} objects, one or more")
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            raise bad_field(path, f"shards[{i}]", "an object")
        for name in ("rec", "idx"):
            if not _plain_name(shard.get(name)) or shard[name] in seen:
                raise bad_field(path, f"shards[{i}].{name}", NAME_FIELD[1] + ", listed once")
            seen.add(shard[name])
        check_fields(path, shard, _SHARD, f"shards[{i}].")
    index = doc.get("index")
    if version >= 3 and index is not None:
        samples = index.get("samples") if isinstance(index, dict) else None
        if not (isinstance(samples, list) and len(samples) == len(shards)):
            raise bad_field(path, "index.samples", "a list of counts, one a shard")
        for i, n in enumerate(samples):
            check_fields(path, {"n": n}, {"n": COUNT_FIELD}, f"index.samples[{i}]")
        for name in INDEX_ARRAYS:
            entry = index.get(name)
            if not (isinstance(entry, dict) and _plain_name(entry.get("file"))):
                raise bad_field(path, f"index.{name}.file", NAME_FIELD[1])
    return doc


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


def load_array(path: str, name: str, length: int | None, kind: Any = None) -> NDArray[Any]:
    """Map the index array `name` (read-only; numpy refuses a pickled object) and check its
    dtype, dimensions and (unless None) length; `kind`: (dtype, ndims), else `INDEX_ARRAYS`'."""
    dtype, ndims = kind or INDEX_ARRAYS[name]
    fd, st = open_regular(path, "index array")
    with os.fdopen(fd, "rb") as f:
        try:  # the header is read and checked before anything is mapped: no pickle, no object
            version = np.lib.format.read_magic(f)
            read_header = getattr(np.lib.format, f"read_array_header_{version[0]}_0")
            shape, fortran, found = read_header(f, max_header_size=1 << 16)
            start, count = f.tell(), int(np.prod(shape))
        except (OSError, ValueError, AttributeError, SyntaxError, TypeError) as exc:
            raise InputError(f"{path}: not a {name} index array ({exc})") from None
        if found != dtype or len(shape) not in ndims or fortran or shape[0] != (length or shape[0]):
            raise InputError(
                f"{path}: the {name} index must be {length} rows of {np.dtype(dtype)}, "
                f"not {shape} {found}: rebuild it with `rectool index`"
            )
        if start + count * found.itemsize != st.st_size:
            raise InputError(f"{path}: {st.st_size:,} bytes, not the {shape} its header says")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    array = np.frombuffer(mm, found, count, start).reshape(shape)
    return array


# --- the dataset -------------------------------------------------------------------------


def open_dataset(
    source: StrPath, decode: Decode = None, *, max_pixels: int = DEFAULT_MAX_PIXELS
) -> RecordDataset:
    """Open a pack for training by its prefix (`out/faces`) or manifest; see `RecordDataset`."""
    source = os.fspath(source)
    if not source.endswith(MANIFEST_SUFFIX):
        if not os.path.exists(source + MANIFEST_SUFFIX):
            raise NotIndexedError(
                f"{source}: no rectool pack here (no {source}{MANIFEST_SUFFIX}); a .rec without "
                "one gets its manifest and index from `rectool index`"
            )
        source += MANIFEST_SUFFIX
    return RecordDataset(source, decode, max_pixels)


class RecordDataset:
    """The samples of a pack, read at random through mmap: `ds[i] -> (image, label)`.

    `decode`: None (image bytes), "bgr", "rgb", "gray" (HWC uint8 arrays) or a function of the
    bytes. The label is the record header's: a float, or a float32 vector. Pickles as its
    manifest path (DataLoader workers, fork or spawn, map the files again).
    """

    def __init__(
        self, manifest: StrPath, decode: Decode = None, max_pixels: int = DEFAULT_MAX_PIXELS
    ) -> None:
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
            raise NotIndexedError(
                f"{path}: a pack without a binary index (manifest format "
                f"{doc.get('format_version', 0)}); write one with `rectool index {path}`"
            )
        counts, n = doc["index"]["samples"], sum(doc["index"]["samples"])
        arrays = [
            load_array(os.path.join(folder, doc["index"][name]["file"]), name, n)
            for name in INDEX_ARRAYS
        ]
        shards = [os.path.join(folder, s["rec"]) for s in doc["shards"]]
        self.layout = doc.get("layout") or "images"
        self._set_index([RecordFile(p) for p in shards], counts, *arrays)

    def _set_index(
        self, files: list[RecordFile], counts: Iterable[int], offsets: Any, keys: Any, labels: Any
    ) -> None:
        """Read samples `offsets[i]` (key `keys[i]`) from `files`: `counts[s]` of them in shard s."""
        self._files, self.offsets, self.keys, self._labels = files, offsets, keys, labels
        self._bounds = [0]
        for count in counts:
            self._bounds.append(self._bounds[-1] + count)
        self._count = self._bounds[-1]

    def __getstate__(self) -> dict[str, Any]:
        return {k: self.__dict__[k] for k in ("manifest_path", "decode", "max_pixels")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def close(self) -> None:
        """Release the shards' mappings (mapped again on the next read)."""
        for rf in self._files:
            rf.close()

    def __enter__(self) -> RecordDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.manifest_path!r}, {len(self)} samples)"

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for i in range(len(self)):
            yield self[i]

    @property
    def labels(self) -> NDArray[Any]:
        """Every sample's label: float32 (N,), or (N, k) for label vectors; read-only."""
        return self._labels

    def _locate(self, i: int) -> tuple[int, int]:
        """Return (shard, sample number) of index `i`, negative indices counted from the end."""
        i = given = operator.index(i)
        i += self._count if i < 0 else 0
        if not 0 <= i < self._count:
            raise SampleIndexError(
                f"sample {given} is out of range: the dataset has {self._count} samples"
            )
        return bisect.bisect_right(self._bounds, i) - 1, i

    def location(self, i: int) -> tuple[str, int, int]:
        """Return (rec path, byte offset, key) of sample `i`."""
        s, i = self._locate(i)
        return self._files[s].path, self.offsets.item(i), self.keys.item(i)

    def raw(self, i: int) -> tuple[bytes, Any]:
        """Return sample `i` undecoded: (image bytes as a buffer, label)."""
        s, i = self._locate(i)
        rf, offset = self._files[s], self.offsets.item(i)
        mm = rf.open()
        if 0 <= offset <= rf._size - 32 and not offset & 3:
            magic, lrec, flag, label = _RECORD_HEAD.unpack_from(mm, offset)
            # One whole part with a scalar label, padding included: nearly every record.
            if (
                magic == MAGIC
                and flag == 0
                and 24 <= lrec
                and (offset + 11 + lrec) & ~3 <= rf._size
            ):
                return mm[offset + 32 : offset + 8 + lrec], label
        key = self.keys.item(i)
        try:
            head, payload = unpack_header(rf.read_at(offset, key), rf.path, offset)
        except RecordFormatError as exc:
            raise RecordFormatError(exc.reason, rf.path, offset, key) from None
        return bytes(payload), (head.label if head.flag == 0 else head.label.copy())

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        payload, label = self.raw(i)
        if self.decode is None or callable(self.decode):
            return (payload if self.decode is None else self.decode(payload)), label
        try:
            return decode_image(payload, self.decode, self.max_pixels), label
        except RecordFormatError as exc:
            raise type(exc)(exc.reason, *self.location(i)) from None


# --- decoding, behind one guard: an image's header is read and its size refused over the budget
# before a decoder allocates (333 bytes of JPEG can ask for 65000^2 pixels). A size the guard
# cannot read it cannot bound: other formats are refused, and so is a cut JPEG (no end marker
# after its scan) or PNG (no IEND), which libjpeg would fill with grey rows.
JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # not DHT, JPG, DAC
JPEG_STANDALONE_MARKERS = frozenset((0x01, *range(0xD0, 0xD8)))
_MARKER_STEP = bytes(
    1 if m == 0xFF else 2 if m in JPEG_STANDALONE_MARKERS or not m else 0 for m in range(256)
)
_SIGNATURES = (
    ("jpeg", b"\xff\xd8\xff"), ("png", b"\x89PNG\r\n\x1a\n"), ("bmp", b"BM"),
    ("gif", (b"GIF87a", b"GIF89a")), ("webp", b"RIFF"), ("tiff", (b"II*\0", b"MM\0*")),
)  # fmt: skip


def sniff_format(data: Data) -> str | None:
    """Return 'jpeg', 'png', 'bmp', 'gif', 'webp', 'tiff' or None from the first bytes."""
    head = bytes(data[:12])
    kind = next((kind for kind, sig in _SIGNATURES if head.startswith(sig)), None)
    return None if kind == "webp" and head[8:] != b"WEBP" else kind


def check_max_pixels(max_pixels: float) -> int:
    """Return `max_pixels` when it is a pixel budget (an int >= 1); raise ValueError if not."""
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(f"max_pixels must be an int >= 1, not {max_pixels!r}")
    return max_pixels


def admit_image(data: Data, max_pixels: float = DEFAULT_MAX_PIXELS) -> tuple[str, int, int]:
    """Return (format, height, width) of image bytes that may be decoded, from their header.

    Raises `RecordFormatError` for an unknown format or a cut header, `ImageTooLargeError`
    when the header declares more than `max_pixels` pixels: the rule before every decoder.
    """
    data = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    kind = sniff_format(data)
    if kind is None:
        raise RecordFormatError("not an image (unknown file signature)" if data else "empty file")
    try:
        height, width = _SIZES[kind](data)
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


def _jpeg_size(data: bytes) -> tuple[int, int]:
    # As libjpeg reads markers (jdmarker.c): bytes before a marker are skipped, and the first
    # frame header sizes the image.
    n, i, size = len(data), 2, None
    while True:
        if i + 4 > n:
            raise RecordFormatError("truncated JPEG (ends inside its headers)")
        if data[i] != 0xFF:
            i = data.find(b"\xff", i)
            i = n if i < 0 else i
            continue
        if step := _MARKER_STEP[data[i + 1]]:  # FF fill, 00 (no marker), RSTn, TEM: no length
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
    # Entropy-coded data stuffs every FF with 00: FF D9 after the scan header is the end marker.
    if data.rfind(b"\xff\xd9", i + 2 + length) < 0:
        raise RecordFormatError("truncated JPEG (no end-of-image marker)")
    return size


def _png_size(data: bytes) -> tuple[int, int]:
    n, pos = len(data), 8  # as libpng reads chunks: IHDR first, then each by its length, to IEND
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
    order, found = "<" if data[:1] == b"I" else ">", {}
    ifd = struct.unpack_from(order + "I", data, 4)[0]  # the first page: what OpenCV decodes
    for at in range(ifd + 2, ifd + 2 + 12 * struct.unpack_from(order + "H", data, ifd)[0], 12):
        tag, kind = struct.unpack_from(order + "HH", data, at)
        if tag in (256, 257) and kind in (3, 4):  # image width, length: SHORT or LONG
            found[tag] = struct.unpack_from(order + "HI"[kind - 3], data, at + 8)[0]
    return found.get(257, 0), found.get(256, 0)


_SIZES = {
    "jpeg": _jpeg_size, "png": _png_size, "bmp": _bmp_size, "webp": _webp_size, "tiff": _tiff_size,
    "gif": lambda data: struct.unpack_from("<HH", data, 6)[::-1],  # the logical screen
}  # fmt: skip


def imdecode(
    data: Data, flags: int | Callable[[str, int, int], int], max_pixels: float = DEFAULT_MAX_PIXELS
) -> NDArray[np.uint8]:
    """Return `cv2.imdecode(data, flags)` of image bytes that `admit_image` admits.

    The one call of OpenCV's decoder in rectool. `flags`: an `IMREAD_*` flag, or a function of
    the admitted (format, height, width) returning one (to pick a reduced scale).
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


def _opencv() -> Any:
    try:
        import cv2
    except ImportError:
        raise RectoolError("decoding images needs OpenCV (pip install opencv-python-headless)")
    return cv2


def decode_image(
    data: Data, mode: str = "bgr", max_pixels: float = DEFAULT_MAX_PIXELS
) -> NDArray[np.uint8]:
    """Decode image bytes into an HWC uint8 array ("bgr", "rgb" or "gray": H x W x 1), refusing
    empty, cut or undecodable bytes and, before decoding, an image over `max_pixels`."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode must be one of {DECODE_MODES}, not {mode!r}")
    if not len(data):
        raise RecordFormatError("empty image: the record holds a header and no image bytes")
    cv2 = _opencv()
    image = imdecode(data, cv2.IMREAD_GRAYSCALE if mode == "gray" else cv2.IMREAD_COLOR, max_pixels)
    if mode == "bgr":
        return image
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if mode == "rgb" else image[:, :, None]
