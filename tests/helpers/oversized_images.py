"""Small image files whose headers declare more pixels than their bytes hold.

Each is a real image of a few pixels from OpenCV with the size fields of its header rewritten
(and a PNG chunk's CRC made right again), so its structure is sound and only a decoder that
believes the header would allocate the declared size: 65000 x 65000 x 3 bytes is 12.7 GB.
"""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np


def small_image(height=16, width=16, seed=1):
    """Return a small BGR image with some texture."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def encoded(ext, image=None, params=()):
    ok, buf = cv2.imencode(ext, small_image() if image is None else image, list(params))
    assert ok
    return bytearray(buf.tobytes())


def oversized_jpeg(height=65000, width=65000):
    """A 16x16 baseline JPEG whose frame header (SOF0) declares `height` x `width`."""
    data = encoded(".jpg")
    i = 2
    while data[i + 1] != 0xC0:
        i += 2 + struct.unpack_from(">H", data, i + 2)[0]
    struct.pack_into(">HH", data, i + 5, height, width)
    return bytes(data)


def oversized_png(height=30000, width=30000):
    """An 8x8 PNG whose IHDR declares `height` x `width`, with its CRC fixed."""
    data = encoded(".png", small_image(8, 8))
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def oversized_bmp(height=30000, width=30000):
    """A 16x16 BMP whose info header declares `height` x `width` (the rows stay 16x16)."""
    data = encoded(".bmp")
    struct.pack_into("<ii", data, 18, width, height)
    return bytes(data)


def oversized_gif(height=65535, width=65535):
    """A 16x16 GIF whose logical screen declares `height` x `width`."""
    data = encoded(".gif")
    struct.pack_into("<HH", data, 6, width, height)
    return bytes(data)


def oversized_webp(kind="VP8 ", height=16383, width=16383):
    """A WebP whose header declares `height` x `width`: lossy (`VP8 `), lossless (`VP8L`), or
    extended (`VP8X`, a canvas header before a lossy frame)."""
    lossy_params = [cv2.IMWRITE_WEBP_QUALITY, 90]
    if kind == "VP8X":
        lossy = encoded(".webp", params=lossy_params)
        flags = bytes(4)
        canvas = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
        body = b"VP8X" + struct.pack("<I", 10) + flags + canvas + bytes(lossy[12:])
        return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body
    if kind == "VP8L":
        data = encoded(".webp", params=[cv2.IMWRITE_WEBP_QUALITY, 101])
        assert data[12:16] == b"VP8L"
        bits = (
            (width - 1) | (height - 1) << 14 | (struct.unpack_from("<I", data, 21)[0] & ~0xFFFFFFF)
        )
        struct.pack_into("<I", data, 21, bits)
        return bytes(data)
    data = encoded(".webp", params=lossy_params)
    assert data[12:16] == b"VP8 "
    struct.pack_into("<HH", data, 26, width, height)
    return bytes(data)


def oversized_tiff(height=30000, width=30000):
    """A 16x16 TIFF whose first directory declares `height` x `width`."""
    data = encoded(".tiff")
    order = "<" if data[:2] == b"II" else ">"
    ifd = struct.unpack_from(order + "I", data, 4)[0]
    for k in range(struct.unpack_from(order + "H", data, ifd)[0]):
        at = ifd + 2 + 12 * k
        tag, kind = struct.unpack_from(order + "HH", data, at)
        if tag in (256, 257):
            code = order + ("H" if kind == 3 else "I")
            struct.pack_into(code, data, at + 8, width if tag == 256 else height)
    return bytes(data)


OVERSIZED = {
    "jpeg": oversized_jpeg,
    "png": oversized_png,
    "bmp": oversized_bmp,
    "gif": oversized_gif,
    "webp": oversized_webp,
    "webp-lossless": lambda: oversized_webp("VP8L"),
    "webp-extended": lambda: oversized_webp("VP8X"),
    "tiff": oversized_tiff,
}


def cut_jpeg(data):
    """`data`, a JPEG, cut in the middle of its scan (no end-of-image marker)."""
    return data[: (data.index(b"\xff\xda") + len(data)) // 2]
