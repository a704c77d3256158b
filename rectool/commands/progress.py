"""Progress, at the edge: a tqdm bar on a terminal's stderr, a line every few seconds on any
other stderr (a CI log), nothing with -q. The library reports through callbacks."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TypedDict

import click

# When stderr is not a terminal (a CI log, a file), progress is a line every this many seconds
# of `clock` (tests set both), instead of a bar.
LOG_EVERY_SECONDS = float(os.environ.get("RECTOOL_PROGRESS_SECONDS") or 10.0)


clock = time.monotonic

# What the library calls as it goes: (done, total, refused), (phase, done, total); and a close.
Progress = Callable[[int, int | None, int], None]
PhaseProgress = Callable[[str, int, int | None], None]
Close = Callable[[], object]


def _log_progress(unit: str, phase: str | None = None) -> tuple[Progress, Close]:
    """Return (callback(done, total, refused), close) printing a progress line on stderr as a
    `PhaseLog` does (at most every LOG_EVERY_SECONDS, what a CI log shows), and the last one
    when closed if any was printed: a run shorter than that prints no progress at all."""
    name = click.get_current_context(silent=True)
    command = (name.info_name if name is not None else None) or "rectool"
    log = PhaseLog(command)
    log.start_heartbeat()
    what = f" {phase}" if phase else ""

    def update(done: int, total: int | None, refused: int = 0) -> None:
        of = f"/{total:,}" if total else ""
        part = f" ({100 * done // total}%)" if total else ""
        more = f", {refused:,} refused" if refused else ""
        log.offer(phase or "", f"{command}{what}: {done:,}{of} {unit}{part}{more}")

    return update, log.close


def progress_bar(quiet: bool, unit: str) -> tuple[Progress | None, Close]:
    """Return (callback, close): a tqdm bar on a terminal's stderr, a line every few seconds on
    any other stderr (a CI log), or no-ops when quiet."""
    if quiet:
        return None, lambda: None
    if not sys.stderr.isatty():
        return _log_progress(unit)
    from tqdm import tqdm

    bar = tqdm(unit=unit, unit_scale=True, file=sys.stderr, dynamic_ncols=True)
    shown = 0

    def update(done: int, total: int | None, refused: int) -> None:
        nonlocal shown
        if bar.total != total:
            bar.total = total
        bar.update(done - shown)
        shown = done
        if refused:
            bar.set_postfix(refused=refused, refresh=False)

    return update, bar.close


def setup_progress(quiet: bool, unit: str) -> tuple[PhaseProgress | None, Progress | None, Close]:
    """Return (setup, update, close): `phase_progress` for the steps before a run's items
    (reading its list...), `progress_bar` for the items. The first item's update ends the
    steps' log (their last state said); `close` ends both."""
    setup, close_setup = phase_progress(quiet)
    update, close = progress_bar(quiet, unit)
    if update is None:
        return setup, None, close_setup
    items = update
    closed = False

    def first_closes(done: int, total: int | None, refused: int) -> None:
        nonlocal closed
        if not closed:
            closed = True
            close_setup()
        items(done, total, refused)

    def close_both() -> None:
        close_setup()
        close()

    return setup, first_closes, close_both


class Seen(TypedDict):
    """The last (done, total) a progress callback was given."""

    done: int
    total: int | None


def remember_progress(update: Progress | None) -> tuple[Progress, Seen]:
    """Return (callback, seen): `update` wrapped so that `seen` holds the last (done, total)."""
    seen: Seen = {"done": 0, "total": None}

    def remember(done: int, total: int | None, refused: int) -> None:
        seen["done"], seen["total"] = done, total
        if update is not None:
            update(done, total, refused)

    return remember, seen


# A phase this large (items; bytes: a thousand times more) may take seconds: its start is
# said in a log at once, so that a long set-up phase is never silent (issue 37).
LONG_PHASE = 1_000_000


# What a phase counts, by the last word of its name ("list bytes", "resume lines"): images
# when it is none of these.
PHASE_UNITS = {"bytes": "B", "lines": "lines"}


def phase_unit(phase: str) -> str:
    """Return the unit a phase's progress counts in: B, lines or img."""
    return PHASE_UNITS.get(phase.rsplit(" ", 1)[-1], "img")


