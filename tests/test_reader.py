"""Records by byte offset (rectool.reader's RecordFile, its one framing loop), .idx parsing
(format/textindex.py), IndexedRecordFile lookups and record_heads (format/headers.py).

Every .rec here is assembled by hand from FORMAT-NOTES §1 (`part()` below), never by rectool's
writer, so a reader bug cannot be hidden by the same bug in the writer.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rectool import errors, reader
from rectool.format import headers
from rectool.format.headers import unpack_header
from rectool.format.records import IndexedRecordFile, iter_records
from rectool.format.textindex import IndexFormatError, load_index, parse_index
from rectool.reader import (
    RecordFile,
    RecordFormatError,
    RectoolError,
)

MAGIC = b"\x0a\x23\xd7\xce"  # 0xced7230a, little-endian


def part(cflag, data, length=None):
    """Return one framed part: magic, lrec = cflag << 29 | len, data, zero padding to 4 bytes."""
    length = len(data) if length is None else length
    return MAGIC + struct.pack("<I", (cflag << 29) | length) + data + b"\0" * (-len(data) % 4)


def write(path, data):
    path.write_bytes(data)
    return path


@contextlib.contextmanager
def opened(path):
    """A `RecordFile` of `path`, closed on leaving."""
    f = RecordFile(path)
    try:
        yield f
    finally:
        f.close()


def as_lists(pair):
    keys, offsets = pair
    assert keys.dtype == np.int64 and offsets.dtype == np.int64
    return keys.tolist(), offsets.tolist()


# --- parse_index ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "keys", "offsets"),
    [
        (b"0\t0\n1\t40\n2\t96\n", [0, 1, 2], [0, 40, 96]),
        (b"0\t0\n1\t40\n2\t96", [0, 1, 2], [0, 40, 96]),
        (b"", [], []),
        (b"7\t123456789012\n", [7], [123456789012]),
        (b"5\t0\n5\t16\n3\t32\n", [5, 5, 3], [0, 16, 32]),
        (b"0\t0\r\n1\t40\r\n", [0, 1], [0, 40]),
        (b"0\t0\textra\n1\t40\t7\t8\n", [0, 1], [0, 40]),
        (b"-3\t8\n+4\t12\n", [-3, 4], [8, 12]),
        (b" 1 \t 2 \n", [1], [2]),
        (b"9223372036854775807\t9223372036854775807\n", [2**63 - 1], [2**63 - 1]),
        (b"-9223372036854775808\t0\n", [-(2**63)], [0]),
    ],
    ids=[
        "normal",
        "no trailing newline",
        "empty",
        "offset beyond 32 bits",
        "duplicate keys kept in file order",
        "CRLF",
        "extra columns ignored, as MXNet does",
        "signed keys",
        "spaces around fields, as int() allows",
        "int64 max",
        "int64 min key",
    ],
)
def test_parse_index(text, keys, offsets):
    assert as_lists(parse_index(text)) == (keys, offsets)


def test_parse_index_large_contiguous():
    expected_offsets = [k * 1000 + 8 for k in range(250_000)]
    text = "".join(f"{k}\t{o}\n" for k, o in enumerate(expected_offsets)).encode()
    keys, offsets = parse_index(text)
    assert keys.tolist() == list(range(250_000))
    assert offsets.tolist() == expected_offsets


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (b"0\t0\n1\t40\nabc\t8\n3\t12\n", 3, "key and offset must be integers, got b'abc\\t8'"),
        (b"0\t0\n1\t4x\n", 2, "key and offset must be integers, got b'1\\t4x'"),
        # A whitespace-blind parser would pair these as (1, 2) and (3, 4).
        (b"1\t2\t3\n4\n", 2, "expected 'key<TAB>offset', got b'4'"),
        (b"0\t0\n\n1\t8\n", 2, "expected 'key<TAB>offset', got b''"),
        (b"0 0\n", 1, "expected 'key<TAB>offset', got b'0 0'"),
        (b"0\t\n", 1, "expected 'key<TAB>offset', got b'0\\t'"),
        (b"0\t0\n1\t-8\n", 2, "number out of range in b'1\\t-8'"),
        (b"9223372036854775808\t0\n", 1, "number out of range in b'9223372036854775808\\t0'"),
        (b"1\t9223372036854775808\n", 1, "number out of range in b'1\\t9223372036854775808'"),
        (
            b"1\t99999999999999999999999\n",
            1,
            "number out of range in b'1\\t99999999999999999999999'",
        ),
    ],
    ids=[
        "non-numeric key",
        "non-numeric offset",
        "1 tab 2 tab 3 / 4",
        "blank line",
        "space instead of tab",
        "missing offset",
        "negative offset",
        "key over int64",
        "offset over int64",
        "offset far over int64",
    ],
)
def test_parse_index_rejects_bad_lines(text, line, reason):
    with pytest.raises(IndexFormatError) as caught:
        parse_index(text, path="data/train.idx")
    assert caught.value.line == line
    assert caught.value.path == "data/train.idx"
    assert str(caught.value) == f"data/train.idx: line {line}: {reason}"


def test_parse_index_names_the_bad_line_deep_in_a_large_index():
    lines = [f"{k}\t{k * 64}\n" for k in range(200_000)]
    lines[123_456] = "123456\t7,9\n"
    with pytest.raises(IndexFormatError) as caught:
        parse_index("".join(lines).encode())
    assert caught.value.line == 123_457
    assert str(caught.value) == "line 123457: key and offset must be integers, got b'123456\\t7,9'"


NUMBERS = st.one_of(
    st.integers(0, 10**18), st.integers(0, 2**63 - 1), st.integers(0, 99), st.integers(0, 10**7)
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    pairs=st.lists(st.tuples(NUMBERS, NUMBERS), max_size=60),
    rising=st.booleans(),
    bad=st.one_of(st.none(), st.tuples(st.integers(0, 10**6), st.sampled_from(b"x \t\n-+,"))),
)
def test_parse_index_agrees_with_int_line_by_line(pairs, rising, bad):
    """Every parser path (runs of equal widths, the bulk one, the line one) gives int()'s answer."""
    if rising:
        pairs = sorted(pairs)
    text = bytearray(b"".join(b"%d\t%d\n" % pair for pair in pairs))
    if bad is not None and text:
        text[bad[0] % len(text)] = bad[1]
    expected = None
    try:
        whole = bytes(text) if text.endswith(b"\n") or not text else bytes(text) + b"\n"
        rows = [line.strip().split(b"\t") for line in whole.split(b"\n")[:-1]]
        expected = ([int(r[0]) for r in rows], [int(r[1]) for r in rows])
        if not all(0 <= o < 2**63 and -(2**63) <= k < 2**63 for k, o in zip(*expected)):
            expected = None
    except (ValueError, IndexError):
        pass
    if expected is None:
        with pytest.raises(IndexFormatError):
            parse_index(bytes(text))
    else:
        assert as_lists(parse_index(bytes(text))) == expected


