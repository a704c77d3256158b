"""The public writers: `RecordWriter` (a .rec) and `IndexedRecordWriter` (a .rec and its .idx).

They frame records with `format/writer.py` and write through the pipeline's own `ShardFile`
(`ShardFile.plain`): one writing path, one fsync, one door, for rectool's packs and for users'
own files alike.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..format.writer import frame_record
from .shardfile import ShardFile

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, StrPath


class RecordWriter:
    """Append framed records to a .rec file; a context manager.

    `write(payload)` returns the number of bytes written; `tell()` the offset the next record
    will start at. Opening with `append=True` continues an existing file. The bytes are
    written by a plain `ShardFile` (buffered, handed to the OS by `flush` and `close`).
    """

    def __init__(self, path: StrPath, append: bool = False) -> None:
        self.path = os.fspath(path)
        self._shard = _plain_file(self.path, None, append)

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # dropped unclosed: still writes its records, as a file does
        if getattr(self, "_shard", None) is not None and not self._shard.closed:
            self.close()

    def tell(self) -> int:
        """Return the byte offset at which the next record starts."""
        return self._shard.rec_bytes

    def write(self, payload: ReadableBuffer, item: object = None) -> int:
        """Frame and append one record; return the bytes written."""
        return self.write_framed(frame_record(payload, item))

    def write_framed(self, framed: ReadableBuffer) -> int:
        """Append bytes already produced by `frame_record`; return the bytes written."""
        _check_open(self._shard, "write to closed file")
        framed = framed if type(framed) is bytes else bytes(framed)  # the caller may reuse it
        self._shard.add(None, framed)
        return len(framed)

    def flush(self, sync: bool = False) -> None:
        """Push buffered bytes to the OS, and to the disk with `sync=True`."""
        _check_open(self._shard, "flush of closed file")
        self._shard.sync(fsync=sync)

    def close(self) -> None:
        """Flush and close the file."""
        _close(self._shard)


def _plain_file(rec_path: str, idx_path: str | None, append: bool) -> ShardFile:
    return ShardFile.plain(rec_path, idx_path, append)


def _check_open(shard: ShardFile, message: str) -> None:
    if shard.closed:
        raise ValueError(message)


def _close(shard: ShardFile) -> None:
    if not shard.closed:
        try:
            shard.sync(fsync=False)
        finally:
            shard.close()


class IndexedRecordWriter:
    """Write a .rec and its .idx together, as `mxnet.recordio.MXIndexedRecordIO` does.

    Both are written by one plain `ShardFile`, the .rec bytes of records before their .idx
    lines.
    """

    def __init__(self, rec_path: StrPath, idx_path: StrPath, append: bool = False) -> None:
        self.idx_path = os.fspath(idx_path)
        self._shard = _plain_file(os.fspath(rec_path), self.idx_path, append)

    def __enter__(self) -> IndexedRecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # dropped unclosed: still writes its records, as a file does
        if getattr(self, "_shard", None) is not None and not self._shard.closed:
            self.close()

    def tell(self) -> int:
        """Return the byte offset at which the next record starts."""
        return self._shard.rec_bytes

    def write(self, key: int, payload: ReadableBuffer, item: object = None) -> int:
        """Append one record under `key`; return its byte offset."""
        framed = frame_record(payload, item if item is not None else f"key {key}")
        return self.write_framed(key, framed)

    def write_framed(self, key: int, framed: ReadableBuffer) -> int:
        """Append an already framed record under `key`; return its byte offset."""
        _check_open(self._shard, "write to closed file")
        framed = framed if type(framed) is bytes else bytes(framed)  # the caller may reuse it
        return self._shard.add(key, framed)

    def flush(self, sync: bool = False) -> None:
        """Push buffered bytes of both files to the OS (and the disk with `sync=True`)."""
        _check_open(self._shard, "flush of closed file")
        self._shard.sync(fsync=sync)

    def close(self) -> None:
        """Flush and close both files."""
        _close(self._shard)
