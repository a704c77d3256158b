"""Record keys: which .idx line a repeated key keeps, and how far float32 holds keys exactly."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

# float32 holds every integer up to 2**24 exactly, and no further: insightface labels (record
# 0's key range, each identity's [start, end)) are float32.
FLOAT32_EXACT = 2**24


def last_line_wins(keys: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep one .idx entry per key, its last line, as MXNet's reader does; keep file order."""
    _, last = np.unique(keys[::-1], return_index=True)
    keep = np.sort(len(keys) - 1 - last)
    return keys[keep], offsets[keep]


def shared_offsets(
    keys: ArrayLike, offsets: ArrayLike, groups: ArrayLike | None = None
) -> tuple[int, int | None, int | None]:
    """Return (count, group, offset): how many record offsets more than one distinct key
    names, and the first of them (by group, then offset); (0, None, None) when none is.

    `groups`, when given, is the shard of each entry: an offset is shared within a shard.
    Each record has one key: many keys naming one record are a finding for `verify` and a
    refusal for commands that would do work per key (`unpack`, `repack`), never a loop.
    """
    keys, offsets = np.asarray(keys), np.asarray(offsets)
    groups = np.zeros(len(offsets), np.int64) if groups is None else np.asarray(groups)
    step, hop = np.diff(offsets), np.diff(groups)
    if np.all((hop > 0) | ((hop == 0) & (step > 0))):
        return 0, None, None  # records in file order, as packs write them: no sort needed
    order = np.lexsort((keys, offsets, groups))
    so, sk, sg = offsets[order], keys[order], groups[order]
    same_record = (so[1:] == so[:-1]) & (sg[1:] == sg[:-1])
    shared = np.flatnonzero(same_record & (sk[1:] != sk[:-1]))
    if not len(shared):
        return 0, None, None
    record = np.concatenate(([0], np.cumsum(~same_record)))  # a number per (group, offset)
    first = int(shared[0])
    return len(np.unique(record[shared])), sg[first].item(), so[first].item()


def refuse_shared_offsets(
    idx_path: str, keys: ArrayLike, offsets: ArrayLike, command: str, shown: int = 5
) -> None:
    """Raise `RectoolError` when keys of `idx_path` share a record offset, naming keys and
    offset: `command` would otherwise handle that one record once per key."""
    from ..errors import RectoolError

    keys, offsets = np.asarray(keys), np.asarray(offsets)
    count, _, offset = shared_offsets(keys, offsets)
    if not count:
        return
    named = np.unique(keys[offsets == offset])
    listed = ", ".join(str(k) for k in named[:shown].tolist())
    more = f" and {len(named) - shown:,} more" if len(named) > shown else ""
    others = f" ({count - 1:,} other offsets too)" if count > 1 else ""
    raise RectoolError(
        f"{idx_path}: byte offset {offset} is named by {len(named):,} keys ({listed}{more})"
        f"{others}; each record has one key, so {command} refuses this index "
        "(`rectool verify` lists every shared offset)"
    )