def test_parse_index_runs_of_widths_as_a_pack_writes_them():
    # Keys and offsets rising through every digit count: the fast path's run boundaries.
    offsets = [0, *np.cumsum(np.arange(1, 3001) * 4099).tolist()]
    text = "".join(f"{k}\t{o}\n" for k, o in enumerate(offsets)).encode()
    assert as_lists(parse_index(text)) == (list(range(len(offsets))), offsets)
    bad = text.replace(b"\n2999\t", b"\n2999x\t")
    with pytest.raises(IndexFormatError) as caught:
        parse_index(bad)
    assert caught.value.line == 3000


def test_parse_index_runs_then_random_widths_then_a_bad_line():
    # A pack's run of rising lines, then keys of random widths (a shuffled im2rec .idx): the
    # rest after the runs is parsed in bulk, and a bad line there is named by its number.
    keys = list(range(2000)) + np.random.default_rng(3).permutation(10**6)[:5000].tolist()
    lines = [f"{k}\t{i * 64}\n" for i, k in enumerate(keys)]
    text = "".join(lines).encode()
    assert as_lists(parse_index(text)) == (keys, [i * 64 for i in range(len(keys))])
    lines[6000] = lines[6000].replace("\t", " \t-")
    with pytest.raises(IndexFormatError) as caught:
        parse_index("".join(lines).encode())
    assert caught.value.line == 6001


