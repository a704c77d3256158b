"""`rectool.packer.images` checks: what `--check structure` and `--check decode` accept and refuse.

The structure walk (`check_image(data, "structure")`, the default of `pack`) is tested on bytes
built by hand, one refusal at a time; re-encoding options are in tests/test_transform_options.py.
"""

from __future__ import annotations

import io
import json
import struct
import zlib

import cv2
import numpy as np
import pytest
import simplejpeg
from click.testing import CliRunner
from helpers.damaged_jpegs import DAMAGES, good_jpeg, scan_start
from helpers.image_files import encode, image_array, jpeg_bytes, write_list
from PIL import Image

from rectool.cli import cli
from rectool.packer.images import (
    ImageRefused,
    Transform,
    check_image,
    decode_for_transform,
    inspect_image,
    reencode_image,
)

TRAILER_LENGTHS = (1, 62, 63, 64, 1000)


def decoded(data, flag=cv2.IMREAD_UNCHANGED):
    return cv2.imdecode(np.frombuffer(data, np.uint8), flag)


def trailer(kind, length):
    """Bytes after the end marker: random, or full of FF D8 / FF D9 pairs."""
    if kind == "random":
        return np.random.default_rng(length).bytes(length)
    return (b"\xff\xd9\x00\xff\xd8\xff\xe1" * (length // 7 + 1))[:length]


# -- the structure walk, one refusal at a time ----------------------------------------------------

SOI = b"\xff\xd8"


def png_chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


GRAY_2X1_IHDR = struct.pack(">IIBBBBB", 2, 1, 8, 0, 0, 0, 0)  # width, height, 8-bit gray


def png_bytes(ihdr=GRAY_2X1_IHDR, first=b"IHDR"):
    """A 2x1 gray PNG written by hand: IHDR (or `first` in its place), IDAT, IEND."""
    chunks = [png_chunk(first, ihdr), png_chunk(b"IDAT", zlib.compress(b"\0\x10\x20"))]
    if first != b"IHDR":
        chunks.append(png_chunk(b"IHDR", ihdr))
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks) + png_chunk(b"IEND", b"")


def scan_header_past_the_end():
    data = bytearray(jpeg_bytes(0))
    data[data.index(b"\xff\xda") + 2] = 2  # the length's high byte: runs past the file's end
    return bytes(data)


def flipped_idat_byte():
    data = bytearray(png_bytes())
    data[data.index(b"IDAT") + 5] ^= 0x01
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"", "empty file", id="empty"),
        pytest.param(b"hello", "not an image (unknown file signature)", id="text"),
        pytest.param(SOI + b"\xff", "truncated JPEG (ends inside its headers)", id="soi-only"),
        pytest.param(
            SOI + b"\xff\xe0\x00\x04ab" + bytes(4),
            "corrupt JPEG (no marker at byte 8)",
            id="no-marker",
        ),
        pytest.param(
            SOI + b"\xff\xd9" + bytes(2),
            "corrupt JPEG (end-of-image marker before any image data)",
            id="eoi-first",
        ),
        pytest.param(
            SOI + b"\xff\xe0\x00\x01", "corrupt JPEG (segment length 1 at byte 2)", id="length-1"
        ),
        pytest.param(
            SOI + b"\xff\xc0\x00\x11\x08\x00",
            "truncated JPEG (ends inside its frame header)",
            id="cut-sof",
        ),
        pytest.param(
            SOI + b"\xff\xc0\x00\x0b\x08\x00\x10\x00\x00\x01" + bytes(8),
            "corrupt JPEG (frame header with zero width or components)",
            id="zero-width",
        ),
        pytest.param(
            SOI + b"\xff\xda\x00\x08" + bytes(8) + b"\xff\xd9",
            "corrupt JPEG (image data before any frame header)",
            id="sos-before-sof",
        ),
        pytest.param(
            scan_header_past_the_end(), "truncated JPEG (ends inside its scan header)", id="cut-sos"
        ),
        pytest.param(jpeg_bytes(1)[:-2], "truncated JPEG (no end-of-image marker)", id="no-eoi"),
        pytest.param(
            png_bytes()[: png_bytes().index(b"IDAT") + 10],
            "truncated PNG (chunk 'IDAT' runs past the end)",
            id="cut-chunk",
        ),
        pytest.param(
            flipped_idat_byte(), "corrupt PNG (CRC mismatch in chunk 'IDAT')", id="png-crc"
        ),
        pytest.param(
            png_bytes(first=b"tEXt"), "corrupt PNG (no valid IHDR chunk first)", id="ihdr-second"
        ),
        pytest.param(
            png_bytes(ihdr=struct.pack(">IIBBBBB", 0, 1, 8, 0, 0, 0, 0)),
            "corrupt PNG (no valid IHDR chunk first)",
            id="zero-width-png",
        ),
        pytest.param(png_bytes()[:-12], "truncated PNG (no IEND chunk)", id="no-iend"),
    ],
)
def test_the_structure_walk_refuses_with_its_reason(data, reason):
    with pytest.raises(ImageRefused) as refused:
        check_image(data, "structure")
    assert refused.value.reason == reason


