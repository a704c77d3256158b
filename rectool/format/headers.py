"""What the package reads from record headers in bulk: labels, and insightface's record 0.

Used where a pack's binary index is written (`format/binindex.py`: at pack time, and by
`rectool index` for a foreign pack) and where a pack without one is opened.
"""

from __future__ import annotations

import mmap
import struct
from collections import namedtuple
from typing import TYPE_CHECKING, Any

import numpy as np

from ..reader import (
    IMAGE_HEADER_SIZE,
    LENGTH_BITS,
    LENGTH_MASK,
    MAGIC,
    RecordFile,
    RecordFormatError,
    RectoolError,
    image_start,
)
from .window import release_range

if TYPE_CHECKING:
    from collections.abc import Callable

    from numpy.typing import NDArray

    Ints = NDArray[np.int64]


# MXNet recordio.py's image header IRHeader(flag, label, id, id2); flag > 0: float32 labels follow.
IMAGE_HEADER = struct.Struct("<IfQQ")
Header = namedtuple("Header", "flag label id id2")


def unpack_header(record: bytes, path: Any = None, offset: Any = None, key: Any = None) -> Any:
    """Split one record into its `Header` and image bytes, as `mxnet.recordio.unpack` does."""
    start, head = image_start(record, path, offset, key), Header(*IMAGE_HEADER.unpack_from(record))
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


