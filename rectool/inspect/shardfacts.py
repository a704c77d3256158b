"""Read every record header of a shard that has no binary index: its facts for `rectool info`.

`shard_facts` walks a shard a `RecWindow` batch at a time in file order (the .idx's offsets,
or the framing walked when there is no .idx), reading each batch's headers and image
signatures with numpy (`inspect.scan`) and keeping a few numpy columns a record, never an
object per record; each batch's pages are handed back as the next is taken. Insightface's
record 0 is read on its own and judged by `format.headers.insightface_header`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import RectoolError
from ..format.headers import Header, insightface_header, unpack_header
from ..format.keys import last_line_wins
from ..format.textindex import load_index
from ..format.window import RecWindow, ascending
from .scan import image_formats, locate_records, read_headers, scan_framing

# open_rec(path): the window a shard is read through; progress(phase, done, total).
OpenRec = Callable[[str], RecWindow]
PhaseProgress = Callable[[str, int, int | None], object]
# A record that cannot be read: (key or None, byte offset, reason).
Damaged = tuple[int | None, int, str]


def shard_facts(rec: str, idx: str, open_rec: OpenRec, progress: PhaseProgress) -> dict[str, Any]:
    """Read every record header of a shard, a window at a time in file order; return its facts
    (see `inspect.info.dataset_info`'s `on_shard`).

    What is kept of each record is a few numpy columns (about 15 bytes; 8 more for a .rec
    without its .idx, whose keys are the headers' ids), never an object per record.
    """
    damage: list[Damaged] = []  # each record that cannot be read
    with open_rec(rec) as window:
        buf, size = window.mapping, window.size
        lengths = split = keys = None
        if os.path.exists(idx):
            keys, offsets = load_index(idx)
            if not len(keys) and size:  # not "0 records": the index is lost, not the data
                held = len(scan_framing(buf, size, window=window).starts)
                raise RectoolError(
                    f"{idx}: empty, but {os.path.basename(rec)} holds {held} records; "
                    f"rebuild it with `rectool reindex {rec} --overwrite`"
                )
            keys, offsets = last_line_wins(keys, offsets)
        else:
            framing = scan_framing(buf, size, window=window)
            damage += [(None, d.start, d.reason) for d in framing.damage]
            offsets, lengths, split = framing.starts, framing.lengths, framing.split
        unframed = len(damage)  # records not in `offsets`
        columns = _HeaderColumns(len(offsets), ids=keys is None)
        order = ascending(offsets)
        starts = offsets if order is None else offsets[order]
        for i, j, lo, hi in window.batches(starts):
            rows = np.arange(i, j) if order is None else order[i:j]
            window.hold(lo, hi)  # handed back as the next batch is taken
            at = starts[i:j]
            if lengths is None or split is None:
                bad: list[tuple[int, int, str]] = []
                batch_keys = None if keys is None else keys[rows]
                got, cut = locate_records(buf, size, at, rec, batch_keys, bad=bad)
                for k, offset, reason in bad:
                    damage.append((None if keys is None else int(keys[rows[k]]), offset, reason))
                    columns.readable[rows[k]] = False
            else:
                got, cut = lengths[rows], split[rows]
            columns.add(buf, size, rows, at, got, cut, window.record)
            progress("records", int(j), len(starts))
            progress("bytes", hi, size)
        window.drop()
        if keys is None:
            keys = columns.ids
        ranges = _insightface(window, keys, offsets, columns)
        images = columns.complete & columns.readable
        layout, classes = "images", None
        if ranges is not None:
            layout, classes = "insightface", len(ranges[1])
            images &= (keys >= ranges[0].start) & (keys < ranges[0].stop)
        # An empty image is still an image (as verify and the reader count it), and damage.
        reason = "empty image: a header and no image bytes"
        empty = np.flatnonzero(images & (columns.image == 0)).tolist()
        damage += [(int(keys[i]), int(offsets[i]), reason) for i in empty]
        # A record too short for its header, or for the labels its flag announces: no image,
        # and damage (the reader refuses it), not a record left out without a word.
        cut = np.flatnonzero(columns.readable & ~columns.complete).tolist()
        damage += [(int(keys[i]), int(offsets[i]), _too_short(columns, i)) for i in cut]
        rows = np.flatnonzero(images)
        kinds = np.bincount(columns.kind[rows], minlength=len(_KINDS))
        damage.sort(key=lambda d: d[1])
        return {
            "records": len(offsets) + unframed,
            "readable": int(np.count_nonzero(columns.readable)),
            "rec_bytes": size,
            "layout": layout,
            "label_vectors": bool((columns.flag[images] > 0).any()),
            "classes": classes,
            "labels": columns.label0[rows],
            "sizes": columns.image[rows],
            "formats": Counter(
                {_KINDS[k] or "unknown": int(c) for k, c in enumerate(kinds.tolist()) if c}
            ),
            "flags": _counts(columns.flag[rows]),
            "offsets": offsets[rows],
            "damage": damage,
        }


# Image formats as `image_formats` names them, by code (0: unknown, or no image bytes).
_KINDS: tuple[str | None, ...] = (None, "jpeg", "png", "bmp", "gif", "webp", "tiff")
_KIND_CODES = {kind: code for code, kind in enumerate(_KINDS)}


class _HeaderColumns:
    """What `shard_facts` keeps of each record's header: numpy columns, filled a batch at a
    time (`add`); `readable` False where the record cannot be read."""

    def __init__(self, n: int, ids: bool) -> None:
        self.readable = np.ones(n, bool)
        self.complete = np.zeros(n, bool)
        self.flag = np.zeros(n, np.uint32)
        self.label0 = np.full(n, np.nan, np.float32)
        self.image = np.zeros(n, np.int32)  # image bytes (< 2**29: a record's length)
        self.kind = np.zeros(n, np.int8)  # a `_KINDS` code
        self.ids = np.zeros(n if ids else 0, np.int64)

    def add(
        self,
        buf: Any,
        size: int,
        rows: np.ndarray,
        starts: np.ndarray,
        lengths: np.ndarray,
        split: np.ndarray,
        read_record: Callable[[int], bytes],
    ) -> None:
        """Read the headers of the records at `starts` (rows `rows`) into the columns."""
        ok = self.readable[rows]
        rows, starts, lengths, split = rows[ok], starts[ok], lengths[ok], split[ok]
        headers = read_headers(buf, size, starts, lengths, split, read_record)
        self.complete[rows] = headers.complete
        self.flag[rows] = headers.flag
        self.label0[rows] = headers.label0
        self.image[rows] = headers.image
        if len(self.ids):
            self.ids[rows] = headers.id.astype(np.int64)
        local = np.flatnonzero(headers.complete)
        found = image_formats(buf, size, starts, headers, split, local, read_record)
        self.kind[rows[local]] = [_KIND_CODES.get(kind, 0) for kind in found.tolist()]


def _insightface(
    window: RecWindow, keys: np.ndarray, offsets: np.ndarray, columns: _HeaderColumns
) -> tuple[range, range] | None:
    """Return `insightface_header`'s key ranges of a shard read by `shard_facts`, or None.

    A record too short for its header counts as one with the flag it shows (0 when even that
    is cut off) and no labels, so a cut record 0 is no header; an unreadable one is not there.
    """
    present = np.where(columns.readable, keys, -1)  # (keys are never negative)

    def read(row: int) -> tuple[Header, bytes]:
        if not columns.complete[row]:
            return Header(int(columns.flag[row]), np.full(2, np.nan, np.float32), 0, 0), b""
        return unpack_header(window.record(int(offsets[row])))

    return insightface_header(read, present)


def _too_short(columns: _HeaderColumns, row: int) -> str:
    """Return why the record at `row`, not `complete`, holds no image."""
    flag = int(columns.flag[row])  # 0 when even the header is cut off
    labels = f" and the {flag} float32 labels it announces" if flag else ""
    return f"record too short for its 24-byte image header{labels}"


def _counts(values: np.ndarray) -> Counter:
    """Return a Counter of an array's values, counted by numpy (no object per record)."""
    found, counts = np.unique(values, return_counts=True)
    return Counter(dict(zip(found.tolist(), counts.tolist())))
