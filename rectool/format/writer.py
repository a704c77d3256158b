"""Write dmlc RecordIO framing, MXNet image headers and .idx files, byte for byte as MXNet does.

The format constants live in `rectool.reader`, the one place that defines the bytes. The
public `RecordWriter` and `IndexedRecordWriter` (`packer/writers.py`) frame here and write
through the pipeline's own `packer.shardfile.ShardFile`: one writing path, one fsync, one door.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import RecordTooLargeError
from ..reader import (
    CFLAG_FIRST,
    CFLAG_LAST,
    CFLAG_MIDDLE,
    LENGTH_BITS,
    MAGIC,
    MAGIC_BYTES,
    MAX_RECORD_BYTES,
    PART_HEADER,
)
from .headers import IMAGE_HEADER

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    # A label: a number (flag 0), or a sequence or array of them (float32 labels).
    Label = float | Sequence[float] | np.ndarray
    # Integers in a sequence or a numpy array.
    Integers = Sequence[int] | np.ndarray

_PADDING = (b"", b"\0\0\0", b"\0\0", b"\0")


def pack_image_record(image: ReadableBuffer, label: Label, id: int = 0, id2: int = 0) -> bytes:
    """Return one record: the MXNet image header, the labels, then `image` bytes.

    A number gives flag 0 and the label in the header; a sequence or array gives
    flag = its length and float32 labels before the image, as `mxnet.recordio.pack` does.
    """
    if type(label) is float or isinstance(label, numbers.Number):
        return IMAGE_HEADER.pack(0, label, id, id2) + bytes(image)
    labels = np.asarray(label, dtype="<f4").ravel()
    return IMAGE_HEADER.pack(labels.size, 0.0, id, id2) + labels.tobytes() + bytes(image)


def frame_record(payload: ReadableBuffer, item: object = None) -> bytes:
    """Return the framed bytes of one record: parts split at aligned magic words, zero padded.

    dmlc's writer ends a part before every 4-byte-aligned occurrence of the magic in the payload
    and drops those 4 bytes; readers put them back. `item` names the record in errors.
    """
    n = memoryview(payload).nbytes  # in bytes, whatever the item size of a buffer
    if n > MAX_RECORD_BYTES:
        raise RecordTooLargeError(
            f"{item if item is not None else 'record'}: {n} bytes exceeds the RecordIO limit "
            f"of {MAX_RECORD_BYTES} bytes (2**29 - 1)"
        )
    if not isinstance(payload, (bytes, bytearray)):
        payload = bytes(payload)  # memoryviews and numpy buffers have no .find
    splits = _aligned_magic_positions(payload)
    if not splits:
        return PART_HEADER.pack(MAGIC, n) + bytes(payload) + _PADDING[n & 3]
    out: list[bytes | bytearray] = []
    start = 0
    for pos in splits:
        cflag = CFLAG_FIRST if start == 0 else CFLAG_MIDDLE
        out.append(PART_HEADER.pack(MAGIC, (cflag << LENGTH_BITS) | (pos - start)))
        out.append(payload[start:pos])
        start = pos + 4
    out.append(PART_HEADER.pack(MAGIC, (CFLAG_LAST << LENGTH_BITS) | (n - start)))
    out.append(payload[start:])
    out.append(_PADDING[n & 3])
    return b"".join(out)


def frame_image_record(
    image: ReadableBuffer, label: Label, id: int = 0, id2: int = 0, item: object = None
) -> bytes:
    """Return `frame_record(pack_image_record(image, label, id, id2), item)`.

    The common record (a float label, image bytes, no magic word anywhere) is built with a
    single copy of the image; anything else takes the general path.
    """
    if type(label) is float and type(image) is bytes:
        n = IMAGE_HEADER.size + len(image)
        head = IMAGE_HEADER.pack(0, label, id, id2)
        # No aligned word straddles the header's end (24 is a multiple of 4), so checking the
        # header and the image apart finds every magic word that could split the record.
        if n <= MAX_RECORD_BYTES and MAGIC_BYTES not in head and MAGIC_BYTES not in image:
            return b"".join((PART_HEADER.pack(MAGIC, n), head, image, _PADDING[n & 3]))
    return frame_record(pack_image_record(image, label, id, id2), item)


def _aligned_magic_positions(payload: bytes | bytearray) -> list[int]:
    positions: list[int] = []
    limit = len(payload) & ~3  # dmlc only looks at whole aligned words
    i = payload.find(MAGIC_BYTES)
    while 0 <= i and i + 4 <= limit:
        if i & 3 == 0:
            positions.append(i)
            i = payload.find(MAGIC_BYTES, i + 4)
        else:
            i = payload.find(MAGIC_BYTES, i + 1)
    return positions


# One .idx line as MXNet's `MXIndexedRecordIO.write_idx` writes it: key, tab, offset.
INDEX_LINE = "%d\t%d\n"


def format_index_line(key: int, offset: int) -> str:
    """Return one .idx line as MXNet's `MXIndexedRecordIO.write_idx` writes it."""
    return INDEX_LINE % (key, offset)


