"""`rectool index`: the manifest and binary index of a pack made by im2rec, insightface or an
older rectool."""

from __future__ import annotations

import os

import click

from ..text import counted
from .conventions import (
    RectoolCommand,
    emit_json,
    library_errors,
)
from .options import (
    json_option,
    overwrite_option,
)


@click.command(cls=RectoolCommand, name="index")
@click.argument("target")
@click.option(
    "--into",
    type=click.Path(file_okay=False, path_type=str),
    metavar="FOLDER",
    help="Write the manifest and index into this folder (made if missing), with a link to "
    "each of the pack's files, instead of beside the shards: for a read-only dataset.",
)
@overwrite_option("With --into: replace another pack's files at the same prefix in FOLDER.")
@click.option(
    "--force", is_flag=True, help="Write the index again even where the pack already has one."
)
@json_option("Print what was found and written as JSON on stdout.")
@library_errors
def index_command(
    target: str, into: str | None, overwrite: bool, force: bool, as_json: bool
) -> None:
    """Write the manifest and binary index (format 3) of the pack TARGET, beside its shards.

    TARGET is a pack made by others or by an older rectool: a bare .rec with its .idx
    (im2rec), a folder holding train.rec and train.idx (insightface: the layout is read
    from record 0), a prefix of numbered shards (PREFIX-00000.rec, ...), or a rectool pack
    of manifest format 1 or 2, upgraded in place (its fields kept, its identity names moved
    to PREFIX.identities.json). The shards are read, never changed; the .npy arrays and the
    manifest (PREFIX.manifest.json) are written beside them. A pack that has its index
    already is left as it is (exit 0) unless --force. URLs are not read: index a local copy.

    With --into FOLDER (a read-only dataset) they go into FOLDER instead, with a symbolic
    link there to each of the pack's files (FOLDER/NAME.rec -> the .rec, ...), so that
    rectool and the reader open FOLDER/NAME while MXNet and DALI read the files where they
    are. The manifest records each file's size and digest: `rectool verify FOLDER/NAME`
    refuses a file changed since.

    \b
    Example:
        rectool index faces_emore/
        rectool index im2rec/train.rec
        rectool index /datasets/faces_emore --into ~/indexes/faces_emore
    """
    from ..packer.indexing import index_pack

    if overwrite and into is None:
        raise click.UsageError("--overwrite goes with --into (beside the shards, use --force)")
    result = index_pack(target, force=force, into=into, overwrite=overwrite)
    if as_json:
        emit_json(result.to_json())
        return
    if result.already:
        click.echo(
            f"{result.manifest}: already indexed (manifest format {result.previous}); wrote "
            "nothing (--force writes the index again).",
            err=True,
        )
        return
    before = "no manifest before" if result.previous is None else f"format {result.previous} before"
    click.echo(
        f"Wrote {result.manifest} ({before}) and its index: "
        f"{counted(result.samples, 'sample')} in {counted(result.shards, 'shard')}, "
        f"layout {result.layout}{_linked(result.links)}.",
        err=True,
    )


def _linked(links: dict[str, str]) -> str:
    """Return what the summary says of the links `--into` made ("" when none)."""
    if not links:
        return ""
    folders = sorted({os.path.dirname(to) for to in links.values()})
    return f"; {counted(len(links), 'link')} to the pack's files in {', '.join(folders)}"
