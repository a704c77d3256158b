"""What is known about a dataset and its shards, worked out once: `DatasetFacts`, `ShardFacts`
(read by `read_shard`), the parsed `.idx` (`ShardIndex`, `read_index`) and the layout found
(`FoundLayout`, `decide_layout`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ...doors.inputs import open_input
from ...errors import IndexFormatError, RectoolError
from ...format.headers import Header, peek_header
from ...format.textindex import parse_index_stream
from ...format.window import RecWindow, ascending
from ..scan import (
    Buffer,
    Headers,
    ReadRecord,
    image_formats,
    insightface_ranges,
    read_headers,
    scan_framing,
)
from .columns import (
    ColumnBuilder,
    HeaderColumns,
    LineNumbers,
    Records,
    chunks,
    flatnonzero_chunked,
    one_value,
)

if TYPE_CHECKING:
    from _typeshed import StrPath

# `progress(phase, done, total)`: "bytes" of a shard read, "images" checked.
Progress = Callable[[str, int, int], object]


@dataclass(frozen=True)
class DatasetFacts:
    """A dataset's manifest (or None) and shards; `entries[n]` is shard n's manifest entry.

    `entries` are all None when there is no manifest or it lists another number of shards.
    """

    manifest: dict[str, Any] | None
    manifest_path: str | None
    shards: Sequence[tuple[str, str]]  # of (rec, idx)
    entries: list[dict[str, Any] | None]
    classes: int | None

    @classmethod
    def of(
        cls,
        manifest: dict[str, Any] | None,
        manifest_path: str | None,
        shards: Sequence[tuple[str, str]],
    ) -> DatasetFacts:
        entries = (manifest or {}).get("shards") or []
        if len(entries) != len(shards):
            entries = [None] * len(shards)
        return cls(manifest, manifest_path, shards, entries, (manifest or {}).get("classes"))


@dataclass(frozen=True, eq=False)
class ShardIndex:
    """A shard's .idx as parsed: `lines[i]` is the line number of (`keys[i]`, `offsets[i]`)
    (a `LineNumbers` when every line parsed: line i + 1).

    `bad_lines` holds (line number, its first 80 bytes) of each line that is not
    'key<TAB>offset'; there are some only when the strict parser refused the file and it was
    parsed leniently, as MXNet would.
    """

    path: str
    keys: np.ndarray
    offsets: np.ndarray
    lines: np.ndarray | LineNumbers
    bad_lines: tuple[tuple[int, bytes], ...] = ()


@dataclass(frozen=True, eq=False)
class FoundLayout:
    """How a shard's records are found laid out (what `packer.layout.Layout` wrote): `name` is
    "images" or "insightface".

    For insightface, `header` is record 0's row and `span` its label (a, b): images are keys
    1..a-1, identities keys a..b-1. `images` marks the records that hold images; `classes` is
    the class count labels must stay below (the manifest's, or the identities record 0
    announces), or None when unknown.
    """

    name: str
    header: int | None
    span: tuple[int, int] | None
    images: np.ndarray
    classes: int | None


def decide_layout(
    keys: np.ndarray,
    starts: np.ndarray,
    headers: Headers | HeaderColumns,
    read_record: ReadRecord,
    classes: int | None,
) -> FoundLayout:
    """Return the `FoundLayout` of records with these keys, starts and headers.

    The rule is the reader's (`scan.insightface_ranges`); a manifest's claim does not change
    it (`check_layout` reports a manifest that disagrees).
    `classes`: the manifest's class count, or None.
    """
    # `insightface_ranges` reads `complete` and `flag`, which both kinds of headers have.
    ranges = insightface_ranges(keys, starts, cast(Headers, headers), read_record)
    if ranges is None:
        every = np.broadcast_to(np.True_, (len(headers),))  # every record: no column
        return FoundLayout("images", None, None, every, classes)
    a, b = ranges[1].start, ranges[1].stop
    header = int(np.flatnonzero(keys == 0)[-1])
    return FoundLayout("insightface", header, (a, b), ~((keys == 0) | (keys >= a)), b - a)


@dataclass(frozen=True, eq=False)
class ShardFacts:
    """What is known about one .rec/.idx pair, worked out once by `read_shard`.

    `buf` (the mapped .rec, `size` bytes) and `read_record(offset)` are valid while the shard
    is open; a check that reads many records reads them through `held_rows` (a window's
    batch at a time). Arrays are per record found by the framing walk, in file order: `keys`
    is each record's key (from the .idx, its last line winning; else its header id),
    `indexed` whether an .idx line points at it; `index_hit[i]` whether .idx line i points
    at a record. `sound` marks complete headers with no stray label; `unknown_signature`
    the image records (sound, non-empty) whose bytes have no known image signature, and
    `id_mismatch` the records an .idx line points at whose header id is not its key.

    What is kept is numpy columns of a few bytes a record (`Records`, `HeaderColumns`; a
    column of one value is a broadcast); a check walks them `CHUNK_ROWS` rows at a time, so
    its temporaries are bounded too. What a problem names and no column holds (a header's
    id or float) is read again from its record (`header`).
    """

    dataset: DatasetFacts
    rec: str
    idx: str
    entry: dict[str, Any] | None
    size: int
    buf: Buffer  # mmap, or b"" for an empty file
    read_record: ReadRecord  # offset -> the record's bytes, split parts rejoined
    index: ShardIndex | None
    framing: Records
    headers: HeaderColumns
    keys: np.ndarray
    indexed: np.ndarray | None
    index_hit: np.ndarray | None
    layout: FoundLayout
    sound: np.ndarray
    unknown_signature: np.ndarray
    id_mismatch: np.ndarray
    window: RecWindow  # what `buf` is the mapping of: `held_rows` reads through it

    @cached_property
    def _offset_order(self) -> np.ndarray | None:
        assert self.index is not None
        return ascending(self.index.offsets)

    def key_at(self, offset: int) -> int | None:
        """Return the key the .idx gives the record starting at `offset` (its last line
        wins), else None."""
        if self.index is None:
            return None
        offsets, order = self.index.offsets, self._offset_order
        at = int(np.searchsorted(offsets, offset, "right", sorter=order)) - 1
        line = at if order is None or at < 0 else int(order[at])
        if at < 0 or offsets[line] != offset:
            return None
        return int(self.index.keys[line])

    def header(self, row: int) -> Header | None:
        """Return the image header of the record at framing `row` (None when the record is
        shorter than one), read again from the record."""
        found = peek_header(self.read_record(int(self.framing.starts[row])))
        return None if found is None else found[0]


def read_shard(
    dataset: DatasetFacts, number: int, window: RecWindow, progress: Progress | None = None
) -> ShardFacts:
    """Return the `ShardFacts` of shard `number`, whose .rec is read through `window`.

    The framing, headers and image signatures are read a window's batch of records at a
    time (each batch's pages handed back as the next is taken); what is kept is numpy
    columns. `progress(phase, done, total)` hears of the "bytes" read (through the last
    record of each batch, out of the file's size). Raises `RectoolError`
    when the .idx exists but cannot be read.
    """
    rec, idx = dataset.shards[number]
    buf, size, read_record = window.mapping, window.size, window.record
    index = read_index(idx)
    offsets = None if index is None else index.offsets
    records = Records.of(scan_framing(buf, size, offsets, window=window), offsets)
    starts, n = records.starts, len(records.starts)
    indexed = index_hit = None
    # The .idx's lines are the records, one each, in order: its keys are theirs.
    same = index is not None and starts is index.offsets
    keys = index.keys if index is not None and same else np.zeros(n, np.int64)
    h, sound, differ = _headers_in_batches(window, records, keys, same, progress)
    if index is not None and same:
        indexed = index_hit = np.broadcast_to(np.True_, (n,))
    elif index is not None:
        pos = np.searchsorted(starts, index.offsets)
        index_hit = pos < len(starts)
        index_hit[index_hit] = starts[pos[index_hit]] == index.offsets[index_hit]
        ids = keys.copy()  # the header ids, read into `keys`
        keys[pos[index_hit]] = index.keys[index_hit]  # later lines overwrite earlier ones
        hits = np.zeros(len(starts), bool)
        hits[pos[index_hit]] = True
        del pos
        differ = flatnonzero_chunked(
            n, lambda lo, hi: hits[lo:hi] & h.complete[lo:hi] & (ids[lo:hi] != keys[lo:hi])
        )
        del ids
        index_hit, indexed = one_value(index_hit), one_value(hits)
    entry = dataset.entries[number]
    layout = decide_layout(keys, starts, cast(Headers, h), read_record, dataset.classes)
    unknown = _unknown_signatures(window, records, h, layout, sound)
    return ShardFacts(
        dataset,
        rec,
        idx,
        entry,
        size,
        buf,
        read_record,
        index,
        records,
        h,
        keys,
        indexed,
        index_hit,
        layout,
        sound,
        unknown,
        differ,
        window,
    )


def held_rows(window: RecWindow, framing: Records, rows: np.ndarray) -> Iterator[np.ndarray]:
    """Yield the ascending framing `rows` a window's batch at a time, each batch's bytes held
    in `window` (a record longer than the window: held whole), the last dropped at the end."""
    starts, ends = framing.starts, framing.ends
    if not len(rows):
        return
    try:
        # Only the batches from the first row's on: a chunk of rows takes its own.
        first = int(rows[0])
        for i, j, lo, hi in window.batches(starts[first:]):
            i, j = i + first, j + first
            a, b = np.searchsorted(rows, (i, j)).tolist()
            if b > a:
                window.hold(lo, max(hi, int(ends[rows[b - 1]])))
                yield rows[a:b]
            if b >= len(rows):
                break
    finally:
        window.drop()


def _headers_in_batches(
    window: RecWindow,
    framing: Records,
    keys: np.ndarray,
    same: bool,
    progress: Progress | None,
) -> tuple[HeaderColumns, np.ndarray, np.ndarray]:
    """Read the header of every record of `framing`, a window's batch at a time; return
    (its `HeaderColumns`, `sound`, the rows whose header id is not their key).

    `keys` are the .idx's keys of the records when `same` (ids are compared with them a
    batch at a time); else the header ids are written into `keys`, for the caller to
    compare and overwrite with the .idx's.
    """
    n, starts, read_at = len(framing.starts), framing.starts, window.record
    complete, sound = np.zeros(n, bool), np.zeros(n, bool)
    label0 = np.full(n, np.nan, np.float32)
    # Most records have no labels after their header, or (insightface) a few have two.
    flag, label1 = ColumnBuilder(n, np.uint32, 0), ColumnBuilder(n, np.float32, np.nan)
    differ: list[np.ndarray] = []
    batches = (b for lo, hi in chunks(n) for b in held_rows(window, framing, np.arange(lo, hi)))
    for rows in batches:  # (a chunk's rows at a time: no row number a record)
        i, j = int(rows[0]), int(rows[-1]) + 1
        part = read_headers(
            window.mapping,
            window.size,
            starts[i:j],
            framing.lengths[i:j],
            framing.split[i:j],
            read_at,
        )
        complete[i:j], label0[i:j] = part.complete, part.label0
        # MXNet's pack zeroes the header's float whenever labels follow it.
        sound[i:j] = part.complete & ~((part.flag > 0) & (part.label != 0))
        flag.put(i, part.flag)
        label1.put(i, part.label1)
        ids = part.id.astype(np.int64)
        if same:
            differ.append(i + np.flatnonzero(part.complete & (ids != keys[i:j])))
        else:
            keys[i:j] = ids
        if progress is not None:
            progress("bytes", int(framing.ends[j - 1]), window.size)
    columns = HeaderColumns(
        one_value(complete), flag.column(), label0, label1.column(), framing.lengths
    )
    found = np.concatenate(differ) if differ else np.zeros(0, np.int64)
    return columns, one_value(sound), found


def _unknown_signatures(
    window: RecWindow, framing: Records, h: HeaderColumns, layout: FoundLayout, sound: np.ndarray
) -> np.ndarray:
    """Return the image records (sound, non-empty) whose bytes have no known image
    signature (ascending rows), a chunk of rows at a time."""
    found: list[np.ndarray] = []
    for lo, hi in chunks(len(framing.starts)):
        mask = layout.images[lo:hi] & sound[lo:hi]
        rows = lo + np.flatnonzero(mask & (h.image_of(slice(lo, hi)) > 0))
        for batch in held_rows(window, framing, rows):
            formats = image_formats(
                window.mapping,
                window.size,
                framing.starts,
                cast(Headers, _BatchHeaders(h, batch)),
                framing.split,
                batch,
                window.record,
            )
            found.append(batch[np.equal(formats, None)])  # type: ignore[call-overload]
    return np.concatenate(found) if found else np.zeros(0, np.int64)


class _BatchHeaders:
    """What `scan.image_formats` reads of the headers of a batch's rows (`flag`, `image`),
    indexed by framing row as a `Headers` is."""

    def __init__(self, h: HeaderColumns, rows: np.ndarray) -> None:
        self.flag = _RowColumn(rows, h.flag[rows])
        self.image = _RowColumn(rows, h.image_of(rows))


class _RowColumn:
    """A column known at some framing rows only, indexed by framing row."""

    def __init__(self, rows: np.ndarray, values: np.ndarray) -> None:
        self.rows, self.values = rows, values

    def __getitem__(self, at: Any) -> Any:
        return self.values[np.searchsorted(self.rows, at)]


def read_index(idx: str) -> ShardIndex | None:
    """Parse the .idx at `idx`; return its `ShardIndex`, or None when there is none.

    The text is parsed a block at a time (`parse_index_stream`): what is kept is the two
    columns. A file the strict parser refuses is read whole and parsed as MXNet would.
    """
    if not os.path.exists(idx):
        return None
    try:
        with open_input(idx, "index file") as f:
            try:
                keys, offsets = parse_index_stream(f, idx)
            except IndexFormatError:
                f.seek(0)
                return _parse_index_leniently(idx, f.read())
    except OSError as exc:
        raise RectoolError(f"{idx}: cannot read ({exc.strerror or exc})") from None
    return ShardIndex(idx, keys, offsets, LineNumbers(len(keys)))


def _parse_index_leniently(idx: str, data: bytes) -> ShardIndex:
    """Parse what can be parsed, as MXNet would (`int()` of two tab-separated fields)."""
    keys: list[int] = []
    offsets: list[int] = []
    lines: list[int] = []
    bad: list[tuple[int, bytes]] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw and number > data.count(b"\n"):
            break  # the empty remainder after the final newline
        fields = raw.strip().split(b"\t")
        try:
            key, offset = int(fields[0]), int(fields[1])
            if offset < 0 or not (-(2**63) <= key < 2**63) or offset >= 2**63:
                raise ValueError
        except (ValueError, IndexError):
            bad.append((number, raw[:80]))
            continue
        keys.append(key)
        offsets.append(offset)
        lines.append(number)
    return ShardIndex(
        idx,
        np.array(keys, np.int64),
        np.array(offsets, np.int64),
        np.array(lines),
        tuple(bad),
    )


def size_or_zero(path: StrPath) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
