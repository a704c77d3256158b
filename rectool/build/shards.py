"""Shards: the plan, rollover, atomic finishing, and resuming what a killed run left.

A shard is an independent `.rec` + `.idx` pair. One shard is `PREFIX.rec`/`PREFIX.idx`; with a
size or count limit shards are `PREFIX-00000.rec`, `PREFIX-00001.rec`, ... (the names are
`manifest.py`'s). While a shard is being written its files carry a `.partial` suffix; they get
their final names only once complete.
"""

from __future__ import annotations

import array
import itertools
import os
import queue
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..doors.output import (
    create_new,
    fault_point,
    fsync_fd,
    open_existing,
    output_error,
    rename,
    truncate,
)
from ..errors import RectoolError, UsageError
from ..format.checksums import RecordChecksums, checksum_path
from ..format.digest import SHA256, XXH3_128, Digests, field_name, file_digests
from ..format.indexcache import INDEX_CACHE_MIN_RECORDS, write_index_cache
from ..format.writer import format_index_line, format_index_lines
from ..reader import (
    RecordFile,
    load_index,
    parse_index,
)
from .manifest import PARTIAL_SUFFIX, shard_paths

# Records are buffered and written in batches; kill -9 can then only cut between two writes.
FLUSH_BYTES = 4 << 20
WRITE_BYTES = 1 << 20
# Writeback to disk is started every this many bytes written (see `_OrderedWriter`).
WRITEBACK_BYTES = 8 << 20
_ADVISE = getattr(os, "POSIX_FADV_DONTNEED", None) if sys.platform.startswith("linux") else None


def plan_shards(total, shard_bytes=None, shard_records=None):
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


def parse_size(text):
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


def shard_digests(sha256=False):
    """Return the whole-file digests a pack's manifest gives: xxh3-128, and SHA-256 with
    `--sha256`."""
    return (XXH3_128, SHA256) if sha256 else (XXH3_128,)


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
    digests: dict | None = None

    def to_json(self):
        digests = self.digests or {}

        def fields(file):
            return {field_name(file, a): h for a, h in (digests.get(file) or {}).items()}

        entry = {"rec": self.rec, "idx": self.idx, "records": self.records,
                 "rec_bytes": self.rec_bytes, "idx_bytes": self.idx_bytes,
                 **fields("rec"), **fields("idx"),
                 "first_key": self.first_key, "last_key": self.last_key}  # fmt: skip
        if self.crc is not None:
            entry["crc"] = self.crc
            entry.update(fields("crc"))
        return entry


class _ShardDigest:
    """What the hashing thread feeds a shard's written buffers to, in order: the .rec's
    digests, and the checksum of each record (`starts`: per buffer, where its records start)."""

    def __init__(self, digests, checksums, starts):
        self.digests, self.checksums, self.starts = digests, checksums, iter(starts)

    def update(self, data):
        self.digests.update(data)
        self.checksums.add(data, next(self.starts))


def _feed(digest, parts):
    for data in parts:
        digest.update(data)


