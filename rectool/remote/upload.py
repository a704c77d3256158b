"""Packs written to object storage: packed locally into a staging folder, each shard uploaded
as soon as it is finished, the manifest last.

    with output_prefix("s3://bucket/packs/faces") as out:
        pack_images(lst, root, out.prefix, options, on_shard_finished=out.on_shard_finished)
    # each shard's .rec, .idx and checksum file uploaded as the shard was finished, while the
    # next ones were written; on leaving: the other files, then the manifest; staging removed

A reader opens a pack by its manifest, so uploading the manifest last means no reader ever
sees a half-written pack at the URL: until then there is no pack there (or the old one, whose
manifest still names only old shards' digests: a new shard of the same name is refused by its
digest, never read as the old). A run that fails or is interrupted uploads no manifest, and
deletes the objects it had uploaded (`ShardUploader.remove_uploaded`), but those of a pack it
was replacing (`--overwrite`): deleting one would leave the old manifest naming a missing
shard, where keeping it leaves one refused by its digest. A run killed outright (SIGKILL, a
lost machine) deletes nothing: its shards stay, named by no manifest (over an old pack: the
old manifest, some of its shards replaced), until the next run to that URL replaces them.
The staging folder needs the pack's size in local disk (`RECTOOL_CACHE_DIR`'s file system;
docs/remote.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..doors.output import LOCK_SUFFIX, make_folders, remove_tree
from ..errors import RectoolError, UsageError
from ..format.manifest import read_manifest
from ..format.paths import PackPaths
from .store import ObjectStore, RemoteError, Retry, is_url, open_store, safe_url, split_url
from .transfer import WAKE_S

if TYPE_CHECKING:
    from _typeshed import DataclassInstance, StrPath

    from ..packer.shardfile import ShardInfo

Result = TypeVar("Result", bound="DataclassInstance")

UPLOAD_THREADS = 4  # files uploaded at once
WRITABLE_SCHEMES = ("s3", "gs", "az", "abfs")  # obstore's; http(s):// is read-only
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def check_output_prefix(prefix: StrPath) -> None:
    """Refuse (`UsageError`) an OUT_PREFIX that is a URL rectool cannot write: http(s)://,
    or any scheme but s3://, gs://, az://. Called before anything is read or packed, so that
    such a prefix is never packed for nothing, nor taken for a local folder named `ftp:`."""
    text = os.fspath(prefix)
    match = _SCHEME.match(text)
    if match is None or match.group(1).lower() in WRITABLE_SCHEMES:
        return
    scheme = match.group(1).lower()
    why = "is read-only" if scheme in ("http", "https") else "is not a place rectool writes to"
    raise UsageError(
        f"OUT_PREFIX {safe_url(text)}: {scheme}:// {why}; write packs to a local folder or "
        f"to object storage ({', '.join(s + '://' for s in WRITABLE_SCHEMES[:3])})"
    )


class ShardUploader:
    """Uploads the files of one pack to `url_prefix` (`s3://bucket/path/NAME`): each shard's
    when `shard_finished` is told (on background threads), the rest and the manifest at
    `finish`. Refuses a URL it cannot write to at once, before anything is packed."""

    def __init__(
        self, url_prefix: str, retry: Retry | None = None, threads: int = UPLOAD_THREADS
    ) -> None:
        folder_url, self.name = split_url(url_prefix)
        self.url_prefix, self.retry = url_prefix, retry or Retry()
        store = open_store(folder_url)
        if not isinstance(store, ObjectStore):  # (not `writable`: http(s)://)
            raise RemoteError(f"{safe_url(url_prefix)}: cannot write there; write packs to s3://")
        self.store = store
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="rectool-upload")
        self._uploads: list[Future[None]] = []  # in submission order
        self.uploaded: set[str] = set()  # names of the objects submitted
        # Names of the pack replaced (--overwrite): never deleted.
        self.kept: frozenset[str] = frozenset()
        self._started: set[str] = set()  # names whose upload began: those a cleanup may delete

    def refuse_existing(self, overwrite: bool) -> None:
        """Refuse (`RemoteError`) to pack over a pack already at the URL (its manifest is
        there) unless `overwrite`, as a local OUT_PREFIX is refused; call before packing.
        With `overwrite`, note the old pack's objects: `remove_uploaded` never deletes them."""
        manifest = PackPaths(self.name).manifest
        url = self.store.object_url(manifest)
        if not self.retry.call(lambda: self.store.exists(manifest), url):
            return
        if not overwrite:
            raise RemoteError(
                f"{safe_url(self.url_prefix)}: a complete pack is already here ({url}); use "
                "--overwrite to replace it"
            )
        names = self.retry.call(self.store.names, safe_url(self.store.url))
        self.kept = frozenset(n for n in names if n.startswith(self.name))

    def remove_uploaded(self) -> list[str]:
        """Delete the objects this run began to upload (after a failure, once `close`d) but
        those of the pack it was replacing (`kept`), whose manifest would then name missing
        shards; return their names. Once the manifest was sent over an old pack's, nothing is
        deleted: the manifest there may be the new one, naming them."""
        manifest = PackPaths(self.name).manifest
        sent = manifest in self._started
        if sent and manifest in self.kept:
            return []
        first = [manifest] if sent else []  # gone first: no manifest names a missing shard
        rest = sorted(self._started - self.kept - {manifest})
        for names in (first, rest):
            if names:
                self.retry.call(partial(self.store.delete, names), safe_url(self.url_prefix))
        return first + rest

    def shard_finished(self, info: ShardInfo, paths: Iterable[str]) -> None:
        """Start uploading the files of a finished shard (`ShardWriter`'s `on_shard_finished`);
        raise the error of an earlier upload that failed, which ends the pack."""
        for future in self._uploads:
            error = future.exception() if future.done() else None
            if error is not None:
                raise error
        for path in paths:
            self._submit(path)

    def _submit(self, path: str) -> None:
        name = os.path.basename(path)
        self.uploaded.add(name)
        self._uploads.append(self._pool.submit(self._put, name, path))

    def _put(self, name: str, path: str) -> None:
        self._started.add(name)
        self.retry.call(lambda: self.store.put(name, path), self.store.object_url(name))

    def wait(self) -> None:
        """Wait until every upload started is done; raise the error of the first that failed
        (in the order they were started) as soon as one has, not once those before it end.
        The wait wakes every `WAKE_S` to raise a Ctrl-C that missed it (see `transfer.WAKE_S`),
        not once every upload queued has ended. `close` then drops those not started and
        lets the running ones end: no object is deleted while its upload runs."""
        pending: set[Future[None]] = set(self._uploads)
        while pending:  # (a future `close` cancelled is never done: not waited for)
            waited = wait_for(pending, WAKE_S, FIRST_EXCEPTION).not_done
            pending = {future for future in waited if not future.cancelled()}
            for future in self._uploads:
                if future.done() and not future.cancelled() and future.exception() is not None:
                    future.result()  # raises it

    def finish(self, manifest_path: StrPath) -> str:
        """Wait for the shards' uploads, upload the pack's other files (those of the manifest's
        folder named NAME.* or NAME-N.*: the binary index's `.npy` arrays, the identity names,
        the failures file...), then the manifest; return its URL."""
        read_manifest(manifest_path)  # a whole pack, or no manifest is uploaded
        folder, manifest = os.path.split(os.fspath(manifest_path))
        local = PackPaths.of_manifest(manifest_path) if PackPaths.is_manifest(manifest) else None
        if local is None or local.stem != self.name:
            named = manifest if local is None else local.stem
            raise RemoteError(f"{manifest_path}: a pack named {named!r}, not {self.name!r}")
        self.wait()
        rest = sorted(
            n
            for n in os.listdir(folder)
            if local.owns(n)  # NAME.* and NAME-N.*, not NAME2's, say
            and n != manifest
            and not n.endswith(LOCK_SUFFIX)  # the lock of the local run that wrote it
            and n not in self.uploaded
            and os.path.isfile(os.path.join(folder, n))
        )
        for path in [os.path.join(folder, n) for n in rest]:
            self._submit(path)
        self.wait()
        self._put(manifest, os.path.join(folder, manifest))
        return self.store.object_url(manifest)

    def close(self) -> None:
        """Stop: uploads not started are dropped, those running are waited for."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def upload_pack(manifest_path: StrPath, url_prefix: str, retry: Retry | None = None) -> str:
    """Upload the local pack of `manifest_path` to `url_prefix` (`s3://bucket/path/NAME`):
    its other files first, the manifest last; return the manifest's URL.

    The files are those in the manifest's folder named after the pack (NAME.*, NAME-N.*).
    """
    uploader = ShardUploader(url_prefix, retry)
    try:
        return uploader.finish(manifest_path)
    finally:
        uploader.close()


class Output(NamedTuple):
    """Where a command writes a pack: `prefix` (local), and the hook that uploads each shard
    as it is finished (None for a local pack)."""

    prefix: str
    on_shard_finished: Callable[[ShardInfo, list[str]], None] | None = None


@contextlib.contextmanager
def staged_pack(
    url_prefix: str,
    overwrite: bool = False,
    staging: StrPath | None = None,
    retry: Retry | None = None,
) -> Iterator[Output]:
    """Yield the `Output` to pack `url_prefix` through: a prefix in a staging folder (under
    `staging`, default the cache folder), whose shards are uploaded as they are finished; on
    success the rest and the manifest are uploaded. The staging folder is removed either way.
    A pack already at `url_prefix` is refused before anything is staged, unless `overwrite`."""
    from .dataset import default_cache_dir  # here: a local OUT_PREFIX needs no dataset code

    uploader = ShardUploader(url_prefix, retry)
    try:
        uploader.refuse_existing(overwrite)
    except BaseException:
        uploader.close()
        raise
    parent = os.path.join(staging or default_cache_dir(), "staging")
    folder = os.path.join(parent, f"{uploader.name}-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        make_folders(parent)
        make_folders(folder)
        local_prefix = os.path.join(folder, uploader.name)
        yield Output(local_prefix, uploader.shard_finished)
        uploader.finish(PackPaths(local_prefix).manifest)
    except BaseException as exc:
        uploader.close()  # no upload running while its objects are deleted
        try:
            uploader.remove_uploaded()
        except RectoolError as cleanup:
            if not isinstance(exc, RectoolError):
                if sys.version_info >= (3, 11):  # (Python 3.10 has no notes)
                    exc.add_note(f"the objects it had uploaded stay: {cleanup}")
                raise
            raise RemoteError(f"{exc} (and the objects it had uploaded stay: {cleanup})") from exc
        raise
    finally:
        uploader.close()  # before the files it may still be reading are removed
        remove_tree(folder)


def output_prefix(prefix: str, overwrite: bool = False) -> AbstractContextManager[Output]:
    """Return a context yielding the `Output` to pack `prefix` through: itself, or a staging
    folder uploaded shard by shard when `prefix` is a URL (`staged_pack`: a pack already
    there is refused on entering, unless `overwrite`)."""
    check_output_prefix(prefix)
    if is_url(prefix):
        return staged_pack(prefix, overwrite)
    return contextlib.nullcontext(Output(prefix))


def named_at(result: Result, local_prefix: StrPath, prefix: str) -> Result:
    """Return `result` (a dataclass of paths: `PackResult`, `RepackResult`) with each path
    under `local_prefix`, the staging folder that was uploaded, named under `prefix` instead."""
    local_prefix = os.fspath(local_prefix)
    if local_prefix == prefix:
        return result
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, str) and value.startswith(local_prefix):
            changes[f.name] = prefix + value[len(local_prefix) :]
    return dataclasses.replace(result, **changes)
