"""`rectool bench`: how fast a dataset reads."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from ..text import counted
from .conventions import (
    RectoolCommand,
    emit_json,
    library_errors,
    write_stream,
)
from .options import json_option, max_pixels_option, renamed_option, workers_option
from .paramtypes import MAX_SECONDS, Count, Finite

if TYPE_CHECKING:
    from ..inspect.bench import BenchReport


@click.command(cls=RectoolCommand, name="bench")
@renamed_option("--decode", "--decode-as", "decode", type=click.Choice(["rgb", "bgr", "gray"]))
@click.argument("target")
@click.option(
    "--samples",
    type=Count(1),
    default=5000,
    show_default=True,
    help="Samples read in each phase (at most).",
)
@click.option(
    "--seconds",
    type=Finite(0.1, MAX_SECONDS),
    default=10.0,
    show_default=True,
    help="Time limit of each phase.",
)
@workers_option("Processes decoding in parallel in the last phase.")
@click.option(
    "--decode-as",
    "decode",
    type=click.Choice(["rgb", "bgr", "gray"]),
    default="rgb",
    show_default=True,
    help="Decoded format, as the reader's open_dataset(decode=...).",
)
@max_pixels_option("Refuse images whose header declares more pixels, as open_dataset does.")
@json_option("Print the report as JSON.")
@library_errors
def bench_command(
    target: str,
    samples: int,
    seconds: float,
    workers: int,
    decode: str,
    max_pixels: int,
    as_json: bool,
) -> None:
    """Measure how fast TARGET reads, the way training will read it.

    TARGET is a manifest, a prefix, a .rec file or an insightface folder. Reports the time
    to open, raw records/s and MB/s in file order and random order (storage), and decoded
    images/s in one process and in --workers processes (CPU): compare the last figure with
    the images/s your training step consumes to see which side is the bottleneck.

    \b
    Example:
        rectool bench out/faces.manifest.json --workers 8
    """
    from ..inspect.bench import bench_dataset

    def announce(name: str) -> None:
        if not as_json and sys.stderr.isatty():
            click.echo(f"measuring: {name} ...", err=True)

    report = bench_dataset(
        target, samples, seconds, workers, decode, progress=announce, max_pixels=max_pixels
    )
    if as_json:
        emit_json(report.to_json())
        return
    write_stream(render_bench_report(report))  # the answer: stdout


def render_bench_report(report: BenchReport) -> str:
    """Return the human table of a `BenchReport`."""
    lines = [
        f"{report.source}: {report.samples:,} samples ({report.layout} layout), "
        f"opened in {report.open_seconds * 1000:.1f} ms",
        f"  {'phase':<32} {'samples':>8} {'samples/s':>11} {'MB/s':>9}",
    ]
    for p in report.phases:
        lines.append(
            f"  {p.name:<32} {p.samples:>8,} {p.per_second:>11,.0f} {p.mb_per_second:>9,.1f}"
        )
    if report.phases:
        last = report.phases[-1]
        lines.append(
            f"Decoding gives {last.per_second:,.0f} images/s with "
            f"{counted(last.workers, 'process')}: a training step that consumes fewer is the "
            "bottleneck; one that consumes more needs more loader workers or GPU decoding."
        )
    return "\n".join(lines)
