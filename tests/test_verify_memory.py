"""verify holds a few numpy columns of a pack's records, never a whole-pack copy (issue 37:
"anonymous memory per record at most ~50 bytes", so that 42M records verify in ~2 GB).

The bound is checked on the Python heap as tracemalloc sees it (numpy's buffers included),
not by timing or by the process's RSS: the peak allocated while `verify_dataset` runs, less
what was allocated before, a record, on a pack of 200k tiny records. What verify holds
whatever the pack's size (the window a shard is read through, the chunk of rows a check
computes at a time, a block of checksum entries or of .idx text, a hashing buffer) is made
small, so that what grows with the records is most of the figure: 42 bytes a record here
(45 for insightface's layout): the .idx's keys and offsets, record lengths, header floats,
and what the framing walk holds while it runs. Before the columns were trimmed it was 131
(161): a .rec.crc read whole, every header field, a copy of the keys and of the offsets,
line numbers, a row a key and an owner a key for insightface's ranges.
"""

from __future__ import annotations

import array
import tracemalloc

import numpy as np
import pytest
from helpers.image_files import encode

import rectool.format.checksums as checksums
import rectool.format.digest as digest
import rectool.format.textindex as textindex
import rectool.inspect.verify.columns as columns
from rectool.format.checksums import RecordChecksums, checksum_path, encode_checksums
from rectool.format.window import RecWindow
from rectool.inspect.verify import verify_dataset
from rectool.packer.indexing import index_pack
from rectool.reader import IMAGE_HEADER_SIZE, MAGIC

RECORDS = 200_000
PER_IDENTITY = 20
# The columns a sound one-shard pack needs (keys and offsets of its .idx: 16 bytes a record;
# record lengths, header floats: 8), the duplicate checks' and the binary index's
# comparisons a chunk at a time, and room for the bounded windows and chunks at this size.
MOST_BYTES_A_RECORD = 50


