"""Record payloads that exercise every corner of dmlc's framing."""

from __future__ import annotations

import random

from rectool.reader import MAGIC_BYTES

M = MAGIC_BYTES


def raw_payload_cases():
    """Return (name, payload) pairs for raw RecordIO records (no image header)."""
    rng = random.Random(1234)
    big = bytearray(rng.randbytes(5 * 1024 * 1024 + 3))
    for pos in (0, 4096, 4100, 1_000_000, 1_000_001, len(big) - 7):
        big[pos : pos + 4] = M
    cases = [
        ("empty", b""),
        ("magic only", M),
        ("magic at 0", M + b"tail bytes"),
        ("magic in the middle", b"abcd" * 3 + M + b"efgh" * 2 + b"x"),
        ("magic twice in a row", b"abcd" + M + M + b"ef"),
        ("magic three times from 0", M + M + M),
        ("magic as last aligned word", b"abcdefgh" + M),
        ("magic as last aligned word, then 2 bytes", b"abcdefgh" + M + b"yz"),
        ("magic unaligned by 1", b"a" + M + b"bcd"),
        ("magic unaligned by 2", b"ab" + M + b"cd" * 5),
        ("magic unaligned by 3, then aligned", b"abc" + M + b"d" + M),
        ("magic straddling the end", b"abcd" + M[:2]),
        ("several MB with magics", bytes(big)),
    ]
    cases += [(f"length {n}", rng.randbytes(n)) for n in range(1, 13)]
    return cases


def image_record_cases():
    """Return (key, label, id, id2, image) tuples for MXNet image records."""
    rng = random.Random(99)
    return [
        (0, 3.0, 0, 0, b"\xff\xd8jpeg-ish" + rng.randbytes(50)),
        (1, 0.0, 1, 0, b""),
        (2, 16777216.0, 2, 7, M + b"image starting with magic"),
        (5, [1.0, 2.5, -3.0], 5, 0, b"multi" + M + b"label"),
        (7, [42.0], 7, 123456789012, rng.randbytes(4097)),
        (9, [0.5, 1.5], 2**40, 2**63 - 1, b""),
        (10, 7.25, 10, 0, bytes(big_image(rng))),
    ]


def big_image(rng):
    data = bytearray(rng.randbytes(3 * 1024 * 1024 + 1))
    data[8:12] = M
    data[9000:9004] = M
    return data