_POWERS = 10 ** np.arange(1, 19, dtype=np.int64)
# Fewer lines than this are written by Python: numpy's fixed cost per call is larger.
_NUMPY_LINES = 512
_DIGITS = np.frombuffer(b"0123456789", np.uint8)
# The 4 ASCII digits of 0..9999 ("0000".."9999"), each as one word (see `_same_width_lines`).
_QUAD = 10**4
_QUADS = _DIGITS[np.arange(_QUAD)[:, None] // 10 ** np.arange(3, -1, -1) % 10].view("<u4").ravel()
# Lines are written a run of equal widths at a time when runs are at least this long on average.
_RUN_LINES = 64


def format_index_lines(keys: Integers, offsets: Integers) -> bytes:
    """Return the .idx lines of `keys` at `offsets` (integer sequences) as ASCII bytes: those
    of `format_index_line`, one after the other, written a column of digits at a time by
    numpy (no Python bytecode per line)."""
    if len(keys) < _NUMPY_LINES:
        return _python_lines(keys, offsets)
    keys = np.asarray(keys, np.int64).reshape(-1)
    offsets = np.asarray(offsets, np.int64).reshape(-1)
    if keys.min() < 0 or offsets.min() < 0:  # a sign: as Python writes it
        return _python_lines(keys, offsets)
    # A shard's keys and offsets mostly rise: their digit counts change at a few lines only.
    key_digits = np.searchsorted(_POWERS, keys, side="right") + 1
    offset_digits = np.searchsorted(_POWERS, offsets, side="right") + 1
    change = np.flatnonzero(
        (key_digits[1:] != key_digits[:-1]) | (offset_digits[1:] != offset_digits[:-1])
    )
    if len(change) * _RUN_LINES <= len(keys):
        bounds = [0, *(change + 1).tolist(), len(keys)]
        return b"".join(
            _same_width_lines(keys[a:b], offsets[a:b], int(key_digits[a]), int(offset_digits[a]))
            for a, b in zip(bounds, bounds[1:])
        )
    columns: list[np.ndarray] = []
    keep: list[np.ndarray] = []
    for values, end in ((keys, b"\t"), (offsets, b"\n")):
        width = int(np.searchsorted(_POWERS, values.max(), side="right")) + 1
        digits = np.searchsorted(_POWERS, values, side="right") + 1
        block = np.empty((len(values), width + 1), np.uint8)
        rest = values.copy()
        for column in range(width - 1, -1, -1):
            block[:, column] = _DIGITS[rest % 10]
            rest //= 10
        block[:, width] = end[0]
        columns.append(block)
        # Right-aligned: the leading columns beyond a value's digits are left out.
        keep.append(np.arange(width + 1) >= (width - digits)[:, None])
    lines = np.concatenate(columns, axis=1)
    return lines[np.concatenate(keep, axis=1)].tobytes()


def _same_width_lines(
    keys: np.ndarray, offsets: np.ndarray, key_width: int, offset_width: int
) -> bytes:
    """Return the .idx lines of `keys` at `offsets` whose numbers all have `key_width` and
    `offset_width` digits: one fixed-width block, 4 digits at a time (a word of `_QUADS`)."""
    lines = np.empty((len(keys), key_width + offset_width + 2), np.uint8)
    _put_digits(lines, 0, keys, key_width)
    lines[:, key_width] = b"\t"[0]
    _put_digits(lines, key_width + 1, offsets, offset_width)
    lines[:, -1] = b"\n"[0]
    return lines.tobytes()


def _put_digits(lines: np.ndarray, column: int, values: np.ndarray, width: int) -> None:
    """Write `values` (below 10**width) as `width` decimal digits from `column` of `lines`."""
    groups = (width + 3) // 4
    quads = np.empty((len(values), groups), "<u4")
    rest = values
    for group in range(groups - 1, 0, -1):
        rest, low = np.divmod(rest, _QUAD)
        quads[:, group] = _QUADS[low]
    quads[:, 0] = _QUADS[rest]
    lines[:, column : column + width] = quads.view(np.uint8)[:, 4 * groups - width :]


def _python_lines(keys: Integers, offsets: Integers) -> bytes:
    pairs: Any = zip(
        keys.tolist() if isinstance(keys, np.ndarray) else keys,
        offsets.tolist() if isinstance(offsets, np.ndarray) else offsets,
    )
    return "".join(map(INDEX_LINE.__mod__, pairs)).encode("ascii")
