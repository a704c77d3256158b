"""repack holds a few narrow numpy columns of the records, never int64 plan columns or a
second whole-length copy (issue 37: "anonymous memory per record ... at most ~50 bytes", so
that 42M records repack in ~2 GB).

The bound is checked on the Python heap as tracemalloc sees it (numpy's buffers included),
not by timing or by the process's RSS: the peak allocated while the library's `repack` runs,
less what was allocated before, a record, on a format-3 pack of 200k tiny records (the
scaling benchmark's, `bench_scale.generate`). What a repack holds whatever the pack's size (a
window of rows, a batch of framed records, a write buffer, a block of checksum entries, of
.idx text or of header labels) is made small, so that what grows with the records is most of
the figure: 34 bytes a record here in identity order, 36 shuffled. They are the source's
labels, the catalog's sample numbers and the plan's rows (int32 each), a refusal flag, and
the shard writer's offset and checksum of each record (8 + 8). Before the columns were
narrowed it was 107 (110 shuffled): int64 labels (twice), samples, rows and new labels, int32
shard and source numbers, and the shard's whole checksum table beside np.diff's temporaries.
"""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import pytest

import rectool.format.checksums as checksums
import rectool.format.digest as digest
import rectool.format.headers as headers
import rectool.format.textindex as textindex
import rectool.packer.shardfile as shardfile
import rectool.repack.copier as copier
import rectool.repack.run as run
from rectool.repack.pipeline import RepackOptions, repack

sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))
from bench_scale import generate  # noqa: E402

RECORDS = 200_000
# Rows, labels, samples and a refusal flag (13 bytes), the writer's offsets and checksums
# (16), and room for the bounded buffers at this size. Over it: int64 columns again (rows,
# samples and labels: 50), the labels copied as int64 (42).
MOST_BYTES_A_RECORD = 40


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    return generate(folder, RECORDS, log=lambda *_: None)


@pytest.fixture
def small_buffers(monkeypatch):
    """What a repack holds whatever the pack's size is made small, as bounded as before:
    the figure left is the columns'."""
    monkeypatch.setattr(run, "BATCH_RECORDS", 1 << 10)
    monkeypatch.setattr(run, "COUNT_RECORDS", 1 << 13)
    monkeypatch.setattr(copier, "BATCH_BYTES", 1 << 18)
    monkeypatch.setattr(shardfile, "FLUSH_BYTES", 1 << 18)
    monkeypatch.setattr(checksums, "TABLE_BLOCK_ENTRIES", 1 << 13)
    monkeypatch.setattr(textindex, "INDEX_BLOCK_BYTES", 1 << 17)
    monkeypatch.setattr(headers, "LABEL_CHUNK", 1 << 13)
    monkeypatch.setattr(digest, "_CHUNK", 1 << 18)


def traced_bytes_a_record(source, out, options):
    """Return the peak bytes tracemalloc saw allocated during `repack` (less those
    allocated before), a record; and its result."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = repack([source], out, options)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (peak - before) / RECORDS, result


@pytest.mark.parametrize("order", ["identity", "shuffle"])
def test_repack_holds_a_few_bytes_a_record(tiny_source, small_buffers, tmp_path, order):
    per_record, result = traced_bytes_a_record(
        tiny_source, tmp_path / "out", RepackOptions(order=order)
    )
    assert result.images == RECORDS and result.failures == 0
    assert per_record < MOST_BYTES_A_RECORD, f"{per_record:.1f} bytes a record"
