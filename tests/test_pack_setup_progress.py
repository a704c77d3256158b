"""`rectool pack` in a log is never silent before its first image (issue 37).

Reading and checking the list, and with --resume hashing the finished shards and reading
past the lines already done, take minutes on a large pack: each is a phase of the log,
said as it begins when long (LONG_PHASE, set to 1 here so that every phase is), and the log
stays within its 10 s. The clock is injected and moves on at each read (each call of the
library), and each stderr line is timed by it as it is printed.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli
from rectool.commands import progress as progress_module
from rectool.packer import packrun


class TickingClock:
    """A clock that moves on by `step` seconds every time it is read."""

    def __init__(self, step):
        self.now, self.step, self.start = 0.0, step, None

    def __call__(self):
        self.now += self.step
        if self.start is None:
            self.start = self.now
        return self.now


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["ann", "bob", "cat"], 10)
    return root, write_list(tmp_path / "faces.lst", items)


def run_logged(monkeypatch, args, step=3.0):
    """Run `rectool ARGS` with a ticking clock, a 10 s interval and every phase long;
    return (result, [(clock time, stderr line)], clock)."""
    clock = TickingClock(step)
    lines = []
    real_echo = click.echo

    def echo(message=None, *rest, err=False, **kwargs):
        if err and message is not None:
            lines.extend((clock.now, text) for text in str(message).splitlines())
        return real_echo(message, *rest, err=err, **kwargs)

    monkeypatch.setattr(progress_module, "clock", clock)
    monkeypatch.setattr(progress_module, "LOG_EVERY_SECONDS", 10.0)
    monkeypatch.setattr(progress_module, "LONG_PHASE", 1)
    monkeypatch.setattr(click, "echo", echo)
    result = CliRunner().invoke(cli, [str(a) for a in args])
    monkeypatch.undo()
    return result, lines, clock


def longest_silence(lines, clock):
    times = [clock.start, *(time for time, _ in lines), clock.now]
    return max(b - a for a, b in zip(times, times[1:]))


def first(texts, start):
    return next(i for i, text in enumerate(texts) if text.startswith(start))


def test_pack_says_it_reads_the_list_before_its_first_image(tree, tmp_path, monkeypatch):
    root, lst = tree
    args = ["pack", lst, root, tmp_path / "out" / "faces", "--workers", "1"]
    result, lines, clock = run_logged(monkeypatch, args)
    assert result.exit_code == 0, result.output
    texts = [text for _, text in lines]
    size = lst.stat().st_size
    assert texts[0] == f"pack list bytes: 0/{size:,} B (0%)"
    assert f"pack list bytes: {size:,}/{size:,} B (100%)" in texts
    assert first(texts, "pack list bytes") < first(texts, "pack: ")
    assert longest_silence(lines, clock) <= 10


def test_pack_resume_says_each_step_before_its_first_image(tree, tmp_path, monkeypatch):
    root, lst = tree
    prefix = tmp_path / "out" / "faces"
    args = ["pack", lst, root, prefix, "--shard-records", "4", "--workers", "1"]
    # Interrupted (SIGINT, in this process) once the first block of items is done: shards
    # written, no manifest.
    monkeypatch.setenv(packrun.FAULT_VARIABLE, "SIGINT:13")
    interrupted = CliRunner().invoke(cli, [str(a) for a in args])
    monkeypatch.delenv(packrun.FAULT_VARIABLE)
    assert interrupted.exit_code != 0
    assert list(prefix.parent.glob("*.partial"))
    result, lines, clock = run_logged(monkeypatch, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    texts = [text for _, text in lines]
    steps = [
        first(texts, "pack list bytes: 0/"),
        first(texts, "pack resume bytes: 0/"),
        first(texts, "pack resume lines: 0/"),
        first(texts, "pack: "),
    ]
    assert steps == sorted(steps), texts
    assert longest_silence(lines, clock) <= 10
