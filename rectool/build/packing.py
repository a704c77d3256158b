"""The packing pipeline: a .lst and an image tree in, sound .rec/.idx shards and a manifest out.

Worker threads read, check and (optionally) re-encode images; OpenCV releases the GIL, so they
run in parallel. One writer consumes their results strictly in list order, so the bytes never
depend on `workers` or timing, and at most a bounded window of images is in flight. Passing
images through, which is reading rather than computing, runs a block at a time on the calling
thread instead (see `passthrough.py`), until reads prove slow. Both paths hand the writer the
same shape, runs of framed records with refusals between them (`_PackRun._consume`).

The pack's files and manifest are `manifest.py`'s; how records are keyed, and what follows the
images, is the layout's (`layout.py`); shards are written by `shards.ShardWriter`.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import os
import re
import signal
import stat
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from ..doors.inputs import dataset_path, open_input
from ..doors.output import (
    OutputLock,
    create_new,
    make_folders,
    open_existing,
    remove,
    remove_empty_folder,
    rename,
    stage_file,
    truncate,
    write_json_atomic,
)
from ..errors import RectoolError, UsageError
from ..format.keys import FLOAT32_EXACT
from ..format.records import IndexedRecordFile
from ..reader import (
    MAX_RECORD_BYTES,
    read_manifest,
    unpack_header,
)
from .images import (
    CHECK_MODES,
    DEFAULT_MAX_PIXELS,
    ImageRefused,
    Transform,
    check_image,
    reencode_image,
)
from .layout import (
    LAYOUTS,  # noqa: F401 (the CLI offers them)
    image_size,
    layout_named,
)
from .listfile import (
    ListFormatError,
    find_label_map,
    format_label,
    iter_list,
    parse_list_line,
    read_label_map,
)
from .manifest import (
    FAILURES_SUFFIX,
    PARTIAL_SUFFIX,
    STAGING_SUFFIX,  # noqa: F401 (the CLI names the staging folder in messages)
    STATE_SUFFIX,
    STDIN_COPY_SUFFIX,
    build_manifest,
    check_resume_state,
    check_same_source,
    copy_stream,
    finish_interrupted,
    is_complete,
    manifest_path,
    manifest_source,
    output_files,  # noqa: F401 (public: every file a pack may have written)
    prepare_outputs,
    remove_stale_temporaries,
    replace_beside,
    shard_files,
    shard_stem,
    source_state,
)
from .passthrough import (
    OUTSIDE_ROOT,
    OUTSIDE_ROOT_LINK,
    TOO_LARGE,
    OutsideRoot,
    PassThroughPacker,
    RootGuard,
    frame_image,
    not_regular,
    resolve_path,
)
from .shards import ShardWriter, describe_shard, plan_shards, shard_digests

# Items go to worker threads in chunks: one future per image would cost more than a check.
CHUNK_ITEMS = 32
# Pass-through from a fast disk takes about 10 us an image, all Python; a network file system
# takes a millisecond, waiting. Over this average, two windows in a row, worker threads take
# over. (One window could be a stall of the machine, not of the files.)
SLOW_ITEM_SECONDS = 0.0001
SWITCH_WINDOW = 1024  # items timed at a time
# Pass-through blocks hold at most this many items (and BLOCK_BYTES of records).
BLOCK_ITEMS = 4096


@dataclass(frozen=True)
class PackOptions:
    """How to pack; every field but `workers` can change the bytes written."""

    transform: Transform | None = None  # None: pass the original bytes through
    check: str = "structure"  # pass-through check: one of images.CHECK_MODES
    pack_label: bool = False
    shard_bytes: int | None = None
    shard_records: int | None = None
    layout: str = "images"
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_failures: int = 0
    allow_outside_root: bool = False  # pack list paths that leave ROOT (absolute, `..`)
    # Images whose header declares more pixels are refused before decoding (--check none: kept).
    max_pixels: int = DEFAULT_MAX_PIXELS
    # The manifest gives each file's SHA-256 beside its xxh3-128 (.rec/.idx bytes unchanged).
    sha256: bool = False

    def byte_options(self):
        """Return the options that determine the output bytes (compared on --resume).

        Not `max_pixels`: a safety limit like `max_failures`; what it refuses is listed in the
        failures file.
        """
        doc = asdict(self)
        for name in ("workers", "max_failures", "max_pixels", "sha256"):
            doc.pop(name)
        return doc


@dataclass(frozen=True)
class Refusal:
    """An image that was not packed: its list line, index, path and why."""

    line: int
    index: int
    path: str
    reason: str

    def to_json(self):
        return {"line": self.line, "index": self.index, "path": self.path, "reason": self.reason}


# What a run did to a pack: `PackResult.outcome`.
PACKED = "packed"  # packed from the first list item
RESUMED = "resumed"  # continued an interrupted pack after `resumed_from` list items
COMPLETE = "complete"  # nothing to do: the pack was already complete, made the same way
FINALIZED = "finalized"  # shards packed one by one were checked and given a manifest


@dataclass
class PackResult:
    """What `pack_images` did; `outcome` is one of PACKED, RESUMED, COMPLETE, FINALIZED."""

    manifest_path: str
    manifest: dict
    images: int
    failures: int
    failures_path: str
    refused: list  # the first refusals, as `Refusal`s
    resumed_from: int = 0
    outcome: str = PACKED

    @property
    def accepted(self):
        """Return True when no more images were refused than `max_failures` allows."""
        return self.failures <= self.manifest["options"]["max_failures"]

    @property
    def max_failures(self):
        return self.manifest["options"]["max_failures"]

    @property
    def shard_paths(self):
        """Return each shard's .rec, in the manifest's folder as `manifest_path` names it."""
        folder = os.path.dirname(self.manifest_path)
        return [os.path.join(folder, s["rec"]) for s in self.manifest["shards"]]

    def to_json(self):
        """Return the result as plain data (what `rectool pack --json` prints)."""
        totals = self.manifest["totals"]
        return {
            "outcome": self.outcome,
            "manifest": self.manifest_path,
            "shards": self.shard_paths,
            "images": self.images,
            "records": totals["records"],
            "rec_bytes": totals["rec_bytes"],
            "failures": self.failures,
            "failures_file": self.failures_path,
            "max_failures": self.max_failures,
            "accepted": self.accepted,
            "resumed_from": self.resumed_from,
            "refused": [r.to_json() for r in self.refused],
        }


def pack_images(
    list_path,
    root,
    prefix,
    options=None,
    resume=False,
    overwrite=False,
    label_map=None,
    progress=None,
    list_stream=None,
    only_shard=None,
    lock_token=None,
    allow_empty=False,
    on_shard_finished=None,
):
    """Pack the images of a .lst under `root` into shards at `prefix`; return a `PackResult`.

    `list_path` may be "-" with the text given as `list_stream` (it is copied beside the
    output so the run can be resumed). `progress(done, total, refused)` is called as items
    finish. Refused images are recorded, never written. With `only_shard=K` (which needs a
    shard plan: `shard_records` without `shard_bytes`) only shard K is packed, with its own
    failures file, and no manifest: `finalize_pack` writes it once every shard is done.
    A shard task started by a run that holds the prefix's lock (Dask's client) passes that
    lock's `lock_token` to join it. An empty list raises `EmptyListError` (nothing is written)
    unless `allow_empty`: a list that failed upstream must not become a "sound" empty pack.
    `on_shard_finished(info, paths)` is called as each shard is finished (`ShardWriter`).
    """
    options = options or PackOptions()
    prefix = check_prefix(prefix)
    root = os.fspath(root)
    check_pack_options(options)
    out_dir = os.path.dirname(prefix) or "."
    made = not os.path.isdir(out_dir)
    make_folders(out_dir)
    try:
        return _pack_locked(
            list_path, root, prefix, options, resume, overwrite, label_map, progress,
            list_stream, only_shard, lock_token, allow_empty, on_shard_finished,
        )  # fmt: skip
    except (WrongRootError, EmptyListError):
        if made:  # nothing was written: leave nothing behind
            remove_empty_folder(out_dir)
        raise


def _pack_locked(list_path, root, prefix, options, resume, overwrite, label_map, progress,
                 list_stream, only_shard, lock_token=None, allow_empty=False,
                 on_shard_finished=None):  # fmt: skip
    if only_shard is not None:
        # Shard tasks of one plan run side by side (a shared lock on the prefix), never beside
        # a whole run of the prefix; each also holds its own shard.
        with OutputLock(prefix, shared=True, token=lock_token):
            with OutputLock(shard_stem(prefix, only_shard)):
                return _pack_shard(
                    list_path, root, prefix, options, only_shard, resume, overwrite, progress
                )
    with OutputLock(prefix):
        finish_interrupted(prefix)
        if overwrite and output_files(prefix):
            result = replace_beside(
                prefix,
                lambda staging: _pack_all(
                    list_path, root, staging, options, False, False, label_map, progress,
                    list_stream, allow_empty, on_shard_finished,
                ),
            )  # fmt: skip
            return dataclasses.replace(
                result,
                manifest_path=manifest_path(prefix),
                failures_path=prefix + FAILURES_SUFFIX,
            )
        return _pack_all(
            list_path, root, prefix, options, resume, overwrite, label_map, progress, list_stream,
            allow_empty, on_shard_finished,
        )  # fmt: skip


def _pack_all(list_path, root, prefix, options, resume, overwrite, label_map, progress,
              list_stream, allow_empty=False, on_shard_finished=None):  # fmt: skip
    complete = resume and is_complete(prefix)
    if not complete:
        prepare_outputs(prefix, resume, overwrite)
    from_stdin = list_path == "-"
    if from_stdin:
        list_path = copy_stream(list_stream if list_stream is not None else sys.stdin, prefix)
    list_path = os.fspath(list_path)
    # Read only now, once the whole list has arrived: `rectool list ROOT - --labels F` writes F
    # before its first list line, so a pipe into `pack - ... --labels F` finds it. A list read
    # from stdin has no file beside which a label map could be found.
    identities = _load_identities(None if from_stdin else list_path, label_map)
    try:
        list_digest, total = validate_list(list_path, options.layout, identities)
    finally:
        if complete and list_path == prefix + STDIN_COPY_SUFFIX:
            remove(list_path)
    options = dataclasses.replace(
        options, max_failures=allowed_failures(options.max_failures, total)
    )
    if not total and not allow_empty and not complete:
        if list_path == prefix + STDIN_COPY_SUFFIX:
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
            if list_path == prefix + STDIN_COPY_SUFFIX:
                remove(list_path)
            raise
    state = source_state(list_digest, root, options)
    if complete:
        # A finished pack "resumes" only with what made it, as an interrupted one does.
        return completed_if_same(prefix, state)
    state_path = prefix + STATE_SUFFIX
    if resume and os.path.exists(state_path):
        check_resume_state(state_path, state)
    else:
        write_json_atomic(state_path, state)

    run = _PackRun(list_path, root, prefix, options, total, progress)
    run.writer.on_shard_finished = on_shard_finished
    run.execute(resume)

    manifest = build_manifest(
        options, "-" if from_stdin else list_path, prefix, run.writer.finished, run.images,
        run.failures, run.classes, identities, state,
    )  # fmt: skip
    final_failures = prefix + FAILURES_SUFFIX
    rename(run.failures_partial, final_failures)
    if run.layout.numbered:  # a layout with a `property` file
        size = _property_size(prefix, run)
        run.layout.write_property(os.path.dirname(prefix), run.classes, size)
    remove_stale_temporaries(prefix)
    write_json_atomic(manifest_path(prefix), manifest)
    remove(state_path)
    if os.path.exists(prefix + STDIN_COPY_SUFFIX):
        remove(prefix + STDIN_COPY_SUFFIX)
    return PackResult(
        manifest_path(prefix),
        manifest,
        run.images,
        run.failures,
        final_failures,
        run.first_refusals,
        run.resumed_from,
        RESUMED if run.resumed_from else PACKED,
    )


@dataclass
class ShardResult:
    """What packing one shard of a plan did (`pack_images(..., only_shard=K)`)."""

    shard: int
    shards: int  # in the plan
    info: object  # shards.ShardInfo
    failures: int
    failures_path: str
    refused: list
    resumed_from: int = 0
    max_failures: int = 0

    @property
    def accepted(self):
        """Return True when this shard refused no more images than `max_failures` allows.

        A task is judged by its own shard, so the exit status of a job-array task tells its
        own truth; `finalize_pack` judges the whole pack."""
        return self.failures <= self.max_failures

    @property
    def rec_path(self):
        """Return the shard's .rec, in the folder `failures_path` names."""
        return os.path.join(os.path.dirname(self.failures_path), self.info.rec)

    def to_json(self):
        """Return the result as plain data (what `rectool pack --only-shard K --json` prints)."""
        return {
            "shard": self.shard,
            "shards": self.shards,
            "rec": self.rec_path,
            "records": self.info.records,
            "failures": self.failures,
            "failures_file": self.failures_path,
            "max_failures": self.max_failures,
            "accepted": self.accepted,
            "resumed_from": self.resumed_from,
            "refused": [r.to_json() for r in self.refused],
        }


