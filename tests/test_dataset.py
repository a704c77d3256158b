"""The dataset API of the reader: open_dataset, RecordDataset, decoding, labels, pickling.

Runs against `rectool.reader`, and through tests/test_emit.py against the emitted standalone
copy in a process where rectool cannot be imported (see helpers/reader_under_test.py). Datasets are
written by hand (helpers/handmade_datasets.py), never by rectool.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers.handmade_datasets import (
    MAGIC,
    image_record,
    write_insightface,
    write_manifest,
    write_pack,
    write_shard,
)
from helpers.image_files import jpeg_bytes
from helpers.reader_under_test import EMITTED, rd


def images(n, start=0):
    return [jpeg_bytes(start + k, 24, 20) for k in range(n)]


def as_pairs(ds):
    return [(image, label) for image, label in ds]


def expected_pairs(samples):
    return [(s.image, s.label) for s in samples]


# --- opening ----------------------------------------------------------------------------------


def test_open_by_prefix_manifest_rec_and_shard_list(handmade_shards):
    prefix, samples = handmade_shards
    shards = [f"{prefix}-{n:05d}.rec" for n in range(3)]
    for source in (prefix, f"{prefix}.manifest.json", shards, [os.fspath(p) for p in shards]):
        ds = rd.open_dataset(source)
        assert len(ds) == 12
        assert as_pairs(ds) == expected_pairs(samples)
        assert ds.layout == "images"
    one = rd.open_dataset(shards[1])
    assert as_pairs(one) == expected_pairs(samples[4:7])


def test_samples_follow_shards_then_index_lines(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    assert ds.keys.tolist() == [s.key for s in samples]
    for i, s in enumerate(samples):
        assert ds.location(i) == (s.rec, s.offset, s.key)
        assert ds[i] == (s.image, s.label)
        assert type(ds[i][1]) is float and type(ds[i][0]) is bytes


def test_negative_and_numpy_indices(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    assert ds[-1] == (samples[-1].image, samples[-1].label)
    assert ds[-12] == ds[0]
    assert ds[np.int64(5)] == ds[5]


@pytest.mark.parametrize("index", [12, 13, -13, 10**12])
def test_out_of_range_index(handmade_shards, index):
    ds = rd.open_dataset(handmade_shards[0])
    with pytest.raises(rd.SampleIndexError) as caught:
        ds[index]
    assert isinstance(caught.value, IndexError) and isinstance(caught.value, rd.RectoolError)
    assert str(caught.value) == f"sample {index} is out of range: the dataset has 12 samples"


def test_non_integer_index(handmade_shards):
    ds = rd.open_dataset(handmade_shards[0])
    with pytest.raises(TypeError):
        ds[1.0]


def test_empty_dataset(tmp_path):
    write_pack(tmp_path / "empty", [[]])
    ds = rd.open_dataset(tmp_path / "empty")
    assert len(ds) == 0 and list(ds) == []
    assert ds.labels.shape == (0,)


# --- labels -----------------------------------------------------------------------------------


def test_labels_scalar(handmade_shards):
    ds = rd.open_dataset(handmade_shards[0])
    assert ds.labels.dtype == np.float32
    assert ds.labels.tolist() == [float(n) for n in range(12)]
    assert ds.labels is ds.labels  # read once
    with pytest.raises(ValueError):
        ds.labels[0] = 5


def test_labels_never_read_image_bytes(handmade_shards, monkeypatch):
    ds = rd.open_dataset(handmade_shards[0])

    def no_reads(*args, **kwargs):
        raise AssertionError("a whole record was read")

    monkeypatch.setattr(rd.RecordFile, "read_at", no_reads)
    monkeypatch.setattr(rd.RecordFile, "read_parts", no_reads)
    assert ds.labels.tolist() == [float(n) for n in range(12)]


def test_multi_label_records(tmp_path):
    data = images(5)
    items = [(k, data[k], [k, 0.5, -2.0]) for k in range(5)]
    write_pack(tmp_path / "m", [items])
    ds = rd.open_dataset(tmp_path / "m")
    assert ds.labels.dtype == np.float32 and ds.labels.shape == (5, 3)
    for k in range(5):
        image, label = ds[k]
        assert image == data[k]
        assert label.dtype == np.float32 and label.tolist() == [k, 0.5, -2.0]
        assert label.flags.writeable
        assert ds.labels[k].tolist() == [k, 0.5, -2.0]
        assert ds.header(k).flag == 3


def test_mixed_label_widths_give_an_object_array(tmp_path):
    data = images(3)
    write_pack(tmp_path / "x", [[(0, data[0], 1.0), (1, data[1], [2.0, 3.0]), (2, data[2], [4.0])]])
    labels = rd.open_dataset(tmp_path / "x").labels
    assert labels.dtype == object
    assert labels[0] == 1.0
    assert labels[1].tolist() == [2.0, 3.0] and labels[2].tolist() == [4.0]


def test_split_records_read_whole(tmp_path):
    """Payloads with the magic at aligned offsets are split into parts (FORMAT-NOTES §1)."""
    # IRHeader is 24 bytes, so image offset 0 is record offset 24: aligned.
    tricky = [MAGIC + b"abcd" + MAGIC + MAGIC, b"xy" + MAGIC + b"zz", b"abcd" + MAGIC, MAGIC]
    items = [(k, image, float(k)) for k, image in enumerate(tricky)]
    items.append((9, b"plain", [MAGIC_FLOAT, 7.0]))  # the magic inside the label vector
    write_pack(tmp_path / "s", [items])
    ds = rd.open_dataset(tmp_path / "s")
    assert [image for image, _ in ds] == [*tricky, b"plain"]
    assert ds.labels.dtype == object
    assert ds.labels[:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert ds[4][1].view("<u4")[0] == 0xCED7230A


MAGIC_FLOAT = float(np.frombuffer(MAGIC, "<f4")[0])


# --- decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "flag", "convert"),
    [
        ("bgr", cv2.IMREAD_COLOR, None),
        ("rgb", cv2.IMREAD_COLOR, cv2.COLOR_BGR2RGB),
        ("gray", cv2.IMREAD_GRAYSCALE, None),
    ],
)
def test_decode(handmade_shards, mode, flag, convert):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix, decode=mode)
    for i, s in enumerate(samples):
        image, label = ds[i]
        expected = cv2.imdecode(np.frombuffer(s.image, np.uint8), flag)
        if convert is not None:
            expected = cv2.cvtColor(expected, convert)
        if mode == "gray":
            expected = expected[:, :, None]
        assert image.dtype == np.uint8 and image.shape == expected.shape
        assert image.shape[:2] == (24, 20)
        assert np.array_equal(image, expected)
        assert label == s.label


def test_decode_with_a_function(handmade_shards):
    ds = rd.open_dataset(handmade_shards[0], decode=len)
    assert [image for image, _ in ds] == [len(s.image) for s in handmade_shards[1]]


def test_decode_mode_is_checked(handmade_shards):
    with pytest.raises(ValueError, match="decode must be None"):
        rd.open_dataset(handmade_shards[0], decode="bgra")


def test_undecodable_image_names_file_offset_and_key(tmp_path):
    data = images(2)
    samples = write_pack(tmp_path / "x", [[(0, data[0], 0.0), (7, b"not a jpeg", 1.0)]])
    ds = rd.open_dataset(tmp_path / "x", decode="rgb")
    with pytest.raises(rd.RecordFormatError) as caught:
        ds[1]
    assert (caught.value.path, caught.value.offset, caught.value.key) == (
        samples[1].rec,
        samples[1].offset,
        7,
    )
    assert "the 10 image bytes cannot be decoded (they start with b'not a jp')" in str(caught.value)


def test_decoding_without_opencv_says_what_to_install(handmade_shards, monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)
    monkeypatch.setattr(rd, "_DECODERS", {})
    ds = rd.open_dataset(handmade_shards[0], decode="rgb")
    with pytest.raises(rd.RectoolError, match="decoding images needs OpenCV"):
        ds[0]
    assert ds.raw(0)[0] == handmade_shards[1][0].image  # undecoded reads need no decoder


# --- the insightface layout -------------------------------------------------------------------


def face(key):
    return jpeg_bytes(key, 16, 16)


@pytest.mark.parametrize("header_last", [True, False])
def test_insightface_layout_detected_from_record_0(tmp_path, header_last):
    samples, ranges = write_insightface(
        tmp_path / "train.rec", tmp_path / "train.idx", [3, 1, 4], face, header_last
    )
    for source in (tmp_path / "train.rec", tmp_path):
        ds = rd.open_dataset(source)
        assert ds.layout == "insightface"
        assert len(ds) == 8
        assert as_pairs(ds) == expected_pairs(samples)
        assert ds.keys.tolist() == list(range(1, 9))
        assert ds.labels.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
        assert ds.identity_ranges.tolist() == [[0, 3], [3, 4], [4, 8]] == [list(r) for r in ranges]


def test_insightface_layout_from_the_manifest(tmp_path):
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2, 2], face)
    entries = [{"rec": "f.rec", "idx": "f.idx", "records": 7}]
    write_manifest(tmp_path / "f", entries, "insightface")
    ds = rd.open_dataset(tmp_path / "f")
    assert (ds.layout, len(ds), ds.identity_ranges.tolist()) == ("insightface", 4, [[0, 2], [2, 4]])


def test_layout_can_be_forced(tmp_path):
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2, 2], face)
    everything = rd.open_dataset(tmp_path / "f.rec", layout="images")
    assert len(everything) == 7 and everything.identity_ranges is None
    with pytest.raises(ValueError, match="layout must be one of"):
        rd.open_dataset(tmp_path / "f.rec", layout="faces")


def test_insightface_layout_refused_without_a_header(handmade_shards):
    with pytest.raises(rd.RecordFormatError, match="record 0 is not an insightface header"):
        rd.open_dataset(handmade_shards[0], layout="insightface")


def test_im2rec_pack_label_record_0_is_an_image_not_a_header(tmp_path):
    # im2rec --pack-label: key 0 is an ordinary image with a label vector (flag 2).
    data = images(3)
    items = [(k, data[k], [float(k), 1.0]) for k in range(3)]
    write_pack(tmp_path / "im2rec", [items], manifest=False)
    ds = rd.open_dataset(tmp_path / "im2rec.rec")
    assert ds.layout == "images" and len(ds) == 3
    assert [image for image, _ in ds] == data


@pytest.mark.parametrize(
    "zero, one",
    [
        ([2.0, 3.0, 3.0], 5.0),  # flag 3 (issue 13: a header for the reader, not for `info`)
        ([1.5, 3.0], 5.0),  # a key range that is not whole
        ([2.0, 2.0], [5.0, 1.0]),  # images with label vectors: im2rec --pack-label
    ],
    ids=["flag 3", "not whole", "image labels"],
)
def test_record_0_is_a_header_only_with_flag_2_and_whole_key_bounds(tmp_path, zero, one):
    records = [(0, image_record(b"", zero, 0, 1)), (1, image_record(face(1), one, 1))]
    write_shard(tmp_path / "f.rec", tmp_path / "f.idx", records)
    ds = rd.open_dataset(tmp_path / "f.rec")
    assert (ds.layout, len(ds), ds.identity_ranges) == ("images", 2, None)
    payload, label = ds.raw(0)
    assert payload == b"" and label.tolist() == zero == ds.labels[0].tolist()
    with pytest.raises(rd.RecordFormatError, match="record 0 is not an insightface header"):
        rd.open_dataset(tmp_path / "f.rec", layout="insightface")


def test_insightface_header_gives_the_key_ranges(tmp_path):
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2, 3], face)
    keys, offsets = rd.load_index(tmp_path / "f.idx")
    rf = rd.RecordFile(tmp_path / "f.rec")
    header = rd.insightface_header(lambda j: rd.unpack_header(rf.read_at(offsets[j])), keys)
    assert header == (range(1, 6), range(6, 8))


def test_insightface_missing_image_key(tmp_path):
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2, 2], face)
    lines = (tmp_path / "f.idx").read_text().splitlines(keepends=True)
    (tmp_path / "f.idx").write_text("".join(lines[:2] + lines[3:]))  # drops key 3
    with pytest.raises(rd.RectoolError, match="key 3 is not in the index"):
        rd.open_dataset(tmp_path / "f.rec")


def test_insightface_images_across_shards(tmp_path):
    # Keys 1..N spread over two files, header in the second: still one dataset in key order.
    images_ = {k: face(k) for k in range(1, 6)}
    write_shard(
        tmp_path / "a.rec",
        tmp_path / "a.idx",
        [(k, image_record(images_[k], float(k > 2), k)) for k in (1, 2, 3)],
    )
    write_shard(
        tmp_path / "b.rec",
        tmp_path / "b.idx",
        [
            (5, image_record(images_[5], 1.0, 5)),
            (4, image_record(images_[4], 1.0, 4)),
            (6, image_record(b"", [1.0, 3.0], 6)),
            (7, image_record(b"", [3.0, 6.0], 7)),
            (0, image_record(b"", [6.0, 8.0], 0, 1)),
        ],
    )
    ds = rd.open_dataset([tmp_path / "a.rec", tmp_path / "b.rec"])
    assert [image for image, _ in ds] == [images_[k] for k in range(1, 6)]
    assert ds.keys.tolist() == [1, 2, 3, 4, 5]
    assert ds.labels.tolist() == [0, 0, 1, 1, 1]
    assert ds.identity_ranges.tolist() == [[0, 2], [2, 5]]
    assert pickle.loads(pickle.dumps(ds))[3] == ds[3] == (images_[4], 1.0)


def test_insightface_images_alternating_between_shards(tmp_path):
    # Keys 1, 3 in one file and 2, 4 in the other: samples in key order jump between shards.
    images_ = {k: face(k) for k in range(1, 5)}
    write_shard(
        tmp_path / "a.rec",
        tmp_path / "a.idx",
        [(k, image_record(images_[k], float(k), k)) for k in (1, 3)]
        + [(0, image_record(b"", [5.0, 6.0], 0, 1)), (5, image_record(b"", [1.0, 5.0], 5))],
    )
    write_shard(
        tmp_path / "b.rec",
        tmp_path / "b.idx",
        [(k, image_record(images_[k], float(k), k)) for k in (2, 4)],
    )
    ds = rd.open_dataset([tmp_path / "a.rec", tmp_path / "b.rec"])
    assert [image for image, _ in ds] == [images_[k] for k in range(1, 5)]
    assert ds.labels.tolist() == [1, 2, 3, 4]
    assert [ds.location(i)[0] for i in range(4)] == [str(tmp_path / f"{n}.rec") for n in "abab"]
    assert ds.identity_ranges.tolist() == [[0, 4]]


# --- errors -----------------------------------------------------------------------------------


def test_missing_rec(handmade_shards):
    prefix, _ = handmade_shards
    os.unlink(f"{prefix}-00001.rec")
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value) == f"{prefix}-00001.rec: record file not found"


def test_missing_idx(handmade_shards):
    prefix, _ = handmade_shards
    os.unlink(f"{prefix}-00002.idx")
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value) == f"{prefix}-00002.idx: index file not found"


def test_missing_dataset(tmp_path):
    with pytest.raises(rd.RectoolError, match="no dataset here"):
        rd.open_dataset(tmp_path / "nothing")


def test_idx_pointing_past_the_end_of_the_rec(tmp_path):
    data = images(3)
    write_pack(tmp_path / "a", [[(k, data[k], 0.0) for k in range(3)]], manifest=False)
    size = os.path.getsize(tmp_path / "a.rec")
    with open(tmp_path / "a.idx", "a") as f:
        f.write(f"3\t{size + 64}\n")
    with pytest.raises(rd.RecordFormatError) as caught:
        rd.open_dataset(tmp_path / "a.rec")
    error = caught.value
    assert (error.path, error.offset, error.key) == (str(tmp_path / "a.rec"), size + 64, 3)
    assert f"the index {tmp_path / 'a.idx'} is stale or belongs to another .rec" in str(error)


def test_idx_of_another_file(tmp_path):
    data = images(4)
    write_pack(tmp_path / "a", [[(k, data[k], 0.0) for k in range(2)]], manifest=False)
    write_pack(tmp_path / "b", [[(k, image, 0.0) for k, image in enumerate(data)]], manifest=False)
    os.replace(tmp_path / "b.idx", tmp_path / "a.idx")
    with pytest.raises(rd.RecordFormatError) as caught:
        rd.open_dataset(tmp_path / "a.rec")
    assert caught.value.path == str(tmp_path / "a.rec")
    assert "is stale or belongs to another .rec (rebuild it from the .rec)" in str(caught.value)


def test_stale_idx_against_the_manifest(handmade_shards):
    prefix, _ = handmade_shards
    idx = f"{prefix}-00001.idx"
    with open(idx) as f:
        lines = f.readlines()
    with open(idx, "w") as f:
        f.writelines(lines[:2])
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value) == (
        f"{idx}: 2 index lines, but the manifest {prefix}.manifest.json lists 3 records for "
        "this shard: the .idx or the manifest is stale"
    )


def test_rec_changed_after_packing(handmade_shards):
    prefix, _ = handmade_shards
    with open(f"{prefix}-00000.rec", "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(
        rd.RectoolError, match="bytes, but the manifest .* lists .*: the file changed"
    ):
        rd.open_dataset(prefix)


def test_corrupt_record_names_file_offset_and_key(tmp_path):
    data = images(5)
    samples = write_pack(
        tmp_path / "c", [[(k + 10, data[k], 0.0) for k in range(5)]], manifest=False
    )
    # Record 1 is none of the records checked at open (first, middle, last, farthest).
    with open(tmp_path / "c.rec", "r+b") as f:
        f.seek(samples[1].offset)
        f.write(b"\xde\xad\xbe\xef")
    ds = rd.open_dataset(tmp_path / "c.rec")
    assert ds[0] == (data[0], 0.0)
    for read in (lambda: ds[1], lambda: ds.labels):
        with pytest.raises(rd.RecordFormatError) as caught:
            read()
        error = caught.value
        assert (error.path, error.offset, error.key) == (samples[1].rec, samples[1].offset, 11)
        assert str(error) == (
            f"{samples[1].rec}, key 11, byte offset {samples[1].offset}: "
            "bad magic 0xefbeadde (expected 0xced7230a): not a record start"
        )


def test_record_too_short_for_its_header(tmp_path):
    write_shard(tmp_path / "t.rec", tmp_path / "t.idx", [(0, b"\0" * 24), (1, b"short")])
    ds = rd.open_dataset(tmp_path / "t.rec")
    with pytest.raises(rd.RecordFormatError) as caught:
        ds[1]
    assert (caught.value.key, caught.value.offset) == (1, 32)
    assert "shorter than the 24-byte image header" in str(caught.value)


# --- processes, pickling, file descriptors ------------------------------------------------------


def rec_descriptors():
    """Return the paths of .rec files this process holds open (mmap descriptors included)."""
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".rec"):
            paths.append(target)
    return sorted(paths)


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")


@needs_proc
def test_files_open_lazily_one_descriptor_per_shard(handmade_shards):
    prefix, samples = handmade_shards
    gc.collect()  # datasets of earlier tests, kept alive by their tracebacks
    before = rec_descriptors()
    ds = rd.open_dataset(prefix)
    assert rec_descriptors() == before  # nothing held after opening
    ds[0]
    assert rec_descriptors() == sorted(before + [samples[0].rec])
    list(ds)
    assert rec_descriptors() == sorted(
        before + [s.rec for s in (samples[0], samples[4], samples[7])]
    )
    ds.close()
    assert rec_descriptors() == before
    assert ds[11] == (samples[11].image, samples[11].label)  # reopens
    del ds
    gc.collect()
    assert rec_descriptors() == before


def test_pickle_round_trip_without_open_files(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix, decode=None)
    assert len(ds.labels) == 12
    list(ds)
    blob = pickle.dumps(ds)
    copy = pickle.loads(blob)
    assert as_pairs(copy) == expected_pairs(samples)
    assert copy.labels.tolist() == ds.labels.tolist()
    if os.path.isdir("/proc/self/fd"):
        before = rec_descriptors()
        fresh = pickle.loads(blob)
        assert rec_descriptors() == before  # unpickling opens no file
        assert fresh[0] == copy[0]
    # The parsed index travels; the file contents never do.
    assert len(blob) < sum(os.path.getsize(s.rec) for s in samples[:1])


@needs_proc
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_maps_its_own_files(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    list(ds)  # the parent holds all three shards
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what it reads and holds, then leave without cleanup
        try:
            ok = as_pairs(ds) == expected_pairs(samples)
            report = pickle.dumps((ok, rec_descriptors()))
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            report = pickle.dumps((repr(exc), []))
        os.write(write, report)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        ok, held = pickle.loads(f.read())
    os.waitpid(pid, 0)
    assert ok is True
    # Three descriptors, not six: the inherited mappings were released before remapping.
    assert held == sorted(s.rec for s in (samples[0], samples[4], samples[7]))
    assert ds[3] == (samples[3].image, samples[3].label)  # the parent's mapping still works


def test_threads_read_one_dataset(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    results, errors = {}, []

    def read(t):
        try:
            results[t] = [ds[i] for i in range(len(ds))[::-1] for _ in range(20)]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    expected = [(s.image, s.label) for s in samples[::-1] for _ in range(20)]
    assert all(r == expected for r in results.values())


def test_module_imports_only_the_standard_library_and_numpy():
    code = (
        "import importlib.util, sys\n"
        "sys.modules['rectool'] = None\n"
        "before = set(sys.modules)\n"
        f"spec = importlib.util.spec_from_file_location('standalone_reader', {rd.__file__!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "new = {name.split('.')[0] for name in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'numpy'}))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(not EMITTED, reason="only when testing the emitted reader")
def test_the_emitted_reader_runs_without_rectool():
    with pytest.raises(ImportError):
        import rectool  # noqa: F401
    assert os.path.samefile(rd.__file__, EMITTED)
    assert rd.RecordDataset.__module__ == rd.__name__ != "rectool.reader"


# --- hostile and damaged inputs (issue 12) -------------------------------------------------------


@pytest.fixture
def no_hang():
    """Fail a test that blocks (a FIFO opened for reading) instead of hanging the suite."""
    import signal

    def timeout(*args):
        raise AssertionError("blocked for 20 s")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def edit_manifest(prefix, edit):
    path = Path(f"{prefix}.manifest.json")
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("name", ["../../x/y.rec", "/etc/hostname", "sub/a.rec", "..", ""])
def test_manifest_shard_paths_must_be_plain_names_in_its_folder(handmade_shards, tmp_path, name):
    prefix, _ = handmade_shards
    secret = tmp_path / "secret.rec"
    secret.write_bytes(b"SECRET CONTENTS")
    if name == "/etc/hostname":
        name = str(secret)
    manifest = edit_manifest(prefix, lambda d: d["shards"][1].update(rec=name))
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(manifest)
    message = str(caught.value)
    assert message == (
        f"{manifest}: manifest field 'shards[1].rec' must be a plain file name in the "
        "manifest's folder"
    )


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["shards"][0].pop("idx"), "shards[0].idx"),
        (lambda d: d["shards"][2].update(rec=None), "shards[2].rec"),
        (lambda d: d.update(shards="x"), "shards"),
        (lambda d: d["shards"][0].update(records="many"), "shards[0].records"),
        (lambda d: d["shards"][0].update(rec_bytes=-1), "shards[0].rec_bytes"),
        (lambda d: d.update(identities=5), "identities"),
        (lambda d: d["shards"].__setitem__(1, "a.rec"), "shards[1]"),
        (lambda d: d.update(format_version="1"), "format_version"),
    ],
    ids=["no idx", "rec null", "shards a string", "records a word", "negative size",
         "identities a number", "shard a string", "version a string"],
)  # fmt: skip
def test_manifest_fields_are_checked_and_named(handmade_shards, edit, field):
    manifest = edit_manifest(handmade_shards[0], edit)
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value).startswith(f"{manifest}: manifest field {field!r} must be ")


def test_manifest_listing_one_shard_twice_is_refused(handmade_shards):
    manifest = edit_manifest(handmade_shards[0], lambda d: d["shards"].append(dict(d["shards"][0])))
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value) == (
        f"{manifest}: manifest lists the shard file "
        f"{Path(f'{handmade_shards.prefix}-00000.rec').name!r} twice"
    )


def test_a_shard_given_twice_is_refused(handmade_shards):
    rec = f"{handmade_shards[0]}-00000.rec"
    with pytest.raises(rd.RectoolError, match="a shard is listed twice"):
        rd.open_dataset([rec, rec])


@pytest.mark.parametrize("which", ["rec", "idx", "manifest", "rtc"])
def test_a_fifo_in_place_of_a_file_is_refused_not_read(handmade_shards, which, no_hang):
    prefix, _ = handmade_shards
    path = {
        "rec": f"{prefix}-00001.rec",
        "idx": f"{prefix}-00001.idx",
        "manifest": f"{prefix}.manifest.json",
        "rtc": f"{prefix}-00001.idx.rtc",
    }[which]
    if os.path.exists(path):
        os.unlink(path)
    os.mkfifo(path)
    if which == "rtc":  # an optional sidecar: a FIFO there is ignored, never opened blocking
        assert len(rd.open_dataset(prefix)) == 12
        return
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value).startswith(f"{path}: not a regular file")


def test_a_folder_in_place_of_a_rec_is_refused(handmade_shards):
    prefix, _ = handmade_shards
    os.unlink(f"{prefix}-00001.rec")
    os.mkdir(f"{prefix}-00001.rec")
    with pytest.raises(rd.RectoolError, match="00001.rec: not a regular file"):
        rd.open_dataset(prefix)


@pytest.mark.parametrize("mode", ["bgr", "rgb", "gray"])
def test_an_empty_image_is_a_record_format_error(tmp_path, mode):
    records = [(0, image_record(jpeg_bytes(0, 8, 8), 1.0)), (1, image_record(b"", 2.0))]
    offsets = write_shard(tmp_path / "e.rec", tmp_path / "e.idx", records)
    ds = rd.open_dataset(tmp_path / "e.rec", decode=mode)
    assert ds[0][0].shape[:2] == (8, 8)
    with pytest.raises(rd.RecordFormatError) as caught:
        ds[1]
    error = caught.value
    assert (error.path, error.key, error.offset) == (str(tmp_path / "e.rec"), 1, offsets[1])
    assert "empty image" in str(error)


def test_an_empty_index_beside_a_full_rec_is_refused(handmade_shards):
    prefix, _ = handmade_shards
    Path(f"{prefix}-00001.idx").write_bytes(b"")
    manifest = edit_manifest(prefix, lambda d: d["shards"][1].update(records=None))
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value).startswith(f"{prefix}-00001.idx: empty index beside ")


def test_an_offset_past_the_end_of_the_rec_is_refused_at_open(tmp_path):
    data = images(5)
    samples = write_pack(tmp_path / "c", [[(k, data[k], 0.0) for k in range(5)]], manifest=False)
    size = os.path.getsize(tmp_path / "c.rec")
    lines = [f"{s.key}\t{s.offset}\n" for s in samples]
    lines[1] = f"1\t{size + 1024}\n"  # the farthest offset: checked at open
    (tmp_path / "c.idx").write_text("".join(lines))
    with pytest.raises(rd.RecordFormatError) as caught:
        rd.open_dataset(tmp_path / "c.rec")
    assert (caught.value.key, caught.value.offset) == (1, size + 1024)
