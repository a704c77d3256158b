"""Reads by `os.pread` (`ds.close(mapped=False)`, what Loader and BatchDecoder workers do).

A worker reads each record into a buffer instead of slicing the shard's mapping: nothing mapped
grows its memory and nothing needs unmapping after a batch. The bytes and the refusals must be
the mapping's: every expected value here comes from the mapped read or from the bytes written.
"""

from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import sys

import numpy as np
import pytest
from helpers.framing_cases import raw_payload_cases
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes

from rectool.dataset.packs import open_dataset as open_pack
from rectool.reader import PreadFile, RecordFormatError, open_dataset
from rectool.training import Loader

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/maps")


@pytest.fixture(scope="module")
def framing_pack(tmp_path_factory):
    """Payloads holding the magic (split records), empty ones and several MB, in two shards."""
    folder = tmp_path_factory.mktemp("pread")
    items = [(k, payload, float(k)) for k, (_, payload) in enumerate(raw_payload_cases())]
    half = len(items) // 2
    write_pack(folder / "p", [items[:half], items[half:]], index=True)
    return folder / "p", [payload for _, payload, _ in items]


def pread_dataset(prefix):
    ds = open_dataset(prefix)
    ds.close(mapped=False)
    return ds


def test_pread_reads_every_record_as_the_mapping_does(framing_pack):
    prefix, payloads = framing_pack
    mapped, pread = open_dataset(prefix), pread_dataset(prefix)
    for i in range(len(payloads)):
        assert bytes(pread.raw(i)[0]) == bytes(mapped.raw(i)[0]) == payloads[i]
        assert pread.raw(i)[1] == mapped.raw(i)[1] == float(i)


def test_a_pread_dataset_maps_no_shard(framing_pack):
    prefix, payloads = framing_pack
    ds = open_pack(prefix)
    ds.close(mapped=False)
    for i in range(len(payloads)):
        ds.raw(i)
    assert all(isinstance(rf.open(), PreadFile) for rf in ds.shard_files)
    ds.close()  # mapped again on the next read: the switch back
    assert bytes(ds.raw(0)[0]) == payloads[0]
    assert all(isinstance(rf.open(), mmap.mmap) for rf in ds.shard_files)


def rewrite_offsets(prefix, change):
    """Write the pack's offsets array again with `change(offsets)` applied."""
    path = f"{prefix}.offsets.npy"
    offsets = np.load(path)
    change(offsets)
    os.remove(path)  # a new file: a mapping of the old one stays as it was
    np.save(path, offsets)


@pytest.mark.parametrize(
    "damage",
    [
        ("past the end", lambda o: o.__setitem__(1, 10**9)),
        ("negative", lambda o: o.__setitem__(1, -8)),
        ("unaligned", lambda o: o.__setitem__(1, o[1] + 2)),
        ("inside a record (bad magic)", lambda o: o.__setitem__(1, o[1] + 8)),
    ],
    ids=lambda d: d[0],
)
def test_pread_refuses_a_bad_offset_as_the_mapping_does(tmp_path, damage):
    prefix = tmp_path / "faces"
    write_pack(prefix, [[(k, jpeg_bytes(k, 40, 32), float(k)) for k in range(3)]], index=True)
    rewrite_offsets(prefix, damage[1])
    errors = []
    for ds in (open_dataset(prefix), pread_dataset(prefix)):
        with pytest.raises(RecordFormatError) as caught:
            ds.raw(1)
        errors.append((str(caught.value), caught.value.path, caught.value.offset))
    assert errors[0] == errors[1]
    assert errors[0][1] == f"{prefix}.rec"


def test_pread_refuses_a_record_cut_short_as_the_mapping_does(tmp_path):
    prefix = tmp_path / "faces"
    write_pack(prefix, [[(k, jpeg_bytes(k, 40, 32), float(k)) for k in range(3)]], index=True)
    rec = f"{prefix}.rec"
    os.truncate(rec, os.path.getsize(rec) - 100)  # the last record runs past the end
    manifest = json.loads(open(f"{prefix}.manifest.json").read())
    manifest["shards"][0]["rec_bytes"] = os.path.getsize(rec)
    open(f"{prefix}.manifest.json", "w").write(json.dumps(manifest))
    errors = []
    for ds in (open_dataset(prefix), pread_dataset(prefix)):
        with pytest.raises(RecordFormatError, match="record cut short") as caught:
            ds.raw(2)
        errors.append(str(caught.value))
        assert bytes(ds.raw(1)[0]) == jpeg_bytes(1, 40, 32)
    assert errors[0] == errors[1]


