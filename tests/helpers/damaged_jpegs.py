"""JPEGs with damaged entropy-coded data, as a flaky disk or a cut download leaves them.

Each is a valid JPEG from OpenCV, damaged deterministically inside its scan: the markers stay
sound and an end-of-image marker ends the file, so only a decoder that reports libjpeg's
warnings tells them from good ones.
"""

from __future__ import annotations

from helpers.image_files import jpeg_bytes


def scan_start(data):
    """Return where the entropy-coded data of a baseline JPEG's only scan begins."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")


def flip_bytes(data):
    """XOR eight bytes in the middle of the scan with 0x5A."""
    middle = (scan_start(data) + len(data)) // 2
    damaged = bytearray(data)
    for i in range(middle, middle + 8):
        damaged[i] ^= 0x5A
    return bytes(damaged)


def zero_run(data):
    """Zero 64 bytes in the middle of the scan (shorter runs can decode without a warning)."""
    middle = (scan_start(data) + len(data)) // 2
    return data[:middle] + bytes(64) + data[middle + 64 :]


def cut_with_end_marker(data):
    """Keep the first half of the file (inside the scan) and append FF D9."""
    half = len(data) // 2
    assert half > scan_start(data)
    return data[:half] + b"\xff\xd9"


DAMAGES = {"flipped": flip_bytes, "zeroed": zero_run, "cut-with-eoi": cut_with_end_marker}


def good_jpeg():
    """Return the 112x112 JPEG the damages are made from."""
    return jpeg_bytes(1, 112, 112)
