"""Pack on a Dask cluster: one task per planned shard, then the manifest on the client.

Each task is `pack_images(..., only_shard=K, resume=True)` on whichever worker runs it, so
the cluster uses the same packing code path as a local run. A task that is retried after its
worker died continues the shard from its `.partial` files; a shard gets its final name only
when complete, and the manifest is written only when every shard is.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from ..doors.output import OutputLock, make_folders
from ..errors import RectoolError, UsageError
from ..extras import missing_module
from ..format.paths import PackPaths
from .finalize import completed_if_same, finalize_locked
from .listcheck import check_root, validate_list
from .manifest import (
    discard_staging,
    finish_interrupted,
    is_complete,
    output_files,
    source_state,
    staging_prefix,
    swap_in,
)
from .options import PackOptions, check_pack_options, check_prefix
from .packing import pack_images
from .results import PACKED, RESUMED, ShardResult
from .shards import plan_shards

if TYPE_CHECKING:
    from _typeshed import StrPath
    from dask.distributed import Client, LocalCluster

    from .packrun import Progress
    from .results import PackResult


def _client_for(scheduler: str | None, workers: int) -> tuple[Client, LocalCluster | None]:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise missing_module("dask") from None  # one line naming `rectool[dask]`
    if scheduler:
        try:
            return Client(scheduler, timeout="30s"), None
        except OSError as exc:
            raise RectoolError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True)
    return Client(cluster), cluster


def _pack_task(
    list_path: str,
    root: str,
    paths: PackPaths,
    options: PackOptions,
    number: int,
    lock_token: str | None = None,
) -> ShardResult:
    result = pack_images(
        list_path, root, paths, options, resume=True, only_shard=number, lock_token=lock_token
    )
    assert isinstance(result, ShardResult)  # only_shard: one shard's result
    return result


def pack_on_dask(
    list_path: StrPath,
    root: StrPath,
    prefix: StrPath,
    options: PackOptions | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    label_map: StrPath | None = None,
    progress: Progress | None = None,
    local_workers: int | None = None,
) -> PackResult:
    """Pack every shard of the plan as a task on a Dask cluster; return `finalize_pack`'s result.

    `scheduler` is the address of a running `dask.distributed` scheduler; None starts a local
    cluster of `local_workers` processes. Workers must see `list_path`, `root` and `prefix` at
    the same paths (a shared file system). Within a task, `options.workers` threads are used.
    """
    options = options or PackOptions()
    if list_path == "-":
        raise UsageError("--executor dask needs the list as a file that every worker can read")
    given = PackPaths(check_prefix(prefix))
    list_path, root = (os.path.abspath(os.fspath(p)) for p in (list_path, root))
    paths = PackPaths(os.path.abspath(given.prefix))
    check_pack_options(options)
    digest, total = validate_list(list_path, options.layout, pack_label=options.pack_label)
    plan = plan_shards(total, options.shard_bytes, options.shard_records)
    make_folders(paths.folder)
    with OutputLock(paths) as lock:
        finish_interrupted(paths)
        result = _pack_locked(
            list_path,
            root,
            paths,
            options,
            plan,
            (digest, total),
            scheduler,
            resume,
            overwrite,
            label_map,
            progress,
            local_workers,
            lock.token,
        )
    # Workers need absolute paths; the caller gets its own back, as it gave them.
    return dataclasses.replace(result, manifest_path=given.manifest, failures_path=given.failures)


def _pack_locked(
    list_path: str,
    root: str,
    paths: PackPaths,
    options: PackOptions,
    plan: list[range],
    listed: tuple[str, int],
    scheduler: str | None,
    resume: bool,
    overwrite: bool,
    label_map: StrPath | None,
    progress: Progress | None,
    local_workers: int | None,
    token: str | None,
) -> PackResult:
    digest, total = listed
    if resume and is_complete(paths):
        return completed_if_same(paths, source_state(digest, root, options))
    existing = output_files(paths)
    if existing and not (overwrite or resume):
        raise RectoolError(f"{existing[0]}: output exists; use --resume or --overwrite")
    if not resume:
        check_root(list_path, root, options.allow_outside_root)
    client, cluster = _client_for(scheduler, local_workers or os.cpu_count() or 1)
    final = None
    if existing and overwrite:
        # The old pack stays whole until the new one is: pack beside it, then swap.
        final, paths = paths, staging_prefix(paths)
        token = None  # the staging prefix is this run's own: its tasks lock it themselves
    try:
        return _run_and_finish(
            client,
            cluster,
            list_path,
            root,
            paths,
            final,
            options,
            plan,
            total,
            label_map,
            progress,
            token,
        )
    except BaseException:
        if final is not None and not os.path.exists(final.journal):
            discard_staging(paths)  # not committed: the old pack stays as it was
        raise


def _run_and_finish(
    client: Client,
    cluster: LocalCluster | None,
    list_path: str,
    root: str,
    paths: PackPaths,
    final: PackPaths | None,
    options: PackOptions,
    plan: list[range],
    total: int,
    label_map: StrPath | None,
    progress: Progress | None,
    token: str | None,
) -> PackResult:
    try:
        from dask.distributed import as_completed

        futures = [
            client.submit(
                _pack_task, list_path, root, paths, options, k, token, pure=False, retries=2
            )
            for k in range(len(plan))
        ]
        done = refused = resumed_from = 0
        for future in as_completed(futures):
            shard = future.result()  # re-raises a task's error here, on the client
            done += len(plan[shard.shard])
            refused += shard.failures
            resumed_from += shard.resumed_from
            if progress is not None:
                progress(done, total, refused)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    result = finalize_locked(list_path, root, paths, options, label_map)
    # The tasks did the packing (finalizing is this function's last step): say what they did.
    result = dataclasses.replace(
        result, resumed_from=resumed_from, outcome=RESUMED if resumed_from else PACKED
    )
    if final is None:
        return result
    swap_in(paths, final)
    return dataclasses.replace(
        result,
        manifest_path=final.manifest,
        failures_path=final.failures,
    )
