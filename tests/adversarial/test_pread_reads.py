"""Adversarial (issue 36): a shard read by `os.pread` (`ds.close(mapped=False)`, what training
workers do) keeps every guarantee of a mapped read.

Each damaged pack is read twice, mapped and by pread, through the core reader's dataset and
the package's `PackDataset`, undecoded and decoded: the refusal must be the same
`RecordFormatError` (message, file, byte offset, key), and an undamaged sample the same bytes.
What a mapping cannot survive (a shard cut after it was opened: SIGBUS) must be refused by
name and never reach the decoder short. Descriptors: a pread dataset holds at most one a
shard, and gives them all back when closed, however many samples it read.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import struct
import sys

import numpy as np
import pytest
from helpers.handmade_datasets import MAGIC, write_pack
from helpers.image_files import jpeg_bytes
from helpers.oversized_images import oversized_jpeg

from rectool.dataset.packs import open_dataset as open_pack
from rectool.reader import (
    ImageTooLargeError,
    PreadFile,
    RecordFormatError,
    RectoolError,
    open_dataset,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/fd")

OPENERS = {"core": open_dataset, "package": open_pack}


def split_image(seed):
    """A JPEG followed (4-byte aligned in its record) by the magic word: a split record."""
    image = jpeg_bytes(seed, 40, 32)
    image += b"\0" * (-(24 + len(image)) % 4)  # the 24-byte image header comes first
    return image + MAGIC + b"tail"


def five_records(prefix):
    """Write a one-shard pack (with its binary index): records 0, 2, 3, 4 whole JPEGs, record
    1 split in two parts by the magic word in its bytes. Return the samples."""
    images = [jpeg_bytes(0, 40, 32), split_image(1), *(jpeg_bytes(k, 40, 32) for k in (2, 3, 4))]
    return write_pack(
        prefix, [[(k, image, float(k)) for k, image in enumerate(images)]], index=True
    )


def part_header(rec, offset):
    with open(rec, "rb") as f:
        f.seek(offset)
        return struct.unpack("<II", f.read(8))


def set_part_header(rec, offset, magic=None, cflag=None, length=None):
    """Rewrite the part header at `offset` in place (the file keeps its size)."""
    old_magic, lrec = part_header(rec, offset)
    cflag = lrec >> 29 if cflag is None else cflag
    length = lrec & ((1 << 29) - 1) if length is None else length
    with open(rec, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<II", old_magic if magic is None else magic, cflag << 29 | length))


def second_part(rec, offset):
    """Return the offset of the second part of the split record at `offset`."""
    _, lrec = part_header(rec, offset)
    length = lrec & ((1 << 29) - 1)
    return offset + 8 + length + (-length % 4)


def rewrite_offsets(prefix, change):
    path = f"{prefix}.offsets.npy"
    offsets = np.load(path)
    change(offsets)
    os.remove(path)
    np.save(path, offsets)


def truncate_last(prefix, samples):
    """Cut the shard inside its last record; the manifest says the new size (a cut pack that
    is opened, not one cut after opening)."""
    rec = samples[-1].rec
    os.truncate(rec, samples[-1].offset + 40)
    manifest = json.loads(open(f"{prefix}.manifest.json").read())
    manifest["shards"][0]["rec_bytes"] = os.path.getsize(rec)
    open(f"{prefix}.manifest.json", "w").write(json.dumps(manifest))


# (name, the sample refused, damage(prefix, samples))
DAMAGE = [
    ("bad magic", 2, lambda p, s: set_part_header(s[2].rec, s[2].offset, magic=0x12345678)),
    ("split record starts with a middle part", 1, lambda p, s: set_part_header(
        s[1].rec, s[1].offset, cflag=2)),
    ("split record's second part starts a record", 1, lambda p, s: set_part_header(
        s[1].rec, second_part(s[1].rec, s[1].offset), cflag=1)),
    ("split record's second part says whole", 1, lambda p, s: set_part_header(
        s[1].rec, second_part(s[1].rec, s[1].offset), cflag=0)),
    ("split record's second part runs past the end", 1, lambda p, s: set_part_header(
        s[1].rec, second_part(s[1].rec, s[1].offset), length=1 << 20)),
    ("whole record runs past the end", 4, lambda p, s: set_part_header(
        s[4].rec, s[4].offset, length=(1 << 29) - 1)),
    ("whole record a byte past the end", 4, lambda p, s: set_part_header(
        s[4].rec, s[4].offset, length=os.path.getsize(s[4].rec) - s[4].offset - 8 + 1)),
    ("shard cut inside the last record", 4, truncate_last),
    ("offset past the end", 3, lambda p, s: rewrite_offsets(p, lambda o: o.__setitem__(3, 10**12))),
    ("offset negative", 3, lambda p, s: rewrite_offsets(p, lambda o: o.__setitem__(3, -4))),
    ("offset unaligned", 3, lambda p, s: rewrite_offsets(p, lambda o: o.__setitem__(3, o[3] + 1))),
    ("offset inside a record", 3, lambda p, s: rewrite_offsets(
        p, lambda o: o.__setitem__(3, o[3] + 12))),
    ("offset at the last part's header word", 3, lambda p, s: rewrite_offsets(
        p, lambda o: o.__setitem__(3, os.path.getsize(s[3].rec) - 4))),
]  # fmt: skip


def refusal(ds, i):
    """Return what reading sample `i` raises: (type, message, path, offset, key)."""
    with pytest.raises(Exception) as caught:
        ds[i]
    exc = caught.value
    where = [getattr(exc, name, None) for name in ("path", "offset", "key")]
    return (type(exc), str(exc), *where)


@pytest.mark.parametrize("opener", OPENERS)
@pytest.mark.parametrize("decode", [None, "bgr"])
@pytest.mark.parametrize("damage", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_pread_refuses_each_damage_as_the_mapping_does(tmp_path, opener, decode, damage):
    _, bad, change = damage
    prefix = tmp_path / "faces"
    samples = five_records(prefix)
    change(prefix, samples)
    opened = OPENERS[opener]
    mapped, pread = opened(prefix, decode), opened(prefix, decode)
    pread.close(mapped=False)
    found = [refusal(ds, bad) for ds in (mapped, pread)]
    assert found[0] == found[1]
    kind, message, path, offset, _ = found[1]
    assert issubclass(kind, RecordFormatError), message
    assert path == samples[bad].rec and offset is not None
    for i in set(range(len(samples))) - {bad}:  # the others read as they were written
        assert bytes(pread.raw(i)[0]) == bytes(mapped.raw(i)[0]) == samples[i].image
    assert all(isinstance(rf._mm, PreadFile) for rf in pread._files)


@pytest.mark.parametrize("opener", OPENERS)
def test_pread_reads_a_split_record_whole(tmp_path, opener):
    prefix = tmp_path / "faces"
    samples = five_records(prefix)
    ds = OPENERS[opener](prefix)
    ds.close(mapped=False)
    assert [bytes(ds[i][0]) for i in range(5)] == [s.image for s in samples]
    assert [ds[i][1] for i in range(5)] == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("opener", OPENERS)
def test_pread_keeps_the_pixel_budget_before_decoding(tmp_path, opener):
    prefix = tmp_path / "faces"
    images = [jpeg_bytes(0, 40, 32), oversized_jpeg(), jpeg_bytes(2, 40, 32)]
    write_pack(prefix, [[(k, image, float(k)) for k, image in enumerate(images)]], index=True)
    calls = []
    found = []
    for mapped in (True, False):
        ds = OPENERS[opener](prefix, "bgr", max_pixels=10_000)
        ds.close(mapped=mapped)
        assert ds[0][0].shape == (40, 32, 3)
        with pytest.raises(ImageTooLargeError) as caught:
            ds[1]
        found.append((str(caught.value), caught.value.path, caught.value.offset))
        ds = OPENERS[opener](prefix, lambda data: calls.append(len(data)), max_pixels=10_000)
        ds.close(mapped=mapped)
        ds[1]  # a function of the bytes is the caller's decoder: handed them, whole
    assert found[0] == found[1]
    assert calls == [len(images[1])] * 2


def test_a_shard_cut_under_an_open_pread_never_reaches_the_decoder_short(tmp_path):
    # A mapping would raise SIGBUS reading past the new end; pread must refuse by name.
    prefix = tmp_path / "faces"
    samples = five_records(prefix)
    seen = []
    ds = open_dataset(prefix, lambda data: seen.append(bytes(data)) or len(data))
    ds.close(mapped=False)
    assert ds[0][0] == len(samples[0].image)  # the shard is open now
    for cut in (samples[4].offset + 40, samples[4].offset + 4, samples[2].offset + 30):
        os.truncate(samples[4].rec, cut)
        for i in range(2 if cut < samples[3].offset else 4, 5):
            with pytest.raises(RecordFormatError) as caught:
                ds[i]
            assert caught.value.path == samples[4].rec
            assert samples[i].offset <= caught.value.offset <= samples[i].offset + 32
    assert seen == [samples[0].image]  # nothing cut was handed to the decoder


def test_a_shard_replaced_under_a_pread_dataset_is_refused_once_reopened(tmp_path):
    prefix = tmp_path / "faces"
    samples = five_records(prefix)
    ds = open_dataset(prefix)
    ds.close(mapped=False)
    first = bytes(ds.raw(0)[0])
    rec = samples[0].rec
    os.rename(rec, rec + ".old")
    with open(rec + ".old", "rb") as f:
        data = bytearray(f.read())
    data[samples[0].offset + 40] ^= 0xFF  # another file, the same size, other bytes
    with open(rec, "wb") as f:
        f.write(data)
    assert bytes(ds.raw(0)[0]) == first  # the file it opened, until it lets go of it
    blob = pickle.dumps(ds)  # pickled while open (a spawned worker's copy)
    ds.close(mapped=False)
    with pytest.raises(RectoolError, match="was replaced after it was opened"):
        ds.raw(0)
    again = pickle.loads(blob)
    again.close(mapped=False)
    with pytest.raises(RectoolError, match="was replaced after it was opened"):
        again.raw(0)


def test_a_pread_dataset_pickled_reads_the_same_bytes(tmp_path):
    prefix = tmp_path / "faces"
    samples = five_records(prefix)
    for opened in OPENERS.values():
        ds = opened(prefix)
        ds.close(mapped=False)
        ds.raw(3)
        copy = pickle.loads(pickle.dumps(ds))
        for mapped in (True, False):
            copy.close(mapped=mapped)
            assert [bytes(copy.raw(i)[0]) for i in range(5)] == [s.image for s in samples]


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@linux_only
@pytest.mark.parametrize("opener", OPENERS)
def test_a_pread_dataset_holds_a_descriptor_a_shard_and_returns_them(tmp_path, opener):
    prefix = tmp_path / "faces"
    shards = [[(4 * s + k, jpeg_bytes(k, 12, 12), float(s)) for k in range(4)] for s in range(6)]
    write_pack(prefix, shards, index=True)
    ds = OPENERS[opener](prefix)
    before = open_fds()
    ds.close(mapped=False)
    order = np.random.default_rng(3).permutation(np.tile(np.arange(len(ds)), 20))
    for n, i in enumerate(order.tolist()):
        ds.raw(i)
        if n % 7 == 6:  # what a worker does between batches
            ds.close(mapped=False)
        assert open_fds() - before <= 6
    ds.close(mapped=False)
    assert open_fds() == before
    for i in range(len(ds)):
        ds.raw(i)
    assert open_fds() == before + 6
    ds.close()  # back to mappings: the descriptors go
    assert open_fds() == before


# --- training workers: pread in fork and spawn workers, the bytes and refusals of a mapping ---


def decoded_pack(prefix, shards=3, per_shard=5, bad=None):
    """Write a pack of `shards` x `per_shard` 40x32 JPEGs labelled by their number (with its
    binary index); with `bad`, that record's magic is damaged. Return the samples."""
    numbers = np.arange(shards * per_shard).reshape(shards, per_shard).tolist()
    items = [[(k, jpeg_bytes(k, 40, 32), float(k)) for k in shard] for shard in numbers]
    samples = write_pack(prefix, items, index=True)
    if bad is not None:
        set_part_header(samples[bad].rec, samples[bad].offset, magic=0x12345678)
    return samples


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_loader_workers_read_what_the_mapping_decodes(tmp_path, start_method):
    from rectool.training import Loader

    prefix = tmp_path / "faces"
    samples = decoded_pack(prefix, bad=7)
    mapped = open_dataset(prefix, "bgr")
    want = {k: mapped[k][0] for k in range(len(samples)) if k != 7}
    ds = open_dataset(prefix)
    ds.raw(0)  # mapped in the parent before the workers start
    options = {"start_method": start_method, "on_error": "skip", "seed": 5, "mode": "bgr"}
    with Loader(ds, 4, workers=2, **options) as loader:
        got = {}
        for images, labels in loader:
            for image, label in zip(images, labels.tolist()):
                got[label] = np.array(image)
        bad = loader.bad_samples
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert [b[0] for b in bad] == [7]
    with pytest.raises(RecordFormatError) as caught:
        mapped[7]
    assert str(caught.value) in bad[0][2]


