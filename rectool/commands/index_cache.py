"""`rectool index-cache`: the .idx sidecar caches of a pack made by others."""

from __future__ import annotations

import click

from .conventions import (
    RectoolCommand,
    emit_json,
    library_errors,
)
from .options import (
    json_option,
)


@click.command(cls=RectoolCommand, name="index-cache")
@click.argument("target")
@json_option("Print the caches (written, and kept as current) as JSON on stdout.")
@library_errors
def index_cache_command(target: str, as_json: bool) -> None:
    """Write the .idx sidecar cache (IDX.rtc) of every shard of TARGET.

    For a pack of several shards with a manifest, also the cache of them all (PREFIX.idx.rtc),
    which every loader worker maps instead of joining the shards' indexes. The reader never
    writes: it reads a cache when it matches the .idx files (size, mtime, CRC-32) and
    otherwise parses the .idx text. `pack` writes the caches of large shards and packs
    itself; use this for packs made by others (insightface's train.idx, im2rec's). A cache
    that is current is left as it is, so a job that maps it keeps working.

    \b
    Example:
        rectool index-cache faces_emore/
    """
    from ..format.indexcache import write_index_caches

    done = write_index_caches(target)
    if as_json:
        emit_json(done.to_json())
        return
    for path in done.written:
        click.echo(f"Wrote {path}.", err=True)
    for path in done.kept:
        click.echo(f"{path} is current; left as it is.", err=True)