def _pack_shard(list_path, root, prefix, options, number, resume, overwrite, progress):
    if list_path == "-":
        raise UsageError("--only-shard needs the list as a file that every task can read, not -")
    list_path = os.fspath(list_path)
    digest, total = validate_list(list_path, options.layout)
    if not resume:
        check_root(list_path, root, options.allow_outside_root)
    plan = plan_shards(total, options.shard_bytes, options.shard_records)
    if not 0 <= number < len(plan):
        raise UsageError(f"--only-shard {number}: the plan has shards 0..{len(plan) - 1}")
    options = dataclasses.replace(
        options, max_failures=allowed_failures(options.max_failures, len(plan[number]))
    )
    stem = shard_stem(prefix, number)
    state_path = stem + STATE_SUFFIX
    existing = shard_files(stem)
    done = os.path.exists(stem + FAILURES_SUFFIX) and not os.path.exists(state_path)
    if existing and overwrite and is_complete(prefix):
        raise RectoolError(
            f"{manifest_path(prefix)}: the pack is complete; packing shard {number} again with "
            "--overwrite would break it (pack the whole list with --overwrite, or shards to "
            "another OUT_PREFIX)"
        )
    if existing and overwrite:
        for name in existing:
            remove(name)
    elif existing and not resume:
        raise RectoolError(f"{existing[0]}: shard output exists; use --resume or --overwrite")
    state = source_state(digest, root, options)
    if resume and os.path.exists(state_path):
        check_resume_state(state_path, state)
    elif not (resume and done):
        write_json_atomic(state_path, state)
    run = _PackRun(
        list_path, root, prefix, options, len(plan[number]), progress, (number, plan[number])
    )
    if resume and done:
        run.writer.resume()  # already complete: describe it, change nothing
        refused = _read_refusals(stem + FAILURES_SUFFIX)
        info = run.writer.finished[0]
        return ShardResult(number, len(plan), info, len(refused), stem + FAILURES_SUFFIX,
                           refused[:100], info.records + len(refused),
                           options.max_failures)  # fmt: skip
    run.execute(resume)
    rename(run.failures_partial, stem + FAILURES_SUFFIX)
    remove(state_path)
    return ShardResult(
        number, len(plan), run.writer.finished[0], run.failures, stem + FAILURES_SUFFIX,
        run.first_refusals, run.resumed_from, options.max_failures,
    )  # fmt: skip


