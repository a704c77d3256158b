"""One exit-code table for every command, the same in README.md and docs/cli.md, and what each
command does for the situations it names: unusable input 2, usage 2, done 0 (issue 21)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli

REPO = Path(__file__).resolve().parent.parent


def table(page):
    text = (REPO / page).read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", text, flags=re.M)
    return dict(rows)


def test_the_table_is_one_table_in_readme_and_cli_reference():
    readme, reference = table("README.md"), table("docs/cli.md")
    assert readme == reference
    assert sorted(map(int, readme)) == [0, 1, 2, 3, 130, 143]


# Every command that reads a dataset or a file it is given: a path with nothing there is an
# unusable input (exit 2), whatever the command.
MISSING = {
    "pack": ["pack", "{missing}", "{root}", "{tmp}/out/p"],
    "repack": ["repack", "{missing}", "{tmp}/out/r"],
    "verify": ["verify", "{missing}"],
    "reindex": ["reindex", "{missing}.rec", "-o", "{tmp}/x.idx"],
    "info": ["info", "{missing}"],
    "unpack": ["unpack", "{missing}", "{tmp}/u"],
    "bench": ["bench", "{missing}"],
    "report": ["report", "{missing}", "-o", "{tmp}/r.html"],
    "index": ["index", "{missing}"],
    "dali-index": ["dali-index", "{missing}", "{tmp}/d.idx"],
}


@pytest.fixture
def world(tmp_path):
    root = tmp_path / "tree"
    write_pack_tree(root, ["ann", "bob"], 2)
    return {"root": root, "tmp": tmp_path, "missing": tmp_path / "nothing"}


def test_every_command_that_reads_is_in_the_table_test():
    reading = set(cli.load_all()) - {"list", "reader"}  # list: a missing ROOT is click's usage
    assert reading == set(MISSING)


@pytest.mark.parametrize("command", sorted(MISSING))
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_input_that_is_not_there_is_exit_2(world, command, as_json):
    args = [a.format(**world) for a in MISSING[command]] + (["--json"] if as_json else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    if as_json:
        assert '"exit": 2' in result.stdout
    elif command == "reindex":  # its REC is checked by click, as a usage error
        assert "Error: Invalid value for 'REC'" in result.stderr
    else:
        assert result.stderr.startswith("Error: ") and "Usage:" not in result.stderr


def test_a_list_root_that_is_not_there_is_a_usage_error_exit_2(world):
    result = CliRunner().invoke(cli, ["list", str(world["missing"]), str(world["tmp"] / "x.lst")])
    assert result.exit_code == 2


def test_refusals_over_the_limit_are_exit_3(world):
    root, tmp = world["root"], world["tmp"]
    (root / "bob" / "empty.jpg").write_bytes(b"")
    lst = write_list(tmp / "bad.lst", [(0, 0, "ann/000.jpg"), (1, 1, "bob/empty.jpg")])
    result = CliRunner().invoke(cli, ["pack", str(lst), str(root), str(tmp / "out" / "p"), "-q"])
    assert result.exit_code == 3
