"""The `.idx` text parsed a block at a time (`format/textindex.parse_index_stream`): what
`rectool index` and the package read a foreign pack's index with, the same as one parse."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rectool.format.textindex import IndexFormatError, parse_index, parse_index_stream

LINES = st.one_of(
    st.tuples(st.integers(0, 10**12), st.integers(0, 10**12)).map(lambda p: f"{p[0]}\t{p[1]}\n"),
    st.sampled_from(["x\t1\n", "1\n", "\n", "1\t-2\n", "1 2\n", "99999999999999999999\t1\n"]),
)


def _parsed(parse):
    try:
        keys, offsets = parse()
        return keys.tolist(), offsets.tolist()
    except IndexFormatError as exc:
        return str(exc), exc.line


@settings(max_examples=200, deadline=None)
@given(
    good=st.lists(st.integers(0, 10**6), max_size=40),
    bad=st.lists(LINES, max_size=6),
    at=st.integers(0, 40),
    block=st.integers(1, 64),
    last_newline=st.booleans(),
)
def test_the_streaming_parse_equals_the_one_shot_parse(good, bad, at, block, last_newline):
    lines = [f"{k}\t{k * 16}\n" for k in good]
    lines[at:at] = bad
    text = "".join(lines).encode()
    text = text if last_newline or not text.endswith(b"\n") else text[:-1]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "a.idx")
        with open(path, "wb") as f:
            f.write(text)
        with open(path, "rb") as f:
            streamed = _parsed(lambda: parse_index_stream(f, path, block=block))
    assert streamed == _parsed(lambda: parse_index(text, path))


def test_the_streaming_parse_names_the_file_and_line_in_a_later_block(tmp_path):
    idx = tmp_path / "a.idx"
    idx.write_bytes(b"".join(b"%d\t%d\n" % (k, 16 * k) for k in range(1000)) + b"7\tx\n")
    with open(idx, "rb") as f, pytest.raises(IndexFormatError) as caught:
        parse_index_stream(f, str(idx), block=100)
    assert str(caught.value) == f"{idx}: line 1001: key and offset must be integers, got b'7\\tx'"
