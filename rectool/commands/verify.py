"""`rectool verify`: is a dataset sound? For people and for CI."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import click

from ..errors import RectoolError, UsageError
from ..text import counted
from .conventions import (
    RectoolCommand,
    UnusableInput,
    emit_json,
    local_targets,
    named_by_urls,
    write_stream,
)
from .options import decode_option, json_option, max_pixels_option, quiet_option, workers_option
from .paramtypes import Count, ImageSize
from .progress import phase_progress

if TYPE_CHECKING:
    from ..inspect.verify import VerifyReport


@click.command(cls=RectoolCommand, name="verify")
@click.argument("targets", metavar="TARGET...", nargs=-1, required=True)
@decode_option("Also decode every image, on all cores.")
@click.option(
    "--no-image-check",
    is_flag=True,
    help="Skip the structural image check (JPEG markers, PNG chunks) pack runs.",
)
@click.option(
    "--size",
    type=ImageSize(),
    help="With --decode: every image must be HEIGHTxWIDTH pixels (e.g. 112x112).",
)
@click.option(
    "--channels", type=click.IntRange(1, 4), help="With --decode: every image's channel count."
)
@workers_option("Threads decoding images (--decode).")
@max_pixels_option(
    "With --decode: images whose header declares more pixels are problems (image-too-large), "
    "not decoded."
)
@click.option(
    "--max-problems",
    type=Count(0),
    default=20,
    show_default=True,
    help="Problems listed one by one in the summary; the rest are counted.",
)
@quiet_option("Print nothing; only the exit status tells.")
@json_option("Print the report as JSON on stdout.")
def verify_command(
    targets: tuple[str, ...],
    decode: bool,
    no_image_check: bool,
    size: tuple[int, int] | None,
    channels: int | None,
    workers: int,
    max_pixels: int,
    max_problems: int,
    quiet: bool,
    as_json: bool,
) -> None:
    """Check that each TARGET (manifest, prefix, .rec files or train.rec folder) is sound.

    Checks the framing of every .rec from first byte to last (magic, lengths, continuation
    flags, zero padding, trailing bytes); the .idx against it (every offset a record start,
    every record indexed, unique keys); every image header (flag, labels integral and below
    the class count when it is known); the manifest's sizes, counts and digests (xxh3-128,
    SHA-256 when the pack has them) when there is one; each record's checksum (xxh3-64, or
    CRC-32 in packs of manifest version 1) when the shard has a .rec.crc (rectool packs write
    one); the insightface layout when record 0 announces it; every image's structure, as pack
    checks it (JPEG markers and end marker, PNG chunks and CRCs); a format-3 pack's binary
    index (each .npy array's size, xxh3-128, dtype and shape, and its offsets, keys, labels
    and identity ranges against the .idx and the record headers; a pack without one is noted,
    not failed). --decode also decodes every image. Each problem is named with its file,
    record key and byte offset.

    A TARGET that is the URL of a manifest (s3://, https://) is read from a copy of its pack
    downloaded into the cache folder ($RECTOOL_CACHE_DIR); the report names the URL's files.

    Exit status: 0 sound, 1 problems found, 2 unreadable input or usage error.

    \b
    Example:
        rectool verify out/faces.manifest.json
        rectool verify faces_emore/train.rec --decode --size 112x112 --channels 3
        rectool verify out/faces --json > report.json
    """
    from ..inspect.verify import DecodeOptions, verify_dataset

    if (size or channels) and not decode:
        raise click.BadParameter("needs --decode", param_hint="--size/--channels")
    options = DecodeOptions(size, channels, max_pixels) if decode else None
    update, close = phase_progress(quiet)  # stderr: --json or not
    shown_as = None
    try:
        local = local_targets(targets, quiet)
        # A URL's pack is read from a local copy, and named by the URL wherever it is shown.
        shown_as = named_by_urls(targets, local)
        report = verify_dataset(
            local, decode=options, workers=workers, progress=update, image_check=not no_image_check
        )
    except UsageError as exc:
        raise click.UsageError(_shown(shown_as, str(exc))) from exc
    except RectoolError as exc:
        # The input cannot be read at all: that is not a verdict on the data, so not 1.
        raise UnusableInput(_shown(shown_as, str(exc))) from exc
    finally:
        close()
    if shown_as is not None:
        report = report.renamed(shown_as)
    for prefix in report.finished:
        if not (quiet or as_json):
            click.echo(
                f"Finished replacing {prefix}: an interrupted run had committed the new pack "
                "but not moved all of it into place.",
                err=True,
            )
    exit_code = 0 if report.sound else 1
    if as_json:
        emit_json(report.to_json(), exit_code)
    elif not quiet:
        write_stream(render_verify_report(report, max_problems))  # the answer: stdout
    sys.exit(exit_code)


def _shown(shown_as: Callable[[str], str] | None, text: str) -> str:
    return text if shown_as is None else shown_as(text)


def layouts_text(layouts: Iterable[str]) -> str:
    """Say the targets' layouts once each: "layout images", "layouts images 4, insightface 1"."""
    kinds = Counter(layouts)
    if len(kinds) <= 1:
        return f"layout {next(iter(kinds), 'empty')}"
    return "layouts " + ", ".join(f"{name} {n:,}" for name, n in kinds.items())


def render_verify_report(report: VerifyReport, shown: int) -> str:
    """Return the human summary of a verification: one line of totals, then the problems, then
    notes (a target without a binary index)."""
    from ..format.digest import DIGEST_NAMES

    shards = len(report.shards)
    line = (
        f"Verified {', '.join(report.targets)}: {counted(report.records, 'record')} "
        f"({counted(report.images, 'image')}) in {counted(shards, 'shard')}, "
        f"{report.rec_bytes / 1e6:,.1f} MB, {layouts_text(report.layouts)}"
    )
    if report.checksums:
        compared = counted(report.checksums, "checksum")
        line += f"; {compared} compared ({', '.join(report.file_digests)})"
    if report.record_checksums:
        named = " or ".join(DIGEST_NAMES[a] for a in report.record_digests)
        line += f"; {counted(report.record_checksums, 'record')} compared with their {named}"
    if report.decoded:
        line += f"; {counted(report.decoded, 'image')} decoded"
    lines = [f"{line} ({report.seconds:.2f} s)."]
    lines += [
        f"Note: {folder} is the staging folder of an --overwrite that was killed; the pack "
        "verified is the one it did not replace. Delete the folder, or run that command again."
        for folder in report.staging
    ]
    notes = [f"Note: {note}." for note in report.notes]  # after the verdict: no problem
    refusals = [refusals_text(r) for r in report.refusals]
    if report.sound:
        over = any(not r["accepted"] for r in report.refusals)
        # Sound bytes of a pack that refused more than it allowed are not a sound dataset.
        lines.append(
            "Sound as bytes: no problems found in the files, but see the refusals below."
            if over
            else "Sound: no problems found."
        )
        return "\n".join(lines + refusals + notes)
    counts = ", ".join(f"{kind} {n:,}" for kind, n in sorted(report.counts.items()))
    lines.append(f"Found {counted(report.problem_count, 'problem')} ({counts}):")
    listed = report.problems[:shown]
    lines += [f"  {problem}" for problem in listed]
    if report.problem_count > len(listed):
        lines.append(f"  ... and {report.problem_count - len(listed):,} more")
    return "\n".join(lines + refusals + notes)


def refusals_text(refusals: dict[str, Any]) -> str:
    """Say what a pack refused when it was made (`VerifyReport.refusals`)."""
    refused, images = refusals["refused"], refusals["images"]
    of = "" if images is None else f" (and packed {counted(images, 'image')})"
    listed = f"; {refusals['failures_file']} lists them" if refusals["failures_file"] else ""
    allowed = refusals["max_failures"]
    what = f"refused {counted(refused, 'image')} when packed"
    if refusals.get("made_by") == "repack":  # removals asked for are among its failures
        what = f"left out {counted(refused, 'image')} when repacked (removed or refused)"
        of = "" if images is None else f" (and wrote {counted(images, 'image')})"
    if refusals["accepted"]:
        return (
            f"Note: {refusals['target']} {what}{of}, within --max-failures {allowed}{listed}."
            if refusals.get("made_by") != "repack"
            else f"Note: {refusals['target']} {what}{of}{listed}."
        )
    return (
        f"Refused: {refusals['target']} {what}{of}, "
        f"more than --max-failures {allowed} allows (the pack exited 3){listed}."
        + (
            " Most images were refused: is ROOT right?"
            if images is not None and refused > images
            else ""
        )
    )
