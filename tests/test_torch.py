"""The reader under the real torch DataLoader: workers under fork and spawn, ranks, resuming.

Runs against `rectool.reader`, and through tests/test_emit.py against the emitted copy (see
helpers/reader_under_test.py). Datasets are small and written by hand, so every sample can be
checked.
"""

from __future__ import annotations

import collections
import os
import sys

import numpy as np
import pytest
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes
from helpers.reader_under_test import EMITTED, rd
from helpers.training_under_test import tr

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

SAMPLES = 37


@pytest.fixture(scope="module")
def torch_shards(tmp_path_factory):
    """37 JPEGs in three shards; label = 0.5 * sample number (exact in float32)."""
    folder = tmp_path_factory.mktemp("torch")
    items = [(1000 + n, jpeg_bytes(n, 12, 10), n * 0.5) for n in range(SAMPLES)]
    samples = write_pack(folder / "faces", [items[:10], items[10:25], items[25:]], index=True)
    return folder / "faces", samples


def check_worker(worker_id):
    """worker_init_fn: the dataset reached this worker, and rectool did not come with it."""
    info = torch.utils.data.get_worker_info()
    assert type(info.dataset).__module__ == rd.__name__
    if EMITTED and sys.modules.get("rectool") is not None:
        raise AssertionError("a worker imported rectool while testing the emitted reader")


def collected(loader):
    """Return every (image bytes, label) a loader yields, in order."""
    out = []
    for images, labels in loader:
        assert len(images) == len(labels)
        out += zip(images, labels.tolist())
    return out


@pytest.mark.parametrize(
    ("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")], ids=["main", "fork", "spawn"]
)
def test_every_sample_exactly_once_per_epoch(torch_shards, workers, context):
    prefix, samples = torch_shards
    ds = rd.open_dataset(prefix)
    sampler = tr.RankSampler(ds, seed=1)
    loader = DataLoader(
        ds,
        batch_size=4,
        sampler=sampler,
        num_workers=workers,
        multiprocessing_context=context,
        persistent_workers=workers > 0,
        worker_init_fn=check_worker if workers else None,
    )
    expected = collections.Counter((s.image, s.label) for s in samples)
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        got = collected(loader)
        assert collections.Counter(got) == expected
        assert [s for s in got] == [(samples[i].image, samples[i].label) for i in sampler.indices()]
        orders.append(got)
    assert orders[0] != orders[1]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_decoded_batches(torch_shards, context):
    prefix, samples = torch_shards
    ds = rd.open_dataset(prefix, decode="rgb")
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=context)
    images, labels = next(iter(loader))
    assert images.dtype == torch.uint8 and images.shape == (8, 12, 10, 3)
    assert labels.tolist() == [s.label for s in samples[:8]]
    for n in range(8):
        assert np.array_equal(images[n].numpy(), ds[n][0])


def test_forked_workers_share_the_mapped_index(torch_shards, monkeypatch):
    prefix, samples = torch_shards
    ds = rd.open_dataset(prefix)

    def refuse(*args, **kwargs):
        raise AssertionError("a worker opened the manifest or an index array again")

    # Forked workers inherit these patches: reading the manifest or mapping an index array
    # there fails the test; they read through the parent's mapping.
    monkeypatch.setattr(rd, "load_array", refuse)
    monkeypatch.setattr(rd, "read_manifest", refuse)
    loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="fork")
    assert len(collected(loader)) == SAMPLES


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_no_descriptors_left_in_the_main_process(torch_shards):
    prefix, _ = torch_shards

    def rec_fds():
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:  # a descriptor may close between the listing and the look (a worker's pipe)
                target = os.readlink(f"/proc/self/fd/{fd}")
            except FileNotFoundError:
                continue
            if target.endswith(".rec"):
                found.append(fd)
        return found

    before = rec_fds()
    ds = rd.open_dataset(prefix)
    for _ in range(2):
        loader = DataLoader(ds, batch_size=6, num_workers=2, multiprocessing_context="fork")
        assert len(collected(loader)) == SAMPLES
        del loader
    # Only the workers mapped the files; the main process never opened one.
    assert rec_fds() == before


@pytest.mark.parametrize("world", [1, 3, 8])
def test_rank_loaders_split_the_epoch(torch_shards, world):
    prefix, samples = torch_shards
    ds = rd.open_dataset(prefix)
    per_rank = []
    for rank in range(world):
        sampler = tr.RankSampler(ds, rank, world, seed=2)
        sampler.set_epoch(5)
        per_rank.append(collected(DataLoader(ds, batch_size=3, sampler=sampler)))
    assert len({len(got) for got in per_rank}) == 1
    seen = collections.Counter(pair for got in per_rank for pair in got)
    assert set(seen) == {(s.image, s.label) for s in samples}
    assert sum(seen.values()) == -(-SAMPLES // world) * world


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_through_a_loader(torch_shards, workers):
    prefix, _ = torch_shards
    ds = rd.open_dataset(prefix)

    def loader_for(sampler):
        return DataLoader(
            ds,
            batch_size=4,
            sampler=sampler,
            num_workers=workers,
            multiprocessing_context="fork" if workers else None,
        )

    sampler = tr.RankSampler(ds, 1, 2, seed=9)
    sampler.set_epoch(3)
    full = collected(loader_for(sampler))
    # Train three batches, save, "crash".
    sampler.set_epoch(3)
    done = 0
    for images, _ in loader_for(sampler):
        done += len(images)
        if done == 12:
            break
    state = sampler.state_dict(consumed=done)
    resumed = tr.RankSampler(ds, 1, 2, seed=9)
    resumed.load_state_dict(state)
    assert collected(loader_for(resumed)) == full[12:]
