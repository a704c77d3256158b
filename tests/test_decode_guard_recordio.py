"""The decode budget in rectool.recordio's image helpers, and its copy of the reader's sniffer.

recordio stands alone, so `unpack_img` and `imdecode` read an image's size from its header with
their own copy of rectool.reader's size sniffing and refuse one over `max_pixels` before any
decoder runs. The crafted images (helpers/oversized_images.py) declare up to 65000x65000
pixels in a few hundred bytes. The two sniffers must not drift: they are run side by side on
generated headers of every format (JPEG frame-header variants, PNG, BMP, GIF, WebP, TIFF).
"""

from __future__ import annotations

import random
import struct

import cv2
import numpy as np
import pytest
from helpers.image_files import jpeg_bytes
from helpers.oversized_images import (
    OVERSIZED,
    cut_jpeg,
    encoded,
    oversized_bmp,
    oversized_jpeg,
    oversized_png,
    oversized_tiff,
    oversized_webp,
    small_image,
)

from rectool import reader, recordio


@pytest.fixture
def no_decoder(monkeypatch):
    """Make OpenCV's decoder fail the test if anything calls it."""

    def called(*args):
        raise AssertionError("cv2.imdecode was called")

    monkeypatch.setattr(cv2, "imdecode", called)


def packed(data):
    return recordio.pack(recordio.IRHeader(0, 3.0, 7, 0), data)


@pytest.mark.parametrize("name", sorted(OVERSIZED))
def test_an_oversized_header_is_refused_before_decoding(name, no_decoder):
    data = OVERSIZED[name]()
    limit = r"declares \d+x\d+ pixels \(.* megapixels\), over the decode limit of 50,000,000"
    for iscolor in (-1, 0, 1):
        with pytest.raises(recordio.ImageTooLargeError, match=limit):
            recordio.unpack_img(packed(data), iscolor)
    for flag, to_rgb in ((1, True), (1, False), (0, True)):
        with pytest.raises(recordio.ImageTooLargeError, match=limit) as caught:
            recordio.imdecode(data, flag, to_rgb)
    assert isinstance(caught.value, recordio.RecordFormatError)  # as the reader's


def test_the_budget_is_the_callers():
    data = jpeg_bytes(1, 40, 32)  # 1,280 pixels
    with pytest.raises(recordio.ImageTooLargeError, match="limit of 1,279 "):
        recordio.unpack_img(packed(data), max_pixels=1279)
    with pytest.raises(recordio.ImageTooLargeError):
        recordio.imdecode(data, max_pixels=1279)
    header, image = recordio.unpack_img(packed(data), max_pixels=1280)
    assert image.shape == (40, 32, 3) and header.label == 3.0
    assert recordio.imdecode(data, max_pixels=1280).shape == (40, 32, 3)
    big = oversized_jpeg(8000, 8000)  # 64 Mpx declared: over the default, under a raised one
    assert recordio.admit_image(big, max_pixels=64_000_000) == ("jpeg", 8000, 8000)
    assert recordio.DEFAULT_MAX_PIXELS == reader.DEFAULT_MAX_PIXELS


@pytest.mark.parametrize("value", [0, -5, 1.5, True, "50M", None])
def test_max_pixels_must_be_a_pixel_count(value):
    data = jpeg_bytes(1, 40, 32)
    with pytest.raises(ValueError, match="max_pixels must be an int >= 1"):
        recordio.unpack_img(packed(data), max_pixels=value)
    with pytest.raises(ValueError, match="max_pixels must be an int >= 1"):
        recordio.imdecode(data, max_pixels=value)


def test_a_cut_jpeg_still_decodes_as_mxnet_decodes_it():
    # The reader refuses a cut image; this module only adds the budget to MXNet's behaviour.
    cut = cut_jpeg(jpeg_bytes(1, 112, 112))
    with pytest.raises(reader.RecordFormatError, match="truncated JPEG"):
        reader.admit_image(cut)
    expected = cv2.imdecode(np.frombuffer(cut, np.uint8), -1)
    assert np.array_equal(recordio.unpack_img(packed(cut))[1], expected)


def test_bytes_without_a_readable_size_are_not_decoded(no_decoder):
    ok, ppm = cv2.imencode(".ppm", small_image(10, 12))  # OpenCV reads PPM; its size: text
    for data in (ppm.tobytes(), b"", b"garbage!", oversized_png()[:20], b"\xff\xd8\xff\xda"):
        assert recordio.image_size(data) is None
        assert recordio.unpack_img(packed(data))[1] is None  # MXNet: None for garbage
        with pytest.raises(recordio.RectoolError, match="no size in its header"):
            recordio.imdecode(data)


# --- the two sniffers agree ------------------------------------------------------------------


