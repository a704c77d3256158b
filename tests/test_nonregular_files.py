"""A FIFO, device or folder named as a .rec/.idx is refused by every command, never read.

Each command runs in a subprocess whose timeout is only a guard: before the fix, opening the
FIFO blocked forever.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.handmade_datasets import image_record, write_shard
from helpers.image_files import jpeg_bytes

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX thing")

COMMANDS = {
    "verify": lambda rec, out: ["verify", rec],
    "info": lambda rec, out: ["info", rec],
    "reindex": lambda rec, out: ["reindex", rec, "--overwrite"],
    "unpack": lambda rec, out: ["unpack", rec, out],
}


def rectool(*args):
    code = "import sys; from rectool.cli import cli; cli(sys.argv[1:], prog_name='rectool')"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


# verify exits 2 when a target cannot be read at all (docs/verify.md), the others 1.
EXIT = {"verify": 2, "info": 2, "reindex": 2, "unpack": 2}  # an unusable input: 2
# reindex writes the .idx without reading it, so only its .rec matters.
CASES = [(c, w) for c in sorted(COMMANDS) for w in ("rec", "idx") if (c, w) != ("reindex", "idx")]


@pytest.mark.parametrize(("command", "which"), CASES)
def test_a_fifo_is_refused(tmp_path, command, which):
    rec, idx = tmp_path / "a.rec", tmp_path / "a.idx"
    write_shard(rec, idx, [(k, image_record(jpeg_bytes(k, 8, 8), float(k))) for k in range(3)])
    fifo = rec if which == "rec" else idx
    fifo.unlink()
    os.mkfifo(fifo)
    result = rectool(*COMMANDS[command](rec, tmp_path / "out"))
    assert result.returncode == EXIT[command], result.stdout + result.stderr
    assert f"{fifo}: not a regular file" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


# A format-3 pack's own files beside its shards: the binary index and the identities file.
INDEX_FILES = ["offsets.npy", "keys.npy", "labels.npy", "identities.json"]
# What each command is given; the ones that do not read a file leave a FIFO there unopened.
PACK_COMMANDS = {
    "info": lambda m, out: ["info", m],
    "unpack": lambda m, out: ["unpack", m, out / "images"],
    "report": lambda m, out: ["report", m, "-o", out / "r.html"],
    "repack": lambda m, out: ["repack", m, out / "again"],
    "index": lambda m, out: ["index", m, "--force"],
}


@pytest.mark.parametrize("name", INDEX_FILES)
def test_verify_reports_a_fifo_in_place_of_an_index_file(small_pack, name):
    fifo = small_pack.manifest.parent / f"faces.{name}"
    fifo.unlink()
    os.mkfifo(fifo)
    result = rectool("verify", small_pack.manifest)
    assert result.returncode == 1, result.stdout + result.stderr  # a problem found
    assert f"index-file: {fifo}: not a regular file" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", sorted(PACK_COMMANDS))
@pytest.mark.parametrize("name", INDEX_FILES)
def test_a_fifo_in_place_of_an_index_file_is_refused_or_left_unread(
    small_pack, tmp_path, name, command
):
    fifo = small_pack.manifest.parent / f"faces.{name}"
    fifo.unlink()
    os.mkfifo(fifo)
    result = rectool(*PACK_COMMANDS[command](small_pack.manifest, tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode in (0, 2), output  # done without it, or an unusable input
    if result.returncode:
        assert f"{fifo}: not a regular file" in output
    assert "Traceback" not in result.stderr
