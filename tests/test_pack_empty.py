"""An empty list is a usage error, not a "sound" empty pack: `rectool list DIR - | rectool pack -
ROOT out/x` with a list that failed upstream must not exit 0 (issue 21). --allow-empty asks for
an empty pack."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rectool.cli import cli


def invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


@pytest.mark.parametrize("source", ["stdin", "file"])
def test_an_empty_list_is_a_usage_error_and_nothing_is_written(tmp_path, source):
    root = tmp_path / "tree"
    root.mkdir()
    lst = tmp_path / "empty.lst"
    lst.write_text("")
    out = tmp_path / "out" / "x"
    if source == "stdin":
        result = invoke("pack", "-", root, out, input="")
        where = "standard input"
    else:
        result = invoke("pack", lst, root, out)
        where = str(lst)
    assert result.exit_code == 2
    assert result.stderr.endswith(
        f"Error: {where}: the list holds no images, so nothing was packed (a list that failed on "
        "the way here?); add --allow-empty to pack an empty dataset\n"
    )
    assert not out.parent.exists()


def test_an_empty_list_under_json_is_one_error_document(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    result = invoke("pack", "-", root, tmp_path / "out" / "x", "--json", input="")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["exit"] == 2


def test_allow_empty_packs_an_empty_dataset_that_verifies(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    out = tmp_path / "out" / "x"
    result = invoke("pack", "-", root, out, "--allow-empty", "--json", input="")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["images"] == 0
    assert invoke("verify", out).exit_code == 0


def test_a_failed_list_piped_into_pack_is_not_a_sound_pack(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    listed = invoke("list", empty, "-")
    assert listed.exit_code != 0 and listed.stdout == ""
    packed = invoke("pack", "-", empty, tmp_path / "out" / "x", input=listed.stdout)
    assert packed.exit_code == 2
    assert not (tmp_path / "out").exists()
