"""Read a pack for its report: every image as numpy columns, and image bytes from the shards.

`ImageTable` holds what the report needs of every image in columns, no Python object per
image: shard, record offset and label (a pack with a binary index: the index's own mapped
arrays), then image size and a 64-bit fingerprint that `scan_images` reads in one pass over
each shard through a bounded window (`format.window.RecWindow`), so the pack's pages never
pile up in the process's memory. About 12 bytes an image are the report's own (size and
fingerprint), and the shard number where there are several shards. The only code of the
report that knows the reader's and scanner's internals.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import RecordFormatError, RectoolError
from ..format.headers import shard_numbers, unpack_header
from ..format.keys import shared_offsets
from ..format.window import RecWindow, ascending
from ..reader import (
    IMAGE_HEADER_SIZE,
    LENGTH_BITS,
    LENGTH_MASK,
    MAGIC,
    sniff_format,
)

if TYPE_CHECKING:
    from ..dataset.packs import PackDataset

# open_rec(path): the window a shard is read through (tests inject one that counts).
OpenRec = Callable[[str], RecWindow]
# progress(phase, done, total): "records" and "bytes" of the scan as it goes.
ScanProgress = Callable[[str, int, int | None], object]

DAMAGE_LISTED = 10  # damaged images named one by one
_K1, _K2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)
_SPREAD8 = np.arange(8)
_HEAD = np.arange(16)  # magic, length word, flag, label: the first 16 bytes of a record


class ImageTable:
    """Every image of the dataset as parallel columns: shard, record offset, label; and, once
    `scan_images` has run, image size (-1: unreadable) and fingerprint."""

    shard: np.ndarray  # each image's shard number (a broadcast for one shard)
    offsets: np.ndarray
    labels: np.ndarray  # the first label of each image
    keys: np.ndarray | None  # each image's key, where the index gives it
    sizes: np.ndarray  # int32 image bytes, -1 where the record cannot be read
    prints: np.ndarray  # uint64: image size, 8 bytes from its middle and 8 from its end, mixed
    integral: bool  # every label a whole number: class ids

    def __init__(self) -> None:
        self.recs: list[str] = []
        self.bounds: list[int] = [0]  # shard s: images bounds[s] .. bounds[s + 1] - 1
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.keys = None

    @classmethod
    def from_index(cls, ds: PackDataset) -> ImageTable:
        """Return the table of a pack with a binary index: its arrays, mapped, not copied."""
        table = cls()
        table.recs = [rec for rec, _ in ds.shards]
        table.bounds = ds.shard_bounds
        labels = ds.labels
        table.labels = labels if labels.ndim == 1 else labels[:, 0]
        table.offsets, table.keys = ds.offsets, ds.keys
        table.shard = ds.shard_ids
        for s, rec in enumerate(table.recs):
            a, b = table.bounds[s], table.bounds[s + 1]
            _refuse_shared(rec, table.keys[a:b], table.offsets[a:b])
        table._finish_labels()
        return table

    def add(self, rec: str, facts: dict[str, Any]) -> None:
        """Take one shard's facts from `dataset_info(on_shard=...)`."""
        self.recs.append(rec)
        offsets = np.asarray(facts["offsets"], np.int64)  # one per key (the last line wins)
        _refuse_shared(rec, np.arange(len(offsets)), offsets)
        self.bounds.append(self.bounds[-1] + len(offsets))
        self._parts.append((offsets, np.asarray(facts["labels"], np.float32)))

    def finish(self) -> None:
        """Join the shards' parts (after the last `add`)."""
        parts = self._parts or [(np.zeros(0, np.int64), np.zeros(0, np.float32))]
        self.offsets = np.concatenate([o for o, _ in parts])
        self.labels = np.concatenate([label for _, label in parts])
        self._parts = []  # joined: let them go
        self.shard = shard_numbers([b - a for a, b in zip(self.bounds, self.bounds[1:])] or [0])
        self._finish_labels()

    def _finish_labels(self) -> None:
        n = len(self.offsets)
        self.sizes, self.prints = np.full(n, -1, np.int32), np.zeros(n, np.uint64)
        finite = bool(np.isfinite(self.labels).all()) if n else False
        self.integral = finite and bool((self.labels == np.round(self.labels)).all())

    def __len__(self) -> int:
        return len(self.offsets)

    def where(self, i: int) -> str:
        """Say where image `i` is, for people: file name and byte offset."""
        return f"{os.path.basename(self.recs[self.shard[i]])} byte {int(self.offsets[i]):,}"

    def label(self, i: int) -> int | float:
        value = float(self.labels[i])
        return int(value) if self.integral else value


