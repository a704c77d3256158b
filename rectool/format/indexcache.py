"""Write the .idx sidecar caches that the reader only reads: one shard's (`<idx>.rtc`) and a
pack of several shards' (`PREFIX.idx.rtc`, all their keys and offsets in one file).

The formats (a header, then int64 keys and offsets, which readers map in place) are defined in
`rectool.reader`, which reads shard caches of versions 2 and 3; this module is the one writer:
`pack` and `repack` call it for large shards and packs, `rectool index-cache` for packs made
by others (insightface's train.idx, im2rec's).
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..doors.inputs import open_input
from ..doors.output import remove, write_atomic
from ..errors import RectoolError
from ..reader import (
    DATASET_CACHE_HEADER,
    DATASET_CACHE_MAGIC,
    DATASET_CACHE_SHARD,
    INDEX_CACHE_HEADER,
    INDEX_CACHE_MAGIC,
    MANIFEST_SUFFIX,
    dataset_cache_path,
    index_cache_path,
    index_sample_crc,
    load_index,
    parse_index_stream,
    read_dataset_cache,
    read_index_cache,
    resolve_source,
    source_prefixes,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from _typeshed import StrPath

    from ..reader import Source

# Parsing a small index is instant; caching it would only litter the dataset folder.
INDEX_CACHE_MIN_RECORDS = 100_000


def wants_dataset_cache(shards: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a pack whose manifest lists `shards` gets one index cache of them all: several
    shards, and `INDEX_CACHE_MIN_RECORDS` records or more in all."""
    return len(shards) > 1 and sum(s.get("records") or 0 for s in shards) >= INDEX_CACHE_MIN_RECORDS


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


def write_dataset_cache(manifest_path: str, idx_paths: Sequence[str]) -> bool:
    """Write the index cache of a pack of several shards (`PREFIX.idx.rtc`, all keys and then
    all offsets, in the order the manifest lists the shards); return False when the folder is
    not writable.

    Each shard's .idx is read once, from its own cache when that is current. Readers check
    every .idx's size, time and sample CRC against the header, so a rebuilt .idx retires it.
    """
    if _clashes(manifest_path, idx_paths):  # the name is a shard's cache's
        return False
    entries, indexes = [], []
    for idx in idx_paths:
        with open_input(idx, "index file") as f:
            st = os.fstat(f.fileno())
            cached = read_index_cache(idx, st, f.fileno())
            keys, offsets = parse_index_stream(f, idx) if cached is None else cached
            sample = index_sample_crc(f.fileno(), st.st_size)
        entries.append(DATASET_CACHE_SHARD.pack(st.st_size, st.st_mtime_ns, len(keys), sample))
        indexes.append((keys, offsets))

    def body() -> Iterator[bytes]:
        records = sum(len(keys) for keys, _ in indexes)
        yield DATASET_CACHE_HEADER.pack(DATASET_CACHE_MAGIC, len(indexes), records)
        yield b"".join(entries)
        for column in (0, 1):
            for index in indexes:
                yield np.ascontiguousarray(index[column], np.int64).tobytes()

    try:
        write_atomic(dataset_cache_path(manifest_path), body())
    except RectoolError:
        return False
    return True


class IndexCaches(NamedTuple):
    """What `write_index_caches` did: the caches it wrote, and those it found current and left
    as they were (every one of both is current now)."""

    written: list[str]
    kept: list[str]

    def to_json(self) -> dict[str, list[str]]:
        return {"caches": self.written + self.kept, "written": self.written, "kept": self.kept}


def write_index_caches(target: Source) -> IndexCaches:
    """Write the sidecar cache of every shard of a dataset, and for a pack of several shards
    its dataset cache, where they are not current.

    A cache that is current (this version, and the same keys and offsets as the .idx text) is
    left as it is: a job that maps it, and pickles its dataset to new workers, keeps working.
    A pack whose first shard's cache would have the dataset cache's name (a manifest listing
    PREFIX.rec and PREFIX.idx) gets no dataset cache. `target` is what `open_dataset` takes.
    Raises `RectoolError` when a folder is not writable or an .idx cannot be parsed.
    """
    _, manifest_path, shards = resolve_source(target)
    done = IndexCaches([], [])
    for _, idx in shards:
        keys, offsets = load_index(idx, cache=False)
        if _same(read_index_cache(idx), keys, offsets) and _current_version(idx):
            done.kept.append(index_cache_path(idx))
            continue
        if not write_index_cache(idx, keys, offsets):
            raise RectoolError(f"{index_cache_path(idx)}: cannot write the index cache")
        done.written.append(index_cache_path(idx))
    if len(shards) > 1 and (manifest_path or "").endswith(MANIFEST_SUFFIX):
        assert manifest_path is not None
        path, idx_paths = dataset_cache_path(manifest_path), [idx for _, idx in shards]
        if _clashes(manifest_path, idx_paths):
            return done
        mapped = read_dataset_cache(manifest_path, idx_paths)
        if mapped is not None and _same_split(mapped[2], idx_paths):
            done.kept.append(path)
        elif write_dataset_cache(manifest_path, idx_paths):
            done.written.append(path)
        else:
            raise RectoolError(f"{path}: cannot write the index cache")
    return done


