"""The decode guard in the reader and the training loaders: sizes read from headers, refused
over `max_pixels` before any decoder runs, cut images refused rather than filled in.

Runs against `rectool.reader` / `rectool.training`, and through tests/test_emit.py against the
emitted standalone copies in a process where rectool cannot be imported. Packs are written by
hand (helpers/handmade_datasets.py); expected sizes come from OpenCV decoding the same bytes.
"""

from __future__ import annotations

import struct

import cv2
import numpy as np
import pytest
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes
from helpers.oversized_images import (
    OVERSIZED,
    cut_jpeg,
    encoded,
    oversized_jpeg,
    oversized_png,
    oversized_webp,
    small_image,
)
from helpers.reader_under_test import rd
from helpers.training_under_test import tr

REAL = {
    "jpeg": (".jpg", ()),
    "png": (".png", ()),
    "bmp": (".bmp", ()),
    "gif": (".gif", ()),
    "webp": (".webp", (cv2.IMWRITE_WEBP_QUALITY, 90)),
    "webp-lossless": (".webp", (cv2.IMWRITE_WEBP_QUALITY, 101)),
    "tiff": (".tiff", ()),
}


@pytest.fixture
def no_decoder(monkeypatch):
    """Make OpenCV's decoder fail the test if anything calls it."""

    def called(*args):
        raise AssertionError("cv2.imdecode was called")

    monkeypatch.setattr(cv2, "imdecode", called)


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_header_gives_the_size_opencv_decodes(name):
    ext, params = REAL[name]
    data = bytes(encoded(ext, small_image(37, 53), params))
    height, width = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape[:2]
    assert (height, width) == (37, 53)
    assert rd.admit_image(data) == (name.split("-")[0], height, width)


def test_an_extended_webp_is_sized_by_its_canvas():
    data = oversized_webp("VP8X", 16, 16)  # the canvas of its 16x16 frame
    assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape[:2] == (16, 16)
    assert rd.admit_image(data) == ("webp", 16, 16)
    assert rd.admit_image(oversized_webp("VP8X", 20, 30), 600) == ("webp", 20, 30)


@pytest.mark.parametrize("name", sorted(OVERSIZED))
def test_an_oversized_header_is_refused_before_decoding(name, no_decoder):
    data = OVERSIZED[name]()
    assert len(data) < 10_000
    with pytest.raises(
        rd.ImageTooLargeError, match=r"declares \d+x\d+ pixels .* limit of 50,000,000"
    ):
        rd.admit_image(data)
    for mode in ("bgr", "rgb", "gray"):
        with pytest.raises(rd.ImageTooLargeError):
            rd.decode_image(data, mode)
    with pytest.raises(rd.ImageTooLargeError):
        rd.decode_image(data, cv2.IMREAD_REDUCED_COLOR_8)


def test_the_budget_is_the_callers():
    data = jpeg_bytes(1, 40, 32)  # 1,280 pixels
    with pytest.raises(rd.ImageTooLargeError, match="32x40 pixels"):
        rd.decode_image(data, "bgr", max_pixels=1279)
    assert rd.decode_image(data, "bgr", max_pixels=1280).shape == (40, 32, 3)
    assert rd.DEFAULT_MAX_PIXELS == 50_000_000


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "50M", None])
def test_a_budget_must_be_a_positive_int(handmade_shards, bad):
    with pytest.raises(ValueError, match="max_pixels must be an int >= 1"):
        rd.open_dataset(handmade_shards.prefix, max_pixels=bad)


def test_a_cut_image_is_refused_not_filled_in(no_decoder):
    # libjpeg pads a cut scan with grey and only warns (OpenCV before 5 returns that picture).
    cut = cut_jpeg(jpeg_bytes(1, 40, 32))
    with pytest.raises(rd.RecordFormatError, match="truncated JPEG"):
        rd.decode_image(cut, "bgr")
    png = bytes(encoded(".png"))
    with pytest.raises(rd.RecordFormatError, match="truncated PNG"):
        rd.decode_image(png[:-12], "bgr")  # without its IEND chunk


def test_an_unknown_format_is_refused_naming_what_is_read():
    with pytest.raises(rd.RecordFormatError, match=r"\(JPEG, PNG, BMP, GIF, WebP, TIFF\)"):
        rd.decode_image(b"P6\n4 4\n255\n" + bytes(48), "bgr")  # a PPM, which OpenCV reads


@pytest.fixture
def guarded_pack(tmp_path):
    """12 JPEGs of 40x32 with four bad samples among them: key 3 declares 65000x65000, key 5
    is a PNG declaring 30000x30000, key 7 a JPEG cut inside its scan, key 9 a JPEG declaring
    12000x12000 (under OpenCV's own limit: it would decode into 432 MB of grey); label = key."""
    items = [(k, jpeg_bytes(k, 40, 32), float(k)) for k in range(12)]
    items[3] = (3, oversized_jpeg(), 3.0)
    items[5] = (5, oversized_png(), 5.0)
    items[7] = (7, cut_jpeg(jpeg_bytes(7, 40, 32)), 7.0)
    items[9] = (9, oversized_jpeg(12000, 12000), 9.0)
    samples = write_pack(tmp_path / "guarded", [items], index=True)
    return tmp_path / "guarded", samples


