"""Packs written to object storage: packed locally into a staging folder, then uploaded.

    with staged_pack("s3://bucket/packs/faces") as local_prefix:
        pack_images(lst, root, local_prefix, options)   # the ordinary local pack
    # on leaving: every file but the manifest uploaded, then the manifest; staging removed

A reader opens a pack by its manifest, so uploading the manifest last means no reader ever
sees a half-written pack at the URL: until then there is no pack there (or the old one, whose
manifest still names only old shards' digests: a new shard of the same name is refused by its
digest, never read as the old). The staging folder needs the pack's size in local disk
(`RECTOOL_CACHE_DIR`'s file system); each shard is uploaded once the whole pack is done, not
as it completes (docs/remote.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from ..doors.output import make_folders, remove_tree
from ..reader import MANIFEST_SUFFIX, read_manifest
from .dataset import default_cache_dir
from .store import RemoteError, Retry, is_url, open_store, safe_url, split_url


def upload_pack(manifest_path, url_prefix, retry=None, progress=None):
    """Upload the local pack of `manifest_path` to `url_prefix` (`s3://bucket/path/NAME`):
    its other files first, the manifest last; return the manifest's URL.

    The files are those in the manifest's folder whose names start with the pack's name.
    """
    retry = retry or Retry()
    folder_url, name = split_url(url_prefix)
    store = open_store(folder_url)
    if not store.writable:
        raise RemoteError(f"{safe_url(url_prefix)}: cannot write there; write packs to s3://")
    read_manifest(manifest_path)  # a whole pack, or nothing is uploaded
    folder, manifest = os.path.split(os.fspath(manifest_path))
    local_name = manifest[: -len(MANIFEST_SUFFIX)]
    if local_name != name:
        raise RemoteError(f"{manifest_path}: a pack named {local_name!r}, not {name!r}")
    files = sorted(
        n
        for n in os.listdir(folder)
        if n.startswith(local_name) and n != manifest and not n.endswith(".lock")
        and os.path.isfile(os.path.join(folder, n))
    )  # fmt: skip
    for n in [*files, manifest]:
        retry.call(lambda n=n: store.put(n, os.path.join(folder, n)), store.object_url(n))
        if progress is not None:
            progress(n)
    return store.object_url(manifest)


@contextlib.contextmanager
def staged_pack(url_prefix, staging=None):
    """Yield a local prefix to pack into; on success upload it to `url_prefix` (`upload_pack`).
    The staging folder (under `staging`, default the cache folder) is removed either way."""
    _, name = split_url(url_prefix)
    parent = os.path.join(staging or default_cache_dir(), "staging")
    make_folders(parent)
    folder = os.path.join(parent, f"{name}-{os.getpid()}-{os.urandom(4).hex()}")
    make_folders(folder)
    try:
        local_prefix = os.path.join(folder, name)
        yield local_prefix
        upload_pack(local_prefix + MANIFEST_SUFFIX, url_prefix)
    finally:
        remove_tree(folder)


def output_prefix(prefix):
    """Return a context yielding where to pack `prefix`: itself, or a staging folder that is
    uploaded on leaving when `prefix` is a URL (`staged_pack`)."""
    return staged_pack(prefix) if is_url(prefix) else contextlib.nullcontext(prefix)


def named_at(result, local_prefix, prefix):
    """Return `result` (a dataclass of paths: `PackResult`, `RepackResult`) with each path
    under `local_prefix`, the staging folder that was uploaded, named under `prefix` instead."""
    local_prefix = os.fspath(local_prefix)
    if local_prefix == prefix:
        return result
    changes = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, str) and value.startswith(local_prefix):
            changes[f.name] = prefix + value[len(local_prefix) :]
    return dataclasses.replace(result, **changes)
