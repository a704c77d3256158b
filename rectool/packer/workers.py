"""What a worker thread does to one image: read it, check or re-encode it, and frame it
(`ImageWorker`), and a chunk's results in the shape of a pass-through `Block` (`ChunkResults`).
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from ..reader import MAX_RECORD_BYTES
from .images import ImageRefused, check_image, reencode_image
from .layout import layout_named
from .passthrough import (
    OUTSIDE_ROOT,
    OUTSIDE_ROOT_LINK,
    TOO_LARGE,
    OutsideRoot,
    RootGuard,
    frame_image,
    not_regular,
    resolve_path,
)

if TYPE_CHECKING:
    from .listfile import ListItem
    from .options import PackOptions
    from .ordered import Buffer
    from .passthrough import MemberSource

    # What a worker makes of one image: its bytes (or framed record), or why it was refused.
    Prepared = bytes | ImageRefused
    # What `runs()` yields: (items, their framed records back to back, where each starts, the
    # first one's place in the chunk), or a refusal (item, reason).
    Run = tuple[Sequence[ListItem], Buffer, list[int], int] | tuple[ListItem, str]


class ImageWorker:
    """Reads, checks or re-encodes, and frames images, in worker threads.

    OpenCV and file reads release the GIL; measured here, processes cost more CPU in pickling
    and pipes than they save (see docs/benchmarks.md).
    """

    def __init__(self, root: str, options: PackOptions, source: MemberSource = None) -> None:
        self.root, self.options = root, options
        self._source = source  # an archive ROOT's members (rectool/archives/), else None
        self._prefix = os.path.join(root, "")
        self._guard = RootGuard(root, options.allow_outside_root)
        # A layout that numbers images as written frames them where they are written.
        self.frame = not layout_named(options.layout).numbered

    def prepare_chunk(self, chunk: Sequence[ListItem]) -> list[Prepared]:
        """Return, per item, its framed record (or image bytes) or an `ImageRefused`."""
        results: list[Prepared] = []
        for item in chunk:
            data = self.prepare(item)
            if self.frame and not isinstance(data, ImageRefused):
                data = frame_image(item, data, item.index, self.options.pack_label)
            results.append(data)
        return results

    def prepare(self, item: ListItem) -> Prepared:
        """Read and check or re-encode one image; return its bytes or an `ImageRefused`."""
        if self._source is not None:
            member = self._source.read(item.path)
            if isinstance(member, str):
                return ImageRefused(member)
            return self._check(member)
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
        return self._check(data)

    def _check(self, data: bytes) -> Prepared:
        """Check or re-encode an image's bytes; return them or an `ImageRefused`."""
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


def _read_file(path: str, open_: Callable[[str], int]) -> bytes:
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


class ChunkResults:
    """A chunk's worker results in the shape of a pass-through `Block`: `runs()` gives the
    framed records as runs, refusals between them, in list order.

    Given `first_key`, the results are images, framed here and numbered from it in order (a
    layout that numbers images as written: only the writer's thread knows the next key), with
    every label of their list line when `pack_label`.
    """

    reuses_buffer = False  # its records are its own bytes

    def __init__(
        self,
        items: Sequence[ListItem],
        results: list[Prepared],
        first_key: int | None = None,
        pack_label: bool = False,
    ) -> None:
        self.items = items
        self._images = results if first_key is not None else None
        if first_key is not None:
            framed: list[Prepared] = []
            key = first_key
            for item, image in zip(items, results):
                if not isinstance(image, ImageRefused):
                    image = frame_image(item, image, key, pack_label)
                    key += not isinstance(image, ImageRefused)
                framed.append(image)
            results = framed
        self._results = results

    def image(self, j: int) -> Prepared:
        """Return the image bytes of record j (numbered results only)."""
        return self._images[j]  # type: ignore[index]  # numbered results: set

    def runs(self) -> Iterator[Run]:
        """Yield `(items, data, starts, j)` runs of records and `(item, reason)` refusals."""
        items, results = self.items, self._results
        first = 0
        for j in range(len(items) + 1):
            refused = j < len(items) and isinstance(results[j], ImageRefused)
            if j == len(items) or refused:
                # The ignores: results[first:j] are all bytes, results[j] is refused.
                if first < j:
                    parts = results[first:j]
                    starts = list(itertools.accumulate(map(len, parts[:-1]), initial=0))  # type: ignore[arg-type]
                    yield items[first:j], b"".join(parts), starts, first  # type: ignore[arg-type]
                if refused:
                    yield items[j], results[j].reason  # type: ignore[union-attr]
                first = j + 1
