"""The one index cache of a pack of several shards (`PREFIX.idx.rtc`) under attack: damaged,
crafted, stale, replaced, or left by another pack; pickled, spawned, repacked, resumed.

The rule checked throughout: with a cache in any state, the reader gives the samples that the
.idx text gives (cache=False), or refuses with a RectoolError; never other samples, a hang or
a traceback of another kind.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from helpers.handmade_datasets import write_insightface, write_pack, write_shard

from rectool.format import indexcache
from rectool.format.indexcache import write_dataset_cache, write_index_caches
from rectool.reader import RecordFormatError, RectoolError, open_dataset


def sharded_pack(folder, shards=3, per=20, name="many"):
    prefix = os.fspath(folder / name)
    items = [[(k, b"img%05d" % k, float(k % 7)) for k in range(s * per, (s + 1) * per)]
             for s in range(shards)]  # fmt: skip
    return prefix, write_pack(prefix, items)


def places(ds):
    return [ds.location(i) for i in range(len(ds))]


def expected(samples):
    return [(s.rec, s.offset, s.key) for s in samples]


def mapped_path(array):
    while isinstance(array, np.ndarray):
        array = array.base
    array = getattr(array, "obj", array)
    return getattr(array, "path", None)


def cache_of(prefix):
    return f"{prefix}.idx.rtc"


def test_a_cache_that_is_a_link_fifo_or_folder_is_ignored(tmp_path, no_hang):
    prefix, samples = sharded_pack(tmp_path)
    write_index_caches(prefix)
    real = tmp_path / "elsewhere.rtc"
    os.replace(cache_of(prefix), real)
    os.symlink(real, cache_of(prefix))
    assert mapped_path(open_dataset(prefix).keys) is None
    os.remove(cache_of(prefix))
    os.mkfifo(cache_of(prefix))
    ds = open_dataset(prefix)
    assert mapped_path(ds.keys) is None and places(ds) == expected(samples)
    os.remove(cache_of(prefix))
    os.mkdir(cache_of(prefix))
    assert places(open_dataset(prefix)) == expected(samples)


@pytest.mark.parametrize("shards", [2, 4, 2**40, 2**64 - 1])
def test_a_cache_that_claims_another_shard_count_is_ignored(tmp_path, shards):
    prefix, samples = sharded_pack(tmp_path)
    write_index_caches(prefix)
    data = bytearray(open(cache_of(prefix), "rb").read())
    struct.pack_into("<Q", data, 8, shards)
    open(cache_of(prefix), "wb").write(bytes(data))
    ds = open_dataset(prefix)
    assert mapped_path(ds.keys) is None and places(ds) == expected(samples)


@pytest.mark.parametrize("records", [61, 2**60, 2**64 - 1])
def test_a_cache_that_claims_a_huge_record_count_is_ignored(tmp_path, records):
    prefix, samples = sharded_pack(tmp_path)
    write_index_caches(prefix)
    data = bytearray(open(cache_of(prefix), "rb").read())
    struct.pack_into("<Q", data, 16, records)
    struct.pack_into("<Q", data, 24 + 16, records - 40)  # the entries sum to it
    open(cache_of(prefix), "wb").write(bytes(data))
    ds = open_dataset(prefix)
    assert mapped_path(ds.keys) is None and places(ds) == expected(samples)


def test_a_manifest_that_lists_the_shards_in_another_order_does_not_use_the_cache(tmp_path):
    prefix, samples = sharded_pack(tmp_path)
    write_index_caches(prefix)
    path = f"{prefix}.manifest.json"
    doc = json.load(open(path))
    doc["shards"] = doc["shards"][::-1]
    json.dump(doc, open(path, "w"))
    ds = open_dataset(prefix)
    assert mapped_path(ds.keys) is None
    assert places(ds) == expected(samples[40:] + samples[20:40] + samples[:20])


def test_a_shard_replaced_by_a_cp_p_copy_of_another_reads_as_the_text_says(tmp_path):
    prefix, _ = sharded_pack(tmp_path)
    write_index_caches(prefix)
    for suffix in (".rec", ".idx"):  # cp -p: the bytes, the size and the time of shard 0
        shutil.copy2(f"{prefix}-00000{suffix}", f"{prefix}-00001{suffix}")
    ds = open_dataset(prefix)
    assert mapped_path(ds.keys) is None
    assert places(ds) == places(open_dataset(prefix, cache=False))


def test_an_idx_edited_in_place_with_size_and_time_kept_retires_the_cache(tmp_path):
    prefix, samples = sharded_pack(tmp_path)
    write_index_caches(prefix)
    idx = f"{prefix}-00002.idx"
    st = os.stat(idx)
    lines = open(idx, "rb").read().splitlines(keepends=True)
    lines[3], lines[4] = lines[4], lines[3]  # two samples swapped: same size
    open(idx, "wb").write(b"".join(lines))
    os.utime(idx, ns=(st.st_atime_ns, st.st_mtime_ns))
    ds = open_dataset(prefix)
    order = samples[:43] + [samples[44], samples[43]] + samples[45:]
    assert mapped_path(ds.keys) is None and places(ds) == expected(order)


def test_a_cache_whose_offsets_run_past_a_shard_is_refused_at_open(tmp_path):
    prefix, _ = sharded_pack(tmp_path)
    write_index_caches(prefix)
    data = bytearray(open(cache_of(prefix), "rb").read())
    offsets_at = 24 + 3 * 32 + 60 * 8
    struct.pack_into("<q", data, offsets_at + 8 * 25, 10**6)  # shard 1, its 6th record
    open(cache_of(prefix), "wb").write(bytes(data))
    with pytest.raises(RecordFormatError, match="stale or belongs to another"):
        open_dataset(prefix)


def test_a_cache_whose_counts_sum_right_but_split_wrong_is_not_used(tmp_path):
    # Crafted (every .idx's size, time and CRC kept): the manifest's record counts differ from
    # the cache's, so the cache is not used and the .idx text is read.
    prefix, samples = sharded_pack(tmp_path)
    write_index_caches(prefix)
    data = bytearray(open(cache_of(prefix), "rb").read())
    struct.pack_into("<Q", data, 24 + 16, 21)
    struct.pack_into("<Q", data, 24 + 32 + 16, 19)
    open(cache_of(prefix), "wb").write(bytes(data))
    ds = open_dataset(prefix)
    assert mapped_path(ds.keys) is None and places(ds) == expected(samples)


# A cache cut short inside its per-shard entries (an interrupted rsync or scp, a full disk on
# a copy) is ignored like any other damaged cache: never a struct.error.
CUTS = [30, 24 + 32 + 5, 24 + 2 * 32 + 31]  # ends inside entry 0, 1, 2 (of 3)


def cut_cache(prefix, cut):
    with open(cache_of(prefix), "rb") as f:
        data = f.read(cut)
    with open(cache_of(prefix), "wb") as f:
        f.write(data)


@pytest.mark.parametrize("cut", CUTS)
def test_a_dataset_cache_cut_inside_its_shard_entries_is_ignored(tmp_path, cut):
    from rectool.inspect.verify import verify_dataset

    prefix, samples = sharded_pack(tmp_path)
    write_index_caches(prefix)
    before = {p.kind for p in verify_dataset(prefix).problems}
    cut_cache(prefix, cut)
    assert places(open_dataset(prefix)) == expected(samples)
    assert {p.kind for p in verify_dataset(prefix).problems} == before


@pytest.mark.parametrize("command", ["verify", "dali-index"])
def test_commands_on_a_pack_whose_dataset_cache_is_cut_print_no_traceback(tmp_path, command):
    prefix, _ = sharded_pack(tmp_path)
    write_index_caches(prefix)
    cut_cache(prefix, CUTS[1])
    extra = {"verify": [], "dali-index": [os.fspath(tmp_path / "dali.idx")]}
    done = subprocess.run(
        [sys.executable, "-m", "rectool", command, prefix, *extra[command]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr[-300:]


def test_a_multi_shard_cache_under_a_one_shard_pack_and_the_reverse_are_ignored(tmp_path):
    many, _ = sharded_pack(tmp_path, name="many")
    one, one_samples = sharded_pack(tmp_path, shards=1, per=30, name="one")
    write_index_caches(many)
    shutil.copy(cache_of(many), cache_of(one))  # a dataset cache where one.idx's cache goes
    ds = open_dataset(one)
    assert mapped_path(ds.keys) is None and places(ds) == expected(one_samples)
    write_index_caches(one)  # one.idx's own cache now
    many2, many2_samples = sharded_pack(tmp_path, name="many2")
    shutil.copy(cache_of(one), cache_of(many2))
    ds = open_dataset(many2)
    assert mapped_path(ds.keys) is None and places(ds) == expected(many2_samples)


def test_unpickling_after_the_cache_was_replaced_is_a_clear_error(tmp_path):
    prefix, _ = sharded_pack(tmp_path)
    write_index_caches(prefix)
    blob = pickle.dumps(open_dataset(prefix))
    idx_paths = [f"{prefix}-{n:05d}.idx" for n in range(3)]
    assert write_dataset_cache(f"{prefix}.manifest.json", idx_paths)  # the same content, anew
    with pytest.raises(RectoolError, match="replaced after the dataset was opened"):
        pickle.loads(blob)


def test_index_cache_leaves_current_caches_as_they_are(tmp_path):
    # `rectool index-cache` run again (by hand, by a cron job) while a job trains: the files
    # that job maps stay, so it can still pickle its dataset to new workers.
    from click.testing import CliRunner

    from rectool.cli import cli

    prefix, samples = sharded_pack(tmp_path)
    write_index_caches(prefix)
    paths = [cache_of(prefix)] + [cache_of(f"{prefix}-{n:05d}") for n in range(3)]
    before = {p: os.stat(p).st_ino for p in paths}
    blob = pickle.dumps(open_dataset(prefix))
    result = CliRunner().invoke(cli, ["index-cache", prefix, "--json"])
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(result.stdout)["caches"]) == sorted(paths)
    assert {p: os.stat(p).st_ino for p in paths} == before
    assert places(pickle.loads(blob)) == expected(samples)
    # One that lies (its size and time still match) is written again.
    data = bytearray(open(cache_of(prefix), "rb").read())
    struct.pack_into("<q", data, len(data) - 8, 4)
    open(cache_of(prefix), "wb").write(bytes(data))
    write_index_caches(prefix)
    ds = open_dataset(prefix)
    assert mapped_path(ds.keys) == cache_of(prefix) and places(ds) == expected(samples)


def everything(ds):
    """What a user reads of a dataset, pickled copies and negative indices included."""
    n = len(ds)
    copy = pickle.loads(pickle.dumps(ds))
    got = {
        "len": n,
        "places": places(ds),
        "copy": places(copy),
        "samples": [(bytes(ds.raw(i)[0]), np.asarray(ds.raw(i)[1]).tolist()) for i in range(n)],
        "negative": [ds.location(-i) for i in range(1, n + 1)],
        "labels": np.asarray(ds.labels).tolist(),
        "copy labels": np.asarray(copy.labels).tolist(),
        "shard ids": np.asarray(ds.shard_ids).tolist(),
        "copy shard ids": np.asarray(copy.shard_ids).tolist(),
        "ranges": None if ds.identity_ranges is None else ds.identity_ranges.tolist(),
        "copy ranges": None if copy.identity_ranges is None else copy.identity_ranges.tolist(),
        "layout": ds.layout,
    }
    for bad in (n, -n - 1):
        with pytest.raises(IndexError):
            ds.location(bad)
    return got


def insightface_in_shards(folder, header_first=False):
    """An insightface pack cut into 3 shards: header and images 1..7 first, then images 8..12,
    then the identity records (key 0 last in shard 0, as insightface writes it, or first: the
    images and identities are then runs of the mapped cache, pickled as places in it)."""
    prefix = os.fspath(folder / "faces")
    rec, idx = f"{prefix}-tmp.rec", f"{prefix}-tmp.idx"
    write_insightface(rec, idx, [3, 4, 5], lambda k: b"face%d" % k)
    records = {}
    with open(rec, "rb") as f:
        blob = f.read()
    lines = [tuple(map(int, line.split())) for line in open(idx)]
    ends = [o for _, o in lines[1:]] + [len(blob)]
    for (key, offset), end in zip(lines, ends):
        records[key] = blob[offset:end]
    os.remove(rec), os.remove(idx)

    # rebuild each record from the raw bytes: strip the 8-byte part head and padding
    def payload(raw):
        (lrec,) = struct.unpack_from("<I", raw, 4)
        return raw[8 : 8 + (lrec & ((1 << 29) - 1))]

    first = [0, *range(1, 8)] if header_first else [*range(1, 8), 0]
    groups = [first, list(range(8, 13)), list(range(13, 16))]
    entries = []
    for number, keys in enumerate(groups):
        stem = f"{prefix}-{number:05d}"
        write_shard(stem + ".rec", stem + ".idx", [(k, payload(records[k])) for k in keys])
        entries.append({"rec": os.path.basename(stem + ".rec"),
                        "idx": os.path.basename(stem + ".idx"), "records": len(keys),
                        "rec_bytes": os.path.getsize(stem + ".rec")})  # fmt: skip
    doc = {"format": "rectool-manifest", "format_version": 1, "layout": "insightface",
           "shards": entries, "totals": {"records": 16}}  # fmt: skip
    json.dump(doc, open(f"{prefix}.manifest.json", "w"))
    return prefix


def vector_pack(folder):
    prefix = os.fspath(folder / "vectors")
    items = [[(k, b"v%d" % k, [float(k), float(k % 3)]) for k in range(s * 9, s * 9 + 9)]
             for s in range(4)]  # fmt: skip
    write_pack(prefix, items)
    return prefix


@pytest.mark.parametrize("kind", ["images", "insightface", "insightface header first", "vectors"])
def test_every_view_of_a_pack_is_the_same_from_the_cache_as_from_the_text(tmp_path, kind):
    if kind == "images":
        prefix = sharded_pack(tmp_path, shards=4, per=7)[0]
    elif kind.startswith("insightface"):
        prefix = insightface_in_shards(tmp_path, header_first=kind != "insightface")
    else:
        prefix = vector_pack(tmp_path)
    text = everything(open_dataset(prefix, cache=False))
    write_index_caches(prefix)
    ds = open_dataset(prefix)
    assert mapped_path(ds.keys) == cache_of(prefix) or kind == "insightface"
    if kind == "insightface header first":  # runs of the mapping, pickled as places in it
        assert mapped_path(ds._identities[1]) == cache_of(prefix)
        assert len(pickle.dumps(ds)) < len(pickle.dumps(open_dataset(prefix, cache=False)))
    assert everything(ds) == text
    if kind.startswith("insightface"):
        assert text["layout"] == "insightface" and text["len"] == 12


def _read_in_spawned(ds, queue):
    queue.put(
        (
            places(ds),
            [bytes(ds.raw(i)[0]) for i in range(-1, -len(ds) - 1, -1)],
            mapped_path(ds.keys),
            mapped_path(ds.offsets),
        )
    )


def test_spawned_workers_read_a_pack_mapped_from_its_dataset_cache(tmp_path):
    prefix, samples = sharded_pack(tmp_path, shards=5, per=11)
    write_index_caches(prefix)
    ds = open_dataset(prefix)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_read_in_spawned, args=(ds, queue))
    process.start()
    got = queue.get(timeout=120)
    process.join(60)
    want = [b"img%05d" % k for k in range(54, -1, -1)]
    assert got == (expected(samples), want, cache_of(prefix), cache_of(prefix))


def test_repack_and_dali_index_of_a_pack_mapped_from_its_dataset_cache(tmp_path):
    from helpers.image_files import jpeg_bytes

    from rectool.inspect.dali import write_dali_index
    from rectool.repack.pipeline import RepackOptions, repack

    prefix = os.fspath(tmp_path / "faces")
    items = [[(k, jpeg_bytes(k, 8, 8), float(k % 4)) for k in range(s * 10, s * 10 + 10)]
             for s in range(3)]  # fmt: skip
    write_pack(prefix, items)
    plain = write_dali_index(prefix, tmp_path / "plain.idx")
    want = open(tmp_path / "plain.idx").read()
    repack([prefix], tmp_path / "before", RepackOptions(shard_records=7))
    write_index_caches(prefix)
    assert mapped_path(open_dataset(prefix).keys) == cache_of(prefix)
    assert write_dali_index(prefix, tmp_path / "mapped.idx") == plain
    assert open(tmp_path / "mapped.idx").read() == want
    repack([prefix], tmp_path / "after", RepackOptions(shard_records=7))
    before, after = open_dataset(tmp_path / "before"), open_dataset(tmp_path / "after")
    assert len(after) == len(before) == 30
    assert [after.raw(i) for i in range(30)] == [before.raw(i) for i in range(30)]


def test_a_pack_killed_between_its_dataset_cache_and_its_manifest_resumes(tmp_path, monkeypatch):
    from helpers.image_files import write_list, write_pack_tree

    from rectool.packer import manifest
    from rectool.packer.packing import PackOptions, pack_images

    items = write_pack_tree(tmp_path / "tree", ["a", "b", "c"], 4)
    lst = write_list(tmp_path / "faces.lst", items)
    out = tmp_path / "out" / "p"
    monkeypatch.setattr(indexcache, "INDEX_CACHE_MIN_RECORDS", 10)
    real = manifest.write_json_atomic

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(manifest, "write_json_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        pack_images(lst, tmp_path / "tree", out, PackOptions(shard_records=5))
    assert os.path.exists(cache_of(out)) and not os.path.exists(f"{out}.manifest.json")
    with pytest.raises(RectoolError, match="unfinished pack"):
        open_dataset(out)
    monkeypatch.setattr(manifest, "write_json_atomic", real)
    pack_images(lst, tmp_path / "tree", out, PackOptions(shard_records=5), resume=True)
    ds = open_dataset(out)
    assert mapped_path(ds.keys) == cache_of(out) and len(ds) == 12
    want = [bytes(ds.raw(i)[0]) for i in range(12)]
    # --overwrite to one shard, then back to several below the threshold: no cache is left
    # that a reader could take for the new pack's
    monkeypatch.setattr(indexcache, "INDEX_CACHE_MIN_RECORDS", 10**9)
    pack_images(lst, tmp_path / "tree", out, PackOptions(), overwrite=True)
    assert not os.path.exists(cache_of(out))
    write_index_caches(out)  # the one shard's own cache, under the same name
    pack_images(lst, tmp_path / "tree", out, PackOptions(shard_records=5), overwrite=True)
    assert not os.path.exists(cache_of(out))
    ds = open_dataset(out)
    assert [bytes(ds.raw(i)[0]) for i in range(12)] == want


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_loader_over_a_remote_pack_mapped_from_its_dataset_cache(
    s3_pack, tmp_path, monkeypatch, start_method
):
    from rectool.training import Loader

    monkeypatch.setattr(indexcache, "INDEX_CACHE_MIN_RECORDS", 10)
    ds = open_dataset(s3_pack.url, cache_dir=str(tmp_path / "cache"))
    assert mapped_path(ds.keys).endswith("faces.idx.rtc")
    local = open_dataset(str(s3_pack.local), decode="rgb")
    loader = Loader(ds, batch_size=5, workers=2, seed=3, copy=True, start_method=start_method)
    with loader:
        order = loader.sampler.global_order()
        labels = np.concatenate([b[1] for b in loader])
    assert sorted(order.tolist()) == list(range(12))
    assert labels.tolist() == [int(local.labels[i]) for i in order]
