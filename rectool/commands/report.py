"""`rectool report`: one HTML page (and a contact sheet) of a dataset."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..text import counted
from .conventions import (
    RectoolCommand,
    emit_json,
    library_errors,
    local_targets,
    named_by_url,
)
from .info import exit_for_damage
from .options import (
    decode_option,
    json_option,
    max_pixels_option,
    output_option,
    overwrite_option,
    sample_option,
    seed_option,
)
from .paramtypes import ByteSize, Count
from .progress import phase_progress


@click.command(cls=RectoolCommand, name="report")
@click.argument("target")
@output_option(
    "The HTML page to write (one self-contained file).", click.Path(dir_okay=False, path_type=Path)
)
@click.option(
    "--sheet",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also (or only) write the contact sheet as an image (.jpg or .png).",
)
@seed_option("Seed of the identities sampled.")
@click.option(
    "--identities",
    type=Count(0),
    default=12,
    show_default=True,
    help="Identities sampled for the contact sheet.",
)
@click.option(
    "--per-identity",
    type=Count(1),
    default=8,
    show_default=True,
    help="Thumbnails shown per identity.",
)
@click.option(
    "--thumb",
    type=click.IntRange(16, 512),
    default=96,
    show_default=True,
    help="Thumbnail size in pixels (longest side).",
)
@sample_option("Images decoded, spread over the dataset, for the dimensions chart.")
@click.option(
    "--max-bytes",
    type=ByteSize(),
    default="5MB",
    show_default=True,
    help="Page size limit: thumbnails beyond it are left out (and counted).",
)
@click.option(
    "--images-root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The folder the pack read, to show thumbnails of refused images.",
)
@click.option("--verify", is_flag=True, help="Verify the dataset too and show the result.")
@decode_option("With --verify: decode every image too.")
@overwrite_option("Replace an existing page or sheet (never a file of a pack).")
@max_pixels_option(
    "Images whose header declares more pixels get no thumbnail (and are not decoded)."
)
@json_option("Print what was written as JSON on stdout.")
@library_errors
def report_command(
    target: str,
    output: Path | None,
    sheet: Path | None,
    seed: int,
    identities: int,
    per_identity: int,
    thumb: int,
    sample: int,
    max_bytes: int,
    images_root: Path | None,
    verify: bool,
    decode: bool,
    overwrite: bool,
    max_pixels: int,
    as_json: bool,
) -> None:
    """Write a report of TARGET (manifest, prefix, .rec or train.rec folder) as one HTML page.

    A TARGET that is the URL of a manifest (s3://, https://) is read from a copy of its pack
    downloaded into the cache folder ($RECTOOL_CACHE_DIR).

    The page holds a summary (records, images, identities, bytes, shards, layout, encodings,
    the pack's options), charts of images per identity, image sizes and bytes, a contact sheet
    of a seeded sample of identities and the smallest and largest ones, the pack's refusals,
    and images stored byte for byte under several identities. It needs no network: thumbnails
    are inline JPEG, charts inline SVG. The same seed and data give the same page.

    \b
    Example:
        rectool report out/faces.manifest.json -o report.html --images-root faces/
        rectool report faces_emore/train.rec -o report.html --verify
        rectool report out/faces --sheet sheet.jpg
    """
    from ..report.data import ReportOptions, write_report

    if output is None and sheet is None:
        raise click.UsageError("give --output/-o PAGE.html, --sheet IMAGE, or both")
    if decode and not verify:
        raise click.BadParameter("needs --verify", param_hint="--decode")
    settings = ReportOptions(
        seed=seed,
        identities=identities,
        per_identity=per_identity,
        thumb=thumb,
        sample=sample,
        max_bytes=max_bytes,
        verify=verify,
        decode=decode,
        images_root=None if images_root is None else os.fspath(images_root),
        max_pixels=max_pixels,
    )
    progress, close = phase_progress(False)  # on stderr, --json or not
    try:
        local = local_targets([target], as_json)[0]  # a URL: a local copy of its pack
        shown_as = None if local == target else named_by_url(local, target)
        result = write_report(local, output, sheet, settings, overwrite, progress, shown_as)
    finally:
        close()
    report = result.report
    info = report.info
    if as_json:
        emit_json(result.to_json())
        exit_for_damage(info)
        return
    if result.html:
        click.echo(
            f"Wrote {result.html} ({result.html_bytes / 1e6:,.2f} MB): "
            f"{counted(info['images'], 'image')}, "
            f"{counted(info.get('identities') or 0, 'identity')}, "
            f"{counted(report.refusals.total, 'refusal')}, "
            f"{counted(report.duplicates.across, 'image')} under several identities.",
            err=True,
        )
    if result.sheet:
        click.echo(f"Wrote the contact sheet {result.sheet}.", err=True)
    exit_for_damage(info)


# -- repack ---------------------------------------------------------------------------------------
