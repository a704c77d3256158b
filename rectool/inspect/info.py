"""Describe a dataset: records, identities, images per identity, payload sizes, formats, layout.

The layout is "images" or "insightface", as `reader.insightface_header` decides it for each
shard (a manifest's claim does not override it); `label_vectors` tells whether any image
carries a label vector (header flag > 0) rather than one label.

`dataset_info` reads every record header (with numpy, through the .idx when there is one) and
decodes only a sample of images for their dimensions. Records it cannot read are described
under `damage` (the rest is still described); `rectool verify` is the command that checks
every byte.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from ..errors import RecordFormatError, RectoolError
from ..format.keys import last_line_wins
from ..reader import (
    DEFAULT_MAX_PIXELS,
    MANIFEST_SUFFIX,
    ImageTooLargeError,
    RecordFile,
    dataset_cache_path,
    imdecode,
    read_dataset_cache,
    read_index_cache,
    unpack_header,
)
from ..format.textindex import load_index
from ..dataset.sources import resolve_source
from .scan import (
    image_formats,
    insightface_ranges,
    locate_records,
    mapped,
    read_headers,
    scan_framing,
)

if TYPE_CHECKING:
    from _typeshed import StrPath

# A record that cannot be read: (key or None, byte offset, reason).
Damaged = tuple[int | None, int, str]

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
) -> DatasetInfo:
    """Return a `DatasetInfo` describing the dataset at `target` (manifest, prefix, .rec or
    folder).

    `sample` images, spread evenly over the dataset, are decoded for their dimensions (those
    whose header declares more than `max_pixels` pixels are counted as "too large", not
    decoded; those that do not decode as "undecodable").
    `on_shard(rec, facts)`, when given, sees each shard's facts as they are read: a dict whose
    `labels`, `sizes` (image bytes) and `offsets` (record starts) arrays describe its images.
    Records that cannot be read (bad framing, an index offset that starts no record) are left
    out of the figures; they and empty images (still counted as images, as `verify` counts
    them) are described under `damage` (None when there is none):
    how many, the first `DAMAGE_LISTED` with file, key and offset, and what to run.
    Raises `RectoolError` when the target cannot be read at all.
    """
    manifest, manifest_path, shards = resolve_source(target)
    identities_map = (manifest or {}).get("identities")
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
        shard = _read_shard(rec, idx)
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
    info.update(_identity_stats(all_labels, identities_map, insightface_classes, manifest))
    info["image_bytes"] = _summary(all_sizes)
    info["encodings"] = dict(formats.most_common())
    info["dimensions"] = _sample_dimensions(images_by_shard, sample, max_pixels)
    info["damage"] = _damage_summary(os.fspath(target), damage)
    info["index_cache"] = index_cache_state(manifest_path, shards)
    return DatasetInfo(info)


def index_cache_state(manifest_path: str | None, shards: list[tuple[str, str]]) -> dict[str, Any]:
    """Return which index caches a reader would map: {"pack": the path of the pack's one cache
    of all its shards, or None when it has none current; "shards_cached": how many shards have
    a current cache of their own; "shards": how many shards}."""
    idx_paths = [idx for _, idx in shards]
    pack = None
    if len(shards) > 1 and (manifest_path or "").endswith(MANIFEST_SUFFIX):
        assert manifest_path is not None
        try:
            if read_dataset_cache(manifest_path, idx_paths) is not None:
                pack = dataset_cache_path(manifest_path)
        except RectoolError:  # a missing .idx: described elsewhere
            pass
    cached = 0
    for idx in idx_paths:
        try:
            cached += read_index_cache(idx) is not None
        except RectoolError:
            pass
    return {"pack": pack, "shards_cached": cached, "shards": len(shards)}


def _read_shard(rec: str, idx: str) -> dict[str, Any]:
    damage: list[Damaged] = []  # each record that cannot be read
    with mapped(rec) as (buf, size), RecordFile(rec) as records:
        if os.path.exists(idx):
            keys, offsets = load_index(idx)
            if not len(keys) and size:  # not "0 records": the index is lost, not the data
                held = len(scan_framing(buf, size).starts)
                raise RectoolError(
                    f"{idx}: empty, but {os.path.basename(rec)} holds {held} records; "
                    f"rebuild it with `rectool reindex {rec} --overwrite`"
                )
            keys, offsets = last_line_wins(keys, offsets)
            bad: list[tuple[int, int, str]] = []
            lengths, split = locate_records(buf, size, offsets, rec, keys, bad=bad)
            if bad:
                damage += [(int(keys[i]), offset, reason) for i, offset, reason in bad]
                keep = np.ones(len(offsets), bool)
                keep[[i for i, _, _ in bad]] = False
                keys, offsets, lengths, split = (a[keep] for a in (keys, offsets, lengths, split))
        else:
            framing = scan_framing(buf, size)
            damage += [(None, d.start, d.reason) for d in framing.damage]
            offsets, lengths, split = framing.starts, framing.lengths, framing.split
            keys = None
        headers = read_headers(buf, size, offsets, lengths, split, records.read_at)
        if keys is None:
            keys = headers.id.astype(np.int64)
        images = headers.complete.copy()
        layout, classes = "images", None
        ranges = insightface_ranges(keys, offsets, headers, records.read_at)
        if ranges is not None:
            layout, classes = "insightface", len(ranges[1])
            images &= (keys >= ranges[0].start) & (keys < ranges[0].stop)
        unreadable = len(damage)  # records not in `offsets`
        # An empty image is still an image (as verify and the reader count it), and damage.
        reason = "empty image: a header and no image bytes"
        empty = np.flatnonzero(images & (headers.image == 0)).tolist()
        damage += [(int(keys[i]), int(offsets[i]), reason) for i in empty]
        rows = np.flatnonzero(images)
        formats = image_formats(buf, size, offsets, headers, split, rows, records.read_at)
        damage.sort(key=lambda d: d[1])
        return {
            "records": len(offsets) + unreadable,
            "readable": len(offsets),
            "rec_bytes": size,
            "layout": layout,
            "label_vectors": bool((headers.flag[images] > 0).any()),
            "classes": classes,
            "labels": headers.label0[rows],
            "sizes": headers.image[rows],
            "formats": Counter(
                {"unknown" if f is None else f: n for f, n in Counter(formats).items()}
            ),
            "flags": _counts(headers.flag[rows]),
            "offsets": offsets[rows],
            "damage": damage,
        }


def _counts(values: np.ndarray) -> Counter:
    """Return a Counter of an array's values, counted by numpy (no object per record)."""
    found, counts = np.unique(values, return_counts=True)
    return Counter(dict(zip(found.tolist(), counts.tolist())))


