"""A pack's binary index (format 3): `.npy` arrays written once, when the pack is made.

`index_shards` reads what a pack's shards say (each `.idx`, a few records checked, record 0 of
an insightface `.rec`, the labels in the record headers) into a `PackIndex`; a writer that knows
what it wrote hands that over instead (`Written`, `index_shards(written=)`: the .idx and the
images' headers are then not read back, the few records still checked); `write_index`
writes its arrays beside the shards through the output door and returns the manifest's
`index` entry (each file with its size and xxh3-128); the reader maps them. Every writer of
a manifest goes through here (`packer/manifest.write_manifest`), and so does `rectool index`
for packs made by im2rec, insightface or an older rectool. The identity names of a pack go to
their own file (`write_identities`), read only when asked for (`read_identities`).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..doors.inputs import read_regular
from ..doors.output import write_atomic
from ..reader import (
    InputError,
    RecordFile,
    RecordFormatError,
    RectoolError,
    json_values,
)
from .digest import XXH3_128, Digests
from .headers import (
    check_covered,
    check_shard,
    header_labels,
    insightface_header,
    key_lines,
    shard_numbers,
    unpack_header,
)
from .paths import PackPaths
from .textindex import load_index

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from .headers import Header

MAX_IDENTITIES_BYTES = 1 << 28  # as a manifest (reader.MAX_MANIFEST_BYTES): docs/format.md


@dataclass
class PackIndex:
    """What a reader needs to read a pack's samples by position, as numpy arrays."""

    layout: str
    counts: list[int]  # samples in each shard, in shard order
    offsets: NDArray[np.int64]  # each sample's byte offset in its shard
    keys: NDArray[np.int64]
    labels: NDArray[Any] | None  # float32 (N,) or (N, k); object where widths differ
    identity_ranges: NDArray[np.int64] | None = None  # insightface: [start, end) of samples


@dataclass
class Written:
    """What a writer of a pack knows of the records it wrote, handed to `index_shards` so
    that nothing is read back: each shard's record offsets (in file order, a shard after
    another), every record's key in the same order, and the images' labels in sample order
    when every image holds one scalar label (None: they are read from the headers)."""

    offsets: list[NDArray[np.int64]]
    keys: NDArray[np.int64]
    labels: NDArray[np.float32] | None = None


def index_shards(
    files: list[RecordFile],
    idx_paths: list[str],
    listed: list[Mapping[str, Any]] | None = None,
    layout: str | None = None,
    where: str | None = None,
    labels: bool = True,
    written: Written | None = None,
    unique: bool = False,
    covered: bool = False,
) -> PackIndex:
    """Return the `PackIndex` of a pack's shards (`files`, their `.idx` at `idx_paths`).

    `listed`: the manifest's shard entries, checked against the files; `layout`: "images",
    "insightface" or None (record 0 decides). Samples must run shard by shard. `labels=False`:
    leave the labels (a read of every header) to the caller, as None. `written`: the keys and
    offsets (and maybe labels) the writer wrote, taken instead of each `.idx` (and the
    headers' labels); the same few records are checked. `unique`: refuse a key on two lines
    of the `.idx` files (any record's, the insightface header's and identities' too), where
    MXNet reads its last line and DALI every line; else the last line counts. `covered`:
    refuse a `.rec` holding bytes no record its `.idx` names covers (`check_covered`).
    """
    if written is None:
        indexes = [load_index(idx) for idx in idx_paths]
    else:
        bounds = np.cumsum([0] + [len(o) for o in written.offsets]).tolist()
        if bounds[-1] != len(written.keys):
            raise RectoolError(
                f"{where}: {len(written.keys)} keys for {bounds[-1]} records written; this is "
                "a bug in rectool"
            )
        indexes = [
            (written.keys[a:b], np.asarray(o, np.int64))
            for a, b, o in zip(bounds, bounds[1:], written.offsets)
        ]
    for rf, idx, info, (keys, offsets) in zip(
        files, idx_paths, listed or [{}] * len(files), indexes
    ):
        check_shard(rf, idx, keys, offsets, dict(info), where)
        if covered:
            check_covered(rf, idx, keys, offsets)
    counts = [len(k) for k, _ in indexes]
    # One shard: its arrays as they are (a copy would double them at the end of a pack).
    keys = indexes[0][0] if len(indexes) == 1 else np.concatenate([k for k, _ in indexes])
    offsets = indexes[0][1] if len(indexes) == 1 else np.concatenate([o for _, o in indexes])
    del indexes
    if unique:
        _refuse_repeated(keys, idx_paths, counts, where)
    shard_of = shard_numbers(counts)  # one byte a record (none for one shard)

    def read(line: int) -> tuple[Header, bytes]:
        rf, offset = files[int(shard_of[line])], int(offsets[line])
        return unpack_header(rf.read_parts(offset, int(keys[line]))[0], rf.path, offset)

    ranges = None if layout == "images" or not len(keys) else insightface_header(read, keys)
    if ranges is None and layout == "insightface":
        raise RecordFormatError(
            "record 0 is not an insightface header (flag 2, no image bytes, labels "
            "[first identity key, end key])", files[0].path, key=0,
        )  # fmt: skip
    identity_ranges = None
    if ranges is not None:
        ids = key_lines(keys, ranges[1], idx_paths[0])
        pairs = header_labels(files, shard_of[ids], offsets[ids], keys[ids])
        identity_ranges = _identity_ranges(
            pairs,
            ranges[0].stop - ranges[0].start,
            lambda j: (files[int(shard_of[ids][j])].path, int(offsets[ids][j]), int(keys[ids][j])),
        )
        lines = np.arange(len(keys))[key_lines(keys, ranges[0], idx_paths[0])]
        order = shard_of[lines]
        if (order[1:] < order[:-1]).any():  # (shard numbers are unsigned: no np.diff)
            raise RectoolError(
                f"{files[0].path}: the insightface images do not run shard by shard; a binary "
                "index reads samples in shard order"
            )
        keys, offsets, shard_of = keys[lines], offsets[lines], shard_of[lines]
        counts = np.bincount(shard_of, minlength=len(files)).tolist()
    label_array = None
    if written is not None and written.labels is not None:
        if len(written.labels) != len(keys):
            raise RectoolError(
                f"{where}: {len(written.labels)} labels for {len(keys)} images written; this "
                "is a bug in rectool"
            )
        label_array = written.labels if labels else None
    elif labels:
        label_array = header_labels(files, shard_of, offsets, keys)
    return PackIndex(
        "images" if ranges is None else "insightface",
        counts,
        np.ascontiguousarray(offsets, "<i8"),
        np.ascontiguousarray(keys, "<i8"),
        label_array,
        identity_ranges,
    )


