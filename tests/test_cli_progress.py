"""What a CI log sees: progress as a line every LOG_EVERY_SECONDS when stderr is not a terminal
(the clock is injected), nothing extra from a short run, and -q never hiding why a command
exits non-zero (issue 21)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli
from rectool.commands import progress as progress_module


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["ann", "bob"], 3)
    return root, write_list(tmp_path / "faces.lst", items)


class TickingClock:
    """A clock that moves on by `step` seconds every time it is read."""

    def __init__(self, step):
        self.now, self.step = 0.0, step * 1e9  # the suite sets a 1e9 s interval (conftest)

    def __call__(self):
        self.now += self.step
        return self.now


def test_a_long_run_prints_progress_lines_into_a_log(tree, tmp_path, monkeypatch):
    root, lst = tree
    monkeypatch.setattr(progress_module, "clock", TickingClock(1))
    result = CliRunner().invoke(cli, ["pack", str(lst), str(root), str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stderr.splitlines() if line.startswith("pack: ")]
    assert progress and progress[-1] == "pack: 6/6 img (100%)"
    assert all(line.endswith("%)") for line in progress)


def test_verify_logs_its_phases(tree, tmp_path, monkeypatch):
    root, lst = tree
    assert (
        CliRunner().invoke(cli, ["pack", str(lst), str(root), str(tmp_path / "p")]).exit_code == 0
    )
    monkeypatch.setattr(progress_module, "clock", TickingClock(1))
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert any(line.startswith("verify bytes: ") for line in result.stderr.splitlines())


def test_a_short_run_prints_no_progress(tree, tmp_path, monkeypatch):
    root, lst = tree
    monkeypatch.setattr(progress_module, "clock", TickingClock(0.0))  # time stands still
    result = CliRunner().invoke(cli, ["pack", str(lst), str(root), str(tmp_path / "p")])
    assert result.exit_code == 0
    assert not any(line.startswith("pack: ") for line in result.stderr.splitlines())


def test_quiet_still_says_why_pack_exits_3(tree, tmp_path):
    root, _ = tree
    (root / "bob" / "empty.jpg").write_bytes(b"")
    lst = write_list(tmp_path / "bad.lst", [(0, 0, "ann/000.jpg"), (1, 1, "bob/empty.jpg")])
    result = CliRunner().invoke(cli, ["pack", str(lst), str(root), str(tmp_path / "p"), "-q"])
    assert result.exit_code == 3
    assert result.stderr == "Error: more than --max-failures 0 refused (1)\n"
