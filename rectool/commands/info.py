"""`rectool info`: what a dataset holds."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import click

from ..errors import InputError, RectoolError
from ..text import counted
from .conventions import (
    RectoolCommand,
    emit_json,
    library_errors,
    local_targets,
    named_by_urls,
    write_stream,
)
from .options import (
    json_option,
    max_pixels_option,
    sample_option,
)
from .progress import phase_progress


@click.command(cls=RectoolCommand, name="info")
@click.argument("target")
@sample_option("Images decoded, spread over the dataset, for their dimensions.")
@max_pixels_option(
    "Sampled images whose header declares more pixels are counted as too large, not decoded."
)
@json_option("Print the description as JSON on stdout.")
@library_errors
def info_command(target: str, sample: int, max_pixels: int, as_json: bool) -> None:
    """Describe TARGET (manifest, prefix, .rec or train.rec folder).

    Records, images, identities and images per identity (min / median / max and a small
    histogram), image payload sizes, encodings, dimensions of a sample, and the layout:
    images, or insightface (record 0 with flag 2 announces the identities); "label vectors"
    when images carry several labels each. A pack with a binary index (format 3) is described
    from it without reading its .rec, but for the sampled images (whose payload sizes and
    encodings are then described); any other from every record header.

    \b
    Example:
        rectool info out/faces
        rectool info faces_emore/train.rec --json
    """
    from ..inspect.info import dataset_info

    progress, close = phase_progress(False)  # on stderr, --json or not
    shown_as = None
    try:
        local = local_targets([target], as_json)[0]
        # A URL's pack is read from a local copy, and named by the URL wherever it is shown.
        shown_as = named_by_urls([target], [local])
        info = dataset_info(local, sample=sample, max_pixels=max_pixels, progress=progress)
    except RectoolError as exc:
        if shown_as is None:
            raise
        named = InputError if isinstance(exc, InputError) else RectoolError  # its exit status
        raise named(shown_as(str(exc))) from None
    finally:
        close()
    document = _renamed(info.to_json(), shown_as)
    if as_json:
        emit_json(document)
    else:
        write_stream(render_info(document, remote=shown_as is not None))  # the answer: stdout
    exit_for_damage(document)


def _renamed(value: Any, shown_as: Callable[[str], str] | None) -> Any:
    """Return `value` (a string, or a document of them) with a local copy's paths named by
    the URL they came from (`shown_as`), or unchanged when the target is local."""
    if shown_as is None:
        return value
    if isinstance(value, str):
        return shown_as(value)
    if isinstance(value, Mapping):
        return {k: _renamed(v, shown_as) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_renamed(v, shown_as) for v in value]
    return value


def exit_for_damage(info: Mapping[str, Any]) -> None:
    """Exit 1 (problems found) with one line on stderr when records could not be read."""
    damage = info.get("damage")
    if damage:
        n = damage["records"]
        click.echo(
            f"Error: {counted(n, 'damaged record')} left out; {damage['advice']}",
            err=True,
        )
        sys.exit(1)


def render_info(info: Mapping[str, Any], width: int = 40, remote: bool = False) -> str:
    """Return the human description of a dataset."""
    shards = info["shards"]
    lines = [
        f"{info['target']}: layout {info['layout']}"
        f"{', label vectors' if info.get('label_vectors') else ''}, "
        f"{counted(shards, 'shard')}, "
        f"{counted(info['records'], 'record')}, {counted(info['images'], 'image')}, "
        f"{info['rec_bytes'] / 1e6:,.1f} MB",
        _index_line(info, remote),
    ]
    per = info.get("images_per_identity")
    if info.get("identities") is None:
        lines.append("Identities: labels are not integral class ids")
    else:
        classes = info.get("classes")
        of = f" (of {counted(classes, 'class')})" if classes is not None else ""
        lines.append(f"Identities: {info['identities']:,}{of}")
    if per:
        lines.append(
            f"Images per identity: min {per['min']:,}, median {per['median']:g}, max {per['max']:,}"
        )
        most = max(row["identities"] for row in per["histogram"])
        for row in per["histogram"]:
            bar = "#" * max(1, round(width * row["identities"] / most))
            noun = "image: " if row["images"] == "1" else "images:"
            lines.append(f"  {row['images']:>9} {noun} {row['identities']:>9,} {bar}")
    sampled = info.get("payload_sample")
    of = "" if sampled is None else f" (sample of {sampled:,})"
    sizes = info["image_bytes"]
    if sizes:
        lines.append(
            f"Image bytes{of}: min {sizes['min']:,}, median {sizes['median']:,.0f}, "
            f"mean {sizes['mean']:,.1f}, max {sizes['max']:,}"
        )
    if info["encodings"]:
        encodings = ", ".join(f"{k} {n:,}" for k, n in info["encodings"].items())
        lines.append(f"Encodings{of}: {encodings}")
    dims = info["dimensions"]
    if dims["sampled"] and dims["distinct"] <= len(dims["most_common"]):
        counts = ", ".join(f"{k} {n:,}" for k, n in dims["counts"].items())
        lines.append(f"Dimensions (HxWxC, sample of {dims['sampled']:,}): {counts}")
    elif dims["sampled"]:
        lines.append(
            f"Dimensions (sample of {dims['sampled']:,}): {dims['distinct']:,} different sizes"
            + (f", {dims['undecodable']:,} undecodable" if dims["undecodable"] else "")
            + (f", {dims['too_large']:,} over --max-pixels" if dims.get("too_large") else "")
        )
        for name in ("height", "width"):
            side = dims[name]
            lines.append(
                f"  {name}: min {side['min']:,}, median {side['median']:g}, max {side['max']:,}"
            )
        common = ", ".join(f"{row['size']} {row['images']:,}" for row in dims["most_common"])
        lines.append(f"  most common (HxWxC): {common}")
    damage = info.get("damage")
    if damage:
        n = damage["records"]
        lines.append(
            f"Damage: {counted(n, 'record')} cannot be read, left out of "
            f"the figures above; {damage['advice']}"
        )
        for d in damage["first"]:
            key = "" if d["key"] is None else f"key {d['key']}, "
            lines.append(f"  {d['file']}, {key}byte offset {d['offset']}: {d['reason']}")
        if n > len(damage["first"]):
            lines.append(f"  and {n - len(damage['first']):,} more")
    return "\n".join(lines)


def _index_line(info: Mapping[str, Any], remote: bool = False) -> str:
    """Say whether the pack has a binary index (what readers map), or only the .idx text, and
    how to write one where that works (`rectool index` writes beside local files only)."""
    if info["index"] == "binary":
        return "Index: binary (format 3)"
    if remote:
        return "Index: text .idx only; `rectool index` of a local copy writes a binary one"
    return f"Index: text .idx only; `rectool index {info['target']}` writes a binary one"
