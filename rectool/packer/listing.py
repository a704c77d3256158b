"""List an identity-per-folder image tree as im2rec .lst files, with its label map.

`list_images` is `rectool list`: it walks the tree (`walk.walk_tree`), labels and cuts the
images into lists (`splits.make_listing`) and writes them (`write_lists`). The walk's and the
splits' public names stay importable from here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from ..doors.output import (
    OutputFiles,
    check_target,
    check_targets,
    finish_commit,
    scratch_file,
    write_output,
)
from ..errors import ListingError, RectoolError, UsageError
from ..format.paths import PackPaths
from .listfile import LIST_SUFFIX, format_list_lines, label_map_path, label_map_text
from .splits import SPLIT_BY as SPLIT_BY
from .splits import SPLITS as SPLITS
from .splits import (
    Listing,
    Row,
    check_listing_options,
    display_path,
    list_suffixes,
    make_listing,
    resolve_ratios,
)
from .streamlist import ListRows, Phase, SpooledTree, plan_lists, spool_tree
from .walk import (
    DEFAULT_EXTENSIONS,
    SKIP_REASONS,
    Identity,
    Progress,
    TreeWalk,
    default_threads,
    normalize_extensions,
    walk_tree,
)
from .walk import SLOW_LISTING_SECONDS as SLOW_LISTING_SECONDS

# Re-exported for callers of the old module; to give listings a latency, patch
# `walk.listing_clock`, the one the walk reads.
from .walk import listing_clock as listing_clock

if TYPE_CHECKING:
    from _typeshed import StrPath

STDOUT_SINGLE_LIST = "OUT - (standard output) takes a single list: no --chunks or ratios"


def list_paths(out: StrPath, suffixes: Iterable[str]) -> dict[str, str]:
    """Return where each list goes: `out` itself for `""`, else `PREFIX<suffix>.lst`."""
    out = os.fspath(out)
    stem = out[: -len(LIST_SUFFIX)] if out.endswith(LIST_SUFFIX) else out
    return {suffix: out if suffix == "" else f"{stem}{suffix}{LIST_SUFFIX}" for suffix in suffixes}


def _row_blocks(rows: Sequence[Row], block: int = 65536) -> Iterator[bytes]:
    for start in range(0, len(rows), block):
        yield format_list_lines(rows[start : start + block]).encode("utf-8")


def _journal_of(out: StrPath) -> str:
    return PackPaths.journal_beside(out)


def write_lists(
    listing: Listing,
    out: StrPath | BinaryIO,
    labels: StrPath | None = None,
    overwrite: bool = False,
) -> Listing:
    """Write a listing's lists to `out` (a path or a binary stream) and its label map.

    With a path, each list goes where `list_paths` says; the label map goes to `labels`, by
    default `PREFIX.labels.tsv` beside `out` (`listfile.label_map_path`). The files are one
    output (`output.OutputFiles`): all are checked before any is written, an existing one is
    replaced only with `overwrite` (a pack's file never), and after a failure or a crash the
    old files are as they were, or all the new ones are in place. A stream can only take a
    single list, and the label map is written only if `labels` is given.
    Updates and returns `listing` (`written`: suffix -> path, `label_map`).
    """
    lines = {suffix: _row_blocks(rows) for suffix, rows in listing.lists.items()}
    return _write(listing, out, labels, overwrite, lines)


def _write(
    listing: Listing,
    out: StrPath | BinaryIO,
    labels: StrPath | None,
    overwrite: bool,
    lines: Mapping[str, Iterable[bytes]],
) -> Listing:
    """Write `lines` (suffix: the list's bytes, consumed in this order) as `write_lists` says."""
    if hasattr(out, "write"):
        if set(listing.sizes) != {""}:
            raise UsageError(STDOUT_SINGLE_LIST)
        if labels is not None:
            # The label map first: a `pack -` reading these lines from a pipe may read it as
            # soon as the list ends.
            write_output(labels, label_map_text(listing.identities), overwrite, "label map")
            listing.label_map = os.fspath(labels)
        stream = cast(BinaryIO, out)
        try:
            for block in lines[""]:
                stream.write(block)
            stream.flush()
        except OSError as exc:
            raise ListingError(f"cannot write standard output: {exc.strerror or exc}") from exc
        listing.written = {"": "-"}
        return listing
    if labels is None:
        labels = label_map_path(out)
    paths = list_paths(out, listing.sizes)
    output = OutputFiles(_journal_of(out), overwrite, "list")
    try:
        with output:
            for path in [labels, *paths.values()]:
                output.check(path)
            output.add(labels, label_map_text(listing.identities))
            for suffix, data in lines.items():
                output.add(paths[suffix], data)
    except ListingError:
        raise
    except RectoolError as exc:  # it names the file and the reason
        raise ListingError(str(exc)) from None
    listing.label_map = os.fspath(labels)
    listing.written = paths
    return listing


def list_images(
    root: StrPath,
    out: StrPath | BinaryIO,
    *,
    labels: StrPath | None = None,
    exts: Iterable[str] = DEFAULT_EXTENSIONS,
    recursive: bool = True,
    threads: int | None = None,
    progress: Progress | None = None,
    overwrite: bool = False,
    allow_outside_root: bool = False,
    steps: ListSteps | None = None,
    **listing_options: Any,
) -> Listing:
    """Walk `root`, then write its lists to `out` and its label map; return the `Listing`.

    `listing_options` are those of `make_listing`; see `walk_tree` and `write_lists` for the
    rest. The bytes written are those of `write_lists(make_listing(walk_tree(...)))`, in
    memory bounded by the identities, not the images (`streamlist`): the paths wait on an
    unnamed scratch file beside `out` (or in the system's temporary folder), and the
    returned `Listing` holds no rows (its `sizes` count them) and at most a few passed-over
    paths a reason (its `passed` counts them). `progress(folders_scanned, images_found)` as
    the walk goes; `steps`, if given, is told more (`ListSteps`). Options are checked
    before the walk. Raises `ListingError` when nothing under `root` is an image, a file
    cannot be written or memory runs out (a ROOT far larger than an image tree),
    `InputError` for a ROOT that is no image tree (`walk.check_walkable`).
    """
    ratios = resolve_ratios(
        listing_options.get("train_ratio"),
        listing_options.get("val_ratio"),
        listing_options.get("test_ratio"),
    )
    min_per_id = listing_options.get("min_per_id", 1)
    max_per_id = listing_options.get("max_per_id")
    shuffle = listing_options.get("shuffle", False)
    seed = listing_options.get("seed")
    split_by = listing_options.get("split_by", "image")
    chunks = listing_options.get("chunks", 1)
    unknown = set(listing_options) - LISTING_OPTIONS
    if unknown:
        raise TypeError(f"list_images() got unexpected options {sorted(unknown)}")
    check_listing_options(min_per_id, max_per_id, shuffle, seed, split_by, chunks, ratios)
    if hasattr(out, "write") and (ratios is not None or chunks > 1):
        raise UsageError(STDOUT_SINGLE_LIST)
    scratch_folder = None
    if not hasattr(out, "write"):  # refuse an output before the walk, which may take hours
        finish_commit(_journal_of(out))  # what an interrupted run committed comes first
        # Only the files it will write: `faces.lst` is none of them with --val-ratio.
        lists = list_paths(out, list_suffixes(chunks, ratios)).values()
        label_map = label_map_path(out) if labels is None else labels
        check_targets([*((path, "list") for path in lists), (label_map, "label map")], overwrite)
        folder = os.path.dirname(os.fspath(out)) or "."
        scratch_folder = folder if os.path.isdir(folder) else None
    elif labels is not None:
        check_target(labels, overwrite, "label map")
    steps = steps or ListSteps()

    def report(folders: int, found: int, read: int, identities: int) -> None:
        if progress is not None:
            progress(folders, found)
        if steps.walk is not None:
            steps.walk(folders, found, read, identities)

    with scratch_file(scratch_folder) as scratch:
        tree: SpooledTree | None
        try:
            tree = spool_tree(root, scratch, exts, recursive, threads, report, allow_outside_root)
        except MemoryError:  # raised below, once the walk's memory is released with its frames
            tree = None
        if tree is None:
            raise ListingError(
                f"out of memory while listing {os.fspath(root)}: the tree holds more entries "
                "than this process can keep. Is ROOT the image tree (one folder per identity)? "
                "If it is, give the process more memory (or read one folder at a time: "
                "--workers 1)"
            )
        plan = plan_lists(
            tree,
            min_per_id=min_per_id,
            max_per_id=max_per_id,
            shuffle=shuffle,
            seed=seed,
            ratios=ratios,
            split_by=split_by,
            chunks=chunks,
            phase=steps.phase,
        )
        identities = {label: tree.names[identity] for label, identity in enumerate(plan.kept)}
        listing = Listing(
            tree.root,
            identities,
            {},
            tree.skipped.paths,
            tree.folders,
            plan.seed,
            sizes=plan.sizes,
            passed=tree.skipped.counts,
        )
        if not listing.image_count:
            tree.skipped.finish()
            passed = ", ".join(
                f"{count} {reason}" for reason, count in listing.passed.items() if count
            )
            raise ListingError(
                f"no images to list under {os.fspath(root)}"
                + (f" (passed over: {passed})" if passed else " (it has no identity folders)")
                + f"; image extensions: {' '.join(normalize_extensions(exts))}"
            )
        rows = ListRows(tree, plan, max_per_id, steps.phase)
        lines = {
            part.suffix: rows.part_lines(part) for part in plan.parts if part.suffix is not None
        }
        _write(listing, out, labels, overwrite, lines)
        rows.finish()
        tree.skipped.finish()
    return listing


@dataclass(frozen=True)
class ListSteps:
    """What `list_images` says as it goes, each called on the calling thread if given:
    `walk(folders_scanned, images_found, identity_folders_read, identity_folders)` as it
    walks, then `phase(name, done, total)` for each step after it (`streamlist.Phase`):
    "shuffle" (rows, with --shuffle), "gather" (rows read back for a shuffle) and "write"
    (lines written, told once before the first), every few thousand rows."""

    walk: Callable[[int, int, int, int], object] | None = None
    phase: Phase | None = None


LISTING_OPTIONS = frozenset(
    {
        "min_per_id",
        "max_per_id",
        "shuffle",
        "seed",
        "train_ratio",
        "val_ratio",
        "test_ratio",
        "split_by",
        "chunks",
    }
)


__all__ = [
    "DEFAULT_EXTENSIONS",
    "SKIP_REASONS",
    "Identity",
    "ListSteps",
    "Listing",
    "TreeWalk",
    "default_threads",
    "display_path",
    "list_images",
    "list_paths",
    "make_listing",
    "normalize_extensions",
    "resolve_ratios",
    "walk_tree",
    "write_lists",
]
