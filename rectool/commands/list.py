"""`rectool list`: a tree in, im2rec's list and a label map out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import click

from ..packer.listing import (
    DEFAULT_EXTENSIONS,
    SKIP_REASONS,
    ListSteps,
    display_path,
    list_images,
)
from ..text import counted
from .conventions import (
    RectoolCommand,
    emit_json,
    library_errors,
    seconds_since_start,
)
from .options import (
    allow_outside_root_option,
    json_option,
    labels_option,
    overwrite_option,
    per_id_options,
    quiet_option,
    renamed_option,
    seed_option,
    workers_option,
)
from .paramtypes import Count, Finite, SourceRoot
from .progress import PhaseLog, PhaseProgress, phase_progress

if TYPE_CHECKING:
    from ..packer.splits import Listing

# `walk(folders_scanned, images_found, identity_folders_read, identity_folders)`.
WalkProgress = Callable[[int, int, int, int], object]


def parse_extensions(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """Return `--exts` values (comma-separated and/or repeated) as one tuple."""
    if not value:
        return DEFAULT_EXTENSIONS
    exts = tuple(e.strip() for text in value for e in text.split(","))
    if not all(e.strip(".") for e in exts):
        raise click.BadParameter(f"empty extension in {','.join(value)!r}")
    return exts


def refuse_stdout(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Refuse `--labels -`: stdout carries the list (with OUT -) or nothing; a label map is
    written to a file, which `-` would otherwise name."""
    if value is not None and str(value) == "-":
        raise click.BadParameter("the label map is written to a file; name one (not -)")
    return value


