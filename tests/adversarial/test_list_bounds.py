"""Issue 36: `rectool list` bounded on a tree it should not walk (`packer/walk.py`'s door).

A ROOT that is the file system's root (through a link, as the attack gave it) or lies in the
kernel's trees is refused before anything is walked, exit 2; a link inside the tree that
leads there is never followed, not even with --allow-outside-root; and a walk that runs out
of memory ends in one `Error:` line saying what to check, never a `MemoryError` traceback.
"""

from __future__ import annotations

import json
import os
import threading

import pytest
from click.testing import CliRunner
from helpers.image_trees import face_tree

from rectool.cli import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("target", ["/", "/proc", "/sys/kernel"])
def test_a_root_leading_to_a_system_tree_is_refused_before_the_walk(tmp_path, alarm, target):
    if not os.path.isdir(target):
        pytest.skip(f"no {target} here")
    root = tmp_path / "faces"
    root.symlink_to(target)
    alarm(60)  # today's main walks the whole machine: blocked, not an answer
    result = run("list", root, tmp_path / "faces.lst", "--json")
    alarm(0)
    assert result.exit_code == 2, result.output
    error = json.loads(result.output)["error"]
    assert error.startswith(f"{root}: ROOT is "), error
    assert f"({target}), not an image tree" in error
    assert not (tmp_path / "faces.lst").exists()
    assert not (tmp_path / "faces.labels.tsv").exists()


def test_root_slash_itself_is_refused(tmp_path, alarm):
    alarm(60)
    result = run("list", "/", tmp_path / "all.lst")
    alarm(0)
    assert result.exit_code == 2
    assert result.output == (
        "Error: /: ROOT is the file system's root, not an image tree; give the folder that "
        "holds one folder per identity\n"
    )


def test_a_link_to_slash_inside_the_tree_is_not_followed_even_when_outside_is_allowed(
    tmp_path, alarm
):
    root = tmp_path / "faces"
    face_tree(root, identities=2, per_identity=2)
    (root / "id0" / "everything").symlink_to("/")
    alarm(60)
    result = run("list", root, tmp_path / "faces.lst", "--allow-outside-root", "--json")
    alarm(0)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["images"] == 4
    assert summary["skipped"]["outside_root"] == 1


def test_running_out_of_memory_is_one_error_line(tmp_path, monkeypatch):
    root = tmp_path / "faces"
    face_tree(root, identities=3, per_identity=2)
    scandir = os.scandir

    def exhausted(path="."):  # memory runs out as the identity folders are listed
        if os.fspath(path) != os.fspath(root):
            raise MemoryError
        return scandir(path)

    monkeypatch.setattr(os, "scandir", exhausted)
    result = run("list", root, tmp_path / "faces.lst")
    assert result.exit_code == 1
    assert result.output == (
        f"Error: out of memory while listing {root}: the tree holds more entries than this "
        "process can keep. Is ROOT the image tree (one folder per identity)? If it is, give "
        "the process more memory (or read one folder at a time: --workers 1)\n"
    )
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "faces.lst").exists()


def test_a_thread_that_cannot_start_is_out_of_memory_too(tmp_path, monkeypatch):
    # Under `ulimit -v`, a thread's stack is what runs out first: Thread.start raises
    # RuntimeError("can't start new thread") as the walk's pool grows.
    root = tmp_path / "faces"
    face_tree(root, identities=3, per_identity=2)

    def cannot_start(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", cannot_start)
    result = run("list", root, tmp_path / "faces.lst", "--workers", "4")
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: out of memory while listing {root}: ")
    assert result.output.endswith("(or read one folder at a time: --workers 1)\n")
    assert not (tmp_path / "faces.lst").exists()
