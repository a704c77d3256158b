"""Choose, relabel and order records for `rectool repack`: pure functions over numpy arrays.

Every function takes and returns arrays with one entry per record (or per identity), so the
state of a repack stays a few numpy arrays however many records there are: no Python object
per record. Seeded choices use `numpy.random.default_rng(seed)`, so the same seed always
picks the same records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..doors.inputs import open_input
from ..errors import RectoolError
from ..text import counted

if TYPE_CHECKING:
    from _typeshed import StrPath
    from numpy.typing import ArrayLike

ORDERS = ("identity", "source", "shuffle")
SAMPLE_UNITS = ("identities", "images")
PICKS = ("first", "random")


def _rng(seed: int, purpose: int) -> np.random.Generator:
    # One stream per purpose: adding a filter never changes what another one picks.
    return np.random.default_rng([int(seed), purpose])


def read_id_list(path: StrPath, names: Mapping[int, str] | None) -> np.ndarray:
    """Read identities from a file, one a line (names or labels); return their labels.

    `names` maps label -> identity name (or is None when the sources carry no names). A line
    that is a known name means that identity; otherwise a line of digits is a label. Blank
    lines and lines starting with `#` are skipped. Unknown identities raise `RectoolError`
    naming the file and lines, so nothing is written.
    """
    by_name: dict[str, int] = {}
    if names:
        for label, name in names.items():
            by_name.setdefault(name, label)
    labels: list[int] = []
    unknown: list[str] = []
    try:
        with open_input(path, "identity list", "utf-8", "\n") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as exc:
        raise RectoolError(f"{path}: not UTF-8 text ({exc.reason})") from None
    known_labels = set(names) if names else None
    for number, text in enumerate(lines, start=1):
        text = text.strip()
        if not text or text.startswith("#"):
            continue
        if text in by_name:
            labels.append(by_name[text])
        elif text.isdigit() and (known_labels is None or int(text) in known_labels):
            labels.append(int(text))
        else:
            unknown.append(f"line {number}: {text!r}")
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise RectoolError(
            f"{path}: {counted(len(unknown), 'unknown identity')}: "
            f"{', '.join(unknown[:5])}{more}; give identity names or labels of the sources"
        )
    return np.array(sorted(set(labels)), np.int64)


def distinct(values: ArrayLike) -> np.ndarray:
    """Return the distinct values of an integer array, sorted: `np.unique`'s answer.

    By sorting: numpy 2.4's `np.unique` imports `numpy.ma` on its first call (10-35 ms of a
    repack here) and hashes (20-120 ms for 100k distinct values, a sort about 0.5 ms).
    """
    flat = np.asarray(values).reshape(-1)
    if len(flat) < 2:
        return flat.copy()
    ordered = np.sort(flat)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def check_labels_exist(path: StrPath, wanted: np.ndarray, labels: np.ndarray) -> None:
    """Raise `RectoolError` when a label of `wanted` has no record in `labels`."""
    missing = np.setdiff1d(wanted, distinct(labels))
    if len(missing):
        shown = ", ".join(map(str, missing[:5].tolist()))
        raise RectoolError(
            f"{path}: {len(missing)} label(s) have no images in the sources: {shown}"
            f"{' ...' if len(missing) > 5 else ''}"
        )


def identity_mask(labels: np.ndarray, wanted: np.ndarray, keep: bool) -> np.ndarray:
    """Return a mask keeping (keep=True) or dropping the records whose label is in `wanted`."""
    inside = np.isin(labels, wanted)
    return inside if keep else ~inside


def sample_identities(
    labels: np.ndarray, mask: np.ndarray, fraction: float, seed: int
) -> np.ndarray:
    """Keep a seeded `fraction` of the identities still present (rounded, at least one)."""
    present = distinct(labels[mask])
    count = min(len(present), max(1, round(fraction * len(present)))) if len(present) else 0
    chosen = np.sort(_rng(seed, 1).choice(present, count, replace=False))
    return mask & np.isin(labels, chosen)


def sample_images(mask: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Keep a seeded `fraction` of the records still present (rounded, at least one)."""
    rows = np.flatnonzero(mask)
    count = min(len(rows), max(1, round(fraction * len(rows)))) if len(rows) else 0
    chosen = _rng(seed, 2).choice(rows, count, replace=False)
    out = np.zeros_like(mask)
    out[chosen] = True
    return out


