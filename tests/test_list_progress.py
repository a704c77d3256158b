"""`rectool list` in a log (stderr not a terminal) is never silent for more than 10 s (issue 37).

The clock is injected (`progress.clock`): it moves on by a step each time it is read, that is
at each call the library makes, so a step stands for the work between two calls. The lines
are timed by that clock as they are printed.
"""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner
from helpers.image_trees import face_tree

from rectool.cli import cli
from rectool.commands import progress as progress_module


class TickingClock:
    """A clock that moves on by `step` seconds every time it is read."""

    def __init__(self, step):
        self.now, self.step, self.start = 0.0, step, None

    def __call__(self):
        self.now += self.step
        if self.start is None:
            self.start = self.now  # the log starts
        return self.now


@pytest.fixture
def timed_log(monkeypatch):
    """Run a command with a ticking clock and a 10 s interval; return (result, lines) where
    lines are (clock time, text) of what it printed on stderr, the summary included."""

    def run(args, step=3.0, long_phase=None):
        clock = TickingClock(step)
        lines = []
        real_echo = click.echo

        def echo(message=None, *args, err=False, **kwargs):
            if err and message is not None:
                lines.extend((clock.now, text) for text in str(message).splitlines())
            return real_echo(message, *args, err=err, **kwargs)

        monkeypatch.setattr(progress_module, "clock", clock)
        monkeypatch.setattr(progress_module, "LOG_EVERY_SECONDS", 10.0)
        monkeypatch.setattr(click, "echo", echo)
        if long_phase is not None:
            monkeypatch.setattr(progress_module, "LONG_PHASE", long_phase)
        result = CliRunner().invoke(cli, [str(a) for a in args])
        return result, lines

    return run


def longest_silence(lines, clock):
    """Return the longest time between the log's start, its lines and the clock's last time."""
    times = [clock.start, *(time for time, _ in lines), clock.now]
    return max(b - a for a, b in zip(times, times[1:]))


@pytest.mark.parametrize(
    "options",
    [[], ["--shuffle", "--seed", "3", "--val-ratio", "0.2", "--chunks", "2"]],
)
def test_list_is_never_silent_for_more_than_10_s(tmp_path, timed_log, options):
    face_tree(tmp_path / "faces", identities=40, per_identity=3)
    result, lines = timed_log(["list", tmp_path / "faces", tmp_path / "x.lst", *options])
    assert result.exit_code == 0, result.output
    assert longest_silence(lines, progress_module.clock) <= 10
    walk = [text for _, text in lines if "identity folders" in text]
    assert len(walk) >= 5  # 40 folders, 3 s each, a line at least every 10 s
    assert walk[-1] == "list: 40/40 identity folders (100%), 40 folders read, 120 images found"


def test_list_says_each_step_after_the_walk_as_it_begins(tmp_path, timed_log):
    # A step of a million rows or more is said as it begins; here every one is (LONG_PHASE 1).
    face_tree(tmp_path / "faces", identities=4, per_identity=3)
    args = ["list", tmp_path / "faces", tmp_path / "x.lst", "--shuffle", "--seed", "1"]
    result, lines = timed_log(args, step=0.0, long_phase=1)
    assert result.exit_code == 0, result.output
    texts = [text for _, text in lines]
    begins = [texts.index(f"list {phase}: 0/12 img (0%)") for phase in ("shuffle", "gather")]
    begins.append(texts.index("list write: 0/12 img (0%)"))
    assert begins == sorted(begins)
    summary = [i for i, text in enumerate(texts) if text.startswith("Listed 12 images of 4")]
    assert begins[-1] < summary[0]


def test_a_short_list_prints_only_its_summary(tmp_path, timed_log):
    face_tree(tmp_path / "faces", identities=4, per_identity=3)
    result, lines = timed_log(["list", tmp_path / "faces", tmp_path / "x.lst"], step=0.0)
    assert result.exit_code == 0
    assert [text for _, text in lines][0].startswith("Listed 12 images of 4 identities")


def test_list_json_keeps_stdout_one_document_and_progress_on_stderr(tmp_path, timed_log):
    # Issue 37: "the same through --json consumers (progress stays on stderr)".
    face_tree(tmp_path / "faces", identities=40, per_identity=3)
    result, lines = timed_log(["list", tmp_path / "faces", tmp_path / "x.lst", "--json"])
    assert json.loads(result.stdout)["images"] == 120
    assert longest_silence(lines, progress_module.clock) <= 10
    assert any("identity folders" in text for _, text in lines)
