"""Issue 38's surfaces, attacked: `list`'s outputs, the report's outputs, the insightface label
shapes (`--pack-label`, `repack` between them), the exit table for every command and the
images-per-identity chart.

Each test names what a user or an attacker tried and what must hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    write_pack_tree(root, ["ann", "bob"], 2)
    return root


# --- One output, two files at one name --------------------------------------------------------
# A label map named like one of the lists it comes with would replace that list (the commit
# moves both into place, the later over the earlier) while the summary says both were written.


@pytest.mark.parametrize(
    "extra, clash",
    [
        ([], "faces.lst"),
        (["--val-ratio", "0.5"], "faces_val.lst"),
        (["--chunks", "2"], "faces_1.lst"),
        (["--chunks", "2", "--test-ratio", "0.5"], "faces_0_train.lst"),
    ],
    ids=["single", "split", "chunk", "chunk-split"],
)
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_label_map_named_like_a_list_is_refused_before_the_walk(
    tmp_path, tree, extra, clash, as_json
):
    out = tmp_path / "o"
    labels = f"{out}/./{clash}"  # another spelling of the same place
    args = ["list", tree, out / "faces.lst", "--labels", labels, *extra]
    result = run(*args, *(["--json"] if as_json else []))
    assert result.exit_code == 2, result.output
    message = json.loads(result.stdout)["error"] if as_json else result.stderr
    assert f"{clash}: is also the list ({out / clash}); " in message, message
    assert "give each file its own name" in message
    assert not out.exists()  # nothing written, not even the folder


def test_a_label_map_reaching_a_list_through_a_linked_folder_is_refused(tmp_path, tree):
    (tmp_path / "o").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "o")
    args = ["list", tree, tmp_path / "o" / "faces.lst", "--labels", tmp_path / "alias/faces.lst"]
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert list((tmp_path / "o").iterdir()) == []


def test_a_label_map_beside_its_lists_is_still_written(tmp_path, tree):
    # The refusal is about one place, not one folder or one stem.
    out = tmp_path / "o"
    args = [
        "list",
        tree,
        out / "faces.lst",
        "--labels",
        out / "faces_val.tsv",
        "--val-ratio",
        "0.5",
    ]
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "faces_train.lst",
        "faces_val.lst",
        "faces_val.tsv",
    ]
    assert (out / "faces_val.tsv").read_text() == "0\tann\n1\tbob\n"


def test_a_report_page_and_its_sheet_at_one_name_are_refused(tmp_path, tree):
    lst = tmp_path / "faces.lst"
    assert run("list", tree, lst).exit_code == 0
    assert run("pack", lst, tree, tmp_path / "p" / "faces", "--quiet").exit_code == 0
    page = tmp_path / "r.png"
    result = run("report", tmp_path / "p" / "faces", "-o", page, "--sheet", page)
    assert result.exit_code == 2, result.output
    assert f"{page}: is also the report's other file (" in result.output
    assert not page.exists()


# --- A kill before anything was recorded ------------------------------------------------------
# A run killed while it writes its state file (the first thing it writes) leaves only that
# file's hidden temporary (`.p.pack-state.json.XXXX.tmp`): nothing was packed. `--resume` and
# a plain run again both start the pack; neither may need --overwrite.


def rectool(*args, env=None):
    command = [sys.executable, "-m", "rectool", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env})


def vector_pack_args(tmp_path, tree):
    items = write_pack_tree(tree, ["ann", "bob"], 2)
    lst = write_list(tmp_path / "v.lst", [(i, [c, 0.5 * i], rel) for i, c, rel in items])
    return [lst, tree, "--layout", "insightface", "--pack-label", "--quiet"]


def pack_files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("again", [["--resume"], []], ids=["resume", "plain"])
@pytest.mark.parametrize("command", ["pack", "repack"])
def test_a_kill_at_the_first_write_leaves_a_run_that_starts_again(tmp_path, again, command):
    lst, root, *options = vector_pack_args(tmp_path, tmp_path / "tree")
    assert run("pack", lst, root, tmp_path / "src" / "p", *options).exit_code == 0
    if command == "pack":
        inputs = [lst, root]
    else:
        inputs, options = [tmp_path / "src" / "p"], ["--layout", "insightface", "--quiet"]
    assert run(command, *inputs, tmp_path / "ref" / "p", *options).exit_code == 0
    out = tmp_path / "out" / "p"
    killed = rectool(command, *inputs, out, *options, env={"RECTOOL_OUTPUT_FAULT": "write:1:kill"})
    assert killed.returncode == -9, killed.stderr
    left = sorted(p.name for p in out.parent.iterdir() if not p.name.endswith(".lock"))
    assert len(left) == 1 and left[0].startswith(".p.pack-state.json."), left  # unrenamed
    result = run(command, *inputs, out, *options, *again)
    assert result.exit_code == 0, result.output
    assert pack_files(out.parent) == pack_files(tmp_path / "ref")


def test_another_packs_temporary_beside_is_neither_refused_nor_removed(tmp_path):
    # `.pq.manifest.json.XXXX.tmp` is pack pq's, maybe being written now: not pack p's.
    lst, root, *options = vector_pack_args(tmp_path, tmp_path / "tree")
    out = tmp_path / "out"
    theirs = out / ".pq.manifest.json.abcd1234.tmp"
    out.mkdir()
    theirs.write_bytes(b"{")
    assert run("pack", lst, root, out / "p", *options).exit_code == 0
    assert run("repack", out / "p", out / "p2", "--layout", "insightface").exit_code == 0
    assert theirs.read_bytes() == b"{"
