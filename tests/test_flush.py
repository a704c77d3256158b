"""A shard is flushed to the disk while it is written (`packer/ordered.py`, DATASYNC_BYTES), so the
fsync that finishes it waits for its last part only. Such a flush runs on a duplicate of the
file's descriptor, whose error the final fsync does not see again: its error must fail the run,
naming the file, as the fsync's own would. Steps are seen through the output door's fault hook;
the sizes are made small here so that a small pack reaches them."""

from __future__ import annotations

import errno
import json
import os
import threading
from contextlib import closing

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli
from rectool.doors import output
from rectool.doors.output import create_new
from rectool.errors import RectoolError
from rectool.format.textindex import load_index
from rectool.format.writer import frame_record
from rectool.packer import ordered, passthrough, shardfile
from rectool.packer.writers import IndexedRecordWriter, RecordWriter
from rectool.reader import RecordFile

CHUNK = 16 << 10


@pytest.fixture
def small_flushes(monkeypatch):
    """Writeback every 4 KB, a flush every 32 KB, pass-through blocks of 16 KB."""
    monkeypatch.setattr(ordered, "WRITEBACK_BYTES", 4 << 10)
    monkeypatch.setattr(ordered, "DATASYNC_BYTES", 32 << 10, raising=False)
    monkeypatch.setattr(passthrough, "BLOCK_BYTES", CHUNK)


@pytest.fixture
def steps():
    """The (step, path) of every step of every output, in order; `fail_at(step)` makes that
    step raise an I/O error from then on."""
    seen: list[tuple[str, str]] = []
    failing: set[str] = set()

    def hook(step, path):
        seen.append((step, path))
        if step in failing:
            raise OSError(errno.EIO, "Input/output error", path)

    output.set_fault_hook(hook)
    seen_and_fail = (seen, failing.add)
    yield seen_and_fail
    output.set_fault_hook(None)


def test_a_file_is_flushed_while_it_is_written_not_only_at_its_end(tmp_path, small_flushes, steps):
    seen, _ = steps
    writer = ordered.OrderedWriter()
    path = str(tmp_path / "data.bin")
    fd = create_new(path)
    writer.names[fd] = path
    try:
        for n in range(16):  # 256 KB in 16 KB writes
            writer.submit(fd, bytes([n]) * CHUNK)
            # Each write done, and its flush, before the next: a flush is skipped while
            # another is under way, so without this how many there are depends on timing.
            writer.drain()
    finally:
        writer.forget(fd)
        writer.close()
    flushes = [p for step, p in seen if step == "flush"]
    assert flushes and set(flushes) == {path}
    assert len(flushes) == 8  # every 32 KB while writing goes on: not one at the end
    assert (tmp_path / "data.bin").read_bytes() == b"".join(bytes([n]) * CHUNK for n in range(16))


def test_an_error_of_a_flush_is_raised_naming_the_file(tmp_path, small_flushes, steps):
    _, fail_at = steps
    fail_at("flush")
    writer = ordered.OrderedWriter()
    path = str(tmp_path / "data.bin")
    fd = create_new(path)
    writer.names[fd] = path
    with pytest.raises(RectoolError, match="data.bin") as raised:
        try:
            for n in range(16):
                writer.submit(fd, bytes([n]) * CHUNK)
            writer.drain()
        finally:
            writer.forget(fd)
            writer.close()
    assert "Input/output error" in str(raised.value)


def _tree(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["alice", "bob", "carol"], 40, height=96, width=96)
    return root, write_list(tmp_path / "faces.lst", items)


def test_pack_flushes_its_shard_before_the_fsync_that_finishes_it(tmp_path, small_flushes, steps):
    seen, _ = steps
    root, lst = _tree(tmp_path)
    out = tmp_path / "out" / "faces"
    result = CliRunner().invoke(cli, ["pack", str(lst), str(root), str(out), "-q"])
    assert result.exit_code == 0, result.output
    partial = f"{out}.rec.partial"
    rec_steps = [step for step, p in seen if p == partial and step in ("flush", "fsync")]
    # At least one (a flush under way makes the next ones wait: how many is timing's).
    assert rec_steps.count("flush") >= 1
    assert rec_steps[-1] == "fsync"  # the flushes come while writing; the fsync ends it


def test_pack_whose_flush_fails_names_the_shard_and_leaves_no_pack(tmp_path, small_flushes, steps):
    _, fail_at = steps
    fail_at("flush")
    root, lst = _tree(tmp_path)
    out = tmp_path / "out" / "faces"
    result = CliRunner().invoke(cli, ["pack", str(lst), str(root), str(out), "-q", "--json"])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    report = json.loads(result.stdout)
    assert "faces.rec.partial" in json.dumps(report)
    assert "Input/output error" in json.dumps(report)
    assert not (tmp_path / "out" / "faces.rec").exists()
    assert not (tmp_path / "out" / "faces.manifest.json").exists()


# --- the public writers write in the caller's thread and flush only when told -----------------

RECORD = 4 << 10


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


@pytest.fixture
def small_handoffs(monkeypatch):
    """Records handed to the OS every 8 KB (`shardfile.FLUSH_BYTES`)."""
    monkeypatch.setattr(shardfile, "FLUSH_BYTES", 8 << 10)


def _payload(key):
    return key.to_bytes(8, "little") * (RECORD // 8 - 1)


def test_a_public_writer_whose_flush_fails_writes_each_record_once(
    tmp_path, small_flushes, small_handoffs, first_flush_fails
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
    keys, offsets = load_index(idx)
    assert keys.tolist() == list(range(64))
    with closing(RecordFile(rec)) as records:
        for key, offset in zip(keys.tolist(), offsets.tolist()):
            assert records.read_parts(offset)[0] == _payload(key), key


def test_a_public_writer_leaves_no_thread_behind_once_closed(
    tmp_path, small_flushes, small_handoffs
):
    """The public writers write in the caller's thread (`OrderedWriter(background=False)`):
    a program that forks after using one must not carry a thread of rectool's."""
    before = {t.ident for t in threading.enumerate()}
    writer = RecordWriter(tmp_path / "data.rec")
    for key in range(64):
        writer.write(_payload(key))
    writer.close()
    left = [t.name for t in threading.enumerate() if t.ident not in before]
    assert left == []
