"""MXNet 1.9.1's `mxnet.recordio` API without MXNet: the standard library and numpy only.

Code that imports MXNet only for `recordio` moves off it by changing the import:

    from mxnet import recordio          ->   import recordio   (or: from rectool import recordio)
    mx.image.imdecode(img).asnumpy()    ->   recordio.imdecode(img)

`MXRecordIO`, `MXIndexedRecordIO`, `IRHeader`, `pack`, `unpack`, `pack_img` and `unpack_img`
behave as MXNet's: the same files byte for byte (records split at aligned magic words), the
same return types and dtypes, the same pid check and reopening after pickling or a fork. Reads
go through `mmap`. Where MXNet aborts with an opaque error or returns garbage (a damaged
record, a key missing from the .idx, a record cut short or past the end, an unparsable .idx
line, a header shorter than it says), this module raises a named `RectoolError` naming the
file, key and byte offset; where MXNet raises a builtin error (`KeyError`, `ValueError`,
`struct.error`), the named one is also of that class. Files are opened as rectool's reader
opens its own: regular files only (a FIFO is refused, not waited on), an .idx read up to the
size it had when opened, in lines of `MAX_IDX_LINE` characters at most. The image helpers
read an image's size from its header first and refuse one over `max_pixels` (50 million by
default) with `ImageTooLargeError` before decoding. rectool's docs/migration.md lists every
difference. OpenCV is imported only by the image helpers.

The framing, the errors and the decode guard are rectool's own (rectool/reader.py,
rectool/format/writer.py), imported here; `rectool reader --recordio` writes this module with
those definitions copied in, so that the file it writes needs neither rectool nor MXNet.
"""

from __future__ import annotations

import errno
import locale
import math
import numbers
import os
import stat
import struct
from collections import namedtuple
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "MAX_IDX_LINE",
    "IRHeader",
    "ImageHeaderError",
    "ImageTooLargeError",
    "IndexFormatError",
    "InputError",
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

# --- rectool's own definitions: `rectool reader --recordio` copies here the ones these imports
# name (and what they use), so that the emitted module stands alone; see rectool/emit.py.
from .format.headers import unpack_header  # noqa: E402
from .format.textindex import IndexFormatError  # noqa: E402
from .format.writer import frame_record  # noqa: E402
from .reader import (  # noqa: E402
    DEFAULT_MAX_PIXELS,
    MAGIC,
    PART_HEADER,
    ImageTooLargeError,
    InputError,
    RecordFile,
    RecordFormatError,
    RectoolError,
    admit_image,
    check_max_pixels,
    open_regular,
)

# --- end of rectool's own definitions

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


# An .idx line is a key, a tab and an offset; a longer line is not one (a key as long as a
# path is far shorter), and reading it whole would let one line without a newline fill memory.
MAX_IDX_LINE = 1 << 16


class MissingKeyError(RectoolError, KeyError):
    """A key that is not in the .idx; a `KeyError`, as MXNet raises."""

    def __str__(self) -> str:
        return str(self.args[0])


def _idx_lines(f: Any, size: int, path: str) -> Any:
    """Yield (number of the first line, lines) of the first `size` bytes of the .idx `f`, a
    block at a time, as MXNet's text-mode reading splits them (at LF, CRLF or CR; the locale's
    encoding). Raise `IndexFormatError` for a line over `MAX_IDX_LINE` characters or bytes
    that are not text, naming the line."""
    encoding, number, carry = locale.getpreferredencoding(False), 1, b""
    while size > 0 or carry:
        block = f.read(min(size, 1 << 16)) if size > 0 else b""
        size = size - len(block) if block else 0
        data = carry + block
        # Cut after the last line end known whole: a CR last may be the first half of a CRLF.
        cut = len(data) if not size else max(data.rfind(b"\n"), data.rfind(b"\r", 0, -1)) + 1
        data, carry = data[:cut], data[cut:]
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        try:
            lines = data.decode(encoding).split("\n")
        except UnicodeDecodeError as exc:
            line_start = data.rfind(b"\n", 0, exc.start) + 1
            at = number + data.count(b"\n", 0, exc.start)
            why = f"byte {data[exc.start]:#04x} at column {exc.start - line_start + 1}"
            raise IndexFormatError(f"not {encoding} text ({why})", path, at) from None
        if not lines[-1]:
            lines.pop()  # after the last line end
        # A character takes 4 bytes at most: a line not ended within 4 * MAX_IDX_LINE bytes
        # is too long, and no more is read to find its end.
        if max(map(len, lines), default=0) > MAX_IDX_LINE or len(carry) > 4 * MAX_IDX_LINE:
            lengths = [*map(len, lines), len(carry)]
            at = number + next(i for i, n in enumerate(lengths) if n > MAX_IDX_LINE)
            why = f"longer than {MAX_IDX_LINE:,} characters: not 'key<TAB>offset'"
            raise IndexFormatError(why, path, at)
        yield number, lines
        number += len(lines)


