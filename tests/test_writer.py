"""rectool.format.writer against byte layouts written out by hand from FORMAT-NOTES §1-3."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rectool.errors import RecordTooLargeError, RectoolError
from rectool.format import writer
from rectool.format.writer import (
    format_index_line,
    frame_image_record,
    frame_record,
    pack_image_record,
)
from rectool.packer.writers import IndexedRecordWriter, RecordWriter

M = b"\x0a\x23\xd7\xce"  # the magic 0xced7230a as it lies in the file
LIMIT = 2**29 - 1


def lrec(cflag, length):
    return struct.pack("<I", (cflag << 29) | length)


# --- frame_record ---------------------------------------------------------------------------------

FRAMING = [
    ("empty", b"", M + lrec(0, 0)),
    ("3 bytes", b"abc", M + lrec(0, 3) + b"abc\0"),
    ("4 bytes", b"abcd", M + lrec(0, 4) + b"abcd"),
    ("5 bytes", b"abcde", M + lrec(0, 5) + b"abcde\0\0\0"),
    ("6 bytes", b"abcdef", M + lrec(0, 6) + b"abcdef\0\0"),
    ("magic only", M, M + lrec(1, 0) + M + lrec(3, 0)),
    ("magic at 0", M + b"xy", M + lrec(1, 0) + M + lrec(3, 2) + b"xy\0\0"),
    (
        "magic in the middle",
        b"abcd" + M + b"efghz",
        M + lrec(1, 4) + b"abcd" + M + lrec(3, 5) + b"efghz\0\0\0",
    ),
    (
        "magic twice in a row",
        b"abcd" + M + M + b"ef",
        M + lrec(1, 4) + b"abcd" + M + lrec(2, 0) + M + lrec(3, 2) + b"ef\0\0",
    ),
    (
        "magic three times from 0",
        M + M + M,
        M + lrec(1, 0) + M + lrec(2, 0) + M + lrec(2, 0) + M + lrec(3, 0),
    ),
    (
        "two magics apart",
        M + b"abcd" + M + b"efgh" + b"i",
        M + lrec(1, 0) + M + lrec(2, 4) + b"abcd" + M + lrec(3, 5) + b"efghi\0\0\0",
    ),
    ("magic as last aligned word", b"abcdefgh" + M, M + lrec(1, 8) + b"abcdefgh" + M + lrec(3, 0)),
    (
        "magic as last aligned word, then 2 bytes",
        b"abcdefgh" + M + b"yz",
        M + lrec(1, 8) + b"abcdefgh" + M + lrec(3, 2) + b"yz\0\0",
    ),
    ("magic unaligned by 1", b"a" + M + b"bcd", M + lrec(0, 8) + b"a" + M + b"bcd"),
    ("magic unaligned by 2", b"ab" + M + b"cd", M + lrec(0, 8) + b"ab" + M + b"cd"),
    ("magic unaligned by 3", b"abc" + M + b"d", M + lrec(0, 8) + b"abc" + M + b"d"),
    (
        "magic unaligned by 3, then aligned",
        b"abc" + M + b"d" + M,
        M + lrec(1, 8) + b"abc" + M + b"d" + M + lrec(3, 0),
    ),
    ("magic straddling the end", b"abcd" + M[:2], M + lrec(0, 6) + b"abcd" + M[:2] + b"\0\0"),
    (
        "3 magic bytes, then magic at 7",
        b"abcd" + M[:3] + M,
        M + lrec(0, 11) + b"abcd" + M[:3] + M + b"\0",
    ),
]


@pytest.mark.parametrize(
    ("payload", "expected"), [c[1:] for c in FRAMING], ids=[c[0] for c in FRAMING]
)
def test_frame_record(payload, expected):
    assert frame_record(payload) == expected


@pytest.mark.parametrize(
    "as_buffer",
    [
        bytearray,
        memoryview,
        lambda b: np.frombuffer(b, np.uint8),
        lambda b: np.frombuffer(b, "<u4"),
    ],
    ids=["bytearray", "memoryview", "uint8 array", "uint32 array"],
)
def test_frame_record_takes_any_bytes_like(as_buffer):
    payload = b"abcd" + M + b"efgh"
    expected = M + lrec(1, 4) + b"abcd" + M + lrec(3, 4) + b"efgh"
    assert frame_record(as_buffer(payload)) == expected


# --- the 2**29 - 1 limit --------------------------------------------------------------------------


def huge(nbytes, dtype=np.uint8):
    """Return a zero buffer of `nbytes` that costs no memory until touched (calloc)."""
    return memoryview(np.zeros(nbytes // np.dtype(dtype).itemsize, dtype))


def test_frame_record_refuses_2_to_the_29_bytes():
    with pytest.raises(RecordTooLargeError) as caught:
        frame_record(huge(2**29), item="alice/001.jpg")
    assert isinstance(caught.value, RectoolError)
    assert str(caught.value) == (
        "alice/001.jpg: 536870912 bytes exceeds the RecordIO limit of 536870911 bytes (2**29 - 1)"
    )


def test_frame_record_counts_bytes_not_items():
    with pytest.raises(RecordTooLargeError) as caught:
        frame_record(huge(2**29, np.float32))  # 2**27 items of 4 bytes
    assert str(caught.value) == (
        "record: 536870912 bytes exceeds the RecordIO limit of 536870911 bytes (2**29 - 1)"
    )


def test_frame_record_lets_2_to_the_29_minus_1_bytes_through(monkeypatch):
    # Framing 512 MB would be slow: the boundary is checked on a limit of 64 bytes, and the
    # limit itself is the public constant, equal to dmlc's.
    assert writer.MAX_RECORD_BYTES == LIMIT == 2**29 - 1
    monkeypatch.setattr(writer, "MAX_RECORD_BYTES", 64)
    assert frame_record(bytes(64)) == M + lrec(0, 64) + bytes(64)
    with pytest.raises(RecordTooLargeError, match="record: 65 bytes exceeds"):
        frame_record(bytes(65))


def test_record_writer_writes_nothing_for_a_record_too_large(tmp_path):
    path = tmp_path / "a.rec"
    with RecordWriter(path) as w:
        with pytest.raises(RecordTooLargeError) as caught:
            w.write(huge(2**29), item="alice/001.jpg")
        assert str(caught.value).startswith("alice/001.jpg: 536870912 bytes exceeds")
        assert w.tell() == 0
        assert w.write(b"ok") == 12  # the writer carries on with the next item
    assert path.read_bytes() == M + lrec(0, 2) + b"ok\0\0"


def test_indexed_writer_writes_nothing_for_a_record_too_large(tmp_path):
    rec, idx = tmp_path / "a.rec", tmp_path / "a.idx"
    with IndexedRecordWriter(rec, idx) as w:
        with pytest.raises(RecordTooLargeError) as caught:
            w.write(7, huge(2**29))
        assert str(caught.value) == (
            "key 7: 536870912 bytes exceeds the RecordIO limit of 536870911 bytes (2**29 - 1)"
        )
        with pytest.raises(RecordTooLargeError) as caught:
            w.write(7, huge(2**29), item="bob/2.jpg")
        assert str(caught.value).startswith("bob/2.jpg: 536870912 bytes")
        w.flush()
        assert (rec.read_bytes(), idx.read_bytes()) == (b"", b"")
        assert w.write(8, b"ok") == 0
    assert rec.read_bytes() == M + lrec(0, 2) + b"ok\0\0"
    assert idx.read_bytes() == b"8\t0\n"


# --- pack_image_record ----------------------------------------------------------------------------


def test_pack_image_record_bytes_by_hand():
    expected = (
        bytes.fromhex("00000000")  # flag 0
        + bytes.fromhex("0000803f")  # label 1.0 as float32
        + bytes.fromhex("0200000000000000")  # id 2
        + bytes.fromhex("0300000000000000")  # id2 3
        + b"x"
    )
    assert pack_image_record(b"x", 1.0, 2, 3) == expected


@pytest.mark.parametrize(
    ("label", "header_label"),
    [
        (3.0, 3.0),
        (5, 5.0),
        (-0.5, -0.5),
        (np.float32(2.5), 2.5),
        (np.float64(0.25), 0.25),
        (np.int64(4), 4.0),
        (16777217, 16777216.0),  # float32 holds integers exactly only up to 2**24
    ],
    ids=["float", "int", "negative", "float32", "float64", "int64", "2**24 + 1"],
)
def test_pack_image_record_scalar_label(label, header_label):
    assert (
        pack_image_record(b"JPEG", label, 7, 9)
        == struct.pack("<IfQQ", 0, header_label, 7, 9) + b"JPEG"
    )


@pytest.mark.parametrize(
    ("label", "floats"),
    [
        ([1.0, 2.5, -3.0], [1.0, 2.5, -3.0]),
        ((1, 2), [1.0, 2.0]),
        ([42.0], [42.0]),
        (np.array([0.1, 7.0]), [0.1, 7.0]),
        (np.array([[1, 2], [3, 4]], np.int32), [1.0, 2.0, 3.0, 4.0]),
        (np.float32([16777217.0]), [16777216.0]),
    ],
    ids=["list", "tuple of ints", "one label", "float64 array", "2-D array, flattened", "rounded"],
)
def test_pack_image_record_vector_label(label, floats):
    n = len(floats)
    expected = struct.pack(f"<IfQQ{n}f", n, 0.0, 1, 2, *floats) + b"img"
    assert pack_image_record(b"img", label, 1, 2) == expected


def test_pack_image_record_empty_label_vector_is_flag_0_as_in_mxnet():
    assert pack_image_record(b"x", []) == struct.pack("<IfQQ", 0, 0.0, 0, 0) + b"x"


@pytest.mark.parametrize(
    "image",
    [
        bytearray(b"\xff\xd8img"),
        memoryview(b"\xff\xd8img"),
        np.frombuffer(b"\xff\xd8img", np.uint8),
    ],
    ids=["bytearray", "memoryview", "uint8 array"],
)
def test_pack_image_record_image_bytes_like(image):
    assert pack_image_record(image, 1.0) == struct.pack("<IfQQ", 0, 1.0, 0, 0) + b"\xff\xd8img"


def test_pack_image_record_full_u64_ids():
    record = pack_image_record(b"", 0.0, 2**64 - 1, 2**63)
    assert record == struct.pack("<IfQQ", 0, 0.0, 2**64 - 1, 2**63)
    assert record[8:] == b"\xff" * 8 + b"\0" * 7 + b"\x80"


# --- RecordWriter and IndexedRecordWriter ---------------------------------------------------------


def test_record_writer(tmp_path):
    path = tmp_path / "a.rec"
    with RecordWriter(path) as w:
        assert (w.tell(), w.write(b"hello"), w.tell()) == (0, 16, 16)
        assert w.write(M) == 16
        assert w.write_framed(M + lrec(0, 0)) == 8
        assert w.tell() == 40
    assert path.read_bytes() == (
        M + lrec(0, 5) + b"hello\0\0\0" + M + lrec(1, 0) + M + lrec(3, 0) + M + lrec(0, 0)
    )
    with RecordWriter(path, append=True) as w:
        assert w.tell() == 40
        w.write(b"z")
    assert path.read_bytes()[40:] == M + lrec(0, 1) + b"z\0\0\0"
    with RecordWriter(path) as w:  # without append the file starts over
        assert w.tell() == 0
    assert path.read_bytes() == b""


def test_indexed_writer_idx_lines(tmp_path):
    rec, idx = tmp_path / "a.rec", tmp_path / "a.idx"
    with IndexedRecordWriter(rec, idx) as w:
        assert w.write(0, b"") == 0
        assert w.write(5, b"hello") == 8
        assert w.write(np.int64(2), b"ab" + M) == 24
        assert w.tell() == 40
        w.flush()
        assert idx.read_bytes() == b"0\t0\n5\t8\n2\t24\n"
    assert rec.read_bytes() == (
        M + lrec(0, 0) + M + lrec(0, 5) + b"hello\0\0\0" + M + lrec(0, 6) + b"ab" + M + b"\0\0"
    )
    with IndexedRecordWriter(rec, idx, append=True) as w:
        assert w.write(9, b"abcd" + M) == 40
        assert w.write_framed(1000000, M + lrec(0, 0)) == 60
    assert idx.read_bytes() == b"0\t0\n5\t8\n2\t24\n9\t40\n1000000\t60\n"
    assert rec.read_bytes()[40:] == M + lrec(1, 4) + b"abcd" + M + lrec(3, 0) + M + lrec(0, 0)


@pytest.mark.parametrize(
    ("key", "offset", "line"),
    [
        (3, 1024, "3\t1024\n"),
        (0, 0, "0\t0\n"),
        (np.int64(7), np.int64(2**40), "7\t1099511627776\n"),
        (2**63 - 1, 2**63 - 1, "9223372036854775807\t9223372036854775807\n"),
    ],
)
def test_format_index_line(key, offset, line):
    assert format_index_line(key, offset) == line


@given(
    image=st.binary(max_size=64).map(lambda b: b.replace(b"X", M)),
    label=st.one_of(
        st.floats(width=32, allow_nan=False), st.lists(st.floats(width=32), max_size=3)
    ),
    key=st.integers(0, 2**64 - 1),
)
def test_frame_image_record_equals_the_general_path(image, label, key):
    assert frame_image_record(image, label, key) == frame_record(
        pack_image_record(image, label, key)
    )


def test_frame_image_record_splits_like_the_general_path():
    image = b"abcd" + M + b"ef"
    assert frame_image_record(image, 1.0, 7) == frame_record(pack_image_record(image, 1.0, 7))
    assert frame_image_record(image, 1.0, 7).count(M) == 2  # two parts


@given(
    st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**63 - 1)), max_size=40),
    st.booleans(),
)
def test_index_lines_of_a_run_are_each_line_in_turn(pairs, non_negative):
    if non_negative:  # the numpy path; a negative key is written by Python's % formatting
        pairs = [(abs(key) // 2, offset) for key, offset in pairs]
    pairs = pairs * (600 // len(pairs) + 1) if pairs else pairs  # long runs go through numpy
    keys, offsets = [k for k, _ in pairs], [o for _, o in pairs]
    expected = "".join(writer.format_index_line(k, o) for k, o in pairs).encode("ascii")
    assert writer.format_index_lines(keys, offsets) == expected
    assert writer.format_index_lines(np.array(keys, np.int64), offsets) == expected


def test_index_lines_at_every_digit_count():
    values = [0, 1, 9, 10, 99, 100] + [10**n + d for n in range(2, 19) for d in (-1, 0, 1)]
    values += [2**63 - 1]
    values *= 12  # past the length from which numpy writes them
    expected = "".join(f"{v}\t{values[-1 - i]}\n" for i, v in enumerate(values)).encode()
    assert writer.format_index_lines(values, values[::-1]) == expected


def test_index_lines_of_rising_keys_and_offsets_across_digit_counts():
    # A shard's lines: keys and offsets rise, so their widths change at a few lines only
    # (written a run of one width at a time); keys and offsets cross powers of ten apart.
    keys = [k for n in (1, 4, 9, 18) for k in range(max(10**n - 700, 0), 10**n + 700)]
    offsets = [7 * k for k in keys]
    expected = "".join(f"{k}\t{o}\n" for k, o in zip(keys, offsets)).encode()
    assert writer.format_index_lines(keys, offsets) == expected
    assert writer.format_index_lines(np.array(keys, np.int64), offsets) == expected


# --- one writer stack ----------------------------------------------------------------------------


def test_the_public_writers_write_through_the_pipelines_shard_file(tmp_path, monkeypatch):
    """RecordWriter and IndexedRecordWriter have no write path of their own: every byte of
    their files is written by the pipeline's ShardFile (its OrderedWriter's `write_all`), and
    `flush(sync=True)` fsyncs through the ShardFile's `fsync_fd`. A writer that opened or wrote
    its files itself again would leave bytes that went through neither."""
    from rectool.packer import ordered, shardfile

    written, synced, added = {}, [], []
    write_all, fsync_fd, add = ordered.write_all, shardfile.fsync_fd, shardfile.ShardFile.add

    def spy_write(fd, data):
        written.setdefault(os.readlink(f"/proc/self/fd/{fd}"), []).append(bytes(data))
        write_all(fd, data)

    def spy_add(self, key, framed):
        added.append(key)
        return add(self, key, framed)

    monkeypatch.setattr(ordered, "write_all", spy_write)
    monkeypatch.setattr(
        shardfile, "fsync_fd", lambda fd, path: synced.append(path) or fsync_fd(fd, path)
    )
    monkeypatch.setattr(shardfile.ShardFile, "add", spy_add)
    rec, idx, plain = tmp_path / "a.rec", tmp_path / "a.idx", tmp_path / "b.rec"
    with IndexedRecordWriter(rec, idx) as w:
        w.write(4, b"four" + M + b"!")
        w.flush(sync=True)
        assert synced == [str(rec), str(idx)]
        w.write(5, b"five")
    with IndexedRecordWriter(rec, idx, append=True) as w:
        w.write_framed(6, frame_record(b"six"))
    with RecordWriter(plain) as w:
        w.write(b"plain")
        w.flush(sync=True)
        assert synced[-1] == str(plain)
    assert added == [4, 5, 6, None]
    for path in (rec, idx, plain):
        assert path.read_bytes() == b"".join(written.pop(os.path.realpath(path)))
    assert written == {}
    assert idx.read_bytes() == b"4\t0\n5\t24\n6\t36\n"


def test_the_one_writer_check_sees_a_writer_of_its_own(tmp_path, monkeypatch):
    """The check above fails for a writer that writes its file itself (the old RecordWriter)."""
    from rectool.packer import ordered

    written = []
    write_all = ordered.write_all
    monkeypatch.setattr(
        ordered, "write_all", lambda fd, data: written.append(bytes(data)) or write_all(fd, data)
    )
    path = tmp_path / "own.rec"
    with open(path, "wb") as f:  # a stack of its own: bytes that skip ShardFile
        f.write(frame_record(b"own"))
    assert path.read_bytes() != b"".join(written)
