"""One execution of a repack plan: `RepackRun` writes the records, then the files
that describe them."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from ..doors.failures import REPACK, failure_line, open_failures
from ..doors.output import (
    open_existing,
    remove,
    rename,
    stage_file,
    write_atomic,
    write_json_atomic,
)
from ..errors import InputError
from ..format.binindex import Written
from ..format.headers import unpack_header
from ..format.paths import PackPaths
from ..format.writer import frame_image_record
from ..packer.images import ImageRefused, reencode_image
from ..packer.layout import image_size, layout_named
from ..packer.manifest import (
    build_manifest,
    remove_stale_temporaries,
    write_manifest,
)
from ..packer.shards import ShardWriter
from ..reader import RecordFile
from .batches import BatchBuffers
from .copier import VIEW_BYTES, RecordCopier, record_label
from .plan import reason_of
from .result import RepackResult

if TYPE_CHECKING:
    from ..format.headers import Header
    from ..packer.packrun import Progress
    from .options import RepackOptions
    from .plan import Catalog, Plan
    from .sources import Source, Target

    # A record read and re-encoded: its header, and its new image or why it was refused.
    Reencoded = list[tuple[Header, bytes | ImageRefused]]

# Records are copied this many at a time (see `copier.RecordCopier`).
BATCH_RECORDS = 8192
REENCODE_CHUNK = 32
# The records of each identity are counted this many at a time.
COUNT_RECORDS = 1 << 20


class RepackRun:
    """One execution of a plan: writes the records, then the files that describe them."""

    def __init__(
        self,
        sources: Sequence[Source],
        targets: Sequence[Target],
        catalog: Catalog,
        plan: Plan,
        paths: PackPaths,
        options: RepackOptions,
        progress: Progress | None,
    ) -> None:
        self.sources, self.targets, self.catalog, self.plan = sources, targets, catalog, plan
        self.paths, self.options, self.progress = paths, options, progress
        self.layout = layout_named(options.layout)
        self.insightface = self.layout.numbered  # images keyed 1..N, identity records after
        # The label shape written (`copier.record_label`): the insightface layout's is chosen
        # (a vector with --pack-label, else a scalar); the images layout keeps each record's.
        self.pack_label = options.pack_label if self.insightface else None
        self.total = len(plan.rows)
        self.last_shard: int | None = None
        if options.shard_records and not options.shard_bytes:
            self.last_shard = max(self.total - 1, 0) // options.shard_records
        elif not options.shard_bytes:
            # One shard: ShardWriter.resume must stop after it (with no last shard it would
            # look at the same finished file again and again).
            self.last_shard = 0
        self.writer = ShardWriter(
            paths,
            options.shard_bytes,
            options.shard_records,
            last_shard=self.last_shard,
            sha256=options.sha256,
            keep_offsets=True,  # handed to the binary index (`_written`)
        )
        self.copier = RecordCopier(sources, catalog, shuffled=options.order == "shuffle")
        self.failures_partial = paths.partial(paths.failures)
        self.refused = np.zeros(self.total, bool)  # plan positions refused while writing
        self._last_refusal = (-1, "")  # the refusal furthest in the plan read by --resume
        self.refused_count = 0  # of them, kept as they come: progress reports it often
        self.images = 0
        self.resumed_from = 0
        self.complete = False
        # Whether every image written holds one scalar label, its new one (`_written`).
        self._scalar_labels = options.transform is None and not self.pack_label
        self._labels: np.ndarray | None = None  # those labels in write order, float32
        # What the report says of the plan's removals (`_release_columns`).
        self._removals: tuple[dict[str, dict[str, int]], list[list[dict[str, Any]]]] = ({}, [])

    # -- the failures file ------------------------------------------------------------------
    def _plan_lines(self) -> Iterator[bytes]:
        """Yield the failures-file lines of the records the plan removes, in catalog order."""
        plan = self.plan
        for row, code, other in zip(
            plan.removed_rows.tolist(), plan.removed_reason.tolist(), plan.removed_other.tolist()
        ):
            entry = self._describe(row)
            if code == 1:
                first = self._describe(other)
                detail = f"byte-identical to key {first['key']} of {first['source']}, kept"
            else:
                target = self.targets[code - 2]
                detail = f"byte-identical to {target.where(other)} of {target.spec}"
            entry.update(stage="plan", reason=reason_of(code), detail=detail)
            yield failure_line(entry)

    def _describe(self, row: int) -> dict[str, Any]:
        cat = self.catalog
        s = self.sources[int(cat.source[row])]
        label = int(cat.label[row])
        return {
            "source": s.spec,
            "key": int(s.dataset.keys[int(cat.sample[row])]),
            "label": label,
            "identity": (cat.names or {}).get(label),
        }

    def _open_failures(self, resume: bool) -> int:
        """Write the plan's removals, then keep the refusals an interrupted run wrote."""
        kept = b""
        earlier = self.failures_partial
        if not os.path.exists(earlier):  # killed after renaming it, before the manifest
            earlier = self.paths.failures
        if resume and os.path.exists(earlier):
            written: list[
                bytes
            ] = []  # the refusals while writing, kept as written; a torn last line is not
            with open_failures(earlier, (REPACK,), torn_tail=True, follow=False) as failures:
                for failure in failures:
                    # The ignores: without `bad_lines` every entry is set, a repack line.
                    if failure.entry["stage"] == "write":  # type: ignore[index, typeddict-item]
                        position = failure.entry["position"]  # type: ignore[index, typeddict-item]
                        where = f"{earlier}: line {failure.number}: position {position}"
                        if position >= self.total:
                            raise InputError(f"{where}: not in the plan")
                        if self.refused[position]:
                            raise InputError(f"{where}: refused twice")
                        self.refused[position] = True
                        if position >= self._last_refusal[0]:
                            self._last_refusal = (position, where)
                        written.append(failure.text)
            kept = b"".join(written)
            self.refused_count = int(self.refused.sum())
        staged = stage_file(self.failures_partial, itertools.chain(self._plan_lines(), [kept]))
        rename(staged, self.failures_partial)
        self._fd = open_existing(self.failures_partial)
        self.writer.register(self._fd, self.failures_partial)
        return self._fd

    # -- writing ----------------------------------------------------------------------------
    def execute(self, resume: bool) -> None:
        done = 0
        if resume:
            written = self.writer.resume(drop_tail=self.layout.written_after_images)
            if self.insightface and self.writer.finished:
                self.complete = True  # killed after its one file was finished
        fd = self._open_failures(resume)
        try:
            if resume and not self.complete:
                done = written + int(self.refused.sum())
                position, where = self._last_refusal
                if position >= done:  # records and refusals must be the plan's first `done`
                    raise InputError(
                        f"{where}: past where the interrupted run stopped ({written} records "
                        f"written, {int(self.refused.sum())} refused): start again with "
                        "--overwrite"
                    )
                self.images = written
                self.resumed_from = done
            if not self.complete:
                self._report(done)
                if self.options.transform is None:
                    self._copy(done)
                else:
                    self._reencode(done)
                self._write_identity_records()
            self._release_columns()
            # The sources are let go of while the last writes and the fsync run: unmapping a
            # source mapped whole (a shuffle's) took 0.03-0.04 s of the 100k benchmark pack's
            # repack, waited for at the end. (A mapping still queued for writing goes with its
            # last view.)
            with ThreadPoolExecutor(1, thread_name_prefix="rectool-release") as release:
                released = release.submit(self.copier.close)
                self.writer.close(self.last_shard)
            released.result()
        except BaseException:
            self.writer.abort()
            raise
        finally:
            os.close(fd)

    def _keys(self, positions: range) -> np.ndarray:
        if self.insightface:
            return np.arange(self.images + 1, self.images + 1 + len(positions), dtype=np.int64)
        return np.arange(positions.start, positions.stop, dtype=np.int64)

    def _copy(self, done: int) -> None:
        """Copy the plan's records from `done` on, refusing those whose image `pack` would
        refuse (`RecordCopier.refusals`), as re-encoding refuses what does not decode."""
        rows = self.plan.rows
        position = done
        # Large views only where no shard ends inside one (`ShardWriter.add_run` would take
        # such a run record by record).
        one_shard = not (self.options.shard_bytes or self.options.shard_records)
        view_bytes = VIEW_BYTES if one_shard else None
        buffers = BatchBuffers(self.writer.wait_written)
        try:
            while position < self.total:
                win = self.copier.window(rows[position : min(position + BATCH_RECORDS, self.total)])
                new_labels = self.plan.new_labels(self.catalog, win.rows)
                bad = (
                    self.copier.refusals(win, self.options.max_pixels)
                    if self.options.check != "none"
                    else {}
                )
                # The images layout keeps a record's label shape: a vector written, or a record
                # framed again (its shape unread here), and the labels are read back instead.
                if self.pack_label is None and self._scalar_labels:
                    scalar = win.whole & (win.flag == 0)
                    scalar[list(bad)] = True
                    self._scalar_labels = bool(scalar.all())
                stops = sorted(bad) + [len(win)]
                i = 0
                for stop in stops:
                    while i < stop:  # the records before the next refusal, as many as fit
                        keys = self._keys(range(position, position + stop - i))
                        data, starts, count = self.copier.frame(
                            win,
                            i,
                            stop,
                            new_labels[i:stop],
                            keys,
                            self.pack_label,
                            view_bytes=view_bytes,
                            buffers=buffers,
                        )
                        positions = range(position, position + count)
                        self.writer.add_run(data, keys[:count], starts, positions)
                        if buffers.taken is not None:  # written from a buffer used again later
                            buffers.handed(self.writer.flush())
                        self.images += count
                        position += count
                        i += count
                        self._report(position)
                    if stop < len(win):
                        self._refuse(int(win.rows[stop]), position, bad[stop])
                        position += 1
                        i += 1
                self._report(position)
        finally:
            buffers.close()

    def _refuse(self, row: int, position: int, reason: str) -> None:
        """Write the refusal of catalog `row` at plan `position` to the failures file."""
        entry = self._describe(row)
        entry.update(stage="write", position=position, reason=reason)
        self.writer.write_after(self._fd, failure_line(entry))
        self.refused_count += not self.refused[position]
        self.refused[position] = True

    def _reencode(self, done: int) -> None:
        rows = self.plan.rows
        transform, max_pixels = self.options.transform, self.options.max_pixels
        copier = self.copier

        def prepare(chunk: np.ndarray) -> Reencoded:
            out: Reencoded = []
            for row in chunk.tolist():
                head, image = copier.read_record(row)
                try:
                    # The ignore: re-encoding runs only with a transform.
                    out.append((head, reencode_image(image, transform, max_pixels)))  # type: ignore[arg-type]
                except ImageRefused as refusal:
                    out.append((head, refusal))
            return out

        chunks = (
            rows[start : start + REENCODE_CHUNK]
            for start in range(done, self.total, REENCODE_CHUNK)
        )
        position = done
        window: list[tuple[np.ndarray, Future[Reencoded]]] = []
        with ThreadPoolExecutor(self.options.workers, thread_name_prefix="rectool-repack") as pool:
            for chunk in chunks:
                window.append((chunk, pool.submit(prepare, chunk)))
                if len(window) >= 4 * self.options.workers:
                    position = self._consume(*window.pop(0), position)
            while window:
                position = self._consume(*window.pop(0), position)

    def _consume(self, chunk: np.ndarray, pending: Future[Reencoded], position: int) -> int:
        labels = self.plan.new_labels(self.catalog, chunk).tolist()
        for row, label, (head, result) in zip(chunk.tolist(), labels, pending.result()):
            if isinstance(result, ImageRefused):
                self._refuse(row, position, result.reason)
            else:
                label = record_label(head, float(label), self.pack_label)
                key = self.images + 1 if self.insightface else position
                framed = frame_image_record(result, label, key, head.id2, f"key {key}")
                self.writer.add(key, framed, position)
                self.images += 1
            position += 1
        self._report(position)
        return position

    def _write_identity_records(self) -> None:
        """Write the records that follow the images (insightface: identities and header)."""
        if not self.layout.numbered:
            return
        counts = np.zeros(self.plan.classes, np.int64)
        for start in range(0, self.total, COUNT_RECORDS):  # no column of new labels at once
            stop = min(start + COUNT_RECORDS, self.total)
            kept = self.plan.rows[start:stop][~self.refused[start:stop]]
            counts += np.bincount(
                self.plan.new_labels(self.catalog, kept), minlength=self.plan.classes
            )
        for key, framed in self.layout.records_after(self.images, counts.tolist()):
            self.writer.add(key, framed)

    def _report(self, done: int) -> None:
        if self.progress is not None:
            self.progress(done, self.total, self.refused_count)

    # -- the files that describe the output -------------------------------------------------
    def finish(self, state_path: str) -> RepackResult:
        paths, plan, options = self.paths, self.plan, self.options
        images = self.total - int(self.refused.sum())
        refused = int(self.refused.sum())
        failures = len(plan.removed_rows) + refused
        final_failures = paths.failures
        rename(self.failures_partial, final_failures)
        names = self._new_names()
        if names:
            write_atomic(paths.label_map, _label_map_text(names))
        write_atomic(paths.relabel, self._relabel_text())
        property_note = None
        if self.insightface:
            property_note = self._write_property()
        report = self._report_document(refused, property_note)
        write_json_atomic(paths.report, report)
        manifest = build_manifest(
            options,
            None,
            paths,
            self.writer.finished,
            images,
            failures,
            plan.classes,
            names,
            None,
        )
        manifest["sources"] = [s.spec for s in self.sources]
        # Removals asked for (--dedupe, --drop-overlap) are failures, not refusals.
        manifest["accepted"] = refused <= options.max_failures
        remove_stale_temporaries(paths)
        write_manifest(paths, manifest, self._written())
        remove(state_path)
        return RepackResult(
            paths.manifest,
            manifest,
            images,
            plan.classes,
            failures,
            final_failures,
            paths.report,
            report,
            self.resumed_from,
        )

    def _written_labels(self) -> np.ndarray:
        """Return the new label of each image written, in write order, as float32: the
        label word its header holds (the plan's columns are let go of next)."""
        labels = np.empty(int(self.total - self.refused.sum()), np.float32)
        done = 0
        for start in range(0, self.total, COUNT_RECORDS):
            stop = min(start + COUNT_RECORDS, self.total)
            kept = self.plan.rows[start:stop][~self.refused[start:stop]]
            labels[done : done + len(kept)] = self.plan.new_labels(self.catalog, kept)
            done += len(kept)
        return labels

    def _written(self) -> Written | None:
        """Return what this run wrote, for the binary index (`binindex.Written`): each
        shard's offsets as the writer kept them, the keys (positions of the images kept, or
        insightface's 1..N, then the identity records' and the header's) and, where every
        image holds a scalar label, the labels. None (the index reads the files back) after
        a resume, or where a shard's first and last keys say otherwise."""
        finished = self.writer.finished
        if self.resumed_from or any(info.offsets is None for info in finished):
            return None
        if self.insightface:
            keys = np.r_[np.arange(1, self.images + 1 + self.plan.classes), 0].astype(np.int64)
        else:
            keys = np.flatnonzero(~self.refused).astype(np.int64)
        start = 0
        for info in finished:
            stop = start + info.records
            if stop > len(keys) or (
                info.records and (info.first_key, info.last_key) != (keys[start], keys[stop - 1])
            ):
                return None
            start = stop
        if start != len(keys):
            return None
        offsets = [info.offsets for info in finished if info.offsets is not None]
        return Written(offsets, keys, self._labels)

    def _new_names(self) -> dict[int, str] | None:
        names = self.catalog.names
        if not names:
            return None
        if self.options.keep_labels:
            return {int(old): names[int(old)] for old in self.plan.old_labels if int(old) in names}
        return {
            new: names[int(old)]
            for new, old in enumerate(self.plan.old_labels)
            if int(old) in names
        }

    def _relabel_text(self) -> str:
        plan, names = self.plan, self.catalog.names or {}
        lines = ["source\tsource_label\tlabel\tidentity\n"]
        for s, (originals, merged) in zip(self.sources, self.catalog.source_labels):
            inside = merged < len(plan.new_label)
            new = np.full(len(merged), -1, np.int64)
            new[inside] = plan.new_label[merged[inside]]
            kept = new >= 0
            for original, label, now in zip(
                originals[kept].tolist(), merged[kept].tolist(), new[kept].tolist()
            ):
                lines.append(f"{s.spec}\t{original}\t{now}\t{names.get(label, '')}\n")
        return "".join(lines)

    def _write_property(self) -> str:
        """Write `property` (classes,height,width) beside the pack; return where H,W came from."""
        size: tuple[int, int] | None = None
        note = "no image written: 112x112 assumed"
        if self.total > self.refused.sum():
            rf = RecordFile(self.paths.rec)
            try:  # image key 1 is the first record of the file (identity records follow)
                record = rf.read_parts(0)[0]
            finally:
                rf.close()
            _, image = unpack_header(record)
            size = image_size(bytes(image))  # from its header: nothing decoded
            if size is not None:
                size = int(size[0]), int(size[1])
                note = "height and width of image key 1 (the first image), read from its bytes"
        self.layout.write_property(self.paths.folder, self.plan.classes, size)
        return note

    def _release_columns(self) -> None:
        """Note what the report says of the plan's removals, then let go of every column a
        record (the plan's, the catalog's, the sources'): what is built from here on, each
        shard's checksum table and the output's binary index, is then all that is held."""
        plan, cat = self.plan, self.catalog
        per_identity: dict[str, dict[str, int]] = {}
        for row, code in zip(plan.removed_rows.tolist(), plan.removed_reason.tolist()):
            label = int(cat.label[row])
            name = (cat.names or {}).get(label, str(label))
            entry = per_identity.setdefault(name, {"duplicate": 0, "overlap": 0})
            entry[reason_of(code)] += 1
        groups = [[self._describe(row) for row in group] for group in plan.shared_groups]
        self._removals = per_identity, groups
        if self._scalar_labels and not self.resumed_from:
            self._labels = self._written_labels()
        plan.release()
        cat.release()
        for source in self.sources:
            source.release()

    def _report_document(self, refused: int, property_note: str | None) -> dict[str, Any]:
        plan, cat = self.plan, self.catalog
        per_identity, groups = self._removals
        duplicates = int((plan.removed_reason == 1).sum())
        removed = {"duplicate": duplicates, "overlap": len(plan.removed_reason) - duplicates}
        return {
            "sources": [s.spec for s in self.sources],
            "overlap_targets": [t.spec for t in self.targets],
            "steps": plan.counts,
            "images": self.total - refused,
            "classes": plan.classes,
            "removed": removed,
            "refused": refused,
            "removed_per_identity": per_identity,
            "shared_across_identities": {"groups": plan.shared_total, "first_groups": groups},
            # Names several sources gave to identities kept apart (each then `K-NAME`).
            "names_kept_apart": cat.kept_apart,
            "property": property_note,
        }


def _label_map_text(names: Mapping[int, str]) -> str:
    return "".join(f"{label}\t{name}\n" for label, name in sorted(names.items()))
