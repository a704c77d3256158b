"""`rectool list ARCHIVE OUT`: an archive's members listed as the extracted tree would be.

`list_archive` is `packer/listing.list_images` for an archive ROOT: it reads the member index
(`source.open_archive`; a compressed tar is read once to the end, in order), turns it into
the `TreeWalk` a walk of the extracted tree would return (`walk_members`: the same identities,
images and reasons to pass over, with links and devices, which an archive does not follow, as
`not_regular`), and hands it to the same `make_listing` and `write_lists`. So the labels, the
lines and the label map are the tree's, byte for byte, with one exception: a list of a
compressed tar (unless `--shuffle`) has its lines in the archive's order, indices unchanged,
so that `pack` reads the stream once with nothing held back (see `reading.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..doors.output import check_target
from ..errors import ListingError, UsageError
from ..packer.listfile import is_writable_path
from ..packer.listing import STDOUT_SINGLE_LIST, write_lists
from ..packer.splits import Listing, check_listing_options, make_listing, resolve_ratios
from ..packer.walk import (
    DEFAULT_EXTENSIONS,
    SKIP_REASONS,
    Identity,
    Progress,
    TreeWalk,
    normalize_extensions,
)
from .members import FILE, FOLDER, ArchiveError, MemberIndex
from .source import TAR_GZ, WEBDATASET, Archive, archive_kind, open_archive

if TYPE_CHECKING:
    from _typeshed import StrPath

# (member position) -> the identity of a webdataset sample, or None.
IdentityOf = Callable[[int, str], "str | None"]


def _path_key(path: str) -> list[str]:
    return path.split("/")


def walk_members(
    index: MemberIndex,
    root: StrPath,
    exts: Iterable[str] = DEFAULT_EXTENSIONS,
    recursive: bool = True,
    identity_of: IdentityOf | None = None,
) -> TreeWalk:
    """Return the `TreeWalk` of the tree an archive would extract to (see the module).

    `identity_of(i, path)`, when given (webdataset), names the identity of member i; else
    a member's identity is its first folder, as in a tree.
    """
    exts = frozenset(normalize_extensions(exts))
    skipped: dict[str, set[str]] = {reason: set() for reason in SKIP_REASONS}
    images: dict[str, list[str]] = {}
    folders: set[str] = set()
    plain = "".join(index.names)
    check_names = not (plain.isprintable() and " " not in plain)
    for i, name in enumerate(index.names):
        path = index.relative(name)
        kind = index.kinds[i]
        parts = path.split("/")
        hidden = next((k for k, part in enumerate(parts) if part.startswith(".")), None)
        if hidden is not None:
            skipped["hidden"].add("/".join(parts[: hidden + 1]))
            continue
        if check_names:
            bad = next((k for k, part in enumerate(parts) if not is_writable_path(part)), None)
            if bad is not None:
                skipped["unwritable_name"].add("/".join(parts[: bad + 1]))
                continue
        if identity_of is not None:
            identity = identity_of(i, path) if kind != FOLDER else None
            if identity is None:
                if kind != FOLDER and not _is_image(parts[-1], exts):
                    skipped["not_image"].add(path)
                elif kind != FOLDER:
                    skipped["outside_identity"].add(path)
                continue
        else:
            if len(parts) == 1:
                if kind == FOLDER:
                    images.setdefault(path, [])
                    folders.add(path)
                else:
                    skipped["outside_identity"].add(path)
                continue
            identity = parts[0]
            if len(parts) > 2 and not recursive:
                images.setdefault(identity, [])
                skipped["subfolder"].add("/".join(parts[:2]))
                continue
        folders.add(path.rpartition("/")[0] if kind != FOLDER else path)
        listed = images.setdefault(identity, [])
        if kind == FOLDER:
            continue
        if not _is_image(parts[-1], exts):
            skipped["not_image"].add(path)
        elif kind != FILE:
            skipped["not_regular"].add(path)
        else:
            listed.append(path)
    identities = []
    for identity in sorted(images):
        paths = images[identity]
        if not paths:
            skipped["empty_identity"].add(identity)
            continue
        paths.sort(key=_path_key)
        identities.append(Identity(identity, tuple(paths)))
    ordered = {reason: sorted(paths, key=_path_key) for reason, paths in skipped.items()}
    return TreeWalk(Path(root), identities, ordered, len(folders))


def _is_image(name: str, exts: frozenset[str]) -> bool:
    dot = name.rfind(".")
    return dot > 0 and name[dot:].lower() in exts


def index_stream(archive: Archive) -> MemberIndex:
    """Return the member index of a compressed tar, read once to its end."""
    from .compressed import open_blocks
    from .tar import HeaderChecks, walk_tar

    blocks = open_blocks(archive.files[0], archive.root)
    index = MemberIndex(archive.root)
    checks = HeaderChecks(archive.root)
    try:
        for name, kind, offset, size in walk_tar(blocks, None, checks):
            blocks.where = f"member {name!r}"
            index.add(name, kind, offset, size)
    except ArchiveError:
        checks.check()  # a damaged header explains a bad name
        raise
    return index.finish()


def _webdataset_identities(archive: Archive) -> IdentityOf:
    from .webdataset import sample_identity, sample_key

    index = archive.index

    def read(i: int) -> bytes:
        data = archive.read(index.member(i))
        return data if isinstance(data, bytes) else b""

    def identity_of(i: int, path: str) -> str | None:
        shard, _, name = path.partition("/")
        key, _ = sample_key(name)
        return sample_identity(index, shard, key, read)

    return identity_of


def archive_order(listing: Listing, index: MemberIndex) -> Listing:
    """Put each list's lines in the archive's order (their indices unchanged)."""
    for rows in listing.lists.values():
        rows.sort(key=lambda row: index.position(row[2]) or 0)
    return listing


def list_archive(
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
    **listing_options: Any,
) -> Listing:
    """List an archive ROOT as `list_images` lists a tree; return the `Listing`.

    Takes `list_images`' arguments (`threads` and `allow_outside_root` have nothing to do
    here: an archive is read in order and its links are never followed). Raises
    `ArchiveError` (an `InputError`) for a damaged or hostile archive, naming the member.
    """
    del threads, allow_outside_root
    ratios = resolve_ratios(
        listing_options.get("train_ratio"),
        listing_options.get("val_ratio"),
        listing_options.get("test_ratio"),
    )
    check_listing_options(
        listing_options.get("min_per_id", 1),
        listing_options.get("max_per_id"),
        listing_options.get("shuffle", False),
        listing_options.get("seed"),
        listing_options.get("split_by", "image"),
        listing_options.get("chunks", 1),
        ratios,
    )
    if hasattr(out, "write") and (ratios is not None or listing_options.get("chunks", 1) > 1):
        raise UsageError(STDOUT_SINGLE_LIST)
    if not hasattr(out, "write"):  # refuse an output before reading a long archive
        check_target(out, overwrite, "list")
    if labels is not None:
        check_target(labels, overwrite, "label map")
    kind = archive_kind(root)
    with open_archive(root, kind) as archive:
        index = index_stream(archive) if kind == TAR_GZ else archive.index
        identity_of = _webdataset_identities(archive) if kind == WEBDATASET else None
        walk = walk_members(index, root, exts, recursive, identity_of)
    if progress is not None:
        progress(walk.folders, walk.image_count)
    listing = make_listing(walk, **listing_options)
    if not listing.image_count:
        passed = ", ".join(
            f"{len(paths)} {reason}" for reason, paths in listing.skipped.items() if paths
        )
        raise ListingError(
            f"no images to list in {os.fspath(root)}"
            + (f" (passed over: {passed})" if passed else " (it has no identity folders)")
            + f"; image extensions: {' '.join(normalize_extensions(exts))}"
        )
    if kind == TAR_GZ and not listing_options.get("shuffle", False):
        archive_order(listing, index)
    return write_lists(listing, out, labels, overwrite)