def write_tiny_pack(prefix, records):
    """Write `records` image records of one small JPEG (labels: one identity a 20 records)
    as PREFIX.rec, .idx and .rec.crc, as numpy writes them (seconds, not minutes)."""
    jpeg = encode(np.full((8, 8), 128, np.uint8), ".jpg")
    length = IMAGE_HEADER_SIZE + len(jpeg)
    stride = 8 + (length + 3) // 4 * 4
    template = np.zeros(stride, np.uint8)
    template[8 + IMAGE_HEADER_SIZE : 8 + length] = np.frombuffer(jpeg, np.uint8)
    words = template.view("<u4")
    words[0], words[1] = MAGIC, length
    keys = np.arange(records, dtype=np.int64)
    block = np.tile(template, (records, 1))
    w = block.view("<u4")
    w[:, 3] = (keys // PER_IDENTITY).astype(np.float32).view("<u4")  # label
    w[:, 4] = keys  # id: the key
    data = block.tobytes()
    del block, w
    return _write_shard(prefix, data, keys, keys * stride)


def write_tiny_insightface(prefix, images):
    """Write insightface's layout of `images` image records of one small JPEG (20 an
    identity): record 0 announcing them and the identities, the images (keys 1..N), then
    an identity record for each (its [start, end) key range) as PREFIX.rec, .idx and .rec.crc."""
    identities = images // PER_IDENTITY
    a, b = images + 1, images + 1 + identities
    jpeg = encode(np.full((8, 8), 128, np.uint8), ".jpg")
    length = IMAGE_HEADER_SIZE + len(jpeg)
    stride = 8 + (length + 3) // 4 * 4
    image = np.zeros(stride, np.uint8)
    image[8 + IMAGE_HEADER_SIZE : 8 + length] = np.frombuffer(jpeg, np.uint8)
    image.view("<u4")[:2] = MAGIC, length
    keys = np.arange(1, images + 1, dtype=np.int64)
    block = np.tile(image, (images, 1))
    block.view("<u4")[:, 3] = ((keys - 1) // PER_IDENTITY).astype(np.float32).view("<u4")
    block.view("<u4")[:, 4] = keys
    # A header of flag 2, float 0.0, ids (key, 0), then two float32 labels: 40 bytes framed.
    pairs = np.zeros((identities + 1, 10), "<u4")
    pairs[:, :3] = MAGIC, 32, 2
    pairs[:, 4] = [0, *range(a, b)]  # record 0, then the identity records' keys
    starts = np.arange(identities) * PER_IDENTITY + 1
    firsts = np.array([a, *starts], np.float32)
    lasts = np.array([b, *(starts + PER_IDENTITY)], np.float32)
    pairs[:, 8], pairs[:, 9] = firsts.view("<u4"), lasts.view("<u4")
    data = pairs[:1].tobytes() + block.tobytes() + pairs[1:].tobytes()
    offsets = np.concatenate(
        ([0], 40 + (keys - 1) * stride, 40 + images * stride + 40 * np.arange(identities))
    )
    return _write_shard(prefix, data, np.array([0, *keys, *range(a, b)]), offsets)


def _write_shard(prefix, data, keys, offsets):
    rec = f"{prefix}.rec"
    with open(rec, "wb") as f:
        f.write(data)
    lines = np.char.add(np.char.add(keys.astype(str), "\t"), offsets.astype(str))
    with open(f"{prefix}.idx", "w") as f:
        f.write("\n".join(lines.tolist()) + "\n")
    sums = RecordChecksums(array.array("q", offsets.tolist()))
    sums.add(data, offsets.tolist())
    with open(checksum_path(rec), "wb") as f:
        f.write(encode_checksums(sums.table(len(data))))
    return rec


@pytest.fixture
def tiny_pack(tmp_path):
    return write_tiny_pack(tmp_path / "tiny", RECORDS)


def traced_bytes_a_record(target, records):
    """Return the peak bytes tracemalloc saw allocated during `verify_dataset(target)` (less
    those allocated before), a record; and the report."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        report = verify_dataset(target, workers=1, open_rec=lambda path: RecWindow(path, 1 << 18))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (peak - before) / records, report


@pytest.fixture
def small_chunks(monkeypatch):
    """What verify holds whatever the pack's size (a chunk of rows a check computes at a
    time, a block of checksum entries or of .idx text, a hashing buffer; the window, in
    `traced_bytes_a_record`) is made small, as bounded as before: the figure left is the
    columns'."""
    monkeypatch.setattr(columns, "CHUNK_ROWS", 1 << 13)
    monkeypatch.setattr(checksums, "TABLE_BLOCK_ENTRIES", 1 << 13)
    monkeypatch.setattr(textindex, "INDEX_BLOCK_BYTES", 1 << 17)
    monkeypatch.setattr(digest, "_CHUNK", 1 << 18)


def test_verify_holds_a_few_bytes_a_record_comparing_every_checksum(tiny_pack, small_chunks):
    # No manifest: every record's checksum is compared, every image's structure walked.
    per_record, report = traced_bytes_a_record(tiny_pack, RECORDS)
    assert report.sound and report.records == RECORDS
    assert report.record_checksums == RECORDS
    assert per_record < MOST_BYTES_A_RECORD, f"{per_record:.1f} bytes a record"


def test_verify_holds_a_few_bytes_a_record_with_a_binary_index(tiny_pack, small_chunks):
    # Format 3: the manifest's digests vouch for the records; the binary index's offsets,
    # keys and labels are compared with the .idx and the headers.
    result = index_pack(tiny_pack)
    per_record, report = traced_bytes_a_record(str(result.manifest), RECORDS)
    assert report.sound and report.records == RECORDS, report.problems[:3]
    assert per_record < MOST_BYTES_A_RECORD, f"{per_record:.1f} bytes a record"


def test_verify_holds_a_few_bytes_a_record_of_an_insightface_pack(tmp_path, small_chunks):
    # Record 0, identity records and their ranges: the layout's checks, a key at a time.
    rec = write_tiny_insightface(tmp_path / "train", RECORDS)
    result = index_pack(rec)
    per_record, report = traced_bytes_a_record(str(result.manifest), RECORDS)
    assert report.sound and report.layouts == ["insightface"], report.problems[:3]
    assert report.images == RECORDS
    assert per_record < MOST_BYTES_A_RECORD, f"{per_record:.1f} bytes a record"
