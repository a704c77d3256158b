"""Output that cannot be written ends a command cleanly: `> /dev/full`, a closed pipe, and a
record file the address space cannot map.

Each runs the real `rectool` in a child process: what is tested is the exit status and stderr
the shell sees, including what Python prints when it flushes stdout at exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

NO_SPACE = "Error: cannot write standard output: No space left on device"


def _rectool(args, stdout, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "rectool", *map(str, args)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        **kwargs,
    )


def _commands(small_pack, tmp_path):
    lst = small_pack.manifest.parent.parent / "faces.lst"
    return {
        "verify": ["verify", "--json", small_pack.manifest],
        "info": ["info", "--json", small_pack.manifest],
        "pack": ["pack", "--json", lst, small_pack.root, tmp_path / "again" / "faces"],
        "reader": ["reader", "-o", "-"],
        "index": ["index", "--json", "--force", small_pack.manifest],
        "failure": ["verify", "--json", tmp_path / "nothing.manifest.json"],
    }


@pytest.fixture
def dev_full():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as f:
        yield f


@pytest.mark.parametrize("command", ["verify", "info", "pack", "reader", "index", "failure"])
def test_a_full_stdout_is_one_error_line_and_exit_1(small_pack, tmp_path, dev_full, command):
    args = _commands(small_pack, tmp_path)[command]
    assert (small_pack.manifest.parent.parent / "faces.lst").exists()
    result = _rectool(args, dev_full)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "Exception ignored" not in result.stderr
    assert result.stderr.splitlines()[-1] == NO_SPACE, result.stderr


@pytest.mark.parametrize("command", ["verify", "info", "reader"])
def test_a_closed_pipe_exits_quietly(small_pack, tmp_path, command):
    args = _commands(small_pack, tmp_path)[command]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: every write gets EPIPE
    try:
        result = _rectool(args, write_end)
    finally:
        os.close(write_end)
    assert result.returncode == 1, result.stderr
    assert result.stderr == ""


LIMITED = textwrap.dedent(
    """
    import resource, sys
    import rectool.inspect.verify, rectool.inspect.scan  # what verify imports, before the limit
    from rectool.cli import main

    def mapped_bytes():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))

    limit = mapped_bytes() + 256 * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.argv = ["rectool", *sys.argv[1:]]
    main()
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (Linux)")
def test_a_record_file_that_cannot_be_mapped_is_an_error_naming_it(small_pack, tmp_path):
    # The pack's records, then 4 GiB of (sparse) zeros: a mapping the limited child cannot get.
    rec = tmp_path / "big.rec"
    rec.write_bytes(small_pack.rec.read_bytes())
    os.truncate(rec, 4 * 2**30)
    result = subprocess.run(
        [sys.executable, "-c", LIMITED, "verify", str(rec)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr  # verify's "could not verify"
    assert "Traceback" not in result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"Error: {rec}: cannot map the record file"), last
