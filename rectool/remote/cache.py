"""The local shard cache: remote shards downloaded whole, checked, shared by every process.

    cache = ShardCache("/scratch/rectool-cache", limit=200 << 30)
    pin = cache.pin(obj)        # present, digest-checked, and held: never evicted while held
    ...                         # map obj.path
    pin.release()

- **Whole and checked, or absent.** A shard is downloaded under a temporary name beside its
  final one (`doors.output.stage_file`), its digest (the manifest's xxh3-128, or SHA-256 for a
  version-1 manifest) computed as the bytes arrive; only a shard whose digest matches is
  renamed into place. A transfer cut or damaged is never used: a cut one is resumed by range
  (`store.Retry.stream`), a mismatched one is removed and refused, naming the URL and shard.
- **Checked again before use.** A cached shard is used only if its size is the manifest's
  and its digest matches: read whole the first time a process uses it, and again whenever
  the file changed since (`ShardCache.intact`). One that differs is downloaded again (a
  warning names the cache file), never read.
- **Once per machine.** Each shard has two locks beside it: a reader holds `NAME.rec.lock`
  shared (`flock`) while the shard is mapped, and an evictor must take it exclusive; whoever
  downloads holds `NAME.rec.download` exclusive, so processes (Loader workers, ranks,
  prefetch threads) that want the same shard wait for that one download instead of starting
  their own. Two locks, because one lock converted from shared to exclusive deadlocks: a
  waiting downloader would wait for ever on a reader's shared hold. A lock's file exists
  only while it is held: the last to let it go removes it (`let_go`, `acquire`).
- **Bounded.** With `limit` (bytes), room for a download is made first, under the cache's own
  lock (`.cache.lock`), by removing the shards used least recently (a shard's modification time
  is set when it is released: when it was last used); a shard whose lock anyone holds is never
  removed. When every cached shard is held the limit is passed rather than a reader failed.
  Every file of the cache's packs counts against the limit (shards, index arrays, identity
  names, `.idx` files, manifests, downloads under way); only `.rec` shards are evicted, the
  small files that describe a pack stay.
- **Copies too.** The whole copies of `mirror/KEY/` (`mirror.py`) count against the limit as
  well, and are evicted whole, least recently used first among the shards, each dated and
  held by its `mirror/KEY.lock` as a shard by its lock: a copy a command reads is never
  evicted.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple

from ..doors.output import (
    make_folders,
    open_lock_file,
    remove,
    remove_tree,
    rename,
    set_used,
    stage_file,
)
from ..format.digest import DIGEST_NAMES, Digests, file_hexdigest
from .fetch import download_elsewhere
from .store import RemoteError, Retry
from .transfer import run

if TYPE_CHECKING:
    from _typeshed import StrPath

    from .store import Store

LOCK_SUFFIX = ".lock"  # held shared by readers, exclusive by an evictor
DOWNLOAD_SUFFIX = ".download"  # held exclusive by whoever downloads the shard
CACHE_LOCK = ".cache.lock"
_log = logging.getLogger("rectool.remote")


class DigestMismatchError(RemoteError):
    """A downloaded object whose bytes are not the ones its manifest describes."""


class CacheFullError(RemoteError):
    """No room for an object that was only wanted ahead of time (`ShardCache.prefetch`)."""


class CachedObject(NamedTuple):
    """One remote object and where its checked copy lives in the cache."""

    store: Store  # a store of `rectool.remote.store`
    name: str  # the object's name in the store
    path: str  # its path in the cache
    size: int  # bytes, from the manifest
    algorithm: str | None  # "xxh3-128" or "sha256"; None: take the bytes as they come
    digest: str | None
    what: str  # how errors name it: "URL (shard 3 of faces.manifest.json)"


def _unlock(fd: int) -> None:
    """Unlock and close `fd`. Unlocked first: a child forked meanwhile has a copy of the
    descriptor, which would otherwise keep the lock held for as long as it lives."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def acquire(path: str, how: int) -> int:
    """Return a descriptor of the lock file at `path` (created if absent) locked `how`
    (`fcntl.LOCK_SH` or `LOCK_EX`, `| LOCK_NB`: `BlockingIOError` when held).

    Whoever lets a lock go last removes its file (`let_go`), so a lock taken on a file
    removed meanwhile is no lock: it is let go and the file at `path` locked instead."""
    while True:
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, how)
            same = _same_file(fd, path)
        except BaseException:  # an interruption too: no descriptor left holding the lock
            os.close(fd)
            raise
        if same:
            return fd
        _unlock(fd)


