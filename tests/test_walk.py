"""The tree walk of `rectool list` visits each folder once and stays inside ROOT (issue 19).

Bounds are structural: folder visits are counted through `os.scandir`, and a walk that
reads more folders than the tree holds fails at once instead of running on.
"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner
from helpers.image_files import jpeg_bytes

from rectool.cli import cli
from rectool.packer.listing import walk_tree


class TooManyVisits(Exception):
    pass


@pytest.fixture
def visits(monkeypatch):
    """The folders read, in order; reading more than `visits.limit` raises TooManyVisits."""
    seen = []
    real = os.scandir

    def counting(path):
        seen.append(os.fspath(path))
        if len(seen) > counting.limit:
            raise TooManyVisits(f"{len(seen)} folder visits")
        return real(path)

    counting.limit, counting.seen = 1000, seen
    monkeypatch.setattr(os, "scandir", counting)
    return counting


@pytest.mark.parametrize("threads", [None, 1, 4])
def test_a_dag_of_links_lists_each_folder_once(tmp_path, visits, threads):
    # d0 .. d29, each with an image and two links to the next: 2**30 paths, 30 folders.
    root, levels = tmp_path / "tree", 30
    for i in range(levels):
        folder = root / "alice" / f"d{i:02d}"
        folder.mkdir(parents=True)
        (folder / "x.jpg").write_bytes(jpeg_bytes(i))
        if i + 1 < levels:
            os.symlink(f"../d{i + 1:02d}", folder / "a")
            os.symlink(f"../d{i + 1:02d}", folder / "b")
    visits.limit = levels + 2  # the root, alice, and each dNN once
    walk = walk_tree(root, threads=threads)
    assert [i.images for i in walk.identities] == [
        tuple(f"alice/d{i:02d}/x.jpg" for i in range(levels))
    ]
    assert len(walk.skipped["symlink_repeat"]) == 2 * (levels - 1)
    assert len(visits.seen) == len(set(visits.seen)) == levels + 2


def test_a_link_to_the_file_system_root_is_not_walked(tmp_path, visits):
    root = tmp_path / "tree"
    (root / "alice").mkdir(parents=True)
    (root / "alice" / "1.jpg").write_bytes(jpeg_bytes(1))
    os.symlink("/", root / "alice" / "everything")
    os.symlink("/", root / "slash")  # an identity folder that is the whole disk
    visits.limit = 10
    walk = walk_tree(root)
    assert [i.images for i in walk.identities] == [("alice/1.jpg",)]
    assert walk.skipped["outside_root"] == ["alice/everything", "slash"]
    assert sorted(visits.seen) == [str(root), str(root / "alice")]


def test_list_skips_linked_files_outside_root_unless_allowed(tmp_path):
    outside = tmp_path / "outside.jpg"
    outside.write_bytes(jpeg_bytes(2))
    root = tmp_path / "tree"
    (root / "alice").mkdir(parents=True)
    (root / "alice" / "1.jpg").write_bytes(jpeg_bytes(1))
    os.symlink(outside, root / "alice" / "out.jpg")
    os.symlink("/etc/passwd", root / "alice" / "passwd.jpg")
    os.symlink("1.jpg", root / "alice" / "same.jpg")  # inside ROOT: listed
    lst = tmp_path / "t.lst"
    result = CliRunner().invoke(cli, ["list", str(root), str(lst), "-q"])
    assert result.exit_code == 0, result.output
    assert [line.split("\t")[2] for line in lst.read_text().splitlines()] == [
        "alice/1.jpg",
        "alice/same.jpg",
    ]
    result = CliRunner().invoke(
        cli, ["list", str(root), str(tmp_path / "all.lst"), "-q", "--allow-outside-root"]
    )
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "all.lst").read_text().splitlines()) == 4
    assert walk_tree(root).skipped["outside_root"] == ["alice/out.jpg", "alice/passwd.jpg"]
