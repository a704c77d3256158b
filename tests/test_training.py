"""The training module: epoch_order, RankSampler, prefetch.

Runs against `rectool.training`, and through tests/test_emit.py against the emitted standalone
copy (`rectool reader --training`) in a process where rectool cannot be imported.
"""

from __future__ import annotations

import gc
import pickle
import threading
import time

import numpy as np
import pytest
from helpers.training_under_test import tr as rd

# --- RankSampler and epoch_order --------------------------------------------------------------


def test_epoch_order_is_a_seeded_permutation():
    order = rd.epoch_order(1000, epoch=3, seed=7)
    assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(1000))
    assert np.array_equal(order, rd.epoch_order(1000, epoch=3, seed=7))
    assert not np.array_equal(order, rd.epoch_order(1000, epoch=4, seed=7))
    assert not np.array_equal(order, rd.epoch_order(1000, epoch=3, seed=8))
    assert rd.epoch_order(5, shuffle=False).tolist() == [0, 1, 2, 3, 4]
    # Pinned, so that a numpy upgrade or another platform cannot silently change the order.
    assert rd.epoch_order(10, epoch=0, seed=0).tolist() == EPOCH_0_SEED_0


EPOCH_0_SEED_0 = [3, 2, 1, 8, 6, 0, 7, 4, 5, 9]