def let_go(fd: int, path: str) -> None:
    """Unlock and close `fd`, the lock taken on `path` by `acquire`; remove the lock file
    unless another descriptor holds it (the cache keeps no empty files once it is idle).
    The file is removed while held exclusively, and `acquire` checks what it locked, so no
    one ever holds a lock on a file that is gone."""
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held by someone else: the last of them removes it
        else:
            if _same_file(fd, path):
                remove(path)
    finally:
        _unlock(fd)


# What this process knows of the cached files it checked: path -> (device, inode, size,
# mtime) when their digest matched. A write to the file changes its mtime, so a file whose
# stamp is unchanged need not be read again (see `ShardCache.intact`). A use is dated in the
# access time (`doors.set_used`), which leaves the stamp alone: other processes' uses never make a
# process read a shard whole again (they did when a use set the mtime: every batch of a
# Loader's workers re-read every shard, a first epoch from S3 at 0.6 of local speed).
_checked: dict[str, tuple[int, ...]] = {}


def _stamp(path: str) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class Pin:
    """A shard held (its lock shared) by this process: never evicted until released."""

    def __init__(self, fd: int, path: str, clock: Callable[[], int]) -> None:
        self.fd: int | None = fd
        self.path, self.pid, self._clock = path, os.getpid(), clock

    def release(self, touch: bool = True) -> None:
        """Let the shard go (`touch`: record now as its last use, for eviction)."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        if self.pid != os.getpid():  # a forked child never unlocks what its parent holds
            os.close(fd)
            return
        try:
            if touch:
                set_used(self.path, self._clock())
        finally:  # a stamp refused (another user's shard) still lets the lock go
            let_go(fd, self.path + LOCK_SUFFIX)


def _folder_bytes(folder: str) -> int:
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # removed meanwhile
                continue
    return total


class ShardCache:
    """Shards of remote packs in `folder`, at most `limit` bytes of them (None: no bound).

    `clock` (nanoseconds) dates each use, `retry` governs downloads: both injected in tests.
    Picklable (for Loader workers) when they are.
    """

    def __init__(
        self,
        folder: StrPath,
        limit: int | None = None,
        clock: Callable[[], int] = time.time_ns,
        retry: Retry | None = None,
    ) -> None:
        if limit is not None and limit < 0:
            raise ValueError("cache_limit must be >= 0 bytes (or None: unbounded)")
        self.folder, self.limit, self.clock = os.fspath(folder), limit, clock
        self.retry = retry or Retry()
        self.downloads = self.evictions = 0  # this process's, for reports and tests
        make_folders(self.folder)

    def pack_folder(self, key: str) -> str:
        """Return the cache's folder for one pack (`key`: its URL and manifest digest)."""
        folder = os.path.join(self.folder, "packs", key)
        make_folders(folder)
        return folder

    def pin(self, obj: CachedObject, touch: bool = True, fit: bool = False) -> Pin:
        """Return a `Pin` of `obj`, downloading and checking it first if it is not cached.

        A cached copy is checked before it is used (`intact`); one that differs from the
        manifest is downloaded again (a warning names the cache file). Blocks while another
        process downloads it (their lock), then uses their copy. When every cached shard is
        held, a reader passes the limit; with `fit`, `CacheFullError`.
        """
        lock, download = obj.path + LOCK_SUFFIX, obj.path + DOWNLOAD_SUFFIX
        while True:
            damaged = False
            if os.path.exists(obj.path):
                fd = acquire(lock, fcntl.LOCK_SH)  # only an evictor's brief hold delays this
                try:
                    whole = self.intact(obj)
                    if whole and touch:  # its use stamped (for eviction) while it is held
                        set_used(obj.path, self.clock())
                except BaseException:  # (a read error, another user's shard, an interruption)
                    let_go(fd, lock)  # not held for ever
                    raise
                if whole:
                    break
                damaged = os.path.exists(obj.path)  # else evicted meanwhile
                let_go(fd, lock)
            fd = acquire(download, fcntl.LOCK_EX)  # held only while a download runs
            try:
                if damaged and os.path.exists(obj.path) and not self.intact(obj):
                    _log.warning(
                        "%s: the cached copy of %s differs from the manifest (changed or "
                        "damaged in the cache); downloading it again",
                        obj.path,
                        obj.what,
                    )
                elif os.path.exists(obj.path):
                    continue  # downloaded (or mended) by another process meanwhile
                fits = self._make_room(obj.size)
                if fit and not fits:
                    raise CacheFullError(f"{obj.what}: no room in {self.folder}")
                if getattr(obj.store, "fork_unsafe", lambda: False)():
                    download_elsewhere(self, obj)  # obstore hangs in a forked child
                else:
                    self.download(obj)
            finally:
                let_go(fd, download)
        return Pin(fd, obj.path, self.clock)

    def intact(self, obj: CachedObject) -> bool:
        """Return whether the cached copy of `obj` is there and what the manifest describes:
        its size, checked at every use, and its digest, read whole the first time this
        process uses it and again whenever the file was written or replaced since (its
        inode, size, modification and change times differ from when it was checked)."""
        try:
            stamp = _stamp(obj.path)
        except FileNotFoundError:
            return False
        if obj.size and stamp[2] != obj.size:
            return False
        if _checked.get(obj.path) == stamp:
            return True
        if obj.algorithm and file_hexdigest(obj.path, obj.algorithm) != obj.digest:
            return False
        _checked[obj.path] = stamp
        return True

    def fetch(self, obj: CachedObject, fit: bool = False) -> str:
        """Make sure `obj` is cached (downloading it if needed) without marking it used;
        `fit`: only if room can be made for it within the limit (else `CacheFullError`)."""
        self.pin(obj, touch=False, fit=fit).release(touch=False)
        return obj.path

    def download(self, obj: CachedObject) -> None:
        """Download `obj` to its cache path through a temporary name; refuse a wrong digest.

        The caller holds the object's lock exclusively (`pin` does).
        """
        digests = Digests([obj.algorithm] if obj.algorithm else [])

        def chunks() -> Iterator[bytes]:
            for chunk in self.retry.stream(obj.store, obj.name, obj.size, obj.what):
                digests.update(chunk)
                yield chunk

        tmp = run(lambda: stage_file(obj.path, chunks()))  # interruptible: transfer.run
        got = digests.hexdigests().get(obj.algorithm) if obj.algorithm else None
        if got != obj.digest:
            remove(tmp)
            name = DIGEST_NAMES[obj.algorithm] if obj.algorithm else "digest"
            raise DigestMismatchError(
                f"{obj.what}: its {obj.size} bytes have the {name} {got}, "
                f"but the manifest gives {obj.digest}: the object was changed or damaged after "
                "packing; it is not used"
            )
        rename(tmp, obj.path)
        _checked[obj.path] = _stamp(obj.path)
        self.downloads += 1

    def usage(self) -> tuple[int, list[tuple[int, str, int]]]:
        """Return (bytes of every file of the cache's packs and copies, [(last use ns, path,
        size)] of what eviction may remove: the `.rec` shards, and each `mirror/` copy whole,
        dated by its lock file)."""
        total, shards = self._copies_usage()
        packs = os.path.join(self.folder, "packs")
        for pack in os.scandir(packs) if os.path.isdir(packs) else ():
            if not pack.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(pack.path):
                if not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # removed meanwhile
                    continue
                total += st.st_size
                if entry.name.endswith(".rec"):
                    shards.append((st.st_atime_ns, entry.path, st.st_size))
        return total, shards

    def _copies_usage(self) -> tuple[int, list[tuple[int, str, int]]]:
        total, copies = 0, []
        mirror = os.path.join(self.folder, "mirror")
        for copy in os.scandir(mirror) if os.path.isdir(mirror) else ():
            if not copy.is_dir(follow_symlinks=False):
                continue
            size = _folder_bytes(copy.path)
            try:
                dated = copy.stat(follow_symlinks=False).st_mtime_ns  # `mirror._hold` dates it
            except FileNotFoundError:  # removed meanwhile
                continue
            total += size
            copies.append((dated, copy.path, size))
        return total, copies

    def _make_room(self, size: int) -> bool:
        """Evict shards used least recently, and not held, until `size` more bytes fit;
        return whether they do."""
        if self.limit is None:
            return True
        lock_path = os.path.join(self.folder, CACHE_LOCK)
        lock = acquire(lock_path, fcntl.LOCK_EX)
        try:
            total, shards = self.usage()
            for _, path, shard_size in sorted(shards):
                if total + size <= self.limit:
                    break
                if self._evict(path):
                    total -= shard_size
            return total + size <= self.limit
        finally:
            let_go(lock, lock_path)

    def _evict(self, path: str) -> bool:
        """Remove the shard (or copy) at `path` unless someone holds it (its `PATH.lock`);
        return whether it was removed."""
        try:
            fd = acquire(path + LOCK_SUFFIX, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            if os.path.isdir(path):  # a whole copy of mirror/
                remove_tree(path)
                removed = True
            else:
                removed = remove(path)
                _checked.pop(path, None)
        finally:
            let_go(fd, path + LOCK_SUFFIX)
        self.evictions += removed
        return removed