class ImageHeaderError(RecordFormatError, ValueError, struct.error):
    """A record too short for its image header or for the labels its flag declares: both a
    `struct.error` and a `ValueError`, as MXNet's `unpack` raises one or the other."""


def _create(path: str, what: str) -> int:
    """Create or truncate `path` for writing, as MXNet does; return its descriptor. Refuse
    anything but a regular file: a FIFO would block (opened without blocking: none waits)."""
    nonblocking = getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nonblocking, 0o666)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: a FIFO that no process reads
            raise
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise InputError(f"{path}: not a regular file (the {what} must be one)")
    if nonblocking:
        os.set_blocking(fd, True)
    return fd


class MXRecordIO:
    """Read ('r') or write ('w') a RecordIO file sequentially, as `mxnet.recordio.MXRecordIO`."""

    _file: Any  # the file written ('w'), else None
    _mm: Any  # the mapping read ('r'; b"" for an empty file), else None
    _records: Any  # the `RecordFile` read ('r'), else None
    pid: int | None
    _reader_pid: int | None  # the pid of an open reader, for read_idx's fast path

    def __init__(self, uri: str | os.PathLike[str], flag: str) -> None:
        self.uri = os.fspath(uri)
        self.flag = flag
        self.pid = None
        self.is_open = False
        self._file = self._mm = self._records = None
        self.open()

    def open(self) -> None:
        """Open the file: 'w' creates or truncates it, 'r' maps it."""
        if self.flag == "w":
            self._file = os.fdopen(_create(self.uri, "record file"), "wb")
            self.writable = True
        elif self.flag == "r":
            self._records = RecordFile(self.uri)
            self._mm = self._records.open()
            self._size = size = len(self._mm)
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
        d = {k: v for k, v in self.__dict__.items() if k not in ("_file", "_mm", "_records")}
        d["is_open"] = is_open
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        """Unpickle as MXNet does: reopen the file if it was open."""
        is_open = d["is_open"]
        self.__dict__ = d
        self._file = self._mm = self._records = self._reader_pid = None
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
        else:
            self._records.close()
        self._file = self._mm = self._records = None
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
        framed = frame_record(buf, f"{self.uri}, byte offset {self._pos}")
        self._file.write(framed)
        self._pos += len(framed)

    def read(self) -> bytes | None:
        """Return the next record as bytes, or None at the end of the file."""
        assert not self.writable
        self._check_pid(allow_reset=False)
        pos, key, self._key = self._pos, self._key, None
        if pos == self._size and key is None:  # the end; a record asked for by key is not there
            return None
        if 0 <= pos <= self._last_header:  # the common record: one whole part
            magic, lrec = PART_HEADER.unpack_from(self._mm, pos)
            end = pos + 8 + lrec
            if magic == MAGIC and lrec < 1 << 29 and end <= self._aligned_size:
                self._pos = (end + 3) & ~3
                return self._mm[pos + 8 : end]
        data, self._pos = self._records.read_parts(pos, key)
        return data


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
        try:
            if self.writable:
                self.fidx = os.fdopen(_create(self.idx_path, "index file"), "w")
            else:
                fd, st = self._open_idx_file()
                self.fidx = os.fdopen(fd, "rb")
                self._read_idx_file(st.st_size)
        except BaseException:
            self.close()
            raise

    def _open_idx_file(self) -> tuple[int, os.stat_result]:
        """Open the .idx through rectool's input door (a regular file, never waited on); a
        missing one is MXNet's `FileNotFoundError`."""
        try:
            return open_regular(self.idx_path, "index file")
        except InputError:
            if os.path.exists(self.idx_path):
                raise
        enoent = errno.ENOENT
        raise FileNotFoundError(enoent, os.strerror(enoent), self.idx_path) from None

    def _read_idx_file(self, size: int) -> None:
        """Parse the .idx's first `size` bytes (its size when opened) into idx and keys."""
        idx, keys, key_type, path = self.idx, self.keys, self.key_type, self.idx_path
        for first, lines in _idx_lines(self.fidx, size, path):
            for number, line in enumerate(lines, first):
                fields = line.strip().split("\t")
                try:
                    key = key_type(fields[0])
                    idx[key] = int(fields[1])
                except (IndexError, ValueError) as exc:
                    shown = repr(line[:80]) + ("..." if len(line) > 80 else "")
                    why = f"{type(exc).__name__}: {str(exc)[:200]}"
                    raise IndexFormatError(
                        f"{shown} is not 'key<TAB>offset' ({why})", path, number
                    ) from None
                keys.append(key)

    def close(self) -> None:
        """Close the record file and the .idx."""
        if not self.is_open:
            return
        super().close()
        if self.fidx is not None:
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
                magic, lrec = PART_HEADER.unpack_from(self._mm, pos)
                end = pos + 8 + lrec
                if magic == MAGIC and lrec < 1 << 29 and end <= self._aligned_size:
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