def min_per_identity(labels: np.ndarray, mask: np.ndarray, minimum: int) -> np.ndarray:
    """Drop the identities with fewer than `minimum` records still present."""
    counts = np.bincount(labels[mask], minlength=int(labels.max(initial=-1)) + 1)
    return mask & (counts[labels] >= minimum)


def max_per_identity(
    labels: np.ndarray, mask: np.ndarray, maximum: int, pick: str = "first", seed: int = 0
) -> np.ndarray:
    """Keep at most `maximum` records of each identity: the first ones in record order, or
    a seeded random choice (`pick="random"`)."""
    rows = np.flatnonzero(mask)
    if pick == "random":
        tie = _rng(seed, 3).permutation(len(rows))
    else:
        tie = np.arange(len(rows))
    order = np.lexsort((tie, labels[rows]))  # by label, then the tie-break
    grouped = labels[rows][order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    out = np.zeros_like(mask)
    out[rows[order[rank < maximum]]] = True
    return out


def relabel_table(
    labels: np.ndarray, mask: np.ndarray, keep_labels: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Return (new label per old label, -1 for one with no record in `mask`; the old labels
    in new-label order): new labels 0..C-1 in the order of the old labels still present, so a
    loss sees no gaps (with `keep_labels`, the old labels themselves), as a table a label, not an
    array a record.

    The table has an entry per label up to the largest in `mask`: `table[labels[rows]]` is
    the new labels of `rows`.
    """
    present = distinct(labels[mask])
    size = int(present[-1]) + 1 if len(present) else 0
    table = np.full(size, -1, np.int32)  # a class id is below 2**24
    table[present] = present if keep_labels else np.arange(len(present))
    return table, present


def output_order(labels: np.ndarray, mask: np.ndarray, order: str, seed: int = 0) -> np.ndarray:
    """Return the records to write, as indices in write order.

    identity: grouped by label (ascending), record order within an identity; source: record
    order; shuffle: a seeded permutation of all of them.
    """
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")
    # Every record kept (the common case): its row is its index, and no column of them is
    # made beside the order's own.
    rows = None if mask.all() else np.flatnonzero(mask)
    if order == "identity":
        if rows is None:
            return np.argsort(labels, kind="stable")
        return rows[np.argsort(labels[rows], kind="stable")]
    if order == "source":
        return np.arange(len(mask)) if rows is None else rows
    permutation = _rng(seed, 4).permutation(len(mask) if rows is None else len(rows))
    return permutation if rows is None else rows[permutation]


def duplicate_groups(
    digests: np.ndarray, labels: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Find byte-identical records by digest; return (first copy per record, shared mask).

    `digests` is an (N, 2) uint64 array (a 128-bit digest of each image). `first[i]` is the
    earliest record with the same digest and label as i (i itself for a first copy, -1 for
    records outside `mask`); `shared[i]` is True when a record of another identity has the
    same digest.
    """
    rows = np.flatnonzero(mask)
    first = np.full(len(labels), -1, np.int64)
    shared = np.zeros(len(labels), bool)
    if not len(rows):
        return first, shared
    d0, d1, lab = digests[rows, 0], digests[rows, 1], labels[rows]
    order = np.lexsort((rows, lab, d1, d0))
    sd0, sd1, slab, srows = d0[order], d1[order], lab[order], rows[order]
    same_digest = np.r_[False, (sd0[1:] == sd0[:-1]) & (sd1[1:] == sd1[:-1])]
    same_group = same_digest & np.r_[False, slab[1:] == slab[:-1]]
    group_start = np.maximum.accumulate(np.where(same_group, 0, np.arange(len(order))))
    first[srows] = srows[group_start]
    digest_start = np.maximum.accumulate(np.where(same_digest, 0, np.arange(len(order))))
    digest_end = np.r_[digest_start[1:] != digest_start[:-1], True]
    # An identity differs within a digest run when its first and last label differ.
    last_of_run = np.flatnonzero(digest_end)
    run_of = np.searchsorted(last_of_run, np.arange(len(order)))
    mixed = slab[digest_start] != slab[last_of_run[run_of]]
    shared[srows] = mixed
    return first, shared
