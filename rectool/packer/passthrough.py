"""Pass-through packing a block at a time: files read straight into framed records.

Passing images through is reading them: a few system calls and, in Python, a few microseconds
of bookkeeping an image, which over many small images is most of the run. So files are
read (`readv`) directly into a reused buffer behind room for their record headers, the headers
are packed in place, and the work that does not need Python per image is done per block:

- the JPEG structure check walks the markers of every image in the block at once with numpy;
  any image that does not pass that walk cleanly is checked again one by one, by the same
  `check_image` the other paths use, which decides and names the reason;
- the dmlc magic word is searched for once over the whole block: the only aligned words that
  may hold it are the record starts, else a record is framed again with its split parts.

A block holds what the list says in order: framed records back to back, and refusals between
them. `Block.runs()` gives them to the writer as contiguous runs and single refusals.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from ..errors import RecordTooLargeError
from ..format.headers import IMAGE_HEADER
from ..format.writer import frame_image_record, frame_record
from ..reader import (
    LENGTH_MASK,
    MAGIC,
    MAX_RECORD_BYTES,
    PART_HEADER,
)
from .images import (
    DEFAULT_MAX_PIXELS,
    JPEG_FRAME_MARKERS,
    JPEG_STANDALONE_MARKERS,
    ImageRefused,
    check_image,
)

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from ..archives.reading import MemberReader, StreamReader

    # An archive ROOT's members (rectool/archives/), or None for a tree.
    MemberSource = MemberReader | StreamReader | None

    from .listfile import ListItem
    from .workers import Run

TOO_LARGE = f"record exceeds the RecordIO limit of {MAX_RECORD_BYTES} bytes"
# Room for one block's records. Files longer than what is left of it are read on their own.
BLOCK_BYTES = 8 << 20
BUFFERS = 3
# A block ends once less than this is left, so that a typical image still fits whole.
MIN_ROOM = 256 << 10
# The part header (magic, length) and the image header (flag, label, id, id2) of a record.
_RECORD_HEADER = struct.Struct("<IIIfQQ")
_HEADER_BYTES = _RECORD_HEADER.size  # 32 = PART_HEADER + IMAGE_HEADER
_KEY_OFFSET = 16  # of the id field, from the record start
# Markers the block walk leaves to `check_image`: fill bytes, standalone markers, and an
# end-of-image before the scan (an error it names).
_ODD_MARKERS = np.zeros(256, bool)
_ODD_MARKERS[[0xFF, 0xD9, *JPEG_STANDALONE_MARKERS]] = True
_FRAME_MARKERS = np.zeros(256, bool)
_FRAME_MARKERS[list(JPEG_FRAME_MARKERS)] = True
# Segments before the scan in ordinary JPEGs; an image with more is checked one by one.
_MAX_SEGMENTS = 64

assert PART_HEADER.size + IMAGE_HEADER.size == _HEADER_BYTES


class Block:
    """What a run of list items became: framed records in `buffer`, refusals between them.

    Entry j is list item `items[j]`: a record at `starts[j]:ends[j]` of the buffer, or
    a refusal in `refused[j]`, or a record framed on its own in `framed[j]`.
    """

    __slots__ = (
        "buffer",
        "items",
        "starts",
        "ends",
        "refused",
        "framed",
        "alone",
        "written",
    )

    # Its records are views of a buffer that the packer fills again once `written` says so.
    reuses_buffer = True
    buffer: bytearray
    items: list[ListItem]
    starts: list[int]
    ends: list[int]
    refused: dict[int, str]
    framed: dict[int, bytes]
    alone: tuple[int, bytes] | None
    written: int | None

    def __init__(self, buffer: bytearray) -> None:
        self.buffer = buffer
        self.items, self.starts, self.ends = [], [], []
        self.refused, self.framed = {}, {}
        self.alone = None  # (j, bytes) of a file too long for the buffer

        # Set by the consumer: a job number to wait for before the buffer is reused.
        self.written = None

    def image(self, j: int) -> bytes:
        """Return the image bytes of record j (one that was not refused)."""
        if self.alone is not None and self.alone[0] == j:
            return self.alone[1]
        begin, end = self.payload(j)
        (flag,) = struct.unpack_from("<I", self.buffer, begin)  # the number of extra labels
        return bytes(self.buffer[begin + IMAGE_HEADER.size + 4 * flag : end])

    def payload(self, j: int) -> tuple[int, int]:
        """Return where record j's payload is in the buffer, as (begin, end).

        The buffer holds it unsplit even where a magic word made the record framed apart.
        """
        start = self.starts[j]
        (lrec,) = struct.unpack_from("<I", self.buffer, start + 4)
        return start + 8, start + 8 + (lrec & LENGTH_MASK)

    def runs(self) -> Iterator[Run]:
        """Yield, in list order, `(items, data, starts, j)` runs of records (the first of them
        entry j) and `(item, reason)` refusals.

        `data` holds the run's framed records back to back, record i from `starts[i]`: a view
        of the packer's buffer, valid until it fills that buffer again (see `written`).
        """
        items, starts, ends = self.items, self.starts, self.ends
        special = sorted((*self.refused, *self.framed))
        view = memoryview(self.buffer)
        first = 0
        for j in (*special, len(items)):
            if first < j:
                base = starts[first]
                data = view[base : ends[j - 1]]
                yield items[first:j], data, [s - base for s in starts[first:j]], first
            if j < len(items):
                if j in self.refused:
                    yield items[j], self.refused[j]
                else:
                    yield [items[j]], self.framed[j], [0], j
            first = j + 1


class PassThroughPacker:
    """Fill blocks from list items: read, frame and check each image, never decode it."""

    def __init__(
        self,
        root: str,
        check: str = "structure",
        pack_label: bool = False,
        block_bytes: int | None = None,
        wait: Callable[[int], object] | None = None,
        allow_outside_root: bool = False,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        source: MemberSource = None,
    ) -> None:
        """`wait(block.written)`, when given, is called before a block's buffer is reused.

        `source`, for an archive ROOT, reads the listed members instead of files
        (`rectool/archives/reading.py`).

        Paths that leave `root` (absolute, or with `..` climbing out) are refused as
        `OUTSIDE_ROOT` unless `allow_outside_root`; images whose header declares more than
        `max_pixels` pixels as `check_image` refuses them (unless `check` is "none").
        """
        self._prefix = os.path.join(root, "")
        self._allow_outside_root = allow_outside_root
        self._guard = RootGuard(root, allow_outside_root)
        self._check = check
        self._source = source
        self._max_pixels = max_pixels
        self._pack_label = pack_label
        self._size = (block_bytes or BLOCK_BYTES) & ~3  # whole words, for the magic search
        self._wait = wait
        # Blocks take turns over a few buffers, so one is filled while others are written.
        self._buffers = [bytearray(self._size) for _ in range(BUFFERS)]
        self._blocks: list[Block | None] = [None] * BUFFERS
        self._next = 0

    def wait_for_buffer(self) -> None:
        """Wait until the writer is done with the buffer the next `fill` fills."""
        previous = self._blocks[self._next]
        if previous is not None and previous.written is not None and self._wait is not None:
            self._wait(previous.written)
            previous.written = None

    def fill(
        self, items: Iterator[ListItem], max_items: int, first_key: int | None = None
    ) -> Block | None:
        """Read up to `max_items` items from the iterator `items` into a block; return it.

        Records are keyed by their list index, or, given `first_key`, numbered from it in
        order, refused images left out (the insightface layout).

        Only items that are placed in the block are taken from `items`. Its buffer is filled
        again BUFFERS calls later, once `wait(block.written)` returns (without `wait`: consume
        `runs()` before then). Returns None when `items` is empty.
        """
        self.wait_for_buffer()
        slot = self._next
        buffer = self._buffers[slot]
        block = Block(buffer)
        entries, starts, ends = block.items, block.starts, block.ends
        refused = block.refused
        view, prefix = memoryview(buffer), self._prefix
        pack_into = _RECORD_HEADER.pack_into
        open_, readv, close = self._guard.open, os.readv, os.close
        fstat, is_regular = os.fstat, stat.S_ISREG
        allow_outside = self._allow_outside_root
        add_item, add_start, add_end = entries.append, starts.append, ends.append
        pack_label = self._pack_label
        source = self._source
        size = self._size
        limit = size - min(MIN_ROOM, size // 4)
        head = _HEADER_BYTES
        pos = j = 0
        key = first_key
        path: str | None
        rest: bytes | None
        for item in itertools.islice(items, max_items):
            add_item(item)
            add_start(pos)
            if pack_label:
                head = _HEADER_BYTES + 4 * len(item.labels)
            begin = pos + head
            # Room for the image and its padding. A file that fills it is read on and framed
            # alone; so is one over the record size limit, always.
            room = size - begin - 3
            if room > MAX_RECORD_BYTES - head + 9:
                room = MAX_RECORD_BYTES - head + 9
            n, rest = 0, None
            path = item.path
            if source is not None:  # an archive's member
                n, rest, reason = source.read_into(path, view[begin : begin + room])
                if reason is not None:
                    refused[j] = reason
                path = None
            elif path[0] == "/" or ".." in path:  # rare: see whether it leaves ROOT
                path = resolve_path(prefix, path, allow_outside)
            else:
                path = prefix + path
            try:
                if source is not None:
                    pass
                elif path is None:
                    refused[j] = OUTSIDE_ROOT
                else:
                    fd = open_(path)
                    try:
                        info = fstat(fd)
                        if not is_regular(info.st_mode):
                            refused[j] = not_regular(info.st_mode)
                        elif info.st_size > MAX_RECORD_BYTES:
                            refused[j] = TOO_LARGE
                        else:
                            n = readv(fd, [view[begin : begin + room]])
                            rest = _read_rest(fd, info.st_size - n) if n == room else None
                    finally:
                        close(fd)
            except OSError as exc:
                refused[j] = _read_error(exc)
                n, rest = 0, None
            except OutsideRoot:
                refused[j] = OUTSIDE_ROOT_LINK
                n, rest = 0, None
            if 0 < n < room:
                if first_key is None:
                    key = item.index
                if pack_label:
                    labels = item.labels
                    pack_into(buffer, pos, MAGIC, head - 8 + n, len(labels), 0.0, key, 0)
                    struct.pack_into(f"<{len(labels)}f", buffer, pos + _HEADER_BYTES, *labels)
                else:
                    pack_into(buffer, pos, MAGIC, head - 8 + n, 0, item.labels[0], key, 0)
                if first_key is not None:
                    key += 1  # type: ignore[operator]  # numbered: from `first_key`
                end = begin + n
                buffer[end : end + 3] = b"\0\0\0"  # the padding, and maybe bytes to overwrite
                pos = end + (-n & 3)
                add_end(pos)
                if pos > limit:
                    break
            else:
                add_end(pos)
                if rest is not None:  # longer than the room left: a record of its own
                    block.alone = (j, bytes(view[begin : begin + n]) + rest)
                    break
                if j not in refused:
                    refused[j] = "empty file"
            j += 1
        if not entries:
            return None
        self._blocks[slot] = block
        self._next = (slot + 1) % BUFFERS
        if self._check != "none":
            before = len(block.refused)
            self._check_images(block)
            if first_key is not None and len(block.refused) > before:
                self._renumber(block, first_key)
        if block.alone is not None:
            self._frame_alone(block, first_key)
        self._split_magic_words(block, pos)
        return block

    def _renumber(self, block: Block, first_key: int) -> None:
        """Number the records in order again, the refused ones left out."""
        key = first_key
        for j, start in enumerate(block.starts):
            if j not in block.refused and start != block.ends[j]:
                struct.pack_into("<Q", block.buffer, start + _KEY_OFFSET, key)
                key += 1

    def _frame_alone(self, block: Block, first_key: int | None) -> None:
        j, data = block.alone  # type: ignore[misc]  # called for a block with one
        item = block.items[j]
        if first_key is None:
            key = item.index
        else:  # after every record placed before it
            key = first_key + sum(
                1 for i in range(j) if i not in block.refused and block.starts[i] != block.ends[i]
            )
        try:
            if self._check != "none":
                check_image(data, self._check, self._max_pixels)
        except ImageRefused as refusal:
            block.refused[j] = refusal.reason
            return
        framed = frame_image(item, data, key, self._pack_label)
        if isinstance(framed, ImageRefused):
            block.refused[j] = framed.reason
        else:
            block.framed[j] = framed

    # -- checks per block -------------------------------------------------------------------
    def _check_images(self, block: Block) -> None:
        """Refuse what `check_image` refuses; walk JPEG markers for the whole block at once."""
        # Records in the buffer: not refused while reading, not read on beyond it.
        jobs = [
            j
            for j, (start, end) in enumerate(zip(block.starts, block.ends))
            if start != end and j not in block.refused
        ]
        if not jobs:
            return
        starts = np.array([block.starts[j] for j in jobs], np.int64)
        u8 = np.frombuffer(block.buffer, np.uint8)
        lengths = u8.view("<u4")[starts // 4 + 1] & LENGTH_MASK
        heads = starts + _HEADER_BYTES  # where each image starts, after its labels
        if self._pack_label:
            heads += 4 * np.array([len(block.items[j].labels) for j in jobs], np.int64)
        ends = starts + 8 + lengths.astype(np.int64)
        passed = _walk_jpegs(u8, heads, ends, self._max_pixels)
        view = memoryview(block.buffer)
        for k in np.flatnonzero(~passed).tolist():
            j = jobs[k]
            try:
                check_image(bytes(view[heads[k] : ends[k]]), self._check, self._max_pixels)
            except ImageRefused as refusal:
                block.refused[j] = refusal.reason

    def _split_magic_words(self, block: Block, used: int) -> None:
        """Frame records again where an aligned word of their payload is the magic number."""
        is_magic = np.frombuffer(block.buffer, "<u4", used // 4) == MAGIC
        if np.count_nonzero(is_magic) == sum(map(int.__ne__, block.starts, block.ends)):
            return  # every hit is the start of a record in the buffer
        hits = np.flatnonzero(is_magic) * 4
        starts = np.array(block.starts, np.int64)
        owners = np.searchsorted(starts, hits, side="right") - 1
        at_start = starts[owners] == hits
        view = memoryview(block.buffer)
        for j in sorted(set(owners[~at_start].tolist())):
            if j in block.refused or j in block.framed or block.starts[j] == block.ends[j]:
                continue
            begin, end = block.payload(j)
            block.framed[j] = frame_record(bytes(view[begin:end]))


def _walk_jpegs(
    u8: np.ndarray, heads: np.ndarray, ends: np.ndarray, max_pixels: int = DEFAULT_MAX_PIXELS
) -> np.ndarray:
    """Return, per image `u8[heads[k]:ends[k]]`, whether it is a JPEG that passes the structure
    check without a doubt; False means: check it one by one.

    The same walk as `images._check_jpeg_structure`, over every image at once: segment by
    segment up to the start of scan, then the end-of-image marker as the file's last bytes;
    a frame header declaring more than `max_pixels` pixels sends the image to `check_image`.
    """
    count = len(heads)
    passed = np.zeros(count, bool)
    if not count:
        return passed
    size = len(u8)
    # Every 4 bytes of the buffer read as one big-endian word, at each byte position.
    words = np.ndarray((size - 3,), ">u4", u8, 0, (1,))
    idx = np.flatnonzero(
        (ends - heads >= 12) & (words[np.minimum(heads, size - 4)] >> 8 == 0xFFD8FF)
    )
    pos = heads[idx] + 2
    frame = np.zeros(len(idx), bool)
    for _ in range(_MAX_SEGMENTS):
        if not len(idx):
            break
        limit = ends[idx]
        at = np.minimum(pos, size - 10)
        head = words[at]  # FF, marker, length (2 bytes)
        marker = (head >> 16) & 0xFF
        length = head & 0xFFFF
        ok = (pos + 4 <= limit) & (at == pos)  # else too near the buffer's end: one by one
        ok &= (head >> 24 == 0xFF) & ~_ODD_MARKERS[marker] & (length >= 2)
        is_frame = _FRAME_MARKERS[marker]
        if is_frame.any():
            # precision, height (2), width (2), components: the word from height's low byte.
            tail = words[at + 6]
            sound = (pos + 10 <= limit) & ((tail >> 8) & 0xFFFF != 0) & (tail & 0xFF != 0)
            sides = words[at + 5]  # height (2), width (2)
            sound &= (sides >> 16).astype(np.int64) * (sides & 0xFFFF) <= min(max_pixels, 1 << 32)
            ok &= ~is_frame | sound
            frame |= is_frame & ok
        scan = marker == 0xDA
        ok &= ~scan | frame
        finished = scan & ok
        if finished.any():
            done = idx[finished]
            # The marker ends the file, after the whole scan header (as check_image wants).
            scan_end = (pos + 2 + length.astype(np.int64))[finished]
            passed[done] = (words[ends[done] - 4] & 0xFFFF == 0xFFD9) & (scan_end <= ends[done] - 2)
        going = ok & ~scan
        idx, pos, frame = idx[going], (pos + 2 + length.astype(np.int64))[going], frame[going]
    return passed


def frame_image(item: ListItem, image: bytes, key: int, pack_label: bool) -> bytes | ImageRefused:
    """Return the framed record of one image, or an `ImageRefused` when it is too large."""
    label = list(item.labels) if pack_label else item.labels[0]
    try:
        return frame_image_record(image, label, key, 0, item.path)
    except RecordTooLargeError:
        return ImageRefused(TOO_LARGE)


def _read_rest(fd: int, size: int) -> bytes:
    """Read on to the end of a file, at most `size` bytes (its size when opened: a file that
    grows is read as it was)."""
    parts: list[bytes] = []
    while size > 0 and (part := os.read(fd, min(size, 1 << 20))):
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


# O_NONBLOCK: opening a FIFO does not wait for a writer (and it is refused once open).
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
OUTSIDE_ROOT = "outside-root: the path leaves ROOT (--allow-outside-root packs it)"
_KINDS = (
    (stat.S_ISDIR, "is a directory, not an image file"),
    (stat.S_ISFIFO, "not a regular file (a FIFO)"),
    (stat.S_ISCHR, "not a regular file (a character device)"),
    (stat.S_ISBLK, "not a regular file (a block device)"),
    (stat.S_ISSOCK, "not a regular file (a socket)"),
)


def not_regular(mode: int) -> str:
    """Return the refusal reason of a file that is not a regular file, by its `st_mode`."""
    for test, reason in _KINDS:
        if test(mode):
            return reason
    return "not a regular file"


OUTSIDE_ROOT_LINK = (
    "outside-root: a symbolic link leads out of ROOT (--allow-outside-root packs it)"
)
_NOFOLLOW_FLAGS = OPEN_FLAGS | getattr(os, "O_NOFOLLOW", 0)


class OutsideRoot(Exception):
    """An image path under ROOT whose real path (links resolved) is outside ROOT."""


class RootGuard:
    """Open images under ROOT so that a symbolic link cannot lead out of it.

    The folder part of a path is resolved once per folder (a cached `realpath`); the file
    itself is opened with `O_NOFOLLOW`, and only a link there is resolved and checked. With
    `allow_outside_root`, paths are opened as they are.
    """

    def __init__(self, root: str, allow_outside_root: bool = False) -> None:
        self.allow = allow_outside_root
        self._real = os.path.realpath(root)
        self._below = os.path.join(self._real, "")
        self._folders: dict[str, bool] = {}

    def inside(self, real: str) -> bool:
        """Return whether a real path is ROOT or below it."""
        return real == self._real or real.startswith(self._below)

    def open(self, path: str) -> int:
        """Return a read-only fd for `path`; raise `OutsideRoot` where it leads out of ROOT."""
        if self.allow:
            return os.open(path, OPEN_FLAGS)
        folder = path[: path.rfind("/") + 1]
        ok = self._folders.get(folder)
        if ok is None:
            ok = self._folders[folder] = self.inside(os.path.realpath(folder or "."))
        if not ok:
            raise OutsideRoot(path)
        try:
            return os.open(path, _NOFOLLOW_FLAGS)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
        real = os.path.realpath(path)  # the file is a link: see where it leads
        if not self.inside(real):
            raise OutsideRoot(path)
        return os.open(real, _NOFOLLOW_FLAGS)


def resolve_path(prefix: str, path: str, allow_outside_root: bool) -> str | None:
    """Return the file to open for list path `path` under ROOT (`prefix` ends with a
    separator), or None when the path leaves ROOT and that is not allowed."""
    if not leaves_root(path):
        return prefix + path
    if not allow_outside_root:
        return None
    return os.path.join(prefix, path)  # an absolute path is taken as it is


def leaves_root(path: str) -> bool:
    """Return True when a list path is absolute or climbs out of ROOT with `..`."""
    if path.startswith("/") or os.path.isabs(path):
        return True
    depth = 0
    for part in path.replace(os.sep, "/").split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _read_error(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "file not found"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, not an image file"
    return f"cannot read ({exc.strerror or exc})"


def refused_images(
    u8: np.ndarray,
    heads: ArrayLike,
    ends: ArrayLike,
    check: Callable[[bytes, str, int], object] = check_image,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> dict[int, ImageRefused]:
    """Return {k: `ImageRefused`} for each image `u8[heads[k]:ends[k]]` that `check(data,
    "structure", max_pixels)` refuses (default `check_image`, as pack checks what it packs).

    The JPEG walk runs over every image at once (`_walk_jpegs`); only images it does not pass
    cleanly (an empty one, a PNG, another format, a damaged JPEG) are checked one by one. For
    verify and repack, which check the images already framed in a mapped .rec.
    """
    starts = np.asarray(heads, np.int64)
    stops = np.asarray(ends, np.int64)
    out: dict[int, ImageRefused] = {}
    if not len(starts):
        return out
    if len(u8) >= 16:
        passed = _walk_jpegs(u8, starts, stops, max_pixels)
    else:
        passed = np.zeros(len(starts), bool)
    for k in np.flatnonzero(~passed).tolist():
        try:
            check(u8[starts[k] : stops[k]].tobytes(), "structure", max_pixels)
        except ImageRefused as refusal:
            out[k] = refusal
    return out
