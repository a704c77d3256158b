"""Describe a dataset: records, identities, images per identity, payload sizes, formats, layout.

A pack with a binary index (format 3) is described from it: counts, labels, the layout and
the identity ranges are mapped from its `.npy` arrays, and the `.rec` is not read, but for the
sample of images decoded for their dimensions (which also give the payload sizes and
encodings described). Any other dataset is described from every record header (read with
numpy, through the .idx when there is one, a bounded window at a time: `inspect.shardfacts`);
the layout is then "images" or "insightface", as `format.headers.insightface_header` decides
it for each shard. `label_vectors` tells whether
images carry a label vector (header flag > 0) rather than one label.

Records it cannot read are described under `damage` (the rest is still described);
`rectool verify` is the command that checks every byte.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from ..dataset.packs import PackDataset
from ..dataset.sources import resolve_source
from ..errors import RecordFormatError, RectoolError
from ..format.binindex import has_binary_index, read_identities
from ..format.headers import unpack_header
from ..format.textindex import load_index
from ..format.window import RecWindow
from ..reader import (
    DEFAULT_MAX_PIXELS,
    ImageTooLargeError,
    decode_image,
    sniff_format,
)
from .shardfacts import OpenRec, PhaseProgress, shard_facts

if TYPE_CHECKING:
    from _typeshed import StrPath


# Histogram of images per identity: (lowest, highest) count of each bin; None is unbounded.
HISTOGRAM_BINS: tuple[tuple[int, int | None], ...] = (
    (1, 1),
    (2, 2),
    (3, 5),
    (6, 10),
    (11, 20),
    (21, 50),
    (51, 100),
    (101, 200),
    (201, 500),
    (501, 1000),
    (1001, None),
)
DEFAULT_SAMPLE = 200
# Image sizes named one by one in a description; the rest are summarised per side.
COMMON_SIZES = 5
DAMAGE_LISTED = 10  # damaged records named one by one in a description


def _no_progress(phase: str, done: int, total: int | None) -> None:
    pass


class DatasetInfo(dict):
    """A dataset's description: a dict of plain data (as `report` reads it)."""

    def to_json(self) -> dict[str, Any]:
        """Return the description as plain data (what `rectool info --json` prints)."""
        return dict(self)


def dataset_info(
    target: StrPath,
    sample: int = DEFAULT_SAMPLE,
    on_shard: Callable[[str, dict[str, Any]], object] | None = None,
    max_pixels: float = DEFAULT_MAX_PIXELS,
    progress: PhaseProgress | None = None,
    open_rec: OpenRec = RecWindow,
) -> DatasetInfo:
    """Return a `DatasetInfo` describing the dataset at `target` (manifest, prefix, .rec or
    folder).

    `sample` images, spread evenly over the dataset, are decoded for their dimensions (those
    whose header declares more than `max_pixels` pixels are counted as "too large", not
    decoded; those that do not decode as "undecodable"). With a binary index, those are the
    only records read, and the payload sizes and encodings are theirs (`payload_sample` says
    how many; None when every image was read).
    `on_shard(rec, facts)`, when given, sees each shard's facts as every record header is read
    (a dataset without a binary index; with one, it is not called): a dict whose `labels`,
    `sizes` (image bytes) and `offsets` (record starts) arrays describe its images.
    `progress(phase, done, total)`, when given, is called as each phase starts and goes on.
    `open_rec(path)` opens the window a shard's records are read through (`RecWindow`;
    tests inject one that counts the bytes read).
    Records that cannot be read (bad framing, an index offset that starts no record) are left
    out of the figures; they and empty images (still counted as images, as `verify` counts
    them) are described under `damage` (None when there is none):
    how many, the first `DAMAGE_LISTED` with file, key and offset, and what to run.
    Raises `RectoolError` when the target cannot be read at all.
    """
    manifest, manifest_path, shards = resolve_source(target)
    indexed = has_binary_index(manifest)
    if indexed:
        assert manifest is not None and manifest_path is not None  # a manifest names the index
        report = progress or _no_progress
        info = _indexed_info(target, manifest, manifest_path, sample, max_pixels, report, open_rec)
    else:
        info = _headers_info(
            target,
            manifest,
            manifest_path,
            shards,
            sample,
            on_shard,
            max_pixels,
            progress or _no_progress,
            open_rec,
        )
    info["index"] = "binary" if indexed else "text"
    return DatasetInfo(info)


