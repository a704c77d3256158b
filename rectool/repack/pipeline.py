"""`rectool repack`: packs in, a pack out: merged, filtered, relabelled, reordered, converted.

A repack runs in two steps. Planning reads only the sources' indexes and record headers (and,
for `--dedupe` / `--drop-overlap`, digests of the images) into a few numpy arrays, one entry
per record, and decides everything: which records are kept, their new labels and keys, and
the order they are written in. Every error about the sources or options is raised there,
before a byte is written. Writing then copies the kept records from the mmapped sources in
large batches (`copier.py`): the payload bytes are copied unchanged and the header words that
change (label, key) are patched with numpy; only a record whose framing must change (a split
record, or a new header word equal to the dmlc magic) is framed again by
`writer.frame_record`. With a transform, images are re-encoded by worker threads and written
in plan order.

The output is a pack like `rectool pack` writes: shards through `shards.ShardWriter`, the
failures file, the state file for `--resume`, the manifest last.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from ..build.images import (
    DEFAULT_MAX_PIXELS,
    ImageRefused,
    Transform,
    reencode_image,
)
from ..build.layout import image_size, layout_named
from ..build.listfile import LABEL_MAP_SUFFIX, read_label_map
from ..build.manifest import (
    FAILURES_SUFFIX,
    PARTIAL_SUFFIX,
    RELABEL_SUFFIX,
    REPORT_SUFFIX,
    STATE_SUFFIX,
    build_manifest,
    finish_interrupted,
    is_complete,
    manifest_path,
    output_files,
    prepare_outputs,
    remove_stale_temporaries,
    replace_beside,
)

# Pack's output conventions and its --resume/--overwrite rules, reused as they are.
from ..build.packing import allowed_failures
from ..build.shards import ShardWriter
from ..doors.inputs import open_input
from ..doors.output import (
    OutputLock,
    make_folders,
    open_existing,
    remove,
    rename,
    stage_file,
    write_atomic,
    write_json_atomic,
)
from ..errors import InputError, RectoolError, UsageError
from ..format.digest import sha256_file
from ..format.keys import FLOAT32_EXACT, refuse_shared_offsets, shared_offsets
from ..format.writer import frame_image_record
from ..reader import (
    RecordFile,
    open_dataset,
    read_manifest,
    unpack_header,
)
from ..remote.mirror import local_source
from . import selection
from .copier import RELEASE_BYTES, RecordCopier
from .evalsets import is_eval_set, read_eval_set

LABELS_BY = ("offset", "name")
# Records are copied this many at a time (see `copier.RecordCopier`).
BATCH_RECORDS = 8192
REENCODE_CHUNK = 32
# Cross-identity duplicate groups listed in the report (all are counted).
REPORT_GROUPS = 1000


@dataclass(frozen=True)
class RepackOptions:
    """How to repack; every field but `workers` and `max_failures` can change the bytes."""

    labels_by: str = "offset"  # offset: source after source; name: unified by identity name
    keep_ids: str | None = None  # a file of names or labels, one a line
    drop_ids: str | None = None
    min_per_id: int | None = None
    max_per_id: int | None = None
    pick: str = "first"  # which images --max-per-id keeps: first | random
    sample: float | None = None  # fraction kept, of identities or images
    sample_by: str = "identities"
    seed: int = 0
    keep_labels: bool = False
    order: str = "identity"
    layout: str = "images"
    shard_bytes: int | None = None
    shard_records: int | None = None
    dedupe: bool = False
    drop_overlap: tuple = ()  # datasets or verification sets (.bin) whose images are removed
    transform: Transform | None = None
    # What is refused when copying: "structure" (as pack: empty, truncated, not an image) or
    # "none" (every record carried as it is).
    check: str = "structure"
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_failures: int = 0
    max_pixels: int = DEFAULT_MAX_PIXELS  # re-encoding: larger images refused before decoding
    # The manifest gives each file's SHA-256 beside its xxh3-128 (.rec/.idx bytes unchanged).
    sha256: bool = False

    def byte_options(self):
        """Return the options that determine the output bytes (compared on --resume)."""
        doc = asdict(self)
        for name in ("workers", "max_failures", "max_pixels", "sha256"):  # safety, not bytes
            doc.pop(name)
        doc["drop_overlap"] = [os.path.abspath(p) for p in self.drop_overlap]
        for name in ("keep_ids", "drop_ids"):
            if doc[name]:
                doc[name] = _file_digest(doc[name])
        return doc


@dataclass
class RepackResult:
    """What `repack` did."""

    manifest_path: str
    manifest: dict
    images: int
    classes: int
    failures: int  # images not written: removed duplicates/overlap, refused re-encodes
    failures_path: str
    report_path: str
    report: dict
    resumed_from: int = 0

    @property
    def accepted(self):
        """Return True when no more images were refused than `max_failures` allows.

        Only re-encoding refuses images; removals asked for (--dedupe, --drop-overlap) are
        not refusals.
        """
        return self.report["refused"] <= self.manifest["options"]["max_failures"]

    def to_json(self):
        """Return what `rectool repack --json` prints."""
        totals = self.manifest["totals"]
        return {
            "manifest": self.manifest_path,
            "shards": [
                os.path.join(os.path.dirname(self.manifest_path), s["rec"])
                for s in self.manifest["shards"]
            ],
            "images": self.images,
            "classes": self.classes,
            "records": totals["records"],
            "rec_bytes": totals["rec_bytes"],
            "steps": self.report["steps"],
            "removed": self.report["removed"],
            "refused": self.report["refused"],
            "shared_across_identities": self.report["shared_across_identities"]["groups"],
            "failures_file": self.failures_path,
            "report": self.report_path,
            "accepted": self.accepted,
            "resumed_from": self.resumed_from,
        }


# -- sources ------------------------------------------------------------------------------------


class _Source:
    """One opened source: its dataset, the shard of each sample, and its identity names."""

    def __init__(self, spec):
        self.spec = os.fspath(spec)
        try:  # a URL: a local copy, named by its URL (the manifest's sources, refusals)
            self.dataset = open_dataset(local_source(self.spec, check=True))
        except InputError as exc:  # still an unusable input, named as the source
            raise InputError(f"source {self.spec}: {exc}") from None
        except RectoolError as exc:
            raise RectoolError(f"source {self.spec}: {exc}") from None
        self.shard_of = _sample_shards(self.dataset)
        _refuse_shared_offsets(self.dataset, self.shard_of)
        self.labels = _identity_labels(self.dataset, self.spec)
        self.names = _identity_names(self.dataset)
        # The copy reads the same files: a source small enough to stay mapped keeps the
        # mappings its labels were read through, so its pages are faulted in once, not twice.
        self.record_files = _shard_files(self.dataset)
        if self.record_files is None or _rec_bytes(self.dataset) > RELEASE_BYTES:
            self.record_files = None
            self.dataset.close()  # its mappings are touched end to end: let them go

    def fingerprint(self):
        """Return what identifies the source's files (compared on --resume)."""
        files = []
        for rec, idx in self.dataset.shards:
            st_rec, st_idx = os.stat(rec), os.stat(idx)
            files.append([os.path.abspath(rec), st_rec.st_size, st_rec.st_mtime_ns,
                          st_idx.st_size, st_idx.st_mtime_ns])  # fmt: skip
        return files


