"""rectool.recordio's read_idx fast path: every check still runs, on every call.

read_idx inlines the common case (a whole one-part record, read in the process that opened
the file) and leaves everything else to seek + read. These tests pin what the shortcut must
not change: a record damaged after an earlier read is still refused, the last record without
its padding is still cut short, and a forked child still reopens the file as MXNet's does.
The differential tests (tests/test_recordio_oracle.py, tests/test_recordio_machine.py) compare
the results with MXNet's.
"""

from __future__ import annotations

import os
import pickle

import pytest

from rectool import recordio
from rectool.reader import MAGIC_BYTES


@pytest.fixture
def written(tmp_path):
    """Three records (keys 0..2); the last, 7 bytes, ends in one padding byte."""
    idx, rec = str(tmp_path / "a.idx"), str(tmp_path / "a.rec")
    w = recordio.MXIndexedRecordIO(idx, rec, "w")
    for key, body in enumerate([b"zero", b"one-record", b"two-two"]):
        w.write_idx(key, body)
    w.close()
    return idx, rec


def test_a_record_damaged_after_it_was_read_is_refused_on_the_next_read(written):
    idx, rec = written
    r = recordio.MXIndexedRecordIO(idx, rec, "r")
    offset = r.idx[1]
    assert r.read_idx(1) == b"one-record"
    with open(rec, "r+b") as f:  # the reader's mapping sees the change
        f.seek(offset)
        f.write(b"XXXX")
    with pytest.raises(recordio.RecordFormatError, match=f"key 1, byte offset {offset}: bad magic"):
        r.read_idx(1)
    with open(rec, "r+b") as f:
        f.seek(offset + 4)
        f.write((1 << 29 | 10).to_bytes(4, "little"))  # restored magic, but a 'first part' flag
        f.seek(offset)
        f.write(MAGIC_BYTES)
    with pytest.raises(
        recordio.RecordFormatError, match="cut short|continuation flag 0 .expected 2 or 3"
    ):
        r.read_idx(1)  # a split record whose next part is not a continuation


def test_the_last_record_without_its_padding_is_cut_short(written):
    idx, rec = written
    os.truncate(rec, os.path.getsize(rec) - 1)
    r = recordio.MXIndexedRecordIO(idx, rec, "r")
    assert r.read_idx(1) == b"one-record"
    with pytest.raises(recordio.RecordFormatError, match="key 2, .*record cut short"):
        r.read_idx(2)


def _in_forked_child(work):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        with os.fdopen(write_end, "wb") as f:
            f.write(pickle.dumps(work()))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def test_a_forked_child_reopens_the_file_on_read_idx_as_mxnet(written):
    r = recordio.MXIndexedRecordIO(*written, "r")
    parent = os.getpid()
    assert r.read_idx(0) == b"zero" and r.pid == parent
    got = _in_forked_child(lambda: (r.read_idx(2), r.pid == os.getpid(), r.pid != parent))
    assert got == (b"two-two", True, True)  # MXNet's seek resets: the child's own pid
    assert r.pid == parent and r.read_idx(1) == b"one-record"


def test_read_idx_on_a_closed_object_reopens_it_and_on_a_writer_fails_as_mxnets(written, tmp_path):
    r = recordio.MXIndexedRecordIO(*written, "r")
    r.close()
    assert r.read_idx(2) == b"two-two" and r.is_open  # MXNet's seek resets a closed reader
    w = recordio.MXIndexedRecordIO(str(tmp_path / "w.idx"), str(tmp_path / "w.rec"), "w")
    w.write_idx(0, b"zero")
    with pytest.raises(AssertionError):
        w.read_idx(0)
