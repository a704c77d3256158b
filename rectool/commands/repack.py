"""`rectool repack`: packs in, a pack out."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

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
    check_option,
    json_option,
    layout_option,
    max_failures_option,
    max_pixels_option,
    overwrite_option,
    pack_label_option,
    per_id_options,
    quiet_option,
    renamed_option,
    resume_option,
    seed_option,
    sha256_option,
    shard_options,
    transform_of,
    transform_options,
    workers_option,
)
from .pack_messages import has_output, interrupted_message
from .paramtypes import Finite
from .progress import progress_bar, remember_progress

if TYPE_CHECKING:
    from ..repack.result import RepackResult


@click.command(cls=RectoolCommand, name="repack")
@renamed_option("--sample", "--keep-fraction", "keep_fraction", type=Finite(0, 1, min_open=True))
@renamed_option(
    "--sample-by", "--fraction-of", "fraction_of", type=click.Choice(["identities", "images"])
)
@click.argument("paths", metavar="SOURCE... OUT_PREFIX", nargs=-1, required=True)
@click.option(
    "--labels-by",
    type=click.Choice(["offset", "name"]),
    default="offset",
    show_default=True,
    help="Merging: offset puts each source's labels after the previous source's; name gives "
    "identities of the same name one label (labels in name order, as `rectool list`).",
)
@click.option(
    "--keep-ids",
    type=click.Path(exists=True, dir_okay=False),
    help="Keep only these identities: a file of names or labels, one a line.",
)
@click.option(
    "--drop-ids",
    type=click.Path(exists=True, dir_okay=False),
    help="Drop these identities: a file of names or labels, one a line.",
)
@per_id_options("Drop identities with fewer images.", "Keep at most N images of each identity.")
@click.option(
    "--pick",
    type=click.Choice(["first", "random"]),
    default="first",
    show_default=True,
    help="Which images --max-per-id keeps: the first in source order, or a seeded choice.",
)
@click.option(
    "--keep-fraction",
    "keep_fraction",
    type=Finite(0, 1, min_open=True),
    metavar="FRACTION",
    help="Keep a seeded fraction of the identities (or images, see --fraction-of).",
)
@click.option(
    "--fraction-of",
    "fraction_of",
    type=click.Choice(["identities", "images"]),
    default="identities",
    show_default=True,
    help="What --keep-fraction draws.",
)
@seed_option("Seed of --order shuffle, --keep-fraction and --pick random.")
@click.option(
    "--keep-labels",
    is_flag=True,
    help="Keep the (merged) source labels instead of relabelling 0..C-1.",
)
@click.option(
    "--order",
    type=click.Choice(["identity", "source", "shuffle"]),
    default="identity",
    show_default=True,
    help="identity: grouped by label; source: as the sources hold them; shuffle: a seeded "
    "global shuffle (for readers that stream in file order, such as DALI's).",
)
@layout_option(
    "images: only image records (what DALI and ImageRecordIter read). insightface: the "
    "face-dataset layout (header record 0, identity ranges, property file)."
)
@pack_label_option(
    "--layout insightface: store each image's label as a float32 vector, the identity first, "
    "as Glint360K and WebFace42M do (a source's other labels kept; a scalar becomes a vector "
    "of one). Without it, one scalar label, the identity, as faces_emore."
)
@shard_options
@check_option(
    ("structure", "none"),
    "structure: refuse what pack refuses (empty, truncated, not an image); none: copy "
    "every record as it is.",
)
@click.option(
    "--dedupe",
    is_flag=True,
    help="Keep one copy of byte-identical images within an identity; report those shared "
    "across identities.",
)
@click.option(
    "--drop-overlap",
    metavar="TARGET",
    multiple=True,
    help="Remove images byte-identical to any image of TARGET: a dataset (or its manifest's "
    "URL), or an insightface verification set such as lfw.bin (read without running the "
    "pickle). Repeatable.",
)
@transform_options
@workers_option("Worker threads re-encoding images.")
@max_pixels_option("Re-encoding: refuse images whose header declares more pixels, before decoding.")
@max_failures_option()
@sha256_option
@resume_option("Continue an interrupted repack where it stopped.")
@overwrite_option("Replace an existing pack at OUT_PREFIX.")
@quiet_option("No progress bar and no summary.")
@json_option("Print the summary as JSON on stdout.")
@library_errors
def repack_command(
    paths: tuple[str, ...],
    resume: bool,
    overwrite: bool,
    quiet: bool,
    as_json: bool,
    **options: Any,  # the options of `RepackOptions`, of every type
) -> None:
    """Repack the records of each SOURCE into a new pack at OUT_PREFIX, without the tree.

    A SOURCE is anything the reader opens: a manifest or pack prefix, an im2rec .rec (with
    its .idx), an insightface folder (train.rec, train.idx, property), the URL of a manifest
    (s3://, https://: read from a copy downloaded into $RECTOOL_CACHE_DIR). Several are merged.
    Identities are filtered, then relabelled 0..C-1, then written in --order. Records are
    copied as bytes (only the header's label and key change, and its label count when a label
    changes shape: see --pack-label) unless a re-encoding option is given. Removed duplicates
    and overlap are listed in OUT_PREFIX.failures.jsonl; counts
    per identity in OUT_PREFIX.report.json; the label mapping in OUT_PREFIX.relabel.tsv.

    An s3:// (gs://, az://) OUT_PREFIX is repacked in a staging folder under the cache folder
    ($RECTOOL_CACHE_DIR), each shard uploaded as soon as it is finished, the manifest last
    (an http(s):// OUT_PREFIX is refused: read-only).

    Exit status: 0 repacked, 1 error, 2 usage error, 3 repacked but more images refused
    (damaged, as pack checks them, or failing to re-encode) than --max-failures allows.

    \b
    Example:
        rectool repack faces_emore/ out/train --order shuffle --seed 1
        rectool repack a.manifest.json b.manifest.json out/ab --labels-by name
        rectool repack out/ab out/clean --dedupe --drop-overlap faces_emore/lfw.bin --min-per-id 2
        rectool repack s3://bucket/packs/faces.manifest.json s3://bucket/packs/train
        rectool repack faces_emore/ glint/train --layout insightface --pack-label
    """
    from ..remote.store import is_url
    from ..remote.upload import check_output_prefix, named_at, output_prefix
    from ..repack.pipeline import RepackOptions, repack

    if len(paths) < 2:
        raise click.UsageError("give at least one SOURCE and the OUT_PREFIX")
    *sources, prefix = paths
    check_output_prefix(prefix)  # an https:// OUT_PREFIX: refused before a source is read
    if is_url(prefix) and resume:
        raise click.UsageError("an s3:// OUT_PREFIX is repacked in one run (no --resume)")
    if options["keep_ids"] and options["drop_ids"]:
        raise click.BadParameter("give --keep-ids or --drop-ids, not both", param_hint="--keep-ids")
    # The options `RepackOptions` names as the command line does; then those it renames.
    same = (
        "labels_by keep_ids drop_ids min_per_id max_per_id pick seed keep_labels order layout "
        "pack_label shard_records dedupe check workers max_failures max_pixels sha256"
    ).split()
    repack_options = RepackOptions(
        **{name: options[name] for name in same},
        sample=options["keep_fraction"],
        sample_by=options["fraction_of"],
        shard_bytes=options["shard_size"],
        drop_overlap=tuple(options["drop_overlap"]),
        transform=transform_of(options),
    )
    update, close = progress_bar(quiet, "rec")  # stderr: --json or not
    update, seen = remember_progress(update)
    replaces = overwrite and has_output(prefix)
    try:
        with output_prefix(prefix, overwrite) as out:  # a URL: staged, uploaded shard by shard
            result = repack(
                sources,
                out.prefix,
                repack_options,
                resume=resume,
                overwrite=overwrite,
                progress=update,
                on_shard_finished=out.on_shard_finished,
            )
        result = named_at(result, out.prefix, prefix)
    except KeyboardInterrupt as exc:
        close()
        status = interrupted_status(exc)
        message = interrupted_message(prefix, seen, replaces, False, None, status, "record")
        raise CommandFailed(message, status) from None
    finally:
        close()
    if as_json:
        document = result.to_json()
        if not result.accepted:
            allowed = result.manifest["options"]["max_failures"]
            document["error"] = (
                f"more than --max-failures {allowed} refused ({result.report['refused']:,})"
            )
        emit_json(document, 0 if result.accepted else 3)
        return
    if not quiet:
        click.echo(render_repack_summary(result), err=True)
    if not result.accepted:
        if quiet:  # quiet hides progress, never the reason for a non-zero exit
            allowed = result.manifest["options"]["max_failures"]
            click.echo(
                f"Error: more than --max-failures {allowed} refused ({result.report['refused']:,})",
                err=True,
            )
        sys.exit(3)


def render_repack_summary(result: RepackResult) -> str:
    """Return the human summary of a repack."""
    report, shards = result.report, result.manifest["shards"]
    lines = [
        f"Repacked {counted(result.images, 'image')} of {counted(result.classes, 'identity')} "
        f"into {counted(len(shards), 'shard')} "
        f"({result.manifest['totals']['rec_bytes'] / 1e6:,.1f} MB); manifest {result.manifest_path}"
    ]
    if result.resumed_from:
        lines.append(f"Resumed after {counted(result.resumed_from, 'record')} written earlier.")
    steps = {k: v for k, v in report["steps"].items() if k not in ("images", "identities")}
    dropped = [f"{name} {count:,}" for name, count in steps.items() if name != "source_images"]
    if dropped:
        lines.append(
            f"From {steps['source_images']:,} source images, removed: {', '.join(dropped)}."
        )
    apart = report.get("names_kept_apart") or []
    if apart:
        shown = ", ".join(apart[:5]) + (", ..." if len(apart) > 5 else "")
        lines.append(
            f"{counted(len(apart), 'identity name')} ({shown}) {'is' if len(apart) == 1 else 'are'}"
            " used by several sources: kept apart as different identities, named K-NAME after "
            "source K (1-"
            + f"{apart[0]}, 2-{apart[0]}, ...); --labels-by name merges them instead."
        )
    removed = report["removed"]
    if removed["duplicate"] or removed["overlap"]:
        lines.append(
            f"Duplicates removed {removed['duplicate']:,}, overlap removed {removed['overlap']:,} "
            f"(listed in {result.failures_path}; per identity in {result.report_path})."
        )
    shared = report["shared_across_identities"]["groups"]
    if shared:
        lines.append(
            f"{counted(shared, 'image')} {'is' if shared == 1 else 'are'} byte-identical across "
            "identities (label noise?): kept, "
            f"listed in {result.report_path}."
        )
    if report["refused"]:
        lines.append(
            f"{counted(report['refused'], 'image')} refused: damaged, or failed to re-encode "
            f"({result.failures_path})."
        )
        if not result.accepted:
            allowed = result.manifest["options"]["max_failures"]
            lines.append(f"More than --max-failures {allowed} refused: exit status 3.")
    return "\n".join(lines)
