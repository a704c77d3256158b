"""Review of two changes: a shard flushed to the disk while it is written (`build/ordered.py`,
FLUSH_BYTES) and the index caches `reindex` writes again (`format/indexcache.py`).

Faults are injected through the output door's hook; sizes are made small so that small files
reach a flush."""

from __future__ import annotations

import errno
import json
import os
import threading

import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import write_pack

from rectool.build import ordered, passthrough, shardfile
from rectool.cli import cli
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


# --- reindex writes again the caches a rebuilt .idx made stale -----------------------------------


def _invoke(*args):
    return CliRunner().invoke(cli, [os.fspath(a) for a in args])


def _sharded_pack(folder, shards=3, per=40):
    prefix = os.fspath(folder / "many")
    write_pack(prefix, [[(k, b"img%d" % k, 0.0) for k in range(s * per, (s + 1) * per)]
                        for s in range(shards)])  # fmt: skip
    return prefix


def _pack_cache(prefix):
    result = _invoke("info", prefix, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["index_cache"]["pack"]


def test_reindex_into_prefix_idx_leaves_the_cache_of_a_pack_of_several_shards(tmp_path):
    """`-o PREFIX.idx` beside a pack of several shards: the .idx's own cache would be named
    PREFIX.idx.rtc, the pack's cache. That is not this .idx's to write again or remove."""
    prefix = _sharded_pack(tmp_path)
    assert _invoke("index-cache", prefix).exit_code == 0
    cache = f"{prefix}.idx.rtc"
    stamp = open(cache, "rb").read()
    result = _invoke("reindex", f"{prefix}-00000.rec", "-o", f"{prefix}.idx", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["index_caches"] == []
    assert open(cache, "rb").read() == stamp
    assert _pack_cache(prefix) == cache
