"""--max-failures takes a share of the images as well as a count (issue 21: any broken file in
an MS1M-size tree meant exit 3 by default): `0.1%` allows that share of the listed images,
rounded down."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli


@pytest.fixture
def ten_with_two_broken(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["ann", "bob"], 4)
    for name in ("ann/broken.jpg", "bob/broken.jpg"):
        (root / name).write_bytes(b"")
    items += [(8, 0, "ann/broken.jpg"), (9, 1, "bob/broken.jpg")]
    return root, write_list(tmp_path / "faces.lst", items)


def pack(tree, tmp_path, *args):
    root, lst = tree
    return CliRunner().invoke(cli, ["pack", str(lst), str(root), str(tmp_path / "p"), *args])


SHARES = [("20%", 0, 2), ("19.9%", 3, 1), ("10%", 3, 1), ("0%", 3, 0), ("100%", 0, 10), ("2", 0, 2)]


@pytest.mark.parametrize(("limit", "exit_code", "allowed"), SHARES)
def test_a_share_of_the_listed_images_is_allowed_rounded_down(
    ten_with_two_broken, tmp_path, limit, exit_code, allowed
):
    result = pack(ten_with_two_broken, tmp_path, "--max-failures", limit, "--json")
    assert result.exit_code == exit_code, result.output
    document = json.loads(result.stdout)
    assert (document["failures"], document["max_failures"]) == (2, allowed)


def test_the_message_names_the_count_the_share_allowed(ten_with_two_broken, tmp_path):
    result = pack(ten_with_two_broken, tmp_path, "--max-failures", "10%", "-q")
    assert result.exit_code == 3
    assert result.stderr == "Error: more than --max-failures 1 refused (2)\n"


@pytest.mark.parametrize("limit", ["abc", "-1", "101%", "-5%", "nan%", "1.5"])
def test_anything_else_is_a_usage_error(ten_with_two_broken, tmp_path, limit):
    result = pack(ten_with_two_broken, tmp_path, "--max-failures", limit)
    assert result.exit_code == 2
    assert "--max-failures" in result.stderr and "Traceback" not in result.output


def test_repack_takes_a_share_too(ten_with_two_broken, tmp_path):
    root, lst = ten_with_two_broken
    good = write_list(
        tmp_path / "good.lst",
        [(i, i // 4, f"{'ann' if i < 4 else 'bob'}/{i % 4:03d}.jpg") for i in range(8)],
    )
    assert (
        CliRunner()
        .invoke(cli, ["pack", str(good), str(root), str(tmp_path / "src"), "-q"])
        .exit_code
        == 0
    )
    result = CliRunner().invoke(
        cli,
        ["repack", str(tmp_path / "src"), str(tmp_path / "re"), "--max-failures", "50%", "--json"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "re.manifest.json").read_text())["options"]["max_failures"] == 4