def test_index_errors_are_rectool_errors():
    assert issubclass(IndexFormatError, RecordFormatError)
    assert issubclass(RecordFormatError, RectoolError)
    assert errors.IndexFormatError is IndexFormatError
    assert errors.RecordFormatError is RecordFormatError
    assert errors.RectoolError is RectoolError


# --- load_index ----------------------------------------------------------------------------------

IDX_TEXT = b"0\t0\n1\t16\n2\t40\n"


def test_load_index_reads_the_idx_and_writes_nothing(tmp_path):
    idx = write(tmp_path / "a.idx", IDX_TEXT)
    assert as_lists(load_index(idx)) == ([0, 1, 2], [0, 16, 40])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.idx"]


def test_load_index_missing_file(tmp_path):
    with pytest.raises(RectoolError) as caught:
        load_index(tmp_path / "nope.idx")
    assert str(caught.value) == f"{tmp_path / 'nope.idx'}: index file not found"


def test_load_index_reports_the_path_of_a_bad_line(tmp_path):
    idx = write(tmp_path / "a.idx", b"0\t0\nx\t1\n")
    with pytest.raises(IndexFormatError) as caught:
        load_index(idx)
    assert (caught.value.path, caught.value.line) == (str(idx), 2)
    assert str(caught.value) == f"{idx}: line 2: key and offset must be integers, got b'x\\t1'"


# --- RecordFile: reading --------------------------------------------------------------------------

SPLIT = part(1, b"abcd") + part(2, b"efgh") + part(3, b"ij")  # "abcd" M "efgh" M "ij"


@pytest.fixture
def rec(tmp_path):
    """Records at 0 ("hello"), 16 (empty), 24 (split in three) and 60 ("xyzw")."""
    return write(tmp_path / "a.rec", part(0, b"hello") + part(0, b"") + SPLIT + part(0, b"xyzw"))


def test_read_at(rec):
    with opened(rec) as f:
        assert len(f.open()) == 72
        assert f.read_parts(0)[0] == b"hello"
        assert f.read_parts(16)[0] == b""
        assert f.read_parts(24)[0] == b"abcd" + MAGIC + b"efgh" + MAGIC + b"ij"
        assert f.read_parts(60)[0] == b"xyzw"
        assert [f.read_parts(o)[1] for o in (0, 16, 24, 60)] == [16, 24, 60, 72]


def test_iter_records(rec):
    with opened(rec) as f:
        assert list(iter_records(f)) == [
            (0, b"hello"),
            (16, b""),
            (24, b"abcd" + MAGIC + b"efgh" + MAGIC + b"ij"),
            (60, b"xyzw"),
        ]
        assert [offset for offset, _ in iter_records(f, 24)] == [24, 60]


def test_empty_rec_scans_to_nothing(tmp_path):
    with opened(write(tmp_path / "empty.rec", b"")) as f:
        assert len(f.open()) == 0
        assert list(iter_records(f)) == []


# --- RecordFile: errors ---------------------------------------------------------------------------


def assert_format_error(caught, path, offset, reason, key=None):
    error = caught.value
    assert type(error) is RecordFormatError
    assert (error.path, error.offset, error.key, error.reason) == (str(path), offset, key, reason)
    where = (
        f"{path}, key {key}, byte offset {offset}"
        if key is not None
        else f"{path}, byte offset {offset}"
    )
    assert str(error) == f"{where}: {reason}"


def check_error(path, offset, reason, start=None, readers=None):
    """Assert that reading at `start` (default `offset`), and a scan from 0, fail at `offset`."""
    start = offset if start is None else start
    for read in readers or [lambda f: f.read_parts(start)[0], lambda f: list(iter_records(f))]:
        with opened(path) as f, pytest.raises(RecordFormatError) as caught:
            read(f)
        assert_format_error(caught, path, offset, reason)


