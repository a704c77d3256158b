"""The shard cache: shared by processes (each shard downloaded once), bounded (least recently
used shards evicted, never a held one), and never serving a half-downloaded or corrupt shard."""

from __future__ import annotations

import itertools
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
from helpers.servers import no_wait

from rectool import open_dataset
from rectool.remote import Retry, ShardCache
from rectool.remote.cache import CachedObject
from rectool.remote.order import block_order
from rectool.training import Loader

SHARD_BYTES = 3408  # the largest shard of the 4-shard test pack


def rec_gets(faults):
    return {name: n for name, n in faults.gets.items() if name.endswith(".rec")}


def _rank(url, cache_dir, rank, out):
    ds = open_dataset(url, cache_dir=cache_dir, retry=Retry(sleep=no_wait))
    with Loader(ds, batch_size=2, workers=2, rank=rank, world_size=2, seed=1) as loader:
        out.put((rank, [label for _, labels in loader for label in labels.tolist()]))


def test_two_ranks_and_their_workers_share_one_cache_each_shard_downloaded_once(s3_pack, tmp_path):
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    cache_dir = str(tmp_path / "cache")
    ranks = [context.Process(target=_rank, args=(s3_pack.url, cache_dir, r, out)) for r in range(2)]
    for p in ranks:
        p.start()
    got = dict(out.get(timeout=300) for _ in ranks)
    for p in ranks:
        p.join()
    assert [p.exitcode for p in ranks] == [0, 0]
    assert rec_gets(s3_pack.faults) == {f"faces-0000{i}.rec": 1 for i in range(4)}
    assert sorted(got[0] + got[1]) == sorted(open_dataset(str(s3_pack.local)).labels.tolist())


def small_files(pack):
    """Bytes of what the cache keeps of `pack` besides its shards: the manifest and the binary
    index's arrays (not the .idx files, which a pack of format 3 is read without)."""
    described = [
        pack.local,
        *(pack.folder / f"faces.{a}.npy" for a in ("offsets", "keys", "labels")),
    ]
    return sum(p.stat().st_size for p in described)


def test_an_epoch_under_a_small_cache_limit_downloads_each_shard_once_within_it(s3_pack, tmp_path):
    limit = 2 * SHARD_BYTES + small_files(s3_pack)
    ds = open_dataset(
        s3_pack.url,
        cache_dir=str(tmp_path / "cache"),
        cache_limit=limit,
        block_shards=1,
        prefetch_shards=1,
        open_shards=1,
        retry=Retry(sleep=no_wait),
    )
    local = open_dataset(str(s3_pack.local))
    with Loader(ds, batch_size=3, workers=1, seed=2) as loader:
        order = loader.sampler.global_order()
        labels = [label for _, batch in loader for label in batch.tolist()]
    assert labels == [int(local.labels[i]) for i in order]
    assert sorted(order.tolist()) == list(range(12))
    ds.close()
    used, shards = ds.shard_cache.usage()
    assert used <= limit and len(shards) <= 2  # two of the four shards read were evicted
    # No pass over the shards before the epoch (the labels are the index's), and each block's
    # shard read once: every shard downloaded once.
    assert rec_gets(s3_pack.faults) == {f"faces-0000{i}.rec": 1 for i in range(4)}


class Clock:
    def __init__(self):
        self.now = itertools.count(1_000_000_000)

    def __call__(self):
        return next(self.now)


@pytest.fixture
def objects(tmp_path, http_pack):
    """`CachedObject`s of the four .rec shards of the HTTP pack, and a `make(limit)` cache."""
    import json

    from rectool.remote import open_store

    doc = json.loads(http_pack.local.read_text())
    store = open_store(http_pack.url.rsplit("/", 1)[0])
    folder = tmp_path / "cache" / "packs" / "p"
    folder.mkdir(parents=True)
    made = [
        CachedObject(
            store,
            s["rec"],
            str(folder / s["rec"]),
            s["rec_bytes"],
            "xxh3-128",
            s["rec_xxh3_128"],
            s["rec"],
        )
        for s in doc["shards"]
    ]

    def make(limit):
        return ShardCache(tmp_path / "cache", limit, Clock(), Retry(sleep=no_wait))

    return made, make, http_pack.faults


def present(objects):
    return [os.path.exists(o.path) for o in objects]


def test_the_least_recently_used_shard_is_evicted_first(objects):
    objs, make, _ = objects
    cache = make(limit=2 * SHARD_BYTES)
    for o in (objs[0], objs[1], objs[0]):  # shard 0 used last
        cache.pin(o).release()
    cache.pin(objs[2]).release()
    assert present(objs) == [True, False, True, False]


