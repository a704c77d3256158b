"""The paths repack takes for speed (issue 38) write the same bytes, and lose no error.

A shard's bytes are hashed a piece of whole records at a time (`shardfile.DIGEST_PIECE_BYTES`),
the sources' mappings are let go of on a thread of their own while the last writes and the
fsync run (`RepackRun.execute`), and a batch's runs are sliced and joined with the cyclic
garbage collector paused (`RecordCopier.frame`).
"""

from __future__ import annotations

import errno
import gc
import json
import mmap
import os

import pytest
import xxhash
from helpers.handmade_datasets import MAGIC, write_pack
from helpers.image_files import jpeg_bytes

from rectool.errors import RectoolError
from rectool.format.checksums import decode_checksums
from rectool.packer import shardfile as shardfile_module
from rectool.packer.shards import ShardWriter
from rectool.repack import batches as batches_module
from rectool.repack import copier as copier_module
from rectool.repack.pipeline import RepackOptions, repack

# The files of a repack whose bytes do not depend on the time it ran.
STABLE = (".rec", ".idx", ".rec.crc", ".offsets.npy", ".keys.npy", ".labels.npy")


def two_shard_source(prefix):
    # Images of several sizes over two shards, and one record holding the magic word and no
    # image (refused): buffers of records of different lengths, and a refusal among them.
    images = [jpeg_bytes(k, 10 + 3 * (k % 5), 8 + 2 * (k % 4)) for k in range(14)]
    images.append(MAGIC * 2 + b"abcd")
    write_pack(
        prefix,
        [
            [(k, images[k], float(k % 4)) for k in range(8)],
            [(k, images[k], float(k % 3)) for k in range(8, 15)],
        ],
    )


def shard_files(prefix):
    return {suffix: (prefix.parent / f"{prefix.name}{suffix}").read_bytes() for suffix in STABLE}


@pytest.mark.parametrize("order", ["identity", "shuffle"])
@pytest.mark.parametrize("piece", [1, 100, 2000])
def test_hashing_a_piece_at_a_time_gives_the_digests_of_the_whole(
    tmp_path, monkeypatch, order, piece
):
    # One record a piece (1), a few (2000), a piece ending inside a record (100): the same
    # checksum file and manifest digests as one piece a buffer, and both true of the bytes.
    two_shard_source(tmp_path / "src")
    options = RepackOptions(order=order, seed=3)
    monkeypatch.setattr(shardfile_module, "DIGEST_PIECE_BYTES", 1 << 40)
    repack([tmp_path / "src"], tmp_path / "whole", options)
    monkeypatch.setattr(shardfile_module, "DIGEST_PIECE_BYTES", piece)
    repack([tmp_path / "src"], tmp_path / "pieces", options)
    assert shard_files(tmp_path / "pieces") == shard_files(tmp_path / "whole")
    manifest = json.loads((tmp_path / "pieces.manifest.json").read_text(encoding="utf-8"))
    whole = json.loads((tmp_path / "whole.manifest.json").read_text(encoding="utf-8"))
    names = ("rec", "idx", "crc")
    assert [{k: v for k, v in s.items() if k not in names} for s in manifest["shards"]] == [
        {k: v for k, v in s.items() if k not in names} for s in whole["shards"]
    ]
    rec = (tmp_path / "pieces.rec").read_bytes()
    (shard,) = manifest["shards"]
    assert shard["rec_xxh3_128"] == xxhash.xxh3_128_hexdigest(rec)
    entries = decode_checksums((tmp_path / "pieces.rec.crc").read_bytes(), "pieces.rec.crc")
    assert len(entries) == 14  # the record that is no image refused
    for offset, length, checksum in entries.tolist():
        assert checksum == xxhash.xxh3_64_intdigest(rec[offset : offset + length])


def test_a_failure_letting_go_of_the_sources_is_the_repacks_error(tmp_path, monkeypatch):
    # The sources are let go of on another thread: what fails there is raised by repack
    # (not printed by the thread and lost), and no manifest names the pack complete.
    two_shard_source(tmp_path / "src")
    real_close = copier_module.RecordCopier.close
    calls = []

    def failing_close(self):
        calls.append(1)
        if len(calls) == 1:
            raise RectoolError("cannot let go of the sources (injected)")
        real_close(self)

    monkeypatch.setattr(copier_module.RecordCopier, "close", failing_close)
    with pytest.raises(RectoolError, match="injected"):
        repack([tmp_path / "src"], tmp_path / "out", RepackOptions(order="shuffle", seed=1))
    assert not (tmp_path / "out.manifest.json").exists()
    assert len(calls) == 2  # and then once more, as the repack ends: nothing left mapped


