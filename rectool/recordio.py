"""MXNet 1.9.1's `mxnet.recordio` API without MXNet: the standard library and numpy only.

Code that imports MXNet only for `recordio` moves off it by changing the import:

    from mxnet import recordio          ->   import recordio   (or: from rectool import recordio)
    mx.image.imdecode(img).asnumpy()    ->   recordio.imdecode(img)

`MXRecordIO`, `MXIndexedRecordIO`, `IRHeader`, `pack`, `unpack`, `pack_img` and `unpack_img`
behave as MXNet's: the same files byte for byte (records split at aligned magic words), the
same return types and dtypes, the same pid check and reopening after pickling or a fork. Reads
go through `mmap`. Where MXNet aborts with an opaque error or returns garbage (a damaged
record, a key missing from the .idx, a record cut short, an unparsable .idx line), this module
raises a named `RectoolError` naming the file, key and byte offset. The image helpers read an
image's size from its header first and refuse one over `max_pixels` (50 million by default)
with `ImageTooLargeError` before decoding. rectool's docs/migration.md lists every
difference. OpenCV is imported only by the image helpers.
"""

from __future__ import annotations

import mmap
import numbers
import os
import struct
from collections import namedtuple
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "IRHeader",
    "ImageTooLargeError",
    "IndexFormatError",
    "MXIndexedRecordIO",
    "MXRecordIO",
    "MissingKeyError",
    "RecordFormatError",
    "RectoolError",
    "admit_image",
    "image_size",
    "imdecode",
    "pack",
    "pack_img",
    "unpack",
    "unpack_img",
]

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
_PART = struct.Struct("<II")
_LENGTH_BITS = 29
_LENGTH_MASK = MAX_RECORD_BYTES = (1 << _LENGTH_BITS) - 1
_PADDING = (b"", b"\0\0\0", b"\0\0", b"\0")

# This process's id, kept current by a fork hook, for read_idx's fast path: `os.getpid()` is a
# system call, dear next to the rest of that path. A child forked without Python's fork hooks
# (a C library's own fork()) keeps the parent's id here; it then reads through the mapping it
# inherited, which holds the same bytes, instead of reopening the file as MXNet would.
_PID = os.getpid()


def _forked() -> None:
    global _PID
    _PID = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX; where there is no fork the id never changes
    os.register_at_fork(after_in_child=_forked)


class RectoolError(Exception):
    """Base class of every error this module raises on purpose."""


class RecordFormatError(RectoolError):
    """Bytes in a .rec are not a record: names the file, key and byte offset."""

    def __init__(
        self, message: str, path: str | None = None, offset: int | None = None, key: Any = None
    ) -> None:
        self.reason, self.path, self.offset, self.key = message, path, offset, key
        where = [f"{path}"] if path is not None else []
        where += [f"key {key}"] if key is not None else []
        where += [f"byte offset {offset}"] if offset is not None else []
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class IndexFormatError(RectoolError, ValueError, IndexError):
    """An .idx line MXNet cannot parse either (it raises a bare ValueError or IndexError)."""


class MissingKeyError(RectoolError, KeyError):
    """A key that is not in the .idx; a `KeyError`, as MXNet raises."""

    def __str__(self) -> str:
        return str(self.args[0])