def test_bad_magic(tmp_path):
    path = write(tmp_path / "a.rec", part(0, b"abcd") + b"\xde\xad\xbe\xef" + part(0, b"x")[4:])
    check_error(path, 12, "bad magic 0xefbeadde (expected 0xced7230a)")


def test_truncated_part_header(tmp_path):
    path = write(tmp_path / "a.rec", part(0, b"abcd") + MAGIC + b"\x04\x00")
    check_error(path, 12, "record cut short: expected a part header, found a truncated part header")


def test_length_running_past_end_of_file(tmp_path):
    path = write(tmp_path / "a.rec", part(0, b"abcd") + part(0, b"0123456789", length=100))
    check_error(path, 12, "record cut short: a part of 100 bytes runs past the end of the file")


def test_last_record_without_its_padding(tmp_path):
    # dmlc reads a part with its padding and fails when the file ends first; so do both our paths.
    path = write(tmp_path / "a.rec", part(0, b"abcd") + part(0, b"hello")[:-3])
    check_error(path, 12, "record cut short: a part of 5 bytes runs past the end of the file")


def test_length_past_end_of_file_in_a_later_part(tmp_path):
    path = write(tmp_path / "a.rec", part(1, b"abcd") + part(3, b"xy", length=64))
    check_error(
        path, 12, "record cut short: a part of 64 bytes runs past the end of the file", start=0
    )


def test_split_record_cut_after_its_first_part(tmp_path):
    path = write(tmp_path / "a.rec", part(1, b"abcd"))
    check_error(
        path, 12, "record cut short: expected a part header, found the end of the file", start=0
    )


def test_split_record_continued_by_a_new_record(tmp_path):
    path = write(tmp_path / "a.rec", part(1, b"abcd") + part(0, b"efgh"))
    reason = "part has continuation flag 0 (expected 2 or 3: a split record goes on)"
    check_error(path, 12, reason, start=0)


@pytest.mark.parametrize("offset", [1, 2, 3, 14])
def test_offset_not_aligned(rec, offset):
    check_error(
        rec,
        offset,
        "not a record start (a negative or not 4-byte aligned offset)",
        readers=[lambda f: f.read_parts(offset)[0], lambda f: f.read_parts(offset)[1]],
    )


@pytest.mark.parametrize(("offset", "cflag"), [(36, 2), (48, 3)])
def test_offset_inside_a_split_record(rec, offset, cflag):
    check_error(
        rec,
        offset,
        f"part has continuation flag {cflag} (expected 0 or 1: a record starts)",
        readers=[lambda f: f.read_parts(offset)[0], lambda f: list(iter_records(f, offset))],
    )


@pytest.mark.parametrize("offset", [4, 20, 28])
def test_offset_inside_a_record(rec, offset):
    with opened(rec) as f, pytest.raises(RecordFormatError) as caught:
        f.read_parts(offset)[0]
    assert caught.value.offset == offset
    assert caught.value.reason.startswith("bad magic 0x")


def test_offset_at_end_of_file(rec):
    check_error(
        rec,
        72,
        "record cut short: expected a part header, found the end of the file",
        readers=[lambda f: f.read_parts(72)[0]],
    )


@pytest.mark.parametrize("offset", [76, 80, 1 << 40])
def test_offset_past_the_end_of_the_file(rec, offset):
    check_error(
        rec,
        offset,
        "record cut short: expected a part header, found the end of the file",
        readers=[lambda f: f.read_parts(offset)[0]],
    )


@pytest.mark.parametrize("offset", [-4, -72, -(1 << 40)])
def test_negative_offset(rec, offset):
    check_error(
        rec,
        offset,
        "not a record start (a negative or not 4-byte aligned offset)",
        readers=[lambda f: f.read_parts(offset)[0]],
    )


