"""The index at scale: the .rtc cache mapped in place, datasets pickled as places in it, labels
gathered in chunks, the .idx text parsed a block at a time, label tables shared by workers.

Correctness only: the sizes and speeds these buy are measured by
tests/benchmarks/bench_scale.py.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import struct
import sys
import tempfile
import zlib

import numpy as np
import pytest
from helpers.handmade_datasets import (
    frame,
    image_record,
    write_insightface,
    write_pack,
    write_shard,
)
from helpers.image_files import jpeg_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from rectool.format import indexcache
from rectool.format.indexcache import write_index_cache, write_index_caches
from rectool.reader import (
    IndexFormatError,
    RecordFormatError,
    RectoolError,
    index_cache_path,
    load_index,
    open_dataset,
    parse_index,
    parse_index_stream,
)
from rectool.training import BatchDecoder


def mapping_behind(array):
    """Return the mmap an array is a view of (through numpy bases and a memoryview), or None."""
    while isinstance(array, np.ndarray):
        array = array.base
    array = getattr(array, "obj", array)
    return array if isinstance(array, mmap.mmap) else None


def numbered_pack(folder, n, cache=True, image=None):
    """A one-shard pack of n records b"img<k>" (or `image`), label k % 7, key k, with its
    cache; return the prefix."""
    prefix = folder / "big"
    records = [(k, image_record(image or b"img%d" % k, float(k % 7), k)) for k in range(n)]
    write_shard(f"{prefix}.rec", f"{prefix}.idx", records)
    if cache:
        assert write_index_cache(f"{prefix}.idx", *load_index(f"{prefix}.idx", cache=False))
    return prefix


# --- the cache, mapped ------------------------------------------------------------------------


def test_a_cached_open_maps_the_index_in_place(tmp_path):
    prefix = numbered_pack(tmp_path, 3000)
    ds = open_dataset(prefix)
    for array in (ds.keys, ds.offsets):
        assert not array.flags.owndata and not array.flags.writeable
        assert mapping_behind(array) is not None
    assert ds.keys.tolist() == list(range(3000))
    assert ds[2999] == (b"img2999", float(2999 % 7))


def test_without_the_cache_the_index_is_parsed_into_memory(tmp_path):
    ds = open_dataset(numbered_pack(tmp_path, 3000), cache=False)
    assert mapping_behind(ds.offsets) is None and ds.keys.tolist() == list(range(3000))


def test_a_version_2_cache_is_still_read_and_mapped(tmp_path):
    idx = tmp_path / "a.idx"
    idx.write_bytes(b"0\t0\n1\t16\n2\t40\n")
    st_idx = os.stat(idx)
    crc = zlib.crc32(idx.read_bytes())
    head = struct.pack("<8sQqQI4x", b"RTIDXC02", st_idx.st_size, st_idx.st_mtime_ns, 3, crc)
    body = struct.pack("<6q", 7, 8, 9, 4, 8, 12)  # not what the .idx says: read from the cache
    (tmp_path / "a.idx.rtc").write_bytes(head + body)
    keys, offsets = load_index(idx)
    assert (keys.tolist(), offsets.tolist()) == ([7, 8, 9], [4, 8, 12])
    assert mapping_behind(keys) is not None
    # Version 2's CRC covers the whole .idx: another CRC there, and the text is parsed.
    head = struct.pack("<8sQqQI4x", b"RTIDXC02", st_idx.st_size, st_idx.st_mtime_ns, 3, crc ^ 1)
    (tmp_path / "a.idx.rtc").write_bytes(head + body)
    assert load_index(idx)[1].tolist() == [0, 16, 40]


def test_a_version_3_cache_checks_a_sample_of_a_large_idx(tmp_path):
    prefix = numbered_pack(tmp_path, 120_000)  # an .idx of ~1.4 MB: sampled, not read whole
    idx = f"{prefix}.idx"
    assert os.path.getsize(idx) > 1 << 20
    st_before = os.stat(idx)
    with open(idx, "r+b") as f:  # line 3's offset, 4 more: same size, in the first block
        text = f.read(64)
        start = text.index(b"\n2\t") + 3
        offset = int(text[start : text.index(b"\n", start)])
        f.seek(start)
        f.write(b"%d" % (offset + 4))
    assert os.path.getsize(idx) == st_before.st_size
    os.utime(idx, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    assert load_index(idx)[1][2] == offset + 4  # the cache is stale: the text counts


def test_a_cache_header_says_version_3_with_both_crcs(tmp_path):
    prefix = numbered_pack(tmp_path, 10)
    data = open(index_cache_path(f"{prefix}.idx"), "rb").read()
    magic, size, _, count, crc, sample = struct.unpack_from("<8sQqQII", data)
    whole = zlib.crc32(open(f"{prefix}.idx", "rb").read())
    assert (magic, count, crc, sample) == (b"RTIDXC03", 10, whole, whole)  # small: all sampled
    assert len(data) == 40 + 16 * count


# --- pickling: the place in the cache, not the arrays -------------------------------------------


def test_a_pickled_dataset_carries_no_index_arrays(tmp_path):
    ds = open_dataset(numbered_pack(tmp_path, 20_000))
    assert len(ds.labels) == 20_000  # kept by the dataset, but not pickled
    blob = pickle.dumps(ds)
    assert len(blob) < 2_000  # the arrays alone are 320,000 bytes
    copy = pickle.loads(blob)
    assert mapping_behind(copy.keys) is not None and mapping_behind(copy.offsets) is not None
    assert np.array_equal(copy.keys, ds.keys) and np.array_equal(copy.offsets, ds.offsets)
    assert copy[19_999] == ds[19_999] and np.array_equal(copy.labels, ds.labels)


def test_a_pickled_insightface_dataset_carries_no_index_arrays(tmp_path):
    identities = [3] * 2000
    write_insightface(tmp_path / "train.rec", tmp_path / "train.idx", identities, lambda k: b"i")
    write_index_cache(tmp_path / "train.idx", *load_index(tmp_path / "train.idx", cache=False))
    ds = open_dataset(tmp_path)
    assert ds.layout == "insightface" and len(ds) == 6000
    assert mapping_behind(ds.keys) is not None  # keys 1..N in order: a slice of the mapping
    blob = pickle.dumps(ds)
    assert len(blob) < 5_000  # the arrays are 128,000 bytes (identities' shard numbers travel)
    copy = pickle.loads(blob)
    assert mapping_behind(copy.offsets) is not None
    assert np.array_equal(copy.identity_ranges, [[3 * j, 3 * j + 3] for j in range(2000)])
    assert copy[5999] == (b"i", 1999.0)


def test_a_dataset_parsed_from_text_pickles_its_arrays(tmp_path):
    ds = open_dataset(numbered_pack(tmp_path, 20_000, cache=False))
    copy = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(copy.offsets, ds.offsets) and copy[5] == ds[5]


def test_unpickling_after_the_cache_was_replaced_is_refused(tmp_path):
    prefix = numbered_pack(tmp_path, 100)
    blob = pickle.dumps(open_dataset(prefix))
    assert write_index_cache(f"{prefix}.idx", *load_index(f"{prefix}.idx", cache=False))
    with pytest.raises(RectoolError) as caught:
        pickle.loads(blob)
    assert str(caught.value) == (
        f"{prefix}.idx.rtc was replaced after the dataset was opened; open it again"
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_spawned_workers_map_the_cache_and_the_label_table(tmp_path):
    picture = jpeg_bytes(0, 8, 8)
    ds = open_dataset(numbered_pack(tmp_path, 100, image=picture))
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    for arg in (ds, BatchDecoder(ds)):  # BatchDecoder: as torch's DataLoader spawns it
        process = context.Process(target=_worker_maps, args=(arg, queue))
        process.start()
        got = queue.get(timeout=60)
        process.join(60)
        assert got == ((picture, float(41 % 7)), True, isinstance(arg, BatchDecoder))


def _worker_maps(arg, queue):
    maps = open("/proc/self/maps").read()
    if isinstance(arg, BatchDecoder):
        ds, label = arg._decoder.ds, arg[[41]][1].tolist()[0]
    else:
        ds, label = arg, arg[41][1]
    queue.put(((ds[41][0], float(label)), ".idx.rtc" in maps, "rectool-labels" in maps))


# --- a pack of several shards: one cache of them all -------------------------------------------


def sharded_pack(folder, shards=4, per=500):
    """A pack of `shards` shards of `per` records b"img<k>" (key k, label k % 7) with a
    manifest, written by hand; return (prefix, the samples as written)."""
    prefix = os.fspath(folder / "many")
    items = [[(k, b"img%d" % k, float(k % 7)) for k in range(s * per, (s + 1) * per)]
             for s in range(shards)]  # fmt: skip
    return prefix, write_pack(prefix, items)


def written_places(ds, samples):
    return [ds.location(i) for i in range(len(ds))] == [(s.rec, s.offset, s.key) for s in samples]


def test_a_pack_of_several_shards_maps_one_cache_of_them_all(tmp_path):
    prefix, samples = sharded_pack(tmp_path)
    assert mapping_behind(open_dataset(prefix).keys) is None  # no cache: joined in memory
    done = write_index_caches(prefix)
    assert done.written[-1] == f"{prefix}.idx.rtc" and len(done.written) == 5 and not done.kept
    ds = open_dataset(prefix)
    assert mapping_behind(ds.keys) is mapping_behind(ds.offsets)
    assert mapping_behind(ds.keys).path == f"{prefix}.idx.rtc"
    assert written_places(ds, samples)
    assert [ds[i] for i in (0, 499, 500, 1999)] == [
        (b"img0", 0.0), (b"img499", float(499 % 7)), (b"img500", float(500 % 7)),
        (b"img1999", float(1999 % 7)),
    ]  # fmt: skip
    assert open_dataset(prefix, cache=False).keys.flags.owndata  # cache=False: never read


def test_the_dataset_cache_header_lists_every_shard(tmp_path):
    prefix, _ = sharded_pack(tmp_path, shards=3, per=10)
    write_index_caches(prefix)
    data = open(f"{prefix}.idx.rtc", "rb").read()
    assert struct.unpack_from("<8sQQ", data) == (b"RTIDXD01", 3, 30)
    for s in range(3):
        idx = f"{prefix}-{s:05d}.idx"
        st_idx, text = os.stat(idx), open(idx, "rb").read()
        entry = struct.unpack_from("<QqQI4x", data, 24 + 32 * s)
        assert entry == (st_idx.st_size, st_idx.st_mtime_ns, 10, zlib.crc32(text))
    body = np.frombuffer(data, np.int64, offset=24 + 3 * 32)
    assert body[:30].tolist() == list(range(30)) and len(body) == 60


def test_a_pickled_pack_of_several_shards_carries_no_index_arrays(tmp_path):
    prefix, samples = sharded_pack(tmp_path, shards=6, per=3000)
    write_index_caches(prefix)
    ds = open_dataset(prefix)
    blob = pickle.dumps(ds)
    assert len(blob) < 4_000  # the arrays alone are 288,000 bytes
    copy = pickle.loads(blob)
    assert mapping_behind(copy.keys).path == f"{prefix}.idx.rtc"
    assert written_places(copy, samples) and copy[17_999] == (b"img17999", float(17_999 % 7))
    # Reads locate samples by the shard bounds: no table of a byte a sample (42 MB at 42M)
    # is made in a worker until something asks for every sample's shard.
    assert vars(copy)["_shard_table"] is None
    assert copy.labels.tolist() == [float(k % 7) for k in range(18_000)]
    assert vars(copy)["_shard_table"] is not None


def test_a_changed_shard_index_retires_the_dataset_cache(tmp_path):
    prefix, samples = sharded_pack(tmp_path, shards=3, per=50)
    write_index_caches(prefix)
    idx = f"{prefix}-00001.idx"
    lines = open(idx, "rb").read().splitlines(keepends=True)
    st_before = os.stat(idx)
    with open(idx, "wb") as f:  # the same lines, reversed: same size, and the same time below
        f.writelines(reversed(lines))
    os.utime(idx, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    ds = open_dataset(prefix)
    assert mapping_behind(ds.keys) is None
    order = samples[:50] + samples[50:100][::-1] + samples[100:]
    assert written_places(ds, order)


@pytest.mark.parametrize("damage", ["truncated", "other magic", "another shard count"])
def test_a_damaged_dataset_cache_is_ignored(tmp_path, damage):
    prefix, samples = sharded_pack(tmp_path, shards=3, per=20)
    write_index_caches(prefix)
    path = f"{prefix}.idx.rtc"
    data = bytearray(open(path, "rb").read())
    if damage == "truncated":
        data = data[:-8]
    elif damage == "other magic":
        data[:8] = b"RTIDXD02"
    else:
        data[8:16] = struct.pack("<Q", 2)
    open(path, "wb").write(bytes(data))
    ds = open_dataset(prefix)
    assert mapping_behind(ds.keys) is None and written_places(ds, samples)


def test_pack_finalize_and_repack_write_the_cache_of_a_pack_of_several_shards(
    tmp_path, monkeypatch
):
    from helpers.image_files import write_list, write_pack_tree

    from rectool.packer.packing import PackOptions, finalize_pack, pack_images
    from rectool.repack.pipeline import RepackOptions, repack

    items = write_pack_tree(tmp_path / "tree", ["a", "b", "c"], 4)
    lst = write_list(tmp_path / "faces.lst", items)
    pack_images(lst, tmp_path / "tree", tmp_path / "small", PackOptions(shard_records=5))
    assert not os.path.exists(tmp_path / "small.idx.rtc")  # 12 records: not worth a file
    monkeypatch.setattr(indexcache, "INDEX_CACHE_MIN_RECORDS", 10)
    pack_images(lst, tmp_path / "tree", tmp_path / "big", PackOptions(shard_records=5))
    for number in range(3):  # shards packed one by one, then finalized
        pack_images(lst, tmp_path / "tree", tmp_path / "jobs", PackOptions(shard_records=5),
                    only_shard=number)  # fmt: skip
    finalize_pack(lst, tmp_path / "tree", tmp_path / "jobs", PackOptions(shard_records=5))
    repack([tmp_path / "small"], tmp_path / "again", RepackOptions(shard_records=4))
    plain = open_dataset(tmp_path / "small")
    for name, shards in (("big", 3), ("jobs", 3), ("again", 3)):
        ds = open_dataset(tmp_path / name)
        assert mapping_behind(ds.keys).path == os.fspath(tmp_path / f"{name}.idx.rtc")
        assert len(ds.shards) == shards and len(ds) == 12
        assert [ds[i] for i in range(12)] == [plain[i] for i in range(12)]


def test_verify_names_a_dataset_cache_that_lies(tmp_path):
    from rectool.inspect.verify import verify_dataset

    def problems():  # the records hold b"img<k>", not images: verify says so every time
        return {(p.kind, p.path) for p in verify_dataset(prefix).problems}

    prefix, _ = sharded_pack(tmp_path, shards=3, per=20)
    write_index_caches(prefix)
    before = problems()
    assert {kind for kind, _ in before} == {"not-an-image"}
    path = f"{prefix}.idx.rtc"
    data = bytearray(open(path, "rb").read())
    last = len(data) - 8  # the last offset, 4 bytes on: a size and time that still match
    data[last:] = struct.pack("<q", struct.unpack_from("<q", data, last)[0] + 4)
    open(path, "wb").write(bytes(data))
    assert problems() - before == {("stale-index-cache", path)}


# --- labels, gathered a chunk at a time ---------------------------------------------------------


def test_labels_across_chunks_match_the_headers_with_a_split_record(tmp_path):
    n = (1 << 20) + 50  # past the first chunk of 2**20 records
    rec, idx = tmp_path / "big.rec", tmp_path / "big.idx"
    payload = struct.pack("<I", 0xCED7230A) * 2  # aligned magic words: a record split in parts
    split = frame(image_record(b"abcd" + payload, 3.5, 1 << 20))
    with open(rec, "wb") as f:  # 36-byte records written with numpy, one split among them
        words = np.zeros((n, 9), "<u4")
        words[:, 0], words[:, 1] = 0xCED7230A, 28
        words[:, 3] = (np.arange(n) % 1000).astype(np.float32).view("<u4")
        words[:, 4] = np.arange(n)
        f.write(words[: 1 << 20].tobytes() + split + words[(1 << 20) + 1 :].tobytes())
    offsets = np.arange(n, dtype=np.int64) * 36
    offsets[(1 << 20) + 1 :] += len(split) - 36
    with open(idx, "w") as f:
        f.writelines(f"{k}\t{o}\n" for k, o in enumerate(offsets.tolist()))
    ds = open_dataset(rec)
    expected = (np.arange(n) % 1000).astype(np.float32)
    expected[1 << 20] = 3.5
    assert ds.labels.dtype == np.float32 and np.array_equal(ds.labels, expected)
    assert ds.header(1 << 20).label == 3.5


def test_labels_of_several_shards_with_vectors_match_the_headers(tmp_path):
    items = [[(k, b"x", [float(k), k + 0.5]) for k in range(s * 5, s * 5 + 5)] for s in range(3)]
    write_pack(tmp_path / "v", items)
    ds = open_dataset(tmp_path / "v")
    assert np.array_equal(ds.labels, [ds.header(i).label for i in range(len(ds))])
    assert ds.labels.shape == (15, 2)


def test_labels_name_a_damaged_record(tmp_path):
    prefix = numbered_pack(tmp_path, 10, cache=False)  # records of 36 bytes
    with open(f"{prefix}.rec", "r+b") as f:
        f.seek(3 * 36)
        f.write(b"\0\0\0\0")  # record 3's magic: not among the records read at open
    ds = open_dataset(prefix)
    with pytest.raises(RecordFormatError) as caught:
        _ = ds.labels
    assert (caught.value.key, caught.value.offset) == (3, 108)


# --- the .idx text, a block at a time -------------------------------------------------------------

LINES = st.one_of(
    st.tuples(st.integers(0, 10**12), st.integers(0, 10**12)).map(lambda p: f"{p[0]}\t{p[1]}\n"),
    st.sampled_from(["x\t1\n", "1\n", "\n", "1\t-2\n", "1 2\n", "99999999999999999999\t1\n"]),
)


def _parsed(parse):
    try:
        keys, offsets = parse()
        return keys.tolist(), offsets.tolist()
    except IndexFormatError as exc:
        return str(exc), exc.line


@settings(max_examples=200, deadline=None)
@given(
    good=st.lists(st.integers(0, 10**6), max_size=40),
    bad=st.lists(LINES, max_size=6),
    at=st.integers(0, 40),
    block=st.integers(1, 64),
    last_newline=st.booleans(),
)
def test_the_streaming_parse_equals_the_one_shot_parse(good, bad, at, block, last_newline):
    lines = [f"{k}\t{k * 16}\n" for k in good]
    lines[at:at] = bad
    text = "".join(lines).encode()
    text = text if last_newline or not text.endswith(b"\n") else text[:-1]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "a.idx")
        with open(path, "wb") as f:
            f.write(text)
        with open(path, "rb") as f:
            streamed = _parsed(lambda: parse_index_stream(f, path, block=block))
    assert streamed == _parsed(lambda: parse_index(text, path))


def test_the_streaming_parse_names_the_file_and_line_in_a_later_block(tmp_path):
    idx = tmp_path / "a.idx"
    idx.write_bytes(b"".join(b"%d\t%d\n" % (k, 16 * k) for k in range(1000)) + b"7\tx\n")
    with open(idx, "rb") as f, pytest.raises(IndexFormatError) as caught:
        parse_index_stream(f, str(idx), block=100)
    assert str(caught.value) == f"{idx}: line 1001: key and offset must be integers, got b'7\\tx'"


def test_insightface_keys_out_of_order_read_as_in_order(tmp_path):
    pictures = [jpeg_bytes(k, 8, 8) for k in range(8)]
    expected, ranges = write_insightface(
        tmp_path / "train.rec", tmp_path / "train.idx", [3, 1, 4], lambda k: pictures[k - 1]
    )
    ordered = open_dataset(tmp_path)
    lines = (tmp_path / "train.idx").read_bytes().splitlines(keepends=True)
    (tmp_path / "train.idx").write_bytes(b"".join(lines[::-1]))  # argsort, not a slice
    shuffled = open_dataset(tmp_path)
    assert [ordered[i] for i in range(8)] == [shuffled[i] for i in range(8)]
    assert [ordered[i] for i in range(8)] == [(s.image, s.label) for s in expected]
    assert np.array_equal(shuffled.identity_ranges, ranges)


# --- workers hold no pages between batches ------------------------------------------------------


def _mapped_kb(path_part):
    """Return the kB of this process's mappings of files whose name contains `path_part`."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0] and ":" not in line.split(" ", 1)[0]:
                inside = path_part in line
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_close_unmaps_the_records_and_drops_the_index_pages(tmp_path):
    ds = open_dataset(numbered_pack(tmp_path, 50_000))
    for i in range(0, 50_000, 7):
        ds.raw(i)
    assert _mapped_kb("big.rec") > 0 and _mapped_kb("big.idx.rtc") > 0
    ds.close()
    assert _mapped_kb("big.rec") == 0 and _mapped_kb("big.idx.rtc") == 0
    assert ds[49_999] == (b"img49999", float(49_999 % 7))  # and reads on afterwards


def test_a_loader_worker_closes_the_dataset_after_each_batch(tmp_path):
    from rectool.reader import RecordDataset
    from rectool.training import Loader

    log = tmp_path / "closes"

    class CountedDataset(RecordDataset):
        def close(self):
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
            super().close()

    CountedDataset.__module__ = RecordDataset.__module__  # the reader module, for its errors
    prefix = numbered_pack(tmp_path, 12, image=jpeg_bytes(0, 8, 8))
    ds = CountedDataset(prefix)
    log.write_text("")
    with Loader(ds, 4, workers=1, start_method="fork", shuffle=False) as loader:
        assert sum(len(images) for images, _ in loader) == 12
        worker = loader._processes[0].pid
    assert log.read_text().split().count(str(worker)) == 3  # one per batch
