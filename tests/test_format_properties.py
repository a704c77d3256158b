"""Round-trip properties of the format core: framing, image headers and .idx text.

Expected values come from FORMAT-NOTES §1-3 (a framing decoder and an MXNet-style .idx parser
written here), from `struct`, or from the generated input itself, never from rectool.
"""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rectool.format.headers import unpack_header
from rectool.format.records import IndexedRecordFile, iter_records
from rectool.format.textindex import IndexFormatError, parse_index
from rectool.format.writer import (
    format_index_line,
    frame_record,
    pack_image_record,
)
from rectool.packer.writers import IndexedRecordWriter, RecordWriter
from rectool.reader import RecordFile

M = b"\x0a\x23\xd7\xce"  # the magic 0xced7230a as it lies in the file

PROPERTY = settings(max_examples=200, deadline=None)
# Each example overwrites the same files, so sharing one tmp_path between examples is safe.
WITH_FILES = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@st.composite
def spliced(draw, min_size=0, max_size=64):
    """Bytes with the magic written over or inserted at aligned and unaligned offsets."""
    data = bytearray(draw(st.binary(min_size=min_size, max_size=max_size)))
    for _ in range(draw(st.integers(0, 4))):
        pos = draw(st.integers(0, len(data)))
        if draw(st.booleans()):
            pos -= pos % 4
        if draw(st.booleans()):
            data[pos:pos] = M
        else:
            data[pos : pos + 4] = M
    return bytes(data)


payloads = st.one_of(
    spliced(),
    # Runs of magics and short chunks: zero-length parts, magics back to back and at the end.
    st.lists(st.one_of(st.just(M), st.binary(max_size=9)), max_size=8).map(b"".join),
    spliced(min_size=1000, max_size=5000),
)


def decode_parts(framed):
    """Split framed bytes into (cflag, data) parts, checking magic and zero padding (§1)."""
    parts, pos = [], 0
    while pos < len(framed):
        assert framed[pos : pos + 4] == M
        (lrec,) = struct.unpack_from("<I", framed, pos + 4)
        cflag, length = lrec >> 29, lrec & (2**29 - 1)
        pad = -length % 4
        parts.append((cflag, framed[pos + 8 : pos + 8 + length]))
        assert framed[pos + 8 + length : pos + 8 + length + pad] == b"\0" * pad
        pos += 8 + length + pad
    assert pos == len(framed)
    return parts


@PROPERTY
@given(payloads)
@example(M)
@example(M + M + M)
@example(b"abc" + M + b"d" + M)
def test_framing_splits_at_every_aligned_magic(payload):
    parts = decode_parts(frame_record(payload))
    cuts = [i for i in range(0, len(payload) - 3, 4) if payload[i : i + 4] == M]
    if cuts:
        assert [flag for flag, _ in parts] == [1] + [2] * (len(cuts) - 1) + [3]
    else:
        assert [flag for flag, _ in parts] == [0]
    starts = [0] + [cut + 4 for cut in cuts]
    ends = cuts + [len(payload)]
    assert [data for _, data in parts] == [payload[s:e] for s, e in zip(starts, ends)]
    assert M.join(data for _, data in parts) == payload


@WITH_FILES
@given(st.lists(payloads, max_size=8))
def test_records_read_back_by_scan_and_read_at(tmp_path, records):
    path = tmp_path / "p.rec"
    offsets = []
    with RecordWriter(path) as w:
        for payload in records:
            offsets.append(w.tell())
            w.write(payload)
        end = w.tell()
    with contextlib.closing(RecordFile(path)) as f:
        assert len(f.open()) == end == path.stat().st_size
        assert end % 4 == 0
        assert list(iter_records(f)) == list(zip(offsets, records))
        for offset, payload in zip(offsets, records):
            assert f.read_parts(offset)[0] == payload
        assert [f.read_parts(offset)[1] for offset in offsets] == (offsets + [end])[1:]


@st.composite
def keyed_payloads(draw):
    """(key, payload) pairs: contiguous keys, or arbitrary int64 keys with duplicates."""
    records = draw(st.lists(payloads, max_size=8))
    if draw(st.booleans()):
        first = draw(st.integers(-5, 5))
        keys = list(range(first, first + len(records)))
    else:
        key = st.one_of(st.integers(0, 4), st.integers(-(2**63), 2**63 - 1))
        keys = draw(st.lists(key, min_size=len(records), max_size=len(records)))
    return list(zip(keys, records))


@WITH_FILES
@given(keyed_payloads())
def test_indexed_records_read_back_by_key(tmp_path, items):
    rec, idx = tmp_path / "p.rec", tmp_path / "p.idx"
    with IndexedRecordWriter(rec, idx) as w:
        for key, payload in items:
            w.write(key, payload)
    last = dict(items)  # a later duplicate replaces an earlier one, as in MXNet
    with IndexedRecordFile(rec, idx) as f:
        assert f.keys.tolist() == [key for key, _ in items]
        for key, payload in last.items():
            assert f.read(key) == payload
        for i, (_, payload) in enumerate(items):
            assert f.read_at_position(i) == payload


# --- image headers -------------------------------------------------------------------------------

float32s = st.floats(width=32, allow_nan=False, allow_infinity=False)
u64s = st.integers(0, 2**64 - 1)
images = st.one_of(st.binary(max_size=64), spliced())


