"""A remote pack opened like a local one: `open_dataset("s3://bucket/faces.manifest.json")`.

`RemoteDataset` is the package's `PackDataset` over a local shard cache (`cache.ShardCache`):
the manifest is read from the store on every open (and kept, by its digest, in the cache
folder of this pack: `CACHE/packs/KEY/`). A pack with a binary index (format 3) has its index
arrays downloaded at open, each checked against the manifest's size and xxh3-128, and mapped
by the core as a local pack's are (every process and worker on the machine shares them); its
identity files are fetched when asked for. Each `.rec` is fetched on first use by
`CachedRecordFile`, which holds the shard (a shared lock) while it is mapped. A process keeps
at most `open_shards` shards mapped (the least recently opened is let go), so the cache can
evict what the readers have finished with.

A pack without a binary index (format 1 or 2) opens too, its index built in memory as
`PackDataset` builds it, from its `.idx` files and a few records of every shard: such an open
downloads every shard (in parallel, `prefetch_threads`), and so does its `labels`; `rectool
index` gives the pack its binary index. `Loader` takes its order from `rank_sampler`: the
streaming block order (`order.StreamingSampler`), whose next shards `ShardPrefetcher`
downloads on background threads, at most `prefetch_shards` not yet used.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import xxhash

from ..dataset.packs import PackDataset
from ..doors.inputs import read_regular
from ..doors.output import write_atomic
from ..format.digest import SHA256, XXH3_128, field_name
from ..format.manifest import read_manifest
from ..format.paths import INDEX_SUFFIXES
from ..reader import DEFAULT_MAX_PIXELS, INDEX_ARRAYS, MANIFEST_SUFFIX, RecordFile, RectoolError
from .cache import CachedObject, CacheFullError, ShardCache
from .order import StreamingSampler, first_uses
from .store import RemoteError, Retry, open_store, safe_url, split_url
from .transfer import Token, run_all, within

if TYPE_CHECKING:
    from .cache import Pin
    from .store import Store

CACHE_ENV = "RECTOOL_CACHE_DIR"
_lock = threading.Lock()  # this process's opening and letting go of shards
_AT_OPEN = {f"index.{name}" for name in INDEX_ARRAYS}  # the rest: fetched when asked for
# What a pickled `RemoteDataset` of a format-3 pack carries besides what `PackDataset` does.
_REMOTE_STATE = (
    "url", "store", "shard_cache", "block_shards", "prefetch_shards", "prefetch_threads",
    "_folder", "_objects", "_described", "_open_files",
)  # fmt: skip


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # one a parent thread held at the fork stays held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def default_cache_dir() -> str:
    """Return `$RECTOOL_CACHE_DIR`, else `$XDG_CACHE_HOME/rectool` (`~/.cache/rectool`)."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rectool")


def _holds(path: str, data: bytes) -> bool:
    """Return whether the file at `path` holds exactly `data` (a manifest: a few KB)."""
    try:
        held, _ = read_regular(path, "cached manifest", max_bytes=len(data))
    except (OSError, RectoolError):  # absent, or longer than `data`
        return False
    return held == data


def described_files(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Return the manifest's entries ({file, bytes, xxh3_128}) of the files of a pack beside
    its shards and `.idx` files, by field: format 3's index arrays ("index.offsets", ...,
    "index.identity_ranges") and identity names ("identities")."""
    if doc.get("format_version", 0) < 3:
        return {}
    index, named = doc.get("index") or {}, doc.get("identities")
    found = {f"index.{name}": index[name] for name in INDEX_SUFFIXES if index.get(name)}
    if isinstance(named, dict) and "file" in named:
        found["identities"] = named
    return found


def open_remote(
    url: str, decode: str | Callable[..., Any] | None = None, **options: Any
) -> RemoteDataset:
    """Open the pack whose manifest is at `url`; return a `RemoteDataset` (see its options)."""
    return RemoteDataset(url, decode, **options)


class _OpenShards:
    """The shards this process has mapped, most recent last; past `limit`, the oldest is let go."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.files: OrderedDict[int, CachedRecordFile] = OrderedDict()

    def __getstate__(self) -> dict[str, int]:
        return {"limit": self.limit}

    def __setstate__(self, state: dict[str, int]) -> None:
        _OpenShards.__init__(self, state["limit"])

    def opening(self, rf: CachedRecordFile) -> None:
        """Let go of the oldest shards until `rf` fits (before it is fetched: room in the cache)."""
        while len(self.files) >= self.limit and next(iter(self.files)) != id(rf):
            _, oldest = self.files.popitem(last=False)
            oldest.close()

    def opened(self, rf: CachedRecordFile) -> None:
        self.files[id(rf)] = rf
        self.files.move_to_end(id(rf))

    def closed(self, rf: CachedRecordFile) -> None:
        self.files.pop(id(rf), None)