def _read_refusals(path):
    with open_input(path, "failures file", "utf-8", follow=False) as f:
        return [Refusal(**json.loads(line)) for line in f]


def plan_list(list_path, options):
    """Return the shard plan of a list file: one range of list positions per shard."""
    _, total = validate_list(os.fspath(list_path), options.layout)
    return plan_shards(total, options.shard_bytes, options.shard_records)


def finalize_pack(list_path, root, prefix, options=None, label_map=None):
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


def finalize_locked(list_path, root, prefix, options, label_map):
    """`finalize_pack` once the prefix is locked."""
    list_path = os.fspath(list_path)
    identities = _load_identities(list_path, label_map)
    digest, total = validate_list(list_path, options.layout, identities)
    options = dataclasses.replace(
        options, max_failures=allowed_failures(options.max_failures, total)
    )
    if is_complete(prefix):
        return completed_if_same(prefix, source_state(digest, root, options))
    plan = plan_shards(total, options.shard_bytes, options.shard_records)
    infos, refused = [], []
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
        refused += _read_refusals(failures)
    final_failures = prefix + FAILURES_SUFFIX
    shard_failures = [shard_stem(prefix, n) + FAILURES_SUFFIX for n in range(len(plan))]
    rename(stage_file(final_failures, _concatenated(shard_failures)), final_failures)
    images = sum(info.records for info in infos)
    source = source_state(digest, root, options)
    manifest = build_manifest(
        options, list_path, prefix, infos, images, len(refused), None, identities, source
    )
    remove_stale_temporaries(prefix)
    write_json_atomic(manifest_path(prefix), manifest)
    for name in shard_failures:  # only now: until the manifest, a rerun needs them
        remove(name)
    return PackResult(
        manifest_path(prefix), manifest, images, len(refused), final_failures, refused[:100],
        0, FINALIZED,
    )  # fmt: skip


