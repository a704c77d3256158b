"""Read a pack for its report: every image as parallel arrays, and image bytes from the shards.

The only code of the report that knows the reader's and scanner's internals.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import RectoolError
from ..format.keys import shared_offsets


class ImageTable:
    """Every image of the dataset as parallel arrays: shard, record offset, label, size."""

    shard: np.ndarray  # the columns, once `finish` has joined the shards' parts
    offsets: np.ndarray
    labels: np.ndarray
    sizes: np.ndarray
    integral: bool  # every label a whole number: class ids

    def __init__(self) -> None:
        self.recs: list[str] = []
        self._parts: list[tuple[np.ndarray, ...]] = []

    def add(self, rec: str, facts: dict[str, Any]) -> None:
        """Take one shard's facts from `dataset_info(on_shard=...)`."""
        number = len(self.recs)
        self.recs.append(rec)
        n = len(facts["offsets"])
        offsets = np.asarray(facts["offsets"], np.int64)  # one per key (the last line wins)
        count, _, offset = shared_offsets(np.arange(n), offsets)
        if count:  # a report of one record shown once per key would run on for every key
            raise RectoolError(
                f"{rec}: byte offset {offset} is named by "
                f"{int(np.count_nonzero(offsets == offset)):,} keys of its index"
                + (f" ({count - 1:,} other offsets too)" if count > 1 else "")
                + "; each record has one key, so report refuses it (`rectool verify` lists them)"
            )
        self._parts.append(
            (
                np.full(n, number, np.int32),
                np.asarray(facts["offsets"], np.int64),
                np.asarray(facts["labels"], np.float64),
                np.asarray(facts["sizes"], np.int64),
            )
        )

    def finish(self) -> None:
        columns: list[Sequence[np.ndarray]] = list(zip(*self._parts)) or [
            [np.zeros(0, t)] for t in ("i4", "i8", "f8", "i8")
        ]
        self.shard, self.offsets, self.labels, self.sizes = (np.concatenate(c) for c in columns)
        self._parts = []  # joined: let them go
        self.integral = bool(
            len(self.labels)
            and np.isfinite(self.labels).all()
            and (self.labels == np.round(self.labels)).all()
        )

    def __len__(self) -> int:
        return len(self.offsets)

    def where(self, i: int) -> str:
        """Say where image `i` is, for people: file name and byte offset."""
        return f"{os.path.basename(self.recs[self.shard[i]])} byte {int(self.offsets[i]):,}"

    def label(self, i: int) -> int | float:
        value = float(self.labels[i])
        return int(value) if self.integral else value


class Payloads:
    """Read image bytes and fingerprints from the shards (memory maps, opened once)."""

    def __init__(self, images: ImageTable) -> None:
        from ..reader import RecordFile

        self.images = images
        self.files = [RecordFile(rec) for rec in images.recs]

    def __enter__(self) -> Payloads:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.files:
            f.close()

    def image(self, i: int) -> bytes:
        """Return the image bytes of image `i` (labels and header stripped)."""
        from ..reader import unpack_header

        rec = self.files[self.images.shard[i]]
        offset = int(self.images.offsets[i])
        return bytes(unpack_header(rec.read_at(offset), rec.path, offset)[1])

    def fingerprints(self) -> np.ndarray:
        """Return an (n, 2) uint64 array: 8 bytes from the middle and the end of each image.

        Whole records are read in place, vectorised; split records are read one by one.
        """
        from ..inspect.scan import mapped
        from ..reader import (
            LENGTH_BITS,
            LENGTH_MASK,
        )

        images = self.images
        out = np.zeros((len(images), 2), np.uint64)
        spread = np.arange(8)
        for number, rec in enumerate(images.recs):
            rows = np.flatnonzero(images.shard == number)
            if not len(rows):
                continue
            offsets, sizes = images.offsets[rows], images.sizes[rows]
            with mapped(rec) as (buf, size):
                data = np.frombuffer(buf, np.uint8, size)
                words = np.frombuffer(buf, "<u4", size // 4)
                try:
                    lrec = words[offsets // 4 + 1].astype(np.int64)
                    end = offsets + 8 + (lrec & LENGTH_MASK)
                    fast = ((lrec >> LENGTH_BITS) == 0) & (sizes >= 8) & (end <= size)
                    for chunk in np.array_split(np.flatnonzero(fast), max(1, len(rows) // 65536)):
                        tail = data[(end[chunk] - 8)[:, None] + spread]
                        middle = data[(end[chunk] - sizes[chunk] // 2 - 4)[:, None] + spread]
                        out[rows[chunk], 0] = middle.copy().view("<u8")[:, 0]
                        out[rows[chunk], 1] = tail.copy().view("<u8")[:, 0]
                finally:
                    del data, words
            for j in np.flatnonzero(~fast & (sizes > 0)).tolist():
                # The same bytes the vectorised path takes, so that a split copy still matches.
                image = self.image(int(rows[j]))
                n = len(image)
                middle = image[n - n // 2 - 4 :][:8] if n >= 8 else image
                out[rows[j], 0] = int.from_bytes(middle.ljust(8, b"\0"), "little")
                out[rows[j], 1] = int.from_bytes(image[-8:].ljust(8, b"\0"), "little")
        return out
