"""The text index of MXNet RecordIO (`.idx`: `key TAB offset` lines), parsed into numpy arrays.

MXNet, DALI and insightface read the `.idx`; rectool writes it byte for byte as they expect
(`format/writer.py`) and reads it only where a pack has no binary index yet: a foreign or older
pack opened by the package, `rectool index`, `reindex` and `verify`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ..reader import (
    RecordFormatError,
    open_regular,
)

if TYPE_CHECKING:
    from _typeshed import StrPath
    from numpy.typing import NDArray

    Ints = NDArray[np.int64]

INDEX_BLOCK_BYTES = 1 << 20  # the .idx text is parsed a block at a time (its temporaries)
# A line is `key TAB offset` (41 bytes at most, MXNet's spaces and extra fields aside): a
# "line" longer than this is no .idx, and is refused before it is gathered into memory.
MAX_LINE_BYTES = 1 << 16


class IndexFormatError(RecordFormatError, ValueError, IndexError):
    """An .idx file cannot be parsed: names the file and line (a `ValueError` and an
    `IndexError`, as MXNet raises one or the other for such a line)."""

    def __init__(self, message: str, path: StrPath | None = None, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message, path)


def parse_index(
    data: bytes, path: StrPath | None = None, chunk: int = 1 << 20, first_line: int = 1
) -> tuple[Ints, Ints]:
    """Parse .idx text (`key TAB offset` lines) into int64 arrays (keys, offsets), in file order.

    Repeated keys stay (lookups take the last line, as MXNet does). Runs of equally wide
    lines, as packs write them, are parsed as 2-D byte arrays, the rest by numpy's text parser;
    a line-by-line pass raises `IndexFormatError` naming the first bad line (`data` starting at
    line `first_line` of the file).
    """
    data += b"\n" if data and not data.endswith(b"\n") else b""
    a, pos, keys, offsets, runs = np.frombuffer(data, np.uint8), 0, [], [], 0
    while pos < len(data) and runs < 256:
        runs += 1
        nl = data.find(b"\n", pos, pos + 40)
        k, width = data.find(b"\t", pos, nl) - pos, nl + 1 - pos
        if not (1 <= k <= 18 and 3 <= width - k <= 20):  # <= 18 digits: no int64 overflow
            break
        grid = a[pos : pos + (len(data) - pos) // width * width].reshape(-1, width)
        low, high = 1, len(grid)  # bisect for a row that does not look like a line
        while low < high:
            mid = (low + high) // 2
            low, high = (mid + 1, high) if grid[mid, k] == 9 and grid[mid, -1] == 10 else (low, mid)
        powers = 10 ** np.arange(width - 3, -1, -1, dtype=np.int64)
        for start in range(0, low, chunk):  # then check every byte of the run
            b = grid[start : min(low, start + chunk)] - 48  # digits 0..9; TAB 217, NL 218
            ok = (b[:, k] == 217) & (b[:, -1] == 218)
            if not ok.all() or np.count_nonzero(b >= 10) != 2 * len(b):
                b = b[: int(np.argmin(ok & ((b < 10).sum(1) == width - 2)))]
            keys.append(np.einsum("ij,j->i", b[:, :k], powers[-k:]))
            offsets.append(np.einsum("ij,j->i", b[:, k + 1 : -1], powers[k - width + 2 :]))
            pos += len(b) * width
            if len(b) < chunk:
                break
        if not len(keys[-1]):
            break
    tail, tail_keys, tail_offsets = data[pos:] if pos else data, [], []
    lines = tail.count(b"\n")
    # The rest (widths varying at random, as in a shuffled im2rec .idx): numpy's whitespace-blind
    # parser pairs each key with its offset once deleting the digits leaves only "\t\n" lines.
    if tail.translate(None, b"0123456789") == b"\t\n" * lines:
        values = np.fromstring(tail, np.int64, sep=" ") if tail else np.empty(0, np.int64)
        if len(values) == 2 * lines and not (values == 2**63 - 1).any():
            tail = b""
            keys.append(values[0::2])
            offsets.append(values[1::2])
    for line, raw in enumerate(tail.split(b"\n")[:-1], sum(map(len, keys)) + first_line):
        fields = raw.strip().split(b"\t")
        try:
            key, offset = int(fields[0]), int(fields[1])
        except (ValueError, IndexError):
            why = (
                "expected 'key<TAB>offset'"
                if len(fields) < 2
                else "key and offset must be integers"
            )
            raise IndexFormatError(f"{why}, got {raw[:80]!r}", path, line) from None
        if not (0 <= offset < 2**63 and -(2**63) <= key < 2**63):
            raise IndexFormatError(f"number out of range in {raw[:80]!r}", path, line)
        tail_keys.append(key)
        tail_offsets.append(offset)
    keys.append(np.array(tail_keys, np.int64))
    offsets.append(np.array(tail_offsets, np.int64))
    return np.concatenate(keys), np.concatenate(offsets)


def parse_index_stream(
    f: Any, path: StrPath | None = None, block: int | None = None
) -> tuple[Ints, Ints]:
    """Parse the .idx text of the open file `f` a `block` of bytes at a time
    (`INDEX_BLOCK_BYTES`), as `parse_index`.

    The temporaries are a block's: the arrays are allocated for the lines the file holds
    (counted a block at a time first, when it can be read again from where it is; else for
    the most its size allows, untouched pages costing nothing) and shrunk in place at the end.
    """
    block = block or INDEX_BLOCK_BYTES
    cap = os.fstat(f.fileno()).st_size // 4 + 1  # "0\t0\n": no line is shorter
    if f.seekable():
        at, lines, last = f.tell(), 0, b"\n"
        while block_bytes := f.read(block):
            lines += block_bytes.count(b"\n")
            last = block_bytes[-1:]
        f.seek(at)
        cap = min(cap, lines + (last != b"\n"))
    keys, offsets, n, pending = np.empty(cap, np.int64), np.empty(cap, np.int64), 0, b""
    while True:
        more = f.read(block)
        data = pending + more if pending else more
        cut = data.rfind(b"\n") + 1 if more else len(data)
        if not cut and more:
            if len(data) > MAX_LINE_BYTES:  # not an .idx: read no more of it
                raise IndexFormatError(
                    f"no line end in {len(data):,} bytes; not an .idx ('key<TAB>offset' lines)",
                    path, n + 1,
                )  # fmt: skip
            pending = data  # a line across two blocks: read on
            continue
        data, pending = (data[:cut], data[cut:]) if cut < len(data) else (data, b"")
        k, o = parse_index(data, path, first_line=n + 1)
        k, o = k[: cap - n], o[: cap - n]  # a file grown since opened: its size then counts
        keys[n : n + len(k)], offsets[n : n + len(k)] = k, o
        n += len(k)
        if not more:
            break
    keys.resize(n, refcheck=False), offsets.resize(n, refcheck=False)
    return keys, offsets


def load_index(idx_path: StrPath) -> tuple[Ints, Ints]:
    """Read an .idx into int64 arrays (keys, offsets), in file order."""
    idx_path = os.fspath(idx_path)
    fd, _ = open_regular(idx_path, "index file")
    with os.fdopen(fd, "rb") as f:
        return parse_index_stream(f, idx_path)