def _refuse_shared_offsets(dataset, shard_of):
    """Refuse a source whose index names one record under several keys: repack would copy it
    once per key (work bounded by the records that exist, not by the index's lines)."""
    keys, offsets = np.asarray(dataset.keys), np.asarray(dataset.offsets)
    count, number, _ = shared_offsets(keys, offsets, shard_of)
    if count:
        mine = shard_of == number
        refuse_shared_offsets(dataset.shards[number][1], keys[mine], offsets[mine], "repack")


class _PackTarget:
    """A --drop-overlap target that is a dataset: its images are compared, nothing else."""

    def __init__(self, spec):
        self.spec = os.fspath(spec)
        try:
            self.dataset = open_dataset(self.spec)
        except InputError as exc:
            raise InputError(f"--drop-overlap {self.spec}: {exc}") from None
        except RectoolError as exc:
            raise RectoolError(f"--drop-overlap {self.spec}: {exc}") from None

    def digests(self):
        return _dataset_digests(self.dataset)

    def image(self, i):
        return bytes(self.dataset[i][0])

    def where(self, i):
        return f"key {int(self.dataset.keys[i])}"


class _EvalTarget:
    """A --drop-overlap target that is an insightface verification set (`lfw.bin`): images
    without identities, read by `evalsets.read_eval_set` (no pickle code is run)."""

    def __init__(self, spec):
        self.spec = os.fspath(spec)
        self.images = read_eval_set(self.spec).images
        self.dataset = None  # no files a repack could write over: a .bin is no shard name

    def digests(self):
        out = np.zeros((len(self.images), 2), np.uint64)
        for i, image in enumerate(self.images):
            out[i] = _digest(image)
        return out

    def image(self, i):
        return self.images[i]

    def where(self, i):
        return f"image {i} (pair {i // 2})"