def _concatenated(paths, size=1 << 20):
    for path in paths:
        with open_input(path, "failures file") as f:
            while block := f.read(size):
                yield block


# A wrong ROOT is told from a few missing files by this many list items, all missing.
ROOT_CHECK_ITEMS = 100


class EmptyListError(UsageError):
    """The list holds no images and an empty pack was not asked for."""


class WrongRootError(RectoolError):
    """None of the first images of the list exist under ROOT."""


def check_root(list_path, root, allow_outside_root=False):
    """Raise `WrongRootError` when none of the first `ROOT_CHECK_ITEMS` list items exist under
    `root`: ROOT is wrong, and packing would only refuse every image."""
    prefix = os.path.join(os.fspath(root), "")
    try:
        with open_input(list_path, "list file", "utf-8", "\n") as f:
            items = list(itertools.islice(iter_list(f, os.fspath(list_path)),
                                          ROOT_CHECK_ITEMS))  # fmt: skip
    except (OSError, UnicodeDecodeError, RectoolError):
        return  # reported, naming the line, where the list is validated
    for item in items:
        path = resolve_path(prefix, item.path, allow_outside_root)
        if path is not None and os.path.lexists(path):
            return
    if items:
        raise WrongRootError(
            f"{os.fspath(root)}: none of the first {len(items)} listed images exist under ROOT "
            f"(the first: {items[0].path}); is ROOT right? Nothing was written"
        )


def check_prefix(prefix):
    """Return `prefix` as a string; raise `UsageError` when it names a folder (`""`, `.`,
    `..`, `out/`), which would give hidden files such as `out/.rec`."""
    prefix = os.fspath(prefix)
    if os.path.basename(prefix) in ("", ".", ".."):
        raise UsageError(
            f"OUT_PREFIX {prefix!r} names a folder, not the start of file names; "
            "give one such as out/faces (for out/faces.rec, out/faces.idx)"
        )
    return prefix


def allowed_failures(max_failures, total):
    """Return the refusals allowed among `total` images: `max_failures` itself (a count), or
    that share of them rounded down (a float from 0 to 1, `--max-failures 0.1%`)."""
    if isinstance(max_failures, float):
        return int(max_failures * total)
    return max_failures


def check_pack_options(options):
    limit = options.max_failures
    if (
        isinstance(limit, bool)
        or not isinstance(limit, (int, float))
        or not (0 <= limit and (isinstance(limit, int) or limit <= 1))
    ):
        raise UsageError(f"max_failures must be a count or a share from 0 to 1, not {limit!r}")
    layout_named(options.layout).check_options(options)
    if options.check not in CHECK_MODES:
        raise UsageError(f"unknown check {options.check!r}; choose from {', '.join(CHECK_MODES)}")
    if options.workers < 1:
        raise UsageError("--workers must be at least 1")


# The fields of a complete pack's manifest that describing it again reads.
COMPLETE_FIELDS = ("failures_file", "totals.images", "totals.failures", "totals.rec_bytes",
                   "options.max_failures")  # fmt: skip


def completed_if_same(prefix, state):
    """Describe the complete pack at `prefix` if it was made as `state` (a `source_state`)
    says; else raise naming what differs."""
    manifest = read_manifest(manifest_path(prefix))
    check_same_source(manifest_path(prefix), manifest_source(manifest), state, "pack")
    return _completed_result(prefix)


def _completed_result(prefix):
    """Describe a pack that is already complete (so `--resume` can be run again safely)."""
    manifest = read_manifest(manifest_path(prefix), require=COMPLETE_FIELDS)
    folder = os.path.dirname(prefix) or "."
    failures_path = dataset_path(folder, manifest["failures_file"], "failures file")
    with open_input(failures_path, "failures file", "utf-8", within=folder) as f:
        refused = [Refusal(**json.loads(line)) for line in itertools.islice(f, 100)]
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