def test_a_held_shard_is_never_evicted_even_past_the_limit(objects):
    objs, make, _ = objects
    cache = make(limit=SHARD_BYTES)
    held = cache.pin(objs[0])
    other = cache.pin(objs[1])  # no room, but shard 0 is held: the limit is passed instead
    assert present(objs) == [True, True, False, False]
    other.release()
    cache.pin(objs[2]).release()  # shard 1 is free to go, shard 0 still held
    assert present(objs) == [True, False, True, False]
    held.release()
    cache.pin(objs[3]).release()
    assert present(objs)[0] is False


def test_a_shard_held_by_another_process_is_never_evicted(objects):
    objs, make, _ = objects
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()

    def hold():
        pin = make(None).pin(objs[0])
        ready.set()
        done.wait(60)
        pin.release()

    holder = context.Process(target=hold)
    holder.start()
    try:
        assert ready.wait(60)
        cache = make(limit=SHARD_BYTES)
        cache.pin(objs[1]).release()
        assert present(objs)[:2] == [True, True]
    finally:
        done.set()
        holder.join()
    cache.pin(objs[2]).release()  # let go by the other process: evicted now
    assert present(objs) == [False, False, True, False]


def test_a_half_downloaded_shard_left_by_a_killed_run_is_never_used(objects):
    objs, make, faults = objects
    o = objs[1]
    partial = os.path.join(os.path.dirname(o.path), f".{os.path.basename(o.path)}.x1y2.tmp")
    with open(partial, "wb") as f:  # what a kill during a download leaves
        f.write(b"\0" * 1000)
    cache = make(None)
    cache.pin(o).release()
    assert faults.gets[os.path.basename(o.path)] == 1
    from rectool.format.digest import file_hexdigest

    assert file_hexdigest(o.path, "xxh3-128") == o.digest


def test_usage_counts_the_shards_and_partial_downloads(objects):
    objs, make, _ = objects
    cache = make(None)
    cache.pin(objs[0]).release()
    assert cache.usage()[0] == os.path.getsize(objs[0].path)


def test_the_limit_counts_every_file_of_the_cache_not_only_the_shards(objects):
    objs, make, _ = objects
    folder = os.path.dirname(objs[0].path)
    sizes = [o.size for o in objs]
    with open(os.path.join(folder, "faces-00000.idx"), "wb") as f:  # what a pack keeps beside
        f.write(b"0\t0\n" * 25)  # 100 bytes
    cache = make(limit=sizes[0] + sizes[1] + 99)  # two shards, not two shards and the index
    cache.pin(objs[0]).release()
    cache.pin(objs[1]).release()
    assert present(objs) == [False, True, False, False]
    assert cache.usage() == (
        sizes[1] + 100,
        [(os.stat(objs[1].path).st_atime_ns, objs[1].path, sizes[1])],
    )


def test_usage_counts_the_manifest_and_index_of_an_opened_pack(s3_pack, tmp_path):
    ds = open_dataset(s3_pack.url, cache_dir=str(tmp_path / "read"), retry=Retry(sleep=no_wait))
    assert len(ds.labels) == 12 and len(ds[11][0])  # the index mapped, the last shard read
    ds.close()
    used, shards = ds.shard_cache.usage()
    assert used == sum(size for *_, size in shards) + small_files(s3_pack)


def test_block_order_is_a_seeded_permutation_a_block_of_shards_at_a_time():
    shard_of = np.repeat(np.arange(10), [7, 3, 5, 5, 9, 1, 4, 6, 2, 8])
    order = block_order(shard_of, epoch=1, seed=4, block_shards=3)
    assert sorted(order.tolist()) == list(range(len(shard_of)))
    assert (order == block_order(shard_of, epoch=1, seed=4, block_shards=3)).all()
    assert not (order == block_order(shard_of, epoch=2, seed=4, block_shards=3)).all()
    # Read in blocks: each run of the order covers 3 shards (the last block: 1).
    blocks, position = [], 0
    seen = shard_of[order]
    while position < len(order):
        shards = set()
        while position < len(order) and (seen[position] in shards or len(shards) < 3):
            shards.add(int(seen[position]))
            position += 1
        blocks.append(shards)
    assert [len(b) for b in blocks] == [3, 3, 3, 1]
    assert set().union(*blocks) == set(range(10))


