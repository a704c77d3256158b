"""Progress, at the edge: a tqdm bar on a terminal's stderr, a line every few seconds on any
other stderr (a CI log), nothing with -q. The library reports through callbacks."""

from __future__ import annotations

import os
import sys
import time

import click

# When stderr is not a terminal (a CI log, a file), progress is a line every this many seconds
# of `clock` (tests set both), instead of a bar.
LOG_EVERY_SECONDS = float(os.environ.get("RECTOOL_PROGRESS_SECONDS") or 10.0)


clock = time.monotonic


def _log_progress(unit, phase=None):
    """Return (callback(done, total, refused), close) printing a progress line on stderr at most
    every LOG_EVERY_SECONDS (what a CI log shows), and the last one when closed if any was
    printed: a run shorter than that prints no progress at all."""
    state = {"last": clock(), "line": None, "printed": None}
    name = click.get_current_context(silent=True)
    command = name.info_name if name is not None else "rectool"

    def update(done, total, refused=0):
        of = f"/{total:,}" if total else ""
        part = f" ({100 * done // total}%)" if total else ""
        more = f", {refused:,} refused" if refused else ""
        what = f" {phase}" if phase else ""
        state["line"] = f"{command}{what}: {done:,}{of} {unit}{part}{more}"
        now = clock()
        if now - state["last"] >= LOG_EVERY_SECONDS:
            state["last"] = now
            state["printed"] = state["line"]
            click.echo(state["line"], err=True)

    def close():
        if state["printed"] is not None and state["line"] != state["printed"]:
            state["printed"] = state["line"]
            click.echo(state["line"], err=True)

    return update, close


def progress_bar(quiet, unit):
    """Return (callback, close): a tqdm bar on a terminal's stderr, a line every few seconds on
    any other stderr (a CI log), or no-ops when quiet."""
    if quiet:
        return None, lambda: None
    if not sys.stderr.isatty():
        return _log_progress(unit)
    from tqdm import tqdm

    bar = tqdm(unit=unit, unit_scale=True, file=sys.stderr, dynamic_ncols=True)
    state = {"done": 0}

    def update(done, total, refused):
        if bar.total != total:
            bar.total = total
        bar.update(done - state["done"])
        state["done"] = done
        if refused:
            bar.set_postfix(refused=refused, refresh=False)

    return update, bar.close


def remember_progress(update):
    """Return (callback, seen): `update` wrapped so that `seen` holds the last (done, total)."""
    seen = {"done": 0, "total": None}

    def remember(done, total, refused):
        seen["done"], seen["total"] = done, total
        if update is not None:
            update(done, total, refused)

    return remember, seen


def phase_progress(quiet):
    """Return (callback(phase, done, total), close): one tqdm bar per phase on a terminal's
    stderr, a line every few seconds per phase on any other (a CI log)."""
    if quiet:
        return None, lambda: None
    if not sys.stderr.isatty():
        loggers = {}

        def log(phase, done, total):
            if phase not in loggers:
                loggers[phase] = _log_progress("B" if phase == "bytes" else "img", phase)
            loggers[phase][0](done, total)

        return log, lambda: [close() for _, close in loggers.values()]
    from tqdm import tqdm

    bars = {}

    def update(phase, done, total):
        bar = bars.get(phase)
        if bar is None:
            unit = "B" if phase == "bytes" else "img"
            bar = bars[phase] = tqdm(
                desc=phase, unit=unit, unit_scale=True, file=sys.stderr, position=len(bars)
            )
        bar.total = total
        bar.update(done - bar.n)

    def close():
        for bar in bars.values():
            bar.close()

    return update, close
