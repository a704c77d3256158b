"""A whole copy of a remote pack on local disk, bytes as they are, for `verify` and `info`.

`verify` must see a damaged shard to report it, so this copy checks nothing on the way in
(the shard cache refuses what does not match its digest, and is never filled from here): every
file the manifest names (shards, indexes, checksum files, the failures file) is downloaded,
retried and resumed as the cache's downloads are, into `CACHE/mirror/KEY/`, and the commands
run on that folder as on any local pack.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import xxhash

from ..doors.output import make_folders, write_atomic
from ..reader import MANIFEST_SUFFIX, read_manifest
from .cache import CachedObject, ShardCache
from .dataset import default_cache_dir
from .store import RemoteError, Retry, open_store, safe_url, split_url


def local_copy(url, cache_dir=None, retry=None, threads=8):
    """Download the pack whose manifest is at `url`; return the local manifest's path."""
    folder_url, name = split_url(url)
    if not name.endswith(MANIFEST_SUFFIX):
        raise RemoteError(
            f"{safe_url(url)}: give the URL of a pack's manifest (*{MANIFEST_SUFFIX})"
        )
    retry, store = retry or Retry(), open_store(folder_url)
    data = retry.call(lambda: store.read(name), safe_url(url))
    cache = ShardCache(cache_dir or default_cache_dir(), None, retry=retry)
    key = xxhash.xxh3_64_hexdigest(safe_url(url).encode() + b"\0" + data)
    folder = os.path.join(cache.folder, "mirror", key)
    make_folders(folder)
    local = os.path.join(folder, name)
    write_atomic(local, data)
    doc = read_manifest(local)
    wanted = [(s[kind], s.get(f"{kind}_bytes")) for s in doc["shards"] for kind in ("rec", "idx")]
    wanted += [(s["crc"], None) for s in doc["shards"] if s.get("crc")]
    if doc.get("failures_file"):
        wanted.append((doc["failures_file"], None))

    def fetch(item):
        object_name, size = item
        path = os.path.join(folder, object_name)
        what = store.object_url(object_name)
        if size is None:  # not listed: read whole
            try:
                write_atomic(path, retry.call(lambda: store.read(object_name), what))
            except RemoteError:
                return  # a missing checksum or failures file: verify reports it
            return
        obj = CachedObject(store, object_name, path, size, None, None, what)
        if not (os.path.exists(path) and os.path.getsize(path) == size):
            cache.download(obj)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fetch, wanted))
    return local