def _indexed_info(
    target: StrPath,
    manifest: dict[str, Any],
    manifest_path: str,
    sample: int,
    max_pixels: float,
    progress: PhaseProgress,
    open_rec: OpenRec,
) -> dict[str, Any]:
    """Describe a pack from its binary index and manifest, reading only the sampled records."""
    ds = PackDataset(manifest_path)
    try:
        progress("labels", 0, len(ds))  # before the one pass over every label
        labels = ds.labels
        first = labels if labels.ndim == 1 else labels[:, 0]
        ranges = ds.identity_ranges
        entries = manifest["shards"]
        records = sum(_records_listed(entry, idx) for entry, (_, idx) in zip(entries, ds.shards))
        width = labels.shape[1] if labels.ndim == 2 else 0
        info: dict[str, Any] = {
            "target": os.fspath(target),
            "manifest": manifest_path,
            "layout": ds.layout,
            "label_vectors": bool(width),
            "shards": len(ds.shards),
            "records": records,
            "images": len(ds),
            "rec_bytes": sum(
                e["rec_bytes"] if e.get("rec_bytes") is not None else os.path.getsize(rec)
                for e, (rec, _) in zip(entries, ds.shards)
            ),
            "label_flags": {str(width): len(ds)} if len(ds) else {},
        }
        classes = None if ranges is None else len(ranges)
        info.update(_identity_stats(first, manifest, manifest_path, classes))
        progress("labels", len(ds), len(ds))
        picks = _picks(len(ds), sample)
        sizes, formats, dims, shapes, damage = _sample_index(
            ds, picks, max_pixels, progress, open_rec
        )
    finally:
        ds.close()
    info["image_bytes"] = value_summary(sizes)
    info["encodings"] = dict(formats.most_common())
    info["payload_sample"] = None if len(picks) == len(ds) else len(picks)
    info["dimensions"] = _dimension_summary(len(picks), dims, shapes)
    info["damage"] = damage_summary(os.fspath(target), damage)
    return info


def _records_listed(entry: dict[str, Any], idx: str) -> int:
    """Return a shard's record count: its manifest entry's, else its .idx lines (not the .rec)."""
    if entry.get("records") is not None:
        return int(entry["records"])
    return len(load_index(idx)[0])


def _picks(total: int, sample: int) -> np.ndarray:
    """Return up to `sample` sample numbers of `total`, spread evenly."""
    if not total or sample <= 0:
        return np.zeros(0, np.int64)
    return np.unique(np.linspace(0, total - 1, min(sample, total)).astype(np.int64))


def _sample_index(
    ds: PackDataset,
    picks: np.ndarray,
    max_pixels: float,
    progress: PhaseProgress,
    open_rec: OpenRec,
) -> tuple[np.ndarray, Counter[str], Counter[str], list[tuple[int, int]], list[Any]]:
    """Read the `picks` samples of an indexed pack, each through its shard's window; return
    (their image sizes, encodings, dimensions counted, (height, width) of each decoded,
    damage)."""
    sizes, formats, dims = [], Counter[str](), Counter[str]()
    shapes: list[tuple[int, int]] = []
    damage: list[tuple[str, int | None, int, str]] = []
    windows: dict[str, RecWindow] = {}
    try:
        for done, i in enumerate(picks.tolist()):
            progress("sample", done, len(picks))
            rec, offset, key = ds.location(i)
            if rec not in windows:
                windows[rec] = open_rec(rec)
            try:
                _, image = unpack_header(windows[rec].record(offset, key), rec, offset, key)
            except RecordFormatError as exc:
                damage.append((rec, key, offset, exc.reason))
                continue
            sizes.append(len(image))
            formats["unknown" if (kind := sniff_format(image)) is None else kind] += 1
            if not len(image):
                damage.append((rec, key, offset, "empty image: a header and no image bytes"))
            _measure(image, max_pixels, dims, shapes)
    finally:
        for window in windows.values():
            window.close()
    progress("sample", len(picks), len(picks))
    return np.array(sizes, np.int64), formats, dims, shapes, damage


