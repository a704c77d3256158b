"""Copy repack's records out of the mapped sources: a window of records at a time, in numpy.

`RecordCopier.window` reads the framing and header words of a window of catalog rows once
(`Window`); `refusals` runs pack's structural image check over the window's images where they
lie in the mapping; `frame` hands the writer a stretch of the window framed for the output.
Whole records are copied as slices of the mapping (a stretch that changes nothing is handed
over as a view, without a copy) and the header words that change, label and key, are patched
with numpy afterwards: no Python bytecode runs per record. A record changing label shape
(`--pack-label`) gets a new head, built in numpy, joined to the rest of its bytes. Only a
record whose framing must change (a split record, or a new header word equal to the dmlc magic)
is read and framed again by `writer.frame_record`.
"""

from __future__ import annotations

import gc
import mmap
import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..format.headers import record_heads, unpack_header
from ..format.writer import frame_record, pack_image_record
from ..packer.images import ImageRefused, check_image
from ..packer.layout import image_label
from ..packer.passthrough import refused_images
from ..reader import (
    IMAGE_HEADER_SIZE,
    MAGIC,
    MAX_RECORD_BYTES,
    RecordFile,
)
from .batches import BATCH_BYTES, BatchBuffers
from .selection import distinct

if TYPE_CHECKING:
    from ..format.headers import Header
    from .plan import Catalog
    from .sources import Source

    # A mapped source file: its mapping (8 zero bytes for an empty file), its uint32 words,
    # and its size.
    Mapped = tuple[mmap.mmap | bytes, np.ndarray, int]

# A stretch handed over as a view of the mapping (nothing copied) may hold this many: fewer,
# larger writes and .idx blocks (see `RecordCopier.frame`).
VIEW_BYTES = 64 << 20
# The source mappings are let go once about this many bytes of them are mapped (see
# `RecordCopier._note_pages`), counted in blocks of BLOCK_BITS bits (Linux maps a file's cached
# pages 64 KiB around each page fault).
RELEASE_BYTES = 64 << 20
# A shuffle reads records scattered over the whole source: letting go of its pages every
# RELEASE_BYTES would fault each block in again for every window (4x cp + sync on the 100k pack
# against 1.3x). Its mappings are let go after this many (RSS bounded, not by the pack's size).
SHUFFLE_RELEASE_BYTES = 1 << 30
BLOCK_BITS = 16


@dataclass
class Window:
    """What the sources' framing says about a window of catalog rows (arrays, one entry a row).

    `whole`: a complete, aligned, unsplit record with room for its header and labels, inside
    its file; only those are copied as bytes and checked in place.
    """

    rows: np.ndarray
    files: np.ndarray  # source file number (see `RecordCopier._file`)
    offsets: np.ndarray
    flag: np.ndarray  # int64: the header's label count
    length: np.ndarray  # int64: the payload's length (header, labels, image)
    framed: np.ndarray  # int64: bytes from the record's magic to the next record
    whole: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.rows)


def record_label(head: Header, label: float, pack_label: bool | None) -> float | list[float]:
    """Return the label a record of header `head` is written with, relabelled to `label`: a
    vector with `pack_label`, a scalar without, its own shape when None (`image_label`)."""
    vector = head.label if head.flag else None
    return image_label(label, vector, bool(head.flag) if pack_label is None else pack_label)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (if it runs) while the block runs."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()


def _leading(flags: np.ndarray) -> int:
    """Return how many of the first `flags` (a bool array) are all True."""
    return len(flags) if flags.all() else int(np.argmin(flags))