IRHeader = namedtuple("HEADER", ["flag", "label", "id", "id2"])  # type: ignore[name-match]  # MXNet's name
_IR_FORMAT = "IfQQ"  # as MXNet: native (a float label too large is a struct.error)


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
    """Return (IRHeader, payload); the label is a float, or a float32 array when flag > 0.

    A record too short for the header or for the labels its flag declares raises
    `ImageHeaderError` (a `struct.error` and a `ValueError`, MXNet's errors for those)."""
    try:
        header, payload = unpack_header(s)
    except RecordFormatError as exc:
        raise ImageHeaderError(exc.reason) from None
    return IRHeader(*header), payload


# --- the decode budget ----------------------------------------------------------------------
# An image's header declares its size; a few hundred crafted bytes can declare 65000x65000
# pixels, which OpenCV would allocate (12.7 GB) before finding out. So the image helpers size
# the image first with rectool's own guard (`admit_image`) and refuse one over `max_pixels`.
# rectool's reader also refuses a cut image; this module decodes it as MXNet does
# (`whole=False`).


def image_size(data: bytes | bytearray | memoryview) -> tuple[str, int, int] | None:
    """Return (format, height, width) read from image bytes' header, or None if unreadable.

    The formats are JPEG, PNG, BMP, GIF, WebP and TIFF; anything else, a header cut short or
    one declaring no pixels gives None.
    """
    try:
        return admit_image(data, math.inf, whole=False)
    except RecordFormatError:
        return None


def _cv2() -> Any:
    import cv2

    return cv2


def _decode(buf: bytes, flags: int, max_pixels: float) -> np.ndarray | None:
    """Return `cv2.imdecode(buf, flags)` if the header admits it, None if it cannot be sized.

    The module's one call of a decoder. Raises `ImageTooLargeError` before decoding an image
    whose header declares more than `max_pixels` pixels.
    """
    check_max_pixels(max_pixels)
    try:
        admit_image(buf, max_pixels, whole=False)
    except ImageTooLargeError:
        raise
    except RecordFormatError:
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
        why = "" if image_size(buf) else ": no size in its header (JPEG, PNG, BMP, GIF, WebP, TIFF)"
        raise RectoolError(f"cannot decode {len(buf)} bytes as an image{why}")
    if not flag:
        return img[:, :, None]
    return _cv2().cvtColor(img, _cv2().COLOR_BGR2RGB) if to_rgb else img
