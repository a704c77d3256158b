"""One shard being written (`ShardFile`) and what the manifest says of it (`ShardInfo`).

`ShardFile` is the one place that appends framed records and their `.idx` lines to a file
(through `ordered.OrderedWriter`): a pack's shards, and (`ShardFile.plain`) the files of the
public `packer.writers.RecordWriter` and `IndexedRecordWriter`; `shards.ShardWriter` decides
where shards end.
"""

from __future__ import annotations

import array
import bisect
import itertools
import operator
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..doors.output import create_new, fsync_fd, open_existing, rename
from ..errors import RectoolError
from ..format.checksums import RecordChecksums, checksum_path
from ..format.digest import XXH3_128, Digests, field_name
from ..format.paths import PackPaths
from ..format.writer import format_index_line, format_index_lines
from .ordered import WRITE_BYTES, OrderedWriter

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from _typeshed import ReadableBuffer

    from .ordered import Buffer

# Records are buffered and written in batches; kill -9 can then only cut between two writes.
FLUSH_BYTES = 4 << 20
# A shard's written bytes are hashed this many at a time (whole records; see `_ShardDigest`):
# about what a core's cache holds. On the 100k benchmark pack, the digest and the records'
# checksums took 0.09 s of CPU as two passes over each buffer, 0.065 s a piece at a time.
DIGEST_PIECE_BYTES = 1 << 20


@dataclass
class ShardInfo:
    """What the manifest says about one finished shard.

    `digests` holds each file's digests: {"rec": {"xxh3-128": hex, ...}, "idx": ..., "crc":
    ...}; the manifest gives them as `rec_xxh3_128`, `rec_sha256`, ... (see `to_json`).
    """

    rec: str
    idx: str
    records: int
    rec_bytes: int
    idx_bytes: int
    first_key: int | None
    last_key: int | None
    # The per-record checksum file (see rectool.format.checksums), when written.
    crc: str | None = None
    digests: dict[str, dict[str, str]] | None = None
    # Each record's offset, in file order, where the writer was asked to keep them
    # (`ShardFile(keep_offsets=True)`): the binary index is then handed them rather than
    # reading the .idx back. Not in the manifest.
    offsets: np.ndarray | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        digests = self.digests or {}

        def fields(file: str) -> dict[str, str]:
            return {field_name(file, a): h for a, h in (digests.get(file) or {}).items()}

        entry: dict[str, Any] = {
            "rec": self.rec,
            "idx": self.idx,
            "records": self.records,
            "rec_bytes": self.rec_bytes,
            "idx_bytes": self.idx_bytes,
            **fields("rec"),
            **fields("idx"),
            "first_key": self.first_key,
            "last_key": self.last_key,
        }
        if self.crc is not None:
            entry["crc"] = self.crc
            entry.update(fields("crc"))
        return entry


if TYPE_CHECKING:
    # `on_shard_finished(info, paths)`: a shard got its final names (`paths`: its .rec, .idx and
    # checksum file).
    ShardFinished = Callable[[ShardInfo, list[str]], object]


class _ShardDigest:
    """What the hashing thread feeds a shard's written buffers to, in order: the .rec's
    digests, and the checksum of each record (`starts`: per buffer, where its records start)."""

    def __init__(
        self, digests: Digests, checksums: RecordChecksums, starts: Iterable[Sequence[int]]
    ) -> None:
        self.digests, self.checksums, self.starts = digests, checksums, iter(starts)

    def update(self, data: ReadableBuffer, /) -> None:
        starts = next(self.starts)
        with memoryview(data) as view:
            # A piece of whole records at a time: the records' checksums read bytes the
            # digests have just brought into the cache (one pass over memory, not two).
            count = len(starts)
            if not count or starts[0]:  # bytes before the first record (none so far)
                self.digests.update(view[: starts[0] if count else len(view)])
                if not count:
                    self.checksums.add(view, starts)
            i = 0
            while i < count:
                j = bisect.bisect_right(starts, starts[i] + DIGEST_PIECE_BYTES, i + 1)
                start, end = starts[i], starts[j] if j < count else len(view)
                piece = view[start:end]
                self.digests.update(piece)
                relative = list(map(operator.sub, starts[i:j], itertools.repeat(start)))
                self.checksums.add(piece, relative)
                i = j


