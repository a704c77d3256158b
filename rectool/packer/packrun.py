"""One run of the packing pipeline over a list (or one shard of its plan): `PackRun`.

Worker threads read, check and (optionally) re-encode images; OpenCV releases the GIL, so they
run in parallel. One writer consumes their results strictly in list order, so the bytes never
depend on `workers` or timing, and at most a bounded window of images is in flight. Passing
images through, which is reading rather than computing, runs a block at a time on the calling
thread instead (see `passthrough.py`), until reads prove slow (`_ReadTimer`). Both paths hand the
writer the same shape, runs of framed records with refusals between them (`PackRun._consume`).
"""

from __future__ import annotations

import collections
import itertools
import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..archives.reading import open_member_reader
from ..doors.failures import failure_line, open_failures
from ..doors.inputs import open_input
from ..doors.output import create_new, open_existing, truncate
from ..errors import InputError, RectoolError
from ..format.paths import PackPaths
from .layout import image_size, layout_named
from .listcheck import WrongRootError
from .listfile import iter_list
from .passthrough import PassThroughPacker
from .results import Refusal
from .shards import ShardWriter, plan_shards
from .workers import ChunkResults, ImageWorker

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from .listfile import ListItem
    from .options import PackOptions
    from .passthrough import Block, MemberSource
    from .workers import Prepared

    # `progress(done, total, refused)`, called as list items finish.
    Progress = Callable[[int, int, int], object]
    # `setup(phase, done, total)`: a step before the first image (`packing.pack_images`).
    SetupProgress = Callable[[str, int, int | None], object]

# Resuming, list lines read past are told to `setup` every this many.
_SETUP_EVERY = 1 << 16
# Items go to worker threads in chunks: one future per image would cost more than a check.
CHUNK_ITEMS = 32
# Pass-through from a fast disk takes about 10 us an image, all Python; a network file system
# takes a millisecond, waiting. Over this average, two windows in a row, worker threads take
# over. (One window could be a stall of the machine, not of the files.)
SLOW_ITEM_SECONDS = 0.0001
SWITCH_WINDOW = 1024  # items timed at a time
# Pass-through blocks hold at most this many items (and BLOCK_BYTES of records).
BLOCK_ITEMS = 4096
# When the first this many list items (or more: the first block or chunk past them) are all
# refused, and more than --max-failures allows, ROOT is almost surely wrong: the run stops.
EARLY_REFUSALS = 1000


