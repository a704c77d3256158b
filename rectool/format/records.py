"""Records by key and in file order: what rectool's own commands need beyond the reader."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..reader import RecordFile, RectoolError
from .paths import PackPaths
from .textindex import load_index
from .window import WINDOW_BYTES, Release, release_range

if TYPE_CHECKING:
    from _typeshed import StrPath


class IndexedRecordFile:
    """A .rec with its .idx: records by key (a repeated key's last line wins, as in MXNet)."""

    def __init__(self, rec_path: StrPath, idx_path: StrPath | None = None) -> None:
        self.rec = RecordFile(rec_path)
        self.idx_path = os.fspath(idx_path or PackPaths.idx_beside(self.rec.path))
        self.keys, self.offsets = load_index(self.idx_path)
        self._lookup: dict[int, int] | None = None

    def __enter__(self) -> IndexedRecordFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.keys)

    def close(self) -> None:
        """Release the mapping of the .rec."""
        self.rec.close()

    def read(self, key: int) -> bytes:
        """Return the record stored under `key` (bytes)."""
        if self._lookup is None:
            self._lookup = dict(zip(self.keys.tolist(), self.offsets.tolist()))
        if key not in self._lookup:
            raise RectoolError(f"{self.idx_path}: key {key} is not in the index")
        return self.rec.read_parts(self._lookup[key], key)[0]

    def read_at_position(self, i: int) -> bytes:
        """Return the record of the i-th line of the index (bytes)."""
        return self.rec.read_parts(int(self.offsets[i]), int(self.keys[i]))[0]


def iter_records(
    records: RecordFile, start: int = 0, release: Release = release_range
) -> Iterator[tuple[int, bytes]]:
    """Yield (offset, record) for every record of a .rec from byte `start` on, in file order.

    The pages read are handed back (`release(mapping, lo, hi)`) a window (`WINDOW_BYTES`) at
    a time behind the walk, and at its end, so that a walk over a whole pack holds one window
    of it, not the file."""
    mapping, released = records.open(), start
    try:
        while start < len(mapping):
            record, after = records.read_parts(start)
            yield start, record
            start = after
            if start - released >= WINDOW_BYTES:
                release(mapping, released, start)
                released = start
    finally:
        if start > released:
            release(mapping, released, start)
