"""Write a dataset's images back out as an identity-per-folder tree.

Each image becomes `OUT_DIR/<identity>/<key>.<ext>`: the identity is the name the manifest's
label map gives the label (else the label itself), the key is the record's .idx key and the
extension comes from the image's signature. The bytes are the stored bytes, so unpacking a
pass-through pack gives back the original files byte for byte; only their names are new (the
.rec does not store them).

A shard with a `.rec.crc` file (rectool packs write one) has every record compared with its
checksum (xxh3-64; CRC-32 in packs of manifest version 1) before anything is written: a
damaged record stops the unpack with an error naming it, so that no damaged image is ever
written as if it were sound.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dataset.packs import open_dataset
from ..doors.output import OutputFolder
from ..errors import InputError, RectoolError
from ..format.checksums import (
    ChecksumFileError,
    checksum_path,
    damaged_in_window,
    load_checksums,
    stale_reason,
)
from ..format.digest import XXH3_128
from ..format.keys import refuse_shared_offsets
from ..format.manifest import identity_name_problem
from ..format.window import RecWindow
from ..packer.images import sniff_format
from ..text import counted
from .verify.binary import read_index_file

if TYPE_CHECKING:
    from _typeshed import StrPath

    from ..dataset.packs import PackDataset

EXTENSIONS: dict[str | None, str] = {
    "jpeg": ".jpg",
    "png": ".png",
    "bmp": ".bmp",
    "gif": ".gif",
    "webp": ".webp",
    "tiff": ".tif",
    None: ".bin",
}


class DamagedRecordsError(RectoolError):
    """Records whose bytes differ from their checksum: unpacking them would write damaged images.

    `damaged` lists (rec path, key or None, byte offset) of every one found.
    """

    def __init__(self, message: str, damaged: list[tuple[str, int | None, int]]) -> None:
        super().__init__(message)
        self.damaged = damaged


# The files of a format-3 pack's binary index that unpack reads.
UNPACK_READS = ("offsets", "keys", "labels")

# The shards' mappings are let go once about this many image bytes were read through them.
RELEASE_BYTES = 64 << 20


@dataclass
class UnpackResult:
    """What `unpack_dataset` wrote."""

    out_dir: str
    layout: str = "images"  # or "insightface": the dataset's layout (`PackDataset.layout`)
    images: int = 0
    identities: int = 0
    bytes: int = 0
    unknown_format: int = 0  # images written as .bin: no known image signature
    kept: int = 0  # with resume: images an earlier run had written, found whole

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def unpack_dataset(
    target: StrPath,
    out_dir: StrPath,
    progress: Callable[[int, int], object] | None = None,
    resume: bool = False,
) -> UnpackResult:
    """Write every image of the dataset at `target` under `out_dir`; return an `UnpackResult`.

    Only image records are written (the insightface layout's header and identity records are
    not images). A key repeated in an .idx is written once, from its last line, as readers
    resolve it. Existing files are never overwritten; with `resume`, one already holding its
    record's bytes (what an interrupted run wrote) is kept. `progress(done, total)` is called as
    images are written. The dataset is opened as every command opens one (a format-3 pack maps
    its binary index; any other gets the same index built from its .idx files).
    """
    out_dir = os.fspath(out_dir)
    result = UnpackResult(out_dir)
    ds = open_dataset(target)
    out = None
    try:
        names = ds.identities or {}  # read (a remote pack's fetched) before it is checked
        _refuse_changed_index(ds)
        _refuse_damaged(ds)
        samples = _samples(ds)
        folders = _folders(ds, samples, names)  # before anything is written
        result.layout = ds.layout
        total = len(samples)
        out = OutputFolder(out_dir)  # never writes through a link planted inside it
        mapped = 0  # bytes read through the shards' mappings since they were let go
        for done, i in enumerate(samples.tolist(), start=1):
            image, label = ds.raw(i)
            mapped += len(image)
            if mapped >= RELEASE_BYTES:  # unmapped, mapped again on the next read: the
                ds.close()  # process never holds the pack's pages (issue 37)
                mapped = 0
            folder = folders[_label_text(label if np.ndim(label) == 0 else label[0])]
            kind = sniff_format(image[:16])
            result.unknown_format += kind is None
            key = ds.keys.item(i)
            written = out.write_new(folder, f"{key}{EXTENSIONS[kind]}", image, resume)
            result.kept += not written
            result.images += 1
            result.bytes += len(image)
            if progress is not None and (done % 256 == 0 or done == total):
                progress(done, total)
    finally:
        ds.close()
        if out is not None:
            out.close()
    result.identities = len(set(folders.values()))
    return result


def _folders(ds: PackDataset, samples: np.ndarray, names: dict[int, str]) -> dict[str, str]:
    """Return the folder of each label the `samples` carry (their first label), by the label's
    `_label_text` (a NaN label is one key, never equal to itself as a float); raise
    `RectoolError` naming the folder when two labels would share one (identities that the
    label map names alike, or a name that is another label's number): two identities are
    never poured into one folder."""
    labels = ds.labels
    if len(samples) and labels.dtype == object:  # widths differ: the first label of each
        firsts = np.array([float(np.ravel(labels[i])[0]) for i in samples.tolist()])
    elif labels.ndim == 2:
        firsts = np.asarray(labels[samples, 0], np.float64)
    else:
        firsts = np.asarray(labels[samples], np.float64)
    folders: dict[str, str] = {}
    owner: dict[str, float] = {}
    for label in np.unique(firsts).tolist():
        folder = folders[_label_text(label)] = _folder_name(label, names)
        if folder in owner:
            raise RectoolError(
                f"labels {owner[folder]:g} and {label:g} of {ds.manifest_path or ds.shards[0][0]} "
                f"would both be written to the folder {folder!r} (their identity name, or a "
                "label's number); unpack never merges identities, so nothing was written. "
                "Give them distinct names in the label map (`rectool verify` flags such names)"
            )
        owner[folder] = label
    return folders


def _samples(ds: PackDataset) -> np.ndarray:
    """Return the samples to write, one per key (its last .idx line), shard by shard.

    The dataset's samples are its images (the insightface layout's are keys 1..N, each once);
    in the images layout every .idx line is one, so a repeated key keeps its last line. Keys
    that share one record are refused: unpack writes one file per record.
    """
    chosen = []
    bounds = ds.shard_bounds
    for (_, idx), a, b in zip(ds.shards, bounds, bounds[1:]):
        keys, offsets = np.asarray(ds.keys[a:b]), np.asarray(ds.offsets[a:b])
        unique, last, count = np.unique(keys[::-1], return_index=True, return_counts=True)
        if ds.layout != "insightface" and len(unique) < len(keys):
            key = int(unique[np.argmax(count)])
            raise RectoolError(
                f"{idx}: key {key} is on {int(count.max()):,} lines ({len(keys) - len(unique):,} "
                f"lines repeat a key); readers keep a key's last line, so unpack would write "
                f"{len(unique):,} of the {len(keys):,} records it indexes: nothing was written. "
                "Rebuild the index from the records (`rectool reindex`), then unpack"
            )
        lines = np.sort(len(keys) - 1 - last)
        refuse_shared_offsets(idx, keys[lines], offsets[lines], "unpack")
        chosen.append(a + lines)
    samples = np.concatenate(chosen) if chosen else np.zeros(0, np.int64)
    _refuse_keys_across_shards(ds, samples)
    return samples


def _refuse_keys_across_shards(ds: PackDataset, samples: np.ndarray) -> None:
    """Raise `RectoolError` when two shards hold one key: each image is named by its key, so
    the second would meet the first's file half-way through the unpack."""
    keys = np.asarray(ds.keys[samples]) if len(samples) else np.zeros(0, np.int64)
    unique, count = np.unique(keys, return_counts=True)
    if len(unique) == len(keys):
        return
    key = unique[np.argmax(count > 1)]
    where = np.flatnonzero(keys == key)[:2]
    shard = np.searchsorted(np.asarray(ds.shard_bounds), samples[where], side="right") - 1
    a, b = (ds.shards[int(i)][1] for i in shard)
    raise RectoolError(
        f"{a} and {b} both hold key {int(key)} ({len(keys) - len(unique):,} keys are in more "
        "than one shard); unpack names each image by its key, so nothing was written. "
        "Unpack each shard (its .rec) into a folder of its own"
    )