class CachedRecordFile(RecordFile):
    """A shard of a remote pack: fetched into the cache and held there while it is mapped."""

    def __init__(
        self, path: str, obj: CachedObject, cache: ShardCache, shards: _OpenShards | None = None
    ) -> None:
        super().__init__(path)
        self.obj, self.cache, self.shards = obj, cache, shards
        self._pin: Pin | None = None
        self._opening = False

    def __reduce__(self) -> Any:  # no mapping, no pin: fetched again where it arrives
        return CachedRecordFile, (self.path, self.obj, self.cache, self.shards)

    def open(self) -> mmap.mmap | bytes:
        pin = self._pin
        if pin is not None and pin.fd is not None and pin.pid == os.getpid():
            return super().open()
        with _lock:
            if self.shards is not None:
                self.shards.opening(self)
            self._opening = True
            try:
                RecordFile.close(self)
                self._unpin()
                self._pin = self.cache.pin(self.obj)
                self._identity = None  # fetched again after an eviction: the same bytes
                mm = super().open()
            except BaseException:
                self._unpin()
                raise
            finally:
                self._opening = False
            if self.shards is not None:
                self.shards.opened(self)
        return mm

    def close(self) -> None:
        super().close()
        if not self._opening:  # RecordFile.open closes before it maps: keep the pin then
            self._unpin()
            if self.shards is not None:
                self.shards.closed(self)

    def _unpin(self) -> None:
        pin, self._pin = self._pin, None
        if pin is not None:
            pin.release()


class ShardPrefetcher:
    """Downloads `objects` in order on `threads` threads, at most `ahead` fetched and not yet
    used (a use sets a shard's modification time: `cache.Pin`). Errors are left to the reader,
    which fetches (and reports) by itself; `stop()` ends it."""

    def __init__(
        self, cache: ShardCache, objects: Iterable[CachedObject], ahead: int = 4, threads: int = 4
    ) -> None:
        self.cache, self.ahead = cache, max(1, ahead)
        self.errors: list[str] = []
        self._pending, self._stop = list(objects)[::-1], threading.Event()
        self._token = Token()  # cancelled by `stop`: downloads under way end at their next chunk
        self._thread = threading.Thread(
            target=self._run, args=(max(1, threads),), name="rectool-shard-prefetch", daemon=True
        )
        self._thread.start()

    def _run(self, threads: int) -> None:
        unused: dict[str, int] = {}  # path -> its last use (access time) at fetch
        running: dict[Future[str], CachedObject] = {}
        with ThreadPoolExecutor(threads, thread_name_prefix="rectool-fetch") as pool:
            while (self._pending or running) and not self._stop.is_set():
                for path, used_at in list(unused.items()):
                    try:
                        used = os.stat(path).st_atime_ns != used_at
                    except FileNotFoundError:
                        used = True  # evicted: not ours to wait for
                    if used:
                        del unused[path]
                while self._pending and len(unused) + len(running) < self.ahead:
                    obj = self._pending.pop()
                    running[pool.submit(self._fetch_one, obj)] = obj
                if not running:
                    self._stop.wait(0.02)  # until a reader uses a shard fetched ahead
                    continue
                done, _ = wait(running, timeout=0.05, return_when=FIRST_COMPLETED)
                for future in done:
                    obj = running.pop(future)
                    try:
                        future.result()
                        unused[obj.path] = os.stat(obj.path).st_atime_ns
                    except CacheFullError:  # try again once readers let shards go
                        self._pending.append(obj)
                        self._stop.wait(0.05)
                    except (RectoolError, OSError) as exc:
                        if not self._stop.is_set():  # stopped: cancelled, not failed
                            self.errors.append(str(exc))

    def _fetch_one(self, obj: CachedObject) -> str:
        return within(self._token, self._fit)(obj)

    def _fit(self, obj: CachedObject) -> str:
        return self.cache.fetch(obj, fit=True)

    def stop(self) -> None:
        self._stop.set()
        self._token.cancel()
        self._thread.join()

    def done(self) -> bool:
        return not self._thread.is_alive()