class ShardFile:
    """One shard being written: its `.rec.partial` and `.idx.partial`, the checksum sidecar,
    and its finishing (fsync, then the final names); it knows nothing of rollover.

    Records are buffered and written in batches through the shared `OrderedWriter`, .rec bytes
    before their .idx lines, so whatever a kill -9 leaves behind is a prefix of complete
    records (see `ShardWriter.resume`). `resumed` continues the `.partial` files an
    interrupted run left, with the state `ShardWriter.resume` read from them.

    `ShardFile.plain` is the same writing without the shard: files at the names given (an
    `.idx` only if named), no digests or checksum file, ended by `sync` and
    `close` rather than `finish`. The public writers of `format/writer.py` are built on it.
    """

    def __init__(
        self,
        number: int,
        rec_path: str,
        idx_path: str | None,
        io: OrderedWriter,
        resumed: Mapping[str, Any] | None = None,
        digests: Iterable[str] = (XXH3_128,),
        plain: bool = False,
        append: bool = False,
        keep_offsets: bool = False,
    ) -> None:
        self.number, self.rec_path = number, rec_path
        self.keep_offsets = keep_offsets and not plain
        # None only for a plain file without an .idx; `finish` (a shard's) reads it.
        self.idx_path: str = idx_path  # type: ignore[assignment]
        self._io = io
        self._plain = plain
        self.algorithms = () if plain else tuple(digests)
        append = append or bool(resumed)
        rec_p = rec_path if plain else PackPaths.partial(rec_path)
        self._rec_fd = open_for_writing(rec_p, append)
        io.names[self._rec_fd] = rec_p
        self._idx_fd: int | None = None
        if idx_path is not None:
            idx_p = idx_path if plain else PackPaths.partial(idx_path)
            self._idx_fd = open_for_writing(idx_p, append)
            io.names[self._idx_fd] = idx_p
        if plain:  # appending continues from the end of each file
            resumed = {
                "rec_bytes": os.fstat(self._rec_fd).st_size,
                "idx_bytes": 0 if self._idx_fd is None else os.fstat(self._idx_fd).st_size,
            }
        resumed = resumed or {}
        self.records = resumed.get("records", 0)
        self.rec_bytes = resumed.get("rec_bytes", 0)
        self.idx_bytes = resumed.get("idx_bytes", 0)
        self.first_key = resumed.get("first_key")
        self.last_key = resumed.get("last_key")
        self._offsets: array.array[int]
        self._rec_hash: Digests
        self._idx_hash: Digests
        self._checksums: RecordChecksums
        # A plain file has none of them (`_append` tells by `_offsets`); a shard sets them below.
        self._offsets = self._rec_hash = self._idx_hash = self._checksums = None  # type: ignore[assignment]
        if not plain:
            # 8 bytes a record, for the shard's checksums; nothing else grows with the data.
            self._offsets = resumed.get("offsets", array.array("q"))
            self._rec_hash = resumed.get("rec_hash") or Digests(self.algorithms)
            self._idx_hash = resumed.get("idx_hash") or Digests(self.algorithms)
            checksums = resumed.get("checksums")
            if checksums is None:
                checksums = RecordChecksums(self._offsets)
            self._checksums = checksums
        self._rec_buf: list[Buffer] = []
        # Per buffer, where its records start (their checksums).
        self._rec_starts: list[Sequence[int]] = []
        self._idx_buf: list[bytes] = []
        self.buffered = 0  # bytes of records not yet handed to the writer thread

    @classmethod
    def plain(cls, rec_path: str, idx_path: str | None = None, append: bool = False) -> ShardFile:
        """Return a plain `ShardFile`: a `.rec` (and an `.idx`) at the names given, new or
        (`append`) continued, written in the caller's thread."""
        io = OrderedWriter(background=False)
        # A plain file has no shard number.
        return cls(None, rec_path, idx_path, io, plain=True, append=append)  # type: ignore[arg-type]

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._rec_fd is None

    def add(self, key: int | None, framed: Buffer) -> int:
        """Append one framed record under `key` (None: a plain file without an .idx); return
        its offset in the .rec."""
        offset = self.rec_bytes
        if self._idx_fd is None:
            lines = b""
        else:  # a file with an .idx is given a key with every record (IndexedRecordWriter)
            lines = format_index_line(key, offset).encode("ascii")  # type: ignore[arg-type]
        self._append(framed, lines, [key], [offset], [0])
        self.first_key = key if self.first_key is None else self.first_key
        self.last_key = key
        return offset

    def add_run(
        self, data: Buffer, keys: Sequence[int] | np.ndarray, starts: Sequence[int]
    ) -> None:
        """Append records framed back to back in `data` (record i from `starts[i]`, a list)
        under `keys` (integers): the same bytes as `add` for each in turn."""
        if len(starts) >= 512:  # numpy's fixed costs are worth it (see format_index_lines)
            keys = np.asarray(keys, np.int64)
            offsets = self.rec_bytes + np.asarray(starts, np.int64)
        else:
            keys = keys.tolist() if isinstance(keys, np.ndarray) else keys
            offsets = [self.rec_bytes + start for start in starts]
        lines = b"" if self._idx_fd is None else format_index_lines(keys, offsets)
        self._append(data, lines, keys, offsets, starts)
        self.first_key = int(keys[0]) if self.first_key is None else self.first_key
        self.last_key = int(keys[-1])

    def _append(
        self,
        data: Buffer,
        lines: bytes,
        keys: Sequence[int | None] | np.ndarray,
        offsets: Sequence[int] | np.ndarray,
        starts: Sequence[int],
    ) -> None:
        self._rec_buf.append(data)
        self._rec_starts.append(starts)
        self._idx_buf.append(lines)
        self.buffered += len(data)
        self.records += len(keys)
        self.rec_bytes += len(data)
        self.idx_bytes += len(lines)
        if self._offsets is None:  # plain: no checksums
            pass
        elif isinstance(offsets, np.ndarray):
            self._offsets.frombytes(offsets.tobytes())
        else:
            self._offsets.extend(offsets)
        if self.buffered >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> int:
        """Write buffered records: all their .rec bytes first, then their .idx lines.

        Return a number to give `OrderedWriter.wait`: the buffers added so far are then
        written.
        """
        if not self._rec_buf:
            return self._io.submitted
        parts, starts = self._rec_buf, self._rec_starts
        if len(parts) > 1 and self.buffered < len(parts) * WRITE_BYTES // 4:
            if not self._plain:
                bases = itertools.accumulate(map(len, parts[:-1]), initial=0)
                starts = [
                    np.concatenate(
                        [np.asarray(b, np.int64) + base for b, base in zip(starts, bases)]
                    ).tolist()
                ]
            parts = [b"".join(parts)]  # many small records: one write, not one each
        digest = None if self._plain else _ShardDigest(self._rec_hash, self._checksums, starts)
        self._io.submit(self._rec_fd, parts, digest)
        if self._idx_fd is not None:
            self._io.submit(self._idx_fd, b"".join(self._idx_buf), self._idx_hash)
        self._rec_buf, self._rec_starts = [], []  # the writer thread owns what it was given
        self._idx_buf.clear()
        self.buffered = 0
        return self._io.submitted

    def sync(self, fsync: bool = True) -> None:
        """Write everything buffered and wait until it is written; with `fsync`, until it is
        on the disk (the .rec first, then the .idx)."""
        self.flush()
        self._io.drain()
        if fsync:
            for fd in (self._rec_fd, self._idx_fd):
                if fd is not None:
                    fsync_fd(fd, self._io.names.get(fd, self.rec_path))

    def finish(self) -> ShardInfo:
        """Flush, fsync and give the shard its final names; return
        its `ShardInfo`."""
        assert not self._plain, "a plain file is ended by sync and close"
        self.sync()
        self.close()  # before anything else can fail: an abort then has nothing to close
        # Before the renames: a shard with its final names always has its checksum file.
        crc_path = checksum_path(self.rec_path)
        crc_digests = self._checksums.write(crc_path, self.rec_bytes, self.algorithms)
        rename(PackPaths.partial(self.idx_path), self.idx_path, "shard")
        rename(PackPaths.partial(self.rec_path), self.rec_path, "shard")
        return ShardInfo(
            os.path.basename(self.rec_path),
            os.path.basename(self.idx_path),
            self.records,
            self.rec_bytes,
            self.idx_bytes,
            self.first_key,
            self.last_key,
            os.path.basename(crc_path),
            {
                "rec": self._rec_hash.hexdigests(),
                "idx": self._idx_hash.hexdigests(),
                "crc": crc_digests,
            },
            # The writer's own array, not a copy (8 bytes a record, as the index's column).
            np.frombuffer(self._offsets, np.int64) if self.keep_offsets else None,
        )

    def abort(self) -> None:
        """Queue what is buffered, then (once the writer thread is stopped) `close`."""
        self.flush()

    def close(self) -> None:
        """Close the `.partial` files as they are, to be resumed (once: later calls do
        nothing)."""
        for fd in (self._rec_fd, self._idx_fd):
            if fd is not None:
                self._io.forget(fd)
                os.close(fd)
        self._rec_fd = self._idx_fd = None  # type: ignore[assignment]  # closed (see `closed`)


def open_for_writing(path: str, append: bool) -> int:
    """Open a `.partial` file: a new one (whatever is at the name is replaced, never followed),
    or, to resume, the one there (never through a symlink)."""
    try:
        return open_existing(path) if append else create_new(path)
    except OSError as exc:
        raise RectoolError(f"{path}: cannot create ({exc.strerror or exc})") from None
