"""The memory a repack's batches of copied records are joined into (`BatchBuffers`).

`RecordCopier.frame` joins each batch of records it copies (a shuffle's scattered records,
say) into one of a few buffers used in turn, and hands it to the writer; its header words are
patched in place there. Where the system has memfds (Linux), the kernel gathers the records
into them, without the GIL.
"""

from __future__ import annotations

import bisect
import itertools
import mmap
import os
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import RectoolError

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

# A stretch handed to the writer holds at most this many bytes of records.
BATCH_BYTES = 8 << 20
# Batches copied are joined into this many buffers, used in turn (see `BatchBuffers`): the
# one being joined and two the writer may be writing or hashing. Each buffer holds what its
# largest batch touched (a shuffle of 1M small records: 1.4 MiB a batch, so 4 MiB in all).
BUFFER_COUNT = 3
BUFFER_STEP = 1 << 20  # a buffer grows by this many bytes at a time, to BATCH_BYTES
# Batches are gathered into memfds by the kernel where the system has them (`BatchBuffers`),
# this many parts a call (Linux's IOV_MAX).
KERNEL_GATHER = hasattr(os, "memfd_create") and hasattr(os, "pwritev")
IOV_MAX = 1024


class BatchBuffers:
    """Memory the batches of a copy are joined into, reused (`RecordCopier.frame`): up to
    `count` buffers of `size` bytes, used in turn, each once the writer is done with the
    batch it held (`wait(job)`, `ShardWriter.wait_written`).

    Joined into new memory each, the batches of a shuffled repack of the 100k benchmark pack
    cost 25,000 more page faults and 0.15 s more CPU: the allocator gave their pages back to
    the system and took them again.

    Where the system has them (Linux), each buffer is a memfd (memory, not a file) mapped
    here, and the kernel copies a batch's parts into it (`os.pwritev`, IOV_MAX parts a call):
    the copy runs without the GIL, while the writer and hashing threads go on. Copied by
    Python (one C call a part, the GIL held throughout), the shuffled repack of the 100k pack
    took 0.90-1.08 s (median 0.95); gathered by the kernel, 0.88-1.06 s (median 0.90; 7 runs
    each, in turns). The kernel's copy costs more CPU than Python's; the other threads run
    meanwhile. Without a memfd (`kernel=False`), a buffer is a bytearray the parts are
    copied into.
    """

    def __init__(
        self,
        wait: Callable[[int], None],
        count: int | None = None,
        size: int | None = None,
        kernel: bool | None = None,
    ) -> None:
        self.wait = wait
        self.count = BUFFER_COUNT if count is None else count
        self.size = BATCH_BYTES if size is None else size
        self.kernel = KERNEL_GATHER if kernel is None else kernel
        self._buffers: list[memoryview] = []
        self._memfds: list[int] = []  # per buffer, with `kernel`: its memfd
        self._jobs: list[int] = []  # per buffer, the writer's job that holds its last batch
        self._next = 0
        self.taken: int | None = None  # the buffer of the batch not yet handed to the writer
        # The memfds are closed with this object at the latest (their mappings go with their
        # last view, maybe one still queued for writing).
        self._finalizer = weakref.finalize(self, _close_all, self._memfds)

    def close(self) -> None:
        """Close the buffers' memfds (their mappings go with their last view)."""
        self._finalizer()

    def join(self, parts: Sequence[ReadableBuffer], size: int) -> memoryview | bytearray:
        """Return `parts` (`size` bytes in all) joined, in the next buffer: a writable view of
        it (new memory when they do not fit)."""
        if size > self.size:
            return bytearray().join(parts)
        k = self._next
        if k == len(self._buffers):
            self._buffers.append(self._memory())
            self._jobs.append(0)
        else:
            self.wait(self._jobs[k])
        if len(self._buffers[k]) < size:  # zeroed as made: only what batches need, in MiBs
            grown = min(self.size, -(-size // BUFFER_STEP) * BUFFER_STEP)
            self._buffers[k] = memoryview(bytearray(grown))
        buffer = self._buffers[k]
        if k < len(self._memfds):
            _gather(self._memfds[k], parts)
        else:
            _copy_into(buffer, 0, parts)
        self._next, self.taken = (k + 1) % self.count, k
        return buffer[:size]

    def _memory(self) -> memoryview:
        """Return a new buffer: a mapped memfd of `size` bytes (its pages are allocated as
        they are written), or, without `kernel` or where one cannot be made, an empty view
        (`join` makes a bytearray)."""
        if not self.kernel or len(self._memfds) < len(self._buffers):
            return memoryview(b"")
        try:
            memfd = os.memfd_create("rectool-batch", os.MFD_CLOEXEC)
        except OSError:  # none left (EMFILE), or refused by a sandbox: bytearrays then
            self.kernel = False
            return memoryview(b"")
        try:
            os.ftruncate(memfd, self.size)
            mapped = mmap.mmap(memfd, self.size)
        except BaseException:
            os.close(memfd)
            raise
        self._memfds.append(memfd)
        return memoryview(mapped)

    def handed(self, job: int) -> None:
        """Note that the batch last joined is held by the writer's job `job` (its `flush`)."""
        if self.taken is not None:
            self._jobs[self.taken], self.taken = job, None


def _copy_into(buffer: memoryview, at: int, parts: Sequence[ReadableBuffer]) -> None:
    """Copy `parts` into `buffer` back to back from byte `at`, each by C code (a bytearray or
    a mapping keeps its size while viewed)."""
    ends = list(itertools.accumulate(map(len, parts), initial=at))  # type: ignore[arg-type]
    deque(map(buffer.__setitem__, map(slice, ends, ends[1:]), parts), maxlen=0)


def _gather(memfd: int, parts: Sequence[ReadableBuffer]) -> None:
    """Have the kernel copy `parts` back to back into the memfd `memfd` from its start:
    `os.pwritev`, IOV_MAX parts a call, again from where a call stopped (a short count: a
    signal); an error is raised as a `RectoolError`."""
    at = 0
    for first in range(0, len(parts), IOV_MAX):
        group = list(parts[first : first + IOV_MAX])
        end = at + sum(map(len, group))  # type: ignore[arg-type]
        while True:
            try:
                done = os.pwritev(memfd, group, at)
            except OSError as exc:  # EFAULT: a source's pages gone (a file cut while mapped)
                raise RectoolError(
                    f"cannot copy {len(group)} records from the mapped sources "
                    f"({exc.strerror}); was a source file changed while it was read?"
                ) from None
            at += done
            if at >= end or not done:
                break
            ends = list(itertools.accumulate(map(len, group)))  # type: ignore[arg-type]
            i = bisect.bisect_right(ends, done)  # the part the call stopped in, and the rest
            group = [memoryview(group[i])[done - (ends[i - 1] if i else 0) :], *group[i + 1 :]]
        if at < end:  # no progress: never from a memfd, but never a loop either
            raise RectoolError(f"cannot copy records into memory: {end - at} bytes left")


def _close_all(memfds: list[int]) -> None:
    while memfds:
        os.close(memfds.pop())