class PhaseLog:
    """Progress of a command's phases as lines on a log's stderr: `log(phase, done, total)`.

    A line as soon as a call comes too late for the next one to keep the log's silence within
    `every` seconds of `clock` (the module's `clock` when not given): when `every`, less the
    longest gap between two calls seen so far (a second at least: the process started before
    the log; half of `every` at most), has passed since the last line of any phase. So the
    log is never silent for longer than `every` while the library's calls come no farther
    apart than they have. Also a line at once when a phase of LONG_PHASE items or more
    begins, and, as a phase a line was printed for ends (another begins, or `close`), its
    last state.
    """

    def __init__(
        self,
        command: str,
        clock: Callable[[], float] | None = None,
        every: float | None = None,
        echo: Callable[[str], object] | None = None,
    ) -> None:
        self.command = command
        self._clock = clock
        self.every = LOG_EVERY_SECONDS if every is None else every
        self._echo = echo or (lambda line: click.echo(line, err=True))
        self.last = self._called = self.now()
        self._gap = 0.0  # the longest time between two calls so far
        self._lines: dict[str, str] = {}  # phase: its latest line
        self._printed: dict[str, str] = {}  # phase: its last line printed
        self._phase: str | None = None  # the phase going on
        self.started = self.last
        self._lock = threading.Lock()  # the heartbeat prints from its own thread
        self._stop = threading.Event()
        self.heartbeat: threading.Thread | None = None

    def now(self) -> float:
        return (self._clock or clock)()

    def line(self, phase: str, done: int, total: int | None) -> str:
        unit = phase_unit(phase)
        of = f"/{total:,}" if total else ""
        part = f" ({100 * done // total}%)" if total else ""
        return f"{self.command} {phase}: {done:,}{of} {unit}{part}"

    def __call__(self, phase: str, done: int, total: int | None) -> None:
        with self._lock:
            self._call(phase, done, total)

    def _call(self, phase: str, done: int, total: int | None) -> None:
        now = self.now()
        self._gap = max(self._gap, now - self._called)
        self._called = now
        if self._phase not in (None, phase):
            self._finish(self._phase, now)  # the phase before ended: its last state, if shown
        self._phase = phase
        large = LONG_PHASE * (1000 if phase_unit(phase) == "B" else 1)
        starts = phase not in self._printed and not done and (total or 0) >= large
        self._offer(phase, self.line(phase, done, total), now, starts)

    def offer(self, phase: str, line: str) -> None:
        """Print `line` of `phase` if it is due (the same rule, with a line made elsewhere)."""
        with self._lock:
            self._offer_line(phase, line)

    def _offer_line(self, phase: str, line: str) -> None:
        now = self.now()
        self._gap = max(self._gap, now - self._called)
        self._called = now
        if self._phase not in (None, phase):
            self._finish(self._phase, now)
        self._phase = phase
        self._offer(phase, line, now, False)

    def _offer(self, phase: str, line: str, now: float, starts: bool) -> None:
        self._lines[phase] = line
        due = self.every - min(max(self._gap, 1.0), self.every / 2)
        if starts or now - self.last >= due:
            self._print(phase, line, now)

    def _print(self, phase: str, line: str, now: float) -> None:
        self.last = now
        self._printed[phase] = line
        self._echo(line)

    def _finish(self, phase: str, now: float) -> None:
        printed = self._printed.get(phase)
        if printed is not None and self._lines[phase] != printed:
            self._print(phase, self._lines[phase], now)

    def close(self) -> None:
        """Stop the heartbeat; print the last state of the phase going on, if a line of it was
        printed."""
        self._stop.set()
        with self._lock:
            if self._phase is not None:
                self._finish(self._phase, self.last)

    def start_heartbeat(self) -> None:
        """Call `beat` from a daemon thread a few times an `every` until `close`: a step the
        library does not count (an fsync, an index written at the end, a sort) keeps the log
        from going silent (issue 37)."""

        if self._clock is not None or clock is not time.monotonic:
            return  # a clock a test injected: the test calls `beat` itself, when it chooses

        def run() -> None:
            while not self._stop.wait(self.every / 4):
                self.beat()

        beat = threading.Thread(target=run, name="rectool-progress", daemon=True)
        try:
            beat.start()
        except RuntimeError:  # no thread to be had (under `ulimit -v`): the log without it
            return
        self.heartbeat = beat

    def beat(self) -> None:
        """Print the last state when nothing has been printed for 0.7 `every` seconds (so,
        called every `every / 4`, the log is never silent for `every`): as it is when the
        library called within the last second, else said to be still going on."""
        with self._lock:
            now = self.now()
            if self._stop.is_set() or now - self.last < 0.7 * self.every:
                return
            line = self._lines.get(self._phase) if self._phase is not None else None
            if line is None:
                text = f"{self.command}: still working ({now - self.started:.0f} s)"
            else:
                since = now - self._called
                text = line if since < 1 else f"{line}, still working ({since:.0f} s since)"
                self._printed[self._phase or ""] = line
            self.last = now
            self._echo(text)


def phase_progress(quiet: bool) -> tuple[PhaseProgress | None, Close]:
    """Return (callback(phase, done, total), close): one tqdm bar per phase on a terminal's
    stderr, a `PhaseLog` on any other (a CI log)."""
    if quiet:
        return None, lambda: None
    if not sys.stderr.isatty():
        context = click.get_current_context(silent=True)
        log = PhaseLog((context.info_name if context is not None else None) or "rectool")
        log.start_heartbeat()
        return log, log.close
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def update(phase: str, done: int, total: int | None) -> None:
        bar = bars.get(phase)
        if bar is None:
            unit = phase_unit(phase)
            bar = bars[phase] = tqdm(
                desc=phase, unit=unit, unit_scale=True, file=sys.stderr, position=len(bars)
            )
        bar.total = total
        bar.update(done - bar.n)

    def close() -> None:
        for bar in bars.values():
            bar.close()

    return update, close