@pytest.mark.parametrize("running", [True, False])
def test_the_garbage_collector_is_left_as_it_was(tmp_path, running):
    # A shuffle's batches are copied with the cyclic collector paused (a thousand memoryviews
    # at once); after the repack it runs again, or stays off if the caller had turned it off.
    two_shard_source(tmp_path / "src")
    options = RepackOptions(order="shuffle", seed=2)
    was = gc.isenabled()
    try:
        if not running:
            gc.disable()
        repack([tmp_path / "src"], tmp_path / "out", options)
        assert gc.isenabled() == running
    finally:
        if was:
            gc.enable()


KERNEL = pytest.param(
    True, marks=pytest.mark.skipif(not batches_module.KERNEL_GATHER, reason="no memfd here")
)


@pytest.mark.parametrize("kernel", [KERNEL, False], ids=["memfd", "bytearray"])
def test_batch_buffers_are_used_again_once_the_writer_is_done_with_them(kernel):
    waited = []
    buffers = batches_module.BatchBuffers(waited.append, count=2, size=8, kernel=kernel)
    first = buffers.join([b"ab", memoryview(b"cd")], 4)
    buffers.handed(7)  # the writer's job holding the first batch
    second = buffers.join([b"efg"], 3)
    buffers.handed(9)
    assert (bytes(first), bytes(second), waited) == (b"abcd", b"efg", [])
    third = buffers.join([b"hi", b"j"], 3)  # the first buffer again: once job 7 is done
    assert (bytes(third), waited, buffers.taken) == (b"hij", [7], 0)
    third[0] = ord("H")  # a writable view: the copy's header words are patched in place
    assert bytes(third) == b"Hij"
    # A batch larger than a buffer is joined into memory of its own; nothing is waited for.
    large = buffers.join([b"0123456789"], 10)
    assert (type(large), bytes(large), waited) == (bytearray, b"0123456789", [7])


@pytest.mark.parametrize("kernel", [KERNEL, False], ids=["memfd", "bytearray"])
@pytest.mark.parametrize("shard_records", [None, 4])
def test_batches_joined_into_reused_buffers_write_the_same_bytes(
    tmp_path, monkeypatch, shard_records, kernel
):
    # Small batches (one or two records), two buffers taken in turn: every batch but the
    # first two waits for the writer. A shard ending inside a batch takes it record by record.
    two_shard_source(tmp_path / "src")
    options = RepackOptions(order="shuffle", seed=4, shard_records=shard_records)
    monkeypatch.setattr(copier_module, "BATCH_BYTES", 1500)
    monkeypatch.setattr(batches_module, "BUFFER_COUNT", 2)
    monkeypatch.setattr(batches_module, "KERNEL_GATHER", kernel)
    joined, memory = [], set()
    real_join = batches_module.BatchBuffers.join

    def counted(self, parts, size):
        data = real_join(self, parts, size)
        joined.append(type(data).__name__)
        if isinstance(data, memoryview):  # a memfd's mapping, or a bytearray
            memory.add(type(data.obj).__name__)
        return data

    monkeypatch.setattr(batches_module.BatchBuffers, "join", counted)
    waited = []
    real_wait = ShardWriter.wait_written

    def wait_written(self, job):
        waited.append(job)
        return real_wait(self, job)

    monkeypatch.setattr(ShardWriter, "wait_written", wait_written)
    repack([tmp_path / "src"], tmp_path / "reused", options)
    assert joined.count("memoryview") >= 4  # in the buffers, used again
    assert memory == {"mmap" if kernel else "bytearray"}
    # Each buffer used again waits for the writer's job that held it (jobs count from 1).
    assert len(waited) == joined.count("memoryview") - 2
    assert all(job >= 1 for job in waited) and waited == sorted(waited)
    monkeypatch.setattr(
        batches_module.BatchBuffers, "join", lambda self, parts, size: bytearray().join(parts)
    )
    repack([tmp_path / "src"], tmp_path / "new", options)
    for suffix in (".idx", ".rec.crc", ".rec") if not shard_records else ("-00000.rec",):
        assert (tmp_path / f"reused{suffix}").read_bytes() == (
            tmp_path / f"new{suffix}"
        ).read_bytes(), suffix
    if shard_records:
        for number in range(4):
            for suffix in (".rec", ".idx", ".rec.crc"):
                name = f"-{number:05d}{suffix}"
                assert (tmp_path / f"reused{name}").read_bytes() == (
                    tmp_path / f"new{name}"
                ).read_bytes(), name


