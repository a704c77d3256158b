"""Shards: the plan, rollover, atomic finishing, and resuming what a killed run left.

A shard is an independent `.rec` + `.idx` pair. One shard is `PREFIX.rec`/`PREFIX.idx`; with a
size or count limit shards are `PREFIX-00000.rec`, `PREFIX-00001.rec`, ... (the names are
`manifest.py`'s). While a shard is being written its files carry a `.partial` suffix; they get
their final names only once complete.

One shard's files are written by `shardfile.ShardFile` (re-exported here with `ShardInfo`)
through the background `ordered.OrderedWriter`; this module decides where shards end.
"""

from __future__ import annotations

import array
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..doors.inputs import read_regular
from ..doors.output import rename, truncate
from ..errors import RectoolError, UsageError
from ..format.checksums import RecordChecksums, checksum_path
from ..format.digest import SHA256, XXH3_128, Digests, file_digests
from ..format.paths import PackPaths
from ..format.textindex import (
    load_index,
    parse_index,
)
from ..reader import RecordFile
from .ordered import WRITE_BYTES as WRITE_BYTES
from .ordered import WRITEBACK_BYTES as WRITEBACK_BYTES
from .ordered import OrderedWriter
from .shardfile import FLUSH_BYTES as FLUSH_BYTES
from .shardfile import ShardFile as ShardFile
from .shardfile import ShardInfo as ShardInfo
from .shardfile import open_for_writing

if TYPE_CHECKING:
    from _typeshed import StrPath

    from .ordered import Buffer
    from .shardfile import ShardFinished


def plan_shards(
    total: int, shard_bytes: int | None = None, shard_records: int | None = None
) -> list[range]:
    """Return the list positions of each shard, as ranges: a pure function of the list length.

    Only a record count makes a plan: shard k holds list lines k*N .. k*N+N-1 (less the refused
    ones). With a byte limit, shards end where the written bytes say, known only while packing.
    """
    if shard_bytes:
        raise UsageError(
            "shards cut by --shard-size depend on the packed bytes and cannot be planned; "
            "use --shard-records N to pack shards separately"
        )
    if not shard_records:
        return [range(total)]
    return [range(k, min(k + shard_records, total)) for k in range(0, max(total, 1), shard_records)]