def test_missing_record_file(tmp_path):
    with pytest.raises(RectoolError) as caught:
        RecordFile(tmp_path / "nope.rec").read_parts(0)[0]
    assert str(caught.value) == f"{tmp_path / 'nope.rec'}: record file not found"


# --- unpack_header --------------------------------------------------------------------------------


def test_unpack_header_scalar():
    record = struct.pack("<IfQQ", 0, 2.5, 7, 2**64 - 1) + b"JPEG"
    header, image = unpack_header(record)
    assert header == (0, 2.5, 7, 2**64 - 1)
    assert image == b"JPEG"


def test_unpack_header_vector():
    record = struct.pack("<IfQQ3f", 3, 0.0, 1, 2, 1.0, -2.5, 1e20) + b"img"
    header, image = unpack_header(record)
    assert (header.flag, header.id, header.id2) == (3, 1, 2)
    assert header.label.dtype == np.float32
    assert header.label.tolist() == [1.0, -2.5, float(np.float32(1e20))]
    assert image == b"img"


def test_unpack_header_too_short():
    with pytest.raises(RecordFormatError) as caught:
        unpack_header(b"\0" * 23, path="a.rec", offset=96)
    assert str(caught.value) == (
        "a.rec, byte offset 96: record of 23 bytes, too short for its 24-byte image header"
    )


def test_unpack_header_labels_past_the_end():
    record = struct.pack("<IfQQ", 3, 0.0, 0, 0) + b"\0" * 11
    with pytest.raises(RecordFormatError) as caught:
        unpack_header(record, path="a.rec", offset=8)
    assert str(caught.value) == (
        "a.rec, byte offset 8: record of 35 bytes, too short for its 24-byte image header "
        "and 3 float32 labels"
    )


# --- IndexedRecordFile ----------------------------------------------------------------------------


def indexed(tmp_path, records, idx_lines, name="a"):
    """Write `records` back to back and an .idx of `idx_lines` (key, record number) pairs."""
    data, offsets = b"", []
    for payload in records:
        offsets.append(len(data))
        data += part(0, payload)
    rec = write(tmp_path / f"{name}.rec", data)
    text = "".join(f"{key}\t{offsets[i]}\n" for key, i in idx_lines)
    idx = write(tmp_path / f"{name}.idx", text.encode())
    return rec, idx


def test_read_contiguous_keys(tmp_path):
    rec, idx = indexed(tmp_path, [b"r10", b"r11", b"r12"], [(10, 0), (11, 1), (12, 2)])
    with IndexedRecordFile(rec) as f:  # the .idx is found next to the .rec
        assert f.idx_path == str(idx)
        assert len(f) == 3
        assert [f.read(k) for k in (12, 10, 11)] == [b"r12", b"r10", b"r11"]
        assert f.read(np.int64(11)) == b"r11"
        assert [f.read_at_position(i) for i in range(3)] == [b"r10", b"r11", b"r12"]
        for key in (9, 13, -1):
            with pytest.raises(RectoolError) as caught:
                f.read(key)
            assert str(caught.value) == f"{idx}: key {key} is not in the index"


def test_read_sparse_keys(tmp_path):
    rec, idx = indexed(tmp_path, [b"a", b"b", b"c"], [(17, 1), (3, 0), (1000000, 2)])
    with IndexedRecordFile(rec, idx) as f:
        assert f.keys.tolist() == [17, 3, 1000000]
        assert [f.read(3), f.read(17), f.read(1000000)] == [b"a", b"b", b"c"]
        assert f.read_at_position(0) == b"b"
        with pytest.raises(RectoolError) as caught:
            f.read(4)
        assert str(caught.value) == f"{idx}: key 4 is not in the index"


@pytest.mark.parametrize(
    "keys",
    [
        [2**63 - 1, -(2**63)],  # would look contiguous in wrapping int64 arithmetic
        [2**63 - 2, 2**63 - 1, -(2**63)],
        [2**63 - 1, 5],
        [2**63 - 2, 2**63 - 1],  # contiguous, up to the last int64
        [-(2**63), -(2**63) + 1],
    ],
)
def test_keys_at_the_ends_of_int64(tmp_path, keys):
    rec, idx = indexed(tmp_path, [b"r0", b"r1", b"r2"][: len(keys)], list(zip(keys, range(3))))
    with IndexedRecordFile(rec, idx) as f:
        assert [f.read(k) for k in keys] == [b"r0", b"r1", b"r2"][: len(keys)]
        with pytest.raises(RectoolError):
            f.read(0)


