"""A folder holding one rectool pack is a TARGET (`rectool verify out/`), as a folder holding
insightface's train.rec is; a folder of several packs names them (issue 21)."""

from __future__ import annotations

from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli


def pack(tmp_path, prefix):
    root = tmp_path / "tree"
    if not root.exists():
        write_pack_tree(root, ["ann", "bob"], 2)
    lst = write_list(tmp_path / "faces.lst", [(0, 0, "ann/000.jpg"), (1, 1, "bob/000.jpg")])
    assert CliRunner().invoke(cli, ["pack", str(lst), str(root), str(prefix), "-q"]).exit_code == 0


def test_a_folder_holding_one_pack_is_that_pack(tmp_path):
    pack(tmp_path, tmp_path / "out" / "faces")
    for command in (["verify", "-q"], ["info", "--json"]):
        result = CliRunner().invoke(cli, [command[0], str(tmp_path / "out"), *command[1:]])
        assert result.exit_code == 0, result.output


def test_a_folder_of_two_packs_asks_which(tmp_path):
    pack(tmp_path, tmp_path / "out" / "a")
    pack(tmp_path, tmp_path / "out" / "b")
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: {tmp_path / 'out'}: a folder without train.rec or one pack (2 manifests: name "
        "one); give a manifest, .rec or prefix\n"
    )
