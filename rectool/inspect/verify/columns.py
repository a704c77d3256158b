"""The numpy columns verify keeps of a shard's records, in as few bytes a record as they take:
`Records` (what the framing walk found), `HeaderColumns` (the image headers), `LineNumbers`
(an .idx's line numbers, computed), `SparseColumn` (a column a few records fill), and the
chunks of rows a check over every record computes its temporaries in (`chunks`,
`flatnonzero_chunked`).

A column that holds one value for every record is a broadcast of it (`one_value`), not a
column: the memory verify holds grows with the records by what they differ in (issue 37).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...reader import IMAGE_HEADER_SIZE
from ..scan import Damage, Framing

# A check over every record computes its temporaries this many rows at a time.
CHUNK_ROWS = 1 << 18


def chunks(n: int, rows: int | None = None) -> Iterator[tuple[int, int]]:
    """Yield (lo, hi) over 0..n, `CHUNK_ROWS` (or `rows`) at a time: a check over every
    record computes its temporaries a chunk at a time."""
    step = rows or CHUNK_ROWS
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def flatnonzero_chunked(n: int, mask_of: Callable[[int, int], np.ndarray]) -> np.ndarray:
    """Return the rows 0..n where `mask_of(lo, hi)` (the mask of rows lo..hi) is True,
    computing it a chunk at a time."""
    found = [lo + np.flatnonzero(mask_of(lo, hi)) for lo, hi in chunks(n)]
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def one_value(column: np.ndarray) -> np.ndarray:
    """Return `column` as a broadcast of its one value when it holds one (else itself)."""
    if len(column) and not column.dtype.kind == "f" and bool((column == column[0]).all()):
        return np.broadcast_to(column[:1], column.shape)
    return column


class LineNumbers:
    """The .idx line numbers of a strictly parsed index's entries: entry i is on line i + 1
    (computed where asked: no column of a line number a record)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, at: Any) -> Any:
        if isinstance(at, (int, np.integer)):
            if not -self.count <= at < self.count:
                raise IndexError(f"line {at} of {self.count}")
            return int(at) % self.count + 1
        return np.arange(1, self.count + 1)[at]


@dataclass(frozen=True, eq=False)
class Records:
    """The records a framing walk found (`scan.Framing`), kept in as few bytes a record as it
    takes: `starts` (int64; the .idx's own offsets column when they are the same), `lengths`
    (uint32 where they fit), `split` (a broadcast False when no record is split), `damage`
    and `bad_padding` as the walk found them. `ends[j]` is computed where asked (a record
    ends, padding included, where its length says; a split record where its last part does).
    """

    size: int
    starts: np.ndarray
    lengths: np.ndarray
    split: np.ndarray
    damage: list[Damage]
    bad_padding: list[tuple[int, int]]
    split_rows: np.ndarray  # ascending rows of the split records
    split_ends: np.ndarray  # their ends

    @classmethod
    def of(cls, framing: Framing, offsets: np.ndarray | None) -> Records:
        """Return the `Records` of `framing`; `offsets`, the .idx's, replace `starts` when
        they are the same numbers in the same order (one column, not two)."""
        starts, lengths, split = framing.starts, framing.lengths, framing.split
        if (
            offsets is not None
            and starts is not offsets
            and len(offsets) == len(starts)
            and np.array_equal(offsets, starts)
        ):
            starts = offsets
        if not len(lengths) or int(lengths.max()) < 1 << 32:
            lengths = lengths.astype(np.uint32)
        split_rows = np.flatnonzero(split)
        split_ends = framing.ends[split_rows]
        if not len(split_rows):
            split = np.broadcast_to(np.False_, split.shape)
        return cls(
            framing.size,
            starts,
            lengths,
            split,
            framing.damage,
            framing.bad_padding,
            split_rows,
            split_ends,
        )

    @property
    def ends(self) -> RecordEnds:
        """Where each record ends, padding included (`ends[j]`, `ends[rows]`)."""
        return RecordEnds(self)


class RecordEnds:
    """`Records.ends`: each record's end, computed from its start and length where asked."""

    def __init__(self, records: Records) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records.starts)

    def __getitem__(self, at: Any) -> Any:
        r = self.records
        if isinstance(at, (int, np.integer)):
            j = int(at) % len(r.starts) if at < 0 else int(at)
            if r.split[j]:
                return int(r.split_ends[np.searchsorted(r.split_rows, j)])
            return int(r.starts[j]) + 8 + ((int(r.lengths[j]) + 3) & ~3)
        rows = np.arange(len(r.starts))[at] if isinstance(at, slice) else np.asarray(at)
        ends = r.starts[rows] + 8 + ((r.lengths[rows].astype(np.int64) + 3) & ~3)
        if len(r.split_rows):
            where = np.searchsorted(r.split_rows, rows)
            hit = where < len(r.split_rows)
            hit[hit] = r.split_rows[where[hit]] == rows[hit]
            ends[hit] = r.split_ends[where[hit]]
        return ends


