"""One door in: every file rectool reads stays where the user pointed it (issue 19).

Links inside ROOT that lead out of it are not followed without `--allow-outside-root`, paths
named inside a dataset stay inside its folder, and work per record is bounded by the records
that exist.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree

from rectool.cli import cli
from rectool.records import IndexedRecordFile

LINK_OUT = "outside-root: a symbolic link leads out of ROOT (--allow-outside-root packs it)"
PACK_MODES = {
    "pass-through": ["--check", "none"],
    "pass-through on threads": ["--check", "none", "--workers", "2"],
    "decode check": ["--check", "decode", "--workers", "2"],
    "re-encode": ["--resize", "20", "--workers", "1"],
}


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def pack_refusals(tmp_path, root, paths, args):
    """Pack alice/000.jpg and `paths`; return ({path: reason} refused, {path: image bytes})."""
    items = [(0, 0, "alice/000.jpg")] + [(i + 1, 0, p) for i, p in enumerate(paths)]
    lst = write_list(tmp_path / "odd.lst", items)
    prefix = tmp_path / "odd" / "out"
    result = invoke("pack", lst, root, prefix, "-q", "--max-failures", "100", "--overwrite",
                    *args)  # fmt: skip
    assert result.exit_code == 0, result.output
    with open(f"{prefix}.failures.jsonl", encoding="utf-8") as f:
        refused = {entry["path"]: entry["reason"] for entry in map(json.loads, f)}
    return refused


@pytest.fixture
def linked_tree(tmp_path):
    """A tree whose links lead out of it (a file, a folder) and one that stays inside."""
    outside = tmp_path / "outside"
    (outside / "carol").mkdir(parents=True)
    (outside / "secret.jpg").write_bytes(jpeg_bytes(7))
    (outside / "carol" / "1.jpg").write_bytes(jpeg_bytes(8))
    root = tmp_path / "tree"
    write_pack_tree(root, ["alice", "bob"], 2)
    os.symlink(outside / "secret.jpg", root / "alice" / "x.jpg")
    os.symlink("../../outside/secret.jpg", root / "alice" / "rel.jpg")
    os.symlink(outside / "carol", root / "carol")
    os.symlink("../bob/000.jpg", root / "alice" / "inside.jpg")  # stays in ROOT: packed
    return root


@pytest.mark.parametrize("mode", PACK_MODES)
def test_pack_refuses_links_that_lead_out_of_root(linked_tree, tmp_path, mode):
    paths = ["alice/x.jpg", "alice/rel.jpg", "carol/1.jpg", "alice/inside.jpg"]
    refused = pack_refusals(tmp_path, linked_tree, paths, PACK_MODES[mode])
    assert refused == {"alice/x.jpg": LINK_OUT, "alice/rel.jpg": LINK_OUT, "carol/1.jpg": LINK_OUT}
    refused = pack_refusals(tmp_path, linked_tree, paths, [*PACK_MODES[mode],
                                                            "--allow-outside-root"])  # fmt: skip
    assert refused == {}
    with IndexedRecordFile(tmp_path / "odd" / "out.rec") as records:
        assert records.keys.tolist() == [0, 1, 2, 3, 4]


def test_pack_does_not_pack_proc_or_etc_through_a_link(tmp_path):
    root = tmp_path / "tree"
    write_pack_tree(root, ["alice"], 1)
    os.symlink("/etc/passwd", root / "alice" / "passwd.jpg")
    os.symlink("/proc/self/environ", root / "alice" / "environ.jpg")
    refused = pack_refusals(tmp_path, root, ["alice/passwd.jpg", "alice/environ.jpg"],
                            ["--check", "none"])  # fmt: skip
    assert refused == {"alice/passwd.jpg": LINK_OUT, "alice/environ.jpg": LINK_OUT}