def _open_target(spec):
    """Open a --drop-overlap TARGET: a verification set when it is a `.bin` file, else a
    dataset."""
    return _EvalTarget(spec) if is_eval_set(spec) else _PackTarget(spec)


def _rec_bytes(dataset):
    return sum(os.path.getsize(rec) for rec, _ in dataset.shards)


def _shard_files(dataset):
    """Return the dataset's own `reader.RecordFile` of each shard (the mappings it read the
    labels through), or None.

    With `_sample_shards`, the one place that reads `reader.RecordDataset` internals.
    """
    files = getattr(dataset, "_files", None)
    if files is None or len(files) != len(dataset.shards):
        return None
    return list(files)


def _sample_shards(dataset):
    """Return the shard number of every sample (int32), from the dataset's own table.

    Reads `reader.RecordDataset` internals (its per-sample shard table, see `_shard_files`);
    without them, `location(i)` of every sample says the same, slowly.
    """
    table = getattr(dataset, "_sample_shards", None)
    if table is not None:
        return np.asarray(table(), np.int32)
    shard_ids, bounds = getattr(dataset, "_shard_ids", None), getattr(dataset, "_bounds", None)
    if shard_ids is not None:
        return np.asarray(shard_ids, np.int32)
    if bounds is not None:
        return np.repeat(np.arange(len(dataset.shards), dtype=np.int32), np.diff(bounds))
    number = {rec: k for k, (rec, _) in enumerate(dataset.shards)}
    count = len(dataset)
    return np.fromiter((number[dataset.location(i)[0]] for i in range(count)), np.int32, count)


def _identity_labels(dataset, spec):
    """Return every sample's class label as int64, from the record headers."""
    labels = dataset.labels
    if labels.dtype == object:
        raise RectoolError(
            f"source {spec}: records carry labels of different widths; repack needs one class "
            "label per image (the first label of a vector counts)"
        )
    if labels.ndim == 2:
        labels = labels[:, 0]
    bad = (labels < 0) | (labels != np.floor(labels)) | (labels >= FLOAT32_EXACT)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        rec, offset, key = dataset.location(i)
        raise RectoolError(
            f"{rec}: record key {key} at byte {offset}: label {float(labels[i])!r} is not a "
            "class id (a non-negative integer below 2**24); repack groups images by class"
        )
    return labels.astype(np.int64)


def _identity_names(dataset):
    """Return label -> identity name from the manifest or a label map beside the pack, or None."""
    names = (dataset.manifest or {}).get("identities")
    if names:
        return {int(label): name for label, name in names.items()}
    rec = dataset.shards[0][0] if dataset.shards else None
    if rec:
        stem = rec[: -len(".rec")]
        numbered = re.fullmatch(r"(.*)-[0-9]{5}", stem)  # PREFIX-00000.rec: PREFIX's map
        for prefix in (stem, numbered.group(1)) if numbered else (stem,):
            if os.path.exists(prefix + LABEL_MAP_SUFFIX):
                return read_label_map(prefix + LABEL_MAP_SUFFIX)
    return None


@dataclass
class Catalog:
    """Every record of every source, one array entry each (no Python object per record)."""

    source: np.ndarray  # int32: which source
    sample: np.ndarray  # int64: sample index in that source
    label: np.ndarray  # int64: the merged label (offset or by name)
    names: dict | None  # merged label -> identity name
    source_labels: list  # per source: merged label -> its label in that source (arrays)