def test_the_hand_written_png_is_sound():
    # The refusals above are damage to this file, not to a file that was bad to begin with.
    assert check_image(png_bytes(), "structure") == "png"
    assert decoded(png_bytes()).tolist() == [[0x10, 0x20]]


def test_fill_bytes_and_standalone_markers_are_walked_over():
    good = jpeg_bytes(2)
    # FF fill bytes before a marker (B.1.1.2) and a TEM marker (no length) after SOI.
    data = SOI + b"\xff\xff\xff\x01" + good[2:]
    assert check_image(data, "structure") == "jpeg"
    assert np.array_equal(decoded(data), decoded(good))


# -- bytes after the end-of-image marker ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["random", "markers"])
@pytest.mark.parametrize("length", TRAILER_LENGTHS)
@pytest.mark.parametrize("mode", ["structure", "decode"])
def test_a_trailer_after_the_end_marker_is_accepted(mode, length, kind):
    good = jpeg_bytes(3)
    data = good + trailer(kind, length)
    assert np.array_equal(decoded(data), decoded(good))  # OpenCV reads it as the image it is
    assert check_image(data, mode) == "jpeg"


@pytest.mark.parametrize("mode", ["structure", "decode"])
@pytest.mark.parametrize("length", TRAILER_LENGTHS)
def test_a_trailer_on_a_progressive_jpeg_is_accepted(mode, length):
    good = encode(image_array(4, 64, 48), ".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert check_image(good + trailer("random", length), mode) == "jpeg"


@pytest.mark.parametrize("mode", ["structure", "decode"])
@pytest.mark.parametrize("keep", [0.3, 0.5, 0.9, -2])
def test_a_jpeg_without_end_marker_is_still_refused(mode, keep):
    good = jpeg_bytes(3, 64, 64)
    cut = len(good) + keep if keep < 0 else int(len(good) * keep)
    assert cut > scan_start(good)
    for data in (good[:cut], good[:cut] + bytes(100)):  # zeros after a cut scan: still no end
        with pytest.raises(ImageRefused) as refused:
            check_image(data, mode)
        assert refused.value.reason == "truncated JPEG (no end-of-image marker)"


# -- damaged entropy-coded data -------------------------------------------------------------------


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_scans_are_real_damage(damage):
    good = good_jpeg()
    data = DAMAGES[damage](good)
    picture = decoded(data)
    assert picture is not None and not np.array_equal(picture, decoded(good))
    with pytest.raises(ValueError, match="^Corrupt JPEG data"):
        simplejpeg.decode_jpeg(data, strict=True)


@pytest.mark.parametrize("damage", DAMAGES)
def test_check_decode_refuses_damaged_scans(damage):
    data = DAMAGES[damage](good_jpeg())
    with pytest.raises(ImageRefused) as refused:
        check_image(data, "decode")
    assert refused.value.reason.startswith("corrupt JPEG data (libjpeg-turbo: Corrupt JPEG data: ")
    with pytest.raises(ImageRefused):
        inspect_image(data)


def test_the_refusal_quotes_libjpeg():
    data = DAMAGES["cut-with-eoi"](good_jpeg())
    with pytest.raises(ImageRefused) as refused:
        check_image(data, "decode")
    assert refused.value.reason == (
        "corrupt JPEG data (libjpeg-turbo: Corrupt JPEG data: premature end of data segment)"
    )


# -- what the strict check leaves as it was -------------------------------------------------------


def cmyk_jpeg():
    rgb = Image.fromarray(image_array(6, 24, 16)[..., ::-1].copy())
    buffer = io.BytesIO()
    rgb.convert("CMYK").save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def unknown_jfif_revision():
    data = bytearray(jpeg_bytes(8))
    app0 = data.index(b"JFIF\0")
    data[app0 + 5] = 2  # major version 2: libjpeg warns, every decoder reads it
    return bytes(data)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(jpeg_bytes(2, 40, 32), id="colour"),
        pytest.param(encode(image_array(2, channels=1), ".jpg"), id="gray-jpeg"),
        pytest.param(
            encode(image_array(2, 33, 17), ".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]),
            id="progressive",
        ),
        pytest.param(cmyk_jpeg(), id="cmyk"),
        pytest.param(unknown_jfif_revision(), id="jfif-2"),
        pytest.param(encode(image_array(2), ".png"), id="png"),
        pytest.param(encode(image_array(2, channels=1), ".png"), id="gray-png"),
        pytest.param(encode(np.dstack([image_array(2)] * 2)[..., :4], ".png"), id="png-alpha"),
        pytest.param(encode(image_array(2), ".bmp"), id="bmp"),
    ],
)
def test_valid_images_pass_decode_with_opencvs_shape(data):
    image = decoded(data)
    assert image is not None
    check_image(data, "decode")
    channels = 1 if image.ndim == 2 else image.shape[2]
    assert inspect_image(data) == (image.shape[0], image.shape[1], channels)


