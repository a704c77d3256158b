"""The text index checks: the .idx parses, it fits the .rec, and no key is in two shards.

(The binary index of format 3 is checked against them in `binary`.)"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import RectoolError
from .columns import chunks
from .facts import ShardFacts, ShardIndex, read_index
from .report import Found, ProblemAt, one_problem


def check_index_file(facts: ShardFacts) -> Iterator[Found]:
    """The .idx exists and every line parses."""
    idx, index = facts.idx, facts.index
    if index is None:
        kind = "missing-file" if facts.entry is not None else "missing-index"
        yield one_problem(
            kind, idx, None, None, f"no index; rebuild it with `rectool reindex {facts.rec}`"
        )
        return
    yield Found(
        "index-syntax",
        len(index.bad_lines),
        (
            (
                idx,
                None,
                None,
                f"line {number}: expected 'key<TAB>offset' with integers, got {raw!r}",
            )
            for number, raw in index.bad_lines
        ),
    )


def check_index(facts: ShardFacts) -> Iterator[Found]:
    """The .idx fits the .rec: every offset a record start, every record indexed, keys unique."""
    if facts.index is None:
        return
    index, idx = facts.index, facts.idx
    index_hit, indexed = facts.index_hit, facts.indexed
    assert index_hit is not None and indexed is not None  # they are when the index is
    keys, offsets, lines = index.keys, index.offsets, index.lines
    starts, ends = facts.framing.starts, facts.framing.ends
    damage_starts = {d.start for d in facts.framing.damage}

    miss = [i for i in np.flatnonzero(~index_hit).tolist() if int(offsets[i]) not in damage_starts]
    yield Found(
        "index-offset",
        len(miss),
        (
            (
                idx,
                keys[i],
                int(offsets[i]),
                f"line {lines[i]}: {_describe_offset(facts, int(offsets[i]))}",
            )
            for i in miss
        ),
    )

    unindexed = np.flatnonzero(~indexed)
    if not len(keys) and len(unindexed):
        yield one_problem(
            "empty-index",
            idx,
            None,
            None,
            f"no lines, but {os.path.basename(facts.rec)} holds {len(unindexed)} records; "
            f"rebuild it with `rectool reindex {facts.rec} --overwrite`",
        )
        unindexed = unindexed[:0]

    def unindexed_problems() -> Iterator[ProblemAt]:
        for j in unindexed.tolist():
            header = facts.header(j) if facts.headers.complete[j] else None
            header_id = None if header is None else int(header.id)
            named = f" (header id {header_id})" if header_id is not None else ""
            yield (
                facts.rec,
                header_id,
                starts[j],
                f"the record at byte {starts[j]}{named}, {ends[j] - starts[j]} bytes, "
                f"is not in {os.path.basename(idx)}",
            )

    yield Found("unindexed-record", len(unindexed), unindexed_problems())

    # Keys and offsets as a pack writes them (rising) repeat none: no sorted copy is made.
    order = np.arange(0) if rising(keys) else np.argsort(keys, kind="stable")
    sk = keys[order]
    repeated = np.flatnonzero(sk[1:] == sk[:-1]) + 1

    def duplicate_problems() -> Iterator[ProblemAt]:
        for i in repeated.tolist():
            first, again = order[i - 1], order[i]
            yield (
                idx,
                keys[again],
                offsets[again],
                f"line {lines[again]} repeats the key of line {lines[first]} "
                f"(offsets {offsets[first]} and {offsets[again]}); readers keep the last",
            )

    yield Found("duplicate-key", len(repeated), duplicate_problems())

    order = np.arange(0) if rising(offsets) else np.argsort(offsets, kind="stable")
    so = offsets[order]
    shared = np.flatnonzero(so[1:] == so[:-1]) + 1
    shared = shared[keys[order[shared]] != keys[order[shared - 1]]].tolist()  # no loop per line

    def shared_problems() -> Iterator[ProblemAt]:
        for i in shared:
            first, again = order[i - 1], order[i]
            yield (
                idx,
                keys[again],
                offsets[again],
                f"line {lines[again]} points at the same record as line {lines[first]} "
                f"(key {keys[first]})",
            )

    yield Found("duplicate-offset", len(shared), shared_problems())


def _describe_offset(facts: ShardFacts, offset: int) -> str:
    starts, ends, size = facts.framing.starts, facts.framing.ends, facts.size
    if offset >= size:
        return f"offset {offset} is past the end of the file ({size} bytes)"
    j = int(np.searchsorted(starts, offset, side="right")) - 1
    if j >= 0 and offset < ends[j]:
        key = int(facts.keys[j])
        return (
            f"offset {offset} is inside the record at byte {starts[j]} (key {key}), "
            "not at a record start"
        )
    for d in facts.framing.damage:
        if d.start <= offset < d.end:
            return f"offset {offset} is inside unreadable bytes {d.start}..{d.end}"
    return f"offset {offset} is not a record start"


@dataclass(frozen=True, eq=False)
class ShardKeys:
    """What the dataset's key check keeps of a shard's .idx once the shard is checked: its
    path and keys (8 bytes a record; the offset a problem names is read again)."""

    path: str
    keys: np.ndarray

    @classmethod
    def of(cls, index: ShardIndex) -> ShardKeys:
        return cls(index.path, index.keys)


def check_keys_across_shards(indexes: Sequence[ShardIndex | ShardKeys]) -> Iterator[Found]:
    """No key is in two shards' .idx (`indexes`: the `ShardIndex`, or the `ShardKeys`, of
    each shard that has one)."""
    if len(indexes) < 2:
        return
    spans = [(int(i.keys[0]), int(i.keys[-1])) for i in indexes if len(i.keys)]
    if all(rising(i.keys) for i in indexes) and all(
        a[1] < b[0] for a, b in zip(sorted(spans), sorted(spans)[1:])
    ):
        return  # each shard's keys rising, the shards' ranges apart: no key in two
    keys = np.concatenate([i.keys for i in indexes])
    bounds = np.cumsum([0, *(len(i.keys) for i in indexes)])
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    ss = np.searchsorted(bounds, order, "right") - 1  # the shard of each
    clash = np.flatnonzero((sk[1:] == sk[:-1]) & (ss[1:] != ss[:-1]))
    del sk

    def problems() -> Iterator[ProblemAt]:
        offsets: dict[int, np.ndarray] = {}  # shard -> its .idx offsets, read again
        for i in clash.tolist():
            a, b = int(order[i]), int(order[i + 1])
            sa, sb = int(ss[i]), int(ss[i + 1])
            first, second = indexes[sa], indexes[sb]
            line_a, line_b = a - int(bounds[sa]) + 1, b - int(bounds[sb]) + 1
            if sb not in offsets:
                offsets[sb] = _offsets_of(second)
            yield (
                second.path,
                keys[b],
                offsets[sb][line_b - 1],
                f"key {keys[b]} is also in {first.path} (line {line_a}); "
                "keys must be unique across a dataset's shards",
            )

    yield Found("duplicate-key", len(clash), problems())


def _offsets_of(index: ShardIndex | ShardKeys) -> np.ndarray:
    """Return the .idx offsets of `index` (read again for `ShardKeys`)."""
    if isinstance(index, ShardIndex):
        return index.offsets
    again = read_index(index.path)
    if again is None or len(again.keys) != len(index.keys):
        raise RectoolError(f"{index.path}: changed while the dataset was verified")
    return again.offsets


def rising(values: np.ndarray) -> bool:
    """Return True when `values` rise strictly (each above the one before), a chunk at a time."""
    return all(
        bool((values[lo + 1 : hi] > values[lo : hi - 1]).all()) for lo, hi in chunks(len(values))
    ) and all(values[hi - 1] < values[hi] for _, hi in chunks(len(values)) if hi < len(values))