class _OrderedWriter:
    """One background thread that runs writes in submission order, so writing overlaps work;
    the bytes of each write are hashed on a second thread meanwhile.

    A bounded queue keeps memory flat; an error in the thread is raised in the caller at its
    next `submit` or `drain`.
    """

    def __init__(self, depth=4):
        self._queue = queue.Queue(maxsize=depth)
        self._error = None
        # Jobs are numbered from 1 as submitted; `wait(n)` returns once job n is done.
        self.submitted = 0
        self._completed = 0
        self._done = threading.Condition()
        self._thread = None  # started on first use, so a process pool can fork before it
        self.names = {}  # fd -> file name, for error messages
        self._written = {}  # fd -> offset up to which writeback was started
        self._hasher = None  # a second thread: a job's bytes are hashed while they are written

    def _started(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rectool-writer", daemon=True)
            self._thread.start()
        return self._queue

    def _run(self):
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                if self._error is None:
                    fd, parts, digest = job
                    hashed = (
                        None if digest is None else self._hashing().submit(_feed, digest, parts)
                    )
                    try:
                        fault_point("write", self.names.get(fd, ""))
                        for data in parts:
                            _write_all(fd, data)
                        self._start_writeback(fd)
                    finally:  # the job is done with its buffers only once they are hashed too
                        if hashed is not None:
                            hashed.result()
            except OSError as exc:  # a full disk, say: re-raised in the submitting thread
                self._error = output_error(exc, self.names.get(job[0], f"descriptor {job[0]}"))
            except BaseException as exc:  # re-raised in the submitting thread
                self._error = exc
            finally:
                with self._done:
                    self._completed += 1
                    self._done.notify_all()

    def _hashing(self):
        if self._hasher is None:
            self._hasher = ThreadPoolExecutor(1, thread_name_prefix="rectool-hash")
        return self._hasher

    def _start_writeback(self, fd):
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

    def forget(self, fd):
        """Forget what was written to `fd`, about to be closed (its number may come again)."""
        self._written.pop(fd, None)

    def _raise(self):
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(self, fd, data, digest=None):
        """Queue `data` (bytes, or a list of buffers) to be written to `fd` (and fed to
        `digest`) after everything before; return the job's number (see `wait`)."""
        self._raise()
        self._started().put((fd, data if isinstance(data, list) else [data], digest))
        self.submitted += 1
        return self.submitted

    def wait(self, job):
        """Wait until job number `job` and every one before it are done with their buffers."""
        with self._done:
            while self._completed < job:
                self._done.wait()

    def drain(self):
        """Wait until every queued write is done."""
        self.wait(self.submitted)
        self._raise()

    def close(self):
        """Finish the queued writes and stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._hasher is not None:
            self._hasher.shutdown()
            self._hasher = None
        self._raise()


class ShardFile:
    """One shard being written: its `.rec.partial` and `.idx.partial`, the checksum sidecar,
    and its finishing (fsync, then the final names); it knows nothing of rollover.

    Records are buffered and written in batches through the shared `_OrderedWriter`, .rec bytes
    before their .idx lines, so whatever a kill -9 leaves behind is a prefix of complete
    records (see `ShardWriter.resume`). `resumed` continues the `.partial` files an
    interrupted run left, with the state `ShardWriter.resume` read from them.
    """

    def __init__(self, number, rec_path, idx_path, io, resumed=None, digests=(XXH3_128,)):
        self.number, self.rec_path, self.idx_path = number, rec_path, idx_path
        self._io = io
        self.algorithms = tuple(digests)
        rec_p, idx_p = rec_path + PARTIAL_SUFFIX, idx_path + PARTIAL_SUFFIX
        append = bool(resumed)
        self._rec_fd = _open_for_writing(rec_p, append)
        self._idx_fd = _open_for_writing(idx_p, append)
        io.names[self._rec_fd], io.names[self._idx_fd] = rec_p, idx_p
        resumed = resumed or {}
        self.records = resumed.get("records", 0)
        self.rec_bytes = resumed.get("rec_bytes", 0)
        self.idx_bytes = resumed.get("idx_bytes", 0)
        self.first_key = resumed.get("first_key")
        self.last_key = resumed.get("last_key")
        # 16 bytes a record, for the shard's .idx cache; nothing else grows with the dataset.
        self._keys = resumed.get("keys", array.array("q"))
        self._offsets = resumed.get("offsets", array.array("q"))
        self._rec_hash = resumed.get("rec_hash") or Digests(self.algorithms)
        self._idx_hash = resumed.get("idx_hash") or Digests(self.algorithms)
        checksums = resumed.get("checksums")
        if checksums is None:
            checksums = RecordChecksums(self._offsets)
        self._checksums = checksums
        self._rec_buf: list = []
        self._rec_starts: list = []  # per buffer, where its records start (their checksums)
        self._idx_buf: list[bytes] = []
        self.buffered = 0  # bytes of records not yet handed to the writer thread

    def add(self, key, framed):
        """Append one framed record under `key`; return its offset in the .rec."""
        offset = self.rec_bytes
        lines = format_index_line(key, offset).encode("ascii")
        self._append(framed, lines, [key], [offset], [0])
        self.first_key = key if self.first_key is None else self.first_key
        self.last_key = key
        return offset

    def add_run(self, data, keys, starts):
        """Append records framed back to back in `data` (record i from `starts[i]`, a list)
        under `keys` (integers): the same bytes as `add` for each in turn."""
        if len(starts) >= 512:  # numpy's fixed costs are worth it (see format_index_lines)
            keys = np.asarray(keys, np.int64)
            offsets = self.rec_bytes + np.asarray(starts, np.int64)
        else:
            keys = keys.tolist() if isinstance(keys, np.ndarray) else keys
            offsets = [self.rec_bytes + start for start in starts]
        self._append(data, format_index_lines(keys, offsets), keys, offsets, starts)
        self.first_key = int(keys[0]) if self.first_key is None else self.first_key
        self.last_key = int(keys[-1])

    def _append(self, data, lines, keys, offsets, starts):
        self._rec_buf.append(data)
        self._rec_starts.append(starts)
        self._idx_buf.append(lines)
        self.buffered += len(data)
        self.records += len(keys)
        self.rec_bytes += len(data)
        self.idx_bytes += len(lines)
        if isinstance(keys, np.ndarray):
            self._keys.frombytes(keys.tobytes())
            self._offsets.frombytes(offsets.tobytes())
        else:
            self._keys.extend(keys)
            self._offsets.extend(offsets)
        if self.buffered >= FLUSH_BYTES:
            self.flush()

    def flush(self):
        """Write buffered records: all their .rec bytes first, then their .idx lines.

        Return a number to give `_OrderedWriter.wait`: the buffers added so far are then
        written.
        """
        if not self._rec_buf:
            return self._io.submitted
        parts, starts = self._rec_buf, self._rec_starts
        if len(parts) > 1 and self.buffered < len(parts) * WRITE_BYTES // 4:
            bases = itertools.accumulate(map(len, parts[:-1]), initial=0)
            starts = [
                np.concatenate(
                    [np.asarray(b, np.int64) + base for b, base in zip(starts, bases)]
                ).tolist()
            ]
            parts = [b"".join(parts)]  # many small records: one write, not one each
        digest = _ShardDigest(self._rec_hash, self._checksums, starts)
        self._io.submit(self._rec_fd, parts, digest)
        self._io.submit(self._idx_fd, b"".join(self._idx_buf), self._idx_hash)
        self._rec_buf, self._rec_starts = [], []  # the writer thread owns what it was given
        self._idx_buf.clear()
        self.buffered = 0
        return self._io.submitted

    def finish(self):
        """Flush, fsync and give the shard its final names; write its .idx cache; return
        its `ShardInfo`."""
        self.flush()
        self._io.drain()
        for fd in (self._rec_fd, self._idx_fd):
            fsync_fd(fd, self._io.names.get(fd, self.rec_path))
        self.close()  # before anything else can fail: an abort then has nothing to close
        # Before the renames: a shard with its final names always has its checksum file.
        crc_path = checksum_path(self.rec_path)
        crc_digests = self._checksums.write(crc_path, self.rec_bytes, self.algorithms)
        rename(self.idx_path + PARTIAL_SUFFIX, self.idx_path, "shard")
        rename(self.rec_path + PARTIAL_SUFFIX, self.rec_path, "shard")
        if len(self._keys) >= INDEX_CACHE_MIN_RECORDS:
            write_index_cache(
                self.idx_path,
                np.frombuffer(self._keys, np.int64),
                np.frombuffer(self._offsets, np.int64),
            )
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
        )

    def abort(self):
        """Queue what is buffered, then (once the writer thread is stopped) `close`."""
        self.flush()

    def close(self):
        """Close the `.partial` files as they are, to be resumed (once: later calls do
        nothing)."""
        for fd in (self._rec_fd, self._idx_fd):
            if fd is not None:
                self._io.forget(fd)
                os.close(fd)
        self._rec_fd = self._idx_fd = None


class ShardWriter:
    """Write framed records into shards that roll over by bytes and/or record count.

    Each shard is written by a `ShardFile`; this class decides when one ends and the next
    begins, and adopts what an interrupted run left (`resume`). `on_shard_finished(info,
    paths)` is called as each shard gets its final names (`paths`: its .rec, .idx and
    checksum file), while the next ones are still to be written: an upload starts there.
    """

    def __init__(
        self, prefix, shard_bytes=None, shard_records=None, first_shard=0, last_shard=None,
        sha256=False, on_shard_finished=None,
    ):  # fmt: skip
        self.prefix = os.fspath(prefix)
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
        self._io = _OrderedWriter()
        self.on_shard_finished = on_shard_finished

    # -- state ------------------------------------------------------------------------------
    @property
    def records_written(self):
        """Return the records in finished shards plus the open one."""
        return sum(s.records for s in self.finished) + (self._shard.records if self._shard else 0)

    def paths(self, number):
        """Return the final (rec, idx) paths of shard `number`."""
        return shard_paths(self.prefix, number, self.numbered)

    # -- writing ----------------------------------------------------------------------------
    def _number(self):
        """Return the number of the open shard, or of the next one to open."""
        return self.first_shard + len(self.finished)

    def add(self, key, framed, position=0):
        """Append one framed record under `key` (list position `position`), rolling over first
        when the shard limits say so; return its offset in its shard's .rec."""
        if self.planned:
            self.open_through(position // self.shard_records)
        elif self._shard and self._shard.records and self._full(self._shard, len(framed)):
            self.finish_shard()
        return (self._shard or self._start(self._number())).add(key, framed)

    def add_run(self, data, keys, starts, positions):
        """Append records framed back to back in `data` (record i from `starts[i]`), under
        `keys`, at list positions `positions`: the same bytes as `add` for each in turn.

        `data` may be a view of a buffer the caller reuses only once `wait_written` says so.
        """
        count = len(keys)
        if not count:
            return
        shard = self._shard
        if self.planned:
            number = positions[0] // self.shard_records
            fits = positions[-1] // self.shard_records == number
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

    def open_through(self, number):
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

    def _full(self, shard, incoming):
        if self.shard_records and shard.records >= self.shard_records:
            return True
        return bool(self.shard_bytes) and shard.rec_bytes + incoming > self.shard_bytes

    def _start(self, number, resumed=None):
        self._shard = ShardFile(number, *self.paths(number), self._io, resumed, self.digests)
        return self._shard

    def flush(self):
        """Write buffered records; return a number to give `wait_written`: the buffers
        added so far are then written."""
        if self._shard is None:
            return self._io.submitted
        return self._shard.flush()

    def wait_written(self, job):
        """Wait until what `flush` returned `job` for is written (its buffers may be reused)."""
        self._io.wait(job)

    def register(self, fd, name):
        """Name another file written through `write_after`, for error messages."""
        self._io.names[fd] = name

    def write_after(self, fd, data):
        """Write `data` to another file once every record added so far is written."""
        self.flush()
        self._io.submit(fd, data)

    def finish_shard(self):
        """Finish the open shard (see `ShardFile.finish`); return its `ShardInfo`."""
        if self._shard is None:
            return None
        info = self._shard.finish()
        self.finished.append(info)
        self._shard = None
        if self.on_shard_finished is not None:
            folder = os.path.dirname(self.prefix)
            names = [info.rec, info.idx, *([info.crc] if info.crc else [])]
            self.on_shard_finished(info, [os.path.join(folder, n) for n in names])
        return info

    def close(self, last_shard=None):
        """Finish the open shard, and empty ones up to `last_shard` (a planned pack's last).

        An empty pack still gets one empty shard.
        """
        if last_shard is not None:
            self.open_through(last_shard)
        elif self._shard is None and not self.finished:
            self._start(self._number())
        self.finish_shard()
        self._io.close()

    def abort(self):
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
    def resume(self, drop_tail=None):
        """Adopt what an interrupted run left; return the number of records already written.

        Finished shards are taken as they are (re-hashed for the manifest). In the partial
        shard every complete .idx line points at a complete record, because .rec bytes are
        written first; the files are cut back to the last such record, and further back past
        trailing records for which `drop_tail(record)` is true.
        """
        number = self.first_shard
        # An unnumbered pack has one shard: every number names the same files.
        last = self.last_shard if self.numbered else self.first_shard
        while last is None or number <= last:
            rec, idx = self.paths(number)
            if (
                os.path.exists(rec)
                and os.path.exists(idx)
                and not os.path.exists(rec + PARTIAL_SUFFIX)
            ):
                self.finished.append(describe_shard(rec, idx, self.digests))
                number += 1
                continue
            break
        else:
            return self.records_written  # every shard of this run is already finished
        rec_p, idx_p = rec + PARTIAL_SUFFIX, idx + PARTIAL_SUFFIX
        if not os.path.exists(rec_p):
            return self.records_written
        if not os.path.exists(idx_p):
            # The shard was renamed half-way (.idx already final): take that .idx back.
            if os.path.exists(idx):
                rename(idx, idx_p, "shard")
            else:
                os.close(_open_for_writing(idx_p, False))
        _refuse_links(rec_p, idx_p)
        with open(idx_p, "rb") as f:
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        keys, offsets = parse_index(complete, idx_p)
        with RecordFile(rec_p) as records:
            end = records.next_offset(int(offsets[-1]), int(keys[-1])) if len(keys) else 0
            if records.size < end:
                raise RectoolError(f"{rec_p}: shorter than its index says; cannot resume")
            keep = len(keys)
            while drop_tail and keep and drop_tail(records.read_at(int(offsets[keep - 1]))):
                keep -= 1
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
            "keys": array.array("q", keys.tobytes()),
            "offsets": kept_offsets,
            "checksums": RecordChecksums.of_file(rec_p, kept_offsets, end),
            "rec_hash": file_digests(rec_p, self.digests, end),
            "idx_hash": idx_hash,
        }
        self._start(number, state)
        return self.records_written


def _line_start(data, n):
    """Return the byte position where line `n` (0-based) of `data` starts."""
    pos = 0
    for _ in range(n):
        pos = data.index(b"\n", pos) + 1
    return pos


def describe_shard(rec, idx, digests=(XXH3_128,)):
    """Return the `ShardInfo` of a finished shard, read from its files (each read once, for
    all the `digests`)."""
    keys, _ = load_index(idx, cache=False)
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


def _refuse_links(*paths):
    """Raise for a symlink planted where a `.partial` file should be (never written through)."""
    for path in paths:
        if os.path.islink(path):
            raise RectoolError(f"{path}: is a symlink, not a file this pack wrote; remove it")


def _open_for_writing(path, append):
    """Open a `.partial` file: a new one (whatever is at the name is replaced, never followed),
    or, to resume, the one there (never through a symlink)."""
    try:
        return open_existing(path) if append else create_new(path)
    except OSError as exc:
        raise RectoolError(f"{path}: cannot create ({exc.strerror or exc})") from None


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        # At most WRITE_BYTES a call: on this machine 4 MB writes ran at about 0.5 GB/s and
        # 1 MB ones at about 4 GB/s into the page cache.
        view = view[os.write(fd, view[:WRITE_BYTES]) :]