def _refuse_repeated(
    keys: NDArray[np.int64], idx_paths: list[str], counts: list[int], where: Any
) -> None:
    """Raise naming the first key on two lines of the `.idx` files (each file and line)."""
    order = np.argsort(keys, kind="stable")
    repeated = np.flatnonzero(keys[order[1:]] == keys[order[:-1]])
    if not len(repeated):
        return
    starts = np.cumsum([0, *counts])
    lines = []
    for line in order[repeated[0] : repeated[0] + 2].tolist():
        shard = int(np.searchsorted(starts, line, "right")) - 1
        lines.append(f"{idx_paths[shard]} line {line - int(starts[shard]) + 1}")
    raise RectoolError(
        f"{where}: key {int(keys[order[repeated[0]]])} is on more than one line of the .idx "
        f"files ({' and '.join(lines)}); MXNet reads the last, DALI both. Rebuild the index "
        "from the .rec (`rectool reindex`) or remove the repeated line"
    )


def index_files(
    recs: list[str],
    idxs: list[str],
    listed: list[Mapping[str, Any]] | None = None,
    layout: str | None = None,
    where: str | None = None,
    written: Written | None = None,
    unique: bool = False,
    covered: bool = False,
) -> PackIndex:
    """Return `index_shards` of the shard files `recs` (their `.idx` at `idxs`), each mapped
    only while it is read."""
    files = [RecordFile(rec) for rec in recs]
    try:
        return index_shards(
            files, idxs, listed, layout, where, written=written, unique=unique, covered=covered
        )
    finally:
        for rf in files:
            rf.close()


def index_manifest(
    path: str,
    manifest: Mapping[str, Any],
    written: Written | None = None,
    unique: bool = False,
    covered: bool = False,
) -> PackIndex:
    """Return `index_files` of the shards the manifest at `path` lists, beside it (`written`:
    what their writer hands over, see `Written`)."""
    folder, shards = os.path.dirname(path), manifest["shards"]
    return index_files(
        [os.path.join(folder, s["rec"]) for s in shards],
        [os.path.join(folder, s["idx"]) for s in shards],
        shards,
        manifest.get("layout"),
        path,
        written,
        unique,
        covered,
    )


def _identity_ranges(
    pairs: NDArray[Any], images: int, where: Callable[[int], tuple[str, int, int]]
) -> NDArray[np.int64]:
    """Return the identity records' label pairs [first key, end key) as sample ranges;
    `where(j)`: (rec, byte offset, key) of identity record j, named when it is refused."""
    if not len(pairs):  # a pack of no identity (a repack that kept none): no pair to check
        return np.empty((0, 2), np.int64)
    if pairs.dtype == object or pairs.ndim != 2 or pairs.shape[1] < 2:
        widths = [np.size(p) for p in pairs] if pairs.dtype == object else [0]
        j = next((j for j, w in enumerate(widths) if w < 2), 0)
        raise RecordFormatError(
            "an identity record must hold a label pair [first key, end key)", *where(j)
        )
    ok = np.isfinite(pairs[:, :2]) & (np.abs(pairs[:, :2]) < 2**31)
    ranges = np.where(ok, pairs[:, :2], 0).astype(np.int64) - 1  # image key k is sample k - 1
    bad = ~ok.all(1) | (ranges[:, 0] < 0) | (ranges[:, 0] > ranges[:, 1]) | (ranges[:, 1] > images)
    if bad.any():
        j = int(np.argmax(bad))
        raise RecordFormatError(
            f"the identity record holds the key range {(pairs[j, :2] + 0).tolist()}, not one "
            f"of the image keys 1..{images} [first, end)", *where(j),
        )  # fmt: skip
    return ranges


