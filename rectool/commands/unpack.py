"""`rectool unpack`: a dataset's images written back as a tree."""

from __future__ import annotations

from pathlib import Path

import click

from ..text import counted
from .conventions import (
    CommandFailed,
    RectoolCommand,
    emit_json,
    interrupted_status,
    library_errors,
)
from .options import (
    json_option,
    quiet_option,
    resume_option,
)
from .progress import progress_bar, remember_progress


@click.command(cls=RectoolCommand, name="unpack")
@click.argument("target")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@resume_option("Continue an interrupted unpack: keep files that already hold their record's bytes.")
@quiet_option("No progress bar and no summary.")
@json_option("Print the summary as JSON on stdout.")
@library_errors
def unpack_command(target: str, out_dir: Path, resume: bool, quiet: bool, as_json: bool) -> None:
    """Write the images of TARGET back as an identity-per-folder tree under OUT_DIR.

    Each image becomes OUT_DIR/IDENTITY/KEY.EXT: IDENTITY is the folder name the manifest's
    label map gives the label (else the label), KEY the record's key, EXT from the image's
    signature (.bin when unknown). Bytes are written as stored, so a pass-through pack
    unpacks to identical files. Each file is written whole under a hidden name, then linked to
    its own; existing files are never overwritten (--resume keeps those that already hold
    their record's bytes). When a record differs from its checksum in the shard's .rec.crc,
    nothing is written and the error names it.

    \b
    Example:
        rectool unpack out/faces.manifest.json faces-again/
    """
    from ..inspect.unpack import unpack_dataset

    update, close = progress_bar(quiet, "img")  # stderr: --json or not
    update, seen = remember_progress(update)
    try:
        result = unpack_dataset(
            target, out_dir, progress=lambda done, total: update(done, total, 0), resume=resume
        )
    except KeyboardInterrupt as exc:
        close()
        status = interrupted_status(exc)
        word = "Terminated (SIGTERM)" if status == 143 else "Interrupted"
        total = f" of {seen['total']:,}" if seen["total"] is not None else ""
        raise CommandFailed(
            f"{word} after about {seen['done']:,}{total} images: the files written under "
            f"{out_dir} are whole.\nRun the same command with --resume to continue it.",
            status,
        ) from None
    finally:
        close()
    if as_json:
        emit_json(result.to_json())
    elif not quiet:
        kept = f", {result.kept:,} of them already there" if result.kept else ""
        click.echo(
            f"Unpacked {counted(result.images, 'image')}{kept} of "
            f"{counted(result.identities, 'identity')} "
            f"({result.bytes / 1e6:,.1f} MB) into {result.out_dir}.",
            err=True,
        )