BAD = (3, 5, 7, 9)
GOOD = [k for k in range(12) if k not in BAD]


def test_the_dataset_names_an_oversized_sample(guarded_pack, no_decoder):
    prefix, samples = guarded_pack
    ds = rd.open_dataset(prefix, decode="rgb")
    assert ds.max_pixels == rd.DEFAULT_MAX_PIXELS
    for i in (3, 5, 9):
        with pytest.raises(rd.ImageTooLargeError) as caught:
            ds[i]
        error = caught.value
        assert (error.path, error.offset, error.key) == (samples[i].rec, samples[i].offset, i)
        assert str(error).startswith(f"{samples[i].rec}, key {i}, byte offset")
    with pytest.raises(rd.RecordFormatError, match="key 7, .*truncated JPEG"):
        ds[7]


def test_past_the_budget_opencv_refusals_are_named_errors_too(guarded_pack):
    # A budget above OpenCV's own limit (2**30 pixels): its refusal is no cv2.error either.
    ds = rd.open_dataset(guarded_pack[0], decode="bgr", max_pixels=10**10)
    with pytest.raises(rd.RecordFormatError, match="key 3, .*OpenCV") as caught:
        ds[3]
    assert not isinstance(caught.value, rd.ImageTooLargeError)


@pytest.mark.parametrize("size", [None, (16, 16)])
def test_the_loader_skips_refused_and_cut_images(guarded_pack, size):
    ds = rd.open_dataset(guarded_pack[0])
    with tr.Loader(ds, 4, shuffle=False, workers=2, on_error="skip", size=size) as loader:
        labels = [label for _, batch in loader for label in batch.tolist()]
        assert labels == GOOD  # never a refused or cut image as a sample
        assert loader.stats["skipped"] == 4
        reasons = {i: message for i, _, message in loader.bad_samples}
    assert sorted(reasons) == list(BAD)
    assert "declares 65000x65000 pixels" in reasons[3]
    assert "declares 30000x30000 pixels" in reasons[5]
    assert "truncated JPEG" in reasons[7]
    assert "declares 12000x12000 pixels" in reasons[9]


def test_the_loader_raises_the_readers_named_error(guarded_pack):
    prefix, samples = guarded_pack
    ds = rd.open_dataset(prefix)
    with tr.Loader(ds, 4, shuffle=False, workers=2, size=(16, 16)) as loader:
        with pytest.raises(rd.ImageTooLargeError) as caught:
            list(loader)
    assert (caught.value.key, caught.value.offset) == (3, samples[3].offset)


def test_replacements_are_never_refused_images(guarded_pack):
    ds = rd.open_dataset(guarded_pack[0])
    with tr.Loader(ds, 12, shuffle=False, workers=1, on_error="replace", size=(16, 16)) as loader:
        ((images, labels),) = list(loader)
        assert len(labels) == 12 and set(labels.tolist()) <= set(GOOD)
        assert loader.stats["replaced"] == 4


def test_the_loaders_budget_comes_from_the_dataset_or_the_caller(guarded_pack):
    prefix = guarded_pack[0]
    small = rd.open_dataset(prefix, max_pixels=1279)  # every 40x32 image is over it
    with tr.Loader(small, 6, shuffle=False, workers=1, on_error="skip", size=(8, 8)) as loader:
        assert [len(batch) for _, batch in loader] == [0, 0]
    ds = rd.open_dataset(prefix)
    with tr.Loader(ds, 6, workers=1, on_error="skip", size=(8, 8), max_pixels=1279) as loader:
        assert sum(len(batch) for _, batch in loader) == 0
    batches = tr.BatchDecoder(ds, size=(8, 8), on_error="skip", max_pixels=1280)
    images, labels = batches[list(range(12))]
    assert labels.tolist() == GOOD
    with pytest.raises(ValueError, match="max_pixels"):
        tr.BatchDecoder(ds, size=(8, 8), max_pixels=0)


def _segment(marker, body):
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(body) + 2) + body


def test_a_jpeg_whose_scan_is_one_byte_is_admitted_and_its_end_marker_is_needed():
    """The end-of-image marker is looked for right after the scan header: with one byte of
    entropy-coded data (an 8x8 grey image), it follows at once. A search that started two
    bytes late refused this valid image as cut."""
    one_code = bytes([1] + [0] * 15) + b"\x00"
    jpeg = b"".join(
        (
            b"\xff\xd8",
            _segment(0xDB, b"\x00" + bytes([1] * 64)),
            _segment(0xC0, b"\x08" + struct.pack(">HH", 8, 8) + b"\x01\x01\x11\x00"),
            _segment(0xC4, b"\x00" + one_code),
            _segment(0xC4, b"\x10" + one_code),
            _segment(0xDA, b"\x01\x01\x00\x00\x3f\x00"),
            b"\x3f",
            b"\xff\xd9",
        )
    )
    assert rd.admit_image(jpeg) == ("jpeg", 8, 8)
    assert rd.decode_image(jpeg, "gray").shape == (8, 8, 1)
    with pytest.raises(rd.RecordFormatError, match="no end-of-image marker"):
        rd.admit_image(jpeg[:-2])
