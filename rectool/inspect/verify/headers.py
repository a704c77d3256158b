"""The header check: every image header fits its record, labels are class ids, images are
images."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ...reader import IMAGE_HEADER_SIZE
from .columns import flatnonzero_chunked
from .facts import ShardFacts
from .report import Found, ProblemAt


def check_headers(facts: ShardFacts) -> Iterator[Found]:
    """Every image header fits its record; labels are integral class ids; images are images."""
    h, starts, rec, keys = facts.headers, facts.framing.starts, facts.rec, facts.keys
    lengths, n = facts.framing.lengths, len(facts.framing.starts)
    incomplete = flatnonzero_chunked(n, lambda lo, hi: ~h.complete[lo:hi])

    def incomplete_problems() -> Iterator[ProblemAt]:
        for j in incomplete.tolist():
            n = int(lengths[j])
            if n < IMAGE_HEADER_SIZE:
                why = f"the record of {n} bytes is shorter than the 24-byte image header"
            else:
                why = (
                    f"the header announces {h.flag[j]} float32 labels but only "
                    f"{n - IMAGE_HEADER_SIZE} bytes follow it"
                )
            yield rec, keys[j], starts[j], why

    yield Found("bad-header", len(incomplete), incomplete_problems())

    sound = facts.sound
    odd = flatnonzero_chunked(n, lambda lo, hi: h.complete[lo:hi] & ~sound[lo:hi])

    def odd_problems() -> Iterator[ProblemAt]:
        for j in odd.tolist():
            header = facts.header(j)
            assert header is not None  # a complete header
            yield (
                rec,
                keys[j],
                starts[j],
                f"flag {h.flag[j]} announces labels after the header, but the header's own "
                f"label is {float(header.label)!r} instead of 0.0",
            )

    yield Found("bad-header", len(odd), odd_problems())
    yield _check_labels(facts)

    def empty_images(lo: int, hi: int) -> np.ndarray:
        images = facts.layout.images[lo:hi] & sound[lo:hi]
        return images & (h.image_of(slice(lo, hi)) == 0)

    empty = flatnonzero_chunked(n, empty_images)
    yield Found(
        "empty-image",
        len(empty),
        ((rec, keys[j], starts[j], "no image bytes after the header") for j in empty.tolist()),
    )
    split, buf, bad = facts.framing.split, facts.buf, facts.unknown_signature

    def signature_problems() -> Iterator[ProblemAt]:
        for j in bad.tolist():
            at = int(starts[j]) + 8 + IMAGE_HEADER_SIZE + 4 * int(h.flag[j])
            first = bytes(buf[at : at + min(8, int(h.image_of(j)))])
            where = "" if not split[j] else " (split record)"
            yield (
                rec,
                keys[j],
                starts[j],
                f"image bytes{where} start with {first.hex(' ')}: no known image signature",
            )

    yield Found("not-an-image", len(bad), signature_problems())


def _check_labels(facts: ShardFacts) -> Found:
    """Every image record's (sound header's) label is a class id."""
    label, classes = facts.headers.label0, facts.layout.classes

    def bad_labels(lo: int, hi: int) -> np.ndarray:
        images = facts.layout.images[lo:hi] & facts.sound[lo:hi]
        part = label[lo:hi]
        with np.errstate(invalid="ignore"):
            bad = images & ~np.isfinite(part)
            known = images & np.isfinite(part)
            if classes is not None:
                bad |= known & ((part != np.round(part)) | (part < 0) | (part >= classes))
        return bad

    bad = flatnonzero_chunked(len(label), bad_labels)

    def problems() -> Iterator[ProblemAt]:
        for j in bad.tolist():
            value = float(label[j])
            if not np.isfinite(value):
                why = f"label {value!r} is not a number"
            elif value != round(value):
                why = f"label {value!r} is not an integral class id"
            else:
                assert classes is not None  # only a known class count bounds labels
                why = f"label {value!r} is outside the {classes} classes 0..{classes - 1}"
            yield facts.rec, facts.keys[j], facts.framing.starts[j], why

    return Found("bad-label", len(bad), problems())