class MXRecordIO:
    """Read ('r') or write ('w') a RecordIO file sequentially, as `mxnet.recordio.MXRecordIO`."""

    _file: Any  # the file written ('w'), else None
    _mm: Any  # the mapping read ('r'; b"" for an empty file), else None
    pid: int | None
    _reader_pid: int | None  # the pid of an open reader, for read_idx's fast path

    def __init__(self, uri: str | os.PathLike[str], flag: str) -> None:
        self.uri = os.fspath(uri)
        self.flag = flag
        self.pid = None
        self.is_open = False
        self._file = self._mm = None
        self.open()

    def open(self) -> None:
        """Open the file: 'w' creates or truncates it, 'r' maps it."""
        if self.flag == "w":
            self._file = open(self.uri, "wb")  # noqa: SIM115 - closed by close()
            self.writable = True
        elif self.flag == "r":
            with open(self.uri, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            self._size = size
            # Bounds for read_idx's fast path: a part header fits at offsets up to
            # _last_header; a part whose padded end fits has its unpadded end within
            # _aligned_size (the size rounded down to a 4-byte boundary).
            self._last_header, self._aligned_size = size - 8, size & ~3
            self.writable = False
        else:
            raise ValueError(f"Invalid flag {self.flag!s}")
        self._pos, self._key = 0, None
        self.pid = os.getpid()
        self._reader_pid = None if self.writable else self.pid
        self.is_open = True

    def __del__(self) -> None:
        if getattr(self, "is_open", False):
            self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle as MXNet does: close here, remember whether it was open."""
        is_open = self.is_open
        self.close()
        d = {k: v for k, v in self.__dict__.items() if k not in ("_file", "_mm")}
        d["is_open"] = is_open
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        """Unpickle as MXNet does: reopen the file if it was open."""
        is_open = d["is_open"]
        self.__dict__ = d
        self._file = self._mm = self._reader_pid = None
        self.is_open = False
        if is_open:
            self.open()

    def _check_pid(self, allow_reset: bool = False) -> None:
        if self.pid != os.getpid():
            if allow_reset:
                self.reset()
            else:
                raise RuntimeError("Forbidden operation in multiple processes")

    def close(self) -> None:
        """Close the file (writes are flushed)."""
        if not self.is_open:
            return
        if self.writable:
            self._file.close()
        elif isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._file = self._mm = None
        self.is_open = False
        self.pid = self._reader_pid = None

    def reset(self) -> None:
        """Go back to the first record; in 'w' mode this truncates the file, as in MXNet."""
        self.close()
        self.open()

    def write(self, buf: bytes) -> None:
        """Append `buf` (bytes) as one record."""
        assert self.writable
        self._check_pid(allow_reset=False)
        n = len(buf)
        if n > MAX_RECORD_BYTES:
            raise RecordFormatError(
                f"a record of {n} bytes exceeds RecordIO's limit of {MAX_RECORD_BYTES} bytes",
                self.uri,
                self._pos,
            )
        framed = _frame(bytes(buf))
        self._file.write(framed)
        self._pos += len(framed)

    def read(self) -> bytes | None:
        """Return the next record as bytes, or None at the end of the file."""
        assert not self.writable
        self._check_pid(allow_reset=False)
        pos, key, self._key = self._pos, self._key, None
        if pos == self._size:
            return None
        if 0 <= pos <= self._last_header:  # the common record: one whole part
            magic, lrec = _PART.unpack_from(self._mm, pos)
            end = pos + 8 + lrec
            if magic == MAGIC and lrec <= _LENGTH_MASK and end <= self._aligned_size:
                self._pos = (end + 3) & ~3
                return self._mm[pos + 8 : end]
        data, self._pos = self._read_parts(pos, key)
        return data

    def _read_parts(self, start: int, key: Any) -> tuple[bytes, int]:
        pieces: list[bytes]
        mm, size, offset, pieces, cflag = self._mm, self._size, start, [], None

        def fail(message: str, at: int) -> RecordFormatError:
            return RecordFormatError(message, self.uri, at, key)

        if start > size:
            raise fail(f"record starts past the end of the file ({size} bytes)", start)
        if start < 0:
            raise fail("a negative record offset: the .idx is damaged", start)
        while cflag not in (0, 3):
            if offset + 8 > size:
                found = "the end of the file" if offset == size else "a truncated part header"
                raise fail(f"record cut short: expected a part header, found {found}", offset)
            magic, lrec = _PART.unpack_from(mm, offset)
            cflag, length = lrec >> _LENGTH_BITS, lrec & _LENGTH_MASK
            if magic != MAGIC:
                raise fail(f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})", offset)
            if not pieces and cflag not in (0, 1):
                raise fail(f"part has continuation flag {cflag}: not a record start", offset)
            if pieces and cflag not in (2, 3):
                raise fail(f"split record continues with flag {cflag}, expected 2 or 3", offset)
            if offset + 8 + ((length + 3) & ~3) > size:
                raise fail(
                    f"record cut short: a part of {length} bytes runs past the end of the file "
                    f"({size} bytes)",
                    offset,
                )
            pieces.append(mm[offset + 8 : offset + 8 + length])
            offset += 8 + ((length + 3) & ~3)
        return MAGIC_BYTES.join(pieces), offset


class MXIndexedRecordIO(MXRecordIO):
    """Random access through an .idx, as `mxnet.recordio.MXIndexedRecordIO`."""

    idx: dict[Any, int]  # key -> byte offset
    keys: list[Any]
    fidx: Any  # the .idx file, None once pickled

    def __init__(
        self,
        idx_path: str,
        uri: str | os.PathLike[str],
        flag: str,
        key_type: type = int,
    ) -> None:
        self.idx_path = idx_path
        self.idx = {}
        self.keys = []
        self.key_type = key_type
        self.fidx = None
        super().__init__(uri, flag)

    def open(self) -> None:
        """Open both files; in 'r' mode parse the .idx as MXNet does (the last of duplicates)."""
        super().open()
        self.idx = {}
        self.keys = []
        self.fidx = open(self.idx_path, self.flag)  # noqa: SIM115 - closed by close()
        if not self.writable:
            idx, keys, key_type = self.idx, self.keys, self.key_type
            for number, line in enumerate(iter(self.fidx.readline, ""), 1):
                fields = line.strip().split("\t")
                try:
                    key = key_type(fields[0])
                    idx[key] = int(fields[1])
                except (IndexError, ValueError) as exc:
                    self.close()
                    raise IndexFormatError(
                        f"{self.idx_path}: line {number}: {line!r} is not 'key<TAB>offset' "
                        f"({type(exc).__name__}: {exc})"
                    ) from None
                keys.append(key)

    def close(self) -> None:
        """Close the record file and the .idx."""
        if not self.is_open:
            return
        super().close()
        self.fidx.close()

    def __getstate__(self) -> dict[str, Any]:
        d = super().__getstate__()
        d["fidx"] = None
        return d

    def seek(self, idx: Any) -> None:
        """Position the reader at the record of key `idx` (reopening in a new process)."""
        assert not self.writable
        self._check_pid(allow_reset=True)
        try:
            self._pos = self.idx[idx]
        except KeyError:
            raise MissingKeyError(
                f"{self.idx_path}: key {idx!r} is not in the index ({len(self.idx)} keys)"
            ) from None
        self._key = idx

    def tell(self) -> int:
        """Return the byte offset at which the next record will be written."""
        assert self.writable
        return self._pos

    def read_idx(self, idx: Any) -> bytes | None:
        """Return the record of key `idx`."""
        # The common case inlined: open for reading in this process, a key in the .idx, a
        # whole one-part record inside the file. Anything else (a closed or writing object,
        # another process, a missing key, a split, damaged or cut-short record) goes the long
        # way, through seek and read, which reopen or name the failure as they always do.
        if self._reader_pid == _PID:
            pos = self.idx.get(idx, -1)
            if 0 <= pos <= self._last_header:
                magic, lrec = _PART.unpack_from(self._mm, pos)
                end = pos + 8 + lrec
                if magic == MAGIC and lrec <= _LENGTH_MASK and end <= self._aligned_size:
                    self._pos, self._key = (end + 3) & ~3, None
                    return self._mm[pos + 8 : end]
        self.seek(idx)
        return self.read()

    def write_idx(self, idx: Any, buf: bytes) -> None:
        """Append `buf` as the record of key `idx` and add its .idx line."""
        key = self.key_type(idx)
        pos = self.tell()
        self.write(buf)
        self.fidx.write(f"{key!s}\t{pos:d}\n")
        self.idx[key] = pos
        self.keys.append(key)


def _frame(payload: bytes) -> bytes:
    """Return the framed bytes of `payload`: parts split at aligned magic words, zero padded."""
    n, limit, splits = len(payload), len(payload) & ~3, []
    i = payload.find(MAGIC_BYTES)
    while 0 <= i and i + 4 <= limit:
        if i & 3:
            i = payload.find(MAGIC_BYTES, i + 1)
        else:
            splits.append(i)
            i = payload.find(MAGIC_BYTES, i + 4)
    if not splits:
        return _PART.pack(MAGIC, n) + payload + _PADDING[n & 3]
    out, start = [], 0
    for pos in splits:
        cflag = 1 if start == 0 else 2
        out += [_PART.pack(MAGIC, (cflag << _LENGTH_BITS) | (pos - start)), payload[start:pos]]
        start = pos + 4
    out += [_PART.pack(MAGIC, (3 << _LENGTH_BITS) | (n - start)), payload[start:], _PADDING[n & 3]]
    return b"".join(out)


IRHeader = namedtuple("HEADER", ["flag", "label", "id", "id2"])  # type: ignore[name-match]  # MXNet's name
_IR_FORMAT = "IfQQ"
_IR_SIZE = struct.calcsize(_IR_FORMAT)


def pack(header: tuple[Any, ...], s: bytes) -> bytes:
    """Return header + `s`: a number label gives flag 0, an array gives flag = its size."""
    header = IRHeader(*header)
    if isinstance(header.label, numbers.Number):
        header = header._replace(flag=0)
    else:
        label = np.asarray(header.label, dtype=np.float32)
        header = header._replace(flag=label.size, label=0)
        s = label.tobytes() + s
    return struct.pack(_IR_FORMAT, *header) + s


def unpack(s: bytes) -> tuple[IRHeader, bytes]:
    """Return (IRHeader, payload); the label is a float, or a float32 array when flag > 0."""
    header = IRHeader(*struct.unpack(_IR_FORMAT, s[:_IR_SIZE]))
    s = s[_IR_SIZE:]
    if header.flag > 0:
        header = header._replace(label=np.frombuffer(s, np.float32, header.flag))
        s = s[header.flag * 4 :]
    return header, s


# --- the decode budget ----------------------------------------------------------------------
# An image's header declares its size; a few hundred crafted bytes can declare 65000x65000
# pixels, which OpenCV would allocate (12.7 GB) before finding out. So the image helpers read
# the size first and refuse an image over `max_pixels`. This is a copy of rectool.reader's size
# sniffing (the module stands alone), reduced to the size: the reader also refuses cut images,
# this module decodes them as MXNet does. tests/test_decode_guard_recordio.py checks that the
# two copies size generated headers of every format alike.

# 50 megapixels, rectool.reader's default: more than a 45-megapixel camera or a 48-megapixel
# phone writes; 150 MB decoded in 8-bit colour.
DEFAULT_MAX_PIXELS = 50_000_000
_JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # not DHT, JPG, DAC
_JPEG_STANDALONE_MARKERS = frozenset((0x01, *range(0xD0, 0xD8)))
_MARKER_STEP = bytes(
    1 if m == 0xFF else 2 if m in _JPEG_STANDALONE_MARKERS or not m else 0 for m in range(256)
)
_SIGNATURES = (
    ("jpeg", b"\xff\xd8\xff"),
    ("png", b"\x89PNG\r\n\x1a\n"),
    ("bmp", b"BM"),
    ("gif", (b"GIF87a", b"GIF89a")),
    ("webp", b"RIFF"),
    ("tiff", (b"II*\0", b"MM\0*")),
)
SIZED_FORMATS = "JPEG, PNG, BMP, GIF, WebP, TIFF"


class ImageTooLargeError(RecordFormatError):
    """An image whose header declares more pixels than the decode budget (`max_pixels`)."""


def image_size(data: bytes | bytearray | memoryview) -> tuple[str, int, int] | None:
    """Return (format, height, width) read from image bytes' header, or None if unreadable.

    The formats are JPEG, PNG, BMP, GIF, WebP and TIFF; anything else, a header cut short or
    one declaring no pixels gives None.
    """
    data = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    head = bytes(data[:12])
    for kind, signatures in _SIGNATURES:
        if head.startswith(signatures):
            if kind == "webp" and head[8:] != b"WEBP":
                return None
            try:
                size = _SIZES[kind](data)
            except struct.error:
                return None
            if size is None or size[0] <= 0 or size[1] <= 0:
                return None
            return kind, size[0], size[1]
    return None


def admit_image(
    data: bytes | bytearray | memoryview, max_pixels: float = DEFAULT_MAX_PIXELS
) -> tuple[str, int, int] | None:
    """Return `image_size(data)`; raise `ImageTooLargeError` if it is over `max_pixels` pixels."""
    size = image_size(data)
    if size is not None and size[1] * size[2] > max_pixels:
        _, height, width = size
        raise ImageTooLargeError(
            f"the image declares {width}x{height} pixels ({height * width / 1e6:,.1f} "
            f"megapixels), over the decode limit of {max_pixels:,} (raise it with max_pixels=)"
        )
    return size


def _check_max_pixels(max_pixels: object) -> None:
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(f"max_pixels must be an int >= 1, not {max_pixels!r}")


def _jpeg_size(data: bytes | bytearray) -> tuple[int, int] | None:
    # As libjpeg reads markers (jdmarker.c): bytes before a marker are skipped, and the first
    # frame header sizes the image; image data or the end before it leaves nothing to decode.
    n, i = len(data), 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            i = data.find(b"\xff", i)
            if i < 0:
                return None
            continue
        step = _MARKER_STEP[data[i + 1]]  # FF fill, 00 (no marker), RSTn, TEM: no length
        if step:
            i += step
            continue
        marker = data[i + 1]
        if marker in _JPEG_FRAME_MARKERS:
            return struct.unpack_from(">HH", data, i + 5)
        if marker in (0xDA, 0xD9):
            return None
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None


def _png_size(data: bytes | bytearray) -> tuple[int, int] | None:
    if data[12:16] != b"IHDR" or data[8:12] != b"\0\0\0\r":
        return None
    return struct.unpack_from(">II", data, 16)[::-1]


def _bmp_size(data: bytes | bytearray) -> tuple[int, int] | None:
    if struct.unpack_from("<I", data, 14)[0] == 12:  # OS/2 1.x: 16-bit sides
        return struct.unpack_from("<HH", data, 18)[::-1]
    width, height = struct.unpack_from("<ii", data, 18)
    return abs(height), width  # negative: rows stored top-down


def _webp_size(data: bytes | bytearray) -> tuple[int, int] | None:
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
    return None


def _tiff_size(data: bytes | bytearray) -> tuple[int, int] | None:
    order = "<" if data[:1] == b"I" else ">"
    ifd = struct.unpack_from(order + "I", data, 4)[0]  # the first page: what OpenCV decodes
    found = {}
    for at in range(ifd + 2, ifd + 2 + 12 * struct.unpack_from(order + "H", data, ifd)[0], 12):
        tag, kind = struct.unpack_from(order + "HH", data, at)
        if tag in (256, 257) and kind in (3, 4):  # image width, length: SHORT or LONG
            found[tag] = struct.unpack_from(order + "HI"[kind - 3], data, at + 8)[0]
    return found.get(257, 0), found.get(256, 0)


_SIZES = {
    "jpeg": _jpeg_size,
    "png": _png_size,
    "bmp": _bmp_size,
    "webp": _webp_size,
    "tiff": _tiff_size,
    "gif": lambda data: struct.unpack_from("<HH", data, 6)[::-1],  # the logical screen
}


def _cv2() -> Any:
    import cv2

    return cv2


def _decode(buf: bytes, flags: int, max_pixels: float) -> np.ndarray | None:
    """Return `cv2.imdecode(buf, flags)` if the header admits it, None if it cannot be sized.

    The module's one call of a decoder. Raises `ImageTooLargeError` before decoding an image
    whose header declares more than `max_pixels` pixels.
    """
    _check_max_pixels(max_pixels)
    if admit_image(buf, max_pixels) is None:
        return None  # an unknown format or a cut header: its size is not known
    return _cv2().imdecode(np.frombuffer(buf, dtype=np.uint8), flags)


def unpack_img(
    s: bytes, iscolor: int = -1, *, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[IRHeader, np.ndarray | None]:
    """Return (IRHeader, image): `cv2.imdecode(payload, iscolor)` (BGR; None if undecodable).

    An image whose header declares more than `max_pixels` pixels raises `ImageTooLargeError`
    before decoding; one whose size cannot be read from its header (a format other than JPEG,
    PNG, BMP, GIF, WebP, TIFF, or a cut header) gives None without decoding.
    """
    header, s = unpack(s)
    return header, _decode(s, iscolor, max_pixels)


def pack_img(
    header: tuple[Any, ...], img: np.ndarray, quality: int = 95, img_fmt: str = ".jpg"
) -> bytes:
    """Encode `img` with OpenCV (JPEG quality 1-100 or PNG compression 0-9) and `pack` it."""
    cv2 = _cv2()
    encode_params = None
    if img_fmt.upper() in (".JPG", ".JPEG"):
        encode_params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    elif img_fmt.upper() == ".PNG":
        encode_params = [cv2.IMWRITE_PNG_COMPRESSION, quality]
    ret, buf = cv2.imencode(img_fmt, img, encode_params)
    assert ret, "failed to encode image"
    return pack(header, buf.tobytes())


def imdecode(
    buf: bytes, flag: int = 1, to_rgb: bool = True, *, max_pixels: int = DEFAULT_MAX_PIXELS
) -> np.ndarray:
    """Decode image bytes as `mx.image.imdecode(buf, flag, to_rgb).asnumpy()` does.

    flag=1: (H, W, 3) uint8, RGB unless to_rgb=False; flag=0: (H, W, 1) grayscale.
    Undecodable bytes raise RectoolError (MXNet raises MXNetError), and so do bytes whose size
    cannot be read from their header (see `unpack_img`); an image declaring more than
    `max_pixels` pixels raises `ImageTooLargeError` before decoding.
    """
    img = _decode(buf, 1 if flag else 0, max_pixels)
    if img is None:
        why = "" if image_size(buf) else f": no size in its header ({SIZED_FORMATS} have one)"
        raise RectoolError(f"cannot decode {len(buf)} bytes as an image{why}")
    if not flag:
        return img[:, :, None]
    return _cv2().cvtColor(img, _cv2().COLOR_BGR2RGB) if to_rgb else img
