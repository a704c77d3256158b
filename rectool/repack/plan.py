"""Planning a repack: the sources merged into one `Catalog`, then the `Plan` of what is written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import RectoolError, UsageError
from ..format.headers import shard_numbers
from ..format.keys import FLOAT32_EXACT
from ..packer.layout import layout_named
from . import selection
from .sources import image_digest

if TYPE_CHECKING:
    from .options import RepackOptions
    from .sources import Source, Target

# Cross-identity duplicate groups listed in the report (all are counted).
REPORT_GROUPS = 1000


@dataclass
class Catalog:
    """Every record of every source, one array entry each (no Python object per record).

    About 9 bytes a record (`row_dtype`: 4-byte rows below 2**31 records): `label` is the
    source's own array when one source is repacked by offset, `source` costs nothing for one
    source and a byte a record below 256.
    """

    source: np.ndarray  # unsigned: which source (a broadcast of 0 for one source)
    sample: np.ndarray  # `row_dtype`: sample index in that source
    label: np.ndarray  # int32 (int64 past 2**31 labels): the merged label (offset or by name)
    names: dict[int, str] | None  # merged label -> identity name
    # Per source: (its labels that have records, ascending; the merged label of each). A
    # merged label that two of a source's labels share (--labels-by name) is listed once, with
    # the larger of them.
    source_labels: list[tuple[np.ndarray, np.ndarray]]
    # --labels-by offset: names that several sources give to identities kept apart, each then
    # named `K-NAME` after its source K (1, 2, ... as given), so no two labels share a name.
    kept_apart: list[str] = field(default_factory=list)

    def release(self) -> None:
        """Let go of the per-record columns (a run that is written needs them no more)."""
        self.source = self.sample = self.label = np.empty(0, np.int32)


def row_dtype(count: int) -> type[np.signedinteger]:
    """Return the integer type of an array of record numbers below `count`: int32 when they
    fit (half the memory of int64 per record), else int64."""
    return np.int32 if count < 2**31 else np.int64


def build_catalog(sources: Sequence[Source], labels_by: str = "offset") -> Catalog:
    """Merge the sources' records; return a `Catalog`.

    offset: source k's labels are shifted by the label count of sources 0..k-1 (one past each
    one's largest label); identities stay apart, and so do their names: a name that several
    sources use becomes `K-NAME` in each (K: the source's place, from 1; `kept_apart` lists
    them). name: identities with the same name share a label; labels are given in code-point
    order of the names, as `rectool list` gives them to folders.
    """
    clashing: set[str] = set()
    labels: list[np.ndarray] = []
    names: dict[int, str] | None = None
    if labels_by == "name":
        missing = [s.spec for s in sources if not s.names]
        if missing:
            raise UsageError(
                f"--labels-by name needs identity names, and {missing[0]} has none (no "
                "manifest identities, no label map beside it); use --labels-by offset"
            )
        # Below, every source has names (`missing` is empty): the ignores say so.
        everything = sorted({n for s in sources for n in s.names.values()})  # type: ignore[union-attr]
        merged = {name: label for label, name in enumerate(everything)}
        names = dict(enumerate(everything))
        for s in sources:
            table = np.full(max(s.names) + 1, -1, row_dtype(len(everything)))  # type: ignore[arg-type]
            for label, name in s.names.items():  # type: ignore[union-attr]
                table[label] = merged[name]
            inside = np.minimum(s.labels, len(table) - 1)
            unnamed = s.labels[(s.labels >= len(table)) | (table[inside] < 0)]
            if len(unnamed):
                raise RectoolError(
                    f"source {s.spec}: label {int(unnamed[0])} has no identity name; "
                    "use --labels-by offset"
                )
            del inside
            labels.append(table[s.labels])
    else:
        bases = _label_bases(sources)
        kind = row_dtype(bases[-1])
        named = all(s.names for s in sources)
        names = {} if named else None
        # The ignores below: when `named`, every source has names.
        if named:
            clashing = _shared_names([s.names for s in sources])  # type: ignore[misc]
        for k, (s, base) in enumerate(zip(sources, bases), start=1):
            # The first source keeps its own array (shifted by nothing): no copy a record.
            shifted = s.labels.astype(kind, copy=False)
            labels.append(shifted + base if base else shifted)
            if named:  # `names` is a dict, and every source has names
                renamed = {
                    label + base: f"{k}-{name}" if name in clashing else name
                    for label, name in s.names.items()  # type: ignore[union-attr]
                }
                names.update(renamed)  # type: ignore[union-attr]
    counts = [len(s.labels) for s in sources]
    total = sum(counts)
    starts = np.cumsum([0, *counts[:-1]])
    sample = np.arange(total, dtype=row_dtype(total))
    if len(sources) > 1:  # each source's samples from 0
        sample -= np.repeat(starts, counts).astype(sample.dtype)
    label = labels[0] if len(labels) == 1 else np.concatenate(labels)
    source_labels = [_label_pairs(s.labels, merged_l) for merged_l, s in zip(labels, sources)]
    del labels
    if labels_by != "name" and names:
        _refuse_repeated_names(names, sources)
    return Catalog(
        shard_numbers(counts) if sources else np.empty(0, np.uint8),
        sample,
        label,
        names,
        source_labels,
        sorted(clashing),
    )


def _label_bases(sources: Sequence[Source]) -> list[int]:
    """Return what each source's labels are shifted by (--labels-by offset), then the label
    count of them all: one past each source's largest label or named label."""
    bases = [0]
    for s in sources:
        width = int(s.labels.max()) + 1 if len(s.labels) else 0
        if s.names:
            width = max(width, max(s.names) + 1)
        bases.append(bases[-1] + width)
    return bases