def _refuse_changed_index(ds: PackDataset) -> None:
    """Raise `RectoolError` when a file of a format-3 pack's binary index or its identity names
    differs from the size or xxh3-128 its manifest gives it.

    unpack names each file by the index's key and puts it in the folder of the index's label
    and name: an index changed after packing would write images under another record's key or
    identity, with nothing to tell them apart from sound ones.
    """
    if not ds.indexed or ds.manifest is None or ds.manifest_path is None:
        return
    folder = os.path.dirname(ds.manifest_path)
    index = ds.manifest.get("index") or {}
    # The files unpack reads (an insightface pack's identity ranges it does not).
    entries = [(name, index.get(name)) for name in UNPACK_READS]
    entries.append(("identities", ds.manifest.get("identities")))
    for name, entry in entries:
        if not isinstance(entry, dict) or "file" not in entry:
            continue
        found = read_index_file(name, os.path.join(folder, str(entry["file"])), entry)
        if found.missing or found.unusable is not None:  # a FIFO or a device too
            raise InputError(f"{found.path}: {found.unusable or name + ' file not found'}")
        size, want = entry.get("bytes"), entry.get("xxh3_128")
        if size is not None and found.size != size:
            why = f"{found.size} bytes; the manifest says {size}"
        elif found.digests is not None and (got := found.digests[XXH3_128]) != want:
            why = f"xxh3-128 {got} differs from the manifest's {want}"
        else:
            continue
        raise RectoolError(
            f"{found.path}: {why}: the pack's index was changed after packing, so unpack could "
            "write images under another record's key or identity; nothing was written. "
            "`rectool verify` says more; `rectool index` writes the index again"
        )


