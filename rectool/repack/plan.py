"""Planning a repack: the sources merged into one `Catalog`, then the `Plan` of what is written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import RectoolError, UsageError
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
    """Every record of every source, one array entry each (no Python object per record)."""

    source: np.ndarray  # int32: which source
    sample: np.ndarray  # int64: sample index in that source
    label: np.ndarray  # int64: the merged label (offset or by name)
    names: dict[int, str] | None  # merged label -> identity name
    source_labels: list[dict[int, int]]  # per source: merged label -> its label in that source
    # --labels-by offset: names that several sources give to identities kept apart, each then
    # named `K-NAME` after its source K (1, 2, ... as given), so no two labels share a name.
    kept_apart: list[str] = field(default_factory=list)


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
    source_ids: list[np.ndarray] = []
    samples: list[np.ndarray] = []
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
            table = np.full(max(s.names) + 1, -1, np.int64)  # type: ignore[arg-type]
            for label, name in s.names.items():  # type: ignore[union-attr]
                table[label] = merged[name]
            inside = np.minimum(s.labels, len(table) - 1)
            unnamed = s.labels[(s.labels >= len(table)) | (table[inside] < 0)]
            if len(unnamed):
                raise RectoolError(
                    f"source {s.spec}: label {int(unnamed[0])} has no identity name; "
                    "use --labels-by offset"
                )
            labels.append(table[s.labels])
    else:
        base = 0
        named = all(s.names for s in sources)
        names = {} if named else None
        # The ignores below: when `named`, every source has names.
        if named:
            clashing = _shared_names([s.names for s in sources])  # type: ignore[misc]
        for k, s in enumerate(sources, start=1):
            labels.append(s.labels + base)
            if named:  # `names` is a dict, and every source has names
                renamed = {
                    label + base: f"{k}-{name}" if name in clashing else name
                    for label, name in s.names.items()  # type: ignore[union-attr]
                }
                names.update(renamed)  # type: ignore[union-attr]
            width = int(s.labels.max()) + 1 if len(s.labels) else 0
            if s.names:
                width = max(width, max(s.names) + 1)
            base += width
    for k, s in enumerate(sources):
        source_ids.append(np.full(len(s.labels), k, np.int32))
        samples.append(np.arange(len(s.labels), dtype=np.int64))
    label = np.concatenate(labels) if labels else np.empty(0, np.int64)
    source_labels: list[dict[int, int]] = []
    for merged_l, s in zip(labels, sources):
        present, first = np.unique(s.labels, return_index=True)  # merged = f(source label)
        source_labels.append(dict(zip(merged_l[first].tolist(), present.tolist())))
    if labels_by != "name" and names:
        _refuse_repeated_names(names, sources)
    return Catalog(
        np.concatenate(source_ids),
        np.concatenate(samples),
        label,
        names,
        source_labels,
        sorted(clashing),
    )


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

    rows: np.ndarray  # int64, catalog rows in write order
    new_label: np.ndarray  # int64, per catalog row (-1 when not kept)
    old_labels: np.ndarray  # merged labels in new-label order
    classes: int
    removed_rows: np.ndarray  # catalog rows removed as duplicates or overlap, in row order
    removed_reason: np.ndarray  # int16 code per removed row (see `reason_of`)
    removed_other: np.ndarray  # the catalog row / target sample each one repeats
    counts: dict[str, int]  # what each step kept and removed
    shared_groups: list[list[int]]  # cross-identity duplicate groups (catalog rows), the first ones
    shared_total: int


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
    new_label, old_labels = selection.relabel(labels, mask, options.keep_labels)
    classes = int(new_label[mask].max()) + 1 if mask.any() else 0
    rows = selection.output_order(new_label, mask, options.order, options.seed)
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
    for k in selection.distinct(catalog.source[plan.rows]).tolist():
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