def has_binary_index(manifest: Mapping[str, Any] | None) -> bool:
    """Return True when a manifest names a binary index (format 3) for readers to map."""
    doc = manifest or {}
    return doc.get("format_version", 0) >= 3 and isinstance(doc.get("index"), dict)


def _npy(array: NDArray[Any]) -> list[Any]:
    """Return the bytes of `array` as an .npy file: its header, then its data (no copy)."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(array))
    data: Any = np.ascontiguousarray(array).reshape(-1)  # flat: (0, 2) casts too
    return [head.getvalue(), memoryview(data).cast("B")]


def _file_entry(path: str, parts: list[Any]) -> dict[str, Any]:
    """Write `parts` to `path` (complete or absent); return its manifest entry."""
    write_atomic(path, parts)
    digests = Digests([XXH3_128])
    for part in parts:
        digests.update(part)
    return {
        "file": os.path.basename(path),
        "bytes": sum(len(p) for p in parts),
        "xxh3_128": digests.hexdigests()[XXH3_128],
    }


def write_index(paths: PackPaths, index: PackIndex) -> dict[str, Any]:
    """Write the index arrays of the pack at `paths`; return the manifest's `index` entry."""
    if index.labels is None or index.labels.dtype == object:
        raise RectoolError(
            f"{paths}: the records hold labels of different widths; a binary index holds one "
            "float32 label, or one vector width, a sample"
        )
    arrays = {"offsets": index.offsets, "keys": index.keys, "labels": index.labels}
    if index.identity_ranges is not None:
        arrays["identity_ranges"] = index.identity_ranges
    entry: dict[str, Any] = {"samples": list(index.counts)}
    for name, path in paths.arrays.items():
        if name in arrays:
            dtype = "<i8" if name != "labels" else "<f4"
            entry[name] = _file_entry(path, _npy(np.ascontiguousarray(arrays[name], dtype)))
    return entry


def write_pack_index(paths: PackPaths, manifest: dict[str, Any], index: PackIndex) -> list[str]:
    """Write the index arrays of the pack at `paths` and, where its manifest holds the names
    themselves (formats 1 and 2, a manifest being built), its identities file; name both in
    `manifest`; return the files written."""
    manifest["index"] = write_index(paths, index)
    written = [paths.beside(e["file"]) for e in manifest["index"].values() if "file" in e]
    names = manifest.get("identities")
    if isinstance(names, dict) and "file" not in names:
        manifest["identities"] = write_identities(paths, {int(k): v for k, v in names.items()})
        written.append(paths.identities)
    return written


def write_identities(paths: PackPaths, identities: Mapping[int, str]) -> dict[str, Any]:
    """Write a pack's identity names ({label: name}); return the manifest's entry of them."""
    text = json.dumps({str(k): v for k, v in sorted(identities.items())}, ensure_ascii=False)
    data, why = text.encode("utf-8"), ""
    if len(data) > MAX_IDENTITIES_BYTES:  # never a file that `read_identities` refuses
        why = f"{paths.identities}: {len(data):,} bytes, over {MAX_IDENTITIES_BYTES:,}"
    try:
        json_values(data, paths.identities, "identities file")
    except InputError as exc:
        why = str(exc)
    if why:
        raise RectoolError(
            f"{len(identities):,} identity names cannot be written as a file that rectool reads "
            f"back: {why} (docs/format.md)"
        )
    entry = _file_entry(paths.identities, [data])
    return {**entry, "count": len(identities)}


def read_identities(manifest_path: str, manifest: Mapping[str, Any]) -> dict[int, str] | None:
    """Return a pack's identity names {label: name}: from their file (format 3) or the manifest."""
    named = manifest.get("identities")
    if named is None:
        return None
    if "file" not in named:  # format 1 and 2: the names are in the manifest
        return {int(k): v for k, v in named.items()}
    path = os.path.join(os.path.dirname(manifest_path), named["file"])
    data, _ = read_regular(path, "identities file", max_bytes=MAX_IDENTITIES_BYTES)
    try:  # this module is the identities file's one schema
        doc = json.loads(json_values(data, path, "identities file"))
        names = {int(k): v for k, v in doc.items() if isinstance(v, str)}
    except (ValueError, UnicodeDecodeError, AttributeError) as exc:
        raise InputError(f"{path}: not an identities file ({exc})") from None
    if len(names) != len(doc) or len(set(names.values())) != len(names):
        raise InputError(f"{path}: every identity must be a name, each given once")
    return names
