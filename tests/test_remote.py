"""A remote pack opens where a local one does: `open_dataset(URL)` over a shard cache, on a real
S3 server (moto) and a plain HTTP server of byte ranges, both on 127.0.0.1 (conftest.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers.servers import no_wait

from rectool import open_dataset
from rectool.format import indexcache
from rectool.remote import Retry
from rectool.remote.dataset import RemoteDataset
from rectool.training import Loader


def no_sleep():
    sleeps = []
    return Retry(sleep=sleeps.append, jitter=False), sleeps


def opened(pack, tmp_path, **options):
    options.setdefault("retry", no_sleep()[0])
    return open_dataset(pack.url, cache_dir=str(tmp_path / "cache"), **options)


def rec_gets(faults):
    return {name: n for name, n in faults.gets.items() if name.endswith(".rec")}


def test_a_remote_pack_reads_the_same_samples_as_the_local_pack(remote_pack, tmp_path):
    ds, local = opened(remote_pack, tmp_path), open_dataset(str(remote_pack.local))
    assert isinstance(ds, RemoteDataset) and len(ds) == len(local) == 12
    assert [bytes(ds.raw(i)[0]) for i in range(12)] == [bytes(local.raw(i)[0]) for i in range(12)]
    assert ds.labels.tolist() == local.labels.tolist()
    assert ds.keys.tolist() == local.keys.tolist()


def test_opening_fetches_the_indexes_and_a_shard_only_when_it_is_read(s3_pack, tmp_path):
    ds = opened(s3_pack, tmp_path)
    idx = {n for n in s3_pack.faults.gets if n.endswith(".idx")}
    assert idx == {f"faces-0000{i}.idx" for i in range(4)}
    assert rec_gets(s3_pack.faults) == {"faces-00000.rec": 1}  # record 0: the layout check
    ds.raw(7)  # shard 2
    assert rec_gets(s3_pack.faults) == {"faces-00000.rec": 1, "faces-00002.rec": 1}
    ds.raw(8)
    ds.close()
    again = opened(s3_pack, tmp_path)  # the cache serves a second open
    again.raw(7)
    assert rec_gets(s3_pack.faults) == {"faces-00000.rec": 1, "faces-00002.rec": 1}


def test_a_remote_pack_of_several_shards_maps_one_index_cache_on_this_machine(
    remote_pack, tmp_path, monkeypatch
):
    import pickle

    monkeypatch.setattr(indexcache, "INDEX_CACHE_MIN_RECORDS", 10)
    ds, local = opened(remote_pack, tmp_path), open_dataset(str(remote_pack.local))
    mapped = mapping_of(ds.keys)
    assert mapped is not None and mapped.path.endswith("faces.idx.rtc")
    assert mapped is mapping_of(ds.offsets)
    copy = pickle.loads(pickle.dumps(ds))  # as a spawned loader worker gets it: mapped again
    assert mapping_of(copy.offsets).path == mapped.path
    assert [bytes(copy.raw(i)[0]) for i in range(12)] == [bytes(local.raw(i)[0]) for i in range(12)]
    assert copy.keys.tolist() == local.keys.tolist()


def test_two_opens_of_a_remote_pack_at_once_write_its_index_cache_once(
    remote_pack, tmp_path, monkeypatch, no_hang
):
    """Ranks that open a remote pack together on one machine: one writes the index cache, the
    others map that file (a second write would rename another over it, and the first rank's
    dataset could no longer be pickled to its spawned workers)."""
    import pickle
    import threading

    from rectool.remote import cache as cache_module
    from rectool.remote import dataset as dataset_module

    monkeypatch.setattr(indexcache, "INDEX_CACHE_MIN_RECORDS", 10)
    at_lock, opens, writes = threading.Event(), {}, []
    real_open_lock, real_write = cache_module.open_lock_file, dataset_module.write_dataset_cache

    def open_lock(path):  # the second open has come to the cache's lock
        if path.endswith(".idx.rtc.download") and threading.current_thread().name == "second":
            at_lock.set()
        return real_open_lock(path)

    def second():
        try:
            opens["second"] = opened(remote_pack, tmp_path)
        finally:
            at_lock.set()  # without a lock it never waits: it has written its own

    other = threading.Thread(target=second, name="second")

    def write(local, idx_paths):  # the first open writes only once the second has looked
        writes.append(threading.current_thread().name)
        if not other.is_alive() and "second" not in opens:
            other.start()
            at_lock.wait()
        return real_write(local, idx_paths)

    monkeypatch.setattr(cache_module, "open_lock_file", open_lock)
    monkeypatch.setattr(dataset_module, "write_dataset_cache", write)
    first = opened(remote_pack, tmp_path)
    other.join()
    assert writes == ["MainThread"]
    want = open_dataset(str(remote_pack.local)).keys.tolist()
    for ds in (first, opens["second"]):
        copy = pickle.loads(pickle.dumps(ds))  # as the Loader's spawned workers get it
        assert mapping_of(copy.keys) is not None and copy.keys.tolist() == want


def mapping_of(array):
    while isinstance(array, np.ndarray):
        array = array.base
    array = getattr(array, "obj", array)
    return array if hasattr(array, "madvise") else None


@pytest.mark.parametrize("workers", [1, 3])
def test_a_loader_epoch_over_a_remote_pack_gives_every_sample_once_with_the_local_labels(
    remote_pack, tmp_path, workers
):
    ds, local = opened(remote_pack, tmp_path), open_dataset(str(remote_pack.local), decode="rgb")
    with Loader(ds, batch_size=5, workers=workers, seed=3, copy=True) as loader:
        order = loader.sampler.global_order()
        batches = list(loader)
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    assert sorted(order.tolist()) == list(range(12))
    assert labels.tolist() == [int(local.labels[i]) for i in order]
    assert all((images[k] == local[i][0]).all() for k, i in enumerate(order.tolist()))


def test_the_loader_order_is_the_same_whatever_the_worker_count(s3_pack, tmp_path):
    ds = opened(s3_pack, tmp_path)
    seen = []
    for workers in (1, 2, 3):
        with Loader(ds, batch_size=4, workers=workers, seed=5) as loader:
            loader.set_epoch(2)
            seen.append([label for _, labels in loader for label in labels.tolist()])
    assert seen[0] == seen[1] == seen[2]


def test_a_shard_whose_bytes_differ_from_the_manifest_is_refused_by_name(s3, s3_pack, tmp_path):
    damaged = bytearray((s3_pack.folder / "faces-00002.rec").read_bytes())
    damaged[100] ^= 0xFF
    bucket = s3_pack.url.split("/")[2]
    s3.client().put_object(Bucket=bucket, Key="packs/faces-00002.rec", Body=bytes(damaged))
    ds = opened(s3_pack, tmp_path)
    ds.raw(0)
    with pytest.raises(Exception) as caught:
        ds.raw(7)
    message = str(caught.value)
    assert type(caught.value).__name__ == "DigestMismatchError"
    assert f"s3://{bucket}/packs/faces-00002.rec (shard 2 of faces.manifest.json)" in message
    assert "xxh3-128" in message and "not used" in message
    folder = next((tmp_path / "cache" / "packs").iterdir())
    names = {p.name for p in folder.iterdir()}
    assert "faces-00002.rec" not in names and not [n for n in names if n.endswith(".tmp")]


def test_500_twice_and_a_connection_dropped_mid_shard_are_survived(remote_pack, tmp_path):
    retry, sleeps = no_sleep()
    remote_pack.faults.plan("faces-00001.rec", "500", "500")
    remote_pack.faults.plan("faces-00002.rec", "drop")
    ds, local = opened(remote_pack, tmp_path, retry=retry), open_dataset(str(remote_pack.local))
    assert [bytes(ds.raw(i)[0]) for i in range(12)] == [bytes(local.raw(i)[0]) for i in range(12)]
    assert remote_pack.faults.gets["faces-00001.rec"] == 3
    # The dropped transfer was asked again from the byte that reached the cache: over HTTP the
    # half sent (urllib hands bytes over as they come); obstore buffers a 1 MiB chunk, more
    # than this small shard, so from its start.
    first, resumed = remote_pack.faults.ranges["faces-00002.rec"]
    size = (remote_pack.folder / "faces-00002.rec").stat().st_size
    assert first == 0 and (0 < resumed < size if remote_pack.url.startswith("http") else True)
    assert sleeps == [0.5, 1.0, 0.5]  # backoff doubling, then a fresh start for the next failure


def test_after_the_retries_the_error_names_the_url_and_shard_and_no_credential(
    remote_pack, tmp_path
):
    retry = Retry(attempts=3, sleep=no_wait)
    remote_pack.faults.plan("faces-00003.rec", *["500"] * 10)
    ds = opened(remote_pack, tmp_path, retry=retry)
    with pytest.raises(Exception) as caught:
        ds.raw(11)
    message = str(caught.value)
    assert "faces-00003.rec (shard 3 of faces.manifest.json)" in message
    assert "gave up after 3 tries" in message
    assert remote_pack.faults.gets["faces-00003.rec"] == 3
    assert "testing-secret-never-shown" not in message and "testing-key-id" not in message


def test_a_missing_manifest_is_one_clear_error(s3_pack, tmp_path):
    url = s3_pack.url.replace("faces.manifest.json", "other.manifest.json")
    with pytest.raises(Exception) as caught:
        open_dataset(url, cache_dir=str(tmp_path / "cache"))
    assert str(caught.value) == f"{url}: not found"


def test_remote_options_for_a_local_pack_are_refused(tmp_path):
    with pytest.raises(TypeError, match="cache_dir"):
        open_dataset(str(tmp_path / "faces"), cache_dir=str(tmp_path))


def test_urls_are_shown_without_their_credentials():
    from rectool.remote import safe_url

    assert safe_url("https://me:pw@host/p/x.json?X-Amz-Signature=abc") == "https://host/p/x.json"


def test_a_remote_pack_opens_when_its_optional_index_cache_cannot_be_locked(
    remote_pack, tmp_path, monkeypatch
):
    """The pack's index cache only saves time: when its lock cannot be opened (here a folder
    left at PREFIX.idx.rtc.download; likewise a link, EACCES or EROFS on a shared cache
    folder), the pack opens without it."""
    from rectool.remote import Retry

    monkeypatch.setattr(indexcache, "INDEX_CACHE_MIN_RECORDS", 10)
    retry = Retry(sleep=lambda s: None, jitter=False)
    first = open_dataset(remote_pack.url, cache_dir=str(tmp_path / "cache"), retry=retry)
    want = first.keys.tolist()
    cache = next(
        os.path.join(root, name)
        for root, _, names in os.walk(tmp_path / "cache")
        for name in names
        if name.endswith(".idx.rtc")
    )
    os.remove(cache)
    os.remove(cache + ".download")  # the lock the first open left
    os.mkdir(cache + ".download")  # what is there instead of a lock file
    ds = open_dataset(remote_pack.url, cache_dir=str(tmp_path / "cache"), retry=retry)
    assert ds.keys.tolist() == want
