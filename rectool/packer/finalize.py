"""A pack's manifest from shards packed one by one (`finalize_pack`), and a complete pack described
again (`completed_if_same`: `--resume` of a finished pack changes nothing).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..doors.failures import open_failures
from ..doors.inputs import dataset_path, open_input
from ..doors.output import OutputLock, remove, rename, stage_file
from ..errors import RectoolError
from ..format.manifest import read_manifest, read_shard_plan_file
from ..format.paths import PARTIAL_SUFFIX, STATE_SUFFIX, PackPaths
from .listcheck import load_identities, validate_list
from .manifest import (
    build_manifest,
    check_same_source,
    finish_interrupted,
    is_complete,
    manifest_source,
    option_differences,
    remove_stale_temporaries,
    shard_files,
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
    prefix: StrPath | PackPaths,
    options: PackOptions | None = None,
    label_map: StrPath | None = None,
) -> PackResult:
    """Check that every shard of the plan was packed, then write the failures file and manifest.

    For shards packed one by one (`only_shard`), e.g. by a job array or a cluster; the result
    is the same as one `pack_images` run over the whole list.
    """
    options = options or PackOptions()
    paths = PackPaths.of(check_prefix(prefix))
    check_pack_options(options)
    with OutputLock(paths):
        finish_interrupted(paths)
        return finalize_locked(list_path, root, paths, options, label_map)


def finalize_locked(
    list_path: StrPath,
    root: StrPath,
    paths: PackPaths,
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
    if is_complete(paths):
        return completed_if_same(paths, source_state(digest, root, options))
    plan = plan_shards(total, options.shard_bytes, options.shard_records)
    infos: list[ShardInfo] = []
    refused: list[Refusal] = []
    for number in range(len(plan)):
        shard = paths.shard(number)
        rec, idx, failures = shard.rec, shard.idx, shard.failures
        unfinished = [p for p in (rec, idx, failures) if not os.path.exists(p)]
        unfinished += [p for p in shard_files(shard) if p.endswith((PARTIAL_SUFFIX, STATE_SUFFIX))]
        if unfinished:
            raise RectoolError(
                f"{unfinished[0]}: shard {number} of {len(plan)} is missing or unfinished; "
                f"pack it with --only-shard {number} (add --resume to continue it)"
            )
        expected = (len(plan), number, options.shard_records or total, total, digest)
        made = read_made_shard(shard.plan, number)
        check_shard_plan(shard.plan, made, expected, options)
        info = describe_shard(rec, idx, shard_digests(options.sha256))
        check_shard_files(shard.plan, made, number, info)
        shard_refused = read_failures_file(failures)
        if info.records + len(shard_refused) != len(plan[number]):
            raise RectoolError(
                f"{rec}: shard {number} holds {info.records:,} records and "
                f"{len(shard_refused):,} refusals, yet its plan has {len(plan[number]):,} list "
                f"lines (its files were replaced or damaged); pack it again with --only-shard "
                f"{number} --overwrite"
            )
        infos.append(info)
        refused += shard_refused
    final_failures = paths.failures
    shard_failures = [paths.shard(n).failures for n in range(len(plan))]
    rename(stage_file(final_failures, _concatenated(shard_failures)), final_failures)
    images = sum(info.records for info in infos)
    source = source_state(digest, root, options)
    manifest = build_manifest(
        options, list_path, paths, infos, images, len(refused), None, identities, source
    )
    remove_stale_temporaries(paths)
    write_manifest(paths, manifest)
    for name in shard_failures:  # only now: until the manifest, a rerun needs them
        remove(name)
    for number in range(len(plan)):  # the manifest now says what the plan files said
        if os.path.lexists(plan_file := paths.shard(number).plan):
            remove(plan_file)
    return PackResult(
        paths.manifest,
        manifest,
        images,
        len(refused),
        final_failures,
        refused[:100],
        0,
        FINALIZED,
    )


_PLAN_FIELDS = ("shards", "shard", "shard_records", "list_items", "list_sha256")


def read_made_shard(path: str, number: int) -> dict[str, Any]:
    """Return the plan file of shard `number` at `path` (`read_shard_plan_file`), which says
    how the shard was made; raise when there is none (which plan packed it is unknown)."""
    if not os.path.lexists(path):
        raise RectoolError(
            f"{path}: shard {number} has no plan file, so which plan packed it is unknown; "
            f"pack it again with --only-shard {number} --overwrite"
        )
    return read_shard_plan_file(path)


def check_shard_plan(
    path: str, doc: Mapping[str, Any], expected: tuple[object, ...], options: PackOptions
) -> None:
    """Raise unless the plan file `doc` (at `path`) says its shard was packed by the plan
    being finalized (`expected`: shards, shard, shard_records, list_items, list_sha256) with
    the byte `options` given now (when it records them: an older rectool's does not), so
    that no shard packed from another list, --shard-records or re-encoding is taken in."""
    plan, number = doc["plan"], expected[1]
    again = f"pack it again with --only-shard {number} --overwrite"
    differ = [
        f"{field} {plan[field]!r}, not {want!r}"
        for field, want in zip(_PLAN_FIELDS, expected)
        if plan[field] != want
    ]
    if differ:
        raise RectoolError(
            f"{path}: shard {number} was packed by another plan ({'; '.join(differ)}): "
            f"another list or --shard-records; {again}, or use that list and --shard-records"
        )
    packed_with = doc.get("options")  # None: an older rectool's plan file
    if packed_with is not None and (
        differ := option_differences(options.byte_options(), packed_with, "shard's plan file")
    ):
        raise RectoolError(
            f"{path}: shard {number} was packed with other options ({'; '.join(differ)}); "
            f"finalize with the options its task was given, or {again}"
        )


def check_shard_files(path: str, doc: Mapping[str, Any], number: int, info: ShardInfo) -> None:
    """Raise unless shard `number`'s files are those its task wrote, as its plan file `doc`
    (at `path`) records them (by their digests; a plan file without them is not checked)."""
    digests = info.digests or {}
    for kind, written in (doc.get("packed") or {}).items():
        if not isinstance(written, dict) or not written:
            continue
        found = digests.get(kind)
        if found is None or any(found.get(name, v) != v for name, v in written.items()):
            raise RectoolError(
                f"{path}: shard {number}'s .{kind} is not the file its task wrote (its digest "
                f"differs from the plan file's): replaced after the task ended? pack it again "
                f"with --only-shard {number} --overwrite"
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


def completed_if_same(paths: PackPaths, state: dict[str, Any]) -> PackResult:
    """Describe the complete pack at `paths` if it was made as `state` (a `source_state`)
    says; else raise naming what differs."""
    manifest = read_manifest(paths.manifest)
    check_same_source(paths.manifest, manifest_source(manifest), state, "pack")
    return _completed_result(paths)


def _completed_result(paths: PackPaths) -> PackResult:
    """Describe a pack that is already complete (so `--resume` can be run again safely)."""
    manifest = read_manifest(paths.manifest, require=COMPLETE_FIELDS)
    folder = paths.folder or "."
    failures_path = dataset_path(folder, manifest["failures_file"], "failures file")
    with open_failures(failures_path, within=folder) as failures:
        # Without `bad_lines` every entry is set, and a pack's failures file holds pack lines.
        lines = itertools.islice(failures, 100)
        refused = [Refusal(**failure.entry) for failure in lines]  # type: ignore[arg-type]
    totals = manifest["totals"]
    return PackResult(
        paths.manifest,
        manifest,
        totals["images"],
        totals["failures"],
        failures_path,
        refused,
        totals["images"] + totals["failures"],
        COMPLETE,
    )