def _headers_info(
    target: StrPath,
    manifest: dict[str, Any] | None,
    manifest_path: str | None,
    shards: list[tuple[str, str]],
    sample: int,
    on_shard: Callable[[str, dict[str, Any]], object] | None,
    max_pixels: float,
    progress: PhaseProgress,
    open_rec: OpenRec,
) -> dict[str, Any]:
    """Describe a dataset from every record header."""
    images_by_shard: list[tuple[str, np.ndarray]] = []
    layouts: Counter[str] = Counter()
    label_vectors = False
    labels: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    formats: Counter[str] = Counter()
    flags: Counter[int] = Counter()
    records = readable = rec_bytes = 0
    insightface_classes = None
    damage: list[tuple[str, int | None, int, str]] = []  # (rec, key or None, offset, reason)
    for rec, idx in shards:
        shard = shard_facts(rec, idx, open_rec, progress)
        if on_shard is not None:
            on_shard(rec, shard)
        records += shard["records"]
        readable += shard["readable"]
        rec_bytes += shard["rec_bytes"]
        layouts[shard["layout"]] += 1
        label_vectors |= shard["label_vectors"]
        if shard["classes"] is not None:
            insightface_classes = (insightface_classes or 0) + shard["classes"]
        labels.append(shard["labels"])
        sizes.append(shard["sizes"])
        formats.update(shard["formats"])
        flags.update(shard["flags"])
        images_by_shard.append((rec, shard["offsets"]))
        damage += [(os.fspath(rec), *d) for d in shard["damage"]]
    if damage and not readable:  # nothing at all to describe: not a dataset
        rec, key, offset, reason = damage[0]
        where = "" if key is None else f"key {key}, "
        raise RectoolError(
            f"{rec}, {where}byte offset {offset}: {reason}; no record of {os.fspath(target)} "
            "can be read (run `rectool verify` to list every problem)"
        )
    all_labels = np.concatenate(labels) if labels else np.zeros(0, np.float32)
    all_sizes = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
    info: dict[str, Any] = {
        "target": os.fspath(target),
        "manifest": manifest_path,
        "layout": "/".join(sorted(layouts)) or "empty",
        "label_vectors": label_vectors,
        "shards": len(shards),
        "records": records,
        "images": int(len(all_labels)),
        "rec_bytes": rec_bytes,
        "label_flags": {str(k): v for k, v in sorted(flags.items())},
    }
    info.update(_identity_stats(all_labels, manifest, manifest_path, insightface_classes))
    info["image_bytes"] = value_summary(all_sizes)
    info["encodings"] = dict(formats.most_common())
    info["payload_sample"] = None
    info["dimensions"] = _sample_dimensions(images_by_shard, sample, max_pixels, open_rec)
    info["damage"] = damage_summary(os.fspath(target), damage)
    return info


def damage_summary(
    target: str, damage: list[tuple[str, int | None, int, str]]
) -> dict[str, Any] | None:
    """Describe the records that could not be read: how many, the first few, what to run."""
    if not damage:
        return None
    return {
        "records": len(damage),
        "first": [
            {"file": rec, "key": key, "offset": offset, "reason": reason}
            for rec, key, offset, reason in damage[:DAMAGE_LISTED]
        ],
        "advice": f"run `rectool verify {target}` to list every problem",
    }


def _named_identities(manifest: dict[str, Any] | None, manifest_path: str | None) -> int | None:
    """Return how many identities the pack names (None for none): the count its manifest gives
    the identities file (format 3), else the names read by `read_identities`."""
    named = (manifest or {}).get("identities")
    if manifest is None or manifest_path is None or named is None:
        return None
    if "file" in named and named.get("count") is not None:
        return int(named["count"]) or None
    return len(read_identities(manifest_path, manifest) or {}) or None


