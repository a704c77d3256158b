"""`rectool repack`: packs in, a pack out: merged, filtered, relabelled, reordered, converted.

A repack runs in two steps. Planning reads only the sources' indexes and record headers (and,
for `--dedupe` / `--drop-overlap`, digests of the images) into a few numpy arrays, one entry
per record, and decides everything: which records are kept, their new labels and keys, and
the order they are written in. Every error about the sources or options is raised there,
before a byte is written. Writing then copies the kept records from the mmapped sources in
large batches (`copier.py`): the payload bytes are copied unchanged and the header words that
change (label, key) are patched with numpy; only a record whose framing must change (a split
record, or a new header word equal to the dmlc magic) is framed again by
`writer.frame_record`. With a transform, images are re-encoded by worker threads and written
in plan order.

The output is a pack like `rectool pack` writes: shards through `shards.ShardWriter`, the
failures file, the state file for `--resume`, the manifest last.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..doors.inputs import open_input, read_state
from ..doors.output import OutputLock, make_folders, remove, write_json_atomic
from ..errors import RectoolError, UsageError
from ..format.manifest import read_manifest
from ..format.paths import PackPaths
from ..packer.manifest import (
    finish_interrupted,
    is_complete,
    output_files,
    prepare_outputs,
    refuse_inputs_among_outputs,
    replace_beside,
)

# Pack's output conventions and its --resume/--overwrite rules, reused as they are.
from ..packer.options import allowed_failures
from .options import LABELS_BY as LABELS_BY
from .options import RepackOptions as RepackOptions
from .options import check_repack_options as check_repack_options
from .plan import REPORT_GROUPS as REPORT_GROUPS
from .plan import Catalog as Catalog
from .plan import Plan as Plan
from .plan import build_catalog as build_catalog
from .plan import check_label_widths as check_label_widths
from .plan import check_plan as check_plan
from .plan import plan_repack as plan_repack
from .plan import reason_of as reason_of
from .result import RepackResult as RepackResult
from .run import BATCH_RECORDS as BATCH_RECORDS
from .run import REENCODE_CHUNK as REENCODE_CHUNK
from .run import RepackRun as RepackRun
from .sources import PackTarget, Target
from .sources import Source as Source
from .sources import open_target as open_target

if TYPE_CHECKING:
    from _typeshed import StrPath

    from ..packer.packrun import Progress
    from ..packer.shardfile import ShardFinished


def repack(
    sources: Sequence[StrPath],
    prefix: StrPath | PackPaths,
    options: RepackOptions | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    on_shard_finished: ShardFinished | None = None,
) -> RepackResult:
    """Repack the records of `sources` (datasets `open_dataset` accepts) into a pack at
    `prefix`; return a `RepackResult`.

    Everything is planned, and every error about the sources or options raised, before a
    file is written. `progress(done, total, refused)` is called as records are written;
    `on_shard_finished(info, paths)` as each shard is finished (`ShardWriter`).
    """
    options = options or RepackOptions()
    check_repack_options(options)
    paths = PackPaths.of(prefix)
    if not sources:
        raise UsageError("give at least one SOURCE")
    files = {"--keep-ids file": options.keep_ids, "--drop-ids file": options.drop_ids}
    refuse_inputs_among_outputs(paths, files, also=[paths.label_map])
    opened = [Source(s) for s in sources]
    targets = [open_target(t) for t in options.drop_overlap]
    # An evaluation set (.bin) has no shards a repack could write over.
    _check_not_a_source(paths, [*opened, *(t for t in targets if isinstance(t, PackTarget))])
    catalog = build_catalog(opened, options.labels_by)
    plan = plan_repack(opened, catalog, options, targets)
    check_plan(plan, options)
    check_label_widths(opened, catalog, plan, options)
    options = dataclasses.replace(
        options, max_failures=allowed_failures(options.max_failures, len(plan.rows))
    )
    make_folders(paths.folder)
    with OutputLock(paths):
        finish_interrupted(paths)
        if resume and is_complete(paths):
            return _completed_result(paths)

        def write_at(at: PackPaths, resume: bool, overwrite: bool) -> RepackResult:
            return _repack_into(
                opened,
                targets,
                catalog,
                plan,
                at,
                options,
                resume,
                overwrite,
                progress,
                on_shard_finished,
            )

        if not (overwrite and output_files(paths)):
            return write_at(paths, resume, overwrite)
        result = replace_beside(paths, lambda staging: write_at(staging, False, False))
        return dataclasses.replace(
            result,
            manifest_path=paths.manifest,
            failures_path=paths.failures,
            report_path=paths.report,
        )


def _repack_into(
    opened: list[Source],
    targets: list[Target],
    catalog: Catalog,
    plan: Plan,
    paths: PackPaths,
    options: RepackOptions,
    resume: bool,
    overwrite: bool,
    progress: Progress | None,
    on_shard_finished: ShardFinished | None = None,
) -> RepackResult:
    """Write the planned repack at `paths` (locked, and the final or a staging prefix)."""
    prepare_outputs(paths, resume, overwrite)
    if not resume:
        for stale in (paths.relabel, paths.report):
            remove(stale)
    state = {
        "command": "repack",
        "sources": [s.fingerprint() for s in opened],
        "options": options.byte_options(),
    }
    state_path = paths.state
    if resume and os.path.exists(state_path):
        _check_state(state_path, state)
    else:
        write_json_atomic(state_path, state)
    run = RepackRun(opened, targets, catalog, plan, paths, options, progress)
    run.writer.on_shard_finished = on_shard_finished
    try:
        run.execute(resume)
    finally:
        run.copier.close()
    return run.finish(state_path)


def _check_state(state_path: str, state: dict[str, Any]) -> None:
    """Refuse to resume a repack that an interrupted run started with other sources or
    options."""
    try:
        saved = read_state(state_path, "repack state")
    except RectoolError as exc:
        raise RectoolError(f"{exc}; start again with --overwrite") from None
    differences = [name for name in state if saved.get(name) != state[name]]
    if differences:
        raise RectoolError(
            f"{state_path}: cannot resume: the interrupted repack used different "
            f"{', '.join(differences)} (start again with --overwrite)"
        )


def _check_not_a_source(paths: PackPaths, sources: Sequence[Source | PackTarget]) -> None:
    """Refuse an OUT_PREFIX whose shards would replace a source's (or a target's) files."""
    out = os.path.realpath(paths.prefix)
    for s in sources:
        for path in (p for shard in s.dataset.shards for p in shard):
            real = os.path.realpath(path)
            if real.startswith(out) and PackPaths.is_shard_tail(real[len(out) :]):
                raise UsageError(
                    f"OUT_PREFIX {paths} would write over {path}, a file of source {s.spec}; "
                    "repack to another prefix"
                )


def _completed_result(paths: PackPaths) -> RepackResult:
    required = (
        "classes",
        "totals.images",
        "totals.failures",
        "totals.records",
        "totals.rec_bytes",
        "options.max_failures",
    )
    manifest = read_manifest(paths.manifest, require=required)
    with open_input(paths.report, "repack report", "utf-8") as f:
        report = json.load(f)
    totals = manifest["totals"]
    return RepackResult(
        paths.manifest,
        manifest,
        totals["images"],
        manifest["classes"],
        totals["failures"],
        paths.failures,
        paths.report,
        report,
        totals["images"],
    )
