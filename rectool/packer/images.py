"""Check, decode, transform and encode one image, with im2rec's semantics for every option.

Everything here works on bytes in memory, so non-ASCII paths never reach OpenCV, and raises
`ImageRefused` with a short reason when an image must not be packed. Every decode goes
through the reader's guard first (`reader.admit_image`: the header's dimensions against
`max_pixels`, before anything is allocated): OpenCV through `reader.decode_image`, simplejpeg
through `_simplejpeg_decode` here.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import choices
from ..errors import RecordFormatError, RectoolError, UsageError
from ..reader import (
    DEFAULT_MAX_PIXELS,
    JPEG_FRAME_MARKERS,
    JPEG_STANDALONE_MARKERS,
    ImageTooLargeError,
    admit_image,
    decode_image,
    sniff_format,
)

if TYPE_CHECKING:
    import numpy as np


class _LazyOpenCV:
    """OpenCV, imported on first use: passing JPEG and PNG bytes through needs none of it.

    The first attribute looked up imports `cv2`, quiets its logging (a refused image is
    reported once, by rectool; OpenCV's own warnings would only add noise) and puts the real
    module in place of this stand-in.
    """

    def __getattr__(self, name: str) -> Any:
        global cv2
        import cv2 as module

        module.utils.logging.setLogLevel(module.utils.logging.LOG_LEVEL_ERROR)
        cv2 = module
        return getattr(module, name)


cv2: Any = _LazyOpenCV()

# Decoding at 1/8 scale still runs libjpeg's entropy decoder over the whole file, so a corrupt or
# truncated image fails, at a fraction of the cost of a full decode. (Names of cv2 flags.)
_CHECK_FLAG = "IMREAD_REDUCED_GRAYSCALE_8"
_REDUCED_COLOR = {
    2: "IMREAD_REDUCED_COLOR_2",
    4: "IMREAD_REDUCED_COLOR_4",
    8: "IMREAD_REDUCED_COLOR_8",
}
_REDUCED_GRAY = {
    2: "IMREAD_REDUCED_GRAYSCALE_2",
    4: "IMREAD_REDUCED_GRAYSCALE_4",
    8: "IMREAD_REDUCED_GRAYSCALE_8",
}
_COLOR_FLAGS = {1: "IMREAD_COLOR", 0: "IMREAD_GRAYSCALE", -1: "IMREAD_UNCHANGED"}
ENCODINGS = choices.ENCODINGS


class ImageRefused(RectoolError):
    """This image must not be packed; `reason` says why in a few words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class ImageTooLarge(ImageRefused):
    """An image whose header declares more pixels than `max_pixels`: refused before decoding
    (what the reader raises as `ImageTooLargeError`)."""


def admit(data: bytes, max_pixels: float = DEFAULT_MAX_PIXELS) -> tuple[str, int, int]:
    """Return (format, height, width) of bytes the decode guard admits (`reader.admit_image`);
    raise `ImageRefused`, or `ImageTooLarge` over `max_pixels`."""
    try:
        return admit_image(data, max_pixels)
    except ImageTooLargeError as exc:
        raise ImageTooLarge(exc.reason) from None
    except RecordFormatError as exc:
        raise ImageRefused(exc.reason) from None


@dataclass(frozen=True)
class Transform:
    """Re-encoding options, as im2rec names them; `None` everywhere means pass-through."""

    resize: int = 0  # shorter side in pixels, 0 = keep
    center_crop: bool = False
    quality: int = 95  # JPEG 1-100, PNG compression 0-9
    encoding: str = ".jpg"
    color: int = 1  # 1 colour, 0 grayscale, -1 unchanged


# Re-encoding quality when none is given, and the range each encoding takes (as OpenCV).
DEFAULT_QUALITY = {".jpg": 95, ".png": 3}
QUALITY_RANGE = {".jpg": (1, 100), ".png": (0, 9)}
_QUALITY_NAME = {".jpg": "JPEG quality", ".png": "PNG compression"}


def transform_from_options(
    resize: int | None = None,
    center_crop: bool = False,
    quality: int | None = None,
    encoding: str | None = None,
    color: int | None = None,
) -> Transform | None:
    """Return the `Transform` that im2rec-style re-encoding options ask for, or None when none
    is given (the images then pass through byte for byte).

    Any option given means re-encoding: the encoding defaults to .jpg, the quality to
    `DEFAULT_QUALITY` of the encoding, the colour to 1. Raises `UsageError` naming the option
    when a value does not fit (a PNG compression above 9, a JPEG quality of 0).
    """
    if not (resize or center_crop or quality is not None or encoding or color is not None):
        return None
    encoding = encoding or ".jpg"
    if encoding not in ENCODINGS:
        raise UsageError(f"--encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    if quality is None:
        quality = DEFAULT_QUALITY[encoding]
    low, high = QUALITY_RANGE[encoding]
    if not low <= quality <= high:
        raise UsageError(
            f"--quality {quality}: {_QUALITY_NAME[encoding]} must be {low}-{high} "
            f"(--encoding {encoding})"
        )
    color = 1 if color is None else int(color)
    if color not in (-1, 0, 1):
        raise UsageError(f"--color must be -1, 0 or 1, got {color}")
    return Transform(resize or 0, bool(center_crop), quality, encoding, color)


def _decode(data: bytes, flag: int, max_pixels: float) -> np.ndarray:
    """Decode with OpenCV through the reader's guard (`reader.decode_image`)."""
    try:
        return decode_image(data, flag, max_pixels)
    except ImageTooLargeError as exc:
        raise ImageTooLarge(exc.reason) from None
    except RecordFormatError:
        raise ImageRefused(
            "cannot decode: not an image OpenCV reads, or corrupt/truncated"
        ) from None


CHECK_MODES = choices.CHECK_MODES


def check_image(
    data: bytes, mode: str = "structure", max_pixels: float = DEFAULT_MAX_PIXELS
) -> str:
    """Refuse bytes that are empty, not an image, truncated, corrupt or over `max_pixels`;
    return the format name.

    `structure` walks the container (JPEG markers up to the scan and an end-of-image marker
    after it; every PNG chunk with its CRC) at a few microseconds an image, and reads the
    dimensions of every format from its header (`admit`); other formats, and every image in
    `decode` mode, are decoded. A JPEG is decoded by libjpeg-turbo at 1/8 scale in `decode`
    mode, which still runs the entropy decoder over every scan, and refused when libjpeg-turbo
    warns that its data is corrupt (OpenCV would return a damaged picture).
    """
    kind, _, _ = check_container(data, max_pixels)
    if kind == "jpeg":
        if mode == "decode" and not check_jpeg_data(data, max_pixels):
            _decode(data, getattr(cv2, _CHECK_FLAG), max_pixels)
    elif kind == "png":
        if mode == "decode":
            _decode(data, cv2.IMREAD_UNCHANGED, max_pixels)
    else:
        _decode(data, cv2.IMREAD_UNCHANGED, max_pixels)
    return kind


def inspect_image(data: bytes, max_pixels: float = DEFAULT_MAX_PIXELS) -> tuple[int, int, int]:
    """Refuse what `check_image(data, "decode", max_pixels)` refuses; return (height, width,
    channels).

    The shape is what `cv2.imdecode(..., IMREAD_UNCHANGED)` returns; a JPEG that libjpeg-turbo
    checks is not decoded a second time for it.
    """
    kind, _, _ = check_container(data, max_pixels)
    if kind == "jpeg":
        header = check_jpeg_data(data, max_pixels)
        if header:
            height, width, colorspace, _ = header
            return height, width, 1 if colorspace == "Gray" else 3
    image = _decode(data, cv2.IMREAD_UNCHANGED, max_pixels)
    return image.shape[0], image.shape[1], 1 if image.ndim == 2 else image.shape[2]


def check_jpeg_data(
    data: bytes, max_pixels: float = DEFAULT_MAX_PIXELS
) -> tuple[int, int, str, str] | None:
    """Run libjpeg-turbo's entropy decoder over a JPEG's scans at 1/8 scale, refusing what it
    reports as corrupt data; return its header (height, width, colourspace, subsampling), or
    None when it cannot judge the file and OpenCV should decode it instead.

    OpenCV hides libjpeg's warnings: a damaged scan (flipped or zeroed bytes, a cut file with
    an end marker appended) decodes into a damaged picture. simplejpeg's strict mode stops at
    the first warning. Warnings about header fields only (an unknown JFIF revision or Adobe
    transform, odd scan parameters) say nothing about the pixels, and errors simplejpeg has but
    OpenCV may not (an unsupported colour conversion) are left to OpenCV.
    """
    # libjpeg converts CMYK and YCCK to CMYK only; every other colourspace to gray.
    decoded = _simplejpeg_decode(data, ("CMYK", "GRAY"), 8, max_pixels)
    return None if decoded is None else decoded[0]


def _simplejpeg_decode(
    data: bytes, spaces: tuple[str, str], factor: int, max_pixels: float
) -> tuple[tuple[int, int, str, str], np.ndarray] | None:
    """Decode a JPEG with simplejpeg's strict mode at 1/`factor` scale, after the guard
    (`admit`); return (header, image), or None when simplejpeg cannot judge the file.

    `spaces` is (colourspace for CMYK and YCCK files, colourspace for every other). Refuses
    the JPEG when libjpeg-turbo reports its data corrupt. The one call of simplejpeg's decoder.
    """
    import simplejpeg

    admit(data, max_pixels)
    try:
        header = simplejpeg.decode_jpeg_header(data, strict=True)
        height, width, colorspace, _ = header
        image = simplejpeg.decode_jpeg(
            data,
            spaces[0] if colorspace in ("CMYK", "YCCK") else spaces[1],
            min_height=-(-height // factor),
            min_width=-(-width // factor),
            min_factor=factor,
            strict=True,
        )
    except ValueError as exc:
        message = str(exc).strip()
        if message.startswith(_CORRUPT_JPEG_WARNINGS):
            raise ImageRefused(f"corrupt JPEG data (libjpeg-turbo: {message[:120]})") from None
        return None
    return header, image


# libjpeg-turbo's warnings (jerror.h) that mean the entropy-coded data is damaged: bad Huffman
# or arithmetic codes, extraneous bytes or a marker where data should be, a premature end. The
# picture it returns has grey, shifted or wrong blocks.
_CORRUPT_JPEG_WARNINGS = (
    "Corrupt JPEG data",
    "Premature end of JPEG file",
    "Inconsistent progression sequence",
)


def check_container(data: bytes, max_pixels: float = DEFAULT_MAX_PIXELS) -> tuple[str, int, int]:
    """Refuse empty, unknown, truncated or structurally corrupt bytes, or bytes whose header
    declares more than `max_pixels` pixels; return (kind, height, width).

    Stricter than the decode guard (`admit`, which also runs), which refuses only what libjpeg
    and libpng would fail on or fill in: no byte between JPEG segments, every PNG CRC.
    """
    if not data:
        raise ImageRefused("empty file")
    kind = sniff_format(data)
    if kind is None:
        raise ImageRefused("not an image (unknown file signature)")
    if kind == "jpeg":
        _check_jpeg_structure(data)
    elif kind == "png":
        _check_png_structure(data)
    return admit(data, max_pixels)


def _check_jpeg_structure(data: bytes) -> None:
    n, i, frame = len(data), 2, False
    while True:
        if i + 4 > n:
            raise ImageRefused("truncated JPEG (ends inside its headers)")
        if data[i] != 0xFF:
            raise ImageRefused(f"corrupt JPEG (no marker at byte {i})")
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        if marker in JPEG_STANDALONE_MARKERS:
            i += 2
            continue
        if marker == 0xD9:
            raise ImageRefused("corrupt JPEG (end-of-image marker before any image data)")
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            raise ImageRefused(f"corrupt JPEG (segment length {length} at byte {i})")
        if marker in JPEG_FRAME_MARKERS:
            if i + 10 > n:
                raise ImageRefused("truncated JPEG (ends inside its frame header)")
            width, components = (data[i + 7] << 8) | data[i + 8], data[i + 9]
            if not width or not components:
                raise ImageRefused("corrupt JPEG (frame header with zero width or components)")
            frame = True
        elif marker == 0xDA:
            if not frame:
                raise ImageRefused("corrupt JPEG (image data before any frame header)")
            break
        i += 2 + length
    if i + 2 + length > n:
        raise ImageRefused("truncated JPEG (ends inside its scan header)")
    # libjpeg fills a truncated scan with grey and only warns; the end marker tells. Entropy-
    # coded data stuffs every 0xFF with 0x00, so FF D9 after the scan header can only be the
    # real marker; bytes may follow it (camera and editor trailers), so search from the end.
    if data.rfind(b"\xff\xd9", i + 2 + length) < 0:
        raise ImageRefused("truncated JPEG (no end-of-image marker)")


def _check_png_structure(data: bytes) -> None:
    n, pos, first = len(data), 8, True
    view = memoryview(data)
    while pos + 12 <= n:
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        name = kind.decode("latin-1")
        if end > n:
            raise ImageRefused(f"truncated PNG (chunk {name!r} runs past the end)")
        (crc,) = struct.unpack_from(">I", data, end - 4)
        if zlib.crc32(view[pos + 4 : end - 4]) != crc:
            raise ImageRefused(f"corrupt PNG (CRC mismatch in chunk {name!r})")
        if first:
            if kind != b"IHDR" or not all(struct.unpack_from(">II", data, pos + 8)):
                raise ImageRefused("corrupt PNG (no valid IHDR chunk first)")
            first = False
        if kind == b"IEND":
            return
        pos = end
    raise ImageRefused("truncated PNG (no IEND chunk)")


def _reduction(size: tuple[int, int], transform: Transform) -> int:
    """Return the largest of 2/4/8 by which a JPEG of `size` (height, width) can be decoded
    and still cover the target."""
    if not transform.resize or transform.color == -1:
        return 1
    shorter = min(size)
    for factor in (8, 4, 2):
        # Reduced decoding rounds dimensions up; demand a margin so the final resize shrinks.
        if shorter // factor >= transform.resize:
            return factor
    return 1


def decode_for_transform(
    data: bytes, transform: Transform, max_pixels: float = DEFAULT_MAX_PIXELS
) -> np.ndarray:
    """Decode with the colour mode of `transform`, at reduced scale when a resize allows it.

    Refuses what `check_container` refuses (an image over `max_pixels` before decoding it). A
    JPEG is refused when libjpeg-turbo reports its data corrupt (`check_jpeg_data`), so a
    damaged image is never re-encoded into a sound-looking one.
    """
    kind, height, width = check_container(data, max_pixels)
    factor = _reduction((height, width), transform) if kind == "jpeg" else 1
    if kind == "jpeg" and transform.color != -1:
        if _has_exif(data):
            check_jpeg_data(data, max_pixels)  # then OpenCV decodes: it applies EXIF rotation
        else:
            image = _decode_jpeg_checked(data, transform.color, factor, max_pixels)
            if image is not None:
                return image
    if factor > 1:
        table = _REDUCED_COLOR if transform.color == 1 else _REDUCED_GRAY
        return _decode(data, getattr(cv2, table[factor]), max_pixels)
    return _decode(data, getattr(cv2, _COLOR_FLAGS[transform.color]), max_pixels)


def _decode_jpeg_checked(
    data: bytes, color: int, factor: int, max_pixels: float
) -> np.ndarray | None:
    """Decode a JPEG as OpenCV's `IMREAD_(REDUCED_)COLOR/GRAYSCALE` would, pixel for pixel (both
    are libjpeg-turbo with its default IDCT and upsampling), refusing corrupt data; None when
    simplejpeg cannot judge the file (OpenCV decodes it then)."""
    space = "BGR" if color == 1 else "GRAY"
    decoded = _simplejpeg_decode(data, (space, space), factor, max_pixels)
    if decoded is None:
        return None
    image = decoded[1]
    return image if color == 1 else image[:, :, 0]


def _has_exif(data: bytes) -> bool:
    """Return True when a JPEG has an Exif segment before its scan (it may rotate the image)."""
    i, n = 2, len(data)
    while i + 10 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xDA:
            return False
        if marker == 0xE1 and data[i + 4 : i + 10] == b"Exif\0\0":
            return True
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return False


def apply_transform(image: np.ndarray, transform: Transform) -> np.ndarray:
    """Center-crop and resize the shorter side exactly as im2rec's `image_encode` does."""
    if transform.center_crop:
        h, w = image.shape[:2]
        if h > w:
            margin = (h - w) // 2
            image = image[margin : margin + w, :]
        else:
            margin = (w - h) // 2
            image = image[:, margin : margin + h]
    if transform.resize:
        h, w = image.shape[:2]
        if h > w:
            size = (transform.resize, h * transform.resize // w)
        else:
            size = (w * transform.resize // h, transform.resize)
        if size != (w, h):  # a reduced decode can land on the target already
            image = cv2.resize(image, size)
    return image


def encode_image(image: np.ndarray, transform: Transform) -> bytes:
    """Encode as `transform.encoding` with its quality, as `mxnet.recordio.pack_img` does."""
    if transform.encoding == ".png":
        params = [cv2.IMWRITE_PNG_COMPRESSION, transform.quality]
    else:
        params = [cv2.IMWRITE_JPEG_QUALITY, transform.quality]
    ok, buf = cv2.imencode(transform.encoding, image, params)
    if not ok:
        raise ImageRefused(f"OpenCV could not encode the image as {transform.encoding}")
    return buf.tobytes()


def reencode_image(
    data: bytes, transform: Transform, max_pixels: float = DEFAULT_MAX_PIXELS
) -> bytes:
    """Return `data` decoded, transformed and encoded again according to `transform` (an image
    over `max_pixels` refused before decoding)."""
    image = decode_for_transform(data, transform, max_pixels)
    return encode_image(apply_transform(image, transform), transform)
