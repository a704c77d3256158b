"""Review of two changes: a shard flushed to the disk while it is written (`build/ordered.py`,
FLUSH_BYTES) and the index caches `reindex` writes again (`format/indexcache.py`).

Faults are injected through the output door's hook; sizes are made small so that small files
reach a flush."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from rectool.build import ordered, passthrough, shardfile
from rectool.doors import output
from rectool.errors import RectoolError
from rectool.format.writer import IndexedRecordWriter, RecordWriter, frame_record
from rectool.reader import RecordFile, load_index

RECORD = 4 << 10


@pytest.fixture
def small_flushes(monkeypatch):
    """Writeback every 4 KB, a flush every 32 KB, records handed to the OS every 8 KB."""
    monkeypatch.setattr(ordered, "WRITEBACK_BYTES", 4 << 10)
    monkeypatch.setattr(ordered, "FLUSH_BYTES", 32 << 10)
    monkeypatch.setattr(shardfile, "FLUSH_BYTES", 8 << 10)
    monkeypatch.setattr(passthrough, "BLOCK_BYTES", 16 << 10)


@pytest.fixture
def first_flush_fails():
    """The first flush of any file raises an I/O error; later ones succeed."""
    failed = []

    def hook(step, path):
        if step == "flush" and not failed:
            failed.append(path)
            raise OSError(errno.EIO, "Input/output error", path)

    output.set_fault_hook(hook)
    yield failed
    output.set_fault_hook(None)


def _payload(key):
    return key.to_bytes(8, "little") * (RECORD // 8 - 1)


def test_a_public_writer_whose_flush_fails_writes_each_record_once(
    tmp_path, small_flushes, first_flush_fails
):
    """An error raised after a write succeeded must not leave the records it wrote queued to
    be written again: the .rec then holds them twice and the .idx points past the first copy
    at the wrong records."""
    rec, idx = tmp_path / "data.rec", tmp_path / "data.idx"
    writer = IndexedRecordWriter(rec, idx)
    for key in range(64):  # 256 KB: several flushes
        try:
            writer.write_framed(key, frame_record(_payload(key)))
        except RectoolError:
            pass  # an I/O error reported: what was written must still be whole and true
    told = writer.tell()
    writer.close()
    assert os.path.getsize(rec) == told
    keys, offsets = load_index(idx, cache=False)
    assert keys.tolist() == list(range(64))
    with RecordFile(rec) as records:
        for key, offset in zip(keys.tolist(), offsets.tolist()):
            assert records.read_at(offset) == _payload(key), key


def test_a_public_writer_leaves_no_thread_behind_once_closed(tmp_path, small_flushes):
    """The public writers write in the caller's thread (`OrderedWriter(background=False)`):
    a program that forks after using one must not carry a thread of rectool's."""
    before = {t.ident for t in threading.enumerate()}
    writer = RecordWriter(tmp_path / "data.rec")
    for key in range(64):
        writer.write(_payload(key))
    writer.close()
    left = [t.name for t in threading.enumerate() if t.ident not in before]
    assert left == []
