"""A repack's inputs, opened: its sources (`Source`) and its --drop-overlap targets
(`open_target`)."""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

import numpy as np

from ..dataset.packs import open_dataset
from ..errors import InputError, RectoolError
from ..format.keys import FLOAT32_EXACT, refuse_shared_offsets, shared_offsets
from ..format.paths import PackPaths
from ..packer.listfile import read_label_map
from ..redaction import safe_url
from ..remote.mirror import local_source
from .copier import RELEASE_BYTES
from .evalsets import is_eval_set, read_eval_set

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, StrPath

    from ..dataset.packs import PackDataset
    from ..reader import RecordFile


class Source:
    """One opened source: its dataset, the shard of each sample, and its identity names.

    Its columns cost 4 bytes a sample: `labels` (int32) and `shard_of` (the dataset's shard
    numbers: none for one shard, one byte a sample below 256 shards).
    """

    def __init__(self, spec: StrPath) -> None:
        given = os.fspath(spec)
        self.spec = safe_url(given)  # what is shown and written (manifest, report, refusals)
        try:  # a URL: a local copy, named by its URL (the manifest's sources, refusals)
            self.dataset = open_dataset(local_source(given, check=True))
        except InputError as exc:  # still an unusable input, named as the source
            raise InputError(f"source {self.spec}: {exc}") from None
        except RectoolError as exc:
            raise RectoolError(f"source {self.spec}: {exc}") from None
        self.shard_of = self.dataset.shard_ids
        _refuse_shared_offsets(self.dataset, self.shard_of)
        self.labels = _identity_labels(self.dataset, self.spec)
        # How many labels each record holds: 0 a scalar, k a vector of k (one width a source).
        held = self.dataset.labels
        self.label_width = int(held.shape[1]) if held.ndim == 2 else 0
        self.names = _identity_names(self.dataset)
        # The copy reads the same files: a source small enough to stay mapped keeps its
        # mappings (a source without a binary index read its labels through them), so its
        # pages are faulted in once, not twice.
        self.record_files: list[RecordFile] | None = self.dataset.shard_files
        if _rec_bytes(self.dataset) > RELEASE_BYTES:
            self.record_files = None
            self.dataset.close()  # its mappings are touched end to end: let them go

    def release(self) -> None:
        """Let go of the columns a sample (a run that is written needs them no more)."""
        self.labels = np.empty(0, np.int32)
        self.shard_of = np.empty(0, np.uint8)

    def fingerprint(self) -> list[list[str | int]]:
        """Return what identifies the source's files (compared on --resume)."""
        files: list[list[str | int]] = []
        for rec, idx in self.dataset.shards:
            st_rec, st_idx = os.stat(rec), os.stat(idx)
            files.append(
                [
                    os.path.abspath(rec),
                    st_rec.st_size,
                    st_rec.st_mtime_ns,
                    st_idx.st_size,
                    st_idx.st_mtime_ns,
                ]
            )
        return files


def _refuse_shared_offsets(dataset: PackDataset, shard_of: np.ndarray) -> None:
    """Refuse a source whose index names one record under several keys: repack would copy it
    once per key (work bounded by the records that exist, not by the index's lines)."""
    keys, offsets = np.asarray(dataset.keys), np.asarray(dataset.offsets)
    count, number, _ = shared_offsets(keys, offsets, shard_of)
    if count:
        mine = shard_of == number
        shard = dataset.shards[number]  # type: ignore[index]  # a count: `number` is set
        refuse_shared_offsets(shard[1], keys[mine], offsets[mine], "repack")


class PackTarget:
    """A --drop-overlap target that is a dataset: its images are compared, nothing else."""

    def __init__(self, spec: StrPath) -> None:
        given = os.fspath(spec)
        self.spec = safe_url(given)  # what is shown and written: never a credential
        try:
            self.dataset = open_dataset(given)
        except InputError as exc:
            raise InputError(f"--drop-overlap {self.spec}: {exc}") from None
        except RectoolError as exc:
            raise RectoolError(f"--drop-overlap {self.spec}: {exc}") from None

    def digests(self) -> np.ndarray:
        return _dataset_digests(self.dataset)

    def image(self, i: int) -> bytes:
        return bytes(self.dataset[i][0])

    def where(self, i: int) -> str:
        return f"key {int(self.dataset.keys[i])}"


class EvalTarget:
    """A --drop-overlap target that is an insightface verification set (`lfw.bin`): images
    without identities, read by `evalsets.read_eval_set` (no pickle code is run)."""

    def __init__(self, spec: StrPath) -> None:
        self.spec = os.fspath(spec)
        self.eval_set = read_eval_set(self.spec)
        self.images = self.eval_set.images
        self.dataset = None  # no files a repack could write over: a .bin is no shard name

    def digests(self) -> np.ndarray:
        objects, which = self.eval_set.distinct()  # an image referenced again: hashed once
        out = np.zeros((len(objects), 2), np.uint64)
        for i, image in enumerate(objects):
            out[i] = image_digest(image)
        return out[which]

    def image(self, i: int) -> bytes:
        return self.images[i]

    def where(self, i: int) -> str:
        return f"image {i} (pair {i // 2})"


# A --drop-overlap TARGET, as `open_target` opens it.
Target = PackTarget | EvalTarget


def open_target(spec: StrPath) -> Target:
    """Open a --drop-overlap TARGET: a verification set when it is a `.bin` file, else a
    dataset."""
    return EvalTarget(spec) if is_eval_set(spec) else PackTarget(spec)


def _rec_bytes(dataset: PackDataset) -> int:
    return sum(os.path.getsize(rec) for rec, _ in dataset.shards)


def _identity_labels(dataset: PackDataset, spec: str) -> np.ndarray:
    """Return every sample's class label as int32 (a class id is below 2**24): a format-3
    source's mapped index, else the record headers (`PackDataset.labels`)."""
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
    return labels.astype(np.int32)


def _identity_names(dataset: PackDataset) -> dict[int, str] | None:
    """Return label -> identity name from the manifest or a label map beside the pack, or None."""
    names = dataset.identities
    if names:
        return names
    rec = dataset.shards[0][0] if dataset.shards else None
    if rec:
        stem = PackPaths.of_rec(rec)
        numbered = stem.numbered_pack()  # PREFIX-00000.rec: PREFIX's map
        for paths in (stem, numbered) if numbered else (stem,):
            if os.path.exists(paths.label_map):
                return read_label_map(paths.label_map)
    return None


def image_digest(data: ReadableBuffer) -> np.ndarray:
    return np.frombuffer(hashlib.blake2b(data, digest_size=16).digest(), "<u8")


def _dataset_digests(dataset: PackDataset) -> np.ndarray:
    out = np.zeros((len(dataset), 2), np.uint64)
    for i in range(len(dataset)):
        out[i] = image_digest(dataset[i][0])
    dataset.close()
    return out
