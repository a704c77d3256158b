"""`rectool dali-index`: the one .idx DALI's fn.readers.mxnet needs."""

from __future__ import annotations

import os

import click

from .conventions import (
    RectoolCommand,
    emit_json,
    library_errors,
    write_stream,
)
from .options import (
    json_option,
    overwrite_option,
)
from .paramtypes import LocalTarget


@click.command(cls=RectoolCommand, name="dali-index")
@click.argument("target", type=LocalTarget())
@click.argument("output", type=click.Path(dir_okay=False))
@overwrite_option("Replace an existing file at OUTPUT (never a file of a pack).")
@json_option("Print the index and the .rec paths as JSON on stdout.")
@library_errors
def dali_index_command(target: str, output: str, overwrite: bool, as_json: bool) -> None:
    """Write the one .idx that DALI's fn.readers.mxnet needs for TARGET's shards.

    DALI reads its .rec files as one stream, so OUTPUT holds offsets counted from the start
    of the first file. The .rec paths to pass to DALI, in order, are printed on stdout. The
    insightface layout is refused (DALI reads every record as a sample). TARGET must be on
    this machine: a URL is refused (copy the pack's folder first).

    \b
    Example:
        rectool dali-index out/faces.manifest.json out/faces.dali.idx
    """
    from ..inspect.dali import write_dali_index

    recs = [os.fspath(rec) for rec in write_dali_index(target, output, overwrite)]
    if as_json:
        emit_json({"idx": output, "recs": recs})
        return
    for rec in recs:
        write_stream(rec, data=True)  # data: the paths to pass to DALI