class FdsAfterBatch:
    """A BatchDecoder's batch (images, labels) and the worker's open descriptors after it:
    (all of them, those of a .rec)."""

    def __init__(self, decoder):
        self.decoder = decoder

    def __len__(self):
        return len(self.decoder)

    def __getitem__(self, indices):
        images, labels = self.decoder[indices]
        links = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except FileNotFoundError:  # the listing's own descriptor
                continue
        recs = sum(link.endswith(".rec") for link in links)
        return images.clone(), labels.clone(), sorted(links), recs


@linux_only
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_batchdecoder_workers_read_what_the_mapping_decodes_and_hold_no_more_fds(
    tmp_path, start_method
):
    torch = pytest.importorskip("torch")
    from rectool.training import BatchDecoder, RankSampler

    prefix = tmp_path / "faces"
    samples = decoded_pack(prefix, shards=6, per_shard=3)
    mapped = open_dataset(prefix, "bgr")
    want = [mapped[k][0] for k in range(len(samples))]
    mapped.close()  # a forked worker would inherit its mappings' descriptors
    ds = open_dataset(prefix)
    ds.raw(0)  # mapped in the parent: the worker lets go of it
    sampler = RankSampler(len(ds), seed=3)
    epochs = []
    for epoch in range(3):  # the same workers' descriptors over several epochs' batches
        sampler.set_epoch(epoch)
        epochs += list(torch.utils.data.BatchSampler(sampler, 2, False))
    loader = torch.utils.data.DataLoader(
        FdsAfterBatch(BatchDecoder(ds, mode="bgr")), batch_size=None, sampler=epochs,
        num_workers=1, multiprocessing_context=start_method,
    )  # fmt: skip
    seen = list(loader)
    got = [(int(k), image.numpy()) for images, labels, _, _ in seen
           for image, k in zip(images, labels)]  # fmt: skip
    assert sorted(k for k, _ in got) == sorted(k for batch in epochs for k in batch)
    assert all(np.array_equal(image, want[k]) for k, image in got)
    # This pack's shards open after a batch: a batch's, at most (a forked worker also holds
    # what the test process held when it forked: other tests' files are not counted).
    recs = [sum(n.startswith(str(tmp_path)) and n.endswith(".rec") for n in links)
            for *_, links, _ in seen]  # fmt: skip
    assert max(recs) <= 2, recs
    # The pack's other files (its index arrays) held open: the same, batch after batch.
    others = [[n for n in links if n.startswith(str(tmp_path)) and not n.endswith(".rec")]
              for *_, links, _ in seen]  # fmt: skip
    assert others[0] and all(files == others[0] for files in others), others


