"""Write the .idx sidecar cache (`<idx>.rtc`) that the reader only reads.

The format (header, then int64 keys and offsets, which readers map in place) is defined in
`rectool.reader`, which reads versions 2 and 3; this module is the one writer (version 3):
`pack` calls it for large shards, `rectool index-cache` for packs made by others
(insightface's train.idx, im2rec's).
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING

import numpy as np

from ..doors.inputs import open_input
from ..doors.output import write_atomic
from ..errors import RectoolError
from ..reader import (
    INDEX_CACHE_HEADER,
    INDEX_CACHE_MAGIC,
    index_cache_path,
    index_sample_crc,
    load_index,
    resolve_source,
)

if TYPE_CHECKING:
    from _typeshed import StrPath

    from ..reader import Source

# Parsing a small index is instant; caching it would only litter the dataset folder.
INDEX_CACHE_MIN_RECORDS = 100_000


def write_index_cache(
    idx_path: StrPath,
    keys: np.ndarray,
    offsets: np.ndarray,
    st: os.stat_result | None = None,
    data: bytes | None = None,
) -> bool:
    """Write the sidecar cache for an .idx; return False when the folder is not writable.

    Version 3 (`INDEX_CACHE_MAGIC`): the header carries the CRC-32 of the whole .idx and of
    the sample of it that readers check (`index_sample_crc`). `data`, the .idx bytes when the
    caller has them, saves reading the file for its CRC. The cache is written to a fresh
    temporary (never following a planted name) and renamed.
    """
    st = st or os.stat(idx_path)
    final = index_cache_path(idx_path)
    with open_input(idx_path, "index file") as f:
        sample = index_sample_crc(f.fileno(), st.st_size)
        if data is not None:
            crc = zlib.crc32(data)
        else:
            crc = 0
            while block := f.read(1 << 24):
                crc = zlib.crc32(block, crc)
    head = INDEX_CACHE_HEADER.pack(
        INDEX_CACHE_MAGIC, st.st_size, st.st_mtime_ns, len(keys), crc, sample
    )
    body = (
        head,
        np.ascontiguousarray(keys, np.int64).tobytes(),
        np.ascontiguousarray(offsets, np.int64).tobytes(),
    )
    try:
        write_atomic(final, body)
    except RectoolError:
        return False  # a read-only dataset folder is normal; the cache only saves time
    return True


def write_index_caches(target: Source) -> list[str]:
    """Write the sidecar cache of every shard of a dataset; return the cache paths written.

    `target` is what `open_dataset` takes. Raises `RectoolError` when a folder is not
    writable or an .idx cannot be parsed.
    """
    _, _, shards = resolve_source(target)
    written = []
    for _, idx in shards:
        keys, offsets = load_index(idx, cache=False)
        if not write_index_cache(idx, keys, offsets):
            raise RectoolError(f"{index_cache_path(idx)}: cannot write the index cache")
        written.append(index_cache_path(idx))
    return written