@PROPERTY
@given(images, float32s, u64s, u64s)
@example(b"", -0.0, 0, 0)
def test_scalar_label_round_trip(image, label, id1, id2):
    record = pack_image_record(image, label, id1, id2)
    assert record == struct.pack("<IfQQ", 0, label, id1, id2) + image
    header, body = unpack_header(record)
    assert header.flag == 0
    assert struct.pack("<f", header.label) == struct.pack("<f", label)  # -0.0 keeps its sign
    assert (header.id, header.id2, body) == (id1, id2, image)


@PROPERTY
@given(images, st.integers(-(2**24), 2**24), u64s)
def test_integer_label_round_trip(image, label, id1):
    header, body = unpack_header(pack_image_record(image, label, id1))
    assert (header.flag, header.label, header.id, header.id2, body) == (0, label, id1, 0, image)


@PROPERTY
@given(images, st.lists(float32s, min_size=1, max_size=16), st.booleans(), u64s, u64s)
def test_vector_label_round_trip(image, labels, as_array, id1, id2):
    label = np.array(labels, np.float32) if as_array else labels
    record = pack_image_record(image, label, id1, id2)
    n = len(labels)
    assert record == struct.pack(f"<IfQQ{n}f", n, 0.0, id1, id2, *labels) + image
    header, body = unpack_header(record)
    assert (header.flag, header.id, header.id2, body) == (n, id1, id2, image)
    assert header.label.dtype == np.float32
    assert header.label.tobytes() == struct.pack(f"<{n}f", *labels)


@WITH_FILES
@given(st.lists(st.tuples(images, st.one_of(float32s, st.lists(float32s, min_size=1)))))
def test_image_records_through_a_file(tmp_path, items):
    path = tmp_path / "img.rec"
    with RecordWriter(path) as w:
        for key, (image, label) in enumerate(items):
            w.write(pack_image_record(image, label, key))
    with contextlib.closing(RecordFile(path)) as f:
        got = [unpack_header(record) for _, record in iter_records(f)]
    assert len(got) == len(items)
    for key, ((header, body), (image, label)) in enumerate(zip(got, items)):
        assert (header.id, body) == (key, image)
        if isinstance(label, list):
            assert header.label.tolist() == label
        else:
            assert header.flag == 0 and header.label == label


# --- .idx text -----------------------------------------------------------------------------------

keys = st.one_of(st.integers(0, 10**7), st.integers(-(2**63), 2**63 - 1))
offsets = st.one_of(st.integers(0, 10**12), st.integers(0, 2**63 - 1))


@PROPERTY
@given(
    st.lists(st.tuples(keys, offsets), max_size=50), st.sampled_from(["\n", "\r\n"]), st.booleans()
)
def test_index_text_round_trip(pairs, newline, final_newline):
    lines = [format_index_line(key, offset) for key, offset in pairs]
    assert lines == [f"{key}\t{offset}\n" for key, offset in pairs]
    text = "".join(lines).replace("\n", newline)
    if not final_newline:
        text = text.removesuffix(newline)
    parsed_keys, parsed_offsets = parse_index(text.encode("ascii"))
    assert parsed_keys.tolist() == [key for key, _ in pairs]
    assert parsed_offsets.tolist() == [offset for _, offset in pairs]


def mxnet_parse(text):
    """Parse .idx text as MXNet 1.9.1's MXIndexedRecordIO.open does, plus rectool's int64 limits.

    Returns (keys, offsets), or the 1-based number of the first line rectool must reject.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    parsed_keys, parsed_offsets = [], []
    for number, line in enumerate(lines, start=1):
        fields = line.strip().split("\t")
        try:
            key, offset = int(fields[0]), int(fields[1])
        except (IndexError, ValueError):
            return number
        if not (-(2**63) <= key < 2**63 and 0 <= offset < 2**63):
            return number
        parsed_keys.append(key)
        parsed_offsets.append(offset)
    return parsed_keys, parsed_offsets


near_limits = st.integers(2**63 - 3, 2**63 + 3) | st.integers(-(2**63) - 3, -(2**63) + 3)
fields = st.one_of(
    st.integers(0, 10**6).map(str),
    st.integers(0, 10**25).map(str),
    near_limits.map(str),
    st.text(alphabet="0123456789\t -+", max_size=6),
)
index_lines = st.one_of(
    st.tuples(st.integers(0, 10**6), st.integers(0, 10**9)).map(lambda p: f"{p[0]}\t{p[1]}"),
    st.lists(fields, min_size=1, max_size=3).map("\t".join),
)


@PROPERTY
@given(st.lists(index_lines, max_size=12), st.sampled_from(["\n", "\r\n"]), st.booleans())
@example(["1\t2\t3", "4"], "\n", True)
@example(["1\t9223372036854775808"], "\n", True)
def test_index_parsing_agrees_with_mxnet(lines, newline, final_newline):
    text = newline.join(lines) + (newline if final_newline and lines else "")
    expected = mxnet_parse(text)
    if isinstance(expected, int):
        with pytest.raises(IndexFormatError) as caught:
            parse_index(text.encode("ascii"))
        assert caught.value.line == expected
    else:
        parsed_keys, parsed_offsets = parse_index(text.encode("ascii"))
        assert (parsed_keys.tolist(), parsed_offsets.tolist()) == expected