def test_duplicate_keys_take_the_last_offset(tmp_path):
    rec, idx = indexed(tmp_path, [b"first", b"second", b"other"], [(5, 0), (6, 2), (5, 1)])
    with IndexedRecordFile(rec, idx) as f:
        assert len(f) == 3
        assert f.read(5) == b"second"
        assert f.read(6) == b"other"


def test_index_offset_that_is_not_a_record_start(tmp_path):
    rec = write(tmp_path / "a.rec", part(0, b"hello") + part(0, b"world"))
    idx = write(tmp_path / "a.idx", b"0\t0\n1\t8\n2\t18\n")
    with IndexedRecordFile(rec, idx) as f:
        assert f.read(0) == b"hello"
        with pytest.raises(RecordFormatError) as caught:
            f.read(1)
        assert_format_error(caught, rec, 8, "bad magic 0x6c6c6568 (expected 0xced7230a)", key=1)
        with pytest.raises(RecordFormatError) as caught:
            f.read_at_position(2)
        assert_format_error(
            caught, rec, 18, "not a record start (a negative or not 4-byte aligned offset)", key=2
        )


# --- processes and file descriptors ---------------------------------------------------------------


def test_pickled_record_file_reads_after_unpickling(rec):
    with opened(rec) as f:
        assert f.read_parts(0)[0] == b"hello"  # mapped before pickling
        clone = pickle.loads(pickle.dumps(f))
    assert clone.path == str(rec)
    assert clone.read_parts(60)[0] == b"xyzw"
    clone.close()