# Ordinary lines (`index<TAB>number...<TAB>path`), matched a block at a time at C speed. Their
# numbers have no exponent and at most 7 integer digits, so a float32 holds every integral one
# exactly (below 2**24), and paths hold no NUL; other lines (rare) are checked one by one,
# which names a bad one.
_NUMBER = rb"[-+]?(?:[0-9]{1,7}(?:\.[0-9]*)?|\.[0-9]+)"
# Possessive (`++`, `*+`): no backtracking, several times faster. A label must be followed by a
# tab, so the path (followed by the newline) is never taken for one.
try:
    _PLAIN_LINES = re.compile(rb"(?:[0-9]++(?:\t" + _NUMBER + rb"(?=\t))++\t[^\t\n\0]++\n)*+")
except re.error:  # Python 3.10: the same lines, with backtracking
    _PLAIN_LINES = re.compile(rb"(?:[0-9]+(?:\t" + _NUMBER + rb")+\t[^\t\n\0]+\n)*")
_LINE_INDEX = re.compile(rb"^([0-9]+)\t", re.M)
# With a label map: ordinary lines whose one label is an integer (`3`, or im2rec's `3.000000`);
# their index and label, taken a block at a time.
_MAPPED_LINES = re.compile(rb"(?:[0-9]+\t[0-9]{1,7}(?:\.0*)?\t[^\t\n\0]+\n)*")
_LINE_INDEX_LABEL = re.compile(rb"^([0-9]+)\t([0-9]+)(?:\.0*)?\t", re.M)
_LIST_BLOCK = 1 << 20


def validate_list(path, layout, identities=None):
    """Parse every line once before packing; return (sha256 of the file, number of items).

    A bad line, a repeated index, a label the layout (a name) cannot key or, given the label
    map `identities` (label -> name), a label not in it stops the run here, before anything
    is written. The file is read a block at a time, so memory does not grow
    with the list (but for 8 bytes an index when the indices are not in increasing order).
    """
    layout = layout_named(layout)
    digest = hashlib.sha256()
    count, last, unordered = 0, -1, []
    try:
        with open_input(path, "list file") as f:
            rest = b""
            while True:
                block = f.read(_LIST_BLOCK)
                digest.update(block)
                data = rest + block
                if not block:
                    if data and not data.endswith(b"\n"):
                        data += b"\n"
                    rest = b""
                else:
                    cut = data.rfind(b"\n") + 1
                    data, rest = data[:cut], data[cut:]
                # A numbered layout checks each item's label: line by line.
                lines = _MAPPED_LINES if identities is not None else _PLAIN_LINES
                if layout.numbered or not lines.fullmatch(data):
                    return _validate_list_slowly(path, layout, identities)  # names the line
                if data:
                    data.decode("utf-8")  # raises for invalid UTF-8, reported slowly below
                    if identities is None:
                        found = np.array(_LINE_INDEX.findall(data)).astype(np.int64)
                    else:
                        pairs = np.array(_LINE_INDEX_LABEL.findall(data)).astype(np.int64)
                        found = pairs[:, 0]
                        if not _all_mapped(pairs[:, 1], identities):
                            return _validate_list_slowly(path, layout, identities)
                    count += len(found)
                    if unordered or found[0] <= last or (found[1:] <= found[:-1]).any():
                        unordered.append(found)
                    last = int(found[-1])
                if not block:
                    break
    except FileNotFoundError:
        raise RectoolError(f"{path}: list file not found") from None
    except (UnicodeDecodeError, OverflowError, ValueError):
        return _validate_list_slowly(path, layout, identities)
    if unordered:
        everything = np.concatenate(unordered)
        if len(np.unique(everything)) != len(everything):
            return _validate_list_slowly(path, layout, identities)  # names the repeated index
    return digest.hexdigest(), count


def _all_mapped(labels, identities):
    """Return whether every label (int64, none negative) is a label of the map."""
    if not len(labels):
        return True
    if len(identities) and max(identities) == len(identities) - 1:  # 0..N-1, the usual map
        return int(labels.max()) < len(identities)
    return bool(np.isin(labels, np.fromiter(identities, np.int64, len(identities))).all())


# A label spelled as an integer (`16777217`, im2rec's `16777217.000000`): a class id, which
# must reach the record as written. (Other spellings are real values, rounded as floats are.)
_INTEGER_LABEL = re.compile(r"[-+]?[0-9]+(?:\.0*)?")


def _check_float32(text, item, path):
    """Raise `ListFormatError` for an integer label that float32, the records' label type, would
    store as another integer (16777217 as 16777216)."""
    for spelled, label in zip(text.split("\t")[1:-1], item.labels):
        if abs(label) > FLOAT32_EXACT and _INTEGER_LABEL.fullmatch(spelled.strip()):
            stored = float(np.float32(label))
            if stored != label:
                raise ListFormatError(
                    f"label {format_label(label)} is not a float32, the type records store "
                    f"labels in: it would be stored as {format_label(stored)}",
                    path,
                    item.line,
                )


def _check_mapped(item, identities, path):
    """Raise `ListFormatError` for a label of `item` that the label map does not hold."""
    for label in item.labels:
        if not (label.is_integer() and int(label) in identities):
            known = f"{len(identities)} identities, labels {min(identities, default=0)}.."
            known += f"{max(identities, default=-1)}"
            raise ListFormatError(
                f"label {format_label(label)} is not in the label map ({known}): a label "
                "must be the integer of one of its identities",
                path,
                item.line,
            )