def _jpeg_variants(rng):
    """JPEGs whose first frame header is any SOFn, amid the segments libjpeg skips."""
    progressive = [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
    base = bytes(encoded(".jpg", small_image(rng.randint(1, 40), rng.randint(1, 40))))
    yield base
    yield bytes(encoded(".jpg", small_image(rng.randint(1, 40), rng.randint(1, 40)), progressive))
    sof = next(i for i in range(2, len(base) - 1) if base[i] == 0xFF and base[i + 1] == 0xC0)
    for marker in sorted(reader.JPEG_FRAME_MARKERS):
        data = bytearray(base)
        data[sof + 1] = marker
        struct.pack_into(">HH", data, sof + 5, rng.randrange(0, 65536), rng.randrange(0, 65536))
        yield bytes(data)
        extra = [
            b"\xff\xe1" + struct.pack(">H", 6) + b"Exif",  # an APP1 segment
            b"\xff\xfe" + struct.pack(">H", 5) + b"hi!",  # a comment
            b"\xff\xff\xff",  # fill bytes before the next marker
            b"junk",  # bytes outside any marker, skipped
            b"\xff\xd0",  # a standalone marker
            b"\xff\xdd\x00\x04\x00\x10",  # DRI
        ]
        inserted = b"".join(rng.sample(extra, rng.randint(1, len(extra))))
        yield bytes(data[:sof] + inserted + data[sof:])
        second = bytes(data[sof : sof + 2 + ((data[sof + 2] << 8) | data[sof + 3])])
        doubled = bytearray(second)
        struct.pack_into(">HH", doubled, 5, rng.randrange(1, 65536), rng.randrange(1, 65536))
        yield bytes(data[: sof + len(second)] + doubled + data[sof + len(second) :])  # first wins
    yield base[:sof] + b"\xff\xd9" + base[sof:]  # the end before a frame header
    scan = base.index(b"\xff\xda")
    yield base[:sof] + base[scan:]  # a scan before any frame header


def _other_variants(rng):
    def side():
        return rng.choice([0, 1, 2, rng.randrange(1, 1 << 14), rng.randrange(1, 1 << 16)])

    for _ in range(3):
        yield oversized_png(side(), side())
        yield oversized_bmp(-side(), side())  # top-down rows
        yield oversized_bmp(side(), -side())  # a negative width: no size
        yield oversized_tiff(side(), side())
        yield oversized_webp("VP8 ", rng.randrange(1, 1 << 14), rng.randrange(1, 1 << 14))
        yield oversized_webp("VP8L", rng.randrange(1, 1 << 14), rng.randrange(1, 1 << 14))
        yield oversized_webp("VP8X", rng.randrange(1, 1 << 24), rng.randrange(1, 1 << 24))
    for ext in (".png", ".bmp", ".gif", ".tiff", ".webp"):
        yield bytes(encoded(ext, small_image(rng.randint(1, 50), rng.randint(1, 50))))
    os2 = bytearray(encoded(".bmp", small_image(5, 7)))
    struct.pack_into("<IHH", os2, 14, 12, 7, 5)  # an OS/2 1.x header: 16-bit sides
    yield bytes(os2)
    big_endian = bytearray(b"MM\0*" + struct.pack(">I", 8) + struct.pack(">H", 2))
    big_endian += struct.pack(">HHII", 256, 4, 1, 300) + struct.pack(">HHIHH", 257, 3, 1, 200, 0)
    yield bytes(big_endian + bytes(4))
    riff = bytearray(oversized_webp("VP8 ", 16, 16))
    riff[12:16] = b"ALPH"  # a first chunk neither sniffer sizes
    yield bytes(riff)
    png = bytearray(oversized_png(9, 9))
    png[12:16] = b"IDAT"  # no IHDR first
    yield bytes(png)


def corpus(seed=0):
    """Whole image headers of every format: well formed, or refused by both sniffers."""
    rng = random.Random(seed)
    return [*_jpeg_variants(rng), *_other_variants(rng)]


def test_the_copy_sizes_every_generated_header_as_the_reader_does():
    whole = corpus()
    assert len(whole) >= 60
    sized = 0
    for data in whole:
        try:
            expected = reader.admit_image(data, max_pixels=1 << 62)
        except reader.RecordFormatError:
            expected = None  # the reader refuses it: the copy must find no size either
        assert recordio.image_size(data) == expected, data[:32]
        sized += expected is not None
    assert sized >= 50  # most of the corpus is sized, not refused by both


def test_a_prefix_is_never_sized_otherwise_than_the_whole():
    # Cut anywhere, the copy either finds no size or the whole image's: never another one.
    rng = random.Random(1)
    for data in corpus():
        whole = recordio.image_size(data)
        for cut in {rng.randrange(0, len(data)) for _ in range(8)} | {12, 16, 24, 30}:
            assert recordio.image_size(data[:cut]) in (None, whole), (data[:32], cut)


@pytest.mark.parametrize(
    ("ext", "params"),
    [
        (".jpg", ()),
        (".png", ()),
        (".bmp", ()),
        (".gif", ()),
        (".tiff", ()),
        (".webp", (cv2.IMWRITE_WEBP_QUALITY, 90)),
        (".webp", (cv2.IMWRITE_WEBP_QUALITY, 101)),
    ],
)
def test_the_header_gives_the_size_opencv_decodes(ext, params):
    data = bytes(encoded(ext, small_image(37, 53), params))
    height, width = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape[:2]
    assert recordio.image_size(data)[1:] == (height, width) == (37, 53)