def test_a_jfif_revision_warning_is_not_corruption():
    data = unknown_jfif_revision()
    with pytest.raises(ValueError, match="JFIF"):
        simplejpeg.decode_jpeg(data, strict=True)  # what the check must not refuse
    assert check_image(data, "decode") == "jpeg"


@pytest.mark.parametrize("mode", ["structure", "decode"])
def test_broken_pngs_are_still_refused(mode):
    png = encode(image_array(3), ".png")
    with pytest.raises(ImageRefused, match="truncated PNG"):
        check_image(png[:-20], mode)


def test_simplejpeg_and_opencv_decode_valid_jpegs_to_the_same_pixels():
    # The strict decoder only checks; the pixels packed when re-encoding stay OpenCV's. They
    # agree anyway: one libjpeg-turbo, the same IDCT and upsampling.
    for seed in range(5):
        data = jpeg_bytes(seed, 56 + seed, 40)
        assert np.array_equal(simplejpeg.decode_jpeg(data, "BGR"), decoded(data, cv2.IMREAD_COLOR))


# -- through `rectool pack` -----------------------------------------------------------------------


def test_pack_check_decode_refuses_damaged_scans(tmp_path):
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    items = [(0, 0, "a/good.jpg")]
    (root / "a" / "good.jpg").write_bytes(good_jpeg())
    for n, (name, damage) in enumerate(DAMAGES.items(), 1):
        (root / "a" / f"{name}.jpg").write_bytes(damage(good_jpeg()))
        items.append((n, 0, f"a/{name}.jpg"))
    lst = write_list(tmp_path / "d.lst", items)
    runner = CliRunner()
    out = tmp_path / "out" / "d"
    result = runner.invoke(cli, ["pack", str(lst), str(root), str(out), "--check", "decode"])
    assert result.exit_code == 3, result.output
    failures = [json.loads(line) for line in (tmp_path / "out" / "d.failures.jsonl").open()]
    assert [(f["line"], f["index"], f["path"]) for f in failures] == [
        (n + 1, n, path) for n, _, path in items[1:]
    ]
    for failure in failures:
        assert failure["reason"].startswith("corrupt JPEG data (libjpeg-turbo: Corrupt JPEG data")
    # The default structural check does not read the scan: only --check decode catches these.
    result = runner.invoke(cli, ["pack", str(lst), str(root), str(out), "--overwrite"])
    assert result.exit_code == 0, result.output


# -- re-encoding decodes through the strict check -------------------------------------------------


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("transform", [Transform(resize=40), Transform(color=0), Transform()])
def test_reencoding_refuses_damaged_scans(damage, transform):
    with pytest.raises(ImageRefused, match=r"^corrupt JPEG data \(libjpeg-turbo: "):
        reencode_image(DAMAGES[damage](good_jpeg()), transform)


REDUCED = {
    (1, 1): cv2.IMREAD_COLOR,
    (1, 2): cv2.IMREAD_REDUCED_COLOR_2,
    (1, 4): cv2.IMREAD_REDUCED_COLOR_4,
    (1, 8): cv2.IMREAD_REDUCED_COLOR_8,
    (0, 1): cv2.IMREAD_GRAYSCALE,
    (0, 2): cv2.IMREAD_REDUCED_GRAYSCALE_2,
    (0, 4): cv2.IMREAD_REDUCED_GRAYSCALE_4,
    (0, 8): cv2.IMREAD_REDUCED_GRAYSCALE_8,
}


@pytest.mark.parametrize(("color", "factor"), sorted(REDUCED))
@pytest.mark.parametrize(
    "params",
    [[], [cv2.IMWRITE_JPEG_PROGRESSIVE, 1], [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, 0x111111]],
    ids=["baseline", "progressive", "4:4:4"],
)
def test_reencoding_decodes_to_opencvs_pixels(color, factor, params):
    # 448x301: resize 37 lets the decode reduce by `factor` (shorter side 301 // factor >= 37).
    data = cv2.imencode(".jpg", image_array(3, 301, 448), params)[1].tobytes()
    resize = {1: 0, 2: 150, 4: 75, 8: 37}[factor]
    image = decode_for_transform(data, Transform(resize=resize, color=color))
    assert np.array_equal(image, decoded(data, REDUCED[color, factor]))


def test_an_exif_orientation_is_applied_as_opencv_applies_it():
    # OpenCV rotates by the EXIF orientation; the strict decoder does not, so such a file is
    # checked by it and decoded by OpenCV.
    buffer = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.fromarray(image_array(4, 60, 100)).save(buffer, "JPEG", exif=exif.tobytes())
    data = buffer.getvalue()
    image = decode_for_transform(data, Transform(color=1))
    assert image.shape == (100, 60, 3)  # turned upright
    assert np.array_equal(image, decoded(data, cv2.IMREAD_COLOR))
    reduced = decode_for_transform(data, Transform(resize=30))
    assert np.array_equal(reduced, decoded(data, cv2.IMREAD_REDUCED_COLOR_2))
    damaged = DAMAGES["cut-with-eoi"](data)
    with pytest.raises(ImageRefused, match="corrupt JPEG data"):
        decode_for_transform(damaged, Transform(resize=30))