def test_pickled_indexed_record_file_reads_after_unpickling(tmp_path):
    rec, idx = indexed(tmp_path, [b"a", b"b", b"c"], [(17, 1), (3, 0), (9, 2)])
    with IndexedRecordFile(rec, idx) as f:
        assert f.read(3) == b"a"  # mapping open and lookup table built before pickling
        blob = pickle.dumps(f)
    idx.unlink()  # the index travels inside the pickle
    with pickle.loads(blob) as clone:
        assert [clone.read(9), clone.read(17), clone.read(3)] == [b"c", b"b", b"a"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_reads(tmp_path):
    rec, idx = indexed(tmp_path, [b"zero", b"one", b"two"], [(0, 0), (1, 1), (2, 2)])
    with IndexedRecordFile(rec, idx) as f:
        assert f.read(0) == b"zero"  # the parent's mapping exists before the fork
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: report through the pipe, never return into pytest
            status = 1
            try:
                os.close(read_end)
                got = [f.read(2), f.read(1), f.read(0)]
                os.write(write_end, repr(got).encode())
                f.close()
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            reported = pipe.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert reported == repr([b"two", b"one", b"zero"]).encode()
        assert f.read(1) == b"one"  # the child closing its copy left the parent's intact


def open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_no_descriptor_leaks(tmp_path):
    rec, idx = indexed(tmp_path, [b"a", b"b"], [(0, 0), (1, 1)])
    before = open_fds()
    for _ in range(20):
        with IndexedRecordFile(rec, idx) as f:
            assert f.read(1) == b"b"
            assert open_fds() > before
        assert open_fds() == before
        f = RecordFile(rec)
        assert list(iter_records(f)) == [(0, b"a"), (12, b"b")]
        f.close()
        f.close()  # closing twice is harmless
        assert open_fds() == before
        assert f.read_parts(12)[0] == b"b"  # a closed file reopens on the next read
        f.close()
        assert open_fds() == before


def test_threads_reading_a_fresh_record_file_at_once(tmp_path):
    # Each thread's first read maps the file; a second mapping must not close the first
    # under a thread that is reading it (it did: TypeError from a None mapping).
    import threading

    records = [bytes([n]) * (n + 1) for n in range(64)]
    path = write(tmp_path / "a.rec", b"".join(part(0, r) for r in records))
    offsets, offset = [], 0
    for r in records:
        offsets.append(offset)
        offset += 8 + len(r) + (-len(r) % 4)
    for _ in range(200):
        rec = RecordFile(path)
        start = threading.Barrier(8)
        errors_seen = []

        def read(rec=rec, start=start, errors_seen=errors_seen):
            start.wait()
            try:
                for n in range(len(records)):
                    assert rec.read_parts(offsets[n])[0] == records[n]
            except Exception as exc:  # reported below, in the test's thread
                errors_seen.append(exc)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rec.close()
        assert errors_seen == []


# --- record_heads: the one bulk read of records' first words ------------------------------------


def _part(cflag, payload):
    """One dmlc part, built by hand: magic, lrec, payload, zero padding to 4 bytes."""
    lrec = cflag << 29 | len(payload)
    return struct.pack("<II", 0xCED7230A, lrec) + payload + b"\0" * (-len(payload) % 4)


def test_record_heads_takes_whole_records_only():
    image_header = struct.pack("<IfQQ", 0, 7.0, 1, 0)
    two_labels = struct.pack("<IfQQ", 2, 0.0, 2, 0) + struct.pack("<ff", 3.0, 4.0)
    short_labels = struct.pack("<IfQQ", 5, 0.0, 3, 0)  # 5 labels announced, none there
    parts = [
        _part(0, image_header + b"abc"),  # whole, scalar label
        _part(0, two_labels + b"xy"),  # whole, two labels
        _part(0, short_labels),  # announces more labels than it holds
        _part(1, image_header),  # the first part of a split record
        _part(3, b"tail"),
        _part(0, image_header + b"cut")[:-8],  # runs past the end of the file
    ]
    starts = [sum(map(len, parts[:i])) for i in range(len(parts))]
    assert starts == [0, 36, 80, 112, 144, 156]  # 8 + payload, padded to 4: by hand
    data = b"".join(parts)
    words = np.frombuffer(data[: len(data) // 4 * 4], "<u4")
    offsets = [*starts[:3], starts[3], starts[5], 2, -4, 10_000]
    ok, w, heads = headers.record_heads(words, len(data), offsets)
    assert ok.tolist() == [True, True, False, False, False, False, False, False]
    assert w[:2].tolist() == [0, 9]
    assert heads[0].tolist() == [
        0xCED7230A,
        24 + 3,
        0,
        struct.unpack("<I", struct.pack("<f", 7.0))[0],
    ]
    assert heads[1, 2] == 2


def test_record_heads_refuses_a_record_shorter_than_the_image_header():
    image_header = struct.pack("<IfQQ", 0, 7.0, 1, 0)
    data = _part(0, b"\0" * 20) + _part(0, image_header)  # 20 bytes: no room for 24
    assert len(data) == 60
    words = np.frombuffer(data, "<u4")
    ok, _, heads = headers.record_heads(words, len(data), [0, 28])
    assert ok.tolist() == [False, True] and heads[1, 1] == 24


def test_record_heads_of_a_file_too_small_for_a_record():
    ok, w, heads = headers.record_heads(np.zeros(2, "<u4"), 8, [0, 4])
    assert ok.tolist() == [False, False] and heads.shape == (2, 4)


def test_bulk_header_reads_go_through_record_heads():
    """labels and repack's copier read header words in bulk through `record_heads` only: the
    strided view of a file's words exists once (there were four header-word gathers)."""
    import pathlib

    package = pathlib.Path(reader.__file__).parent
    users = sorted(
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if "as_strided" in p.read_text(encoding="utf-8")
    )
    assert users == ["format/headers.py"]
    source = (package / "format" / "headers.py").read_text(encoding="utf-8")
    assert source.count("as_strided") == 1
    assert "record_heads(" in (package / "repack" / "copier.py").read_text(encoding="utf-8")