@pytest.mark.parametrize("size", [1, 7, 23, 64])
@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_views_cover_the_dataset_with_equal_counts(size, drop_last):
    for world in range(1, 9):
        views = [
            list(rd.RankSampler(size, rank, world, seed=5, drop_last=drop_last))
            for rank in range(world)
        ]
        counts = {len(v) for v in views}
        assert len(counts) == 1, (world, counts)
        count = counts.pop()
        assert len(rd.RankSampler(size, 0, world, drop_last=drop_last)) == count
        seen = [i for v in views for i in v]
        if drop_last:
            assert count == size // world
            assert len(set(seen)) == len(seen)
        else:
            assert count == -(-size // world)
            assert set(seen) == set(range(size))
            # Padding repeats as few samples as possible, each at most once more.
            assert len(seen) - size < world
        # Interleaving the ranks gives back the one global order, whatever the world size.
        order = rd.epoch_order(size, 0, 5)
        merged = [views[p % world][p // world] for p in range(world * count)]
        assert merged == np.resize(order, world * count).tolist()


def test_rank_sampler_epochs():
    sampler = rd.RankSampler(50, 1, 2, seed=3)
    first = list(sampler)
    assert list(sampler) == first  # same epoch, same order
    sampler.set_epoch(1)
    second = list(sampler)
    assert second != first and sorted(second) != sorted(first) or second != first
    unshuffled = rd.RankSampler(6, 1, 2, shuffle=False)
    assert list(unshuffled) == [1, 3, 5]


def test_rank_sampler_accepts_a_sized_object():
    ds = [None] * 12  # anything with a len(), a dataset of 12 samples
    assert len(rd.RankSampler(ds, 0, 5)) == 3


def test_rank_sampler_arguments_are_checked():
    with pytest.raises(ValueError, match="need 0 <= rank < world_size"):
        rd.RankSampler(10, 2, 2)
    with pytest.raises(ValueError):
        rd.RankSampler(10, 0, 0)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("stop", [0, 1, 5, 9])
def test_resume_mid_epoch_reproduces_the_rest(stop, drop_last):
    world = 3
    samplers = [rd.RankSampler(29, r, world, seed=11, drop_last=drop_last) for r in range(world)]
    for s in samplers:
        s.set_epoch(4)
    full = [list(s) for s in samplers]
    states = []
    for s in samplers:
        it = iter(s)
        for _ in range(stop):
            next(it)
        states.append(s.state_dict())
    assert {st["position"] for st in states} == {stop * world}
    assert states[0]["epoch"] == 4
    for rank, state in enumerate(states):
        resumed = rd.RankSampler(29, rank, world, seed=11, drop_last=drop_last)
        resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
        assert len(resumed) == len(full[rank]) - stop
        assert list(resumed) == full[rank][stop:]
    # The explicit count of samples trained on gives the same state.
    assert samplers[0].state_dict(consumed=stop) == states[0]


def test_resume_on_another_number_of_ranks_reads_each_remaining_sample_once():
    order = rd.epoch_order(40, 2, 1).tolist()
    four = [rd.RankSampler(40, r, 4, seed=1) for r in range(4)]
    for s in four:
        s.set_epoch(2)
    state = four[0].state_dict(consumed=3)  # 12 samples of the global order done
    three = []
    for r in range(3):
        s = rd.RankSampler(40, r, 3, seed=1)
        s.load_state_dict(state)
        three.append(list(s))
    rest = [i for view in three for i in view]
    # 28 left, padded to 30 with the start of the order, as on three ranks from the start.
    assert sorted(rest) == sorted(order[12:] + order[:2])


def test_resume_refuses_another_dataset_or_seed():
    state = rd.RankSampler(10, seed=1).state_dict()
    with pytest.raises(ValueError, match="state was saved with seed=1"):
        rd.RankSampler(10, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="state was saved with size=10"):
        rd.RankSampler(11, seed=1).load_state_dict(state)


def test_a_finished_epoch_resumes_to_nothing():
    s = rd.RankSampler(10, 0, 2)
    list(s)
    s2 = rd.RankSampler(10, 0, 2)
    s2.load_state_dict(s.state_dict())
    assert len(s2) == 0 and list(s2) == []


# --- prefetch ---------------------------------------------------------------------------------


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "rectool-prefetch"]


def test_prefetch_yields_everything_in_order():
    assert list(rd.prefetch(range(100), depth=3)) == list(range(100))
    assert list(rd.prefetch([], depth=1)) == []
    assert prefetch_threads() == []


def test_prefetch_applies_fn_on_the_background_thread():
    names = list(rd.prefetch(range(3), fn=lambda x: (x, threading.current_thread().name)))
    assert names == [(0, "rectool-prefetch"), (1, "rectool-prefetch"), (2, "rectool-prefetch")]


def test_prefetch_stays_within_depth():
    produced = []

    def source():
        for i in range(50):
            produced.append(i)
            yield i

    it = rd.prefetch(source(), depth=4)
    assert next(it) == 0
    time.sleep(0.2)
    # One handed over, four queued, and at most one more waiting to be queued.
    assert len(produced) <= 6
    it.close()


def test_prefetch_reraises_the_sources_exception_in_the_consumer():
    def source():
        yield 1
        yield 2
        raise KeyError("broken batch")

    it = rd.prefetch(source(), depth=2)
    got = []
    with pytest.raises(KeyError, match="broken batch") as caught:
        for item in it:
            got.append(item)
    assert got == [1, 2]
    assert "source" in [frame.name for frame in caught.traceback]
    assert list(it) == []  # finished for good
    assert prefetch_threads() == []


def test_prefetch_reraises_an_exception_of_fn():
    def fn(x):
        if x == 3:
            raise ValueError("cannot move batch 3")
        return x

    with pytest.raises(ValueError, match="cannot move batch 3"):
        list(rd.prefetch(range(10), fn=fn))


def test_prefetch_break_stops_the_thread_and_closes_the_source():
    closed = threading.Event()

    def source():
        try:
            yield from range(10**9)
        finally:
            closed.set()

    for i in rd.prefetch(source(), depth=2):
        if i == 5:
            break
    # The abandoned prefetcher is collected at once (CPython) and stops its thread.
    assert closed.wait(5)
    for thread in prefetch_threads():
        thread.join(60)  # stopped: it ends at once (the bound only keeps a bug from hanging)
    assert prefetch_threads() == []


def test_prefetch_close_and_with():
    closed = threading.Event()

    def source():
        try:
            yield from range(100)
        finally:
            closed.set()

    with rd.prefetch(source(), depth=1) as it:
        assert next(it) == 0
    assert closed.is_set() and prefetch_threads() == []
    it.close()  # again: harmless
    with pytest.raises(StopIteration):
        next(it)


def test_prefetch_consumer_exception_shuts_down():
    def train():
        for i in rd.prefetch(range(1000), depth=2):
            if i == 3:
                raise RuntimeError("loss is nan")

    with pytest.raises(RuntimeError, match="loss is nan"):
        train()
    gc.collect()
    for thread in prefetch_threads():
        thread.join(60)  # stopped: it ends at once (the bound only keeps a bug from hanging)
    assert prefetch_threads() == []


def test_prefetch_depth_is_checked():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        rd.prefetch(range(3), depth=0)