def check_shard(
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


COVER_CHUNK = 1 << 16  # records whose extents are checked at once
SCAN_WORDS = 1 << 22  # words of a gap between records scanned at once (16 MiB)


def check_covered(rf: RecordFile, idx: str, keys: Ints, offsets: Ints) -> None:
    """Refuse a shard whose .rec holds a record that no line of its .idx names (lines lost or
    deleted): MXNet never reads it. The bytes between the records the .idx names (each one's
    extent read from its head, or its parts for a split one, a chunk at a time) are searched
    for a record start as `reindex` finds one; damage the .idx skips holds none, and passes."""
    mapping = rf.open()
    size = len(mapping)
    order = None if (offsets[1:] >= offsets[:-1]).all() else np.argsort(offsets, kind="stable")
    words = np.frombuffer(mapping, "<u4", size // 4) if size >= 32 else None
    covered = 0  # every byte before it is in a record the .idx names, or searched
    try:
        for start in range(0, len(offsets), COVER_CHUNK):
            end = start + COVER_CHUNK
            rows = slice(start, end) if order is None else order[start:end]
            at = offsets[rows]
            if words is None:
                ok, head = np.zeros(len(at), bool), np.zeros((len(at), 4), np.uint32)
            else:
                ok, _, head = record_heads(words, size, at)
            ends = at + 8 + ((head[:, 1].astype(np.int64) + 3) & ~3)
            bad = np.flatnonzero(~ok)  # split or damaged: read part by part
            for i, key in zip(bad.tolist(), keys[rows][bad].tolist() if len(bad) else []):
                try:
                    ends[i] = rf.read_parts(int(at[i]), key)[1]
                except RecordFormatError as exc:
                    raise RecordFormatError(exc.reason, rf.path, int(at[i]), key) from None
            reach = np.maximum.accumulate(np.maximum(ends, covered))
            before = np.concatenate([[covered], reach[:-1]])
            for g in np.flatnonzero(at > before).tolist():
                _refuse_record_in(rf, idx, int(before[g]), int(at[g]))
            covered = int(reach[-1]) if len(at) else covered
            if len(at):
                release_range(mapping, int(at.min()), covered)
        _refuse_record_in(rf, idx, covered, size)
    finally:
        del words


def _refuse_record_in(rf: RecordFile, idx: str, lo: int, hi: int) -> None:
    """Raise naming the first record that starts between bytes `lo` and `hi` of a .rec."""
    offset = _record_in(rf, lo, hi)
    if offset is not None:
        raise RecordFormatError(
            f"a record starts here that no line of {idx} names (lines lost or deleted): "
            "MXNet would never read it, and `rectool verify` reports it; rebuild the .idx "
            "from the .rec with `rectool reindex`",
            rf.path, offset,
        )  # fmt: skip


def _record_in(rf: RecordFile, lo: int, hi: int) -> int | None:
    """Return the offset of the first record between bytes `lo` and `hi` of a .rec (its magic,
    a part that starts a record, whole, an image header with a key), a window of words at a
    time; None where there is none (damage, which reindex skips too)."""
    mapping = rf.open()
    lo += -lo % 4
    for at in range(lo, hi - 7, 4 * SCAN_WORDS):
        count = (min(hi, at + 4 * SCAN_WORDS + 4) - at) // 4
        w = np.frombuffer(mapping, "<u4", count, at)
        starts = (at + 4 * np.flatnonzero((w[:-1] == MAGIC) & (w[1:] >> LENGTH_BITS <= 1))).tolist()
        del w  # (no view of the mapping may outlive this: it is closed after an error)
        release_range(mapping, at, at + 4 * count)
        for offset in starts:
            try:
                record = rf.read_parts(offset)[0]
            except RecordFormatError:
                continue  # no record: damage
            if len(record) >= IMAGE_HEADER_SIZE and IMAGE_HEADER.unpack_from(record)[2] < 2**63:
                return offset  # (a shorter one, or one of no int64 key: reindex skips it too)
    return None


def insightface_header(
    read: Callable[[int], tuple[Header, bytes]], keys: Ints
) -> tuple[range, range] | None:
    """Return the key ranges (images, identities) that record 0 of an insightface .rec declares.

    Record 0 is that header only with flag 2, no image bytes, and two whole-number labels
    [N + 1, N + 1 + K], 1 <= N + 1 <= N + 1 + K, while key 1 (when N > 0 and it is there) has
    a scalar label, or label vectors (Glint360K's, WebFace42M's) and key N + 1 is the first
    identity record (flag 2, no image bytes, labels [1, end)): keys 1..N are then the images,
    N+1..N+K the identity records (FORMAT-NOTES §5). Else None. `keys` are the .idx's (a
    repeated key: its last line counts, as in MXNet); `read(line)` returns `unpack_header` of
    the record on an .idx line.
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
        # Images with label vectors: insightface's, when an identity record follows them;
        # else an im2rec --pack-label pack whose record 0 happens to look like a header.
        ids = np.flatnonzero(keys == first)
        if end == first or not len(ids):
            return None
        identity, body = read(int(ids[-1]))
        if identity.flag != 2 or len(body) or float(identity.label[0]) != 1.0:
            return None
    return range(1, int(first)), range(int(first), int(end))


def key_lines(keys: Ints, wanted: range, where: str) -> slice | Ints:
    """Return the .idx line of each key in the range `wanted` (a repeated key: its last line)."""
    if wanted.stop - wanted.start > len(keys):  # (no len(): a range past 2**63)
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
def shard_numbers(counts: list[int]) -> NDArray[np.unsignedinteger[Any]]:
    """Return each record's shard number (`counts[s]` records in shard s): a broadcast for one."""
    n = len(counts)
    if n == 1:
        return np.broadcast_to(np.zeros(1, np.uint8), (counts[0],))  # no memory a record
    return np.repeat(np.arange(n, dtype=np.min_scalar_type(n)), counts)


def runs(starts: Ints, counts: Ints) -> Ints:
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


LABEL_CHUNK = 1 << 16  # records whose labels are gathered at once


def header_labels(
    files: list[RecordFile], shard_of: NDArray[Any], offsets: Ints, keys: Ints
) -> NDArray[Any]:
    """Return the header labels of the records at `offsets`, without reading image bytes.

    float32 (N,) when every flag is 0, (N, k) when every record has k labels, else objects.
    Whole, aligned records are gathered with numpy from the mappings; any other is read and
    checked one by one, so damage raises a `RecordFormatError`. A file read by pread (a
    training worker's, `RecordFile.mapped` False) is mapped while its labels are gathered.
    """
    preads = [rf for rf in files if not rf.mapped]
    for rf in preads:
        rf.close()
        rf.mapped = True
    try:
        return _gather_labels(files, shard_of, offsets, keys)
    finally:
        for rf in preads:
            rf.close()
            rf.mapped = False


def _gather_labels(
    files: list[RecordFile], shard_of: NDArray[Any], offsets: Ints, keys: Ints
) -> NDArray[Any]:
    n, columns = len(offsets), []  # columns: (rows, flags, their labels) of fast records
    flags, scalars, fast = np.zeros(n, np.uint32), np.zeros(n, np.float32), np.zeros(n, bool)
    for s, rf in enumerate(files):
        if len(rf.open()) < 32:
            continue
        mapping = rf.open()
        words = np.frombuffer(mapping, "<u4", len(mapping) // 4)
        try:
            # Temporaries of a chunk, not of every record; and the pages a chunk touched are
            # handed back before the next (at most a page a record: 256 MiB), so that RSS
            # never grows with the file.
            for start in range(0, n, LABEL_CHUNK):
                end = min(n, start + LABEL_CHUNK)
                rows: Any = slice(start, end)
                if len(files) > 1:
                    rows = start + np.flatnonzero(shard_of[rows] == s)
                ok, w, head = record_heads(words, len(rf.open()), offsets[rows])
                flag = head[:, 2].astype(np.int64)
                if not ok.all():
                    rows = (np.arange(start, end) if type(rows) is slice else rows)[ok]
                    w, flag, head = w[ok], flag[ok], head[ok]
                fast[rows], flags[rows], scalars[rows] = True, flag, head[:, 3].view(np.float32)
                v = flag > 0  # label vectors: their labels, gathered flat
                if v.any():
                    rows = np.arange(start, end) if type(rows) is slice else rows
                    labels = words[runs(w[v] + 8, flag[v])].view(np.float32)
                    columns.append((rows[v], flag[v], labels))
                if len(w):
                    last = int((4 * w + 32 + 4 * flag).max())
                    release_range(mapping, 4 * int(w.min()), last)
        finally:
            del words
    slow = []
    for row in np.flatnonzero(~fast).tolist():
        rf, offset, key = files[int(shard_of[row])], int(offsets[row]), int(keys[row])
        try:
            header, _ = unpack_header(rf.read_parts(offset, key)[0], rf.path, offset)
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
        flat[runs(starts[rows], counts)] = values
    for row, label in slow:
        flat[starts[row] : starts[row] + len(label)] = label
    out = flat.reshape(n, width) if (flags == width).all() else np.empty(n, object)
    for row, f in enumerate(flags.tolist() if out.dtype == object else []):
        out[row] = flat[starts[row] : starts[row] + f].copy() if f else float(scalars[row])
    out.flags.writeable = False
    return out


def release_pages(mapping: object) -> None:
    """Drop this process's page-table entries of a whole mapping (its pages stay in the page
    cache), so that a scan of a .rec does not count the file in the process's memory."""
    if isinstance(mapping, mmap.mmap):
        release_range(mapping, 0, len(mapping))