def test_pread_refuses_a_shard_that_shrank_after_it_was_opened(tmp_path):
    # A mapping would raise SIGBUS here; a short read is refused by name, never returned.
    prefix = tmp_path / "faces"
    write_pack(prefix, [[(k, jpeg_bytes(k, 40, 32), float(k)) for k in range(3)]], index=True)
    ds = pread_dataset(prefix)
    assert bytes(ds.raw(0)[0]) == jpeg_bytes(0, 40, 32)  # the shard is open now
    rec, offset = f"{prefix}.rec", ds.location(2)[1]
    os.truncate(rec, offset + 40)
    with pytest.raises(RecordFormatError, match="record cut short: the file shrank") as caught:
        ds.raw(2)
    assert caught.value.path == rec and caught.value.offset >= offset


def mapped_recs(pid, pack):
    """The lines of process `pid`'s maps naming a .rec under `pack` (a forked worker also
    inherits whatever the test process maps: other tests' packs, not yet collected, are not
    counted; once they were, in a full run)."""
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if ".rec" in line and str(pack) in line]


@linux_only
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_loader_workers_read_by_pread_and_map_no_shard(tmp_path, start_method):
    prefix = tmp_path / "faces"
    images = [jpeg_bytes(k, 40, 32) for k in range(24)]
    write_pack(prefix, [[(k, image, float(k)) for k, image in enumerate(images)]], index=True)
    ds = open_dataset(prefix)
    ds.raw(0)  # mapped in the parent before the workers start: forked ones inherit it
    with Loader(ds, 4, workers=2, start_method=start_method, seed=1) as loader:
        labels = []
        for _, batch in loader:
            labels += batch.tolist()
            workers = [p for p in multiprocessing.active_children() if p.name == "rectool-loader"]
            assert [mapped_recs(p.pid, tmp_path) for p in workers] == [[], []]
    assert sorted(labels) == list(range(24))


class MappedAfterBatch:
    """A BatchDecoder's batch's labels, and the lines of the worker's maps naming a .rec under
    `pack` (see `mapped_recs`)."""

    def __init__(self, decoder, pack):
        self.decoder, self.pack = decoder, str(pack)

    def __len__(self):
        return len(self.decoder)

    def __getitem__(self, indices):
        _, labels = self.decoder[indices]
        with open("/proc/self/maps") as f:
            return labels.clone(), [line for line in f if ".rec" in line and self.pack in line]


@linux_only
def test_batchdecoder_in_dataloader_workers_reads_by_pread_and_maps_no_shard(tmp_path):
    torch = pytest.importorskip("torch")
    from rectool.training import BatchDecoder, RankSampler

    prefix = tmp_path / "faces"
    images = [jpeg_bytes(k, 40, 32) for k in range(24)]
    write_pack(prefix, [[(k, image, float(k)) for k, image in enumerate(images)]], index=True)
    ds = open_dataset(prefix)
    ds.raw(0)  # mapped in the parent: forked workers inherit the mapping
    batches = torch.utils.data.BatchSampler(RankSampler(ds, seed=2), 5, False)
    probe = MappedAfterBatch(BatchDecoder(ds, mode="bgr"), tmp_path)
    loader = torch.utils.data.DataLoader(
        probe, batch_size=None, sampler=batches, num_workers=2, multiprocessing_context="fork"
    )
    seen = list(loader)
    assert sorted(int(v) for labels, _ in seen for v in labels) == list(range(24))
    assert [maps for _, maps in seen] == [[]] * len(seen)


def open_recs(pid, pack):
    """The .rec files of the pack under `pack` that process `pid` holds open (a forked worker
    also inherits whatever the test process holds: other tests' files are not counted)."""
    folder = f"/proc/{pid}/fd"
    links = []
    for fd in os.listdir(folder):
        try:
            links.append(os.readlink(os.path.join(folder, fd)))
        except FileNotFoundError:  # closed while listed
            continue
    return [link for link in links if link.startswith(str(pack)) and link.endswith(".rec")]


@linux_only
def test_loader_workers_keep_no_more_shards_open_than_a_batch_reads(tmp_path):
    # A descriptor a shard read by pread: kept for an epoch, a pack of thousands of shards
    # would run a worker out of them. Each batch lets go of the last batch's.
    prefix = tmp_path / "faces"
    shards = [[(k, jpeg_bytes(k, 40, 32), float(k))] for k in range(30)]
    write_pack(prefix, shards, index=True)
    seen = []
    with Loader(open_dataset(prefix), 3, workers=1, seed=4) as loader:
        for _, batch in loader:
            seen += batch.tolist()
            (worker,) = [p for p in multiprocessing.active_children() if p.name == "rectool-loader"]
            assert len(open_recs(worker.pid, tmp_path)) <= 3
    assert sorted(seen) == list(range(30))