@click.command(cls=RectoolCommand, name="list")
@renamed_option("--threads", "--workers", "workers", type=click.IntRange(1, 256))
@click.argument("root", type=SourceRoot())
@click.argument("out", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option(
    "--recursive/--no-recursive",
    default=True,
    show_default=True,
    help="Also list images in subfolders of an identity folder, with its label. "
    "--no-recursive skips (and counts) such subfolders.",
)
@click.option(
    "--exts",
    multiple=True,
    callback=parse_extensions,
    metavar="EXT[,EXT...]",
    help="Image extensions, case-insensitive, comma-separated or repeated.  "
    f"[default: {','.join(e.lstrip('.') for e in DEFAULT_EXTENSIONS)}]",
)
@click.option("--shuffle", is_flag=True, help="Shuffle the images (default: in order).")
@seed_option(
    "Seed of --shuffle (default: a random one, shown in the summary).", type=Count(0), default=None
)
@click.option(
    "--chunks",
    type=Count(1),
    default=1,
    show_default=True,
    help="Cut the images into N lists PREFIX_0.lst ... of nearly equal length.",
)
@click.option(
    "--train-ratio",
    type=Finite(0, 1),
    help="Fraction written to PREFIX_train.lst (default: what val and test leave).",
)
@click.option(
    "--val-ratio",
    type=Finite(0, 1),
    help="Fraction written to PREFIX_val.lst (default: what train and test leave).",
)
@click.option("--test-ratio", type=Finite(0, 1), help="Fraction written to PREFIX_test.lst.")
@click.option(
    "--split-by",
    type=click.Choice(["image", "identity"]),
    default="image",
    show_default=True,
    help="image: cut runs of images, as im2rec. identity: whole identities, so nobody is "
    "in two splits (the ratios then count identities).",
)
@per_id_options(
    "Skip identities with fewer images.",
    "Keep at most N images per identity (the first in path order).",
    min_default=1,
)
@workers_option(
    "Folders read at once. Default: one at a time while folders list fast (a local or "
    "cached disk), 4 per CPU (at most 32) once they prove slow (a network file system).",
    type=click.IntRange(1, 256),
    default=None,
    show_default=None,
)
@labels_option(
    "Write the label map here. Default: PREFIX.labels.tsv beside OUT; "
    "with OUT - it is written only if this is given.",
    "labels",
    click.Path(dir_okay=False, path_type=Path),
    callback=refuse_stdout,
)
@overwrite_option("Replace existing lists and label map (all or none are written).")
@allow_outside_root_option(
    "Follow symbolic links that lead out of ROOT (each folder is still listed once); "
    "by default they are skipped as outside-root."
)
@quiet_option("No progress bar and no summary.")
@json_option("Print the summary as JSON: on stdout, or on stderr when OUT is -.")
@library_errors
def list_command(
    root: Path,
    out: Path,
    recursive: bool,
    exts: tuple[str, ...],
    shuffle: bool,
    seed: int | None,
    chunks: int,
    train_ratio: float | None,
    val_ratio: float | None,
    test_ratio: float | None,
    split_by: str,
    min_per_id: int,
    max_per_id: int | None,
    workers: int | None,
    labels: Path | None,
    allow_outside_root: bool,
    overwrite: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """List the images under ROOT, one identity per folder, into OUT (.lst, or - for stdout).

    Each first-level folder of ROOT is an identity. Labels 0, 1, ... go to identities in
    sorted folder-name order, so the same tree always gets the same labels. Lines are
    im2rec's `index<TAB>label<TAB>identity/file`, UTF-8, by identity then path unless
    --shuffle; indices run 0..N-1 in that order before any split, so they are unique across
    PREFIX_train/_val/_test.lst and PREFIX_0.lst ... chunks. The label map,
    `label<TAB>identity` per line, goes to PREFIX.labels.tsv beside OUT (see --labels).

    Passed over, counted by reason and summarised on stderr: files without an image
    extension, hidden files and folders (.name), files directly in ROOT, empty identity
    folders, unreadable folders, names a .lst line cannot hold (tab, newline, CR, not UTF-8,
    leading or trailing whitespace), broken links and special files, symlink loops and
    repeats, links that lead out of ROOT.

    Symbolic links are followed, to files and to folders, while they stay inside ROOT (see
    --allow-outside-root). Every folder is listed once: a linked folder that leads back to
    one of its own ancestors, or to a folder already listed, is skipped and counted, so a
    scan always ends. A ROOT that is / or lies in /proc, /sys or /dev is refused, and a link
    that leads there is never followed: no image tree is there.

    ROOT may be an archive of such a tree: a .tar, .tar.gz/.tgz or .zip (read from inside
    its one top folder when it has one), or webdataset shards (a folder of .tar files, a
    glob, a {000..099} pattern: identity from the key's folder, else its .cls member). Paths
    are member names; links and devices in it are passed over. A .tar.gz's list follows
    the archive's order, so that pack reads it once.

    \b
    Example:
        rectool list faces/ faces.lst
        rectool list faces/ faces.lst --shuffle --seed 1 --val-ratio 0.05 --split-by identity
        rectool list train.tar.gz train.lst
    """
    to_stdout = str(out) == "-"
    phase, close = phase_progress(quiet)  # stderr: --json or not
    steps = ListSteps(walk=walk_progress(phase), phase=phase) if phase else None
    from ..archives.source import archive_kind

    lister: Any = list_images
    more: dict[str, Any] = {"steps": steps}
    if archive_kind(root) is not None:
        from ..archives.listing import list_archive

        lister, more = list_archive, {"progress": _archive_progress(steps)}
    try:
        listing = lister(
            root,
            cast(BinaryIO, click.open_file("-", "wb")) if to_stdout else out,  # stdout's bytes
            labels=labels,
            overwrite=overwrite,
            exts=exts,
            recursive=recursive,
            threads=workers,
            allow_outside_root=allow_outside_root,
            **more,
            shuffle=shuffle,
            seed=seed,
            chunks=chunks,
            train_ratio=train_ratio,
            val_ratio=val_ratio,
            test_ratio=test_ratio,
            split_by=split_by,
            min_per_id=min_per_id,
            max_per_id=max_per_id,
        )
    finally:
        close()
    seconds = seconds_since_start(click.get_current_context())
    if as_json:
        # With OUT -, stdout carries the list: the summary goes to stderr.
        emit_json({**listing.summary(), "seconds": seconds}, err=to_stdout)
    elif not quiet:
        click.echo(render_list_summary(listing, seconds), err=True)


def walk_progress(phase: PhaseProgress | None) -> WalkProgress | None:
    """Return what tells the walk's progress to `phase`: a line of its own in a log
    (identity folders read of all, images found), the identity folders' bar on a terminal."""
    if phase is None:
        return None
    if not isinstance(phase, PhaseLog):
        return lambda folders, images, identities, of: phase("identity folders", identities, of)
    log = phase

    def walked(folders: int, images: int, identities: int, of: int) -> None:
        read = f"{identities:,}/{of:,} identity folders ({100 * identities // of}%), " if of else ""
        log.offer(
            "walk",
            f"{log.command}: {read}{counted(folders, 'folder')} read, "
            f"{counted(images, 'image')} found",
        )

    return walked


def _archive_progress(steps: ListSteps | None) -> Callable[[int, int], object] | None:
    walk = steps.walk if steps is not None else None
    if walk is None:
        return None
    return lambda folders, images: walk(folders, images, 0, 0)


def _list_json_on_stderr(args: list[str]) -> bool:
    return "-" in args  # OUT - (no option of `list` takes - as its value)


list_command.json_on_stderr = _list_json_on_stderr


def render_list_summary(listing: Listing, seconds: float, shown: int = 3) -> str:
    """Return the human summary of a listing: what was listed and written, what passed over."""

    lines = [
        f"Listed {counted(listing.image_count, 'image')} of "
        f"{counted(len(listing.identities), 'identity')} "
        f"({counted(listing.folders, 'folder')} read in {seconds:.2f} s)."
    ]
    for suffix, path in listing.written.items():
        images = counted(listing.sizes[suffix], "image")
        lines.append(f"Wrote {images} to stdout." if path == "-" else f"Wrote {path}: {images}.")
    if listing.label_map:
        lines.append(f"Wrote the label map {listing.label_map}.")
    if listing.seed is not None:
        lines.append(f"Shuffled with --seed {listing.seed}.")
    skipped = [(reason, count) for reason, count in listing.passed.items() if count]
    if skipped:
        lines.append("Passed over:")
    for reason, count in skipped:
        examples = ", ".join(display_path(p) for p in listing.skipped[reason][:shown])
        more = ", ..." if count > shown else ""
        lines.append(f"  {SKIP_REASONS[reason]}: {count:,} ({examples}{more})")
    return "\n".join(lines)
