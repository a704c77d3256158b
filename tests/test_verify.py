"""`rectool verify`: every kind of damage is caught and named with its file, key and offset.

Expected keys and offsets come from the .idx text and the raw bytes (helpers/rec_files.py), never
from the code under test.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.damaged_jpegs import DAMAGES, good_jpeg
from helpers.image_files import encode, image_array, jpeg_bytes
from helpers.rec_files import (
    idx_lines,
    image_payload,
    label_vector_payload,
    make_pack,
    part_length,
    set_bytes,
    write_idx_lines,
    write_records,
    xor_byte,
)

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.format.checksums import checksum_path
from rectool.format.writer import pack_image_record
from rectool.inspect.verify import DecodeOptions, verify_dataset
from rectool.packer.writers import IndexedRecordWriter


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def found(report):
    """Return the problems as (kind, path, key, offset) tuples, in the order reported."""
    return [(p.kind, p.path, p.key, p.offset) for p in report.problems]


def npy_at(path, row, rows, row_bytes):
    """Return the byte offset of row `row` in an .npy file of `rows` rows: its data is last."""
    return os.path.getsize(path) - (rows - row) * row_bytes


@pytest.fixture
def bare(small_pack):
    """The same pack without its manifest and .rec.crc: only the .rec and .idx speak."""
    small_pack.manifest.unlink()
    os.unlink(checksum_path(small_pack.rec))
    return small_pack


# -- sound data ---------------------------------------------------------------------------------


def test_sound_pack_by_manifest_prefix_and_rec(small_pack):
    for target in (small_pack.manifest, small_pack.rec.with_suffix(""), small_pack.rec):
        report = verify_dataset(target)
        assert report.sound, report.problems
        # .rec, .idx, .rec.crc; offsets, keys and labels .npy; identities.json
        assert (report.records, report.images, report.checksums) == (12, 12, 7)
        assert report.layouts == ["images"]
        assert report.rec_bytes == small_pack.size


def test_sound_insightface_pack(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    report = verify_dataset(pack.manifest, decode=DecodeOptions((40, 32), 3))
    assert report.sound, report.problems
    assert report.layouts == ["insightface"]
    assert (report.records, report.images, report.decoded) == (16, 12, 12)


def test_sound_sharded_pack(tmp_path):
    pack = make_pack(tmp_path, shard_records=5)
    shards = sorted(pack.manifest.parent.glob("faces-*.rec"))
    assert len(shards) == 3
    report = verify_dataset(pack.manifest)
    assert report.sound, report.problems
    # 3 x (.rec, .idx, .rec.crc); offsets, keys and labels .npy; identities.json
    assert (report.records, len(report.shards), report.checksums) == (12, 3, 13)


def test_split_records_are_sound(tmp_path):
    rec, idx = tmp_path / "s.rec", tmp_path / "s.idx"
    magic = b"\x0a\x23\xd7\xce"
    # An image with the magic at aligned payload offsets 32 and 36 is split into three parts.
    image = jpeg_bytes(1)
    image = image[:8] + magic + magic + image[16:]
    with IndexedRecordWriter(rec, idx) as w:
        w.write(0, pack_image_record(jpeg_bytes(0), 0.0, 0))
        w.write(1, pack_image_record(image, 1.0, 1))
        w.write(2, pack_image_record(jpeg_bytes(2), 2.0, 2))
    offset = idx_lines(idx)[1][1]
    assert part_length(rec, offset) == (1, 32)  # a first part: the split is really there
    report = verify_dataset(rec)
    assert report.sound, report.problems
    assert report.records == 3


# -- framing --------------------------------------------------------------------------------------


def test_truncated_last_record(bare):
    key, offset = bare.lines[-1]
    os.truncate(bare.rec, offset + 20)
    report = verify_dataset(bare.rec)
    assert found(report) == [("truncated", bare.r, key, offset)]
    length = bare.lengths[-1]
    assert report.problems[0].message == (
        f"a part of {length} bytes runs past the end of the file ({offset + 20} bytes); "
        f"bytes {offset}..{offset + 20} (20 bytes) are unreadable"
    )


def test_truncated_mid_file_reports_lost_index_entries(bare):
    key, offset = bare.lines[5]
    os.truncate(bare.rec, offset + 10)
    report = verify_dataset(bare.rec)
    lost = [("index-offset", bare.i, k, o) for k, o in bare.lines[6:]]
    assert found(report) == [("truncated", bare.r, key, offset), *lost]
    assert report.problems[1].message == (
        f"line 7: offset {bare.lines[6][1]} is past the end of the file ({offset + 10} bytes)"
    )


def test_bad_magic(bare):
    key, offset = bare.lines[4]
    next_offset = bare.lines[5][1]
    xor_byte(bare.rec, offset, 0x01)
    report = verify_dataset(bare.rec)
    assert found(report) == [("bad-magic", bare.r, key, offset)]
    assert report.problems[0].message == (
        f"bad magic 0xced7230b (expected 0xced7230a); bytes {offset}..{next_offset} "
        f"({next_offset - offset} bytes) are unreadable"
    )


def test_bad_cflag_on_record_start(bare):
    key, offset = bare.lines[2]
    xor_byte(bare.rec, offset + 7, 0x40)  # cflag 0 -> 2, a middle part where a record starts
    report = verify_dataset(bare.rec)
    assert found(report) == [("bad-cflag", bare.r, key, offset)]
    assert report.problems[0].message.startswith(
        "record starts with continuation flag 2 (expected 0 or 1); "
    )


def test_bad_length_running_past_the_end_with_records_after(bare):
    key, offset = bare.lines[3]
    xor_byte(bare.rec, offset + 6, 0x10)  # length + 2**20: past the end of this small file
    report = verify_dataset(bare.rec)
    assert found(report) == [("bad-length", bare.r, key, offset)]
    assert f"the next record starts at byte {bare.lines[4][1]}" in report.problems[0].message


def test_nonzero_padding(bare):
    line = next(i for i, n in enumerate(bare.lengths) if n % 4)
    key, offset = bare.lines[line]
    set_bytes(bare.rec, offset + 8 + bare.lengths[line], b"\x01")
    report = verify_dataset(bare.rec)
    assert found(report) == [("bad-padding", bare.r, key, offset)]


def test_trailing_garbage(bare):
    with open(bare.rec, "ab") as f:
        f.write(b"garbage!!")
    report = verify_dataset(bare.rec)
    assert found(report) == [("trailing-garbage", bare.r, None, bare.size)]
    assert report.problems[0].message == "9 bytes after the last record are not a record"


def test_short_trailing_garbage(bare):
    with open(bare.rec, "ab") as f:
        f.write(b"\x00\x01\x02")
    report = verify_dataset(bare.rec)
    assert found(report) == [("trailing-garbage", bare.r, None, bare.size)]


def test_damaged_split_record_continuation(tmp_path):
    rec, idx = tmp_path / "s.rec", tmp_path / "s.idx"
    image = jpeg_bytes(1)
    image = image[:8] + b"\x0a\x23\xd7\xce" + image[12:]
    with IndexedRecordWriter(rec, idx) as w:
        w.write(7, pack_image_record(image, 1.0, 7))
        w.write(8, pack_image_record(jpeg_bytes(2), 2.0, 8))
    start = idx_lines(idx)[0][1]
    second_part = start + 8 + 32  # after the first part's header and its 32 bytes
    assert part_length(rec, second_part)[0] == 3
    xor_byte(rec, second_part + 7, 0x60)  # cflag 3 -> 0: continues with a whole-record flag
    report = verify_dataset(rec)
    # The walk resynchronises on the damaged part itself, which now looks like a record start.
    assert found(report)[0] == ("bad-cflag", str(rec), 7, start)
    assert report.problems[0].message.startswith(
        f"split record continues with flag 0 (expected 2 or 3) (part at byte {second_part}); "
        f"bytes {start}..{second_part} ("
    )
    # dmlc's resynchronising reader would take the damaged part for a record, and so do we.
    assert ("unindexed-record", str(rec), None, second_part) in [
        (k, p, None, o) for k, p, _, o in found(report)
    ]


# -- the index --------------------------------------------------------------------------------


def test_dropped_index_line(bare):
    key, offset = bare.lines[6]
    write_idx_lines(bare.idx, bare.lines[:6] + bare.lines[7:])
    report = verify_dataset(bare.rec)
    assert found(report) == [("unindexed-record", bare.r, key, offset)]
    assert report.problems[0].message == (
        f"the record at byte {offset} (header id {key}), "
        f"{bare.lines[7][1] - offset} bytes, is not in faces.idx"
    )


def test_index_offset_inside_a_record(bare):
    key, offset = bare.lines[3]
    lines = list(bare.lines)
    lines[3] = (key, offset + 12)
    write_idx_lines(bare.idx, lines)
    report = verify_dataset(bare.rec)
    assert found(report) == [
        ("index-offset", bare.i, key, offset + 12),
        ("unindexed-record", bare.r, key, offset),
    ]
    assert report.problems[0].message == (
        f"line 4: offset {offset + 12} is inside the record at byte {offset} (key {key}), "
        "not at a record start"
    )


def test_unaligned_index_offset(bare):
    key, offset = bare.lines[8]
    lines = list(bare.lines)
    lines[8] = (key, offset + 1)
    write_idx_lines(bare.idx, lines)
    report = verify_dataset(bare.rec)
    assert found(report) == [
        ("index-offset", bare.i, key, offset + 1),
        ("unindexed-record", bare.r, key, offset),
    ]


def test_duplicate_key(bare):
    lines = list(bare.lines)
    first_key, first_offset = lines[2]
    _, offset = lines[9]
    lines[9] = (first_key, offset)
    write_idx_lines(bare.idx, lines)
    report = verify_dataset(bare.rec)
    assert found(report) == [("duplicate-key", bare.i, first_key, offset)]
    assert report.problems[0].message == (
        f"line 10 repeats the key of line 3 (offsets {first_offset} and {offset}); "
        "readers keep the last"
    )


def test_duplicate_offset(bare):
    lines = list(bare.lines)
    lines.append((99, lines[4][1]))
    write_idx_lines(bare.idx, lines)
    report = verify_dataset(bare.rec)
    assert found(report) == [("duplicate-offset", bare.i, 99, lines[4][1])]


def test_missing_index(bare):
    bare.idx.unlink()
    report = verify_dataset(bare.rec)
    assert found(report) == [("missing-index", bare.i, None, None)]


def test_index_syntax_errors_are_reported_per_line(bare):
    text = bare.idx.read_text()
    lines = text.splitlines()
    lines[1] = "one\ttwo"
    bare.idx.write_text("\n".join(lines) + "\n")
    report = verify_dataset(bare.rec)
    key, offset = bare.lines[1]
    assert found(report) == [
        ("index-syntax", bare.i, None, None),
        ("unindexed-record", bare.r, key, offset),
    ]
    assert report.problems[0].message == (
        "line 2: expected 'key<TAB>offset' with integers, got b'one\\ttwo'"
    )


# -- headers and labels ---------------------------------------------------------------------------


def test_flag_flip_in_header(bare):
    line = next(i for i, (_, _, rel) in enumerate(bare.items) if rel.startswith("bob/"))
    key, offset = bare.lines[line]
    xor_byte(bare.rec, offset + 8, 0x01)  # flag 0 -> 1 on a record whose label is 1.0
    report = verify_dataset(bare.rec)
    assert found(report) == [("bad-header", bare.r, key, offset)]
    assert report.problems[0].message == (
        "flag 1 announces labels after the header, but the header's own label is 1.0 instead of 0.0"
    )


def test_huge_flag_in_header(bare):
    key, offset = bare.lines[0]
    xor_byte(bare.rec, offset + 8 + 3, 0x01)  # flag 0 -> 2**24
    report = verify_dataset(bare.rec)
    assert found(report) == [("bad-header", bare.r, key, offset)]
    assert report.problems[0].message == (
        f"the header announces 16777216 float32 labels but only {bare.lengths[0] - 24} "
        "bytes follow it"
    )


def test_label_outside_the_class_count(small_pack):
    line = next(i for i, (_, _, rel) in enumerate(small_pack.items) if rel.startswith("bob/"))
    key, offset = small_pack.lines[line]
    xor_byte(small_pack.rec, offset + 8 + 4 + 3, 0x7F)  # 1.0 (3f 80 00 00) -> 4.0 (40 80 00 00)
    report = verify_dataset(small_pack.manifest)
    labels = str(small_pack.manifest.parent / "faces.labels.npy")
    assert found(report) == [
        ("bad-label", small_pack.r, key, offset),
        ("record-checksum-mismatch", small_pack.r, key, offset),
        ("index-mismatch", labels, key, npy_at(labels, line, 12, 4)),
        ("checksum-mismatch", small_pack.r, None, None),
    ]
    assert report.problems[0].message == "label 4.0 is outside the 3 classes 0..2"
    assert report.problems[2].message == (
        f"sample {line} (record at byte {offset} of faces.rec): faces.labels.npy holds 1.0, "
        "the record's header 4.0"
    )


def test_labels_unchecked_without_class_count(bare):
    """Without a manifest or insightface header, any finite label is a valid one."""
    key, offset = bare.lines[5]
    xor_byte(bare.rec, offset + 8 + 4 + 3, 0x7F)
    assert verify_dataset(bare.rec).sound


def test_nan_label_is_caught_without_class_count(bare):
    key, offset = bare.lines[5]
    set_bytes(bare.rec, offset + 8 + 4, struct.pack("<f", float("nan")))
    report = verify_dataset(bare.rec)
    assert found(report) == [("bad-label", bare.r, key, offset)]


def test_empty_image_and_unknown_signature(tmp_path):
    rec, idx = tmp_path / "x.rec", tmp_path / "x.idx"
    offsets = write_records(
        rec,
        idx,
        [
            (0, image_payload(jpeg_bytes(0), 0.0, 0)),
            (1, image_payload(b"", 0.0, 1)),
            (2, image_payload(b"hello, world", 0.0, 2)),
            (3, image_payload(encode(image_array(3), ".png"), 0.0, 3)),
            (4, image_payload(b"\x00" * 10, 0.0, 4)),
        ],
    )
    report = verify_dataset(rec)
    assert found(report) == [
        ("empty-image", str(rec), 1, offsets[1]),
        ("not-an-image", str(rec), 2, offsets[2]),
        ("not-an-image", str(rec), 4, offsets[4]),
    ]
    assert report.problems[1].message == (
        "image bytes start with 68 65 6c 6c 6f 2c 20 77: no known image signature"
    )


def test_record_shorter_than_a_header(tmp_path):
    rec, idx = tmp_path / "x.rec", tmp_path / "x.idx"
    offsets = write_records(rec, idx, [(0, image_payload(jpeg_bytes(0), 0.0, 0)), (1, b"tiny")])
    report = verify_dataset(rec)
    assert found(report) == [("bad-header", str(rec), 1, offsets[1])]
    assert report.problems[0].message == (
        "the record of 4 bytes is shorter than the 24-byte image header"
    )


def test_label_vectors_are_the_images_layout(tmp_path):
    rec, idx = tmp_path / "m.rec", tmp_path / "m.idx"
    write_records(
        rec,
        idx,
        [
            (0, label_vector_payload([1.0, 2.0], 0, jpeg_bytes(0))),  # not insightface's record 0
            (1, label_vector_payload([0.0, 2.5], 1, jpeg_bytes(1))),
        ],
    )
    report = verify_dataset(rec)
    assert report.sound, report.problems
    assert report.layouts == ["images"]


# -- the manifest ---------------------------------------------------------------------------------


def test_payload_flip_is_caught_by_the_checksum(small_pack):
    key, offset = small_pack.lines[7]
    xor_byte(small_pack.rec, offset + 8 + 24 + 200, 0x01)  # inside the JPEG's entropy-coded data
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [
        ("record-checksum-mismatch", small_pack.r, key, offset),
        ("checksum-mismatch", small_pack.r, None, None),
    ]
    end = small_pack.lines[8][1]
    assert report.problems[0].message.startswith(
        f"record 7 of faces.rec.crc: bytes {offset}..{end} differ from their xxh3-64 ("
    )
    assert report.record_checksums == 12


def test_manifest_counts_sizes_and_keys(small_pack):
    write_idx_lines(small_pack.idx, small_pack.lines[:-1])  # the last record loses its line
    key, offset = small_pack.lines[-1]
    lost_line = len(f"{key}\t{offset}\n")
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [
        ("unindexed-record", small_pack.r, key, offset),
        ("size-mismatch", small_pack.i, None, None),
        ("count-mismatch", small_pack.i, None, None),
        ("key-mismatch", small_pack.i, small_pack.lines[-2][0], None),
        ("index-mismatch", str(small_pack.manifest), None, None),
    ]
    assert [p.message for p in report.problems[1:]] == [
        f"{small_pack.idx.stat().st_size} bytes; "
        f"the manifest says {small_pack.idx.stat().st_size + lost_line}",
        "11 entries; the manifest says 12",
        f"the last key is {small_pack.lines[-2][0]}; the manifest says {key}",
        f"index.samples[0] is 12, but {small_pack.idx} holds 11 samples; `rectool index` "
        "writes the index again",
    ]


def test_duplicate_key_with_manifest_also_reports_the_header_id(small_pack):
    lines = list(small_pack.lines)
    first_key = lines[2][0]
    _, offset = lines[9]
    lines[9] = (first_key, offset)
    write_idx_lines(small_pack.idx, lines)
    report = verify_dataset(small_pack.manifest)
    keys = str(small_pack.manifest.parent / "faces.keys.npy")
    assert found(report) == [
        ("duplicate-key", small_pack.i, first_key, offset),
        ("id-mismatch", small_pack.i, first_key, offset),
        ("index-mismatch", keys, first_key, npy_at(keys, 9, 12, 8)),
        ("checksum-mismatch", small_pack.i, None, None),
    ]
    assert report.problems[2].message == (
        f"sample 9: faces.keys.npy holds key {small_pack.lines[9][0]}, but line 10 of faces.idx "
        f"gives {first_key}"
    )


def test_missing_shard_file(tmp_path):
    pack = make_pack(tmp_path, shard_records=5)
    second = pack.manifest.parent / "faces-00001.rec"
    second.unlink()
    report = verify_dataset(pack.manifest)
    assert found(report) == [("missing-file", str(second), None, None)]


def test_keys_unique_across_shards(tmp_path):
    pack = make_pack(tmp_path, shard_records=6)
    first = idx_lines(pack.manifest.parent / "faces-00000.idx")
    second_idx = pack.manifest.parent / "faces-00001.idx"
    second = idx_lines(second_idx)
    second[0] = (first[0][0], second[0][1])
    write_idx_lines(second_idx, second)
    report = verify_dataset(pack.manifest)
    kinds = [(kind, path, key) for kind, path, key, _ in found(report)]
    assert ("duplicate-key", str(second_idx), first[0][0]) in kinds
    assert ("id-mismatch", str(second_idx), first[0][0]) in kinds


# -- insightface ----------------------------------------------------------------------------------


def insightface_records(counts, images=None, header=None, ranges=None):
    """Return (key, payload) records of the insightface layout, header record written last."""
    records, key = [], 1
    for label, count in enumerate(counts):
        for _ in range(count):
            records.append((key, image_payload(jpeg_bytes(key), float(label), key)))
            key += 1
    n, k = key - 1, len(counts)
    start = 1
    for label, count in enumerate(counts):
        pair = ranges[label] if ranges else [start, start + count]
        records.append((n + 1 + label, label_vector_payload(pair, n + 1 + label)))
        start += count
    records.append((0, label_vector_payload(header or [n + 1, n + 1 + k], 0, id2=1)))
    return records


def test_insightface_written_by_hand_is_sound(tmp_path):
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    write_records(rec, idx, insightface_records([2, 3, 1]))
    (tmp_path / "property").write_text("3,40,32\n")
    report = verify_dataset(tmp_path)
    assert report.sound, report.problems
    assert report.layouts == ["insightface"]
    assert (report.records, report.images) == (10, 6)


def test_insightface_gap_between_ranges(tmp_path):
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    offsets = write_records(
        rec, idx, insightface_records([2, 3, 1], ranges=[[1, 3], [4, 6], [6, 7]])
    )
    report = verify_dataset(rec)
    assert found(report) == [("insightface-range", str(rec), 8, offsets[7])]
    assert report.problems[0].message == "identity range [4, 6) starts at 4 instead of 3"


def test_insightface_last_range_short_of_the_images(tmp_path):
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    offsets = write_records(
        rec, idx, insightface_records([2, 3, 1], ranges=[[1, 3], [3, 6], [6, 6]])
    )
    report = verify_dataset(rec)
    assert found(report) == [("insightface-range", str(rec), 9, offsets[8])]
    assert report.problems[0].message == (
        "identity range [6, 6) is the last range and should end at 7, after the last image"
    )


def test_insightface_image_label_outside_its_identity(tmp_path):
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    records = insightface_records([2, 3, 1])
    records[3] = (4, image_payload(jpeg_bytes(4), 0.0, 4))  # key 4 is in identity 1's range
    offsets = write_records(rec, idx, records)
    report = verify_dataset(rec)
    assert found(report) == [("insightface-label", str(rec), 4, offsets[3])]
    assert report.problems[0].message == (
        "label 0.0, but the key lies in the range of identity 1 (key 8)"
    )


def test_insightface_missing_identity_record(tmp_path):
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    records = insightface_records([2, 3, 1])
    del records[7]  # identity record key 8
    write_records(rec, idx, records)
    report = verify_dataset(rec)
    assert found(report) == [("insightface-range", str(rec), 8, None)]
    assert (
        report.problems[0].message == "identity key 8 (of 7..9) is missing; record 0 announces it"
    )


def test_insightface_header_beyond_float32(tmp_path):
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    records = insightface_records([1], header=[2.0**24, 2.0**24 + 2])
    offsets = write_records(rec, idx, records)
    report = verify_dataset(rec)
    assert found(report)[0] == ("float32-inexact", str(rec), 0, offsets[-1])
    assert report.counts["insightface-range"] > 16_000_000  # keys 1..2**24 - 1 are missing


def test_insightface_property_disagrees(tmp_path):
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    write_records(rec, idx, insightface_records([2, 3, 1]))
    (tmp_path / "property").write_text("4,40,32\n")
    report = verify_dataset(rec)
    assert found(report) == [("insightface-header", str(tmp_path / "property"), None, None)]


def test_manifest_says_insightface_but_record_0_has_no_label_pair(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    key, offset = pack.lines[-1]
    assert key == 0  # written last, at the physical end of the file
    xor_byte(pack.rec, offset + 8, 0x02)  # flag 2 -> 0
    report = verify_dataset(pack.manifest)
    assert found(report)[0] == ("insightface-header", pack.r, 0, offset)
    assert report.problems[0].message == (
        "the manifest says layout insightface, but record 0 is not its header (flag 2, no image "
        "bytes, whole-number labels [N+1, N+1+K], key 1 with one label): it has flag 0, 8 image "
        "bytes, label 0.0; key 1 has flag 0"
    )
    assert report.layouts == ["images"]  # as the reader reads it
    assert ("checksum-mismatch", pack.r, None, None) in found(report)
    assert ("record-checksum-mismatch", pack.r, 0, offset) in found(report)


def test_manifest_says_insightface_but_record_0_labels_are_not_key_numbers(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    key, offset = pack.lines[-1]
    assert key == 0
    set_bytes(pack.rec, offset + 8 + 24, struct.pack("<f", 12.5))  # first label 13 -> 12.5
    report = verify_dataset(pack.manifest)
    assert found(report)[0] == ("insightface-header", pack.r, 0, offset)
    assert report.problems[0].message == (
        "the manifest says layout insightface, but record 0 is not its header (flag 2, no image "
        "bytes, whole-number labels [N+1, N+1+K], key 1 with one label): it has flag 2, 0 image "
        "bytes, labels [12.5, 16.0]; key 1 has flag 0"
    )
    assert report.layouts == ["images"]


def test_manifest_says_images_over_an_insightface_header(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    manifest = json.loads(pack.manifest.read_text())
    pack.manifest.write_text(json.dumps({**manifest, "layout": "images"}))
    report = verify_dataset(pack.manifest)
    assert found(report) == [("manifest", str(pack.manifest), None, None)]
    assert report.problems[0].message == (
        f"says layout images, but {pack.rec} has an insightface header record 0"
    )
    assert report.layouts == ["insightface"]


# -- decoding -------------------------------------------------------------------------------------


@pytest.fixture
def decodable(tmp_path):
    rec, idx = tmp_path / "d.rec", tmp_path / "d.idx"
    good = jpeg_bytes(1)
    gray = encode(image_array(2, channels=1), ".png")
    offsets = write_records(
        rec,
        idx,
        [
            (0, image_payload(good, 0.0, 0)),
            (1, image_payload(good[: len(good) // 2], 0.0, 1)),  # no end-of-image marker
            (2, image_payload(good[:200] + b"\xff\xd9", 0.0, 2)),  # ends, but corrupt
            (3, image_payload(jpeg_bytes(3, 20, 20), 0.0, 3)),
            (4, image_payload(gray, 0.0, 4)),
        ],
    )
    return rec, offsets


def test_decode_catches_broken_images(decodable):
    rec, offsets = decodable
    assert verify_dataset(rec, image_check=False).sound  # the signatures are all fine
    # the default structure walk finds both; decoding reports them as decode-failed instead
    assert [(k, key, o) for k, _, key, o in found(verify_dataset(rec))] == [
        ("image-damaged", 1, offsets[1]),
        ("image-damaged", 2, offsets[2]),
    ]
    report = verify_dataset(rec, decode=DecodeOptions(), workers=2)
    assert report.decoded == 5
    assert [(k, key, o) for k, _, key, o in found(report)] == [
        ("decode-failed", 1, offsets[1]),
        ("decode-failed", 2, offsets[2]),
    ]
    # the same structure walk as `pack --check decode`: it names where the file ends
    assert report.problems[0].message == "truncated JPEG (ends inside its headers)"


def test_decode_checks_size_and_channels(decodable):
    rec, offsets = decodable
    report = verify_dataset(rec, decode=DecodeOptions((40, 32), 3))
    assert [(k, key) for k, _, key, _ in found(report)] == [
        ("decode-failed", 1),
        ("decode-failed", 2),
        ("image-size", 3),
        ("image-channels", 4),
    ]
    assert report.problems[2].message == "20x20 (height x width), expected 40x32"
    assert report.problems[3].message == "1 channels, expected 3"


@pytest.fixture
def damaged_scans(tmp_path):
    """Records 0 and 4 sound (4 with 100 random bytes after its end marker); 1-3 damaged."""
    rec, idx = tmp_path / "s.rec", tmp_path / "s.idx"
    good = good_jpeg()
    trailer = np.random.default_rng(4).bytes(100)
    images = [good, *(damage(good) for damage in DAMAGES.values()), good + trailer]
    offsets = write_records(
        rec, idx, [(n, image_payload(image, 0.0, n)) for n, image in enumerate(images)]
    )
    return rec, offsets


def test_decode_reports_damaged_scans_by_key_and_offset(damaged_scans):
    # libjpeg-turbo warns about each of 1-3 (tests/test_images.py shows the damage is real);
    # OpenCV alone decodes them into damaged pictures.
    rec, offsets = damaged_scans
    report = verify_dataset(rec, decode=DecodeOptions(), workers=2)
    assert report.decoded == 5
    assert [(k, key, o) for k, _, key, o in found(report)] == [
        ("decode-failed", key, offsets[key]) for key in (1, 2, 3)
    ]
    for problem in report.problems:
        assert problem.message.startswith("corrupt JPEG data (libjpeg-turbo: Corrupt JPEG data: ")


def test_cli_decode_names_the_damaged_scan(damaged_scans):
    rec, offsets = damaged_scans
    result = invoke("verify", rec, "--decode", "-j", "1")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[1] == "Found 3 problems (decode-failed 3):"
    assert lines[4] == (
        f"  decode-failed: {rec}, key 3, byte offset {offsets[3]}: corrupt JPEG data "
        "(libjpeg-turbo: Corrupt JPEG data: premature end of data segment)"
    )


# -- unreadable input -----------------------------------------------------------------------------


def test_unreadable_inputs_raise(tmp_path):
    with pytest.raises(RectoolError, match="no dataset here"):
        verify_dataset(tmp_path / "nothing")
    bad = tmp_path / "bad.manifest.json"
    bad.write_text("{")
    with pytest.raises(RectoolError, match="not a (JSON|rectool) manifest"):
        verify_dataset(bad)


def test_keep_limits_the_listed_problems_not_the_count(bare):
    write_idx_lines(bare.idx, bare.lines[:1])
    report = verify_dataset(bare.rec, keep=3)
    assert report.problem_count == 11
    assert len(report.problems) == 3
    assert report.counts == {"unindexed-record": 11}


# -- the command line -----------------------------------------------------------------------------


def test_cli_sound_exit_0(small_pack):
    result = invoke("verify", small_pack.manifest)
    assert result.exit_code == 0, result.output
    first, second = result.stdout.splitlines()
    assert first.startswith(
        f"Verified {small_pack.manifest}: 12 records (12 images) in 1 shard, 0.0 MB, "
        "layout images; "
        "7 checksums compared ("
    )
    assert second == "Sound: no problems found."


def test_cli_problems_exit_1_with_file_key_offset(bare):
    key, offset = bare.lines[4]
    xor_byte(bare.rec, offset, 0x01)
    with open(bare.rec, "ab") as f:
        f.write(b"garbage!!")
    result = invoke("verify", bare.rec)
    assert result.exit_code == 1
    end = bare.lines[5][1]
    assert result.stdout.splitlines()[1:] == [
        "Found 2 problems (bad-magic 1, trailing-garbage 1):",
        f"  bad-magic: {bare.rec}, key {key}, byte offset {offset}: bad magic 0xced7230b "
        f"(expected 0xced7230a); bytes {offset}..{end} ({end - offset} bytes) are unreadable",
        f"  trailing-garbage: {bare.rec}, byte offset {bare.size}: "
        "9 bytes after the last record are not a record",
        f"Note: {bare.rec} has no binary index (no manifest: im2rec's, insightface's or bare "
        f"shards); its .idx text was checked. `rectool index {bare.rec}` writes one.",
    ]


def test_cli_max_problems(bare):
    write_idx_lines(bare.idx, bare.lines[:1])
    result = invoke("verify", bare.rec, "--max-problems", "2")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[1] == "Found 11 problems (unindexed-record 11):"
    assert len(lines) == 6  # and a note: no binary index
    assert lines[4] == "  ... and 9 more"


def test_cli_json(bare):
    key, offset = bare.lines[0]
    write_idx_lines(bare.idx, bare.lines[1:])
    result = invoke("verify", bare.rec, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["sound"] is False
    assert report["problem_count"] == 1
    assert report["counts"] == {"unindexed-record": 1}
    assert report["problems"] == [
        {
            "kind": "unindexed-record",
            "path": str(bare.rec),
            "key": key,
            "offset": offset,
            "message": f"the record at byte {offset} (header id {key}), "
            f"{bare.lines[1][1]} bytes, is not in faces.idx",
        }
    ]


def test_cli_exit_2_for_unreadable_input_and_usage(tmp_path, small_pack):
    result = invoke("verify", tmp_path / "nothing")
    assert result.exit_code == 2
    assert "no dataset here" in result.stderr
    result = invoke("verify", small_pack.rec, "--size", "112x112")
    assert result.exit_code == 2
    assert "--size/--channels" in result.stderr
    result = invoke("verify")
    assert result.exit_code == 2
    result = invoke("verify", small_pack.rec, "--decode", "--size", "big")
    assert result.exit_code == 2


def test_cli_quiet_and_several_targets(tmp_path, small_pack):
    other = tmp_path / "copy.rec"
    shutil.copy(small_pack.rec, other)
    shutil.copy(small_pack.idx, tmp_path / "copy.idx")
    result = invoke("verify", small_pack.rec, other, "-q")
    assert (result.exit_code, result.output) == (0, "")
    xor_byte(other, 0, 0x01)
    result = invoke("verify", small_pack.rec, other, "-q")
    assert (result.exit_code, result.output) == (1, "")


def test_cli_decode(decodable):
    rec, offsets = decodable
    result = invoke("verify", rec, "--decode", "-j", "2", "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["decoded"] == 5
    assert report["counts"] == {"decode-failed": 2}