class RecordCopier:
    """Frame kept records for the output from the mmapped sources, a window at a time.

    `sources` are repack's opened sources (`.dataset`, `.shard_of`), `catalog` its catalog.
    """

    def __init__(self, sources: Sequence[Source], catalog: Catalog, shuffled: bool = False):
        self.sources, self.catalog = sources, catalog
        self.release_bytes = SHUFFLE_RELEASE_BYTES if shuffled else RELEASE_BYTES
        self._files: list[Mapped | None] = []  # (source, shard) -> (mmap, uint32 words, size)
        self._base = np.cumsum([0] + [len(s.dataset.shards) for s in sources])
        # Read by worker threads when re-encoding: made here, once, not on first use.
        self._record_files = {rec: RecordFile(rec) for s in sources for rec, _ in s.dataset.shards}
        # The sources' own record files mapped here (see `_file`).
        self._shared: list[RecordFile] = []
        # File number -> bool per block touched since the last release.
        self._touched: dict[int, np.ndarray] = {}
        self._mapped = 0  # bytes of those blocks, and of the insides of records longer than one
        self._closed = False

    def close(self) -> None:
        """Let go of every mapping (a mapping still queued for writing goes with its last
        view); later calls do nothing."""
        if self._closed:
            return
        maps = [entry[0] for entry in self._files if entry is not None]
        self._let_go()  # drops the numpy views first: a mapping with views cannot close
        for mm in maps:
            if isinstance(mm, mmap.mmap) and not mm.closed:
                try:
                    mm.close()
                except BufferError:  # a view is still queued (after an error): let GC close it
                    pass
        for rf in self._record_files.values():
            rf.close()
        self._closed = True

    def _file(self, f: int) -> Mapped:
        """Return (mapping, its uint32 words, size) of source file `f`, mapping it if need be."""
        while len(self._files) <= f:
            self._files.append(None)
        if self._files[f] is None:
            k = int(np.searchsorted(self._base, f, side="right") - 1)
            source, shard = self.sources[k], f - self._base[k]
            # The mapping the source's labels were read through (still mapped), else this
            # copier's own RecordFile of the shard: the reader's one mapping of a .rec.
            shared = source.record_files
            rf = shared[shard] if shared else self._record_files[source.dataset.shards[shard][0]]
            mm = rf.open()
            size = len(mm)
            self._shared.append(rf)
            mm = mm if size else b"\0" * 8
            self._files[f] = (mm, np.frombuffer(mm, "<u4", len(mm) // 4), size)
        return self._files[f]  # type: ignore[return-value]  # mapped above

    def _let_go(self) -> None:
        """Drop every mapping: each is unmapped once its last view (one queued for writing,
        say) is gone."""
        self._files = [None] * len(self._files)
        shared, self._shared = self._shared, []
        for rf in shared:
            try:
                rf.close()
            except BufferError:  # a view is still queued: the mapping goes with the last one
                pass

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return (file number, byte offset) of catalog rows."""
        cat = self.catalog
        src = cat.source[rows]
        if len(self.sources) == 1:
            s, samples = self.sources[0], cat.sample[rows]
            return s.shard_of[samples].astype(np.int64), np.asarray(s.dataset.offsets)[samples]
        files = np.empty(len(rows), np.int64)
        offsets = np.empty(len(rows), np.int64)
        for k in distinct(src).tolist():
            sel = np.flatnonzero(src == k)
            samples = cat.sample[rows[sel]]
            files[sel] = self._base[k] + self.sources[k].shard_of[samples]
            offsets[sel] = np.asarray(self.sources[k].dataset.offsets)[samples]
        return files, offsets

    def window(self, rows: np.ndarray) -> Window:
        """Return the `Window` of catalog `rows`: their framing, read once from the mappings."""
        self._release_if_due()
        files, offsets = self.locate(rows)
        n = len(rows)
        length = np.zeros(n, np.int64)
        flag = np.zeros(n, np.int64)
        whole = np.zeros(n, bool)
        numbers = distinct(files).tolist()
        for f in numbers:
            sel = np.flatnonzero(files == f) if len(numbers) > 1 else slice(None)
            _, words, size = self._file(f)
            o = offsets[sel]
            ok, _, head = record_heads(words, size, o)
            length[sel] = np.where(ok, head[:, 1], 0)
            flag[sel] = np.where(ok, head[:, 2], 0)
            whole[sel] = ok
            self._note_pages(f, np.where(ok, o, 0), np.where(ok, o + 8 + length[sel], 0))
        framed = 8 + ((length + 3) & ~3)
        return Window(np.asarray(rows), files, offsets, flag, length, framed, whole)

    def refusals(self, win: Window, max_pixels: int) -> dict[int, str]:
        """Return {i: reason} for each record `i` of `win` whose image `pack` would refuse
        (`check_image` in structure mode: empty, truncated, corrupt, over `max_pixels`).

        A payload with no known image signature is refused, as `pack` refuses such a file
        ("not an image"): a repack never carries forward what `verify` calls "not-an-image".

        Whole records are checked where they lie in the mapped source, the JPEG walk over
        all of them at once (`passthrough.refused_images`); any other record is read whole.
        """
        out: dict[int, str] = {}
        for f in distinct(win.files).tolist():
            sel = np.flatnonzero((win.files == f) & win.whole)
            if not len(sel):
                continue
            mm, _, size = self._file(f)
            o = win.offsets[sel]
            heads = o + 8 + IMAGE_HEADER_SIZE + 4 * win.flag[sel]
            ends = o + 8 + win.length[sel]
            u8 = np.frombuffer(mm, np.uint8, size) if size else np.zeros(0, np.uint8)
            try:
                refused = refused_images(u8, heads, ends, check_image, max_pixels)
            finally:
                del u8
            for k, refusal in refused.items():
                out[int(sel[k])] = refusal.reason
        for i in np.flatnonzero(~win.whole).tolist():
            _, image = self.read_record(int(win.rows[i]))
            try:
                check_image(image, "structure", max_pixels)
            except ImageRefused as refusal:
                out[i] = refusal.reason
        return out

    def frame(
        self,
        win: Window,
        a: int,
        b: int,
        labels: np.ndarray,
        keys: np.ndarray,
        pack_label: bool | None,
        max_bytes: int | None = None,
        view_bytes: int | None = None,
        buffers: BatchBuffers | None = None,
    ) -> tuple[memoryview | bytearray, list[int], int]:
        """Frame the first records of `win[a:b]` (relabelled to `labels`, keyed `keys`, one
        each) that fit in `max_bytes` (default BATCH_BYTES; at least one); return (framed
        records back to back, their start offsets, how many that is).

        Whole records are copied and their header words patched; any other record is read,
        rejoined and framed again. `pack_label` is the label shape written (`image_label`):
        a vector (True) or a scalar (False); None keeps each record's. A whole record of the
        other shape changes length: its new head (`_new_heads`) is joined to its image bytes.
        When the records that fit lie back to back in one source and keep their header
        words, that stretch, as far as it goes up to `view_bytes`, is handed over as a view
        of the mapping: nothing is copied, so it may be larger. A copy is joined into
        `buffers` when given (see `BatchBuffers`: then hand the writer's job to
        `buffers.handed`), else into new memory.
        """
        max_bytes = BATCH_BYTES if max_bytes is None else max_bytes
        framed = win.framed[a:b]
        reach = np.cumsum(framed)
        n = max(1, int(np.searchsorted(reach, max_bytes, side="right")))
        # Looked at: what a view may hold (and at least what a copy holds).
        m = max(n, int(np.searchsorted(reach, view_bytes or 0, side="right")))
        end = a + m
        rows, files, offsets = win.rows[a:end], win.files[a:end], win.offsets[a:end]
        flag, framed, whole = win.flag[a:end], framed[:m], win.whole[a:end]
        labels, keys = labels[:m], keys[:m]
        label_bits = labels.astype("<f4").view("<u4")
        key_lo = (keys & 0xFFFFFFFF).astype(np.uint32)
        key_hi = (keys >> 32).astype(np.uint32)
        plain = whole & (label_bits != MAGIC) & (key_lo != MAGIC) & (key_hi != MAGIC)
        fast = plain.copy()
        if pack_label is not None:
            fast &= (flag > 0) if pack_label else (flag == 0)
        # Records that follow each other in one source file are copied as one slice.
        joined = np.zeros(m, bool)
        joined[1:] = (
            fast[1:]
            & fast[:-1]
            & (files[1:] == files[:-1])
            & (offsets[1:] == offsets[:-1] + framed[:-1])
        )
        if fast[0]:
            # The leading records that lie back to back in one source and keep their header
            # words (a pack resharded, or already in this order): handed to the writer as
            # they are, without a copy, when they cover at least what a copy would.
            stretch = _leading(np.r_[True, joined[1:]])  # back to back in one file
            if stretch >= n:
                k = slice(0, stretch)
                same = self._unchanged(
                    files[0], offsets[k], flag[k], label_bits[k], key_lo[k], key_hi[k]
                )
                stretch = _leading(same)
            if stretch >= n:
                mm = self._file(int(files[0]))[0]
                first = int(offsets[0])
                view = memoryview(mm)[first : int(offsets[stretch - 1] + framed[stretch - 1])]
                return view, (offsets[:stretch] - first).tolist(), stretch
        rows, files, offsets = rows[:n], files[:n], offsets[:n]
        flag, framed, whole, fast, joined = flag[:n], framed[:n], whole[:n], fast[:n], joined[:n]
        labels, keys, label_bits = labels[:n], keys[:n], label_bits[:n]
        key_lo, key_hi = key_lo[:n], key_hi[:n]
        # Whole records of the other label shape: a new head before the rest of their bytes.
        reshaped = plain[:n] & ~fast
        if pack_label:  # one label word more: within the RecordIO limit
            reshaped &= win.length[a : a + n] + 4 <= MAX_RECORD_BYTES
        firsts = np.flatnonzero(~joined)
        lasts = np.r_[firsts[1:], n] - 1
        sizes_out = framed.copy()
        quick = fast[firsts]
        run_files = files[firsts].tolist()
        # Each run is a memoryview, which the garbage collector tracks: a shuffle's batch holds
        # a thousand at once, enough to set off a collection or two (45 ms of a shuffled repack
        # of the 100k benchmark pack went to them). They are in no cycle: it waits for them.
        with _collector_paused():
            views = {f: memoryview(self._file(f)[0]) for f in set(run_files)}
            # Every run as a slice of its mapping, sliced by C code (no bytecode per run).
            parts: list[memoryview | bytes] = list(
                map(
                    operator.getitem,  # type: ignore[arg-type]  # stubs: a memoryview's slice
                    map(views.__getitem__, run_files),
                    map(slice, offsets[firsts].tolist(), (offsets + framed)[lasts].tolist()),
                )
            )
            redo = ~quick
            if reshaped.any():  # each a run of one
                at = np.flatnonzero(reshaped)
                heads, rest = self._new_heads(
                    files[at],
                    offsets[at],
                    flag[at],
                    win.length[a : a + n][at],
                    label_bits[at],
                    key_lo[at],
                    key_hi[at],
                    bool(pack_label),
                )
                ends = offsets[at] + framed[at]
                size = 4 * heads.shape[1]
                blob = heads.tobytes()
                runs = np.searchsorted(firsts, at)
                for j, (k, f, start, stop) in enumerate(
                    zip(runs.tolist(), files[at].tolist(), rest.tolist(), ends.tolist())
                ):
                    parts[k] = b"".join((blob[j * size : (j + 1) * size], views[f][start:stop]))
                sizes_out[at] = size + ends - rest
                redo[runs] = False
            for k in np.flatnonzero(redo).tolist():  # a run of one, framed again
                i = int(firsts[k])
                record = self._reframe(int(rows[i]), float(labels[i]), int(keys[i]), pack_label)
                sizes_out[i] = len(record)
                parts[k] = record
            size = int(sizes_out.sum())
            data = bytearray().join(parts) if buffers is None else buffers.join(parts, size)
            del parts, views
        starts = np.zeros(n, np.int64)
        np.cumsum(sizes_out[:-1], out=starts[1:])
        out = np.frombuffer(data, "<u4")
        w = starts[fast] >> 2
        vector = flag[fast] > 0
        out[w + np.where(vector, 8, 3)] = label_bits[fast]
        out[w + 4] = key_lo[fast]
        out[w + 5] = key_hi[fast]
        del out
        return data, starts.tolist(), n

    def _new_heads(
        self,
        files: np.ndarray,
        offsets: np.ndarray,
        flag: np.ndarray,
        length: np.ndarray,
        label_bits: np.ndarray,
        key_lo: np.ndarray,
        key_hi: np.ndarray,
        pack_label: bool,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return the new heads of whole records changing label shape, one row of uint32 words
        a record (part header, image header, labels), and where the rest of each record's
        bytes starts in its file.

        `pack_label`: a scalar becomes a vector of one, `IRHeader(1, 0.0, key, id2)` and the
        label, one word longer; else a vector becomes its first label, `IRHeader(0, label,
        key, id2)`, its labels dropped. The image keeps its alignment (whole words come or
        go), so a record without an aligned magic word stays without one, and its padding.
        """
        id2 = np.empty((len(offsets), 2), np.uint32)
        for f in distinct(files).tolist():
            sel = np.flatnonzero(files == f)
            words = self._file(f)[1]
            w = offsets[sel] >> 2
            id2[sel, 0], id2[sel, 1] = words[w + 6], words[w + 7]
        heads = np.zeros((len(offsets), 9 if pack_label else 8), "<u4")
        heads[:, 0] = MAGIC
        if pack_label:
            heads[:, 1] = length + 4
            heads[:, 2] = 1  # the flag; word 3, the header's label, 0.0
            heads[:, 8] = label_bits
            rest = offsets + 8 + IMAGE_HEADER_SIZE
        else:
            heads[:, 1] = length - 4 * flag
            heads[:, 3] = label_bits  # the flag 0
            rest = offsets + 8 + IMAGE_HEADER_SIZE + 4 * flag
        heads[:, 4], heads[:, 5], heads[:, 6:8] = key_lo, key_hi, id2
        return heads, rest

    def _unchanged(
        self,
        f: int,
        offsets: np.ndarray,
        flag: np.ndarray,
        label_bits: np.ndarray,
        key_lo: np.ndarray,
        key_hi: np.ndarray,
    ) -> np.ndarray:
        """Return, per record at `offsets` of file `f`, whether it already holds this label
        and key."""
        words = self._file(int(f))[1]
        w = offsets >> 2
        label_at = w + np.where(flag > 0, 8, 3)
        return (words[label_at] == label_bits) & (words[w + 4] == key_lo) & (words[w + 5] == key_hi)

    def _note_pages(self, f: int, offsets: np.ndarray, ends: np.ndarray) -> None:
        """Count the blocks of file `f` that records `offsets`..`ends` map; once they add up
        to `release_bytes`, the next window lets go of every mapping (`_release_if_due`).

        The pages stay in the page cache, but no longer count in this process's memory, so
        RSS stays bounded. Blocks, not bytes copied, are counted: a shuffled copy touches
        blocks all over its sources, and letting go of them every few copied megabytes would
        fault the same pages in again and again (on the 100k benchmark pack, a shuffle took
        2.0-2.3 s letting go every 64 MB copied, 0.85-0.9 s with the mapping kept). A mapping
        is unmapped once the last view of it, maybe one queued for writing, is gone; munmap
        costs far less than madvise(MADV_DONTNEED) with other threads running.
        """
        size = self._file(f)[2]
        touched = self._touched.get(f)
        if touched is None:
            touched = self._touched[f] = np.zeros((size >> BLOCK_BITS) + 1, bool)
        before = int(np.count_nonzero(touched))
        first, last = offsets >> BLOCK_BITS, np.maximum(ends - 1, offsets) >> BLOCK_BITS
        touched[first] = True
        touched[last] = True
        inside = int(np.maximum(last - first - 1, 0).sum())
        self._mapped += (int(np.count_nonzero(touched)) - before + inside) << BLOCK_BITS

    def _release_if_due(self) -> None:
        if self._mapped >= self.release_bytes:
            self._mapped = 0
            self._touched = {}
            self._let_go()
            for rf in self._record_files.values():  # only this thread reads them here
                rf.close()

    def _reframe(self, row: int, label: float, key: int, pack_label: bool | None) -> bytes:
        head, image = self.read_record(row)
        value = record_label(head, label, pack_label)
        return frame_record(pack_image_record(image, value, key, head.id2), f"key {key}")

    def read_record(self, row: int) -> tuple[Header, bytes]:
        """Return (header, image bytes) of a catalog row, read record by record."""
        s = self.sources[self.catalog.source[row]]
        i = int(self.catalog.sample[row])
        rec, offset, key = s.dataset.location(i)
        record = self._record_files[rec].read_parts(offset, key)[0]
        head, image = unpack_header(record, rec, offset)
        return head, bytes(image)
