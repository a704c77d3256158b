"""`rectool pack`: a list and a tree in, shards and a manifest out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..choices import CHECK_MODES
from .conventions import (
    CommandFailed,
    RectoolCommand,
    emit_json,
    interrupted_status,
    library_errors,
    write_stream,
)
from .options import (
    allow_outside_root_option,
    check_option,
    json_option,
    labels_option,
    layout_option,
    max_failures_option,
    max_pixels_option,
    overwrite_option,
    pack_label_option,
    quiet_option,
    resume_option,
    sha256_option,
    shard_options,
    transform_of,
    transform_options,
    workers_option,
)
from .pack_messages import (
    has_output,
    interrupted_message,
    refused_too_many,
    render_plan,
    render_result,
    shard_plan,
)
from .paramtypes import Count, SourceRoot
from .progress import remember_progress, setup_progress

if TYPE_CHECKING:
    from ..packer.results import PackResult, ShardResult


@click.command(cls=RectoolCommand, name="pack")
@click.argument("list_file", metavar="LIST", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("root", type=SourceRoot())
@click.argument("prefix", metavar="OUT_PREFIX")
@pack_label_option(
    "Store every list label as a float32 vector (flag > 0), as im2rec; every line "
    "must then have as many labels."
)
@check_option(
    CHECK_MODES,
    "Pass-through check of each image. structure: walk the JPEG markers to the scan and "
    "the end marker, every PNG chunk and CRC (other formats are decoded). decode: also decode "
    "every image, refusing JPEGs whose data libjpeg-turbo reports corrupt (slower). none: only "
    "refuse missing and empty files.",
)
@click.option("--no-check", is_flag=True, help="Same as --check none.")
@transform_options
@shard_options
@layout_option(
    "images: keys as in the list. insightface: the face-dataset layout "
    "(header record 0, identity ranges, property file)."
)
@workers_option("Worker threads reading, checking and encoding images.")
@max_pixels_option(
    "Refuse images whose header declares more pixels, before checking or re-encoding them "
    "(not with --check none)."
)
@max_failures_option("the listed images")
@labels_option(
    "Label map (label<TAB>identity) for the manifest; "
    "default: the one `rectool list` wrote beside LIST.",
    "label_map",
    click.Path(dir_okay=False),
)
@allow_outside_root_option(
    "Pack list paths that leave ROOT (absolute, climbing out with .., or through a "
    "symbolic link); by default they are refused as outside-root."
)
@sha256_option
@resume_option("Continue an interrupted pack where it stopped.")
@overwrite_option("Replace an existing pack at OUT_PREFIX, once the new one is complete.")
@click.option(
    "--only-shard",
    type=Count(0),
    metavar="K",
    help="Pack only shard K of the plan (needs --shard-records): one job-array task per shard.",
)
@click.option(
    "--finalize",
    is_flag=True,
    help="After --only-shard runs: check every shard and write the failures file and manifest.",
)
@click.option(
    "--plan", "show_plan", is_flag=True, help="Print the shard plan (count, list lines) and exit."
)
@click.option(
    "--executor",
    type=click.Choice(["local", "dask"]),
    default="local",
    show_default=True,
    help="dask: one task per shard on a Dask cluster (needs rectool's dask extra: install "
    "rectool[dask] as you installed rectool).",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    help="Dask scheduler address (tcp://host:8786); default: a local cluster.",
)
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Pack an empty list as an empty dataset (by default an empty list is a usage error).",
)
@quiet_option("No progress bar and no summary.")
@json_option("Print the summary as JSON on stdout.")
@library_errors
def pack_command(
    list_file: str,
    root: Path,
    prefix: str,
    pack_label: bool,
    check: str,
    no_check: bool,
    shard_size: int | None,
    shard_records: int | None,
    layout: str,
    workers: int,
    max_pixels: int,
    max_failures: int | float,
    label_map: str | None,
    allow_outside_root: bool,
    sha256: bool,
    resume: bool,
    overwrite: bool,
    only_shard: int | None,
    finalize: bool,
    show_plan: bool,
    executor: str,
    scheduler: str | None,
    allow_empty: bool,
    quiet: bool,
    as_json: bool,
    **values: Any,  # the re-encoding options (`transform_of`)
) -> None:
    """Pack the images of LIST (or - for stdin) under ROOT into OUT_PREFIX.rec/.idx shards.

    Images are passed through byte for byte, each checked as --check says (by default their
    structure: JPEG markers, PNG chunks and CRCs), unless a re-encoding option (--resize,
    --center-crop, --quality, --encoding, --color) is given. Broken images are never
    written: each is recorded in OUT_PREFIX.failures.jsonl. Shards are written as .partial
    files and renamed when complete; then the binary index readers map
    (OUT_PREFIX.offsets.npy, .keys.npy, .labels.npy) and, last, OUT_PREFIX.manifest.json.

    An s3:// (gs://, az://) OUT_PREFIX is packed in a staging folder under the cache folder
    ($RECTOOL_CACHE_DIR), each shard uploaded as soon as it is finished, the manifest last
    (an http(s):// OUT_PREFIX is refused: read-only).

    One run at a time writes an OUT_PREFIX (a second is refused, naming the first's pid).
    Images that are not regular files, or whose paths leave ROOT, are refused.
    ROOT may be a .tar, .tar.gz/.tgz or .zip of the tree, or webdataset shards: LIST's paths
    are member names, and the pack is the extracted tree's, byte for byte.

    Exit status: 0 packed (refusals within --max-failures), 1 error, 2 usage error,
    3 packed but more images refused than --max-failures allows (with --only-shard: by that
    shard), 130 interrupted (Ctrl-C: what was packed is kept; --resume continues it).

    \b
    Example:
        rectool pack faces.lst faces/ out/faces --shard-size 2GiB
        rectool pack faces.lst faces/ out/faces112 --resize 112 --quality 95
        rectool list faces/ - --labels faces.tsv | rectool pack - faces/ out/f --labels faces.tsv
        rectool pack faces.lst faces/ s3://bucket/packs/faces   # staged, then uploaded
    """
    from ..packer.distributed import pack_on_dask
    from ..packer.finalize import finalize_pack
    from ..packer.options import PackOptions
    from ..packer.packing import pack_images
    from ..remote.store import is_url
    from ..remote.upload import check_output_prefix, named_at, output_prefix

    check_output_prefix(prefix)  # an https:// OUT_PREFIX: refused before anything is read
    if no_check and check != "structure":
        raise click.BadParameter(f"--no-check contradicts --check {check}", param_hint="--no-check")
    options = PackOptions(
        transform=transform_of(values),
        check="none" if no_check else check,
        pack_label=pack_label,
        shard_bytes=shard_size,
        shard_records=shard_records,
        layout=layout,
        workers=workers,
        max_failures=max_failures,  # a count or a share (a float): `allowed_failures`
        allow_outside_root=allow_outside_root,
        max_pixels=max_pixels,
        sha256=sha256,
    )
    by_shard = only_shard is not None or finalize or show_plan
    if executor == "dask" or by_shard:
        if not shard_records or shard_size:
            raise click.BadParameter(
                "packing shard by shard needs a plan: give --shard-records N (not --shard-size)",
                param_hint="--shard-records",
            )
        if sum([only_shard is not None, finalize, show_plan, executor == "dask"]) > 1:
            raise click.UsageError(
                "use one of --only-shard, --finalize, --plan, --executor dask at a time"
            )
    if is_url(prefix) and (by_shard or executor == "dask" or resume):
        raise click.UsageError(
            "an s3:// OUT_PREFIX is packed in one run (no --resume, --only-shard, --finalize, "
            "--plan or --executor dask)"
        )
    if scheduler and executor != "dask":
        raise click.BadParameter("--scheduler needs --executor dask", param_hint="--scheduler")
    if show_plan:
        plan = shard_plan(list_file, options)
        if as_json:
            emit_json(plan)
        elif not quiet:
            write_stream(render_plan(plan))
        return
    setup, update, close = setup_progress(quiet, "img")  # stderr: --json or not
    update, seen = remember_progress(update)
    replaces = overwrite and only_shard is None and not finalize and has_output(prefix)
    result: PackResult | ShardResult
    try:
        if only_shard is not None:
            result = pack_images(
                list_file,
                root,
                prefix,
                options,
                resume=resume,
                overwrite=overwrite,
                progress=update,
                only_shard=only_shard,
                setup=setup,
            )
        elif finalize:
            result = finalize_pack(list_file, root, prefix, options, label_map=label_map)
        elif executor == "dask":
            result = pack_on_dask(
                list_file,
                root,
                prefix,
                options,
                scheduler=scheduler,
                resume=resume,
                overwrite=overwrite,
                label_map=label_map,
                progress=update,
            )
        else:
            with output_prefix(prefix, overwrite) as out:  # a URL: staged, uploaded shard by shard
                result = pack_images(
                    list_file,
                    root,
                    out.prefix,
                    options,
                    resume=resume,
                    overwrite=overwrite,
                    label_map=label_map,
                    progress=update,
                    allow_empty=allow_empty,
                    on_shard_finished=out.on_shard_finished,
                    setup=setup,
                )
            result = named_at(result, out.prefix, prefix)
    except KeyboardInterrupt as exc:
        close()
        status = interrupted_status(exc)
        message = interrupted_message(prefix, seen, replaces, finalize, only_shard, status)
        raise CommandFailed(message, status) from None
    finally:
        close()
    exit_code = 0 if result.accepted else 3
    if as_json:
        document = result.to_json()
        if exit_code:
            document["error"] = refused_too_many(result)
        emit_json(document, exit_code)
        return
    if not quiet:
        click.echo(render_result(result), err=True)
    elif exit_code:  # quiet hides progress, never the reason for a non-zero exit
        click.echo(f"Error: {refused_too_many(result)}", err=True)
    sys.exit(exit_code)
