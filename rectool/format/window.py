"""Read a whole .rec front to back while holding a bounded part of it: `RecWindow`.

A scan of every record (info and report of a pack without a binary index, the report's
duplicate fingerprints, verify, repack, unpack) maps the file once and reads it in ascending
windows of at most `span` bytes. Each window's pages are handed back before the next one is
given out (madvise MADV_DONTNEED: they stay in the page cache, but leave the process's
resident set), so a scan's RSS is its own arrays plus one window, not the pack: a job limit
that counts RSS (Slurm, containers) would kill a scan of a 300 GB pack that kept its pages.

The bound is structural: `view(lo, hi)` is a numpy view of that range only (an index outside
it raises), and the previous view's pages are released first. `read`/`record` copy a few
bytes from anywhere (a sampled record, a thumbnail) with pread, mapping nothing; a split or
damaged record goes through the reader's own walk on the mapping, released at once.
`release` is the hook that hands pages back (tests inject one to see every range).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..reader import (
    CFLAG_WHOLE,
    LENGTH_BITS,
    MAGIC,
    PART_HEADER,
    RecordFile,
    RecordFormatError,
    open_regular,
)

if TYPE_CHECKING:
    from _typeshed import StrPath
    from numpy.typing import NDArray

WINDOW_BYTES = 16 << 20  # a window: large enough that a record rarely straddles two
# A read fault maps more than its page: the cached pages around it (fault_around_bytes, 64
# KiB) and, since Linux 6.x, the whole large folio it falls in (up to 2 MiB, a PMD).
FAULT_AROUND = max(mmap.PAGESIZE, 2 << 20)
# release(mapping, lo, hi): hand back the pages of bytes lo..hi of a mapping.
Release = Callable[[Any, int, int], object]


def release_range(mapping: object, lo: int, hi: int) -> None:
    """Drop this process's page-table entries for bytes lo..hi of a mapping (the pages stay in
    the page cache): they no longer count in its RSS. Does nothing for bytes (an empty file).

    The range is widened to whole FAULT_AROUND blocks: a read fault maps cached pages around
    it too, and single records read all over a file would otherwise leave their neighbours
    mapped until the whole file is (measured on Linux 6.18: the report's duplicate hashing
    held 770 MB of a 730 MB pack releasing just the records' pages; `info`'s 200 sampled
    records, 50 MB)."""
    if isinstance(mapping, mmap.mmap) and not mapping.closed and hi > lo:
        start = lo - lo % FAULT_AROUND
        end = min(len(mapping), hi + (-hi % FAULT_AROUND))
        if end > start:  # (nothing past the end of the file)
            mapping.madvise(mmap.MADV_DONTNEED, start, end - start)


class RecWindow:
    """A .rec read through a window of at most `span` bytes of its mapping at a time.

    `view(lo, hi)`: bytes lo..hi as a read-only uint8 array (the previous view released);
    `batches(starts)`: group sorted record starts into windows; `read(offset, n)`,
    `record(offset)`: copies from anywhere. `bytes_read` counts every byte given out, `peak`
    the largest range held at once. A context manager; `close` releases and unmaps.
    """

    def __init__(
        self, path: StrPath, span: int = WINDOW_BYTES, release: Release | None = None
    ) -> None:
        if span < 4096:
            raise ValueError(f"a window must hold at least 4096 bytes, not {span}")
        self.file = RecordFile(path)  # a FIFO or device is refused
        self.path, self.span = self.file.path, span
        self.mapping = self.file.open()
        self.size = len(self.mapping)
        self._fd = open_regular(self.path, "record file")[0]  # single records: pread
        self._release: Release = release or release_range
        self._held: tuple[int, int] | None = None
        self.bytes_read = 0
        self.peak = 0

    def __enter__(self) -> RecWindow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the window and unmap the file (a view still alive keeps the mapping)."""
        self.drop()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self.file.close()
        except BufferError:  # a numpy view of the mapping is alive; the mapping goes with it
            pass

    def _hold(self, lo: int, hi: int) -> None:
        self.drop()
        self._held = (lo, hi)
        self.bytes_read += hi - lo
        self.peak = max(self.peak, hi - lo)

    def drop(self) -> None:
        """Hand back the pages of the range held now, if any."""
        if self._held is not None:
            lo, hi = self._held
            self._held = None
            self._release(self.mapping, lo, hi)

    def hold(self, lo: int, hi: int) -> None:
        """Take bytes lo..hi as the window, for code that reads `mapping` by absolute offsets
        (a walk part by part): the previous window's pages are released first, these with
        the next. Code that holds a range reads only inside it (a record that straddles its
        end: the next range starts where this one ends, and takes the rest)."""
        self._hold(max(0, lo), max(lo, min(hi, self.size)))

    def view(self, lo: int, hi: int) -> NDArray[np.uint8]:
        """Return bytes lo..hi (clipped to the file) as a read-only uint8 view; the pages of
        the previous view are released first. Raises ValueError past `span` bytes."""
        lo = min(max(0, lo), self.size)
        hi = max(lo, min(hi, self.size))
        if hi - lo > self.span:
            raise ValueError(f"a view of {hi - lo:,} bytes is over the window ({self.span:,})")
        self._hold(lo, hi)
        return np.frombuffer(self.mapping, np.uint8, hi - lo, lo)

    def read(self, offset: int, n: int) -> bytes:
        """Return a copy of bytes offset..offset+n (clipped to the file): from the window held
        when inside it, else read from the file (pread), mapping nothing."""
        lo, hi = max(0, offset), min(offset + min(n, self.span), self.size)
        if hi <= lo:
            return b""
        inside = self._inside(lo, hi)
        data = bytes(self.mapping[lo:hi]) if inside else os.pread(self._fd, hi - lo, lo)
        self._count(lo, hi, mapped=inside)
        return data

    def record(self, offset: int, key: int | None = None) -> bytes:
        """Return the record at `offset` (split parts rejoined). A whole record outside the
        window held is read from the file (two preads), mapping nothing: random reads all
        over a pack would otherwise map it page by page (a read fault maps its whole large
        folio). Any other goes through `RecordFile.read_parts`, and raises
        `RecordFormatError` as it does; its pages are released at once."""
        if not self._inside(offset, offset + 8) and offset >= 0 and not offset & 3:
            head = os.pread(self._fd, 8, offset)
            if len(head) == 8:
                magic, lrec = PART_HEADER.unpack(head)
                end = offset + 8 + lrec
                if magic == MAGIC and lrec >> LENGTH_BITS == CFLAG_WHOLE:
                    if end + (-end & 3) <= self.size:
                        data = os.pread(self._fd, lrec, offset + 8)
                        if len(data) == lrec:
                            self._count(offset, end + (-end & 3), mapped=False)
                            return data
        try:
            data, after = self.file.read_parts(offset, key)
        except RecordFormatError:
            self._count(max(0, offset), max(0, min(self.size, offset + 8)))  # a part header
            raise
        self._count(offset, after)
        return data

    def _inside(self, lo: int, hi: int) -> bool:
        held = self._held
        return held is not None and held[0] <= lo and hi <= held[1]

    def _count(self, lo: int, hi: int, mapped: bool = True) -> None:
        """Count bytes lo..hi read by copy; release their pages (`mapped`: read through the
        mapping) unless the window held has them."""
        self.bytes_read += max(0, hi - lo)
        self.peak = max(self.peak, hi - lo)
        if mapped and not self._inside(lo, hi):
            self._release(self.mapping, lo, hi)

    def batches(self, starts: NDArray[np.int64]) -> Iterator[tuple[int, int, int, int]]:
        """Yield (i, j, lo, hi): records `starts[i:j]` (ascending) lie in bytes lo..hi, which is
        at most `span` bytes and ends at the next batch's first start (or the end of the file).

        A record is whole inside its batch when the records do not overlap; one longer than
        the span gets a batch of its own, cut at `span` bytes (its caller reads the rest).
        """
        n, i = len(starts), 0
        while i < n:
            lo = int(starts[i])
            if self.size - lo <= self.span:
                yield i, n, lo, self.size
                return
            last = int(np.searchsorted(starts, lo + self.span, "right")) - 1
            j = int(np.searchsorted(starts, starts[last], "left"))  # the next batch's first
            if j <= i:  # one record (or several at one offset) over the span: cut at it
                j = int(np.searchsorted(starts, lo, "right"))
                hi = min(lo + self.span, int(starts[j]) if j < n else self.size)
            else:
                hi = int(starts[j])
            yield i, j, lo, max(lo, hi)
            i = j


def ascending(offsets: NDArray[np.int64]) -> NDArray[np.intp] | None:
    """Return None when `offsets` never decrease (as a pack writes them), else the order that
    sorts them (what `RecWindow.batches` needs)."""
    if len(offsets) < 2 or bool((offsets[1:] >= offsets[:-1]).all()):
        return None
    return np.argsort(offsets, kind="stable")