# --- found by the adversarial pass, mended since: each failed on the pread path first -------


def unindexed_pack(tmp_path, n=8):
    items = [(k, jpeg_bytes(k, 40, 32), float(k)) for k in range(n)]
    write_pack(tmp_path / "p", [items], index=False)  # manifest format 1: no binary index
    return tmp_path / "p"


def test_labels_of_a_pack_without_an_index_gathered_under_pread(tmp_path):
    # format/headers.header_labels maps a pread file while it gathers (was: TypeError)
    ds = open_pack(unindexed_pack(tmp_path))
    assert not ds.indexed
    ds.close(mapped=False)
    assert ds.labels.tolist() == [float(k) for k in range(8)]
    assert all(not rf.mapped for rf in ds._files)  # and it reads by pread again after


def test_batchdecoder_in_spawn_workers_over_a_pack_without_an_index(tmp_path):
    torch = pytest.importorskip("torch")
    from rectool.training import BatchDecoder, RankSampler

    ds = open_pack(unindexed_pack(tmp_path))
    batches = torch.utils.data.BatchSampler(RankSampler(ds, seed=2), 4, False)
    loader = torch.utils.data.DataLoader(
        BatchDecoder(ds, mode="bgr"),
        batch_size=None,
        sampler=batches,
        num_workers=1,
        multiprocessing_context="spawn",
    )
    assert sorted(int(v) for _, batch in loader for v in batch) == list(range(8))


