"""Reading samples: order, indices, labels, split records and decoding.

Runs against `rectool.reader`, and through tests/test_emit.py against the emitted standalone
copy in a process where rectool cannot be imported (see helpers/reader_under_test.py). Datasets
are written by hand (helpers/handmade_datasets.py), never by rectool.
"""

from __future__ import annotations

import importlib.util
import sys

import cv2
import numpy as np
import pytest
from helpers.handmade_datasets import (
    MAGIC,
    image_record,
    images,
    write_pack,
    write_shard,
)
from helpers.image_files import jpeg_bytes
from helpers.reader_under_test import rd


def test_samples_follow_shards_then_index_lines(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    assert ds.keys.tolist() == [s.key for s in samples]
    for i, s in enumerate(samples):
        assert ds.location(i) == (s.rec, s.offset, s.key)
        assert ds[i] == (s.image, s.label)
        assert type(ds[i][1]) is float and type(ds[i][0]) is bytes


def test_each_samples_shard_is_public(handmade_shards):
    # Shards of 4, 3 and 5 samples (conftest.py): what the DALI index and repack read.
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    assert ds.shard_bounds == [0, 4, 7, 12]
    assert ds.shard_ids.tolist() == [0] * 4 + [1] * 3 + [2] * 5
    assert [rf.path for rf in ds.shard_files] == [f"{prefix}-{n:05d}.rec" for n in range(3)]
    assert [ds.shard_files[int(ds.shard_ids[i])].path for i in range(12)] == [
        s.rec for s in samples
    ]


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
    # A fresh copy of the module: the one under test may have made its decoders already.
    spec = importlib.util.spec_from_file_location("reader_without_opencv", rd.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    ds = fresh.open_dataset(handmade_shards[0], decode="rgb")
    with pytest.raises(fresh.RectoolError, match="decoding images needs OpenCV"):
        ds[0]
    assert ds.raw(0)[0] == handmade_shards[1][0].image  # undecoded reads need no decoder


# --- damaged records -------------------------------------------------------------------------


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