class PackRun:
    """One execution of the pipeline; holds the counters the manifest reports."""

    def __init__(
        self,
        list_path: str,
        root: str,
        paths: PackPaths,
        options: PackOptions,
        total: int,
        progress: Progress | None,
        part: tuple[int, range] | None = None,
        setup: SetupProgress | None = None,
    ) -> None:
        self.list_path, self.root, self.paths = list_path, root, paths
        self.options, self.total, self.progress = options, total, progress
        self.setup = setup
        self.layout = layout_named(options.layout)
        # `part`: (shard number, its list positions) when packing one shard of a plan.
        self.positions = part[1] if part else range(total)
        first, last = (part[0], part[0]) if part else (0, None)
        if part is None and options.shard_records and not options.shard_bytes:
            last = len(plan_shards(total, None, options.shard_records)) - 1
        self.last_shard = last
        self.writer = ShardWriter(
            paths,
            options.shard_bytes,
            options.shard_records,
            first_shard=first,
            last_shard=last,
            sha256=options.sha256,
        )
        failures = paths.shard(part[0]).failures if part else paths.failures
        self.failures_partial = paths.partial(failures)
        self.images = 0
        self.failures = 0
        self.first_refusals: list[Refusal] = []
        self.resumed_from = 0
        # Numbered layouts: images per identity.
        self.label_counts: collections.Counter[int] = collections.Counter()
        self.max_label = -1
        self.image_size: tuple[int, int] | None = None
        self._fault = _test_fault()

    # -- items ------------------------------------------------------------------------------
    def _items(self) -> Iterator[ListItem]:
        with open_input(self.list_path, "list file", "utf-8", "\n") as f:
            yield from self.layout.order(iter_list(f, self.list_path))

    @property
    def classes(self) -> int | None:
        """Return the identities counted while writing (numbered layouts), else None."""
        return self.max_label + 1 if self.layout.numbered else None

    # -- resume -----------------------------------------------------------------------------
    def _resume(self) -> dict[int, str]:
        written = self.writer.resume(
            drop_tail=self.layout.written_after_images, progress=self._setup_phase("resume bytes")
        )
        refused_lines: dict[int, str] = {}  # list line -> where in the failures file it was refused
        if os.path.islink(self.failures_partial):
            raise RectoolError(
                f"{self.failures_partial}: is a symlink, not a file this pack wrote; remove it"
            )
        if os.path.exists(self.failures_partial):
            complete = 0  # bytes of whole lines: a torn last line is cut (doors/failures.py)
            with open_failures(self.failures_partial, torn_tail=True, follow=False) as failures:
                for failure in failures:
                    # Without `bad_lines` every entry is set: a pack line (the ignores below).
                    entry, complete = failure.entry, failure.end
                    number, line = failure.number, entry["line"]  # type: ignore[index, typeddict-item]
                    where = f"{self.failures_partial}: line {number}: list line {line}"
                    if line in refused_lines:
                        raise InputError(f"{where}: refused twice")
                    refused_lines[line] = where
                    if len(self.first_refusals) < 100:
                        self.first_refusals.append(Refusal(**entry))  # type: ignore[arg-type]
            truncate(self.failures_partial, complete)
        self.failures = len(refused_lines)
        self.images = written
        self.resumed_from = written + self.failures
        return refused_lines

    def _setup_phase(self, phase: str) -> Callable[[int, int], object] | None:
        setup = self.setup
        if setup is None:
            return None
        return lambda done, total: setup(phase, done, total)

    # -- the pipeline -----------------------------------------------------------------------
    def execute(self, resume: bool) -> None:
        refused_lines = self._resume() if resume else {}
        skip = self.resumed_from
        if resume:
            self._failures_fd = open_existing(self.failures_partial)
        else:
            self._failures_fd = create_new(self.failures_partial)
        self.writer.register(self._failures_fd, self.failures_partial)
        try:
            items = itertools.islice(self._items(), self.positions.start, self.positions.stop)
            met: set[int] = set()  # the refused lines among the items done: every one, or a lie
            for passed, item in enumerate(itertools.islice(items, skip)):
                if self.setup is not None and not passed % _SETUP_EVERY:
                    self.setup("resume lines", passed, skip)
                if item.line in refused_lines:
                    met.add(item.line)
                else:
                    self._count_label(item)
            if self.setup is not None and skip:
                self.setup("resume lines", skip, skip)
            for line in sorted(refused_lines.keys() - met)[:1]:
                raise InputError(
                    f"{refused_lines[line]}: past where the interrupted run stopped "
                    f"({self.images} images written, {self.failures} refused): start again "
                    "with --overwrite"
                )
            self._position = self.positions.start + skip
            self._report(skip)
            self._process(items, skip)
            self._finish()
        except BaseException:
            self.writer.abort()
            raise
        finally:
            os.close(self._failures_fd)

    def _process(self, items: Iterator[ListItem], done: int) -> None:
        # An archive ROOT: its members, read by offset or in one pass (rectool/archives/).
        source = open_member_reader(self.root, self._remaining_paths)
        try:
            self._process_from(items, done, source)
        finally:
            if source is not None:
                source.close()

    def _remaining_paths(self) -> Iterator[str]:
        items = itertools.islice(self._items(), self._position, self.positions.stop)
        return (item.path for item in items)

    def _process_from(self, items: Iterator[ListItem], done: int, source: MemberSource) -> None:
        may_switch = self.options.workers > 1
        worker = ImageWorker(self.root, self.options, source)
        chunks = _chunks(items, CHUNK_ITEMS)
        if _io_bound(self.options):
            done, finished = self._process_blocks(items, done, may_switch, source)
            if finished:
                return
        elif self.options.workers == 1:
            for chunk in chunks:
                done = self._consume(self._results(chunk, worker.prepare_chunk(chunk)), done)
            return
        window: collections.deque[tuple[list[ListItem], Future[list[Prepared]]]]
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

    def _results(self, chunk: list[ListItem], results: list[Prepared]) -> ChunkResults:
        """Return a chunk's worker results as a `ChunkResults`, numbered (framed here) from
        the next key when the layout numbers images as written."""
        return ChunkResults(
            chunk, results, self.layout.first_key(self.images), self.options.pack_label
        )

    def _process_blocks(
        self, items: Iterator[ListItem], done: int, may_switch: bool, source: MemberSource = None
    ) -> tuple[int, bool]:
        """Pass images through a block at a time on this thread; return (done, finished),
        stopping when reads are slow (see `_ReadTimer`)."""
        packer = PassThroughPacker(
            self.root,
            self.options.check,
            self.options.pack_label,
            wait=self.writer.wait_written,
            allow_outside_root=self.options.allow_outside_root,
            max_pixels=self.options.max_pixels,
            source=source,
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

    def _consume(self, block: Block | ChunkResults, done: int) -> int:
        """Write the records and refusals of a pass-through `Block` or a `ChunkResults` in
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
                    # The ignore: a record's image is bytes (a refusal is no record).
                    self.image_size = image_size(block.image(first))  # type: ignore[arg-type]
                for item in items:
                    self._count_label(item)
            else:
                keys = [item.index for item in items]
            self.writer.add_run(data, keys, starts, positions)
            self.images += count
            self._position += count
        if block.reuses_buffer:
            # The packer reuses the buffer once written (a Block: only it reuses a buffer).
            block.written = self.writer.flush()  # type: ignore[union-attr]
        done += len(block.items)
        self._report(done)
        self._stop_if_all_refused(done)
        return done

    def _stop_if_all_refused(self, done: int) -> None:
        """Raise `WrongRootError` when every item so far, at least EARLY_REFUSALS of them, was
        refused, and more than --max-failures allows: a pack of nothing is no pack."""
        if done < EARLY_REFUSALS or self.images or self.failures <= self.options.max_failures:
            return
        if self.failures < done:  # (resumed past written images: not all refused)
            return
        first = self.first_refusals[0]
        raise WrongRootError(
            f"{self.root}: the first {done:,} listed images were all refused (the first, list "
            f"line {first.line}: {first.path}: {first.reason}); is ROOT right? Stopped early: "
            "nothing this run wrote was kept (--max-failures N lets a run refuse that many)"
        )

    def _count_label(self, item: ListItem) -> None:
        if self.layout.numbered:
            label = int(item.labels[0])
            self.label_counts[label] += 1
            self.max_label = max(self.max_label, label)

    def _refuse(self, item: ListItem, reason: str) -> None:
        refusal = Refusal(item.line, item.index, item.path, reason)
        # Records before this one must reach the file first, so that what a kill leaves is a
        # prefix of the list's outcomes (see ShardWriter.resume).
        self.writer.write_after(self._failures_fd, failure_line(refusal.to_json()))
        self.failures += 1
        if len(self.first_refusals) < 100:
            self.first_refusals.append(refusal)

    def _report(self, done: int) -> None:
        if self.progress is not None:
            self.progress(done, self.total, self.failures)
        if self._fault is not None and done >= self._fault[1]:
            signal_number, self._fault = self._fault[0], None
            os.kill(os.getpid(), signal_number)

    def _finish(self) -> None:
        for key, framed in self.layout.records_after(self.images, self.label_counts):
            self.writer.add(key, framed)
        self.writer.close(self.last_shard)


class _ReadTimer:
    """Decide when images are slow to read: over SLOW_ITEM_SECONDS an image outside Python,
    two windows of SWITCH_WINDOW images in a row.

    Outside Python is the wall time less the time this thread ran in user mode or waited for a
    CPU (Linux: its rusage and schedstat; elsewhere, less its CPU time): reads that wait for a
    disk or a network, or keep the kernel busy, count, and worker threads overlap them; Python's
    own work, and a machine busy with other work, do not, since threads cannot help there.
    """

    def __init__(self) -> None:
        # The ignore: `_in_python` is chosen only where it gives a number.
        self._clock: Callable[[], float]
        self._clock = _in_python if _in_python() is not None else time.thread_time  # type: ignore[assignment]
        self.seconds = 0.0
        self.items = 0
        self.slow_windows = 0
        self.start()

    def start(self) -> None:
        """Start timing a read of some images."""
        self._wall, self._ran = time.perf_counter(), self._clock()

    def slow(self, items: int) -> bool:
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


def _in_python() -> float | None:
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


def _test_fault() -> tuple[int, int] | None:
    """Return (signal, items) from `RECTOOL_TEST_FAULT=SIGNAME:N`, or None.

    A test hook: the run sends itself the signal once N list items are done (progress is
    reported a block or a chunk at a time), a deterministic point to kill or interrupt it.
    """
    text = os.environ.get(FAULT_VARIABLE)
    if not text:
        return None
    name, _, items = text.partition(":")
    return getattr(signal, name), int(items or 0)


def _io_bound(options: PackOptions) -> bool:
    """Return True when preparing an image is reading it, not decoding or encoding it."""
    return options.transform is None and options.check != "decode"


def _chunks(items: Iterable[ListItem], size: int) -> Iterator[list[ListItem]]:
    chunk: list[ListItem] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
