"""Reading .lst files: the block-at-a-time reader gives what line-by-line parsing gives."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rectool.packer.listfile as listfile
from rectool.packer.listfile import ListFormatError, iter_list, parse_list_line

names = st.text(
    st.characters(blacklist_characters="\t\n\r\0", blacklist_categories=["Cs"]), min_size=1
)
labels = st.one_of(st.integers(-5, 10**6).map(str), st.floats(-1e30, 1e30).map(repr))
lines = st.tuples(st.integers(0, 10**9), st.lists(labels, min_size=1, max_size=3), names).map(
    lambda t: "\t".join([str(t[0]), *t[1], t[2]])
)


@given(st.lists(lines, max_size=40), st.integers(1, 64), st.booleans(), st.booleans())
def test_blocks_give_what_lines_give(rows, read_chars, final_newline, crlf):
    end = "\r\n" if crlf else "\n"
    text = end.join(rows) + (end if final_newline and rows else "")
    expected = [parse_list_line(line, "l", n) for n, line in enumerate(rows, 1)]
    saved = listfile._READ_CHARS
    listfile._READ_CHARS = read_chars  # lines cut across blocks everywhere
    try:
        got = list(iter_list(io.StringIO(text, newline=""), "l"))
    finally:
        listfile._READ_CHARS = saved
    assert got == expected
    assert [type(item) for item in got] == [listfile.ListItem] * len(got)


plain_labels = st.from_regex(r"[-+]?(?:[0-9]{1,7}(?:\.[0-9]*)?|\.[0-9]+)", fullmatch=True)
plain_lines = st.tuples(st.integers(0, 10**18 - 1), plain_labels, names).map(
    lambda t: f"{t[0]}\t{t[1]}\t{t[2]}"
)


@given(st.lists(plain_lines, min_size=1, max_size=40))
def test_plain_blocks_parse_to_what_lines_give(rows):
    # Blocks of ordinary lines skip the line-by-line checks: they must give the same items.
    expected = [parse_list_line(line, "l", n) for n, line in enumerate(rows, 1)]

    def unused(*args):
        raise AssertionError("a plain block parsed line by line")

    saved = listfile._parse_lines, listfile._PLAIN_CHUNK
    listfile._parse_lines, listfile._PLAIN_CHUNK = unused, 3  # chunks cut everywhere
    try:
        got = list(iter_list(io.StringIO("\n".join(rows) + "\n", newline=""), "l"))
    finally:
        listfile._parse_lines, listfile._PLAIN_CHUNK = saved
    assert got == expected
    assert [type(item) for item in got] == [listfile.ListItem] * len(got)
    assert [type(item.labels[0]) for item in got] == [float] * len(got)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0\t1\ta.jpg\n\n2\t1\tb.jpg\n", "l: line 2: expected"),
        ("0\t1\ta.jpg\n1\tx\tb.jpg\n", r"l: line 2: labels \['x'\] are not numbers"),
        ("0\t1\ta.jpg\n1\t1e39\tb.jpg\n", "l: line 2: labels .* do not fit a float32"),
        ("0\t1\ta\0.jpg\n", "l: line 1: the image path holds a NUL character"),
        ("0\t1\ta.jpg\n1\t1\t", "l: line 2: the image path is empty"),
    ],
)
def test_bad_lines_are_named(text, message):
    with pytest.raises(ListFormatError, match=message):
        list(iter_list(io.StringIO(text, newline=""), "l"))


@given(st.lists(st.tuples(st.integers(0, 10**18 - 1), st.integers(0, 3)), min_size=1), names)
def test_line_indices_are_the_leading_numbers_of_lines(rows, name):
    from rectool.packer.listcheck import line_indices

    # Indices written with leading zeros as well (`zeros`), as a list may hold them.
    fields = [f"{'0' * zeros}{index}" for index, zeros in rows]
    data = "".join(f"{field}\t1\t{name}\n" for field in fields).encode("utf-8")
    got = line_indices(data)
    if max(map(len, fields)) > 18:
        assert got is None  # left to the line-by-line check
    else:
        assert got.dtype == "int64" and got.tolist() == [index for index, _ in rows]


def test_line_indices_leave_long_numbers_to_the_line_by_line_check():
    from rectool.packer.listcheck import line_indices

    assert line_indices(b"1\t0\ta\n" + b"1" * 19 + b"\t0\tb\n") is None
    assert line_indices(b"1\t0\ta\n" + b"9" * 18 + b"\t0\tb\n").tolist() == [1, 10**18 - 1]


# -- the list check, fed as a stream ---------------------------------------------------------


def _check_result(data, sizes, layout="images"):
    """Feed `data` to a `ListCheck` in blocks of `sizes` (cycled); return its answer or error."""
    from rectool.errors import RectoolError
    from rectool.packer.listcheck import ListCheck

    check = ListCheck("l", layout)
    at, k = 0, 0
    try:
        while at < len(data):
            size = sizes[k % len(sizes)]
            check.feed(data[at : at + size])
            at, k = at + size, k + 1
        return check.end()
    except RectoolError as exc:
        return str(exc)


index_lines = st.lists(
    st.tuples(st.integers(0, 40), st.sampled_from(["0", "1.5", "x", "1e-50", "2"])),
    max_size=30,
)


@given(index_lines, st.lists(st.integers(1, 50), min_size=1, max_size=5))
def test_a_list_check_answers_the_same_whatever_the_blocks(rows, sizes):
    data = "".join(f"{index}\t{label}\ta/{n}.jpg\n" for n, (index, label) in enumerate(rows))
    data = data.encode("utf-8")
    assert _check_result(data, sizes) == _check_result(data, [len(data) + 1])


def test_an_index_repeated_in_a_later_block_is_named(tmp_path):
    from rectool.packer.listcheck import validate_list

    lst = tmp_path / "dup.lst"
    rows = "".join(f"{i}\t0\ta/{i}.jpg\n" for i in range(100_000))  # 1.9 MB: several blocks
    lst.write_text(rows + "5\t0\ta/again.jpg\n", encoding="utf-8")
    with pytest.raises(ListFormatError, match=r"dup.lst: line 100001: index 5 appears twice"):
        validate_list(str(lst), "images")