def _damage_summary(
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


def _identity_stats(
    labels: np.ndarray,
    identities_map: dict[str, str] | None,
    insightface_classes: int | None,
    manifest: dict[str, Any] | None,
) -> dict[str, Any]:
    finite = labels[np.isfinite(labels)]
    integral = bool(len(finite) == len(labels) and (finite == np.round(finite)).all())
    out: dict[str, Any] = {"labels_integral": integral}
    if not integral or not len(labels):
        out["identities"] = None if not integral else 0
        out["images_per_identity"] = None
        return out
    values, counts = np.unique(labels.astype(np.int64), return_counts=True)
    out["identities"] = int(len(values))
    classes = (manifest or {}).get("classes") or insightface_classes
    out["classes"] = classes
    if classes is not None:
        # Identities with no image at all count as 0 in the statistics.
        out["identities_without_images"] = int(classes - len(values[values < classes]))
    out["named_identities"] = len(identities_map) if identities_map else None
    summary = _summary(counts)
    assert summary is not None  # labels is not empty here
    out["images_per_identity"] = {
        **summary,
        "histogram": _histogram(counts),
    }
    return out


def _summary(values: np.ndarray) -> dict[str, Any] | None:
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
    images_by_shard: list[tuple[str, np.ndarray]], sample: int, max_pixels: float
) -> dict[str, Any]:
    """Decode up to `sample` images spread evenly; count their height x width x channels."""
    total = sum(len(offsets) for _, offsets in images_by_shard)
    if not total or sample <= 0:
        return _dimension_summary(0, Counter(), [])
    picks = np.unique(np.linspace(0, total - 1, min(sample, total)).astype(np.int64))
    bounds = np.cumsum([len(offsets) for _, offsets in images_by_shard])
    dims: Counter[str] = Counter()
    shapes: list[tuple[int, int]] = []
    handles: dict[str, RecordFile] = {}
    try:
        for i in picks.tolist():
            shard = int(np.searchsorted(bounds, i, side="right"))
            rec, offsets = images_by_shard[shard]
            offset = int(offsets[i - (bounds[shard - 1] if shard else 0)])
            if rec not in handles:
                handles[rec] = RecordFile(rec)
            _, image = unpack_header(handles[rec].read_at(offset), rec, offset)
            if not len(image):  # listed under `damage`
                dims["undecodable"] += 1
                continue
            try:
                array = imdecode(image, cv2.IMREAD_UNCHANGED, max_pixels)
            except ImageTooLargeError:
                dims["too large"] += 1
                continue
            except RecordFormatError:
                dims["undecodable"] += 1
                continue
            channels = 1 if array.ndim == 2 else array.shape[2]
            dims[f"{array.shape[0]}x{array.shape[1]}x{channels}"] += 1
            shapes.append(array.shape[:2])
    finally:
        for handle in handles.values():
            handle.close()
    return _dimension_summary(len(picks), dims, shapes)


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
