"""The layout check: an insightface layout is whole, and the manifest names the layout found."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from ...doors.inputs import open_input
from ...errors import RectoolError
from ...format.keys import FLOAT32_EXACT
from ...reader import DATASET_LAYOUTS
from .columns import chunks, flatnonzero_chunked
from .facts import ShardFacts
from .report import Found, ProblemAt, one_problem


def check_layout(facts: ShardFacts) -> Iterator[Found]:
    """An insightface layout is whole (record 0, identity ranges, labels, `property` file), and
    the manifest names the layout the records have.

    The layout is the reader's rule's; the manifest's claim does not change it. A manifest
    that says insightface over records whose record 0 is no such header is an
    "insightface-header" problem (they are checked as the images layout, as every reader
    reads them); one that says images over an insightface header is a "manifest" problem.
    """
    layout = facts.layout
    if layout.header is not None:
        yield from _check_insightface(facts)
    manifest = facts.dataset.manifest if facts.entry is not None else None
    claimed = manifest.get("layout") if manifest is not None else None
    if claimed not in DATASET_LAYOUTS or claimed == layout.name:
        return
    if layout.header is None:
        yield _not_a_header(facts)
    else:
        assert facts.dataset.manifest_path is not None  # the manifest's claim
        yield one_problem(
            "manifest",
            facts.dataset.manifest_path,
            None,
            None,
            f"says layout {claimed}, but {facts.rec} has an insightface header record 0",
        )


def _not_a_header(facts: ShardFacts) -> Found:
    """Name what record 0 (and key 1) hold, when a manifest says insightface but they do not."""
    h, keys, starts = facts.headers, facts.keys, facts.framing.starts
    zero, one = np.flatnonzero(keys == 0), np.flatnonzero(keys == 1)
    says = (
        "the manifest says layout insightface, but record 0 is not its header (flag 2, no image "
        "bytes, whole-number labels [N+1, N+1+K], key 1 with one label)"
    )
    if not zero.size:
        return one_problem(
            "insightface-header", facts.rec, None, None, f"{says}: there is no record 0"
        )
    j = int(zero[-1])
    flag = int(h.flag[j])
    if not h.complete[j]:
        held = "a header cut short"
    elif flag == 0:  # (the header's float is its label0)
        held = f"flag 0, {int(h.image_of(j))} image bytes, label {float(h.label0[j])!r}"
    else:
        labels = ", ".join(repr(float(x)) for x in (h.label0[j], h.label1[j])[:flag])
        more = ", ..." if flag > 2 else ""
        held = f"flag {flag}, {int(h.image_of(j))} image bytes, labels [{labels}{more}]"
    if one.size and h.complete[one[-1]]:
        held += f"; key 1 has flag {int(h.flag[one[-1]])}"
    return one_problem("insightface-header", facts.rec, 0, starts[j], f"{says}: it has {held}")


def _check_insightface(facts: ShardFacts) -> Iterator[Found]:
    h, rec, layout = facts.headers, facts.rec, facts.layout
    starts, keys, j = facts.framing.starts, facts.keys, layout.header
    assert j is not None and layout.span is not None  # an insightface layout has both
    a, b = layout.span
    if b > FLOAT32_EXACT:
        yield one_problem(
            "float32-inexact",
            rec,
            0,
            starts[j],
            f"record 0's label [{a}, {b}] needs keys above {FLOAT32_EXACT:,}, "
            "where float32 labels are not exact",
        )
    identities = b - a
    declared = facts.dataset.classes
    if declared is not None and declared != identities:
        assert facts.dataset.manifest_path is not None  # the manifest's class count
        yield one_problem(
            "manifest",
            facts.dataset.manifest_path,
            None,
            None,
            f"says {declared} classes, but record 0 of {rec} announces {identities} identities",
        )
    if b - 1 > len(keys):  # keys announced past the records held: an array of b is not made
        yield from _announced_past_the_records(facts, a, b)
        return
    # The row of each key (-1: none), in 4 bytes a key where the rows fit.
    by_key = np.full(b, -1, np.int32 if len(keys) < 1 << 31 else np.int64)
    for lo_row, hi_row in chunks(len(keys)):  # in file order: later records win
        part = keys[lo_row:hi_row]
        inside = (part >= 0) & (part < b)
        by_key[part[inside]] = lo_row + np.flatnonzero(inside)
    outside = flatnonzero_chunked(
        len(keys), lambda lo_row, hi_row: (keys[lo_row:hi_row] < 0) | (keys[lo_row:hi_row] >= b)
    )
    yield Found(
        "insightface-range",
        len(outside),
        (
            (
                rec,
                keys[i],
                starts[i],
                f"key {keys[i]} is outside the layout's keys 0..{b - 1} that record 0 announces",
            )
            for i in outside.tolist()
        ),
    )
    missing = np.flatnonzero(by_key[1:] < 0) + 1
    yield Found(
        "insightface-range", len(missing), (_missing(rec, k, a, b) for k in missing.tolist())
    )
    ids = by_key[a:]
    not_ranges = _not_ranges(facts, ids[ids >= 0])
    yield not_ranges
    if len(missing) or not_ranges.total:
        return
    lo, hi = h.label0[ids].astype(np.float64), h.label1[ids].astype(np.float64)
    expect_lo = np.concatenate(([1.0], hi[:-1]))
    wrong = (lo != np.round(lo)) | (hi != np.round(hi)) | (lo != expect_lo) | (hi < lo)
    if identities:
        wrong[-1] |= hi[-1] != a
    wrong = np.flatnonzero(wrong)

    def range_problems() -> Iterator[ProblemAt]:
        for i in wrong.tolist():
            if lo[i] != expect_lo[i]:
                after = "the first image, 1" if i == 0 else f"{hi[i - 1]:g}"
                why = f"starts at {lo[i]:g} instead of {after}"
            elif hi[i] < lo[i]:
                why = "ends before it starts"
            elif lo[i] != round(lo[i]) or hi[i] != round(hi[i]):
                why = "is not a range of integral keys"
            else:
                why = f"is the last range and should end at {a}, after the last image"
            yield rec, a + i, starts[ids[i]], f"identity range [{lo[i]:g}, {hi[i]:g}) {why}"

    yield Found("insightface-range", len(wrong), range_problems())
    if wrong.size:
        return
    image_rows = by_key[1:a]

    def owners(first: int, end: int) -> np.ndarray:
        """The identity whose range holds each image key first+1..end (the ranges follow
        each other from key 1 to key a: the last that starts at or before it)."""
        return np.searchsorted(lo, np.arange(first + 1, end + 1), "right") - 1

    def mislabelled(first: int, end: int) -> np.ndarray:
        rows = image_rows[first:end]
        with np.errstate(invalid="ignore"):
            return h.complete[rows] & (h.label0[rows] != owners(first, end))

    mismatch = flatnonzero_chunked(len(image_rows), mislabelled)

    def label_problems() -> Iterator[ProblemAt]:
        for i in mismatch.tolist():
            owner = int(owners(i, i + 1)[0])
            yield (
                rec,
                i + 1,
                starts[image_rows[i]],
                f"label {float(h.label0[image_rows[i]])!r}, but the key lies in the range of "
                f"identity {owner} (key {a + owner})",
            )

    yield Found("insightface-label", len(mismatch), label_problems())
    yield from _check_property(facts, identities)


def _missing(rec: str, k: int, a: int, b: int) -> ProblemAt:
    """The problem of key `k` missing from keys 0..b-1 (images 1..a-1, identities a..b-1)."""
    what = f"image key {k} (of 1..{a - 1})" if k < a else f"identity key {k} (of {a}..{b - 1})"
    return rec, k, None, f"{what} is missing; record 0 announces it"


def _not_ranges(facts: ShardFacts, rows: np.ndarray) -> Found:
    """The identity records (at `rows`) that are no [start, end) label pair."""
    h, keys, starts = facts.headers, facts.keys, facts.framing.starts
    bad = rows[~(h.complete[rows] & (h.flag[rows] == 2))]
    return Found(
        "insightface-range",
        len(bad),
        (
            (
                facts.rec,
                keys[i],
                starts[i],
                f"identity record has flag {h.flag[i]}, expected 2 (a [start, end) label pair)",
            )
            for i in bad.tolist()
        ),
    )


def _announced_past_the_records(facts: ShardFacts, a: int, b: int) -> Iterator[Found]:
    """The missing keys and the identity records that are no ranges, when record 0 announces
    more keys (0..b-1) than the shard holds records: found from the keys present (memory in
    the records, not in the announced count, which a hostile header makes 2**31 or more)."""
    keys = facts.keys
    inside = np.flatnonzero((keys >= 1) & (keys < b))
    # The last row of each key present: in file order, later records win.
    present, first = np.unique(keys[inside][::-1], return_index=True)
    rows = inside[::-1][first]

    def missing() -> Iterator[ProblemAt]:
        expected = 1
        for k in [*present.tolist(), b]:
            for m in range(expected, k):  # read lazily: the report keeps the first few
                yield _missing(facts.rec, m, a, b)
            expected = k + 1

    yield Found("insightface-range", (b - 1) - len(present), missing())
    yield _not_ranges(facts, rows[present >= a])


def _check_property(facts: ShardFacts, identities: int) -> Iterator[Found]:
    path = os.path.join(os.path.dirname(facts.rec), "property")
    try:
        with open_input(path, "property file", "ascii", max_bytes=1 << 16) as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError, RectoolError):
        return
    first = text.split(",")[0]
    if first.strip().isdigit() and int(first) != identities:
        yield one_problem(
            "insightface-header",
            path,
            None,
            None,
            f"says {int(first)} classes, but record 0 announces {identities} identities",
        )
