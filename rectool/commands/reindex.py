"""`rectool reindex`: an .idx rebuilt from a walk over its .rec."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..text import counted
from .conventions import (
    RectoolCommand,
    emit_json,
    library_errors,
    write_stream,
)
from .options import (
    json_option,
    output_option,
    overwrite_option,
    quiet_option,
)

if TYPE_CHECKING:
    from ..inspect.reindex import ReindexResult


@click.command(cls=RectoolCommand, name="reindex")
@click.argument("rec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@output_option(
    "Where to write the .idx (default: beside REC, same name).",
    click.Path(dir_okay=False, path_type=Path),
    "idx",
)
@click.option(
    "--keys",
    type=click.Choice(["header", "position"]),
    default="header",
    show_default=True,
    help="header: each record's header id (what rectool, im2rec and insightface write); "
    "position: 0, 1, 2, ... in file order.",
)
@overwrite_option("Replace an existing .idx.")
@quiet_option("No summary; only the exit status tells.")
@json_option("Print the result as JSON on stdout.")
@library_errors
def reindex_command(
    rec: Path, idx: Path | None, keys: str, overwrite: bool, quiet: bool, as_json: bool
) -> None:
    """Rebuild the .idx of REC by walking its records from first byte to last.

    Where REC is damaged the walk skips to the next record start (an aligned magic followed
    by continuation flag 0 or 1) and reports each skipped byte range; the .idx then lists
    every record that could be read. It is written to a temporary file and renamed. Where
    REC is a shard of a pack with a binary index (format 3) and its own .idx changes, the
    pack's manifest and index are written again to match it, so the reader and MXNet read
    the same records. With a .rec.crc beside REC, records whose bytes differ from their
    checksum are listed as damaged.

    Exit status: 0 REC was sound, 1 damage was skipped or a record is damaged (the .idx is
    still written) or an error, 2 usage error.

    \b
    Example:
        rectool reindex faces_emore/train.rec --overwrite
        rectool reindex broken.rec -o recovered.idx
    """
    from ..inspect.reindex import reindex

    result = reindex(rec, idx, keys=keys, overwrite=overwrite)
    exit_code = 0 if result.sound else 1
    if as_json:
        emit_json(result.to_json(), exit_code)
    elif not quiet:
        wrote, *findings = render_reindex_result(result).split("\n")
        click.echo(wrote, err=True)  # the work done: stderr
        if findings:
            write_stream("\n".join(findings))  # its findings, the answer: stdout
    sys.exit(exit_code)


def render_reindex_result(result: ReindexResult, shown: int = 20) -> str:
    """Return the human summary of a reindex."""
    source = "record headers" if result.keys_from == "header" else "record positions"
    lines = [f"Wrote {result.idx_path}: {result.records:,} records, keys from {source}."]
    if result.pack_files:
        lines[0] += f" Wrote the index of the pack {result.pack} again to match it."
    elif result.pack is not None:
        lines[0] += f" The index of the pack {result.pack} matches it already."
    if result.skipped:
        total = sum(d.end - d.start for d in result.skipped)
        n = len(result.skipped)
        lines.append(f"Skipped {counted(n, 'damaged byte range')} ({total:,} bytes):")
        for d in result.skipped[:shown]:
            lines.append(
                f"  bytes {d.start}..{d.end} ({d.end - d.start:,} bytes): {d.kind}: {d.reason}"
            )
        if n > shown:
            lines.append(f"  ... and {n - shown:,} more")
    if result.unkeyed:
        n = len(result.unkeyed)
        lines.append(f"Left out {counted(n, 'record')} without a key:")
        lines += [f"  byte offset {offset}: {reason}" for offset, reason in result.unkeyed[:shown]]
    if result.duplicates:
        n = len(result.duplicates)
        examples = ", ".join(f"{k} ({c} times)" for k, c in sorted(result.duplicates.items())[:5])
        lines.append(
            f"{n:,} {'key appears' if n == 1 else 'keys appear'} more than once: {examples}; "
            "readers keep the last (try --keys position)."
        )
    if result.checksum_problem:
        lines.append(f"Records not checked one by one: {result.checksum_problem}")
    if result.damaged:
        n = len(result.damaged)
        lines.append(f"{counted(n, 'damaged record')} (per {result.checksums}):")
        for offset, key, reason in result.damaged[:shown]:
            where = "" if key is None else f"key {key}, "
            lines.append(f"  {where}byte offset {offset}: {reason}")
        if n > shown:
            lines.append(f"  ... and {n - shown:,} more")
    return "\n".join(lines)
