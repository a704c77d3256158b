"""Walk a .rec file's framing from first byte to last, and read its record headers in bulk.

`scan_framing` follows the parts without trusting any .idx. Where the bytes are not a record it
resynchronises as dmlc's split reader does, on the next 4-byte-aligned magic followed by a part
whose continuation flag is 0 or 1, and records the skipped range as `Damage`. `read_headers`
reads the image header of many records at once, with numpy, for verify, info and reindex;
`insightface_ranges` applies the reader's insightface rule to records read that way.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..format.headers import (
    Header,
    insightface_header,
    peek_header,
    unpack_header,
)
from ..format.window import RecWindow
from ..packer.images import sniff_format
from ..reader import (
    CFLAG_FIRST,
    CFLAG_LAST,
    CFLAG_MIDDLE,
    CFLAG_WHOLE,
    IMAGE_HEADER_SIZE,
    LENGTH_BITS,
    LENGTH_MASK,
    MAGIC,
    MAGIC_BYTES,
    PART_HEADER,
    RecordFile,
    RecordFormatError,
)

if TYPE_CHECKING:
    from _typeshed import StrPath

# `read_record(offset)`: the bytes of the record starting at a byte offset.
ReadRecord = Callable[[int], bytes]
# What a .rec is read from: its mapping (`mapped`), or bytes.
Buffer = mmap.mmap | bytes

_ZEROS = (b"", b"\0", b"\0\0", b"\0\0\0")
_WORD = np.dtype("<u4")


@dataclass(frozen=True)
class Damage:
    """Bytes `start`..`end` hold no readable record; reading failed at the part at `part`.

    `kind` is "truncated" (the file ends inside the record), "bad-length" (a part runs past the
    end of the file, yet records follow), "bad-magic" or "bad-cflag".
    """

    start: int
    end: int
    part: int
    kind: str
    reason: str


@dataclass
class Framing:
    """What a walk over a .rec found: readable records in file order, and the damage between."""

    size: int
    starts: np.ndarray  # int64: byte offset of each record's first part
    ends: np.ndarray  # int64: byte offset just past each record (padding included)
    lengths: np.ndarray  # int64: payload bytes (a split record's parts rejoined)
    split: np.ndarray  # bool: the record has more than one part
    damage: list[Damage]  # in file order
    # (record start, part offset): padding bytes that are not zero
    bad_padding: list[tuple[int, int]]


@contextmanager
def mapped(path: StrPath) -> Iterator[tuple[Buffer, int]]:
    """Map a file read-only through the reader's `RecordFile`; yield (buffer, size). An empty
    file yields (b"", 0). The whole file stays in the process's RSS as it is read: a scan of
    every record takes a `format.window.RecWindow` instead (its `mapping` and `size` are
    this buffer and size; `hold`/`batches` hand the pages back behind the scan)."""
    records = RecordFile(os.fspath(path))  # a FIFO or device is refused
    mm = records.open()
    try:
        yield mm, len(mm)
    finally:
        try:
            records.close()
        except BufferError:
            # A numpy view of the mapping is still alive; the mapping goes with it.
            pass


def find_record_start(buf: Buffer, start: int, size: int) -> int:
    """Return the first offset >= `start` where a record can begin, or `size` if there is none.

    A record begins at a 4-byte-aligned magic followed by a length word whose continuation flag
    is 0 (whole) or 1 (first part), as dmlc-core's resynchronising reader requires.
    """
    pos = (start + 3) & ~3
    while True:
        i = buf.find(MAGIC_BYTES, pos)
        if i < 0 or i + 8 > size:
            return size
        if i & 3:
            pos = i + 1
            continue
        lrec = int.from_bytes(buf[i + 4 : i + 8], "little")
        if lrec >> LENGTH_BITS in (CFLAG_WHOLE, CFLAG_FIRST):
            return i
        pos = i + 4


def _follow_parts(
    buf: Buffer, size: int, offset: int
) -> tuple[Literal[True], int, int, list[int]] | tuple[Literal[False], str, int, str]:
    """Read the record at `offset` part by part.

    Return (True, end, payload length, [part offsets with non-zero padding]) or
    (False, kind, part offset, reason).
    """
    unpack = PART_HEADER.unpack_from
    pos, total, first = offset, 0, True
    bad_padding: list[int] = []
    while True:
        if pos + 8 > size:
            if pos == size:
                return False, "truncated", pos, "the file ends before the record's last part"
            return (
                False,
                "truncated",
                pos,
                f"the file ends {size - pos} bytes into a part header",
            )
        magic, lrec = unpack(buf, pos)
        if magic != MAGIC:
            return False, "bad-magic", pos, f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})"
        cflag, length = lrec >> LENGTH_BITS, lrec & LENGTH_MASK
        if first and cflag not in (CFLAG_WHOLE, CFLAG_FIRST):
            return (
                False,
                "bad-cflag",
                pos,
                f"record starts with continuation flag {cflag} (expected 0 or 1)",
            )
        if not first and cflag not in (CFLAG_MIDDLE, CFLAG_LAST):
            return (
                False,
                "bad-cflag",
                pos,
                f"split record continues with flag {cflag} (expected 2 or 3)",
            )
        end = pos + 8 + length
        padded = (end + 3) & ~3
        if padded > size:
            return (
                False,
                "truncated",
                pos,
                f"a part of {length} bytes runs past the end of the file ({size} bytes)",
            )
        if padded != end and buf[end:padded] != _ZEROS[padded - end]:
            bad_padding.append(pos)
        total += length if first else length + 4
        pos = padded
        if cflag in (CFLAG_WHOLE, CFLAG_LAST):
            return True, pos, total, bad_padding
        first = False


def scan_framing(
    buf: Buffer,
    size: int,
    hint: Sequence[int] | np.ndarray | None = None,
    window: RecWindow | None = None,
) -> Framing:
    """Walk every part of a mapped .rec from byte 0 to `size`; return a `Framing`.

    Never raises on bad bytes: damage is skipped up to the next record start and recorded.
    `hint`, the offsets an .idx gives, lets a sound file be confirmed with numpy instead of
    part by part; the result is the same as the walk's, which runs whenever the hint fails.
    `window`, the `RecWindow` whose mapping `buf` is, is held a span at a time as the walk
    goes, so the pages walked are handed back behind it.
    """
    if hint is not None:
        framing = _confirm_chain(buf, size, hint, window)
        if framing is not None:
            return framing
    unpack = PART_HEADER.unpack_from
    starts: list[int] = []
    ends: list[int] = []
    lengths: list[int] = []
    split_at: list[int] = []
    damage: list[Damage] = []
    bad_padding: list[tuple[int, int]] = []
    offset = held = 0
    whole_limit = 1 << LENGTH_BITS  # lrec below this: continuation flag 0, a whole record
    while offset < size:
        if window is not None and offset >= held:
            window.hold(held, offset + window.span)  # from where the last one ended
            held = offset + window.span
        if offset + 8 <= size:
            magic, lrec = unpack(buf, offset)
            if magic == MAGIC and lrec < whole_limit:
                end = offset + 8 + lrec
                padded = (end + 3) & ~3
                if padded <= size:
                    if padded != end and buf[end:padded] != _ZEROS[padded - end]:
                        bad_padding.append((offset, offset))
                    starts.append(offset)
                    ends.append(padded)
                    lengths.append(lrec)
                    offset = padded
                    continue
        result = _follow_parts(buf, size, offset)
        if result[0]:
            _, end, length, padding = result
            split_at.append(len(starts))
            starts.append(offset)
            ends.append(end)
            lengths.append(length)
            bad_padding.extend((offset, part) for part in padding)
            offset = end
            continue
        _, kind, part, reason = result
        resume = find_record_start(buf, offset + 4, size)
        if kind == "truncated" and resume < size and part + 8 <= size:
            kind = "bad-length"
            reason += f"; the next record starts at byte {resume}"
        damage.append(Damage(offset, resume, part, kind, reason))
        offset = resume
    split = np.zeros(len(starts), bool)
    split[split_at] = True
    return Framing(
        size,
        np.array(starts, np.int64),
        np.array(ends, np.int64),
        np.array(lengths, np.int64),
        split,
        damage,
        bad_padding,
    )


def _confirm_chain(
    buf: Buffer,
    size: int,
    hint: Sequence[int] | np.ndarray,
    window: RecWindow | None = None,
) -> Framing | None:
    """Return the `Framing` of a file whose records are exactly `hint`, back to back, or None.

    Checks at once what the walk checks one record at a time: the first record at byte 0,
    each a magic and a whole-record length word (split records are followed part by part),
    each ending, padding included, where the next begins and the last at the end of the
    file, and zero padding. With a `window`, a batch of records at a time, each batch's
    pages held in it (and handed back as the next is taken): what is kept is a few columns.
    """
    starts = np.asarray(hint, np.int64)
    if len(starts) > 1 and not (starts[1:] > starts[:-1]).all():  # not as a pack writes it
        # Sorted, then deduplicated: numpy 2's hash-based np.unique took 14 s on 10M offsets
        # of one stride.
        starts = np.sort(starts)
        starts = starts[np.concatenate(([True], starts[1:] != starts[:-1]))]
    n = len(starts)
    if not n or starts[0] != 0 or (starts & 3).any() or starts[-1] + 8 > size:
        return None
    lengths, split = np.zeros(n, np.int64), np.zeros(n, bool)
    padding_bad = np.zeros(n, bool)
    words = np.frombuffer(buf, _WORD, size // 4)
    try:
        for i, j in _held_batches(starts, window):
            at = starts[i:j]
            w = at // 4
            magic, lrec = words[w], words[w + 1]
            if (magic != MAGIC).any():
                return None
            cflag = lrec >> LENGTH_BITS
            got = (lrec & LENGTH_MASK).astype(np.int64)
            ends = at + 8 + ((got + 3) & ~3)
            whole = cflag == CFLAG_WHOLE
            if not (whole | (cflag == CFLAG_FIRST)).all():
                return None
            tail = whole & (ends <= size) & (got & 3 != 0)
            last_word = words[np.minimum(ends[tail], size & ~3) // 4 - 1]
            pad_bits = (8 * (got[tail] & 3)).astype(np.uint32)
            # Little-endian: the record's last bytes are the low ones, padding the high ones.
            padding_bad[i:j][tail] = (last_word >> pad_bits) != 0
            lengths[i:j], split[i:j] = got, ~whole
    finally:
        del words
        if window is not None:
            window.drop()
    # In place: one new column, not the three temporaries of the expression (verify's peak).
    ends = lengths + 3
    ends &= ~3
    ends += starts
    ends += 8
    bad_padding = [(o, o) for o in starts[padding_bad].tolist()]
    for i in np.flatnonzero(split).tolist():
        result = _follow_parts(buf, size, int(starts[i]))
        if window is not None:  # its pages: handed back at once
            window.hold(int(starts[i]), result[1] if result[0] else size)
            window.drop()
        if not result[0]:
            return None
        _, ends[i], lengths[i], padding = result
        bad_padding.extend((int(starts[i]), part) for part in padding)
    if ends[-1] != size or (ends[:-1] != starts[1:]).any():
        return None
    bad_padding.sort()
    return Framing(size, starts, ends, lengths, split, [], bad_padding)


def _held_batches(starts: np.ndarray, window: RecWindow | None) -> Iterator[tuple[int, int]]:
    """Yield (i, j): all of the ascending `starts` at once without a window; else a window's
    batch at a time, its bytes held in the window (its caller drops the last)."""
    if window is None:
        yield 0, len(starts)
        return
    for i, j, lo, hi in window.batches(starts):
        window.hold(lo, hi)
        yield i, j


@dataclass
class Headers:
    """The image headers of many records, as parallel arrays.

    `complete` is False where the record is too short for its header and the labels the header
    announces; the other fields are then meaningless. `label0`/`label1` are the first two labels
    (the header's float when flag is 0; NaN where absent). `image` is the image length in bytes.
    """

    complete: np.ndarray
    flag: np.ndarray
    label: np.ndarray
    label0: np.ndarray
    label1: np.ndarray
    id: np.ndarray
    id2: np.ndarray
    image: np.ndarray

    def __len__(self) -> int:
        return len(self.flag)


def read_headers(
    buf: Buffer,
    size: int,
    starts: np.ndarray,
    lengths: np.ndarray,
    split: np.ndarray,
    read_record: ReadRecord,
) -> Headers:
    """Read the header of each record at `starts` (whole records: vectorised; split: one by one).

    `lengths` are payload lengths and `split` marks records with several parts, which are read
    whole through `read_record(offset)`. Records must be known to be readable (see
    `scan_framing` or `locate_records`).
    """
    n = len(starts)
    out = Headers(
        np.zeros(n, bool),
        np.zeros(n, np.uint32),
        np.zeros(n, np.float32),
        np.full(n, np.nan, np.float32),
        np.full(n, np.nan, np.float32),
        np.zeros(n, np.uint64),
        np.zeros(n, np.uint64),
        np.zeros(n, np.int64),
    )
    if not n:
        return out
    words = np.frombuffer(buf, _WORD, size // 4)
    try:
        whole = np.flatnonzero(~split & (lengths >= IMAGE_HEADER_SIZE))
        if whole.size:
            w = starts[whole] // 4 + 2  # the payload's first word
            flag = words[w]
            out.flag[whole] = flag
            out.label[whole] = words[w + 1].view(np.float32)
            out.id[whole] = words[w + 2].astype(np.uint64) | (
                words[w + 3].astype(np.uint64) << np.uint64(32)
            )
            out.id2[whole] = words[w + 4].astype(np.uint64) | (
                words[w + 5].astype(np.uint64) << np.uint64(32)
            )
            need = IMAGE_HEADER_SIZE + 4 * flag.astype(np.int64)
            complete = lengths[whole] >= need
            out.complete[whole] = complete
            out.image[whole] = np.where(complete, lengths[whole] - need, 0)
            out.label0[whole] = np.where(flag == 0, out.label[whole], np.nan)
            # Only whole words inside the record are read; the mask keeps others out of range.
            for field, k in ((out.label0, 0), (out.label1, 1)):
                has = complete & (flag > k)
                idx = whole[has]
                field[idx] = words[w[has] + 6 + k].view(np.float32)
        for i in np.flatnonzero(split | (lengths < IMAGE_HEADER_SIZE)).tolist():
            _read_one_header(out, i, read_record(int(starts[i])))
    finally:
        del words
    return out


def _read_one_header(out: Headers, i: int, record: bytes) -> None:
    found = peek_header(record)
    if found is None:
        return
    (flag, label, id1, id2), need = found
    out.flag[i], out.label[i], out.id[i], out.id2[i] = flag, label, id1, id2
    if len(record) < need:
        return
    out.complete[i] = True
    out.image[i] = len(record) - need
    labels = np.frombuffer(record, np.float32, min(flag, 2), IMAGE_HEADER_SIZE)
    if flag == 0:
        out.label0[i] = label
    else:
        out.label0[i] = labels[0]
        if flag > 1:
            out.label1[i] = labels[1]


def locate_records(
    buf: Buffer,
    size: int,
    offsets: Sequence[int] | np.ndarray,
    path: StrPath | None = None,
    keys: np.ndarray | None = None,
    bad: list[tuple[int, int, str]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Check that each offset starts a readable record; return (lengths, split) arrays.

    Whole records are checked at once with numpy; split records are followed part by part.
    Raises `RecordFormatError` naming the first offset that is not a record start, unless
    `bad` is a list: then each unreadable record's (index, offset, reason) is appended to it
    instead (its length is left 0).
    """
    offsets = np.asarray(offsets, np.int64)
    n = len(offsets)
    lengths, split = np.zeros(n, np.int64), np.zeros(n, bool)
    if not n:
        return lengths, split
    outside = (offsets < 0) | (offsets & 3 != 0) | (offsets + 8 > size)
    if outside.any():
        reason = "offset is not a record start (unaligned or past the end of the file)"
        if bad is None:
            i = int(np.flatnonzero(outside)[0])
            raise RecordFormatError(
                reason, path, int(offsets[i]), None if keys is None else int(keys[i])
            )
        bad.extend((i, int(offsets[i]), reason) for i in np.flatnonzero(outside).tolist())
    words = np.frombuffer(buf, _WORD, size // 4)
    try:
        w = np.where(outside, 0, offsets) // 4
        magic, lrec = words[w], words[w + 1]
        lengths[:] = lrec & LENGTH_MASK
        whole = (magic == MAGIC) & (lrec >> LENGTH_BITS == CFLAG_WHOLE)
        whole &= offsets + 8 + ((lengths + 3) & ~3) <= size
        whole &= ~outside
    finally:
        del words
    lengths[outside] = 0
    for i in np.flatnonzero(~whole & ~outside).tolist():
        result = _follow_parts(buf, size, int(offsets[i]))
        if not result[0]:
            if bad is not None:
                part = "" if result[2] == offsets[i] else f" (part at byte {result[2]})"
                bad.append((i, int(offsets[i]), result[3] + part))
                lengths[i] = 0
                continue
            raise RecordFormatError(
                result[3], path, result[2], None if keys is None else int(keys[i])
            )
        lengths[i] = result[2]
        split[i] = True
    return lengths, split


def image_formats(
    buf: Buffer,
    size: int,
    starts: np.ndarray,
    headers: Headers,
    split: np.ndarray,
    rows: Sequence[int] | np.ndarray,
    read_record: ReadRecord,
) -> np.ndarray:
    """Return the image format (see `images.sniff_format`, None if unknown) of each record in
    `rows`, as an object array. JPEG and PNG signatures are recognised with numpy (no Python
    object or loop per record), the rest one by one.
    """
    rows = np.asarray(rows, np.int64)
    out: np.ndarray = np.full(len(rows), None, object)
    if not len(rows):
        return out
    whole = ~split[rows] & (headers.image[rows] > 0)
    at = starts[rows] + 8 + IMAGE_HEADER_SIZE + 4 * headers.flag[rows].astype(np.int64)
    kinds = np.zeros(len(rows), np.int8)
    if whole.any():
        words = np.frombuffer(buf, _WORD, size // 4)
        first = words[at[whole] // 4]
        del words
        kinds[whole] = np.where(
            (first & 0xFFFFFF) == 0xFFD8FF, 1, np.where(first == 0x474E5089, 2, 0)
        )
    out[kinds == 1], out[kinds == 2] = "jpeg", "png"
    for i in np.flatnonzero(kinds == 0).tolist():
        j, length = int(rows[i]), int(headers.image[rows[i]])
        if length == 0:
            continue
        if split[j]:
            record = read_record(int(starts[j]))
            head = record[len(record) - length :][:16]
        else:
            a = int(at[i])
            head = bytes(buf[a : a + min(16, length)])
        out[i] = sniff_format(head)
    return out


def insightface_ranges(
    keys: np.ndarray, starts: np.ndarray, headers: Headers, read_record: ReadRecord
) -> tuple[range, range] | None:
    """Return the key ranges (images, identities) of an insightface .rec read in bulk, or None.

    The rule is `reader.insightface_header`'s, the one definition of the layout; this only feeds
    it the records read here: record i has key `keys[i]`, starts at `starts[i]` and has header
    `headers` row i; `read_record(offset)` returns a record's bytes. A record too short for its
    header counts as one with the flag it shows (0 when even that is cut off) and no labels, so
    a cut record 0 is no header; `rectool verify` names the record.
    """

    def read(row: int) -> tuple[Header, bytes]:
        if not headers.complete[row]:
            return Header(int(headers.flag[row]), np.full(2, np.nan, np.float32), 0, 0), b""
        return unpack_header(read_record(int(starts[row])))

    return insightface_header(read, keys)
