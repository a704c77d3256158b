"""Issue 36: a list on standard input is checked as it streams (`packer/listcheck.py`).

`yes | rectool pack - ROOT out` copied stdin to disk and never ended; `< /dev/zero` spun
forever; non-UTF-8 bytes ended in a `UnicodeEncodeError` traceback. A list read from `-` now
goes through the checks of a list file, a block at a time as it arrives: the first bad line
stops rectool as it would in a file, with the same message (naming "standard input"), and at
most `MAX_STDIN_LIST_BYTES` are staged. Each stream below would never end: the test ends
because rectool stops reading (the writer gets a broken pipe long before its byte cap).
"""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys

import pytest

from rectool.errors import InputError, RectoolError

# What the writer sends at most before it gives up on rectool stopping: a fixed rectool reads
# a block or two (up to 2 MiB), today's main copied all of it.
CAP = 64 << 20
CHUNK = 1 << 16


def pack_from_endless_stdin(tmp_path, head, repeated, *flags):
    """Run `rectool pack - ROOT OUT` fed `head`, then `repeated` again and again; return
    (whether rectool stopped reading before CAP, exit status, stderr)."""
    root = tmp_path / "faces"
    (root / "a").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rectool",
            "pack",
            "-",
            str(root),
            str(tmp_path / "out" / "p"),
            "-q",
            *flags,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    block = repeated * max(1, CHUNK // len(repeated))
    written, stopped = 0, False
    try:
        proc.stdin.write(head)
        while written < CAP:
            proc.stdin.write(block)
            written += len(block)
        proc.stdin.close()
    except BrokenPipeError:
        stopped = True
    if not stopped:
        proc.kill()
    err = proc.stderr.read().decode("utf-8", "replace")
    status = proc.wait()
    try:
        proc.stdin.close()
    except BrokenPipeError:
        pass
    return stopped, status, err


def pack_file(tmp_path, data):
    root = tmp_path / "faces"
    (root / "a").mkdir(parents=True, exist_ok=True)
    lst = tmp_path / "given.lst"
    lst.write_bytes(data)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rectool",
            "pack",
            str(lst),
            str(root),
            str(tmp_path / "fout" / "p"),
            "-q",
        ],
        capture_output=True,
        text=True,
    )
    return result.returncode, result.stderr.replace(str(lst), "standard input")


def test_yes_into_pack_stops_at_the_first_line_as_a_file_does(tmp_path):
    stopped, status, err = pack_from_endless_stdin(tmp_path, b"", b"y\n")
    assert stopped, "rectool kept reading a list whose first line is bad"
    assert err == "Error: standard input: line 1: expected 'index<TAB>label<TAB>path', got 'y'\n"
    assert (status, err) == pack_file(tmp_path, b"y\n" * 1000)
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir())  # nothing staged is left


def test_dev_zero_into_pack_is_refused_as_no_list_line(tmp_path):
    stopped, status, err = pack_from_endless_stdin(tmp_path, b"", b"\0" * CHUNK)
    assert stopped, "rectool kept reading a stream without a newline"
    assert err == (
        "Error: standard input: line 1: over 1,048,576 bytes without a newline: not a list line\n"
    )
    assert (status, err) == pack_file(tmp_path, b"\0" * (3 << 20))


def test_a_bad_line_after_good_ones_stops_where_it_arrives(tmp_path):
    good = b"".join(b"%d\t0\ta/%d.jpg\n" % (i, i) for i in range(3000))
    stopped, status, err = pack_from_endless_stdin(tmp_path, good + b"3000\tx\ta/b.jpg\n", b"y\n")
    assert stopped
    assert err == "Error: standard input: line 3001: labels ['x'] are not numbers\n"
    assert status == 1


def test_non_utf8_bytes_on_stdin_are_refused_as_in_a_file(tmp_path):
    line = b"0\t0\ta/caf\xe9.jpg\n"
    stopped, status, err = pack_from_endless_stdin(tmp_path, line, b"1\t0\ta/b.jpg\n")
    assert stopped
    assert err == "Error: standard input: line 1: not valid UTF-8 (invalid continuation byte)\n"
    assert "Traceback" not in err
    assert (status, err) == pack_file(tmp_path, line)


def test_a_repeated_index_in_an_endless_stream_stops_it(tmp_path):
    stopped, status, err = pack_from_endless_stdin(tmp_path, b"7\t0\ta/b.jpg\n", b"7\t0\ta/b.jpg\n")
    assert stopped
    assert err == "Error: standard input: line 2: index 7 appears twice\n"
    assert status == 1


class EndlessList(io.RawIOBase):
    """A binary stream of ordinary list lines that never ends."""

    def __init__(self):
        self.lines = (b"%d\t0\ta/%d.jpg\n" % (i, i) for i in itertools.count())
        self.pending = b""
        self.read_bytes = 0

    def readable(self):
        return True

    def readinto(self, buffer):
        while len(self.pending) < len(buffer):
            self.pending += b"".join(next(self.lines) for _ in range(1000))
        n = len(buffer)
        buffer[:n], self.pending = self.pending[:n], self.pending[n:]
        self.read_bytes += n
        return n


def test_what_is_staged_is_bounded(tmp_path):
    from rectool.packer.listcheck import MAX_STDIN_LIST_BYTES, stage_list

    assert MAX_STDIN_LIST_BYTES == 4 << 30  # the bound docs/pack.md states
    docs = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "docs", "pack.md")
    with open(docs, encoding="utf-8") as f:
        assert "at most 4 GiB (a longer list is given as a file)" in " ".join(f.read().split())
    stream = io.BufferedReader(EndlessList())
    target = tmp_path / "p.stdin.lst"
    with pytest.raises(InputError) as caught:
        stage_list(stream, str(target), "images", max_bytes=1 << 20)
    assert str(caught.value) == (
        "standard input: the list is over 1,048,576 bytes, the most rectool copies of a list "
        "read from standard input; give a longer list as a file"
    )
    assert stream.raw.read_bytes <= (1 << 20) + (1 << 20)  # stopped within a block
    assert list(tmp_path.iterdir()) == []  # nothing staged is left


def test_a_text_stream_is_checked_by_the_same_rule(tmp_path):
    from rectool.packer.listcheck import stage_list

    target = tmp_path / "p.stdin.lst"
    staged = stage_list(io.StringIO("0\t1\ta/b.jpg\n1\t2\ta/c.jpg"), str(target), "images")
    assert (staged.items, staged.path) == (2, str(target))
    assert target.read_bytes() == b"0\t1\ta/b.jpg\n1\t2\ta/c.jpg"
    other = tmp_path / "q.stdin.lst"
    with pytest.raises(RectoolError) as caught:  # a lone surrogate: not UTF-8, as in a file
        stage_list(io.StringIO("0\t1\ta/\udce9.jpg\n"), str(other), "images")
    assert str(caught.value).startswith("standard input: line 1: not valid UTF-8")
    assert not other.exists()


def test_a_closed_stdin_is_one_error_line(tmp_path):
    (tmp_path / "faces" / "a").mkdir(parents=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rectool",
            "pack",
            "-",
            str(tmp_path / "faces"),
            str(tmp_path / "p"),
        ],
        preexec_fn=lambda: os.close(0),  # the child starts with no stdin: sys.stdin is None
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stderr) == (
        2,
        "Error: standard input is closed: pipe the list in, or give it as a file\n",
    )