def _refuse_damaged(ds: PackDataset, shown: int = 5) -> None:
    """Raise `DamagedRecordsError` when a record differs from its checksum in a .rec.crc file."""
    damaged: list[tuple[str, int | None, int]] = []
    bounds = ds.shard_bounds
    for (rec, _), a, b in zip(ds.shards, bounds, bounds[1:]):
        path = checksum_path(rec)
        try:
            entries, _ = load_checksums(path)
        except FileNotFoundError:
            continue  # packed by another tool: nothing to compare with
        except ChecksumFileError as exc:
            raise RectoolError(
                f"{exc}; cannot check the records against it (`rectool verify` says more; "
                "delete it to unpack without per-record checks)"
            ) from None
        with RecWindow(rec) as window:  # the pack read a window at a time, never held
            stale = stale_reason(entries, window.size)
            if stale is not None:
                raise RectoolError(
                    f"{path}: {stale} (`rectool verify` says more; delete it to unpack "
                    "without per-record checks)"
                )
            bad = damaged_in_window(window, entries)
        if len(bad):
            key_of = dict(zip(ds.offsets[a:b].tolist(), ds.keys[a:b].tolist()))
            for i in bad:
                offset = int(entries["offset"][i])
                damaged.append((rec, key_of.get(offset), offset))
    if damaged:
        n = len(damaged)
        named = "; ".join(
            f"{rec}{'' if key is None else f' key {key}'} at byte offset {offset}"
            for rec, key, offset in damaged[:shown]
        )
        more = f" and {n - shown} more" if n > shown else ""
        raise DamagedRecordsError(
            f"{counted(n, 'damaged record')} (bytes differ from the checksum taken "
            f"when packed): {named}{more}; nothing was written. `rectool verify` lists them all",
            damaged,
        )


def _label_text(label: float) -> str:
    """Return a label as a folder name: the integer's digits, else its repr ('1.5', 'nan')."""
    label = float(label)
    return str(int(label)) if label.is_integer() else repr(label)


def _folder_name(label: float, names: dict[int, str]) -> str:
    label = float(label)
    text = _label_text(label)
    name = names.get(int(label)) if label.is_integer() else None
    # A label map names folders that `rectool list` read; a name that cannot name one (the
    # manifest schema's rule, which `verify` reports) is written as the label.
    if name is None or identity_name_problem(name) is not None or os.sep in name:
        return text
    return name
