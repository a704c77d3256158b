"""The `rectool` command line: parse options, call the library, render the result.

Each command is a thin skin over one library call. Library errors (`RectoolError`) become
`Error: ...` with exit status 1; usage errors exit 2, as click does.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import click
from tqdm import tqdm

from . import __version__
from .errors import RectoolError, UsageError
from .images import ENCODINGS, Transform
from .packing import LAYOUTS, PackOptions, pack_images
from .shards import parse_size


def library_errors(func):
    """Turn the library's own exceptions into click's: exit 1 (`Error: ...`) or 2 for usage."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from exc
        except RectoolError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rectool")
def cli():
    """Pack identity-per-folder image trees into MXNet RecordIO shards and read them back.

    \b
    Example:
        rectool list faces/ faces.lst
        rectool pack faces.lst faces/ out/faces
        rectool verify out/faces.manifest.json
    """


class ByteSize(click.ParamType):
    """A byte count written as `512MB`, `2GiB` or a plain number."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def progress_bar(quiet, unit):
    """Return (callback, close) drawing a tqdm bar on stderr, or no-ops when quiet/not a tty."""
    if quiet or not sys.stderr.isatty():
        return None, lambda: None
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


@cli.command("pack")
@click.argument("list_file", metavar="LIST", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("root", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("prefix", metavar="OUT_PREFIX")
@click.option(
    "--pack-label",
    is_flag=True,
    help="Store every list label as a float32 vector (flag > 0), as im2rec.",
)
@click.option(
    "--no-check", is_flag=True, help="Pass-through without checking that each image decodes."
)
@click.option(
    "--resize",
    type=click.IntRange(min=1),
    help="Re-encode with the shorter side resized to N pixels.",
)
@click.option("--center-crop", is_flag=True, help="Re-encode, cropping the centre square first.")
@click.option(
    "--quality",
    type=click.IntRange(0, 100),
    help="Re-encode: JPEG quality 1-100 (default 95) or PNG compression 0-9 (default 3).",
)
@click.option(
    "--encoding", type=click.Choice(ENCODINGS), help="Re-encode as JPEG or PNG (default .jpg)."
)
@click.option(
    "--color",
    type=click.Choice(["-1", "0", "1"]),
    help="Re-encode: 1 colour, 0 grayscale, -1 unchanged (default 1).",
)
@click.option(
    "--shard-size",
    type=ByteSize(),
    help="Roll over to a new shard before a shard's .rec passes this size (e.g. 512MB, 2GiB).",
)
@click.option(
    "--shard-records", type=click.IntRange(min=1), help="Roll over to a new shard every N records."
)
@click.option(
    "--layout",
    type=click.Choice(LAYOUTS),
    default="images",
    show_default=True,
    help="images: keys as in the list. insightface: the face-dataset layout "
    "(header record 0, identity ranges, property file).",
)
@click.option(
    "--workers",
    "-j",
    type=click.IntRange(min=1),
    default=os.cpu_count() or 1,
    show_default="all cores",
    help="Worker threads reading, checking and encoding images.",
)
@click.option(
    "--max-failures",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Refused images accepted before the exit status turns to 3.",
)
@click.option(
    "--labels",
    "label_map",
    type=click.Path(exists=True, dir_okay=False),
    help="Label map (label<TAB>identity) for the manifest; "
    "default: the one `rectool list` wrote beside LIST.",
)
@click.option("--resume", is_flag=True, help="Continue an interrupted pack where it stopped.")
@click.option("--overwrite", is_flag=True, help="Replace an existing pack at OUT_PREFIX.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@library_errors
def pack_command(
    list_file,
    root,
    prefix,
    resize,
    center_crop,
    quality,
    encoding,
    color,
    resume,
    overwrite,
    label_map,
    quiet,
    as_json,
    no_check,
    **shared,
):
    """Pack the images of LIST (or - for stdin) under ROOT into OUT_PREFIX.rec/.idx shards.

    Images are passed through byte for byte, each checked to decode, unless a re-encoding
    option (--resize, --center-crop, --quality, --encoding, --color) is given. Broken images
    are never written: each is recorded in OUT_PREFIX.failures.jsonl. Shards are written as
    .partial files and renamed when complete; OUT_PREFIX.manifest.json is written last.

    Exit status: 0 packed (refusals within --max-failures), 1 error, 2 usage error,
    3 packed but more images refused than --max-failures allows.

    \b
    Example:
        rectool pack faces.lst faces/ out/faces --shard-size 2GiB
        rectool pack faces.lst faces/ out/faces112 --resize 112 --quality 95
    """
    transform = None
    if resize or center_crop or quality is not None or encoding or color is not None:
        encoding = encoding or ".jpg"
        if quality is None:
            quality = 3 if encoding == ".png" else 95
        elif encoding == ".png" and quality > 9:
            raise click.BadParameter("PNG compression must be 0-9", param_hint="--quality")
        elif encoding == ".jpg" and quality < 1:
            raise click.BadParameter("JPEG quality must be 1-100", param_hint="--quality")
        transform = Transform(resize or 0, center_crop, quality, encoding, int(color or 1))
    options = PackOptions(
        transform=transform,
        check=not no_check,
        pack_label=shared["pack_label"],
        shard_bytes=shared["shard_size"],
        shard_records=shared["shard_records"],
        layout=shared["layout"],
        workers=shared["workers"],
        max_failures=shared["max_failures"],
    )
    update, close = progress_bar(quiet or as_json, "img")
    try:
        result = pack_images(
            list_file,
            root,
            prefix,
            options,
            resume=resume,
            overwrite=overwrite,
            label_map=label_map,
            progress=update,
        )
    finally:
        close()
    if as_json:
        click.echo(json.dumps(pack_summary(result), ensure_ascii=False, indent=2))
    elif not quiet:
        click.echo(render_pack_summary(result), err=True)
    if not result.accepted:
        sys.exit(3)


def pack_summary(result):
    """Return the JSON summary of a pack."""
    totals = result.manifest["totals"]
    return {
        "manifest": result.manifest_path,
        "shards": [s["rec"] for s in result.manifest["shards"]],
        "images": result.images,
        "records": totals["records"],
        "rec_bytes": totals["rec_bytes"],
        "failures": result.failures,
        "failures_file": result.failures_path,
        "max_failures": result.manifest["options"]["max_failures"],
        "accepted": result.accepted,
        "resumed_from": result.resumed_from,
        "refused": [r.to_json() for r in result.refused],
    }


def render_pack_summary(result, shown=10):
    """Return the human summary of a pack."""
    totals = result.manifest["totals"]
    shards = result.manifest["shards"]
    lines = [
        f"Packed {result.images:,} images into {len(shards)} shard"
        f"{'s' if len(shards) != 1 else ''} ({totals['rec_bytes'] / 1e6:,.1f} MB); "
        f"manifest {result.manifest_path}"
    ]
    if result.resumed_from:
        lines.append(f"Resumed after {result.resumed_from:,} list items done earlier.")
    if result.failures:
        lines.append(f"Refused {result.failures:,} images (all listed in {result.failures_path}):")
        lines += [f"  line {r.line}: {r.path}: {r.reason}" for r in result.refused[:shown]]
        if result.failures > shown:
            lines.append(f"  ... and {result.failures - shown:,} more")
        if not result.accepted:
            allowed = result.manifest["options"]["max_failures"]
            lines.append(f"More than --max-failures {allowed} refused: exit status 3.")
    return "\n".join(lines)


def main():
    """Run the command line (the `rectool` console script)."""
    cli(prog_name="rectool")