def label_counts(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (each distinct label as an int64, ascending; how many images carry it) of
    integral labels. The labels are copied once as integers (4 bytes each where they fit) and
    sorted in place only when they are not in order already (packs write them in order)."""
    if not len(labels):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    small = -(2**31) <= float(labels.min()) and float(labels.max()) < 2**31
    ints = labels.astype(np.int32 if small else np.int64)
    if not bool((ints[1:] >= ints[:-1]).all()):
        ints.sort()
    starts = np.concatenate(([0], np.flatnonzero(ints[1:] != ints[:-1]) + 1))
    values = ints[starts].astype(np.int64)
    return values, np.diff(np.append(starts, len(ints)))


def _identity_stats(
    labels: np.ndarray,
    manifest: dict[str, Any] | None,
    manifest_path: str | None,
    insightface_classes: int | None,
) -> dict[str, Any]:
    # Whole-array checks: a few bytes an image of temporaries, no copy of the finite labels.
    integral = bool(np.isfinite(labels).all()) and bool((labels == np.round(labels)).all())
    out: dict[str, Any] = {"labels_integral": integral}
    if not integral or not len(labels):
        out["identities"] = None if not integral else 0
        out["images_per_identity"] = None
        return out
    values, counts = label_counts(labels)
    out["identities"] = int(len(values))
    classes = (manifest or {}).get("classes") or insightface_classes
    out["classes"] = classes
    if classes is not None:
        # Identities with no image at all count as 0 in the statistics.
        out["identities_without_images"] = int(classes - len(values[values < classes]))
    out["named_identities"] = _named_identities(manifest, manifest_path)
    summary = value_summary(counts)
    assert summary is not None  # labels is not empty here
    out["images_per_identity"] = {
        **summary,
        "histogram": _histogram(counts),
    }
    return out


def value_summary(values: np.ndarray) -> dict[str, Any] | None:
    """Return min, median, mean, max and total of `values` (None when empty)."""
    if not len(values):
        return None
    return {
        "min": int(values.min()),
        "median": float(np.median(values)),
        "mean": round(float(values.mean()), 1),
        "max": int(values.max()),
        "total": int(values.sum()),
    }


def _histogram(counts: np.ndarray) -> list[dict[str, Any]]:
    rows = []
    for low, high in HISTOGRAM_BINS:
        hit = (counts >= low) & (counts <= high) if high is not None else counts >= low
        n = int(hit.sum())
        if n:
            name = str(low) if low == high else f"{low}-{high}" if high else f"{low}+"
            rows.append({"images": name, "identities": n})
    return rows


def _sample_dimensions(
    images_by_shard: list[tuple[str, np.ndarray]],
    sample: int,
    max_pixels: float,
    open_rec: OpenRec,
) -> dict[str, Any]:
    """Decode up to `sample` images spread evenly; count their height x width x channels."""
    total = sum(len(offsets) for _, offsets in images_by_shard)
    picks = _picks(total, sample)
    bounds = np.cumsum([len(offsets) for _, offsets in images_by_shard])
    dims: Counter[str] = Counter()
    shapes: list[tuple[int, int]] = []
    handles: dict[str, RecWindow] = {}
    try:
        for i in picks.tolist():
            shard = int(np.searchsorted(bounds, i, side="right"))
            rec, offsets = images_by_shard[shard]
            offset = int(offsets[i - (bounds[shard - 1] if shard else 0)])
            if rec not in handles:
                handles[rec] = open_rec(rec)
            _, image = unpack_header(handles[rec].record(offset), rec, offset)
            _measure(image, max_pixels, dims, shapes)
    finally:
        for handle in handles.values():
            handle.close()
    return _dimension_summary(len(picks), dims, shapes)


def _measure(
    image: bytes, max_pixels: float, dims: Counter[str], shapes: list[tuple[int, int]]
) -> None:
    """Decode a sampled image; count its HxWxC in `dims` (or why it has none), add its sides
    to `shapes`."""
    if not len(image):  # listed under `damage`
        dims["undecodable"] += 1
        return
    try:
        array = decode_image(image, cv2.IMREAD_UNCHANGED, max_pixels)
    except ImageTooLargeError:
        dims["too large"] += 1
        return
    except RecordFormatError:
        dims["undecodable"] += 1
        return
    channels = 1 if array.ndim == 2 else array.shape[2]
    dims[f"{array.shape[0]}x{array.shape[1]}x{channels}"] += 1
    shapes.append(array.shape[:2])


def _dimension_summary(
    sampled: int, dims: Counter[str], shapes: list[tuple[int, int]]
) -> dict[str, Any]:
    """Describe the sampled sizes: every HxWxC with its count (`counts`, most common first),
    how many differ, the most common few, and min / median / max of each side."""
    counts = dict(dims.most_common())
    decoded = {k: n for k, n in counts.items() if k not in ("undecodable", "too large")}
    heights = np.array([h for h, _ in shapes], np.int64)
    widths = np.array([w for _, w in shapes], np.int64)

    def side(values: np.ndarray) -> dict[str, Any] | None:
        if not len(values):
            return None
        return {
            "min": int(values.min()),
            "median": float(np.median(values)),
            "max": int(values.max()),
        }

    return {
        "sampled": sampled,
        "counts": counts,
        "distinct": len(decoded),
        "most_common": [{"size": k, "images": n} for k, n in list(decoded.items())[:COMMON_SIZES]],
        "height": side(heights),
        "width": side(widths),
        "undecodable": counts.get("undecodable", 0),
        "too_large": counts.get("too large", 0),
    }