def _label_pairs(own: np.ndarray, merged: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (a source's labels that have records, ascending; the merged label of each),
    a merged label listed once, with the largest of its source labels."""
    present, first = np.unique(own, return_index=True)
    into = merged[first]
    order = np.argsort(into, kind="stable")
    ends = np.ones(len(order), bool)  # (none for a source without records)
    ends[:-1] = into[order][1:] != into[order][:-1]
    last = np.sort(order[ends])
    return present[last], into[last]


def _shared_names(per_source: Sequence[dict[int, str]]) -> set[str]:
    """Return the names that more than one source gives an identity."""
    seen: dict[str, int] = {}
    for names in per_source:
        for name in set(names.values()):
            seen[name] = seen.get(name, 0) + 1
    return {name for name, count in seen.items() if count > 1}


def _refuse_repeated_names(names: dict[int, str], sources: Sequence[Source]) -> None:
    """Raise when two merged labels would still share a name (a source that names two of its
    identities alike, or a `K-NAME` another source already uses): the output would pour two
    identities into one folder of `unpack`, one entry of `--keep-ids`."""
    first: dict[str, int] = {}
    for label, name in sorted(names.items()):
        if name in first:
            raise RectoolError(
                f"labels {first[name]} and {label} of the merged sources "
                f"({', '.join(s.spec for s in sources)}) would both be named {name!r}; "
                "repack keeps identities apart by name: rename one in its source's label map, "
                "or use --labels-by name if they are the same identity"
            )
        first[name] = label


@dataclass
class Plan:
    """What a repack writes: `rows` (catalog indices) in write order, with their new labels."""

    rows: np.ndarray  # `row_dtype`, catalog rows in write order
    # int32 a merged label (not a record: `new_labels` gives a record's): its new label, -1
    # when none of its records is kept.
    new_label: np.ndarray
    old_labels: np.ndarray  # merged labels in new-label order
    classes: int
    removed_rows: np.ndarray  # catalog rows removed as duplicates or overlap, in row order
    removed_reason: np.ndarray  # int16 code per removed row (see `reason_of`)
    removed_other: np.ndarray  # the catalog row / target sample each one repeats
    counts: dict[str, int]  # what each step kept and removed
    shared_groups: list[list[int]]  # cross-identity duplicate groups (catalog rows), the first ones
    shared_total: int

    def new_labels(self, catalog: Catalog, rows: np.ndarray) -> np.ndarray:
        """Return the new labels of catalog `rows` (kept ones)."""
        return self.new_label[catalog.label[rows]]

    def release(self) -> None:
        """Let go of the per-record columns (a run that is written needs them no more)."""
        self.rows = np.empty(0, self.rows.dtype)


def reason_of(code: int) -> str:
    """Return the reason a plan removed a record: code 1 duplicate, 2 + t overlap (target t)."""
    return "duplicate" if code == 1 else "overlap"


def plan_repack(
    sources: Sequence[Source],
    catalog: Catalog,
    options: RepackOptions,
    targets: Sequence[Target] = (),
) -> Plan:
    """Decide which records are written, with what labels and in which order; return a `Plan`.

    The steps run in this order: --keep-ids/--drop-ids, --drop-overlap, --dedupe, --sample,
    --min-per-id, --max-per-id, relabelling, ordering.
    """
    labels = catalog.label
    mask = np.ones(len(labels), bool)
    counts = {"source_images": int(len(labels))}
    for path, keep in ((options.keep_ids, True), (options.drop_ids, False)):
        if path:
            wanted = selection.read_id_list(path, catalog.names)
            if keep and not len(wanted):  # a step that failed upstream: not an empty pack
                raise UsageError(
                    f"{path}: names no identity to keep (empty, or only blank and # lines); "
                    "nothing was written"
                )
            selection.check_labels_exist(path, wanted, labels)
            before = int(mask.sum())
            mask &= selection.identity_mask(labels, wanted, keep)
            counts["keep_ids" if keep else "drop_ids"] = before - int(mask.sum())
    removed_rows: list[np.ndarray] = []
    removed_reason: list[np.ndarray] = []
    removed_other: list[np.ndarray] = []
    shared_groups: list[list[int]] = []
    shared_total = 0
    # Set below whenever it is read (--dedupe, or --drop-overlap targets).
    digests: np.ndarray = None  # type: ignore[assignment]
    if options.dedupe or targets:
        digests = _catalog_digests(sources, catalog, mask)
    for t, target in enumerate(targets):
        rows, matches = _overlap(sources, catalog, digests, mask, target)
        mask[rows] = False
        removed_rows.append(rows)
        removed_reason.append(np.full(len(rows), 2 + t, np.int16))
        removed_other.append(matches)
        counts[f"overlap:{target.spec}"] = len(rows)
    if options.dedupe:
        first, shared = selection.duplicate_groups(digests, labels, mask)
        dup = np.flatnonzero((first >= 0) & (first != np.arange(len(first))))
        dup = dup[[_same_bytes(sources, catalog, i, first[i]) for i in dup.tolist()]]
        mask[dup] = False
        removed_rows.append(dup)
        removed_reason.append(np.full(len(dup), 1, np.int16))
        removed_other.append(first[dup])
        counts["duplicates"] = len(dup)
        shared_groups, shared_total = _shared_groups(digests, labels, mask, shared)
    if options.sample is not None:
        before = int(mask.sum())
        if options.sample_by == "identities":
            mask = selection.sample_identities(labels, mask, options.sample, options.seed)
        else:
            mask = selection.sample_images(mask, options.sample, options.seed)
        counts["sample"] = before - int(mask.sum())
    if options.min_per_id:
        before = int(mask.sum())
        mask = selection.min_per_identity(labels, mask, options.min_per_id)
        counts["min_per_id"] = before - int(mask.sum())
    if options.max_per_id:
        before = int(mask.sum())
        mask = selection.max_per_identity(
            labels, mask, options.max_per_id, options.pick, options.seed
        )
        counts["max_per_id"] = before - int(mask.sum())
    new_label, old_labels = selection.relabel_table(labels, mask, options.keep_labels)
    classes = int(new_label[old_labels].max()) + 1 if len(old_labels) else 0
    # In the order of the merged labels: the same as of the new ones (relabelling keeps it).
    rows = selection.output_order(labels, mask, options.order, options.seed)
    rows = rows.astype(row_dtype(len(labels)), copy=False)
    counts["images"] = len(rows)
    counts["identities"] = len(old_labels)
    removed = np.concatenate(removed_rows) if removed_rows else np.empty(0, np.int64)
    order = np.argsort(removed, kind="stable")
    return Plan(
        rows,
        new_label,
        old_labels,
        classes,
        removed[order],
        (np.concatenate(removed_reason) if removed_rows else np.empty(0, np.int16))[order],
        (np.concatenate(removed_other) if removed_rows else np.empty(0, np.int64))[order],
        counts,
        shared_groups,
        shared_total,
    )


def _catalog_digests(sources: Sequence[Source], catalog: Catalog, mask: np.ndarray) -> np.ndarray:
    """Return a 128-bit BLAKE2b digest of the image bytes of every record in `mask`."""
    digests = np.zeros((len(catalog.label), 2), np.uint64)
    for k, s in enumerate(sources):
        rows = np.flatnonzero(mask & (catalog.source == k))
        ds = s.dataset
        for row, i in zip(rows.tolist(), catalog.sample[rows].tolist()):
            digests[row] = image_digest(ds[i][0])
        ds.close()
    return digests


def _image(sources: Sequence[Source], catalog: Catalog, row: int) -> bytes:
    return bytes(sources[catalog.source[row]].dataset[int(catalog.sample[row])][0])


def _same_bytes(sources: Sequence[Source], catalog: Catalog, a: int, b: int) -> bool:
    # A digest match is checked byte for byte: "identical" means identical.
    return _image(sources, catalog, a) == _image(sources, catalog, b)


def _as_pairs(digests: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(digests).view([("a", "<u8"), ("b", "<u8")]).ravel()


def _overlap(
    sources: Sequence[Source],
    catalog: Catalog,
    digests: np.ndarray,
    mask: np.ndarray,
    target: Target,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (catalog rows in `mask` whose image is byte-identical to one of `target`, and
    the target sample each one equals)."""
    theirs = target.digests()
    pairs = _as_pairs(theirs)
    order = np.argsort(pairs, kind="stable")
    ours = _as_pairs(digests)
    rows = np.flatnonzero(mask)
    at = np.searchsorted(pairs[order], ours[rows])
    at = np.minimum(at, max(len(order) - 1, 0))
    hit = len(order) > 0
    if not hit:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    found = pairs[order][at] == ours[rows]
    rows, matches = rows[found], order[at[found]]
    same = [
        _image(sources, catalog, r) == target.image(int(m))
        for r, m in zip(rows.tolist(), matches.tolist())
    ]
    return rows[same], matches[same]


def _shared_groups(
    digests: np.ndarray, labels: np.ndarray, mask: np.ndarray, shared: np.ndarray
) -> tuple[list[list[int]], int]:
    """Return (the first REPORT_GROUPS groups of kept rows sharing an image across identities,
    the number of such groups)."""
    rows = np.flatnonzero(shared & mask)
    if not len(rows):
        return [], 0
    pairs = _as_pairs(digests)[rows]
    order = np.argsort(pairs, kind="stable")
    rows, pairs = rows[order], pairs[order]
    starts = np.flatnonzero(np.r_[True, pairs[1:] != pairs[:-1]])
    ends = np.r_[starts[1:], len(rows)]
    shown = zip(starts[:REPORT_GROUPS].tolist(), ends[:REPORT_GROUPS].tolist())
    return [rows[a:b].tolist() for a, b in shown], len(starts)


def check_label_widths(
    sources: Sequence[Source], catalog: Catalog, plan: Plan, options: RepackOptions
) -> None:
    """Refuse, before writing, sources whose kept records would be written with labels of
    different widths: a pack's labels have one (its binary index holds one a sample)."""
    pack_label = options.pack_label if layout_named(options.layout).numbered else None
    first: dict[int, int] = {}  # width written (0: a scalar) -> the first source giving it
    if len(sources) == 1:  # no column of source numbers to gather
        used = [0] if len(plan.rows) else []
    else:
        used = selection.distinct(catalog.source[plan.rows]).tolist()
    for k in used:
        width = sources[k].label_width
        if pack_label is not None:  # the shape chosen; a scalar becomes a vector of one
            width = max(width, 1) if pack_label else 0
        first.setdefault(width, k)
    if len(first) > 1:
        (a, wa), (b, wb) = sorted((k, w) for w, k in first.items())[:2]
        raise UsageError(
            f"sources {sources[a].spec} and {sources[b].spec} would be written with labels of "
            f"different widths ({_width_text(wa)} and {_width_text(wb)} an image); a pack's "
            "labels have one width: repack them apart, or write one scalar label an image "
            "(--layout insightface without --pack-label)"
        )


def _width_text(width: int) -> str:
    if width < 2:
        return "a vector of one label" if width else "one scalar label"
    return f"a vector of {width} labels"


def check_plan(plan: Plan, options: RepackOptions) -> None:
    """Refuse, before writing, a plan the output layout cannot hold."""
    layout_named(options.layout).check_keys(len(plan.rows), plan.classes)
    if plan.classes > FLOAT32_EXACT:
        raise RectoolError(
            f"{plan.classes} classes: labels above {FLOAT32_EXACT} are not exact as float32"
        )