class BlockingStore:
    """A store whose one object arrives only when `go` is set (`started`: it was asked)."""

    def __init__(self, data):
        import threading

        self.data, self.started, self.go = data, threading.Event(), threading.Event()

    def object_url(self, name):
        return f"test://{name}"

    def stream(self, name, start=0):
        self.started.set()
        self.go.wait(60)
        yield self.data[start:]


def test_a_child_forked_during_a_download_does_not_keep_its_lock(tmp_path):
    import fcntl
    import threading

    import xxhash

    data = b"x" * 1000
    store = BlockingStore(data)
    folder = tmp_path / "cache" / "packs" / "p"
    folder.mkdir(parents=True)
    path = str(folder / "a.rec")
    obj = CachedObject(
        store, "a.rec", path, len(data), "xxh3-128", xxhash.xxh3_128_hexdigest(data), "a.rec"
    )
    cache = ShardCache(tmp_path / "cache", None, Clock(), Retry(sleep=no_wait))
    downloading = threading.Thread(target=lambda: cache.pin(obj).release())
    downloading.start()
    assert store.started.wait(60)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # holds a copy of every descriptor, the download's lock included
        os.read(read_end, 1)
        os._exit(0)
    try:
        store.go.set()
        downloading.join()
        # The next downloader's lock (the file is removed once let go, so it opens it anew
        # as `cache.acquire` does): BlockingIOError if the child still held it.
        fd = os.open(path + ".download", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        os.write(write_end, b"x")
        os.waitpid(child, 0)


def test_a_mirror_copy_counts_against_the_limit_and_is_evicted_whole_once_let_go(
    objects, http_pack, tmp_path
):
    from rectool.remote.mirror import local_copy, release_copy

    objs, make, _ = objects
    copy = local_copy(http_pack.url, str(tmp_path / "cache"), Retry(sleep=no_wait))
    folder = os.path.dirname(copy)
    copy_bytes = sum(p.stat().st_size for p in Path(folder).iterdir())
    cache = make(limit=SHARD_BYTES)
    assert cache.usage()[0] == copy_bytes  # counted, though no shard is cached yet
    cache.pin(objs[0]).release()  # no room, but the copy is in use: kept, the limit passed
    assert os.path.exists(copy) and present(objs)[0]
    release_copy(copy)
    cache.pin(objs[1]).release()  # room made: shard 0, then the copy, are evicted
    assert not os.path.exists(folder) and present(objs)[:2] == [False, True]
    assert cache.usage()[0] == objs[1].size


def test_a_check_that_fails_lets_the_shards_lock_go(objects, monkeypatch):
    """A cached shard whose check fails (a read error, a Ctrl-C while it is read whole) lets its
    lock go: a descriptor left holding it would keep every evictor off that shard, and its
    lock file in the cache, for as long as the process lives."""
    objs, make, _ = objects
    cache = make(None)
    cache.pin(objs[0]).release()
    lock = objs[0].path + ".lock"
    fds = set(os.listdir("/proc/self/fd"))

    def unreadable(obj):
        raise OSError(5, "Input/output error", obj.path)

    monkeypatch.setattr(ShardCache, "intact", staticmethod(unreadable))
    with pytest.raises(OSError, match="Input/output error"):
        cache.pin(objs[0])
    assert set(os.listdir("/proc/self/fd")) <= fds  # no descriptor kept
    assert not os.path.exists(lock)  # let go, and removed by its last holder


@pytest.mark.parametrize("when", ["pin", "release"])
def test_a_use_that_cannot_be_stamped_lets_the_shards_lock_go(objects, monkeypatch, when):
    """Stamping a shard's last use (for eviction) fails on another user's file in a shared
    cache (EPERM): the pin, or its release, fails, but never keeps the lock held."""
    import rectool.remote.cache as cache_module
    from rectool.errors import RectoolError

    objs, make, _ = objects
    cache = make(None)
    cache.pin(objs[0]).release()
    fds = set(os.listdir("/proc/self/fd"))
    held = cache.pin(objs[0]) if when == "release" else None

    def refused(path, when):
        raise RectoolError(f"{path}: cannot write (Operation not permitted)")

    monkeypatch.setattr(cache_module, "set_used", refused)
    with pytest.raises(RectoolError, match="Operation not permitted"):
        held.release() if held else cache.pin(objs[0])
    assert set(os.listdir("/proc/self/fd")) <= fds  # no descriptor kept
    assert not os.path.exists(objs[0].path + ".lock")  # let go, removed by its last holder