def _validate_list_slowly(path, layout, identities=None):
    """Parse line by line, naming the first bad line or repeated index."""
    digest = hashlib.sha256()
    keys = _KeyRegistry()
    count = 0
    with open_input(path, "list file") as f:
        for number, raw in enumerate(f, start=1):
            digest.update(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RectoolError(
                    f"{path}: line {number}: not valid UTF-8 ({exc.reason})"
                ) from None
            item = parse_list_line(text.rstrip("\n").rstrip("\r"), path, number)
            if not keys.add(item.index):
                raise ListFormatError(f"index {item.index} appears twice", path, item.line)
            layout.check_item(item, path)
            _check_float32(text, item, path)
            if identities is not None:
                _check_mapped(item, identities, path)
            count += 1
    return digest.hexdigest(), count


def _load_identities(list_path, label_map):
    """Return the label map given, else the one beside `list_path` (None: look nowhere)."""
    if label_map:
        path = os.fspath(label_map)
    else:
        path = None if list_path is None else find_label_map(list_path)
    if path is None:
        return None
    try:
        return read_label_map(path)
    except FileNotFoundError:
        raise RectoolError(f"{path}: label map not found") from None


class _KeyRegistry:
    """Detect a repeated list index with a bitmap: memory grows with the largest index, not N."""

    def __init__(self):
        self._bits = bytearray()
        self._large = set()

    def add(self, key):
        if key >= 1 << 33:
            if key in self._large:
                return False
            self._large.add(key)
            return True
        byte, bit = key >> 3, 1 << (key & 7)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        if self._bits[byte] & bit:
            return False
        self._bits[byte] |= bit
        return True


class _PackRun:
    """One execution of the pipeline; holds the counters the manifest reports."""

    def __init__(self, list_path, root, prefix, options, total, progress, part=None):
        self.list_path, self.root, self.prefix = list_path, root, prefix
        self.options, self.total, self.progress = options, total, progress
        self.layout = layout_named(options.layout)
        # `part`: (shard number, its list positions) when packing one shard of a plan.
        self.positions = part[1] if part else range(total)
        first, last = (part[0], part[0]) if part else (0, None)
        if part is None and options.shard_records and not options.shard_bytes:
            last = len(plan_shards(total, None, options.shard_records)) - 1
        self.last_shard = last
        self.writer = ShardWriter(
            prefix, options.shard_bytes, options.shard_records, first_shard=first, last_shard=last,
            sha256=options.sha256,
        )  # fmt: skip
        stem = shard_stem(prefix, part[0]) if part else prefix
        self.failures_partial = stem + FAILURES_SUFFIX + PARTIAL_SUFFIX
        self.images = 0
        self.failures = 0
        self.first_refusals = []
        self.resumed_from = 0
        self.label_counts = collections.Counter()  # numbered layouts: images per identity
        self.max_label = -1
        self.image_size = None
        self._fault = _test_fault()

    # -- items ------------------------------------------------------------------------------
    def _items(self):
        with open_input(self.list_path, "list file", "utf-8", "\n") as f:
            yield from self.layout.order(iter_list(f, self.list_path))

    @property
    def classes(self):
        """Return the identities counted while writing (numbered layouts), else None."""
        return self.max_label + 1 if self.layout.numbered else None

    # -- resume -----------------------------------------------------------------------------
    def _resume(self):
        written = self.writer.resume(drop_tail=self.layout.written_after_images)
        refused_lines = set()
        if os.path.islink(self.failures_partial):
            raise RectoolError(
                f"{self.failures_partial}: is a symlink, not a file this pack wrote; remove it"
            )
        if os.path.exists(self.failures_partial):
            with open_input(self.failures_partial, "failures file", follow=False) as f:
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            truncate(self.failures_partial, len(complete))
            for raw in complete.splitlines():
                entry = json.loads(raw)
                refused_lines.add(entry["line"])
                if len(self.first_refusals) < 100:
                    self.first_refusals.append(Refusal(**entry))
        self.failures = len(refused_lines)
        self.images = written
        self.resumed_from = written + self.failures
        return refused_lines

    # -- the pipeline -----------------------------------------------------------------------
    def execute(self, resume):
        refused_lines = self._resume() if resume else set()
        skip = self.resumed_from
        if resume:
            self._failures_fd = open_existing(self.failures_partial)
        else:
            self._failures_fd = create_new(self.failures_partial)
        self.writer.register(self._failures_fd, self.failures_partial)
        try:
            items = itertools.islice(self._items(), self.positions.start, self.positions.stop)
            for item in itertools.islice(items, skip):
                if item.line not in refused_lines:
                    self._count_label(item)
            self._position = self.positions.start + skip
            self._report(skip)
            self._process(items, skip)
            self._finish()
        except BaseException:
            self.writer.abort()
            raise
        finally:
            os.close(self._failures_fd)

    def _process(self, items, done):
        may_switch = self.options.workers > 1
        worker = _ImageWorker(self.root, self.options)
        chunks = _chunks(items, CHUNK_ITEMS)
        if _io_bound(self.options):
            done, finished = self._process_blocks(items, done, may_switch)
            if finished:
                return
        elif self.options.workers == 1:
            for chunk in chunks:
                done = self._consume(self._results(chunk, worker.prepare_chunk(chunk)), done)
            return
        window = collections.deque()
        limit = 4 * self.options.workers
        with ThreadPoolExecutor(self.options.workers, thread_name_prefix="rectool-pack") as pool:
            for chunk in chunks:
                window.append((chunk, pool.submit(worker.prepare_chunk, chunk)))
                if len(window) >= limit:
                    chunk, pending = window.popleft()
                    done = self._consume(self._results(chunk, pending.result()), done)
            while window:
                chunk, pending = window.popleft()
                done = self._consume(self._results(chunk, pending.result()), done)

    def _results(self, chunk, results):
        """Return a chunk's worker results as a `_ChunkResults`, numbered (framed here) from
        the next key when the layout numbers images as written."""
        return _ChunkResults(chunk, results, self.layout.first_key(self.images))

    def _process_blocks(self, items, done, may_switch):
        """Pass images through a block at a time on this thread; return (done, finished),
        stopping when reads are slow (see `_ReadTimer`)."""
        packer = PassThroughPacker(
            self.root,
            self.options.check,
            self.options.pack_label,
            wait=self.writer.wait_written,
            allow_outside_root=self.options.allow_outside_root,
            max_pixels=self.options.max_pixels,
        )
        timer = _ReadTimer()
        while True:
            packer.wait_for_buffer()  # waiting for the writer is not reading: not timed
            timer.start()
            block = packer.fill(
                items,
                # Blocks no longer than a timing window, so that slow reads are noticed early.
                SWITCH_WINDOW if may_switch else BLOCK_ITEMS,
                first_key=self.layout.first_key(self.images),
            )
            if block is None:
                return done, True
            slow = timer.slow(len(block.items))
            done = self._consume(block, done)
            if may_switch and slow:
                return done, False

    def _consume(self, block, done):
        """Write the records and refusals of a pass-through `Block` or a `_ChunkResults` in
        list order; return the new count of items done."""
        numbered = self.layout.numbered
        for run in block.runs():
            if len(run) == 2:
                self._refuse(*run)
                self._position += 1
                continue
            items, data, starts, first = run
            count = len(items)
            positions = range(self._position, self._position + count)
            if numbered:
                keys = list(range(self.images + 1, self.images + 1 + count))
                if self.image_size is None:
                    self.image_size = image_size(block.image(first))
                for item in items:
                    self._count_label(item)
            else:
                keys = [item.index for item in items]
            self.writer.add_run(data, keys, starts, positions)
            self.images += count
            self._position += count
        if block.reuses_buffer:
            block.written = self.writer.flush()  # the packer reuses the buffer once written
        done += len(block.items)
        self._report(done)
        return done

    def _count_label(self, item):
        if self.layout.numbered:
            label = int(item.labels[0])
            self.label_counts[label] += 1
            self.max_label = max(self.max_label, label)

    def _refuse(self, item, reason):
        refusal = Refusal(item.line, item.index, item.path, reason)
        # Records before this one must reach the file first, so that what a kill leaves is a
        # prefix of the list's outcomes (see ShardWriter.resume).
        line = json.dumps(refusal.to_json(), ensure_ascii=False) + "\n"
        self.writer.write_after(self._failures_fd, line.encode("utf-8"))
        self.failures += 1
        if len(self.first_refusals) < 100:
            self.first_refusals.append(refusal)

    def _report(self, done):
        if self.progress is not None:
            self.progress(done, self.total, self.failures)
        if self._fault is not None and done >= self._fault[1]:
            signal_number, self._fault = self._fault[0], None
            os.kill(os.getpid(), signal_number)

    def _finish(self):
        for key, framed in self.layout.records_after(self.images, self.label_counts):
            self.writer.add(key, framed)
        self.writer.close(self.last_shard)


class _ImageWorker:
    """Reads, checks or re-encodes, and frames images, in worker threads.

    OpenCV and file reads release the GIL; measured here, processes cost more CPU in pickling
    and pipes than they save (see docs/benchmarks.md).
    """

    def __init__(self, root, options):
        self.root, self.options = root, options
        self._prefix = os.path.join(root, "")
        self._guard = RootGuard(root, options.allow_outside_root)
        # A layout that numbers images as written frames them where they are written.
        self.frame = not layout_named(options.layout).numbered

    def prepare_chunk(self, chunk):
        """Return, per item, its framed record (or image bytes) or an `ImageRefused`."""
        results = []
        for item in chunk:
            data = self.prepare(item)
            if self.frame and not isinstance(data, ImageRefused):
                data = frame_image(item, data, item.index, self.options.pack_label)
            results.append(data)
        return results

    def prepare(self, item):
        """Read and check or re-encode one image; return its bytes or an `ImageRefused`."""
        path = resolve_path(self._prefix, item.path, self.options.allow_outside_root)
        if path is None:
            return ImageRefused(OUTSIDE_ROOT)
        try:
            data = _read_file(path, self._guard.open)
        except ImageRefused as refusal:
            return refusal
        except OutsideRoot:
            return ImageRefused(OUTSIDE_ROOT_LINK)
        except FileNotFoundError:
            return ImageRefused("file not found")
        except IsADirectoryError:
            return ImageRefused("is a directory, not an image file")
        except OSError as exc:
            return ImageRefused(f"cannot read ({exc.strerror or exc})")
        try:
            if self.options.transform is not None:
                return reencode_image(data, self.options.transform, self.options.max_pixels)
            if not data:
                raise ImageRefused("empty file")
            if self.options.check != "none":
                check_image(data, self.options.check, self.options.max_pixels)
        except ImageRefused as refusal:
            return refusal
        return data


class _ReadTimer:
    """Decide when images are slow to read: over SLOW_ITEM_SECONDS an image outside Python,
    two windows of SWITCH_WINDOW images in a row.

    Outside Python is the wall time less the time this thread ran in user mode or waited for a
    CPU (Linux: its rusage and schedstat; elsewhere, less its CPU time): reads that wait for a
    disk or a network, or keep the kernel busy, count, and worker threads overlap them; Python's
    own work, and a machine busy with other work, do not, since threads cannot help there.
    """

    def __init__(self):
        self._clock = _in_python if _in_python() is not None else time.thread_time
        self.seconds = 0.0
        self.items = 0
        self.slow_windows = 0
        self.start()

    def start(self):
        """Start timing a read of some images."""
        self._wall, self._ran = time.perf_counter(), self._clock()

    def slow(self, items):
        """Count `items` read since `start()`; return True once reads are slow."""
        self.seconds += (time.perf_counter() - self._wall) - (self._clock() - self._ran)
        self.items += items
        if self.items < SWITCH_WINDOW:
            return False
        if self.seconds / self.items > SLOW_ITEM_SECONDS:
            self.slow_windows += 1
        else:
            self.slow_windows = 0
        self.seconds, self.items = 0.0, 0
        return self.slow_windows >= 2


def _in_python():
    """Return the seconds this thread ran in user mode or waited on a run queue (Linux), or
    None where that cannot be known."""
    try:
        import resource  # not on Windows

        with open("/proc/thread-self/schedstat", "rb") as f:
            waited = int(f.read().split()[1])
        return resource.getrusage(resource.RUSAGE_THREAD).ru_utime + waited / 1e9
    except (ImportError, AttributeError, OSError, ValueError, IndexError):
        return None


FAULT_VARIABLE = "RECTOOL_TEST_FAULT"


def _test_fault():
    """Return (signal, items) from `RECTOOL_TEST_FAULT=SIGNAME:N`, or None.

    A test hook: the run sends itself the signal once N list items are done (progress is
    reported a block or a chunk at a time), a deterministic point to kill or interrupt it.
    """
    text = os.environ.get(FAULT_VARIABLE)
    if not text:
        return None
    name, _, items = text.partition(":")
    return getattr(signal, name), int(items or 0)


def _io_bound(options):
    """Return True when preparing an image is reading it, not decoding or encoding it."""
    return options.transform is None and options.check != "decode"


def _read_file(path, open_):
    """Return a file's bytes with four system calls for a small file, and no file object.

    Raises `ImageRefused` for anything but a regular file (opened without waiting: a FIFO
    does not block) and for one over the record limit; reads at most the size it had.
    """
    fd = open_(path)  # a `RootGuard`'s: a link cannot lead out of ROOT
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ImageRefused(not_regular(info.st_mode))
        if info.st_size > MAX_RECORD_BYTES:
            raise ImageRefused(TOO_LARGE)
        data = os.read(fd, min(_FIRST_READ, info.st_size) or 1)
        if len(data) == _FIRST_READ:  # a larger file: read on to its size
            parts = [data]
            left = info.st_size - len(data)
            while left > 0 and (part := os.read(fd, min(left, 1 << 20))):
                parts.append(part)
                left -= len(part)
            data = b"".join(parts)
        return data
    finally:
        os.close(fd)


# A short read of a regular file means its end; most face crops fit in one read of this size
# (a larger read would allocate more than malloc serves without mmap, for every image).
_FIRST_READ = 64 * 1024


def _chunks(items, size):
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _ChunkResults:
    """A chunk's worker results in the shape of a pass-through `Block`: `runs()` gives the
    framed records as runs, refusals between them, in list order.

    Given `first_key`, the results are images, framed here and numbered from it in order (a
    layout that numbers images as written: only the writer's thread knows the next key).
    """

    reuses_buffer = False  # its records are its own bytes

    def __init__(self, items, results, first_key=None):
        self.items = items
        self._images = results if first_key is not None else None
        if first_key is not None:
            framed, key = [], first_key
            for item, image in zip(items, results):
                if not isinstance(image, ImageRefused):
                    image = frame_image(item, image, key, False)
                    key += not isinstance(image, ImageRefused)
                framed.append(image)
            results = framed
        self._results = results

    def image(self, j):
        """Return the image bytes of record j (numbered results only)."""
        return self._images[j]

    def runs(self):
        """Yield `(items, data, starts, j)` runs of records and `(item, reason)` refusals."""
        items, results = self.items, self._results
        first = 0
        for j in range(len(items) + 1):
            refused = j < len(items) and isinstance(results[j], ImageRefused)
            if j == len(items) or refused:
                if first < j:
                    parts = results[first:j]
                    starts = list(itertools.accumulate(map(len, parts[:-1]), initial=0))
                    yield items[first:j], b"".join(parts), starts, first
                if refused:
                    yield items[j], results[j].reason
                first = j + 1


def _property_size(prefix, run):
    """Return the (height, width) of the first image packed, or None when there is none."""
    size = run.image_size
    if size is None and run.images:
        # A resumed run may have written no image itself: take the size from key 1.
        with IndexedRecordFile(prefix + ".rec", prefix + ".idx") as records:
            size = image_size(unpack_header(records.read(1))[1])
    return size
