"""Reading samples of a format-3 pack: order, indices, labels, split records and decoding.

Runs against `rectool.reader`, and through tests/test_emit.py against the emitted standalone
copy in a process where rectool cannot be imported (see helpers/reader_under_test.py). Packs
are written by hand (helpers/handmade_datasets.py), never by rectool. The package's reading of
packs without a binary index is tests/test_dataset_packs.py's.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import cv2
import numpy as np
import pytest
from helpers.handmade_datasets import (
    MAGIC,
    Sample,
    image_record,
    images,
    write_binary_index,
    write_manifest,
    write_pack,
    write_shard,
)
from helpers.image_files import jpeg_bytes
from helpers.reader_under_test import rd


@pytest.fixture
def handmade_shards(tmp_path):
    """Three shards of 4, 3 and 5 JPEGs of 24x20, keys out of order, labels 0.0 .. 11.0; the
    binary index written beside them (format 3)."""
    keys = [40, 3, 17, 8, 100, 5, 6, 7, 1, 0, 9, 2]
    items = [(key, jpeg_bytes(n, 24, 20), float(n)) for n, key in enumerate(keys)]
    samples = write_pack(tmp_path / "faces", [items[:4], items[4:7], items[7:]], index=True)
    return tmp_path / "faces", samples


def test_samples_follow_shards_then_index_lines(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    assert ds.keys.tolist() == [s.key for s in samples]
    assert ds.offsets.tolist() == [s.offset for s in samples]
    for i, s in enumerate(samples):
        assert ds.location(i) == (s.rec, s.offset, s.key)
        assert ds[i] == (s.image, s.label)
        assert ds.raw(i) == (s.image, s.label)
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
    assert str(caught.value) == f"sample {index} is out of range: 12 samples"


def test_non_integer_index(handmade_shards):
    ds = rd.open_dataset(handmade_shards[0])
    with pytest.raises(TypeError):
        ds[1.0]


# --- labels -----------------------------------------------------------------------------------


def test_labels_are_the_mapped_index(handmade_shards):
    ds = rd.open_dataset(handmade_shards[0])
    assert ds.labels.dtype == np.float32
    assert ds.labels.tolist() == [float(n) for n in range(12)]
    assert ds.labels is ds.labels  # mapped once
    with pytest.raises(ValueError):
        ds.labels[0] = 5
    with pytest.raises(ValueError):
        ds.offsets[0] = 5


def test_labels_read_no_record(handmade_shards, monkeypatch):
    ds = rd.open_dataset(handmade_shards[0])

    def no_reads(*args, **kwargs):
        raise AssertionError("a record was read")

    monkeypatch.setattr(rd.RecordFile, "open", no_reads)
    assert ds.labels.tolist() == [float(n) for n in range(12)]
    assert len(ds) == 12 and ds.location(11)[1:] == (handmade_shards[1][11].offset, 2)


def test_multi_label_records(tmp_path):
    data = images(5)
    items = [(k, data[k], [k, 0.5, -2.0]) for k in range(5)]
    write_pack(tmp_path / "m", [items], index=True)
    ds = rd.open_dataset(tmp_path / "m")
    assert ds.labels.dtype == np.float32 and ds.labels.shape == (5, 3)
    for k in range(5):
        image, label = ds[k]
        assert image == data[k]
        assert label.dtype == np.float32 and label.tolist() == [k, 0.5, -2.0]
        assert label.flags.writeable
        assert ds.labels[k].tolist() == [k, 0.5, -2.0]


def test_split_records_read_whole(tmp_path):
    """Payloads with the magic at aligned offsets are split into parts (FORMAT-NOTES §1)."""
    # IRHeader is 24 bytes, so image offset 0 is record offset 24: aligned.
    tricky = [MAGIC + b"abcd" + MAGIC + MAGIC, b"xy" + MAGIC + b"zz", b"abcd" + MAGIC, MAGIC]
    items = [(k, image, [float(k), 1.0]) for k, image in enumerate(tricky)]
    items.append((9, b"plain", [MAGIC_FLOAT, 7.0]))  # the magic inside the label vector
    write_pack(tmp_path / "s", [items], index=True)
    ds = rd.open_dataset(tmp_path / "s")
    assert [image for image, _ in ds] == [*tricky, b"plain"]
    assert ds.labels[:4, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert ds[4][1].view("<u4")[0] == 0xCED7230A
    assert ds.labels[4].view("<u4")[0] == 0xCED7230A


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
    samples = write_pack(tmp_path / "x", [[(0, data[0], 0.0), (7, b"not a jpeg", 1.0)]], index=True)
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


def damaged(tmp_path, records):
    """A format-3 pack of `records` ((key, record bytes)) written by hand; return its path."""
    offsets = write_shard(tmp_path / "d.rec", tmp_path / "d.idx", records)
    samples = [
        Sample(b"", 0.0, key, str(tmp_path / "d.rec"), o) for (key, _), o in zip(records, offsets)
    ]
    entry = write_binary_index(tmp_path / "d", samples, [len(records)])
    shard = {"rec": "d.rec", "idx": "d.idx", "records": len(records)}
    write_manifest(tmp_path / "d", [shard], "images", entry)
    return tmp_path / "d", offsets


def test_corrupt_record_names_file_offset_and_key(tmp_path):
    data = images(5)
    prefix, offsets = damaged(tmp_path, [(k + 10, image_record(data[k], 0.0)) for k in range(5)])
    with open(tmp_path / "d.rec", "r+b") as f:
        f.seek(offsets[1])
        f.write(b"\xde\xad\xbe\xef")
    ds = rd.open_dataset(prefix)
    assert ds[0] == (data[0], 0.0)
    for read in (lambda: ds[1], lambda: ds.raw(1)):
        with pytest.raises(rd.RecordFormatError) as caught:
            read()
        error = caught.value
        assert (error.path, error.offset, error.key) == (str(tmp_path / "d.rec"), offsets[1], 11)
        assert str(error) == (
            f"{tmp_path / 'd.rec'}, key 11, byte offset {offsets[1]}: "
            "bad magic 0xefbeadde (expected 0xced7230a)"
        )
    assert ds.labels.tolist() == [0.0] * 5  # the index, not the record


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (b"short", "record of 5 bytes, too short for its 24-byte image header"),
        (image_record(b"", [1.0, 2.0])[:30], "too short for its 24-byte image header and 2 "),
    ],
)
def test_record_too_short_for_its_header(tmp_path, record, reason):
    prefix, offsets = damaged(tmp_path, [(0, b"\0" * 24), (1, record)])
    ds = rd.open_dataset(prefix)
    with pytest.raises(rd.RecordFormatError) as caught:
        ds[1]
    assert (caught.value.key, caught.value.offset) == (1, offsets[1])
    assert reason in str(caught.value)


@pytest.mark.parametrize("mode", ["bgr", "rgb", "gray"])
def test_an_empty_image_is_a_record_format_error(tmp_path, mode):
    records = [(0, image_record(jpeg_bytes(0, 8, 8), 1.0)), (1, image_record(b"", 2.0))]
    prefix, offsets = damaged(tmp_path, records)
    ds = rd.open_dataset(prefix, decode=mode)
    assert ds[0][0].shape[:2] == (8, 8)
    with pytest.raises(rd.RecordFormatError) as caught:
        ds[1]
    error = caught.value
    assert (error.path, error.key, error.offset) == (str(tmp_path / "d.rec"), 1, offsets[1])
    assert "empty image" in str(error)


def test_a_split_flag_is_never_read_as_a_length(tmp_path):
    # lrec = 1 << 29 | length: the first part of a split record. In a file of more than 512 MB
    # (sparse here) that value, read as a whole part's length, would fit inside the file.
    first = image_record(b"jpeg", 1.0)
    part = MAGIC + (1 << 29 | len(first)).to_bytes(4, "little") + first
    prefix, offsets = damaged(tmp_path, [(0, image_record(b"ok", 0.0))])
    with open(tmp_path / "d.rec", "r+b") as f:
        f.seek(0, 2)
        second = f.tell()
        f.write(part)
        f.truncate(600 << 20)
    np.save(tmp_path / "d.offsets.npy", np.array([0, second], "<i8"))
    np.save(tmp_path / "d.keys.npy", np.array([0, 1], "<i8"))
    np.save(tmp_path / "d.labels.npy", np.array([0.0, 1.0], "<f4"))
    manifest = tmp_path / "d.manifest.json"
    doc = json.loads(manifest.read_text())
    doc["index"]["samples"], doc["shards"][0]["records"] = [2], 2
    manifest.write_text(json.dumps(doc))
    ds = rd.open_dataset(prefix)
    assert ds[0] == (b"ok", 0.0)
    with pytest.raises(rd.RecordFormatError) as caught:
        ds[1]
    assert (caught.value.offset, caught.value.key) == (second + 8 + len(first), 1)
    assert caught.value.reason.startswith("bad magic 0x00000000")
