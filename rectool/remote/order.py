"""An epoch order that streams: blocks of shards, shuffled within and across blocks.

A global shuffle (`training.epoch_order`) reads every shard all through the epoch, so a
remote pack would need the whole of it in the cache from the first batch. `block_order`
instead shuffles the shards (a new permutation each epoch), cuts that permutation into blocks
of `block_shards` shards, and shuffles the samples inside each block: the epoch reads one block
after another, every sample once, and needs only a block or two of shards at a time.
docs/remote.md compares its randomness with a global shuffle's.

Like `epoch_order`, it is drawn from PCG64 raw bits seeded by (seed, epoch, ...), stable across
numpy versions, and it is one global order: the same for a seed and epoch whatever the number
of Loader workers; ranks read interleaved positions of it, as `RankSampler`'s.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

from ..training import RankSampler


def _permutation(n: int, *seed: int) -> np.ndarray:
    return np.argsort(np.random.PCG64(list(seed)).random_raw(n), kind="stable")


def block_order(
    shard_of: ArrayLike, epoch: int = 0, seed: int = 0, block_shards: int = 4
) -> np.ndarray:
    """Return the order of the samples (int64) in one epoch, block of shards after block.

    `shard_of[i]` is sample i's shard. The shards are permuted by (seed, epoch), taken
    `block_shards` at a time; each block's samples are shuffled by (seed, epoch, block).
    """
    if epoch < 0 or seed < 0:
        raise ValueError("epoch and seed must be >= 0")
    if block_shards < 1:
        raise ValueError("block_shards must be >= 1")
    shard_of = np.asarray(shard_of)
    shards = int(shard_of.max()) + 1 if len(shard_of) else 0
    by_shard = np.argsort(shard_of, kind="stable")  # samples grouped by shard, in order
    counts = np.bincount(shard_of, minlength=shards)
    starts = np.cumsum(counts) - counts
    permuted = _permutation(shards, seed, epoch, 0)
    blocks = []
    for number, first in enumerate(range(0, shards, block_shards)):
        members = permuted[first : first + block_shards]
        samples = np.concatenate(
            [by_shard[starts[s] : starts[s] + counts[s]] for s in members.tolist()]
        )
        blocks.append(samples[_permutation(len(samples), seed, epoch, 1 + number)])
    return np.concatenate(blocks).astype(np.int64) if blocks else np.zeros(0, np.int64)


def first_uses(shard_of: ArrayLike, order: ArrayLike) -> list[int]:
    """Return the shards in the order `order` (sample indices) first needs them."""
    seen = np.asarray(shard_of)[np.asarray(order, np.int64)]
    _, first = np.unique(seen, return_index=True)
    return seen[np.sort(first)].tolist()


class StreamingSampler(RankSampler):
    """`RankSampler` over `block_order`: the same ranks, padding, `state_dict` and resume.

    `on_order(indices)`, when given, is told each pass's indices before they are read (the
    remote dataset starts prefetching the shards they need in that order).
    """

    def __init__(
        self,
        shard_of: np.ndarray,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        block_shards: int = 4,
        on_order: Callable[[np.ndarray], object] | None = None,
    ) -> None:
        super().__init__(len(shard_of), rank, world_size, shuffle, seed, drop_last)
        self.shard_of, self.block_shards, self.on_order = shard_of, block_shards, on_order

    def global_order(self) -> np.ndarray:
        """Return the epoch's global order (`block_order`), padded or cut to `total`."""
        if self.shuffle:
            order = block_order(self.shard_of, self.epoch, self.seed, self.block_shards)
        else:
            order = np.arange(self.size, dtype=np.int64)
        if self.total <= self.size:
            return order[: self.total]
        return np.resize(order, self.total)

    def indices(self) -> np.ndarray:
        """Return the sample indices this rank reads from `position` to the end of the epoch:
        its positions of `global_order`, as `RankSampler.indices` takes them of its own."""
        start = min(self.position, self.total)
        indices = self.global_order()[start + self.rank :: self.world_size]
        if self.on_order is not None:
            self.on_order(indices)
        return indices
