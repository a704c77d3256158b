"""What is known about a dataset and its shards, worked out once: `DatasetFacts`, `ShardFacts`
(read by `read_shard`), the parsed `.idx` (`ShardIndex`, `read_index`) and the layout found
(`FoundLayout`, `decide_layout`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from ...doors.inputs import open_input
from ...errors import IndexFormatError, RectoolError
from ...format.textindex import parse_index
from ...format.window import RecWindow
from ..scan import (
    Buffer,
    Framing,
    Headers,
    ReadRecord,
    image_formats,
    insightface_ranges,
    read_headers,
    scan_framing,
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
    """A shard's .idx as parsed: `lines[i]` is the line number of (`keys[i]`, `offsets[i]`).

    `bad_lines` holds (line number, its first 80 bytes) of each line that is not
    'key<TAB>offset'; there are some only when the strict parser refused the file and it was
    parsed leniently, as MXNet would.
    """

    path: str
    keys: np.ndarray
    offsets: np.ndarray
    lines: np.ndarray
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
    headers: Headers,
    read_record: ReadRecord,
    classes: int | None,
) -> FoundLayout:
    """Return the `FoundLayout` of records with these keys, starts and headers.

    The rule is the reader's (`scan.insightface_ranges`); a manifest's claim does not change
    it (`check_layout` reports a manifest that disagrees).
    `classes`: the manifest's class count, or None.
    """
    ranges = insightface_ranges(keys, starts, headers, read_record)
    if ranges is None:
        return FoundLayout("images", None, None, np.ones(len(headers), bool), classes)
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
    the image records (sound, non-empty) whose bytes have no known image signature.
    """

    dataset: DatasetFacts
    rec: str
    idx: str
    entry: dict[str, Any] | None
    size: int
    buf: Buffer  # mmap, or b"" for an empty file
    read_record: ReadRecord  # offset -> the record's bytes, split parts rejoined
    index: ShardIndex | None
    framing: Framing
    headers: Headers
    keys: np.ndarray
    indexed: np.ndarray | None
    index_hit: np.ndarray | None
    layout: FoundLayout
    sound: np.ndarray
    unknown_signature: np.ndarray
    window: RecWindow  # what `buf` is the mapping of: `held_rows` reads through it

    @cached_property
    def _offset_order(self) -> np.ndarray:
        assert self.index is not None
        return np.argsort(self.index.offsets, kind="stable")

    def key_at(self, offset: int) -> int | None:
        """Return the key the .idx gives the record starting at `offset` (its last line
        wins), else None."""
        if self.index is None:
            return None
        offsets, order = self.index.offsets, self._offset_order
        at = int(np.searchsorted(offsets, offset, "right", sorter=order)) - 1
        if at < 0 or offsets[order[at]] != offset:
            return None
        return int(self.index.keys[order[at]])


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
    framing = scan_framing(buf, size, None if index is None else index.offsets, window=window)
    starts = framing.starts
    h = _headers_in_batches(window, framing, progress)
    keys = h.id.astype(np.int64)
    indexed = index_hit = None
    if index is not None:
        pos = np.searchsorted(starts, index.offsets)
        index_hit = pos < len(starts)
        index_hit[index_hit] = starts[pos[index_hit]] == index.offsets[index_hit]
        keys[pos[index_hit]] = index.keys[index_hit]  # later lines overwrite earlier ones
        indexed = np.zeros(len(starts), bool)
        indexed[pos[index_hit]] = True
    entry = dataset.entries[number]
    layout = decide_layout(keys, starts, h, read_record, dataset.classes)
    # MXNet's pack zeroes the header's float whenever labels follow it.
    sound = h.complete & ~((h.flag > 0) & (h.label != 0))
    rows = np.flatnonzero(layout.images & sound & (h.image > 0))
    unknown = rows[_unknown_signatures(window, framing, h, rows)]
    return ShardFacts(
        dataset,
        rec,
        idx,
        entry,
        size,
        buf,
        read_record,
        index,
        framing,
        h,
        keys,
        indexed,
        index_hit,
        layout,
        sound,
        unknown,
        window,
    )


def held_rows(window: RecWindow, framing: Framing, rows: np.ndarray) -> Iterator[np.ndarray]:
    """Yield the ascending framing `rows` a window's batch at a time, each batch's bytes held
    in `window` (a record longer than the window: held whole), the last dropped at the end."""
    starts, ends = framing.starts, framing.ends
    try:
        for i, j, lo, hi in window.batches(starts):
            a, b = np.searchsorted(rows, (i, j)).tolist()
            if b > a:
                window.hold(lo, max(hi, int(ends[rows[b - 1]])))
                yield rows[a:b]
    finally:
        window.drop()


def _headers_in_batches(window: RecWindow, framing: Framing, progress: Progress | None) -> Headers:
    """Read the header of every record of `framing`, a window's batch at a time."""
    n, starts, read_at = len(framing.starts), framing.starts, window.record
    empty = read_headers(b"", 0, starts[:0], framing.lengths[:0], framing.split[:0], read_at)
    out = Headers(*(np.zeros(n, c.dtype) for c in vars(empty).values()))  # every row filled
    for rows in held_rows(window, framing, np.arange(n)):
        i, j = int(rows[0]), int(rows[-1]) + 1
        part = read_headers(
            window.mapping,
            window.size,
            starts[i:j],
            framing.lengths[i:j],
            framing.split[i:j],
            window.record,
        )
        for name, column in vars(part).items():
            getattr(out, name)[i:j] = column
        if progress is not None:
            progress("bytes", int(framing.ends[j - 1]), window.size)
    return out


def _unknown_signatures(
    window: RecWindow, framing: Framing, h: Headers, rows: np.ndarray
) -> np.ndarray:
    """Return which of the image records at `rows` have no known image signature (bool)."""
    unknown = np.zeros(len(rows), bool)
    done = 0
    for batch in held_rows(window, framing, rows):
        formats = image_formats(
            window.mapping, window.size, framing.starts, h, framing.split, batch, window.record
        )
        unknown[done : done + len(batch)] = np.equal(formats, None)  # type: ignore[call-overload]
        done += len(batch)
    return unknown


def read_index(idx: str) -> ShardIndex | None:
    """Parse the .idx at `idx`; return its `ShardIndex`, or None when there is none."""
    if not os.path.exists(idx):
        return None
    try:
        with open_input(idx, "index file") as f:
            data = f.read()
    except OSError as exc:
        raise RectoolError(f"{idx}: cannot read ({exc.strerror or exc})") from None
    try:
        keys, offsets = parse_index(data, idx)
    except IndexFormatError:
        return _parse_index_leniently(idx, data)
    return ShardIndex(idx, keys, offsets, np.arange(1, len(keys) + 1))


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
