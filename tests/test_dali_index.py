"""`rectool dali-index` and `rectool.inspect.dali.write_dali_index`: one .idx for DALI."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import MAGIC, write_insightface
from helpers.image_files import jpeg_bytes

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.inspect.dali import write_dali_index


def face(key):
    return jpeg_bytes(key, 16, 16)


# --- write_dali_index -------------------------------------------------------------------------


def test_dali_index_counts_offsets_across_the_shards(handmade_shards, tmp_path):
    prefix, samples = handmade_shards
    recs = write_dali_index(prefix, tmp_path / "all.idx")
    assert recs == [f"{prefix}-{n:05d}.rec" for n in range(3)]
    sizes = [os.path.getsize(r) for r in recs]
    base = {recs[0]: 0, recs[1]: sizes[0], recs[2]: sizes[0] + sizes[1]}
    expected = "".join(f"{s.key}\t{base[s.rec] + s.offset}\n" for s in samples)
    assert (tmp_path / "all.idx").read_text() == expected
    # The concatenated files hold each record where the index says.
    blob = b"".join(open(r, "rb").read() for r in recs)
    for line in expected.splitlines():
        assert blob[int(line.split("\t")[1]) :].startswith(MAGIC)


def test_dali_index_refuses_the_insightface_layout(tmp_path):
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2], face)
    with pytest.raises(RectoolError, match="pack with --layout images for DALI"):
        write_dali_index(tmp_path / "f.rec", tmp_path / "dali.idx")
    assert not (tmp_path / "dali.idx").exists()


def test_the_insightface_layout_is_unusable_input_exit_2(tmp_path):
    # Issue 38: the exit table gives 2 to an input that cannot be used as it is.
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2], face)
    for as_json in ([], ["--json"]):
        result = CliRunner().invoke(
            cli, ["dali-index", str(tmp_path / "f.rec"), str(tmp_path / "d.idx"), *as_json]
        )
        assert result.exit_code == 2, result.output
        assert "pack with --layout images for DALI" in result.output


def test_dali_index_command(handmade_shards, tmp_path):
    prefix, _ = handmade_shards
    result = CliRunner().invoke(cli, ["dali-index", str(prefix), str(tmp_path / "cli.idx")])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"{prefix}-{n:05d}.rec" for n in range(3)]
    write_dali_index(prefix, tmp_path / "lib.idx")
    assert (tmp_path / "cli.idx").read_bytes() == (tmp_path / "lib.idx").read_bytes()