class RemoteDataset(PackDataset):
    """The samples of the remote pack whose manifest is at `url`, read through a shard cache.

    Options beyond `open_dataset`'s: `cache_dir` (default `default_cache_dir()`),
    `cache_limit` (bytes of files kept, shards and all; None: no bound), `retry` (a `store.Retry`),
    `block_shards` (shards per block of the streaming order), `prefetch_shards` (shards
    fetched ahead; default two blocks), `prefetch_threads`, `open_shards` (shards one process
    keeps mapped; default a block), `store` (one of `store`'s, for tests), `clock`.
    """

    _files: list[CachedRecordFile]  # type: ignore[assignment]  # _open_shard makes them

    def __init__(
        self,
        url: str,
        decode: str | Callable[..., Any] | None = None,
        layout: str | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        *,
        cache_dir: str | None = None,
        cache_limit: int | None = None,
        retry: Retry | None = None,
        block_shards: int = 4,
        prefetch_shards: int | None = None,
        prefetch_threads: int = 8,
        open_shards: int | None = None,
        store: Store | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        folder_url, name = split_url(url)
        self.url = safe_url(url)
        if not name.endswith(MANIFEST_SUFFIX):
            raise RemoteError(f"{self.url}: give the URL of a pack's manifest (*{MANIFEST_SUFFIX})")
        self.store = store or open_store(folder_url)
        retry = retry or Retry()
        self.shard_cache = ShardCache(cache_dir or default_cache_dir(), cache_limit, clock, retry)
        self.block_shards = block_shards
        self.prefetch_shards = prefetch_shards or 2 * block_shards
        self.prefetch_threads = prefetch_threads
        self._prefetcher: ShardPrefetcher | None = None
        data = retry.call(lambda: self.store.read(name), self.url)
        key = xxhash.xxh3_64_hexdigest(self.url.encode() + b"\0" + data)
        self._folder = self.shard_cache.pack_folder(key)
        local = os.path.join(self._folder, name)
        if not _holds(local, data):  # absent, or changed in the cache since: written again
            write_atomic(local, data)
        doc = read_manifest(local)
        self._objects: dict[str, CachedObject] = {}  # each shard's .rec, by its cache path
        for i, shard in enumerate(doc["shards"]):
            obj = self._shard_object(i, shard, "rec")
            self._objects[obj.path] = obj
        # The binary index (format 3): its arrays, checked, before the core maps them.
        self._described = {
            field: self._file_object(field, entry) for field, entry in described_files(doc).items()
        }
        self._fetch_index()
        self._open_files = _OpenShards(open_shards or block_shards)
        super().__init__(local, decode, layout, max_pixels)

    def _shard_object(self, i: int, shard: Mapping[str, Any], kind: str) -> CachedObject:
        """Return the `CachedObject` of shard `i`'s `kind` file ("rec", "idx")."""
        name, size = shard[kind], shard.get(f"{kind}_bytes")
        for algorithm in (XXH3_128, SHA256):
            digest = shard.get(field_name(kind, algorithm))
            if digest:
                break
        else:
            raise RemoteError(
                f"{self.url}: shard {i} ({name}) has no digest in the manifest; a remote pack "
                "needs one to check each download (pack it with rectool 0.1 or later)"
            )
        if size is None and kind == "rec":
            raise RemoteError(f"{self.url}: shard {i} ({name}) has no rec_bytes in the manifest")
        what = f"{self.store.object_url(name)} (shard {i} of {os.path.basename(self.url)})"
        path = os.path.join(self._folder, name)
        return CachedObject(self.store, name, path, size or 0, algorithm, digest, what)

    def _file_object(self, field: str, entry: Mapping[str, Any]) -> CachedObject:
        """Return the `CachedObject` of a file the manifest names at `field` ({file, bytes,
        xxh3_128}: the index arrays, the identity names)."""
        name, size, digest = entry["file"], entry.get("bytes"), entry.get("xxh3_128")
        if size is None or not digest:
            raise RemoteError(
                f"{self.url}: the manifest gives no bytes or xxh3_128 of {field} ({name}); a "
                "remote pack needs both to check the download (write them with `rectool index`)"
            )
        what = f"{self.store.object_url(name)} ({field} of {os.path.basename(self.url)})"
        path = os.path.join(self._folder, name)
        return CachedObject(self.store, name, path, size, XXH3_128, digest, what)

    def _fetch(self, objects: Iterable[CachedObject]) -> None:
        """Make sure `objects` are in the cache, checked (downloading them in parallel)."""
        run_all(self.shard_cache.fetch, objects, self.prefetch_threads)

    def _fetch_index(self) -> None:
        self._fetch(obj for field, obj in self._described.items() if field in _AT_OPEN)

    def _build_index(self) -> None:
        # A pack without a binary index (format 1 or 2, or opened in another layout): its
        # .idx files, and a few records of every shard (`index_shards` checks each shard
        # against its .idx), so every shard is downloaded, on `prefetch_threads` threads.
        shards = cast(dict[str, Any], self.manifest)["shards"]  # (a remote pack's: never None)
        self._fetch(self._shard_object(i, shard, "idx") for i, shard in enumerate(shards))
        recs = [self._objects[rec] for rec, _ in self.shards]
        prefetcher = ShardPrefetcher(
            self.shard_cache, recs, self.prefetch_shards, self.prefetch_threads
        )
        try:
            super()._build_index()
        finally:
            prefetcher.stop()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if state.get("reopen"):  # the core maps the cached index again on arrival
            state["remote"] = {k: self.__dict__[k] for k in _REMOTE_STATE}
            del state["_files"]  # shards of the cache, each mapped again from it
        state["_prefetcher"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if not state.get("reopen"):
            self.__dict__.update(state)
            return
        self.__dict__.update(state["remote"], _prefetcher=None)
        self._fetch_index()
        PackDataset.__init__(
            self, state["_source"], state["decode"], state["_layout_arg"], state["max_pixels"]
        )

    def _open_shard(self, rec: str) -> CachedRecordFile:
        return CachedRecordFile(rec, self._objects[rec], self.shard_cache, self._open_files)

    def __repr__(self) -> str:
        return (
            f"RemoteDataset({self.url!r}, {len(self.shards)} shards, {len(self)} samples, "
            f"layout={self.layout!r}, decode={self.decode!r}, cache={self.shard_cache.folder!r})"
        )

    # -- the order, and the shards it needs next -------------------------------------------

    def rank_sampler(
        self,
        size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> StreamingSampler:
        """Return the `Loader`'s sampler: `StreamingSampler`, prefetching what it reads next."""
        if size != len(self):
            raise ValueError(f"a sampler of {size} samples for a dataset of {len(self)}")
        return StreamingSampler(
            self.shard_ids,
            rank,
            world_size,
            shuffle,
            seed,
            drop_last,
            self.block_shards,
            on_order=self.prefetch,
        )

    def prefetch(self, order: np.ndarray) -> ShardPrefetcher:
        """Start fetching the shards that the samples `order` need, in the order they need them
        (the fetch of an earlier order is stopped)."""
        self.stop_prefetch()
        files = [self._files[s] for s in first_uses(self.shard_ids, order)]
        self._prefetcher = ShardPrefetcher(
            self.shard_cache,
            [rf.obj for rf in files],
            self.prefetch_shards,
            self.prefetch_threads,
        )
        return self._prefetcher

    def stop_prefetch(self) -> None:
        """Stop fetching ahead."""
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None

    # -- labels: mapped from the binary index; else read from every shard's headers ---------

    @property
    def labels(self) -> np.ndarray:
        if self._labels is None:  # no binary index: every shard, in reading order
            self.prefetch(np.arange(len(self)))
            try:
                self._labels = super().labels
            finally:
                self.stop_prefetch()
                self.close()  # let the shards go: the cache may need the room
        return cast(np.ndarray, self._labels)  # set by `PackDataset.labels` at the latest

    # -- what is read only when asked for: fetched then ---------------------------------------

    @property
    def identity_ranges(self) -> np.ndarray | None:
        if self._identity_ranges is None and self._ranges_file is not None:
            self._fetch([self._described["index.identity_ranges"]])
        return super().identity_ranges

    @property
    def identities(self) -> dict[int, str] | None:
        if "identities" in self._described:
            self._fetch([self._described["identities"]])
        return super().identities