def _refuse_shared(rec: str, keys: np.ndarray, offsets: np.ndarray) -> None:
    """Refuse a shard whose index names one record under several keys."""
    if len(offsets) < 2 or bool((offsets[1:] > offsets[:-1]).all()):
        return  # records in file order, as packs write them
    count, _, offset = shared_offsets(keys, offsets)
    if count:  # a report of one record shown once per key would run on for every key
        raise RectoolError(
            f"{rec}: byte offset {offset} is named by "
            f"{int(np.count_nonzero(offsets == offset)):,} keys of its index"
            + (f" ({count - 1:,} other offsets too)" if count > 1 else "")
            + "; each record has one key, so report refuses it (`rectool verify` lists them)"
        )


@dataclass
class ScanFacts:
    """What `scan_images` found beside the columns: encodings and unreadable images."""

    encodings: Counter[str] = field(default_factory=Counter)
    damaged: int = 0
    # the first DAMAGE_LISTED: (rec, key or None, offset, reason)
    damage: list[tuple[str, int | None, int, str]] = field(default_factory=list)

    def note(self, rec: str, key: int | None, offset: int, reason: str) -> None:
        self.damaged += 1
        if len(self.damage) < DAMAGE_LISTED:
            self.damage.append((rec, key, offset, reason))


