"""Where a dataset's shards are: a manifest, a pack prefix, a .rec, a folder or a list of them.

The emitted reader opens a pack by its prefix or manifest only; the package's commands take
any of these (`resolve_source`), and foreign packs too (`dataset/packs.py`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..format.manifest import read_manifest, refuse_unfinished_plan
from ..format.paths import PackPaths
from ..reader import (
    InputError,
    refuse_unfinished,
)

if TYPE_CHECKING:
    from _typeshed import StrPath

    Source = StrPath | list[StrPath] | tuple[StrPath, ...]  # see resolve_source


def resolve_source(
    source: Source,
) -> tuple[dict[str, Any] | None, str | None, list[tuple[str, str]]]:
    """Find a dataset's shards; return (manifest or None, manifest path or None, shards).

    `source`: a manifest (.json), a .rec, a pack prefix (`PREFIX.manifest.json`, `PREFIX.rec`,
    `PREFIX-00000.rec`...), a folder holding `train.rec` (insightface) or a list of .rec paths.
    `shards` lists (rec, idx) path pairs; each that exists is checked to be a regular file.
    """
    if isinstance(source, (list, tuple)):
        if not source:
            raise InputError("no shard paths given")
        recs = [os.fspath(p) for p in source]
        for prefix in {p for rec in recs for p in source_prefixes(rec)}:
            refuse_unfinished(prefix)
    elif os.path.isdir(source := os.fspath(source)):
        if os.path.exists(os.path.join(source, "train.rec")):
            return resolve_source(os.path.join(source, "train.rec"))
        packs = sorted(n for n in os.listdir(source) if PackPaths.is_manifest(n))
        if len(packs) == 1:  # a folder holding one rectool pack: that pack
            return resolve_source(os.path.join(source, packs[0]))
        some = f" ({len(packs)} manifests: name one)" if packs else ""
        raise InputError(
            f"{source}: a folder without train.rec or one pack{some}; give a manifest, .rec "
            "or prefix"
        )
    elif source.endswith(".json"):
        for prefix in source_prefixes(source):
            refuse_unfinished(prefix)
        manifest, folder = read_manifest(source), os.path.dirname(source)
        shards = [(s["rec"], s["idx"]) for s in manifest["shards"]]
        pairs = [(os.path.join(folder, rec), os.path.join(folder, idx)) for rec, idx in shards]
        return manifest, source, _checked(pairs)
    elif source.endswith(".rec"):
        named = PackPaths.of_rec(source).manifest
        if os.path.exists(named) and os.path.exists(source):  # a pack of one shard
            found = resolve_source(named)
            if len(found[2]) == 1 and os.path.samefile(found[2][0][0], source):
                return found
        if not os.path.exists(source):
            raise InputError(f"{source}: record file not found")
        for prefix in source_prefixes(source):
            refuse_unfinished(prefix)
        recs = [source]
    elif os.path.exists((paths := PackPaths(source)).manifest):
        return resolve_source(paths.manifest)
    elif os.path.exists(paths.rec):
        return resolve_source(paths.rec)
    else:
        refuse_unfinished(source)
        recs = paths.numbered_recs()
        if not recs:
            raise InputError(
                f"{source}: no dataset here (looked for {paths.manifest}, {paths.rec}, "
                f"{paths.shard(0).rec})"
            )
        refuse_unfinished_plan(paths, recs)  # shards of a job array, not yet finalized
    return None, None, _checked([(p, PackPaths.idx_beside(p)) for p in recs])


def source_prefixes(source: str) -> list[str]:
    """Return the pack prefixes a source path may belong to (for `refuse_unfinished`)."""
    if PackPaths.is_manifest(source):
        return [PackPaths.of_manifest(source).prefix]
    if source.endswith(".rec"):
        stem = PackPaths.of_rec(source)
        numbered = stem.numbered_pack()
        return [stem.prefix] if numbered is None else [stem.prefix, numbered.prefix]
    train = os.path.join(source, "train.rec")
    if os.path.isdir(source) and os.path.exists(train):  # an insightface folder: its train
        return [source, *source_prefixes(train)]
    return [source]


def _checked(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    if len({os.path.realpath(rec) for rec, _ in pairs}) < len(pairs):
        raise InputError(f"{pairs[0][0]}: a shard is listed twice")
    for path in (p for pair in pairs for p in pair):
        if os.path.exists(path) and not os.path.isfile(path):  # a missing file: its opener says
            raise InputError(f"{path}: not a regular file (shard files must be)")
    return pairs