def test_a_batch_buffer_holds_what_its_batches_need():
    # A bytearray buffer is zeroed as it is made: it grows a MiB at a time to the largest batch
    # it held, never past BATCH_BYTES (a million small records: 1.4 MiB batches, not 8 MiB).
    # (A memfd's pages are allocated as they are written.)
    buffers = batches_module.BatchBuffers(lambda job: None, count=1, size=4 << 20, kernel=False)
    small = buffers.join([b"x" * 10], 10)
    assert len(small.obj) == 1 << 20
    buffers.handed(1)
    larger = buffers.join([b"y" * (3 << 19)], 3 << 19)
    assert (len(larger.obj), bytes(larger[:2])) == (2 << 20, b"yy")
    buffers.handed(2)
    again = buffers.join([b"z" * 10], 10)
    assert (len(again.obj), bytes(again)) == (2 << 20, b"z" * 10)


@pytest.mark.skipif(not batches_module.KERNEL_GATHER, reason="no memfd here")
def test_a_batch_the_kernel_copies_in_part_is_finished_by_more_calls(monkeypatch):
    # pwritev may copy less than asked (a signal): the next call starts where it stopped, in
    # every group of IOV_MAX parts. (Copied by Python instead, a source cut while mapped
    # would die of SIGBUS there: a call from there raises EFAULT, the test below.)
    real = os.pwritev
    calls = []

    def short(fd, parts, offset):
        calls.append(bytes(parts[0]))
        return real(fd, [memoryview(parts[0])[:3]], offset)  # 3 bytes of the first part

    monkeypatch.setattr(batches_module, "IOV_MAX", 2)
    monkeypatch.setattr(os, "pwritev", short)
    buffers = batches_module.BatchBuffers(lambda job: None, count=1, size=64, kernel=True)
    parts = [b"abcde", memoryview(b"fg"), b"hijklmn", b"o", b"pqr"]
    joined = buffers.join(parts, 18)
    assert bytes(joined) == b"abcdefghijklmnopqr"
    assert type(joined.obj).__name__ == "mmap"
    assert calls == [b"abcde", b"de", b"fg", b"hijklmn", b"klmn", b"n", b"o", b"pqr"]
    buffers.close()


@pytest.mark.skipif(not batches_module.KERNEL_GATHER, reason="no memfd here")
def test_a_batch_the_kernel_cannot_copy_is_an_error_and_the_memfds_are_closed(monkeypatch):
    # EFAULT: a source's mapped pages gone (the file cut while it was read); a Python copy
    # would have died of SIGBUS instead.
    def failing(fd, parts, offset):
        raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))

    buffers = batches_module.BatchBuffers(lambda job: None, count=1, size=64, kernel=True)
    assert bytes(buffers.join([b"ab"], 2)) == b"ab"
    memfd = buffers._memfds[0]
    os.fstat(memfd)  # open
    monkeypatch.setattr(os, "pwritev", failing)
    with pytest.raises(RectoolError, match=r"cannot copy 1 records from the mapped sources"):
        buffers.join([b"cd"], 2)
    buffers.close()
    with pytest.raises(OSError):
        os.fstat(memfd)
    assert buffers._memfds == []


def test_without_a_memfd_a_batch_is_copied_into_a_bytearray(monkeypatch):
    # memfd_create refused (a sandbox, no descriptors left): the buffers are bytearrays.
    def refused(*args):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(os, "memfd_create", refused, raising=False)
    buffers = batches_module.BatchBuffers(lambda job: None, count=2, size=64, kernel=True)
    joined = buffers.join([b"ab", b"cd"], 4)
    assert (bytes(joined), type(joined.obj), buffers.kernel) == (b"abcd", bytearray, False)


@pytest.mark.skipif(not batches_module.KERNEL_GATHER, reason="no memfd here")
def test_a_source_cut_while_mapped_is_an_error_not_a_crash(tmp_path):
    # The real kernel: a part whose mapped pages are past the end of its file (cut after it
    # was mapped). Copied by Python, this read dies of SIGBUS.
    path = tmp_path / "source.rec"
    path.write_bytes(b"x" * 8192)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    os.truncate(path, 100)
    view = memoryview(mapped)
    buffers = batches_module.BatchBuffers(lambda job: None, count=1, size=1 << 16, kernel=True)
    try:
        assert bytes(buffers.join([view[:50]], 50)) == b"x" * 50  # still in the file
        buffers.handed(1)
        with pytest.raises(RectoolError, match=r"was a source file changed while it was read"):
            buffers.join([view[:50], view[4096:8192]], 4146)
    finally:
        view.release()
        mapped.close()
        buffers.close()
