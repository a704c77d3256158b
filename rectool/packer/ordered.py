"""The ordered writer every record file's bytes go through (`OrderedWriter`).

One thread runs writes in submission order, so writing overlaps encoding; a second hashes
each write's bytes meanwhile, and a third flushes what was written to the disk every
DATASYNC_BYTES, so the fsync that finishes a shard waits for its last part only.
`packer/shardfile.py` hands it a shard's buffers (and those of the public
`RecordWriter`/`IndexedRecordWriter`, which write in the caller's thread:
`background=False`); nothing else writes records to a file.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from ..doors.output import fault_point, output_error

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    # Bytes handed in to be written: framed records, index lines, or views of a reused buffer.
    Buffer = bytes | bytearray | memoryview

# At most this many bytes an `os.write` call (see `write_all`).
WRITE_BYTES = 1 << 20
# Writeback to disk is started every this many bytes written (see `OrderedWriter`).
WRITEBACK_BYTES = 8 << 20
# Every this many bytes written to a file, its data is flushed to the disk (fdatasync) on a
# thread of its own while writing goes on. On this machine the fsync of a 600 MB shard whose
# writeback had been started all along still took 0.56 s: the disk's own cache is flushed
# then. Flushed as it goes, that wait overlaps the run.
DATASYNC_BYTES = 64 << 20
_ADVISE = getattr(os, "POSIX_FADV_DONTNEED", None) if sys.platform.startswith("linux") else None


class Feed(Protocol):
    """What a write's bytes are fed to, in order (`Digests`, a shard's digest and checksums)."""

    def update(self, data: ReadableBuffer, /) -> None: ...


if TYPE_CHECKING:
    # One write: the descriptor, its buffers in order, and what they are fed to.
    Job = tuple[int, list[Buffer], Feed | None]


def _feed(digest: Feed, parts: Iterable[Buffer]) -> None:
    for data in parts:
        digest.update(data)


def _flush(fd: int, name: str) -> None:
    """fdatasync `fd`, a duplicate of a file being written (`name`), then close it.

    The duplicate shares the file's open description, so an error of this flush is not seen
    again by the fsync that finishes the file: it is raised here, naming the file, and
    `OrderedWriter` raises it in its caller.
    """
    try:
        fault_point("flush", name)
        os.fdatasync(fd)
    except OSError as exc:
        raise output_error(exc, name) from None
    finally:
        os.close(fd)


class OrderedWriter:
    """One background thread that runs writes in submission order, so writing overlaps work;
    the bytes of each write are hashed on a second thread meanwhile, and every DATASYNC_BYTES
    a file is flushed to the disk on a third (one flush at a time; its error is raised at the
    next `submit` or `drain`).

    A bounded queue keeps memory flat; an error in the thread is raised in the caller at its
    next `submit` or `drain`. With `background=False` each write runs in `submit` itself
    (the same code, no threads and no flushes: for the public writers) and its error is
    raised there.
    """

    def __init__(self, depth: int = 4, background: bool = True) -> None:
        self.background = background
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        # Jobs are numbered from 1 as submitted; `wait(n)` returns once job n is done.
        self.submitted = 0
        self._completed = 0
        self._done = threading.Condition()
        # Started on first use, so a process pool can fork before it.
        self._thread: threading.Thread | None = None
        self.names: dict[int, str] = {}  # fd -> file name, for error messages
        self._written: dict[int, int | None] = {}  # fd -> offset writeback was started to
        # A second thread: a job's bytes are hashed while they are written.
        self._hasher: ThreadPoolExecutor | None = None
        # A third: a file's data is flushed to the disk while writing goes on.
        self._flusher: ThreadPoolExecutor | None = None
        self._flushing: Future[None] | None = None  # the flush under way, if any
        self._flushed: dict[int, int] = {}  # fd -> offset its last flush was started at

    def _started(self) -> queue.Queue[Job | None]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rectool-writer", daemon=True)
            self._thread.start()
        return self._queue

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                if self._error is None:
                    self._write(*job)
            except BaseException as exc:  # re-raised in the submitting thread
                self._error = exc
            finally:
                with self._done:
                    self._completed += 1
                    self._done.notify_all()

    def _write(self, fd: int, parts: list[Buffer], digest: Feed | None) -> None:
        """Write `parts` to `fd` in order, feeding them to `digest` meanwhile: one job."""
        try:
            hashed = None if digest is None else self._hashing().submit(_feed, digest, parts)
            try:
                fault_point("write", self.names.get(fd, ""))
                for data in parts:
                    write_all(fd, data)
                self._start_writeback(fd)
            finally:  # the job is done with its buffers only once they are hashed too
                if hashed is not None:
                    hashed.result()
        except OSError as exc:  # a full disk, say: the error names the file
            raise output_error(exc, self.names.get(fd, f"descriptor {fd}")) from None

    def _hashing(self) -> ThreadPoolExecutor:
        if self._hasher is None:
            self._hasher = ThreadPoolExecutor(1, thread_name_prefix="rectool-hash")
        return self._hasher

    def _start_writeback(self, fd: int) -> None:
        """Have the kernel start writing what this fd wrote to disk, without waiting for it.

        Otherwise gigabytes wait in the page cache for the fsync that finishes a shard, and
        the run ends waiting for the disk. (On Linux, POSIX_FADV_DONTNEED starts writeback of
        dirty pages and drops only clean ones, so what was just written stays cached.)
        """
        if _ADVISE is None:
            return
        start = self._written.get(fd, 0)
        if start is None:
            return
        try:
            position = os.lseek(fd, 0, os.SEEK_CUR)
            start = min(start, position)  # a file under a reused number, unless forgotten
            if position - start >= WRITEBACK_BYTES:
                os.posix_fadvise(fd, start, position - start, _ADVISE)
                start = position
        except OSError:  # not a regular file, say: leave writeback to the kernel
            start = None
        self._written[fd] = start
        # Not for the public writers (`background=False`): they start no thread, and an error
        # raised here, after the write, would have their caller write the same bytes again.
        if start is not None and self.background:
            self._start_flush(fd, position)

    def _start_flush(self, fd: int, position: int) -> None:
        """Start flushing `fd` to the disk where DATASYNC_BYTES were written since its last
        flush and no flush is under way (see DATASYNC_BYTES)."""
        last = self._flushed.get(fd, 0)
        if position - (last if last <= position else 0) < DATASYNC_BYTES:
            return
        if self._flushing is not None:
            if not self._flushing.done():
                return
            self._end_flush()
        if self._flusher is None:
            self._flusher = ThreadPoolExecutor(1, thread_name_prefix="rectool-flush")
        self._flushed[fd] = position
        name = self.names.get(fd, f"descriptor {fd}")
        self._flushing = self._flusher.submit(_flush, os.dup(fd), name)

    def _end_flush(self) -> None:
        """Wait for the flush under way, if any; raise its error."""
        flushing, self._flushing = self._flushing, None
        if flushing is not None:
            flushing.result()

    def forget(self, fd: int) -> None:
        """Forget what was written to `fd`, about to be closed (its number may come again)."""
        self._written.pop(fd, None)
        self._flushed.pop(fd, None)

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(self, fd: int, data: Buffer | list[Buffer], digest: Feed | None = None) -> int:
        """Queue `data` (bytes, or a list of buffers) to be written to `fd` (and fed to
        `digest`) after everything before; return the job's number (see `wait`)."""
        self._raise()
        parts = data if isinstance(data, list) else [data]
        if not self.background:
            self.submitted += 1
            try:
                self._write(fd, parts, digest)
            finally:
                self._completed += 1
            return self.submitted
        self._started().put((fd, parts, digest))
        self.submitted += 1
        return self.submitted

    def wait(self, job: int) -> None:
        """Wait until job number `job` and every one before it are done with their buffers."""
        with self._done:
            while self._completed < job:
                self._done.wait()

    def drain(self) -> None:
        """Wait until every queued write, and the flush under way, are done."""
        self.wait(self.submitted)
        self._raise()
        self._end_flush()  # the writer thread is idle: no job starts another

    def close(self) -> None:
        """Finish the queued writes and stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._hasher is not None:
            self._hasher.shutdown()
            self._hasher = None
        try:
            self._end_flush()
        finally:
            if self._flusher is not None:
                self._flusher.shutdown()
                self._flusher = None
        self._raise()


def write_all(fd: int, data: ReadableBuffer) -> None:
    """Write all of `data` to `fd`, at most WRITE_BYTES a call."""
    view = memoryview(data)
    while view:
        # At most WRITE_BYTES a call: on this machine 4 MB writes ran at about 0.5 GB/s and
        # 1 MB ones at about 4 GB/s into the page cache.
        view = view[os.write(fd, view[:WRITE_BYTES]) :]