def rewrite_stale_caches(
    idx_path: str,
    rec_path: str,
    had_cache: bool,
    index: tuple[np.ndarray, np.ndarray],
    data: bytes,
) -> list[str]:
    """Write again the caches that the rewriting of `idx_path` (by `rectool reindex`, the
    index of the shard `rec_path`) made stale; return those written. `index` is its keys and
    offsets in file order and `data` its bytes, as just written: not read again.

    Its own cache, where it had one or has INDEX_CACHE_MIN_RECORDS records or more (otherwise,
    or in a read-only folder, the stale one is removed; a pack's cache at its name, that of
    an .idx named PREFIX.idx beside a pack of several shards, is left alone). Where
    `idx_path` is the index a pack of several shards lists for `rec_path`, and that pack has
    its one cache, that cache too: a rebuilt .idx, even one byte-identical to the old, has a
    new mtime, which retires every cache made of it, and at WebFace42M's size a pack read
    without its cache holds its index in every worker.
    """
    written = []
    cache = index_cache_path(idx_path)
    keys, offsets = index
    if _is_dataset_cache(cache):
        pass  # `-o PREFIX.idx` beside a pack of several shards: the name is that pack's cache
    elif (had_cache or len(keys) >= INDEX_CACHE_MIN_RECORDS) and write_index_cache(
        idx_path, keys, offsets, data=data
    ):
        written.append(cache)
    else:
        remove(cache)
    for prefix in source_prefixes(rec_path):
        manifest_path = prefix + MANIFEST_SUFFIX
        if not os.path.exists(dataset_cache_path(manifest_path)):
            continue
        try:
            _, _, shards = resolve_source(manifest_path)
            idx_paths = [idx for _, idx in shards]
            if not any(_same_file(idx, idx_path) for idx in idx_paths):
                continue
            if len(shards) > 1 and write_dataset_cache(manifest_path, idx_paths):
                written.append(dataset_cache_path(manifest_path))
        except RectoolError:  # a pack that cannot be read keeps its stale cache, unused
            continue
    return written


def _is_dataset_cache(path: str) -> bool:
    """Whether `path` holds the index cache of a pack of several shards."""
    try:
        with open_input(path, "index cache", follow=False) as f:
            return f.read(len(DATASET_CACHE_MAGIC)) == DATASET_CACHE_MAGIC
    except RectoolError:  # none there (or not a file): no pack's cache to keep
        return False


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _clashes(manifest_path: str, idx_paths: Sequence[str]) -> bool:
    """Whether a shard's own cache would have the name of the pack's dataset cache."""
    return dataset_cache_path(manifest_path) in {index_cache_path(idx) for idx in idx_paths}


def _same_split(shards: list[tuple[np.ndarray, np.ndarray]], idx_paths: list[str]) -> bool:
    """Whether a dataset cache's shards (`read_dataset_cache`'s views) hold each shard's keys
    and offsets (read from the shards' caches, current by now: mapped, not copied)."""
    return all(_same(view, *load_index(idx)) for view, idx in zip(shards, idx_paths))


def _same(
    cached: tuple[np.ndarray, np.ndarray] | None, keys: np.ndarray, offsets: np.ndarray
) -> bool:
    """Whether a cache's arrays (None: no current cache) hold these keys and offsets."""
    return cached is not None and all(map(np.array_equal, cached, (keys, offsets)))


def _current_version(idx: str) -> bool:
    """Whether the shard cache of `idx` is of the version this module writes."""
    with open_input(index_cache_path(idx), "index cache", follow=False) as f:
        return f.read(len(INDEX_CACHE_MAGIC)) == INDEX_CACHE_MAGIC
