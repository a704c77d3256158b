"""What a CI log sees: progress as a line every LOG_EVERY_SECONDS when stderr is not a terminal
(the clock is injected), nothing extra from a short run, and -q never hiding why a command
exits non-zero (issue 21)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli
from rectool.commands import progress as progress_module
from rectool.commands.progress import PhaseLog


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


# --- issue 37: info and report are never silent in a log ---------------------------------------


class SteppedClock:
    """A clock that reads the times it is set to, in order (the last one after that)."""

    def __init__(self, *times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0) if len(self.times) > 1 else self.times[0]


def test_a_phase_log_is_never_silent_longer_than_its_interval_across_phases():
    lines = []
    times = [0.0] + [0.5 * k for k in range(1, 81)]  # a call every half second, for 40 s
    log = PhaseLog("report", clock=SteppedClock(*times), every=10, echo=lines.append)
    printed_at = []
    for k, t in enumerate(times[1:]):
        phase = "records" if k < 30 else "duplicates"  # the phase changes mid-way
        before = len(lines)
        log(phase, k, 80)
        if len(lines) > before:
            printed_at.append(t)
    # One clock for every phase, a line 9 s after the last (10 s less a second of margin, more
    # than the calls' gap): never silent 10 s; a phase that ends says its last state.
    assert printed_at == [9.0, 15.5, 24.5, 33.5]
    assert lines[:2] == ["report records: 17/80 img (21%)", "report records: 29/80 img (36%)"]
    log.close()
    assert lines[-1] == "report duplicates: 79/80 img (98%)"


def test_a_phase_log_keeps_its_silence_within_the_interval_when_calls_come_far_apart():
    lines = []
    times = [0.0, 3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 21.0]  # a call every 3 s
    log = PhaseLog("verify", clock=SteppedClock(*times), every=10, echo=lines.append)
    printed_at = []
    for k, t in enumerate(times[1:]):
        before = len(lines)
        log("records", k, 7)
        if len(lines) > before:
            printed_at.append(t)
    assert printed_at == [9.0, 18.0]  # due 7 s after a line: the next call would be too late


def test_a_long_phase_is_said_as_it_begins():
    lines = []
    log = PhaseLog("info", clock=SteppedClock(0.0), every=10, echo=lines.append)
    log("labels", 0, 999_999)  # short: nothing yet
    log("sample", 0, 1_000_000)  # a million items: said at once, whatever the clock
    log("bytes", 0, 10**9)
    log("bytes", 5, 10**9)
    assert lines == ["info sample: 0/1,000,000 img (0%)", "info bytes: 0/1,000,000,000 B (0%)"]


def test_report_logs_its_scan_and_keeps_stdout_one_json_document(tree, tmp_path, monkeypatch):
    root, lst = tree
    assert (
        CliRunner().invoke(cli, ["pack", str(lst), str(root), str(tmp_path / "p")]).exit_code == 0
    )
    monkeypatch.setattr(progress_module, "clock", TickingClock(1))
    args = ["report", str(tmp_path / "p"), "-o", str(tmp_path / "r.html"), "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # one document
    log = result.stderr.splitlines()
    for phase in ("labels", "sample", "records", "bytes", "thumbnails", "duplicates"):
        assert any(line.startswith(f"report {phase}: ") for line in log), phase
    assert "report records: 6/6 img (100%)" in log
    size = (tmp_path / "p.rec").stat().st_size
    assert f"report bytes: {size:,}/{size:,} B (100%)" in log


def test_info_logs_its_phases(tree, tmp_path, monkeypatch):
    root, lst = tree
    assert (
        CliRunner().invoke(cli, ["pack", str(lst), str(root), str(tmp_path / "p")]).exit_code == 0
    )
    monkeypatch.setattr(progress_module, "clock", TickingClock(1))
    result = CliRunner().invoke(cli, ["info", str(tmp_path / "p"), "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert "info labels: 6/6 img (100%)" in result.stderr.splitlines()


def test_every_command_s_log_line_keeps_to_the_same_rule(monkeypatch, capsys):
    # pack, list, repack, unpack report through progress_bar: a line when the next call would
    # come too late to keep the silence within the interval (calls every 3 s: due after 7 s).
    times = [0.0, 3.0, 6.0, 9.0, 12.0, 15.0, 18.0]
    monkeypatch.setattr(progress_module, "clock", SteppedClock(*times))
    monkeypatch.setattr(progress_module, "LOG_EVERY_SECONDS", 10.0)
    update, close = progress_module.progress_bar(False, "img")
    for done in range(1, 7):
        update(done, 6, 0)
    close()
    assert capsys.readouterr().err.splitlines() == [
        "rectool: 3/6 img (50%)",
        "rectool: 6/6 img (100%)",
    ]


# --- issue 37: a step the library does not count (an fsync, an index written at the end) ------


def test_the_heartbeat_says_the_last_state_when_the_library_goes_quiet():
    lines = []
    clock = SteppedClock(0.0, 1.0, 2.0, 6.0, 7.5, 8.0, 14.0)
    log = PhaseLog("repack", clock=clock, every=10, echo=lines.append)  # created at 0
    log.offer("", "repack: 5/10 rec (50%)")  # at 1 (as `progress_bar` offers): not due
    log.beat()  # at 2: printed 2 s ago (the log's start): nothing
    log.beat()  # at 6: 6 s of silence, under 0.7 of the interval: nothing
    assert lines == []
    log.beat()  # at 7.5: silent 7.5 s, the last call 6.5 s ago
    assert lines == ["repack: 5/10 rec (50%), still working (6 s since)"]
    log.beat()  # at 8: a line 0.5 s ago
    assert len(lines) == 1
    log.beat()  # at 14: 6.5 s after the last line: nothing yet
    assert len(lines) == 1


def test_the_heartbeat_before_any_step_says_the_command_is_working():
    lines = []
    log = PhaseLog("repack", clock=SteppedClock(0.0, 9.0), every=10, echo=lines.append)
    log.beat()
    assert lines == ["repack: still working (9 s)"]


def test_the_heartbeat_thread_ends_with_the_log():
    log = PhaseLog("verify", every=1e9, echo=lambda line: None)  # the real clock
    log.start_heartbeat()
    assert log.heartbeat is not None and log.heartbeat.is_alive()
    log.close()
    log.heartbeat.join(timeout=60)
    assert not log.heartbeat.is_alive()


def test_no_heartbeat_thread_runs_on_an_injected_clock_nor_beats_after_close():
    # Tests drive `beat` themselves: a thread reading their clock would move it under them.
    lines = []
    log = PhaseLog("verify", clock=SteppedClock(0.0, 1e10), every=1e9, echo=lines.append)
    log.start_heartbeat()
    assert log.heartbeat is None
    log.close()
    log.beat()  # ten intervals of silence later, but closed: nothing
    assert lines == []


@pytest.mark.parametrize("command", ["pack", "repack", "verify"])
def test_json_consumers_see_progress_on_stderr_and_one_document_on_stdout(
    tree, tmp_path, monkeypatch, command
):
    root, lst = tree
    made = CliRunner().invoke(cli, ["pack", str(lst), str(root), str(tmp_path / "p")])
    assert made.exit_code == 0, made.output
    monkeypatch.setattr(progress_module, "clock", TickingClock(1))
    args = {
        "pack": ["pack", str(lst), str(root), str(tmp_path / "q")],
        "repack": ["repack", str(tmp_path / "p"), str(tmp_path / "r")],
        "verify": ["verify", str(tmp_path / "p")],
    }[command]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert any(line.startswith(command) for line in result.stderr.splitlines()), result.stderr


def test_a_heartbeat_that_cannot_start_leaves_the_command_alone(monkeypatch):
    # Under `ulimit -v` a thread's stack is what runs out first: the log goes on without it.
    import threading

    def cannot_start(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", cannot_start)
    log = PhaseLog("list", every=1e9, echo=lambda line: None)
    log.start_heartbeat()
    assert log.heartbeat is None
    log.close()
