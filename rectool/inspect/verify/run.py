"""`verify_dataset`: run every check over each target's shards, then the dataset's, into one
`VerifyReport`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING

from ...dataset.sources import (
    resolve_source,
    source_prefixes,
)
from ...errors import RectoolError
from ...format.window import RecWindow
from ...packer.manifest import finish_interrupted_source, leftover_staging
from .binary import (
    BinaryIndex,
    check_index_arrays,
    check_index_files,
    check_index_layout,
    no_index_note,
    read_binary_index,
)
from .columns import chunks
from .digests import ShardHashes, check_record_checksums
from .facts import DatasetFacts, ShardIndex, read_shard, size_or_zero
from .framing import check_framing
from .headers import check_headers
from .images import DecodeOptions, check_decoding, check_image_structure, decodable_rows
from .index import ShardKeys, check_index, check_index_file, check_keys_across_shards
from .layout import check_layout
from .manifest import (
    check_identity_names,
    check_listed_once,
    check_manifest_entry,
    check_totals,
    pack_refusals,
    repeated_shards,
)
from .report import DEFAULT_KEEP, CheckResult, Findings, Tally, VerifyReport, one_problem

if TYPE_CHECKING:
    from _typeshed import StrPath

# `progress(phase, done, total)`: "bytes" of the shards walked, "images" checked or decoded.
Progress = Callable[[str, int, int], object]
# open_rec(path): the window a shard's .rec is read through.
OpenRec = Callable[[str], RecWindow]


def verify_dataset(
    targets: StrPath | Iterable[StrPath],
    decode: DecodeOptions | None = None,
    workers: int | None = None,
    keep: int = DEFAULT_KEEP,
    progress: Progress | None = None,
    image_check: bool = True,
    open_rec: OpenRec = RecWindow,
) -> VerifyReport:
    """Check every target (manifest, prefix, .rec, or folder with train.rec); return a report.

    `decode` is a `DecodeOptions` (or None to skip decoding); it decodes every image with
    `workers` threads (default: all cores). Without it, `image_check` walks every image's
    structure as `pack` checks it (`check_image_structure`: "image-damaged" problems).
    `progress(phase, done, total)` is called with phase "bytes" as shards are walked (a
    window's batch of records at a time, within a shard too) and "images" as their structure
    is checked or they decode. `open_rec(path)` opens the window a shard's .rec is read
    through (`RecWindow`: a bounded part of it mapped at a time). Raises `RectoolError` when
    a target cannot be read.
    """
    if isinstance(targets, (str, os.PathLike)):
        targets = [targets]
    names = [os.fspath(t) for t in targets]
    if not names:
        raise RectoolError("no dataset given to verify")
    finished = [p for t in names for p in finish_interrupted_source(t)]
    resolved = [resolve_source(t) for t in names]
    staging = sorted({s for t in names for p in source_prefixes(t) if (s := leftover_staging(p))})
    report = VerifyReport(names, finished=finished, staging=staging)
    findings = Findings(report, keep)
    workers = workers or os.cpu_count() or 1
    start = time.perf_counter()
    total_bytes = sum(size_or_zero(rec) for _, _, shards in resolved for rec, _ in shards)
    done_bytes = 0
    # Digests run on their own thread (hashlib and xxhash release the GIL) during the walk.
    with (
        ThreadPoolExecutor(1, thread_name_prefix="rectool-digest") as hasher,
        ThreadPoolExecutor(workers, thread_name_prefix="rectool-decode") as decoder,
    ):
        for name, (manifest, manifest_path, shards) in zip(names, resolved):
            dataset = DatasetFacts.of(manifest, manifest_path, shards)
            binary = read_binary_index(dataset)
            if binary is None:
                report.notes.append(no_index_note(name, dataset))
            else:
                findings.take(check_index_files(binary))
            # Read before the shards, reported after them: the names' dict (hundreds of
            # bytes a name) is gone before the shards' columns are taken.
            identity_names = list(check_identity_names(dataset))
            hashes = ShardHashes(dataset, hasher)
            repeats = repeated_shards(shards)
            layouts: set[str] = set()  # of the shards read (a missing one has none)
            indexes: list[ShardKeys] = []  # each shard's keys, for the dataset's key check
            for number in range(len(shards)):
                if number in repeats:
                    findings.take(check_listed_once(dataset, number, repeats[number]))
                    continue
                layout, index, size = _verify_shard(
                    dataset,
                    number,
                    binary,
                    findings,
                    hashes,
                    decode,
                    decoder,
                    _within(progress, done_bytes, total_bytes),
                    image_check,
                    open_rec,
                )
                if layout is not None:
                    layouts.add(layout)
                if index is not None:
                    indexes.append(ShardKeys.of(index))
                done_bytes += size
                if progress is not None:
                    progress("bytes", done_bytes, total_bytes)
            findings.take(hashes.check())
            findings.take(check_totals(dataset))
            findings.take(identity_names)
            refusals = pack_refusals(dataset, name)
            if refusals is not None:
                report.refusals.append(refusals)
            findings.take(check_keys_across_shards(indexes))
            if binary is not None:
                findings.take(check_index_layout(binary, layouts))
            report.layouts.append("/".join(sorted(layouts)) or "empty")
    report.seconds = time.perf_counter() - start
    return report


def _verify_shard(
    dataset: DatasetFacts,
    number: int,
    binary: BinaryIndex | None,
    findings: Findings,
    hashes: ShardHashes,
    decode: DecodeOptions | None,
    decoder: Executor,
    progress: Progress | None,
    image_check: bool = True,
    open_rec: OpenRec = RecWindow,
) -> tuple[str | None, ShardIndex | None, int]:
    """Run every check of shard `number`; return (layout name, its `ShardIndex`, bytes).

    `hashes` (`ShardHashes`) hashes the .rec beside the checks; `binary`, the pack's binary
    index (or None), is compared with the shard's rows; `progress` hears of the shard's
    "bytes" read and "images" checked or decoded.
    """
    rec, _ = dataset.shards[number]
    if not os.path.exists(rec):
        if dataset.manifest is None:
            raise RectoolError(f"{rec}: record file not found")
        findings.take(
            [one_problem("missing-file", rec, None, None, "listed in the manifest, missing")]
        )
        return None, None, 0
    with open_rec(rec) as window:
        size = window.size
        hashes.start(rec)
        facts = read_shard(dataset, number, window, progress)
        checks: tuple[Iterable[CheckResult], ...] = (
            check_index_file(facts),
            check_framing(facts),
            check_index(facts),
            check_layout(facts),
            check_headers(facts),
            check_manifest_entry(facts),
            check_record_checksums(facts, hashes.matches),
            () if binary is None else check_index_arrays(facts, binary, number),
        )
        for check in checks:
            findings.take(check)
        report, records_found = findings.report, len(facts.framing.starts)
        report.shards.append(
            {"rec": rec, "idx": facts.idx, "records": records_found, "rec_bytes": size}
        )
        report.records += records_found
        report.images += int(facts.layout.images.sum())
        report.rec_bytes += size
        if decode is None and image_check:  # decoding checks the structure first
            findings.take(check_image_structure(facts, progress))
        if decode is not None:  # a chunk of rows at a time: never a row a record
            spans = list(chunks(records_found))
            total = sum(len(decodable_rows(facts, lo, hi)) for lo, hi in spans)
            for lo, hi in spans:
                rows = decodable_rows(facts, lo, hi)
                for item in check_decoding(facts, rows, decode, decoder):
                    findings.take([item])
                    if progress is not None and isinstance(item, Tally):
                        progress("images", report.decoded, total)
    return facts.layout.name, facts.index, size


def _within(progress: Progress | None, before: int, total: int) -> Progress | None:
    """Return `progress` for one shard: its "bytes" counted after the `before` bytes of the
    shards walked so far, out of `total`."""
    if progress is None:
        return None

    def update(phase: str, done: int, of: int) -> object:
        if phase == "bytes":
            return progress(phase, before + done, total)
        return progress(phase, done, of)

    return update
