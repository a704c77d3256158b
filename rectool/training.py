"""What training code needs only sometimes: epoch orders, rank views, background prefetch.

Standard library and numpy only, like the reader: `rectool reader --training -o FILE` copies
this module verbatim beside it.

    sampler = RankSampler(len(ds), rank, world_size, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=256, sampler=sampler, num_workers=8)
    for batch in prefetch(loader, depth=2): ...
"""

from __future__ import annotations

import queue
import threading

import numpy as np

__all__ = ["Prefetcher", "RankSampler", "epoch_order", "prefetch"]


# --- sampling: epochs, ranks, resuming ---------------------------------------------------------


def epoch_order(size, epoch=0, seed=0, shuffle=True):
    """Return the order of all `size` samples in one epoch (int64), the same on every rank.

    Shuffled from PCG64 raw bits seeded by (seed, epoch), whose stream numpy keeps stable
    across versions, so a run resumed elsewhere sees the same order.
    """
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    if epoch < 0 or seed < 0:
        raise ValueError("epoch and seed must be >= 0")
    bits = np.random.PCG64([seed, epoch]).random_raw(size)
    return np.argsort(bits, kind="stable").astype(np.int64)


class RankSampler:
    """The samples one rank reads in an epoch: an equal share of one global order.

    Every epoch has one global order (`epoch_order`), independent of the number of ranks,
    cut to a multiple of `world_size` (`drop_last=True`) or padded by repeating its start.
    Rank r reads positions r, r + world_size, ... of it, so every rank gets the same count.
    `state_dict()` says how far the epoch got (`epoch`, `position` in the global order);
    `load_state_dict()` resumes there, on any number of ranks. Use as a DataLoader `sampler`.
    """

    def __init__(self, size, rank=0, world_size=1, shuffle=True, seed=0, drop_last=False):
        size = size if isinstance(size, int) else len(size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.position = 0  # where in the epoch's global order this view starts
        self._yielded = 0

    def __repr__(self):
        return (
            f"RankSampler(size={self.size}, rank={self.rank}, world_size={self.world_size}, "
            f"epoch={self.epoch}, position={self.position})"
        )

    @property
    def total(self):
        """Return the length of an epoch's global order after padding or dropping."""
        w = self.world_size
        return self.size // w * w if self.drop_last else -(-self.size // w) * w

    def set_epoch(self, epoch):
        """Start epoch `epoch` from its beginning."""
        self.epoch, self.position, self._yielded = epoch, 0, 0

    def global_order(self):
        """Return the epoch's global order, padded or cut to `total`."""
        order = epoch_order(self.size, self.epoch, self.seed, self.shuffle)
        if self.total <= self.size:
            return order[: self.total]
        return np.resize(order, self.total)  # repeats the order from its start

    def indices(self):
        """Return the sample indices this rank reads from `position` to the end of the epoch."""
        start = min(self.position, self.total)
        return self.global_order()[start + self.rank :: self.world_size]

    def __len__(self):
        return max(0, self.total - self.position) // self.world_size

    def __iter__(self):
        self._yielded = 0
        return self._count_yielded(self.indices().tolist())

    def _count_yielded(self, indices):
        for i in indices:
            self._yielded += 1
            yield i

    def state_dict(self, consumed=None):
        """Return {epoch, position, ...}: where to resume after `consumed` samples of this rank.

        `consumed` defaults to what the last iteration yielded, exact without DataLoader
        workers; with workers (which read ahead) pass the samples actually trained on.
        """
        consumed = self._yielded if consumed is None else consumed
        return {
            "epoch": self.epoch,
            "position": min(self.position + consumed * self.world_size, self.total),
            "seed": self.seed,
            "size": self.size,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state):
        """Resume at a `state_dict()`: the next iteration reads the rest of that epoch."""
        for name in ("seed", "size", "shuffle"):
            if name in state and state[name] != getattr(self, name):
                raise ValueError(
                    f"state was saved with {name}={state[name]!r}, this sampler has "
                    f"{getattr(self, name)!r}"
                )
        self.epoch, self.position, self._yielded = int(state["epoch"]), int(state["position"]), 0


# --- prefetching on a background thread -------------------------------------------------------

_ITEM, _END, _ERROR = range(3)


def prefetch(iterable, depth=2, fn=None):
    """Iterate `iterable` on a background thread, up to `depth` items ahead; return a `Prefetcher`.

    `fn` (optional) runs on that thread for each item, e.g. a copy to the GPU with
    `non_blocking=True` from pinned memory, so the copy overlaps the training step.
    """
    return Prefetcher(iterable, depth, fn)


class Prefetcher:
    """An iterator that produces items on a background thread into a bounded queue.

    An exception raised by the source (or `fn`) is raised again in the consumer, with its
    traceback. Leaving early (break, an exception, `close()`, garbage collection or `with`)
    stops the thread and closes the source iterator.
    """

    def __init__(self, iterable, depth=2, fn=None):
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self._queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._done = False
        # The thread must not reference self, or an abandoned Prefetcher would never be freed.
        self._thread = threading.Thread(
            target=_produce,
            args=(iterable, fn, self._queue, self._stop),
            name="rectool-prefetch",
            daemon=True,
        )
        self._thread.start()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == _ITEM:
            return value
        self.close()
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self):
        """Stop the background thread and drop what it produced ahead."""
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # No join here: the thread sees the flag within 50 ms and ends by itself.
        if getattr(self, "_stop", None) is not None:
            self._done = True
            self._stop.set()


def _produce(iterable, fn, out, stop):
    def put(entry):
        while not stop.is_set():
            try:
                out.put(entry, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    iterator = None
    try:
        iterator = iter(iterable)
        for item in iterator:
            if stop.is_set() or not put((_ITEM, fn(item) if fn is not None else item)):
                return
        put((_END, None))
    except BaseException as exc:  # handed to the consumer, which raises it
        put((_ERROR, exc))
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
