"""A whole copy of a remote pack on local disk, for `verify`, `info`, `report` and `repack`.

Every file the manifest names (shards, `.idx` files, checksum files, the binary index's
arrays, the identity names, the failures file) is downloaded, retried and resumed as the
cache's downloads are, into `CACHE/mirror/KEY/`, and the commands run on that folder as on
any local pack. `verify` must see a damaged shard to report it, so the copy takes the bytes as
they are; `repack`, which must not copy damaged bytes into a new pack, asks for them checked
against the manifest's digests (`check`). The shard cache, which takes only checked shards, is
never filled from here.

A copy counts against a shard cache's `cache_limit` and may be evicted whole (`cache.py`),
but never while it is in use: `local_copy` holds `mirror/KEY.lock` shared from before it
writes the copy until `release_copy` or the end of the process (a command uses its copy
until it exits), and dates the folder `mirror/KEY/` (the least recently used copy goes
first). A file already in the copy is checked against the manifest (its size, and its
digest) before it is used: one damaged in the cache is downloaded again, with a warning
naming the cache file, and never reported as the bucket's fault.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import xxhash

from ..doors.output import make_folders, remove, set_mtime, write_atomic
from ..errors import RectoolError
from ..format.digest import DIGEST_NAMES, SHA256, XXH3_128, digests_of, field_name, file_hexdigest
from ..format.manifest import read_manifest
from ..reader import MANIFEST_SUFFIX
from .store import NotFoundError, RemoteError, Retry, is_url, open_store, safe_url, split_url
from .transfer import run_all

if TYPE_CHECKING:
    from _typeshed import StrPath

# (object name, size or None: read whole, digest algorithm, digest) of a file to copy.
_Wanted = tuple[str, int | None, str | None, str | None]


def local_copy(
    url: str,
    cache_dir: StrPath | None = None,
    retry: Retry | None = None,
    threads: int = 8,
    check: bool = False,
) -> str:
    """Download the pack whose manifest is at `url`; return the local manifest's path.

    `check`: every file the manifest gives a digest of (shards, `.idx` and checksum files,
    the binary index, the identity names) is checked against it, downloaded or already
    there, and a mismatch is refused (`DigestMismatchError`, naming the URL): for commands
    that write what they read.
    """
    # Here, not at the top: `local_source` of a local path needs none of the download code.
    from .cache import CachedObject, DigestMismatchError, ShardCache
    from .dataset import default_cache_dir, described_files

    folder_url, name = split_url(url)
    if not name.endswith(MANIFEST_SUFFIX):
        raise RemoteError(
            f"{safe_url(url)}: give the URL of a pack's manifest (*{MANIFEST_SUFFIX})"
        )
    retry, store = retry or Retry(), open_store(folder_url)
    data = retry.call(lambda: store.read(name), safe_url(url))
    cache = ShardCache(cache_dir or default_cache_dir(), None, retry=retry)
    key = xxhash.xxh3_64_hexdigest(safe_url(url).encode() + b"\0" + data)
    mirror = os.path.join(cache.folder, "mirror")
    make_folders(mirror)
    folder = os.path.join(mirror, key)
    _hold(folder)  # first: an evictor never removes the folder this is writing
    make_folders(folder)
    local = os.path.join(folder, name)
    write_atomic(local, data)
    doc = read_manifest(local)
    wanted: list[_Wanted] = [
        (s[kind], s.get(f"{kind}_bytes"), *_digest(s, kind))
        for s in doc["shards"]
        for kind in ("rec", "idx", "crc")
        if s.get(kind)
    ]
    wanted += [_file(entry) for entry in described_files(doc).values()]
    if doc.get("failures_file"):
        wanted.append((doc["failures_file"], None, None, None))

    def fetch(item: _Wanted) -> None:
        object_name, size, algorithm, digest = item
        if not check:
            algorithm = digest = None
        path = os.path.join(folder, object_name)
        what = store.object_url(object_name)
        if size is None:  # not listed: read whole
            try:
                data = retry.call(lambda: store.read(object_name), what)
            except NotFoundError:
                return  # a missing checksum or failures file: verify reports it
            if algorithm and digests_of(data, [algorithm])[algorithm] != digest:
                raise DigestMismatchError(
                    f"{what}: its {DIGEST_NAMES[algorithm]} differs from the manifest's: the "
                    "object was changed or damaged after packing; it is not used"
                )
            write_atomic(path, data)
            return
        obj = CachedObject(store, object_name, path, size, algorithm, digest, what)
        if os.path.exists(path):
            if _intact(path, size, *_digest_of(item)):
                return
            # Damaged here, not in the bucket (or in the bucket too: the new download says):
            # fetched again, never reported as the object's fault.
            _log.warning(
                "%s: the cached copy of %s differs from the manifest; downloading it again",
                path,
                what,
            )
            remove(path)
        cache.download(obj)

    run_all(fetch, wanted, threads)
    return local


_log = logging.getLogger("rectool.remote")


def _digest_of(item: _Wanted) -> tuple[str | None, str | None]:
    return item[2], item[3]


def _intact(path: str, size: int, algorithm: str | None, digest: str | None) -> bool:
    """Return whether the copy at `path` is what the manifest describes: its size, and its
    digest when the manifest gives one (read whole: `verify` would read it anyway)."""
    if os.path.getsize(path) != size:
        return False
    return not algorithm or file_hexdigest(path, algorithm) == digest


_held: dict[str, int] = {}  # copy folder -> the descriptor of its lock, held shared


def _hold(folder: str) -> None:
    """Hold the copy at `folder` (its lock shared) until `release_copy` or the end of the
    process, and date its use (the folder's modification time), for the cache's LRU."""
    from .cache import LOCK_SUFFIX, acquire  # here: see local_copy

    if folder not in _held:
        if not _held:
            atexit.register(_release_all)
        # only an evictor's brief hold can delay this
        _held[folder] = acquire(folder + LOCK_SUFFIX, fcntl.LOCK_SH)
    set_mtime(folder, time.time_ns())


def release_copy(local_manifest: StrPath) -> None:
    """Let go of the copy `local_copy` returned `local_manifest` of: evictable from now."""
    _let_go(os.path.dirname(os.fspath(local_manifest)))


def _let_go(folder: str) -> None:
    fd = _held.pop(folder, None)
    if fd is not None:
        from .cache import LOCK_SUFFIX, let_go  # here: see local_copy

        set_mtime(folder, time.time_ns())
        let_go(fd, folder + LOCK_SUFFIX)


def _release_all() -> None:
    """Let go of every copy this process holds (at its exit: no lock file left behind)."""
    for folder in list(_held):
        try:
            _let_go(folder)
        except (OSError, RectoolError):
            pass  # a lock file left is harmless: the next holder removes it


def _digest(shard: Mapping[str, Any], kind: str) -> tuple[str | None, str | None]:
    """Return (algorithm, digest) the manifest gives for `kind` ("rec", ...) of `shard`."""
    for algorithm in (XXH3_128, SHA256):
        if shard.get(field_name(kind, algorithm)):
            return algorithm, shard[field_name(kind, algorithm)]
    return None, None


def _file(entry: Mapping[str, Any]) -> _Wanted:
    digest = entry.get("xxh3_128")
    return entry["file"], entry.get("bytes"), XXH3_128 if digest else None, digest


def local_source(source: StrPath, cache_dir: StrPath | None = None, check: bool = False) -> StrPath:
    """Return `source` itself, or, when it is a URL, the local manifest of its copy
    (`local_copy`, with `check`)."""
    if isinstance(source, str) and is_url(source):
        return local_copy(source, cache_dir, check=check)
    return source
