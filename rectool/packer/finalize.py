"""A pack's manifest from shards packed one by one (`finalize_pack`), and a complete pack described
again (`completed_if_same`: `--resume` of a finished pack changes nothing).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..doors.failures import open_failures
from ..doors.inputs import dataset_path, open_input
from ..doors.output import OutputLock, remove, rename, stage_file
from ..errors import RectoolError
from ..format.manifest import PLAN_SUFFIX, read_manifest
from .listcheck import load_identities, validate_list
from .manifest import (
    FAILURES_SUFFIX,
    PARTIAL_SUFFIX,
    STATE_SUFFIX,
    build_manifest,
    check_same_source,
    finish_interrupted,
    is_complete,
    manifest_path,
    manifest_source,
    remove_stale_temporaries,
    shard_files,
    shard_stem,
    source_state,
    write_manifest,
)
from .options import PackOptions, allowed_failures, check_pack_options, check_prefix
from .results import COMPLETE, FINALIZED, PackResult, Refusal, read_failures_file
from .shards import describe_shard, plan_shards, shard_digests

if TYPE_CHECKING:
    from _typeshed import StrPath

    from .shardfile import ShardInfo


def finalize_pack(
    list_path: StrPath,
    root: StrPath,
    prefix: StrPath,
    options: PackOptions | None = None,
    label_map: StrPath | None = None,
) -> PackResult:
    """Check that every shard of the plan was packed, then write the failures file and manifest.

    For shards packed one by one (`only_shard`), e.g. by a job array or a cluster; the result
    is the same as one `pack_images` run over the whole list.
    """
    options = options or PackOptions()
    prefix = check_prefix(prefix)
    check_pack_options(options)
    with OutputLock(prefix):
        finish_interrupted(prefix)
        return finalize_locked(list_path, root, prefix, options, label_map)


def finalize_locked(
    list_path: StrPath,
    root: StrPath,
    prefix: str,
    options: PackOptions,
    label_map: StrPath | None,
) -> PackResult:
    """`finalize_pack` once the prefix is locked."""
    list_path = os.fspath(list_path)
    identities = load_identities(list_path, label_map)
    digest, total = validate_list(list_path, options.layout, identities, options.pack_label)
    options = dataclasses.replace(
        options, max_failures=allowed_failures(options.max_failures, total)
    )
    if is_complete(prefix):
        return completed_if_same(prefix, source_state(digest, root, options))
    plan = plan_shards(total, options.shard_bytes, options.shard_records)
    infos: list[ShardInfo] = []
    refused: list[Refusal] = []
    for number in range(len(plan)):
        stem = shard_stem(prefix, number)
        rec, idx, failures = stem + ".rec", stem + ".idx", stem + FAILURES_SUFFIX
        unfinished = [p for p in (rec, idx, failures) if not os.path.exists(p)]
        unfinished += [p for p in shard_files(stem) if p.endswith((PARTIAL_SUFFIX, STATE_SUFFIX))]
        if unfinished:
            raise RectoolError(
                f"{unfinished[0]}: shard {number} of {len(plan)} is missing or unfinished; "
                f"pack it with --only-shard {number} (add --resume to continue it)"
            )
        infos.append(describe_shard(rec, idx, shard_digests(options.sha256)))
        refused += read_failures_file(failures)
    final_failures = prefix + FAILURES_SUFFIX
    shard_failures = [shard_stem(prefix, n) + FAILURES_SUFFIX for n in range(len(plan))]
    rename(stage_file(final_failures, _concatenated(shard_failures)), final_failures)
    images = sum(info.records for info in infos)
    source = source_state(digest, root, options)
    manifest = build_manifest(
        options, list_path, prefix, infos, images, len(refused), None, identities, source
    )
    remove_stale_temporaries(prefix)
    write_manifest(prefix, manifest)
    for name in shard_failures:  # only now: until the manifest, a rerun needs them
        remove(name)
    for number in range(len(plan)):  # the manifest now says what the plan files said
        if os.path.lexists(plan_file := shard_stem(prefix, number) + PLAN_SUFFIX):
            remove(plan_file)
    return PackResult(
        manifest_path(prefix),
        manifest,
        images,
        len(refused),
        final_failures,
        refused[:100],
        0,
        FINALIZED,
    )


def _concatenated(paths: Iterable[str], size: int = 1 << 20) -> Iterator[bytes]:
    for path in paths:
        with open_input(path, "failures file") as f:
            while block := f.read(size):
                yield block


# The fields of a complete pack's manifest that describing it again reads.
COMPLETE_FIELDS = (
    "failures_file",
    "totals.images",
    "totals.failures",
    "totals.rec_bytes",
    "options.max_failures",
)


def completed_if_same(prefix: str, state: dict[str, Any]) -> PackResult:
    """Describe the complete pack at `prefix` if it was made as `state` (a `source_state`)
    says; else raise naming what differs."""
    manifest = read_manifest(manifest_path(prefix))
    check_same_source(manifest_path(prefix), manifest_source(manifest), state, "pack")
    return _completed_result(prefix)


def _completed_result(prefix: str) -> PackResult:
    """Describe a pack that is already complete (so `--resume` can be run again safely)."""
    manifest = read_manifest(manifest_path(prefix), require=COMPLETE_FIELDS)
    folder = os.path.dirname(prefix) or "."
    failures_path = dataset_path(folder, manifest["failures_file"], "failures file")
    with open_failures(failures_path, within=folder) as failures:
        # Without `bad_lines` every entry is set, and a pack's failures file holds pack lines.
        lines = itertools.islice(failures, 100)
        refused = [Refusal(**failure.entry) for failure in lines]  # type: ignore[arg-type]
    totals = manifest["totals"]
    return PackResult(
        manifest_path(prefix),
        manifest,
        totals["images"],
        totals["failures"],
        failures_path,
        refused,
        totals["images"] + totals["failures"],
        COMPLETE,
    )