class SparseColumn:
    """A column of `n` values, all `fill` but at the ascending `rows` (`values`): indexed
    as an array is (a row, a slice, rows), what is given back being a scalar or a new
    array. What a few records hold (insightface's identity records' flags and label pairs)
    costs a few bytes a record that holds it, not every record."""

    def __init__(self, n: int, rows: np.ndarray, values: np.ndarray, fill: Any) -> None:
        self.n, self.rows, self.values = n, rows, values
        self.fill = values.dtype.type(fill)

    def __len__(self) -> int:
        return self.n

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.values.dtype

    def __getitem__(self, at: Any) -> Any:
        if isinstance(at, (int, np.integer)):
            j = int(at) + (self.n if at < 0 else 0)
            if not 0 <= j < self.n:
                raise IndexError(f"row {at} of {self.n}")
            k = int(np.searchsorted(self.rows, j))
            return self.values[k] if k < len(self.rows) and self.rows[k] == j else self.fill
        wanted: np.ndarray = np.arange(self.n)[at] if isinstance(at, slice) else np.asarray(at)
        if wanted.dtype == bool:
            wanted = np.flatnonzero(wanted)
        out = np.full(wanted.shape, self.fill, self.values.dtype)
        if len(self.rows):
            where: np.ndarray = np.searchsorted(self.rows, wanted)
            where = np.minimum(where, len(self.rows) - 1)
            hit = self.rows[where] == wanted
            out[hit] = self.values[where[hit]]
        return out


class ColumnBuilder:
    """Build a column of `n` values a batch of rows at a time: rows that are not `fill`
    kept sparse while they are few (a `SparseColumn`), a dense array once they are not
    (a quarter of the rows), nothing at all when there are none (a broadcast of `fill`)."""

    def __init__(self, n: int, dtype: Any, fill: Any) -> None:
        self.n, self.dtype, self.fill = n, np.dtype(dtype), fill
        self.rows: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.count = 0
        self.dense: np.ndarray | None = None

    def put(self, i: int, values: np.ndarray) -> None:
        """Take the values of rows i..i+len(values)."""
        if self.dense is not None:
            self.dense[i : i + len(values)] = values
            return
        same = np.isnan(values) if np.isnan(self.fill) else values == self.fill
        rows = np.flatnonzero(~same)
        if not len(rows):
            return
        self.rows.append(i + rows)
        self.values.append(values[rows].astype(self.dtype))
        self.count += len(rows)
        if self.count > self.n // 4:
            self.dense = np.full(self.n, self.fill, self.dtype)
            for r, v in zip(self.rows, self.values):
                self.dense[r] = v
            self.rows, self.values = [], []

    def column(self) -> np.ndarray | SparseColumn:
        if self.dense is not None:
            return self.dense
        if not self.count:
            return np.broadcast_to(self.dtype.type(self.fill), (self.n,))
        return SparseColumn(
            self.n, np.concatenate(self.rows), np.concatenate(self.values), self.fill
        )


@dataclass(frozen=True, eq=False)
class HeaderColumns:
    """The image headers of a shard's records, as the columns the checks need (`scan.Headers`
    less what is read again where a problem names it: a column that holds one value for
    every record is a broadcast of it, not a column).

    `complete` is False where the record is too short for its header and the labels the
    header announces; `flag` and `label0`/`label1` (the first two labels: the header's float
    when flag is 0; NaN where absent) are then meaningless. `image_of(rows)` is the image
    length in bytes.
    """

    complete: np.ndarray
    flag: np.ndarray | SparseColumn
    label0: np.ndarray
    label1: np.ndarray | SparseColumn
    lengths: np.ndarray  # of the records (`Records.lengths`)

    def __len__(self) -> int:
        return len(self.complete)

    def image_of(self, rows: Any) -> np.ndarray:
        """Return the image bytes of the records at `rows` (0 where the header is incomplete)."""
        need = IMAGE_HEADER_SIZE + 4 * self.flag[rows].astype(np.int64)
        return np.where(self.complete[rows], self.lengths[rows].astype(np.int64) - need, 0)
