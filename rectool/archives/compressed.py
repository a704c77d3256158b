"""A compressed tar read once, in order: gzip decompressed a window at a time, with bounds.

`GzipBlocks` gives `tar.walk_tar` the decompressed bytes of a `.tar.gz`/`.tgz` (concatenated
gzip members, as pigz writes, included) and moves forward only: skipping data is decompressing
it. A gzip bomb is refused as it shows: once more than `BOMB_FLOOR` bytes came out, output over
`MAX_RATIO` times the compressed input read so far stops the read naming the member reached.
Memory is a window of compressed input and what one `read` asks for.
"""

from __future__ import annotations

import os
import zlib
from typing import BinaryIO

from .members import ArchiveError

# A tar of images compresses little (its headers and padding do); a bomb, thousands of times.
MAX_RATIO = 100
BOMB_FLOOR = 64 << 20
_WINDOW = 1 << 20
_GZIP = 16 + zlib.MAX_WBITS


class GzipBlocks:
    """The decompressed bytes of a gzip file, forward only (`read`, `seek` ahead, `pos`)."""

    def __init__(self, file: BinaryIO, name: str, window: int = _WINDOW) -> None:
        self.file, self.name, self.pos = file, name, 0
        self._window = window
        self._inflate = zlib.decompressobj(_GZIP)
        self._pending = b""  # compressed input not yet given to the decompressor
        self._out = bytearray()  # decompressed, not yet read
        self._read_in = 0  # compressed bytes read from the file
        self._made = 0  # decompressed bytes made
        self._eof = False
        self._fresh = True  # a decompressor that has read nothing yet
        self.where = "its start"  # what the walk reached, for errors

    def _fill(self, wanted: int) -> None:
        """Decompress until `wanted` bytes are ready or the input ends."""
        out = self._out
        while len(out) < wanted and not self._eof:
            if not self._pending:
                self._pending = self.file.read(self._window)
                self._read_in += len(self._pending)
            if not self._pending:
                if not self._fresh:
                    out += self._inflate.flush()  # what zlib still holds
                    if not self._inflate.eof:
                        raise ArchiveError(
                            f"{self.name}: truncated: the gzip stream ends early (near "
                            f"{self.where})"
                        )
                self._eof = True
                break
            if self._fresh and not self._pending.strip(b"\0"):
                self._pending = b""  # zeros after the last gzip member (a tape's blocking)
                continue
            try:
                made = self._inflate.decompress(self._pending, max(wanted - len(out), _WINDOW))
            except zlib.error as exc:
                raise ArchiveError(
                    f"{self.name}: damaged gzip data near {self.where} ({exc})"
                ) from None
            self._fresh = False
            if self._inflate.eof:  # another gzip member may follow (pigz, cat a.gz b.gz)
                self._pending = self._inflate.unused_data
                self._inflate = zlib.decompressobj(_GZIP)
                self._fresh = True
            else:
                self._pending = self._inflate.unconsumed_tail
            out += made
            self._made += len(made)
            if self._made > BOMB_FLOOR and self._made > MAX_RATIO * self._read_in:
                raise ArchiveError(
                    f"{self.name}: {self._made:,} bytes out of {self._read_in:,} compressed "
                    f"(over {MAX_RATIO} times) near {self.where}: a gzip bomb; refused"
                )

    def read(self, n: int) -> bytes:
        """Return the next `n` decompressed bytes (fewer only at the end)."""
        self._fill(n)
        data = bytes(self._out[:n])
        del self._out[:n]
        self.pos += len(data)
        return data

    def read_into(self, view: memoryview) -> int:
        """Fill `view` with the next bytes; return how many (fewer only at the end)."""
        n = len(view)
        self._fill(n)
        got = min(n, len(self._out))
        view[:got] = self._out[:got]
        del self._out[:got]
        self.pos += got
        return got

    def seek(self, pos: int) -> None:
        """Move forward to `pos`, decompressing what lies between."""
        while self.pos < pos:
            step = min(pos - self.pos, self._window)
            self._fill(step)
            if not self._out:
                return  # the end: the walk finds it truncated
            got = min(step, len(self._out))
            del self._out[:got]
            self.pos += got


def open_blocks(file: BinaryIO, name: str) -> GzipBlocks:
    """Return the decompressed stream of a gzip `file`, checking its magic first."""
    head = os.pread(file.fileno(), 2, 0)
    if head != b"\x1f\x8b":
        raise ArchiveError(f"{name}: not a gzip file (it does not start as one)")
    return GzipBlocks(file, name)
