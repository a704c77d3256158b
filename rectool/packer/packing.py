"""The packing pipeline: a .lst and an image tree in, sound .rec/.idx shards and a manifest out.

`pack_images` checks the options (`options.py`) and the list (`listcheck.py`), then runs the
pipeline (`packrun.PackRun`: worker threads, or pass-through blocks on the calling thread, one
writer in list order) over the whole list or, with `only_shard`, one shard of its plan;
`finalize_pack` (`finalize.py`) gives shards packed one by one their manifest. What a run
reports is `results.py`'s.

The pack's files and manifest are `manifest.py`'s; how records are keyed, and what follows the
images, is the layout's (`layout.py`); shards are written by `shards.ShardWriter`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..doors.output import (
    OutputLock,
    make_folders,
    remove,
    remove_empty_folder,
    rename,
    write_json_atomic,
)
from ..errors import RectoolError, UsageError
from ..format.headers import unpack_header
from ..format.manifest import plan_document
from ..format.paths import PackPaths
from ..format.records import IndexedRecordFile
from .finalize import check_shard_plan, read_made_shard
from .finalize import completed_if_same as completed_if_same
from .finalize import finalize_locked as finalize_locked
from .finalize import finalize_pack as finalize_pack
from .layout import (
    LAYOUTS,  # noqa: F401 (the CLI offers them)
    image_size,
)
from .listcheck import EmptyListError as EmptyListError
from .listcheck import WrongRootError as WrongRootError
from .listcheck import check_root as check_root
from .listcheck import load_identities, stage_list
from .listcheck import validate_list as validate_list
from .manifest import (
    build_manifest,
    check_resume_state,
    finish_interrupted,
    is_complete,
    output_files,  # (public too: every file a pack may have written)
    prepare_outputs,
    refuse_inputs_among_outputs,
    remove_stale_temporaries,
    replace_beside,
    shard_files,
    source_state,
    write_manifest,
)
from .options import PackOptions as PackOptions
from .options import allowed_failures as allowed_failures
from .options import check_pack_options as check_pack_options
from .options import check_prefix as check_prefix
from .packrun import PackRun
from .results import COMPLETE as COMPLETE
from .results import FINALIZED as FINALIZED
from .results import PACKED as PACKED
from .results import RESUMED as RESUMED
from .results import PackResult as PackResult
from .results import Refusal as Refusal
from .results import ShardResult as ShardResult
from .results import read_failures_file
from .shards import plan_shards

if TYPE_CHECKING:
    from _typeshed import StrPath, SupportsRead

    from .packrun import Progress, SetupProgress
    from .shardfile import ShardFinished

    ListStream = SupportsRead[str] | SupportsRead[bytes]


def pack_images(
    list_path: StrPath,
    root: StrPath,
    prefix: StrPath | PackPaths,
    options: PackOptions | None = None,
    resume: bool = False,
    overwrite: bool = False,
    label_map: StrPath | None = None,
    progress: Progress | None = None,
    list_stream: ListStream | None = None,
    only_shard: int | None = None,
    lock_token: str | None = None,
    allow_empty: bool = False,
    on_shard_finished: ShardFinished | None = None,
    setup: SetupProgress | None = None,
) -> PackResult | ShardResult:
    """Pack the images of a .lst under `root` into shards at `prefix`; return a `PackResult`
    (a `ShardResult` with `only_shard`).

    `list_path` may be "-" with the text given as `list_stream` (it is copied beside the
    output so the run can be resumed). `progress(done, total, refused)` is called as items
    finish. Refused images are recorded, never written. With `only_shard=K` (which needs a
    shard plan: `shard_records` without `shard_bytes`) only shard K is packed, with its own
    failures file, and no manifest: `finalize_pack` writes it once every shard is done.
    A shard task started by a run that holds the prefix's lock (Dask's client) passes that
    lock's `lock_token` to join it. An empty list raises `EmptyListError` (nothing is written)
    unless `allow_empty`: a list that failed upstream must not become a "sound" empty pack.
    `on_shard_finished(info, paths)` is called as each shard is finished (`ShardWriter`).
    `setup(phase, done, total)` is told the steps before the first image, as they go (so
    that a log is never silent through them): "list bytes" (the list read and checked) and,
    resuming, "resume bytes" (the finished shards adopted, hashed) and "resume lines" (the
    list lines already done, read past).
    """
    options = options or PackOptions()
    paths = PackPaths.of(check_prefix(prefix))
    root = os.fspath(root)
    check_pack_options(options)
    refuse_inputs_among_outputs(paths, {"list": list_path, "label map": label_map})
    out_dir = paths.folder or "."
    made = not os.path.isdir(out_dir)
    make_folders(out_dir)
    try:
        return _pack_locked(
            list_path,
            root,
            paths,
            options,
            resume,
            overwrite,
            label_map,
            progress,
            list_stream,
            only_shard,
            lock_token,
            allow_empty,
            on_shard_finished,
            setup,
        )
    except (WrongRootError, EmptyListError):
        if made:  # nothing was written: leave nothing behind
            remove_empty_folder(out_dir)
        raise


def _pack_locked(
    list_path: StrPath,
    root: str,
    paths: PackPaths,
    options: PackOptions,
    resume: bool,
    overwrite: bool,
    label_map: StrPath | None,
    progress: Progress | None,
    list_stream: ListStream | None,
    only_shard: int | None,
    lock_token: str | None = None,
    allow_empty: bool = False,
    on_shard_finished: ShardFinished | None = None,
    setup: SetupProgress | None = None,
) -> PackResult | ShardResult:
    if only_shard is not None:
        # Shard tasks of one plan run side by side (a shared lock on the prefix), never beside
        # a whole run of the prefix; each also holds its own shard.
        with OutputLock(paths, shared=True, token=lock_token):
            with OutputLock(paths.shard(only_shard)):
                return _pack_shard(
                    list_path, root, paths, options, only_shard, resume, overwrite, progress, setup
                )
    with OutputLock(paths):
        finish_interrupted(paths)
        if overwrite and output_files(paths):
            result = replace_beside(
                paths,
                lambda staging: _pack_all(
                    list_path,
                    root,
                    staging,
                    options,
                    False,
                    False,
                    label_map,
                    progress,
                    list_stream,
                    allow_empty,
                    on_shard_finished,
                    setup,
                ),
            )
            return dataclasses.replace(
                result,
                manifest_path=paths.manifest,
                failures_path=paths.failures,
            )
        return _pack_all(
            list_path,
            root,
            paths,
            options,
            resume,
            overwrite,
            label_map,
            progress,
            list_stream,
            allow_empty,
            on_shard_finished,
            setup,
        )


def _pack_all(
    list_path: StrPath,
    root: str,
    paths: PackPaths,
    options: PackOptions,
    resume: bool,
    overwrite: bool,
    label_map: StrPath | None,
    progress: Progress | None,
    list_stream: ListStream | None,
    allow_empty: bool = False,
    on_shard_finished: ShardFinished | None = None,
    setup: SetupProgress | None = None,
) -> PackResult:
    complete = resume and is_complete(paths)
    if not complete:
        prepare_outputs(paths, resume, overwrite)
    from_stdin = list_path == "-"
    if from_stdin:
        # Checked as it streams, bounded, and copied beside the pack so that the run can be
        # resumed; its label map (--labels: no file is beside stdin) is read once the first
        # bytes arrive, after `rectool list ROOT - --labels F` wrote F.
        stream = list_stream if list_stream is not None else sys.stdin
        staged = stage_list(stream, paths.stdin_copy, options.layout, label_map, options.pack_label)
        list_path, identities, list_digest, total = staged
        if complete:
            remove(list_path)
    else:
        list_path = os.fspath(list_path)
        identities = load_identities(list_path, label_map)
        list_digest, total = validate_list(
            list_path, options.layout, identities, options.pack_label, _phase(setup, "list bytes")
        )
    options = dataclasses.replace(
        options, max_failures=allowed_failures(options.max_failures, total)
    )
    if not total and not allow_empty and not complete:
        if list_path == paths.stdin_copy:
            remove(list_path)
        shown = "standard input" if from_stdin else list_path
        raise EmptyListError(
            f"{shown}: the list holds no images, so nothing was packed (a list that failed on "
            "the way here?); add --allow-empty to pack an empty dataset"
        )
    if not resume:
        try:
            check_root(list_path, root, options.allow_outside_root)
        except WrongRootError:
            if list_path == paths.stdin_copy:
                remove(list_path)
            raise
    state = source_state(list_digest, root, options)
    if complete:
        # A finished pack "resumes" only with what made it, as an interrupted one does.
        return completed_if_same(paths, state)
    state_path = paths.state
    if resume and os.path.exists(state_path):
        check_resume_state(state_path, state)
    else:
        write_json_atomic(state_path, state)

    run = PackRun(list_path, root, paths, options, total, progress, setup=setup)
    run.writer.on_shard_finished = on_shard_finished
    try:
        run.execute(resume)
    except WrongRootError:  # everything refused, early: leave nothing that looks like a pack
        if not resume:
            for name in output_files(paths):
                remove(name)
        raise

    manifest = build_manifest(
        options,
        "-" if from_stdin else list_path,
        paths,
        run.writer.finished,
        run.images,
        run.failures,
        run.classes,
        identities,
        state,
    )
    final_failures = paths.failures
    rename(run.failures_partial, final_failures)
    if run.layout.numbered:  # a layout with a `property` file
        size = _property_size(paths, run)
        # The ignore: a numbered layout counts its classes (an int).
        run.layout.write_property(paths.folder, run.classes, size)  # type: ignore[arg-type]
    remove_stale_temporaries(paths)
    write_manifest(paths, manifest)
    remove(state_path)
    if os.path.exists(paths.stdin_copy):
        remove(paths.stdin_copy)
    return PackResult(
        paths.manifest,
        manifest,
        run.images,
        run.failures,
        final_failures,
        run.first_refusals,
        run.resumed_from,
        RESUMED if run.resumed_from else PACKED,
    )


def _pack_shard(
    list_path: StrPath,
    root: str,
    paths: PackPaths,
    options: PackOptions,
    number: int,
    resume: bool,
    overwrite: bool,
    progress: Progress | None,
    setup: SetupProgress | None = None,
) -> ShardResult | PackResult:
    if list_path == "-":
        raise UsageError("--only-shard needs the list as a file that every task can read, not -")
    list_path = os.fspath(list_path)
    digest, total = validate_list(
        list_path, options.layout, None, options.pack_label, _phase(setup, "list bytes")
    )
    if not resume:
        check_root(list_path, root, options.allow_outside_root)
    plan = plan_shards(total, options.shard_bytes, options.shard_records)
    if not 0 <= number < len(plan):
        raise UsageError(f"--only-shard {number}: the plan has shards 0..{len(plan) - 1}")
    if resume and is_complete(paths):
        # Finalized: the manifest says what each shard holds. A resubmitted task changes
        # nothing (no shard packed again, no plan or failures file left behind), as --resume
        # of a whole pack; made from another list or options, it is refused naming them.
        return completed_if_same(paths, source_state(digest, root, options))
    allowed = allowed_failures(options.max_failures, len(plan[number]))
    options = dataclasses.replace(options, max_failures=allowed)
    shard = paths.shard(number)
    state_path = shard.state
    existing = shard_files(shard)
    done = os.path.exists(shard.failures) and not os.path.exists(state_path)
    if existing and overwrite and is_complete(paths):
        raise RectoolError(
            f"{paths.manifest}: the pack is complete; packing shard {number} again with "
            "--overwrite would break it (pack the whole list with --overwrite, or shards to "
            "another OUT_PREFIX)"
        )
    if existing and overwrite:
        for name in existing:
            remove(name)
    elif existing and not resume:
        raise RectoolError(f"{existing[0]}: shard output exists; use --resume or --overwrite")
    if resume and done and os.path.lexists(shard.plan):
        # A complete shard is described, not packed again: only if this plan packed it.
        records = options.shard_records or total
        expected = (len(plan), number, records, total, digest)
        check_shard_plan(shard.plan, read_made_shard(shard.plan, number), expected, options)
    state = source_state(digest, root, options)
    if resume and os.path.exists(state_path):
        check_resume_state(state_path, state)
    elif not (resume and done):
        write_json_atomic(state_path, state)
    shards, records = len(plan), options.shard_records or total
    plan_file = plan_document(shards, number, records, total, digest)
    plan_file["options"] = options.byte_options()  # what --finalize must pack alike
    if not (resume and done) or not os.path.exists(shard.plan):
        # Until --finalize, the shard says which plan it is part of (`refuse_unfinished_plan`).
        write_json_atomic(shard.plan, plan_file)
    run = PackRun(
        list_path,
        root,
        paths,
        options,
        len(plan[number]),
        progress,
        (number, plan[number]),
        setup,
    )
    if resume and done:
        run.writer.resume()  # already complete: describe it, change nothing
        refused = read_failures_file(shard.failures)
        info = run.writer.finished[0]
        return ShardResult(
            number,
            len(plan),
            info,
            len(refused),
            shard.failures,
            refused[:100],
            info.records + len(refused),
            allowed,
        )
    try:
        run.execute(resume)
    except WrongRootError:  # everything refused, early: leave no shard behind
        if not resume:
            for name in shard_files(shard):
                remove(name)
        raise
    rename(run.failures_partial, shard.failures)
    # And which files this task wrote, so that --finalize knows a shard replaced since.
    write_json_atomic(shard.plan, {**plan_file, "packed": run.writer.finished[0].digests})
    remove(state_path)
    return ShardResult(
        number,
        len(plan),
        run.writer.finished[0],
        run.failures,
        shard.failures,
        run.first_refusals,
        run.resumed_from,
        allowed,
    )


def plan_list(list_path: StrPath, options: PackOptions) -> list[range]:
    """Return the shard plan of a list file: one range of list positions per shard."""
    _, total = validate_list(os.fspath(list_path), options.layout, pack_label=options.pack_label)
    return plan_shards(total, options.shard_bytes, options.shard_records)


def _phase(setup: SetupProgress | None, phase: str) -> Callable[[int, int], object] | None:
    """Return `setup` as the progress of one phase, `(done, total)`."""
    if setup is None:
        return None
    return lambda done, total: setup(phase, done, total)


def _property_size(paths: PackPaths, run: PackRun) -> tuple[int, int] | None:
    """Return the (height, width) of the first image packed, or None when there is none."""
    size = run.image_size
    if size is None and run.images:
        # A resumed run may have written no image itself: take the size from key 1.
        with IndexedRecordFile(paths.rec, paths.idx) as records:
            size = image_size(unpack_header(records.read(1))[1])
    return size
