"""Options unified across commands keep their old names: `list --threads` is `--workers` (as in
every other command), `repack --sample/--sample-by` are `--keep-fraction/--fraction-of` (a
`--sample` elsewhere is a count), `bench --decode` is `--decode-as` (a `--decode` elsewhere is a
flag). The old name works, warns on stderr, and is hidden from --help."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rectool.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_list_threads_is_workers(small_tree, tmp_path):
    new = invoke("list", small_tree.root, tmp_path / "new.lst", "--workers", "2")
    old = invoke("list", small_tree.root, tmp_path / "old.lst", "--threads", "2")
    assert new.exit_code == old.exit_code == 0, old.output
    assert (tmp_path / "new.lst").read_bytes() == (tmp_path / "old.lst").read_bytes()
    assert "Warning: --threads is now --workers (the same meaning); use --workers." in old.stderr
    assert "Warning" not in new.stderr
    both = invoke("list", small_tree.root, tmp_path / "b.lst", "--threads", "2", "-j", "2")
    assert both.exit_code == 2
    assert "give --workers or its old name --threads, not both" in both.stderr


def test_an_old_name_is_checked_as_the_new_one(small_tree, tmp_path):
    bad = invoke("list", small_tree.root, tmp_path / "x.lst", "--threads", "0")
    assert bad.exit_code == 2
    assert "0 is not in the range 1<=x<=256" in bad.stderr


def test_repack_sample_is_keep_fraction(small_pack, tmp_path):
    source = small_pack.manifest
    new = invoke(
        "repack",
        source,
        tmp_path / "new",
        *"--keep-fraction 0.5 --fraction-of images --json".split(),
    )
    old = invoke(
        "repack", source, tmp_path / "old", *"--sample 0.5 --sample-by images --json".split()
    )
    assert new.exit_code == old.exit_code == 0, old.output
    assert json.loads(new.stdout)["steps"] == json.loads(old.stdout)["steps"]
    assert json.loads(new.stdout)["images"] == 6  # half of 12 images, not of 3 identities
    assert (tmp_path / "new.rec").read_bytes() == (tmp_path / "old.rec").read_bytes()
    assert "--sample is now --keep-fraction" in old.stderr
    assert "--sample-by is now --fraction-of" in old.stderr


def test_bench_decode_is_decode_as(small_pack):
    args = ["bench", small_pack.manifest, "--seconds", "0.1", "--samples", "3", "-j", "1"]
    old = invoke(*args, "--decode", "gray", "--json")
    new = invoke(*args, "--decode-as", "gray", "--json")
    assert new.exit_code == old.exit_code == 0, old.output
    phases = [p["name"] for p in json.loads(old.stdout)["phases"]]
    assert phases == [p["name"] for p in json.loads(new.stdout)["phases"]]
    assert any("gray" in name for name in phases)
    assert "--decode is now --decode-as" in old.stderr


@pytest.mark.parametrize(
    "command, old, new",
    [
        ("list", "--threads", "--workers"),
        ("repack", "--sample ", "--keep-fraction"),
        ("repack", "--sample-by", "--fraction-of"),
        ("bench", "--decode ", "--decode-as"),
    ],
)
def test_help_shows_only_the_new_name(command, old, new):
    text = invoke(command, "--help").output
    assert new in text
    assert old not in text