def build_catalog(sources, labels_by="offset"):
    """Merge the sources' records; return a `Catalog`.

    offset: source k's labels are shifted by the label count of sources 0..k-1 (one past each
    one's largest label). name: identities with the same name share a label; labels are given
    in code-point order of the names, as `rectool list` gives them to folders.
    """
    labels, source_ids, samples = [], [], []
    names = None
    if labels_by == "name":
        missing = [s.spec for s in sources if not s.names]
        if missing:
            raise UsageError(
                f"--labels-by name needs identity names, and {missing[0]} has none (no "
                "manifest identities, no label map beside it); use --labels-by offset"
            )
        everything = sorted({name for s in sources for name in s.names.values()})
        merged = {name: label for label, name in enumerate(everything)}
        names = dict(enumerate(everything))
        for s in sources:
            table = np.full(max(s.names) + 1, -1, np.int64)
            for label, name in s.names.items():
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
        for s in sources:
            labels.append(s.labels + base)
            if named:
                names.update({label + base: name for label, name in s.names.items()})
            width = int(s.labels.max()) + 1 if len(s.labels) else 0
            if s.names:
                width = max(width, max(s.names) + 1)
            base += width
    for k, s in enumerate(sources):
        source_ids.append(np.full(len(s.labels), k, np.int32))
        samples.append(np.arange(len(s.labels), dtype=np.int64))
    label = np.concatenate(labels) if labels else np.empty(0, np.int64)
    source_labels = []
    for merged_l, s in zip(labels, sources):
        present, first = np.unique(s.labels, return_index=True)  # merged = f(source label)
        source_labels.append(dict(zip(merged_l[first].tolist(), present.tolist())))
    return Catalog(np.concatenate(source_ids), np.concatenate(samples), label, names, source_labels)


# -- planning -----------------------------------------------------------------------------------


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
    counts: dict  # what each step kept and removed
    shared_groups: list  # cross-identity duplicate groups (catalog rows), the first ones
    shared_total: int


def reason_of(code):
    """Return the reason a plan removed a record: code 1 duplicate, 2 + t overlap (target t)."""
    return "duplicate" if code == 1 else "overlap"


def plan_repack(sources, catalog, options, targets=()):
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
    removed_rows, removed_reason, removed_other = [], [], []
    shared_groups, shared_total = [], 0
    digests = None
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


def _digest(data):
    return np.frombuffer(hashlib.blake2b(data, digest_size=16).digest(), "<u8")


def _catalog_digests(sources, catalog, mask):
    """Return a 128-bit BLAKE2b digest of the image bytes of every record in `mask`."""
    digests = np.zeros((len(catalog.label), 2), np.uint64)
    for k, s in enumerate(sources):
        rows = np.flatnonzero(mask & (catalog.source == k))
        ds = s.dataset
        for row, i in zip(rows.tolist(), catalog.sample[rows].tolist()):
            digests[row] = _digest(ds[i][0])
        ds.close()
    return digests


def _dataset_digests(dataset):
    out = np.zeros((len(dataset), 2), np.uint64)
    for i in range(len(dataset)):
        out[i] = _digest(dataset[i][0])
    dataset.close()
    return out


def _image(sources, catalog, row):
    return bytes(sources[catalog.source[row]].dataset[int(catalog.sample[row])][0])


def _same_bytes(sources, catalog, a, b):
    # A digest match is checked byte for byte: "identical" means identical.
    return _image(sources, catalog, a) == _image(sources, catalog, b)


def _as_pairs(digests):
    return np.ascontiguousarray(digests).view([("a", "<u8"), ("b", "<u8")]).ravel()


def _overlap(sources, catalog, digests, mask, target):
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


def _shared_groups(digests, labels, mask, shared):
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


def check_plan(plan, options):
    """Refuse, before writing, a plan the output layout cannot hold."""
    layout_named(options.layout).check_keys(len(plan.rows), plan.classes)
    if plan.classes > FLOAT32_EXACT:
        raise RectoolError(
            f"{plan.classes} classes: labels above {FLOAT32_EXACT} are not exact as float32"
        )


def check_repack_options(options):
    """Refuse options that cannot work together."""
    if options.check not in ("structure", "none"):
        raise UsageError(f"unknown --check {options.check!r}: repack checks structure or none")
    layout = layout_named(options.layout)
    if options.labels_by not in LABELS_BY:
        raise UsageError(f"unknown --labels-by {options.labels_by!r}")
    if options.order not in selection.ORDERS:
        raise UsageError(f"unknown order {options.order!r}")
    if layout.numbered and options.order != "identity":
        raise UsageError(
            "--layout insightface stores each identity's images as one key range: "
            "it needs --order identity"
        )
    layout.check_options(options)
    if options.sample is not None and not 0 < options.sample <= 1:
        raise UsageError("--keep-fraction must be a fraction in (0, 1]")
    if options.sample_by not in selection.SAMPLE_UNITS:
        raise UsageError(f"unknown --fraction-of {options.sample_by!r}")
    if options.pick not in selection.PICKS:
        raise UsageError(f"unknown --pick {options.pick!r}")
    if options.keep_ids and options.drop_ids:
        raise UsageError("give --keep-ids or --drop-ids, not both")
    if options.workers < 1:
        raise UsageError("--workers must be at least 1")