def parse_size(text: str | int) -> int:
    """Parse a byte size such as `512MB`, `2GiB`, `1.5G` or `1000000` into an int."""
    units = {
        "": 1, "B": 1,
        "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3,
        "T": 1000**4, "TB": 1000**4,
        "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4,
    }  # fmt: skip
    s = str(text).strip().upper().replace("_", "")
    number = s.rstrip("KMGTIB")
    unit = s[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise ValueError(f"{text!r} is not a size (examples: 512MB, 2GiB, 1000000)")
    return int(value * units[unit])


def shard_digests(sha256: bool = False) -> tuple[str, ...]:
    """Return the whole-file digests a pack's manifest gives: xxh3-128, and SHA-256 with
    `--sha256`."""
    return (XXH3_128, SHA256) if sha256 else (XXH3_128,)


class ShardWriter:
    """Write framed records into shards that roll over by bytes and/or record count.

    Each shard is written by a `ShardFile`; this class decides when one ends and the next
    begins, and adopts what an interrupted run left (`resume`). `on_shard_finished(info,
    paths)` is called as each shard gets its final names (`paths`: its .rec, .idx and
    checksum file), while the next ones are still to be written: an upload starts there.
    """

    def __init__(
        self,
        prefix: StrPath | PackPaths,
        shard_bytes: int | None = None,
        shard_records: int | None = None,
        first_shard: int = 0,
        last_shard: int | None = None,
        sha256: bool = False,
        on_shard_finished: ShardFinished | None = None,
        keep_offsets: bool = False,
    ) -> None:
        self.pack = PackPaths.of(prefix)
        # Each finished shard's `ShardInfo.offsets` kept (repack hands them to the index).
        self.keep_offsets = keep_offsets
        # The manifest's digests of each file: xxh3-128, and SHA-256 too with `sha256`.
        self.digests = shard_digests(sha256)
        self.shard_bytes = shard_bytes
        self.shard_records = shard_records
        self.numbered = bool(shard_bytes or shard_records)
        # With a record count alone, shard k holds list positions k*N..k*N+N-1 (see plan_shards).
        self.planned = bool(shard_records) and not shard_bytes
        self.first_shard, self.last_shard = first_shard, last_shard
        self.finished: list[ShardInfo] = []
        self._shard: ShardFile | None = None
        self._io = OrderedWriter()
        self.on_shard_finished = on_shard_finished

    # -- state ------------------------------------------------------------------------------
    @property
    def records_written(self) -> int:
        """Return the records in finished shards plus the open one."""
        return sum(s.records for s in self.finished) + (self._shard.records if self._shard else 0)

    def paths(self, number: int) -> tuple[str, str]:
        """Return the final (rec, idx) paths of shard `number`."""
        return self.pack.shard_names(number, self.numbered)

    # -- writing ----------------------------------------------------------------------------
    def _number(self) -> int:
        """Return the number of the open shard, or of the next one to open."""
        return self.first_shard + len(self.finished)

    def add(self, key: int, framed: Buffer, position: int = 0) -> int:
        """Append one framed record under `key` (list position `position`), rolling over first
        when the shard limits say so; return its offset in its shard's .rec."""
        if self.planned:  # (so `shard_records` is set: the ignores here and in add_run)
            self.open_through(position // self.shard_records)  # type: ignore[operator]
        elif self._shard and self._shard.records and self._full(self._shard, len(framed)):
            self.finish_shard()
        return (self._shard or self._start(self._number())).add(key, framed)

    def add_run(
        self,
        data: Buffer,
        keys: Sequence[int] | np.ndarray,
        starts: Sequence[int],
        positions: Sequence[int],
    ) -> None:
        """Append records framed back to back in `data` (record i from `starts[i]`), under
        `keys`, at list positions `positions`: the same bytes as `add` for each in turn.

        `data` may be a view of a buffer the caller reuses only once `wait_written` says so.
        """
        count = len(keys)
        if not count:
            return
        shard = self._shard
        if self.planned:
            number = positions[0] // self.shard_records  # type: ignore[operator]
            fits = positions[-1] // self.shard_records == number  # type: ignore[operator]
            if fits:
                self.open_through(number)
                shard = self._shard
        else:
            records, size = (shard.records, shard.rec_bytes) if shard else (0, 0)
            fits = (not self.shard_records or records + count <= self.shard_records) and (
                not self.shard_bytes or size + len(data) <= self.shard_bytes
            )
        if not fits:  # a shard ends inside the run: record by record
            ends = [*starts[1:], len(data)]
            keys = np.asarray(keys, np.int64).tolist()
            for key, start, end, position in zip(keys, starts, ends, positions):
                self.add(key, data[start:end], position)
            return
        (shard or self._start(self._number())).add_run(data, keys, starts)

    def open_through(self, number: int) -> None:
        """Finish shards, empty ones included, until shard `number` is the open one.

        Does nothing when shard `number` is already finished (a resumed run that was killed
        after renaming its last shard): it must never be opened, and so emptied, again.
        """
        while self._shard is None or self._shard.number < number:
            if self._shard is not None:
                self.finish_shard()
            elif self._number() > number:
                return
            else:
                self._start(self._number())

    def _full(self, shard: ShardFile, incoming: int) -> bool:
        if self.shard_records and shard.records >= self.shard_records:
            return True
        return bool(self.shard_bytes) and shard.rec_bytes + incoming > self.shard_bytes

    def _start(self, number: int, resumed: dict[str, Any] | None = None) -> ShardFile:
        self._shard = ShardFile(
            number,
            *self.paths(number),
            self._io,
            resumed,
            self.digests,
            keep_offsets=self.keep_offsets and resumed is None,
        )
        return self._shard

    def flush(self) -> int:
        """Write buffered records; return a number to give `wait_written`: the buffers
        added so far are then written."""
        if self._shard is None:
            return self._io.submitted
        return self._shard.flush()

    def wait_written(self, job: int) -> None:
        """Wait until what `flush` returned `job` for is written (its buffers may be reused)."""
        self._io.wait(job)

    def register(self, fd: int, name: str) -> None:
        """Name another file written through `write_after`, for error messages."""
        self._io.names[fd] = name

    def write_after(self, fd: int, data: Buffer) -> None:
        """Write `data` to another file once every record added so far is written."""
        self.flush()
        self._io.submit(fd, data)

    def finish_shard(self) -> ShardInfo | None:
        """Finish the open shard (see `ShardFile.finish`); return its `ShardInfo`."""
        if self._shard is None:
            return None
        info = self._shard.finish()
        self.finished.append(info)
        self._shard = None
        if self.on_shard_finished is not None:
            names = [info.rec, info.idx, *([info.crc] if info.crc else [])]
            self.on_shard_finished(info, [self.pack.beside(n) for n in names])
        return info

    def close(self, last_shard: int | None = None) -> None:
        """Finish the open shard, and empty ones up to `last_shard` (a planned pack's last).

        An empty pack still gets one empty shard.
        """
        if last_shard is not None:
            self.open_through(last_shard)
        elif self._shard is None and not self.finished:
            self._start(self._number())
        self.finish_shard()
        self._io.close()

    def abort(self) -> None:
        """Write what is buffered and close the descriptors, leaving `.partial` files to resume."""
        shard = self._shard
        try:
            if shard is not None:
                shard.abort()
        finally:
            self._io.close()
            if shard is not None:
                shard.close()
                self._shard = None

    # -- resuming ---------------------------------------------------------------------------
    def resume(
        self,
        drop_tail: Callable[[bytes], bool] | None = None,
        progress: Callable[[int, int], object] | None = None,
    ) -> int:
        """Adopt what an interrupted run left; return the number of records already written.

        Finished shards are taken as they are (re-hashed for the manifest; `progress(bytes
        hashed, bytes)` is told before the first and after each, if given). In the partial
        shard every complete .idx line points at a complete record, because .rec bytes are
        written first; the files are cut back to the last such record, and further back past
        trailing records for which `drop_tail(record)` is true.
        """
        # An unnumbered pack has one shard: every number names the same files.
        last = self.last_shard if self.numbered else self.first_shard
        finished = []
        number = self.first_shard
        while last is None or number <= last:
            rec, idx = self.paths(number)
            if not (
                os.path.exists(rec)
                and os.path.exists(idx)
                and not os.path.exists(PackPaths.partial(rec))
            ):
                break
            finished.append((rec, idx, os.path.getsize(rec)))
            number += 1
        total, done = sum(size for _, _, size in finished), 0
        if progress is not None:
            progress(0, total)
        for rec, idx, size in finished:
            self.finished.append(describe_shard(rec, idx, self.digests))
            done += size
            if progress is not None:
                progress(done, total)
        if last is not None and number > last:
            return self.records_written  # every shard of this run is already finished
        rec, idx = self.paths(number)
        rec_p, idx_p = PackPaths.partial(rec), PackPaths.partial(idx)
        if not os.path.exists(rec_p):
            return self.records_written
        if not os.path.exists(idx_p):
            # The shard was renamed half-way (.idx already final): take that .idx back.
            if os.path.exists(idx):
                rename(idx, idx_p, "shard")
            else:
                os.close(open_for_writing(idx_p, False))
        _refuse_links(rec_p, idx_p)
        data, _ = read_regular(idx_p, "partial index", follow=False)
        complete = data[: data.rfind(b"\n") + 1]
        keys, offsets = parse_index(complete, idx_p)
        records = RecordFile(rec_p)
        try:
            end = records.read_parts(int(offsets[-1]), int(keys[-1]))[1] if len(keys) else 0
            if len(records.open()) < end:
                raise RectoolError(f"{rec_p}: shorter than its index says; cannot resume")
            keep = len(keys)
            while drop_tail and keep and drop_tail(records.read_parts(int(offsets[keep - 1]))[0]):
                keep -= 1
        finally:
            records.close()
        if keep < len(keys):
            end = int(offsets[keep])
            complete = complete[: _line_start(complete, keep)]
            keys, offsets = keys[:keep], offsets[:keep]
        truncate(rec_p, end)
        truncate(idx_p, len(complete))
        kept_offsets = array.array("q", offsets.tobytes())
        idx_hash = Digests(self.digests)
        idx_hash.update(complete)
        state = {
            "records": len(keys),
            "rec_bytes": end,
            "idx_bytes": len(complete),
            "first_key": int(keys[0]) if len(keys) else None,
            "last_key": int(keys[-1]) if len(keys) else None,
            "offsets": kept_offsets,
            "checksums": RecordChecksums.of_file(rec_p, kept_offsets, end),
            "rec_hash": file_digests(rec_p, self.digests, end),
            "idx_hash": idx_hash,
        }
        self._start(number, state)
        return self.records_written


def _line_start(data: bytes, n: int) -> int:
    """Return the byte position where line `n` (0-based) of `data` starts."""
    pos = 0
    for _ in range(n):
        pos = data.index(b"\n", pos) + 1
    return pos


def describe_shard(rec: str, idx: str, digests: Iterable[str] = (XXH3_128,)) -> ShardInfo:
    """Return the `ShardInfo` of a finished shard, read from its files (each read once, for
    all the `digests`)."""
    keys, _ = load_index(idx)
    crc = checksum_path(rec)
    has_crc = os.path.exists(crc)
    files = {"rec": rec, "idx": idx, **({"crc": crc} if has_crc else {})}
    return ShardInfo(
        os.path.basename(rec),
        os.path.basename(idx),
        len(keys),
        os.path.getsize(rec),
        os.path.getsize(idx),
        int(keys[0]) if len(keys) else None,
        int(keys[-1]) if len(keys) else None,
        os.path.basename(crc) if has_crc else None,
        {name: file_digests(path, digests).hexdigests() for name, path in files.items()},
    )


def _refuse_links(*paths: str) -> None:
    """Raise for a symlink planted where a `.partial` file should be (never written through)."""
    for path in paths:
        if os.path.islink(path):
            raise RectoolError(f"{path}: is a symlink, not a file this pack wrote; remove it")