def mix(sizes: np.ndarray, middle: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """Return one uint64 fingerprint of (image size, 8 middle bytes, 8 end bytes) each."""
    with np.errstate(over="ignore"):
        return (middle * _K1) ^ tail ^ (sizes.astype(np.uint64) * _K2)


def scan_images(
    images: ImageTable,
    open_rec: OpenRec = RecWindow,
    progress: ScanProgress | None = None,
) -> ScanFacts:
    """Read each image's size, fingerprint and encoding into `images` (in place), in one
    pass over each shard in file order through `open_rec(path)`'s bounded window.

    Whole records are read with numpy a window at a time; split ones, and any that a window
    cuts, one by one. A record that cannot be read is left at size -1 and counted in the
    result's `damage`, as is an empty image (size 0).
    """
    facts = ScanFacts()
    total = int(images.bounds[-1])
    done = done_bytes = 0
    total_bytes = sum(os.path.getsize(rec) for rec in images.recs)
    for s, rec in enumerate(images.recs):
        a, b = images.bounds[s], images.bounds[s + 1]
        offsets = images.offsets[a:b]
        order = ascending(offsets)
        starts = offsets if order is None else offsets[order]
        with open_rec(rec) as window:
            for i, j, lo, hi in window.batches(starts):
                rows = a + (np.arange(i, j) if order is None else order[i:j])
                _scan_window(images, facts, window, rec, rows, starts[i:j], lo, hi)
                done, done_bytes = done + j - i, done_bytes + (hi - lo)
                if progress is not None:
                    progress("records", done, total)
                    progress("bytes", done_bytes, total_bytes)
    return facts


def _scan_window(
    images: ImageTable,
    facts: ScanFacts,
    window: RecWindow,
    rec: str,
    rows: np.ndarray,
    starts: np.ndarray,
    lo: int,
    hi: int,
) -> None:
    view = window.view(lo, hi)
    rel = starts - min(max(0, lo), window.size)  # the view starts where the file allows
    ok = (starts & 3 == 0) & (rel >= 0) & (rel + 32 <= len(view))
    head = view[np.where(ok, rel, 0)[:, None] + _HEAD] if len(view) >= 16 else None
    if head is None:
        ok[:] = False
        magic = lrec = flag = np.zeros(len(rows), np.uint32)
    else:
        magic, lrec, flag, _ = head.view("<u4").T
    room = lrec - np.uint32(IMAGE_HEADER_SIZE)  # uint32: huge when the record has no room
    ok &= (magic == MAGIC) & (lrec >> LENGTH_BITS == 0) & (room <= LENGTH_MASK - 24)
    ok &= flag <= room >> 2
    size = (room - 4 * flag).astype(np.int64)
    end = rel + 8 + lrec.astype(np.int64)
    ok &= (end + (-end & 3) <= len(view)) & (size >= 8)
    fast = np.flatnonzero(ok)
    if len(fast):
        e, n = end[fast], size[fast]
        tail = view[(e - 8)[:, None] + _SPREAD8].view("<u8")[:, 0]
        middle = view[(e - n // 2 - 4)[:, None] + _SPREAD8].view("<u8")[:, 0]
        images.sizes[rows[fast]] = n
        images.prints[rows[fast]] = mix(n, middle, tail)
        first = view[(e - n)[:, None] + _SPREAD8[:4]].view("<u4")[:, 0]
        jpeg = (first & 0xFFFFFF) == 0xFFD8FF
        png = first == 0x474E5089
        facts.encodings["jpeg"] += int(jpeg.sum())
        facts.encodings["png"] += int(png.sum())
        for k in np.flatnonzero(~jpeg & ~png).tolist():  # other formats: by their signature
            at = int(e[k] - n[k])
            kind = sniff_format(view[at : at + min(16, int(n[k]))].tobytes())
            facts.encodings["unknown" if kind is None else kind] += 1
    del view
    keys = images.keys
    for k in np.flatnonzero(~ok).tolist():  # split, cut by the window, short, or damaged
        row, offset = int(rows[k]), int(starts[k])
        key = None if keys is None else int(keys[row])
        try:
            _, image = unpack_header(window.record(offset, key), rec, offset, key)
        except RecordFormatError as exc:
            facts.note(rec, key, offset, exc.reason)
            continue
        n = len(image)
        mid = image[n - n // 2 - 4 :][:8] if n >= 8 else image
        pair = [int.from_bytes(bytes(x).ljust(8, b"\0"), "little") for x in (mid, image[-8:])]
        images.sizes[row] = n
        images.prints[row] = mix(np.array([n]), *(np.array([x], np.uint64) for x in pair))[0]
        if n:
            kind = sniff_format(image[:16])
            facts.encodings["unknown" if kind is None else kind] += 1
    for k in np.flatnonzero(images.sizes[rows] == 0).tolist():
        row = int(rows[k])
        key = None if keys is None else int(keys[row])
        facts.note(rec, key, int(starts[k]), "empty image: a header and no image bytes")


class Payloads:
    """Read the image bytes of single images (thumbnails, duplicate candidates) from the
    shards, each through its window (opened once, released after each read)."""

    def __init__(self, images: ImageTable, open_rec: OpenRec = RecWindow) -> None:
        self.images = images
        self._open_rec = open_rec
        self.files: dict[int, RecWindow] = {}

    def __enter__(self) -> Payloads:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.files.values():
            f.close()

    def image(self, i: int) -> bytes:
        """Return the image bytes of image `i` (labels and header stripped)."""
        s = int(self.images.shard[i])
        if s not in self.files:
            self.files[s] = self._open_rec(self.images.recs[s])
        window, offset = self.files[s], int(self.images.offsets[i])
        key = None if self.images.keys is None else int(self.images.keys[i])
        return bytes(unpack_header(window.record(offset, key), window.path, offset, key)[1])