# -- writing ------------------------------------------------------------------------------------


def _file_digest(path):
    try:
        return sha256_file(path)
    except RectoolError:
        if not os.path.lexists(path):
            raise RectoolError(f"{path}: identity list not found") from None
        raise


def repack(sources, prefix, options=None, resume=False, overwrite=False, progress=None,
           on_shard_finished=None):  # fmt: skip
    """Repack the records of `sources` (datasets `open_dataset` accepts) into a pack at
    `prefix`; return a `RepackResult`.

    Everything is planned, and every error about the sources or options raised, before a
    file is written. `progress(done, total, refused)` is called as records are written;
    `on_shard_finished(info, paths)` as each shard is finished (`ShardWriter`).
    """
    options = options or RepackOptions()
    check_repack_options(options)
    prefix = os.fspath(prefix)
    if not sources:
        raise UsageError("give at least one SOURCE")
    opened = [_Source(s) for s in sources]
    targets = [_open_target(t) for t in options.drop_overlap]
    _check_not_a_source(prefix, opened + [t for t in targets if t.dataset is not None])
    catalog = build_catalog(opened, options.labels_by)
    plan = plan_repack(opened, catalog, options, targets)
    check_plan(plan, options)
    options = dataclasses.replace(
        options, max_failures=allowed_failures(options.max_failures, len(plan.rows))
    )
    make_folders(os.path.dirname(prefix))
    with OutputLock(prefix):
        finish_interrupted(prefix)
        if resume and is_complete(prefix):
            return _completed_result(prefix)
        if not (overwrite and output_files(prefix)):
            return _repack_into(opened, targets, catalog, plan, prefix, options, resume,
                                overwrite, progress, on_shard_finished)  # fmt: skip
        result = replace_beside(
            prefix,
            lambda staging: _repack_into(
                opened, targets, catalog, plan, staging, options, False, False, progress,
                on_shard_finished,
            ),
        )  # fmt: skip
        return dataclasses.replace(
            result,
            manifest_path=manifest_path(prefix),
            failures_path=prefix + FAILURES_SUFFIX,
            report_path=prefix + REPORT_SUFFIX,
        )


def _repack_into(opened, targets, catalog, plan, prefix, options, resume, overwrite, progress,
                 on_shard_finished=None):  # fmt: skip
    """Write the planned repack at `prefix` (locked, and the final or a staging prefix)."""
    prepare_outputs(prefix, resume, overwrite)
    if not resume:
        for stale in (prefix + RELABEL_SUFFIX, prefix + REPORT_SUFFIX):
            remove(stale)
    state = {
        "command": "repack",
        "sources": [s.fingerprint() for s in opened],
        "options": options.byte_options(),
    }
    state_path = prefix + STATE_SUFFIX
    if resume and os.path.exists(state_path):
        _check_state(state_path, state)
    else:
        write_json_atomic(state_path, state)
    run = _RepackRun(opened, targets, catalog, plan, prefix, options, progress)
    run.writer.on_shard_finished = on_shard_finished
    try:
        run.execute(resume)
    finally:
        run.copier.close()
    return run.finish(state_path)


def _check_state(state_path, state):
    """Refuse to resume a repack that an interrupted run started with other sources or
    options."""
    try:
        with open_input(state_path, "repack state", "utf-8", follow=False) as f:
            saved = json.load(f)
    except (OSError, ValueError, RectoolError) as exc:
        raise RectoolError(
            f"{state_path}: cannot read ({exc}); start again with --overwrite"
        ) from None
    differences = [name for name in state if saved.get(name) != state[name]]
    if differences:
        raise RectoolError(
            f"{state_path}: cannot resume: the interrupted repack used different "
            f"{', '.join(differences)} (start again with --overwrite)"
        )


_SHARD_NAME = re.compile(r"(?:-[0-9]{5})?\.(?:rec|idx)(?:\.rtc)?")


