"""Adversarial review of the one index cache of a pack of several shards (`PREFIX.idx.rtc`):
reproductions of the defects found. Each test here fails on the code under review.

What was tried and held up is in tests/test_adv_dataset_cache_holds.py.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading

import pytest
from helpers.handmade_datasets import write_pack

from rectool.format.indexcache import write_index_caches
from rectool.reader import RectoolError, open_dataset


def sharded_pack(folder, shards=3, per=20):
    """A hand-made pack of `shards` shards of `per` records b"img<k>" (key k, label k % 7)."""
    prefix = os.fspath(folder / "many")
    items = [[(k, b"img%d" % k, float(k % 7)) for k in range(s * per, (s + 1) * per)]
             for s in range(shards)]  # fmt: skip
    return prefix, write_pack(prefix, items)


def places(ds):
    return [ds.location(i) for i in range(len(ds))]


def expected_places(samples):
    return [(s.rec, s.offset, s.key) for s in samples]


# --- 1. a dataset cache cut short inside its per-shard entries ------------------------------
# read_dataset_cache reads 24 + 32 * S bytes and unpacks an entry at every 32 bytes from 24 on,
# so a file that ends inside an entry raises struct.error from DATASET_CACHE_SHARD.unpack_from
# before the length check. A cache copied in part (an interrupted rsync or scp, a full disk
# on a copy, a network file system) then stops every open of the pack, and `rectool verify`.

CUTS = [30, 24 + 32 + 5, 24 + 2 * 32 + 31]  # ends inside entry 0, 1, 2 (of 3)


@pytest.mark.parametrize("cut", CUTS)
def test_a_dataset_cache_cut_inside_its_shard_entries_is_ignored(tmp_path, cut):
    prefix, samples = sharded_pack(tmp_path)
    write_index_caches(prefix)
    path = f"{prefix}.idx.rtc"
    with open(path, "rb") as f:
        data = f.read(cut)
    with open(path, "wb") as f:
        f.write(data)
    ds = open_dataset(prefix)  # struct.error on the code under review
    assert places(ds) == expected_places(samples)


@pytest.mark.parametrize("cut", CUTS)
def test_verify_survives_a_dataset_cache_cut_inside_its_shard_entries(tmp_path, cut):
    from rectool.inspect.verify import verify_dataset

    prefix, _ = sharded_pack(tmp_path)
    write_index_caches(prefix)
    before = {p.kind for p in verify_dataset(prefix).problems}
    path = f"{prefix}.idx.rtc"
    with open(path, "rb") as f:
        data = f.read(cut)
    with open(path, "wb") as f:
        f.write(data)
    # check_dataset_cache catches OSError, ValueError and RectoolError, not struct.error
    assert {p.kind for p in verify_dataset(prefix).problems} == before


@pytest.mark.parametrize("command", ["verify", "dali-index"])
def test_commands_on_a_pack_whose_dataset_cache_is_cut_print_no_traceback(tmp_path, command):
    prefix, _ = sharded_pack(tmp_path)
    write_index_caches(prefix)
    path = f"{prefix}.idx.rtc"
    with open(path, "rb") as f:
        data = f.read(CUTS[1])
    with open(path, "wb") as f:
        f.write(data)
    extra = {"verify": [], "dali-index": [os.fspath(tmp_path / "dali.idx")]}
    done = subprocess.run(
        [sys.executable, "-m", "rectool", command, prefix, *extra[command]],
        capture_output=True,
        text=True,
    )
    assert "Traceback" not in done.stderr, done.stderr[-300:]


# --- 2. two processes opening a remote pack at once -----------------------------------------
# RemoteDataset.__init__ checks for the local dataset cache and, when there is none, writes it,
# with no lock: ranks (or jobs) that open the same remote pack on one machine at the same time
# all find none (they wait together for the same .idx downloads, then go on together) and all
# write it, each renaming its own over the others'. Every rank but the last maps a file that
# is no longer at the path: its dataset cannot be pickled to spawned loader workers any more
# ("replaced after the dataset was opened"), and the machine holds one copy per rank in the
# page cache, where the change meant one for all. The interleaving is injected: the second
# open runs whole between the first one's check and its write.


def test_two_opens_of_a_remote_pack_at_once_both_pickle_to_spawned_workers(
    remote_pack, tmp_path, monkeypatch
):
    from rectool.remote import dataset as dataset_module

    def opened():
        return open_dataset(remote_pack.url, cache_dir=str(tmp_path / "cache"))

    monkeypatch.setattr(dataset_module, "INDEX_CACHE_MIN_RECORDS", 10)
    real, others = dataset_module.write_dataset_cache, []

    def write_after_another_open(local, idx_paths):
        # The other rank looked before this one's cache was renamed in. It opens in a thread:
        # were the check and the write made under a lock, it would wait there (60 s at most,
        # never reached otherwise) and find this one's cache when it is free.
        if not others:
            other = threading.Thread(target=lambda: others.append(opened()))
            others.append(other)
            other.start()
            other.join(60)
        return real(local, idx_paths)

    monkeypatch.setattr(dataset_module, "write_dataset_cache", write_after_another_open)
    first = opened()
    others[0].join()
    second = others[1]
    want = open_dataset(str(remote_pack.local), cache=False).keys.tolist()
    for ds in (first, second):
        try:
            copy = pickle.loads(pickle.dumps(ds))  # as the Loader's spawned workers get it
        except RectoolError as exc:
            pytest.fail(f"a dataset opened beside another cannot reach its workers: {exc}")
        assert copy.keys.tolist() == want


# --- 3. the demo's folder: a marker that licenses deleting whatever is there later ----------
# fresh_folder adopts an existing empty folder (writes .rectool-demo into it); from then on
# every run rmtree's that folder whole, whatever was put there since: `python -m rectool.demo
# .` in a new, empty project folder, then work in it, then the demo again, deletes the work.


def test_the_demo_never_deletes_files_it_did_not_write_in_a_folder_it_adopted(tmp_path):
    from rectool.demo import fresh_folder

    project = tmp_path / "project"
    project.mkdir()
    fresh_folder(project)  # empty: adopted (the demo did not make it)
    (project / "tree").mkdir()  # what the demo writes
    (project / "train.py").write_text("weeks of work")  # what the user wrote there since
    try:
        fresh_folder(project)
    except SystemExit:
        pass  # refusing is fine
    assert (project / "train.py").read_text() == "weeks of work"