@pytest.mark.parametrize("opener", sorted(OPENERS))
def test_a_shard_cut_under_pread_names_the_key_and_record_offset(tmp_path, opener):
    items = [(k + 100, jpeg_bytes(k, 40, 32), float(k)) for k in range(3)]
    samples = write_pack(tmp_path / "p", [items], index=True)
    ds = OPENERS[opener](tmp_path / "p", "bgr")
    ds.close(mapped=False)
    ds[0]  # the shard opened
    os.truncate(samples[2].rec, samples[2].offset + 40)
    with pytest.raises(RecordFormatError) as caught:
        ds[2]
    assert (caught.value.key, caught.value.offset) == (102, samples[2].offset)
    assert caught.value.path == str(samples[2].rec)


@pytest.mark.parametrize("opener", sorted(OPENERS))
def test_an_io_error_under_pread_is_a_record_error_naming_the_shard(tmp_path, monkeypatch, opener):
    items = [(k, jpeg_bytes(k, 40, 32), float(k)) for k in range(3)]
    samples = write_pack(tmp_path / "p", [items], index=True)
    ds = OPENERS[opener](tmp_path / "p", "bgr")
    ds.close(mapped=False)

    def failing(fd, n, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "pread", failing)
    with pytest.raises(RecordFormatError) as caught:  # a RecordFormatError: skip can skip it
        ds[1]
    assert "Input/output error" in str(caught.value)
    assert (caught.value.path, caught.value.offset, caught.value.key) == (
        str(samples[1].rec),
        samples[1].offset,
        1,
    )