def _check_not_a_source(prefix, sources):
    """Refuse an OUT_PREFIX whose shards would replace a source's (or a target's) files."""
    out = os.path.realpath(prefix)
    for s in sources:
        for path in (p for shard in s.dataset.shards for p in shard):
            real = os.path.realpath(path)
            if real.startswith(out) and _SHARD_NAME.fullmatch(real[len(out) :]):
                raise UsageError(
                    f"OUT_PREFIX {prefix} would write over {path}, a file of source {s.spec}; "
                    "repack to another prefix"
                )


def _completed_result(prefix):
    required = ("classes", "totals.images", "totals.failures", "totals.records",
                "totals.rec_bytes", "options.max_failures")  # fmt: skip
    manifest = read_manifest(manifest_path(prefix), require=required)
    with open_input(prefix + REPORT_SUFFIX, "repack report", "utf-8") as f:
        report = json.load(f)
    totals = manifest["totals"]
    return RepackResult(
        manifest_path(prefix), manifest, totals["images"], manifest["classes"],
        totals["failures"], prefix + FAILURES_SUFFIX, prefix + REPORT_SUFFIX, report,
        totals["images"],
    )  # fmt: skip


class _RepackRun:
    """One execution of a plan: writes the records, then the files that describe them."""

    def __init__(self, sources, targets, catalog, plan, prefix, options, progress):
        self.sources, self.targets, self.catalog, self.plan = sources, targets, catalog, plan
        self.prefix, self.options, self.progress = prefix, options, progress
        self.layout = layout_named(options.layout)
        self.insightface = self.layout.numbered  # images keyed 1..N, identity records after
        self.total = len(plan.rows)
        self.last_shard = None
        if options.shard_records and not options.shard_bytes:
            self.last_shard = max(self.total - 1, 0) // options.shard_records
        elif not options.shard_bytes:
            # One shard: ShardWriter.resume must stop after it (with no last shard it would
            # look at the same finished file again and again).
            self.last_shard = 0
        self.writer = ShardWriter(
            prefix, options.shard_bytes, options.shard_records, last_shard=self.last_shard,
            sha256=options.sha256,
        )  # fmt: skip
        self.copier = RecordCopier(sources, catalog)
        self.failures_partial = prefix + FAILURES_SUFFIX + PARTIAL_SUFFIX
        self.refused = np.zeros(self.total, bool)  # plan positions refused while writing
        self.refused_count = 0  # of them, kept as they come: progress reports it often
        self.images = 0
        self.resumed_from = 0
        self.complete = False

    # -- the failures file ------------------------------------------------------------------
    def _plan_lines(self):
        """Yield the failures-file lines of the records the plan removes, in catalog order."""
        plan = self.plan
        for row, code, other in zip(
            plan.removed_rows.tolist(), plan.removed_reason.tolist(), plan.removed_other.tolist()
        ):
            entry = self._describe(row)
            if code == 1:
                first = self._describe(other)
                detail = f"byte-identical to key {first['key']} of {first['source']}, kept"
            else:
                target = self.targets[code - 2]
                detail = f"byte-identical to {target.where(other)} of {target.spec}"
            entry.update(stage="plan", reason=reason_of(code), detail=detail)
            yield json.dumps(entry, ensure_ascii=False) + "\n"

    def _describe(self, row):
        cat = self.catalog
        s = self.sources[int(cat.source[row])]
        label = int(cat.label[row])
        return {
            "source": s.spec,
            "key": int(s.dataset.keys[int(cat.sample[row])]),
            "label": label,
            "identity": (cat.names or {}).get(label),
        }

    def _open_failures(self, resume):
        """Write the plan's removals, then keep the refusals an interrupted run wrote."""
        kept = b""
        earlier = self.failures_partial
        if not os.path.exists(earlier):  # killed after renaming it, before the manifest
            earlier = self.prefix + FAILURES_SUFFIX
        if resume and os.path.exists(earlier):
            with open_input(earlier, "failures file", follow=False) as f:
                data = f.read()
            lines = data[: data.rfind(b"\n") + 1].splitlines(keepends=True)
            kept = b"".join(line for line in lines if b'"stage": "write"' in line)
            for line in kept.splitlines():
                self.refused[json.loads(line)["position"]] = True
            self.refused_count = int(self.refused.sum())
        lines = (line.encode("utf-8") for line in self._plan_lines())
        staged = stage_file(self.failures_partial, itertools.chain(lines, [kept]))
        rename(staged, self.failures_partial)
        self._fd = open_existing(self.failures_partial)
        self.writer.register(self._fd, self.failures_partial)
        return self._fd

    # -- writing ----------------------------------------------------------------------------
    def execute(self, resume):
        done = 0
        if resume:
            written = self.writer.resume(drop_tail=self.layout.written_after_images)
            if self.insightface and self.writer.finished:
                self.complete = True  # killed after its one file was finished
        fd = self._open_failures(resume)
        try:
            if resume and not self.complete:
                done = written + int(self.refused.sum())
                self.images = written
                self.resumed_from = done
            if not self.complete:
                self._report(done)
                if self.options.transform is None:
                    self._copy(done)
                else:
                    self._reencode(done)
                self._write_identity_records()
            self.writer.close(self.last_shard)
        except BaseException:
            self.writer.abort()
            raise
        finally:
            os.close(fd)

    def _keys(self, positions):
        if self.insightface:
            return np.arange(self.images + 1, self.images + 1 + len(positions), dtype=np.int64)
        return np.arange(positions.start, positions.stop, dtype=np.int64)

    def _copy(self, done):
        """Copy the plan's records from `done` on, refusing those whose image `pack` would
        refuse (`RecordCopier.refusals`), as re-encoding refuses what does not decode."""
        rows, labels = self.plan.rows, self.plan.new_label
        position = done
        while position < self.total:
            win = self.copier.window(rows[position : min(position + BATCH_RECORDS, self.total)])
            new_labels = labels[win.rows]
            bad = (
                self.copier.refusals(win, self.options.max_pixels)
                if self.options.check != "none"
                else {}
            )
            stops = sorted(bad) + [len(win)]
            i = 0
            for stop in stops:
                while i < stop:  # the records before the next refusal, as many as fit
                    keys = self._keys(range(position, position + stop - i))
                    data, starts, count = self.copier.frame(
                        win, i, stop, new_labels[i:stop], keys, self.insightface
                    )
                    positions = range(position, position + count)
                    self.writer.add_run(data, keys[:count], starts, positions)
                    self.images += count
                    position += count
                    i += count
                    self._report(position)
                if stop < len(win):
                    self._refuse(int(win.rows[stop]), position, bad[stop])
                    position += 1
                    i += 1
            self._report(position)

    def _refuse(self, row, position, reason):
        """Write the refusal of catalog `row` at plan `position` to the failures file."""
        entry = self._describe(row)
        entry.update(stage="write", position=position, reason=reason)
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        self.writer.write_after(self._fd, line.encode("utf-8"))
        self.refused_count += not self.refused[position]
        self.refused[position] = True

    def _reencode(self, done):
        rows, labels = self.plan.rows, self.plan.new_label
        transform, max_pixels = self.options.transform, self.options.max_pixels
        copier = self.copier

        def prepare(chunk):
            out = []
            for row in chunk.tolist():
                head, image = copier.read_record(row)
                try:
                    out.append((head, reencode_image(image, transform, max_pixels)))
                except ImageRefused as refusal:
                    out.append((head, refusal))
            return out

        chunks = (
            rows[start : start + REENCODE_CHUNK]
            for start in range(done, self.total, REENCODE_CHUNK)
        )
        position = done
        window = []
        with ThreadPoolExecutor(self.options.workers, thread_name_prefix="rectool-repack") as pool:
            for chunk in chunks:
                window.append((chunk, pool.submit(prepare, chunk)))
                if len(window) >= 4 * self.options.workers:
                    position = self._consume(*window.pop(0), position, labels)
            while window:
                position = self._consume(*window.pop(0), position, labels)

    def _consume(self, chunk, pending, position, labels):
        for row, (head, result) in zip(chunk.tolist(), pending.result()):
            if isinstance(result, ImageRefused):
                self._refuse(row, position, result.reason)
            else:
                label = float(labels[row])
                if head.flag and not self.insightface:
                    value = np.array(head.label, np.float32)
                    value[0] = label
                    label = value
                key = self.images + 1 if self.insightface else position
                framed = frame_image_record(result, label, key, head.id2, f"key {key}")
                self.writer.add(key, framed, position)
                self.images += 1
            position += 1
        self._report(position)
        return position

    def _write_identity_records(self):
        """Write the records that follow the images (insightface: identities and header)."""
        if not self.layout.numbered:
            return
        kept = self.plan.rows[~self.refused]
        counts = np.bincount(self.plan.new_label[kept], minlength=self.plan.classes)
        for key, framed in self.layout.records_after(self.images, counts.tolist()):
            self.writer.add(key, framed)

    def _report(self, done):
        if self.progress is not None:
            self.progress(done, self.total, self.refused_count)

    # -- the files that describe the output -------------------------------------------------
    def finish(self, state_path):
        prefix, plan, options = self.prefix, self.plan, self.options
        images = self.total - int(self.refused.sum())
        refused = int(self.refused.sum())
        failures = len(plan.removed_rows) + refused
        final_failures = prefix + FAILURES_SUFFIX
        rename(self.failures_partial, final_failures)
        names = self._new_names()
        if names:
            write_atomic(prefix + LABEL_MAP_SUFFIX, _label_map_text(names))
        write_atomic(prefix + RELABEL_SUFFIX, self._relabel_text())
        property_note = None
        if self.insightface:
            property_note = self._write_property()
        report = self._report_document(refused, property_note)
        write_json_atomic(prefix + REPORT_SUFFIX, report)
        manifest = build_manifest(
            options, None, prefix, self.writer.finished, images, failures, plan.classes, names,
            None,
        )  # fmt: skip
        manifest["sources"] = [s.spec for s in self.sources]
        remove_stale_temporaries(prefix)
        write_json_atomic(manifest_path(prefix), manifest)
        remove(state_path)
        return RepackResult(
            manifest_path(prefix), manifest, images, plan.classes, failures, final_failures,
            prefix + REPORT_SUFFIX, report, self.resumed_from,
        )  # fmt: skip

    def _new_names(self):
        names = self.catalog.names
        if not names:
            return None
        if self.options.keep_labels:
            return {int(old): names[int(old)] for old in self.plan.old_labels if int(old) in names}
        return {new: names[int(old)] for new, old in enumerate(self.plan.old_labels)
                if int(old) in names}  # fmt: skip

    def _relabel_text(self):
        plan, names = self.plan, self.catalog.names or {}
        lines = ["source\tsource_label\tlabel\tidentity\n"]
        kept = set(plan.old_labels.tolist())
        for s, table in zip(self.sources, self.catalog.source_labels):
            for merged, original in sorted(table.items(), key=lambda kv: kv[1]):
                if self.options.keep_labels:
                    new = merged if merged in kept else None
                else:
                    at = int(np.searchsorted(plan.old_labels, merged))
                    found = at < len(plan.old_labels) and plan.old_labels[at] == merged
                    new = at if found else None
                if new is not None:
                    lines.append(f"{s.spec}\t{original}\t{new}\t{names.get(merged, '')}\n")
        return "".join(lines)

    def _write_property(self):
        """Write `property` (classes,height,width) beside the pack; return where H,W came from."""
        size = None
        note = "no image written: 112x112 assumed"
        if self.total > self.refused.sum():
            with RecordFile(self.prefix + ".rec") as rf:
                # Image key 1 is the first record of the file (identity records follow).
                record = rf.read_at(0)
            _, image = unpack_header(record)
            size = image_size(bytes(image))  # from its header: nothing decoded
            if size is not None:
                size = int(size[0]), int(size[1])
                note = "height and width of image key 1 (the first image), read from its bytes"
        self.layout.write_property(os.path.dirname(self.prefix), self.plan.classes, size)
        return note

    def _report_document(self, refused, property_note):
        plan, cat = self.plan, self.catalog
        per_identity = {}
        for row, code in zip(plan.removed_rows.tolist(), plan.removed_reason.tolist()):
            label = int(cat.label[row])
            name = (cat.names or {}).get(label, str(label))
            entry = per_identity.setdefault(name, {"duplicate": 0, "overlap": 0})
            entry[reason_of(code)] += 1
        groups = [[self._describe(row) for row in group] for group in plan.shared_groups]
        duplicates = int((plan.removed_reason == 1).sum())
        removed = {"duplicate": duplicates, "overlap": len(plan.removed_reason) - duplicates}
        return {
            "sources": [s.spec for s in self.sources],
            "overlap_targets": [t.spec for t in self.targets],
            "steps": plan.counts,
            "images": self.total - refused,
            "classes": plan.classes,
            "removed": removed,
            "refused": refused,
            "removed_per_identity": per_identity,
            "shared_across_identities": {"groups": plan.shared_total, "first_groups": groups},
            "property": property_note,
        }


def _label_map_text(names):
    return "".join(f"{label}\t{name}\n" for label, name in sorted(names.items()))
