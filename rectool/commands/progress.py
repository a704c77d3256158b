"""Progress, at the edge: a tqdm bar on a terminal's stderr, a line every few seconds on any
other stderr (a CI log), nothing with -q. The library reports through callbacks."""

from __future__ import annotations

import os
import sys
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
    """Return (callback(done, total, refused), close) printing a progress line on stderr at most
    every LOG_EVERY_SECONDS (what a CI log shows), and the last one when closed if any was
    printed: a run shorter than that prints no progress at all."""
    last = clock()
    line: str | None = None
    printed: str | None = None
    name = click.get_current_context(silent=True)
    command = name.info_name if name is not None else "rectool"

    def update(done: int, total: int | None, refused: int = 0) -> None:
        nonlocal last, line, printed
        of = f"/{total:,}" if total else ""
        part = f" ({100 * done // total}%)" if total else ""
        more = f", {refused:,} refused" if refused else ""
        what = f" {phase}" if phase else ""
        line = f"{command}{what}: {done:,}{of} {unit}{part}{more}"
        now = clock()
        if now - last >= LOG_EVERY_SECONDS:
            last = now
            printed = line
            click.echo(line, err=True)

    def close() -> None:
        nonlocal printed
        if printed is not None and line != printed:
            printed = line
            click.echo(line, err=True)

    return update, close


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


def phase_progress(quiet: bool) -> tuple[PhaseProgress | None, Close]:
    """Return (callback(phase, done, total), close): one tqdm bar per phase on a terminal's
    stderr, a line every few seconds per phase on any other (a CI log)."""
    if quiet:
        return None, lambda: None
    if not sys.stderr.isatty():
        loggers: dict[str, tuple[Progress, Close]] = {}

        def log(phase: str, done: int, total: int | None) -> None:
            if phase not in loggers:
                loggers[phase] = _log_progress("B" if phase == "bytes" else "img", phase)
            loggers[phase][0](done, total, 0)

        return log, lambda: [close() for _, close in loggers.values()]
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def update(phase: str, done: int, total: int | None) -> None:
        bar = bars.get(phase)
        if bar is None:
            unit = "B" if phase == "bytes" else "img"
            bar = bars[phase] = tqdm(
                desc=phase, unit=unit, unit_scale=True, file=sys.stderr, position=len(bars)
            )
        bar.total = total
        bar.update(done - bar.n)

    def close() -> None:
        for bar in bars.values():
            bar.close()

    return update, close
