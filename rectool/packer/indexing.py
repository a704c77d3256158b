"""A manifest and binary index for a pack that lacks them (`rectool index`), and a shard's entry
written again after its `.idx` was rebuilt (`rectool reindex`).

A pack made by im2rec (a bare `.rec`/`.idx`), by insightface (`train.rec`/`train.idx`, its
layout read from record 0), a numbered set of shards (`PREFIX-00000.rec`, ...) or an older
rectool (manifest format 1 or 2) gets the format-3 files that `pack` writes: the `.npy` arrays
(`format/binindex.py`) and a manifest naming them, beside its shards, under the prefix's lock.
The shards are read, never changed.

For a pack in a folder rectool cannot write (a read-only dataset), `index_pack(into=FOLDER)`
writes the same files into FOLDER instead, with a symbolic link there to each file the manifest
names (`FOLDER/NAME.rec -> /abs/NAME.rec`, ...), so that every name in the manifest is still a
file in its folder. The manifest lists those links (`links`: {name: absolute target}): that
folder's files lead out of it on purpose. The whole output is built in a staging folder and
moved into place as one commit (`packer/manifest.replace_beside`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..dataset.sources import resolve_source, source_prefixes
from ..doors.inputs import open_checked
from ..doors.output import OutputLock, commit, make_folders, make_link, write_json_atomic
from ..errors import InputError, RectoolError
from ..format.binindex import (
    index_files,
    index_manifest,
    write_pack_index,
)
from ..format.digest import SHA256, XXH3_128, Digests, field_name, file_digests
from ..format.manifest import read_manifest, refuse_unfinished_plan
from ..format.paths import MANIFEST_SUFFIX, PackPaths
from ..reader import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    refuse_unfinished,
)
from .manifest import (
    created_time,
    discard_staging,
    finish_interrupted,
    finish_interrupted_source,
    output_files,
    replace_beside,
    staging_prefix,
)

if TYPE_CHECKING:
    from _typeshed import StrPath

    from ..format.binindex import PackIndex

_READ_BYTES = 4 << 20


@dataclass
class IndexResult:
    """What `index_pack` found and wrote.

    `previous`: the manifest's format version before (None: the pack had no manifest);
    `written`: the files written, manifest last (empty when the pack was already indexed);
    `links`: with `into`, each link made in that folder {name: the file it leads to}.
    """

    manifest: str
    layout: str
    shards: int
    samples: int
    previous: int | None
    written: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)

    @property
    def already(self) -> bool:
        """Whether the pack already had its binary index (nothing was written)."""
        return not self.written

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "layout": self.layout,
            "shards": self.shards,
            "samples": self.samples,
            "previous_format_version": self.previous,
            "already_indexed": self.already,
            "written": self.written,
            "links": self.links,
        }


def index_pack(
    target: StrPath, force: bool = False, into: StrPath | None = None, overwrite: bool = False
) -> IndexResult:
    """Write the manifest and binary index (format 3) of the pack at `target`, beside it or,
    with `into`, into that folder.

    `target`: what `open_dataset` takes, less URLs and lists (a manifest, a prefix, a `.rec`, a
    folder holding `train.rec`). A format-1/2 manifest is upgraded, its fields kept and its
    identity names moved to `PREFIX.identities.json`. A pack already indexed is left as it is
    unless `force`. Beside the shards, their folder must be writable. `into`: a folder (made if
    missing) that gets the manifest, the index and a link to each of the pack's files, named
    as they are; the pack's own folder is only read. An index of another pack there (or any
    file of the prefix) is replaced only with `overwrite`; one `index_pack` wrote there of
    the same files is left as it is unless `force`.
    """
    _refuse_url(target)
    if into is None:  # an index (or pack) a killed run committed beside it comes first
        finish_interrupted_source(target)
    paths = pack_prefix(target)
    if into is not None and not _same_folder(into, paths.folder or "."):
        return _index_into(target, paths, os.fspath(into), force, overwrite)
    check_writable(paths)
    with OutputLock(paths):
        finish_interrupted(paths)  # an index a killed run committed comes first
        refuse_unfinished(paths.prefix)
        path = paths.manifest
        if os.path.lexists(path):  # read under the lock: another run may have written it
            manifest = read_manifest(path)
            if _index_present(paths, manifest) and not force:
                return _already(path, manifest)
            return _write(paths, *_again(target, paths, manifest))
        return _write(paths, *_described(paths, resolve_source(target)[2]))


def _refuse_url(target: StrPath) -> None:
    """Refuse a URL: the index is written beside local shards, or into a local folder."""
    from ..redaction import safe_url
    from ..remote.store import is_url

    if is_url(target):
        raise InputError(
            f"{safe_url(os.fspath(target))}: a URL; `rectool index` reads local shards only "
            "(it writes their manifest and index beside them, or --into a local folder). "
            "Download the pack's .rec and .idx files and index the copy; a pack written by "
            "`rectool pack` or `repack` is indexed already"
        )


def _same_folder(a: StrPath, b: StrPath) -> bool:
    """Whether two folder paths name one folder (either may not exist yet)."""
    return os.path.realpath(a) == os.path.realpath(b)


def pack_prefix(target: StrPath) -> PackPaths:
    """Return the paths of the pack whose manifest describes `target` (`PREFIX.manifest.json`)."""
    _, path, shards = resolve_source(target)
    if path is not None:
        if not PackPaths.is_manifest(path):
            raise InputError(
                f"{path}: a manifest is named PREFIX{MANIFEST_SUFFIX}; rename it to index the pack"
            )
        return PackPaths.of_manifest(path)
    stems = [PackPaths.of_rec(rec) for rec, _ in shards]
    if len(stems) == 1:
        numbered = stems[0].numbered_pack()
        if numbered is not None and os.path.exists(numbered.manifest):
            raise InputError(
                f"{shards[0][0]}: a shard of the pack {numbered}; index the pack "
                f"({numbered.manifest}), not one of its shards"
            )
        return stems[0]
    bases = {stem.numbered_pack() for stem in stems}
    if len(bases) != 1 or None in bases:
        raise InputError(f"{stems[0]}: shards of several packs; name one pack")
    base = bases.pop()
    assert base is not None  # (refused above)
    return base


def check_writable(paths: PackPaths) -> None:
    """Refuse a prefix whose folder cannot be written: the manifest and index go beside it."""
    folder = paths.folder or "."
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only or not os.access(folder, os.W_OK):
        raise RectoolError(
            f"{folder}: read-only; `rectool index` writes the manifest and index beside the "
            f"shards ({os.path.basename(paths.manifest)}, .npy arrays). Write them "
            "into a folder you can write with --into FOLDER: the shards stay where they are, "
            "linked from there"
        )


def _index_present(paths: PackPaths, manifest: dict[str, Any], sized: bool = True) -> bool:
    """Whether a format-3 manifest has its index and every index file it names is there, of
    the size it records (a file cut or written over is no index: the reader refuses it;
    `sized=False`: of any size)."""
    index = manifest.get("index")
    if manifest.get("format_version", 0) < MANIFEST_VERSION or not isinstance(index, dict):
        return False
    for entry in (e for e in index.values() if isinstance(e, dict) and "file" in e):
        size = _file_size(paths.beside(entry["file"]))
        if size is None or (sized and size != entry.get("bytes")):
            return False
    return True


def _file_size(path: str) -> int | None:
    """Return the size of the regular file at `path` (None: not one)."""
    return os.path.getsize(path) if os.path.isfile(path) else None


def _already(path: str, manifest: dict[str, Any]) -> IndexResult:
    """Return the result of a pack indexed already (nothing written)."""
    samples = manifest["index"]["samples"]
    layout = manifest.get("layout") or "images"
    links = manifest.get("links") or {}
    return IndexResult(
        path, layout, len(samples), sum(samples), manifest["format_version"], links=links
    )


def _again(
    target: StrPath, paths: PackPaths, manifest: dict[str, Any]
) -> tuple[dict[str, Any], PackIndex, int | None]:
    """Return (the manifest, index and format version before) of a pack that has a manifest.

    A manifest `index` described (no options, no list: not packed by rectool) records only
    what the shards were, so it is described again from the shards as they are now (their
    sizes, digests and keys; its `links` kept); a pack's own manifest is upgraded
    (`_upgraded`), its record of the shards kept and checked."""
    if "options" in manifest or manifest.get("list") is not None:
        return _upgraded(paths.manifest, manifest)
    described, index, _ = _described(paths, _shards_now(target, paths, manifest))
    if "links" in manifest:
        described["links"] = manifest["links"]
    return described, index, manifest.get("format_version", 0)


def _shards_now(
    target: StrPath, paths: PackPaths, manifest: dict[str, Any]
) -> list[tuple[str, str]]:
    """Return the (rec, idx) shards of a pack `index` described, found as they are now: a
    numbered set found again (a shard added or gone since), else those its manifest names."""
    numbered = paths.numbered_recs()
    listed = [shard["rec"] for shard in manifest["shards"]]
    if numbered and listed == [os.path.basename(paths.shard(n).rec) for n in range(len(listed))]:
        refuse_unfinished_plan(paths, numbered)
        return [(rec, PackPaths.idx_beside(rec)) for rec in numbered]
    return resolve_source(target)[2]


def _upgraded(path: str, manifest: dict[str, Any]) -> tuple[dict[str, Any], PackIndex, int | None]:
    """Return (the manifest at `path` as format 3, its fields kept; its pack's index; its
    format version before)."""
    previous = manifest.get("format_version", 0)
    index = index_manifest(path, manifest, unique=True, covered=True)
    manifest["format_version"] = MANIFEST_VERSION
    if manifest.get("layout") is None:
        manifest["layout"] = index.layout
    return manifest, index, previous


def _described(
    paths: PackPaths, shards: list[tuple[str, str]]
) -> tuple[dict[str, Any], PackIndex, int | None]:
    """Return (the manifest `pack` would write for shards without one, their index, None)."""
    for rec, idx in shards:
        for name in (rec, idx):
            if os.path.dirname(name) != paths.folder:
                raise InputError(
                    f"{name}: not in the folder of {paths}; a manifest names the files beside it"
                )
    recs, idxs = [rec for rec, _ in shards], [idx for _, idx in shards]
    index = index_files(recs, idxs, None, None, paths.manifest, unique=True, covered=True)
    entries = [shard_entry(rec, idx) for rec, idx in shards]
    samples = sum(index.counts)
    identities = None if index.identity_ranges is None else len(index.identity_ranges)
    manifest = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "rectool_version": __version__,
        "created": created_time(),
        "layout": index.layout,
        "list": None,  # not packed by rectool: no list, options or failures
        "shards": entries,
        "totals": {
            "shards": len(entries),
            "records": sum(e["records"] for e in entries),
            "images": samples,
            "rec_bytes": sum(e["rec_bytes"] for e in entries),
            "failures": None,
        },
        "classes": identities,
        "identities": None,
    }
    return manifest, index, None


def _write(
    paths: PackPaths, manifest: dict[str, Any], index: PackIndex, previous: int | None
) -> IndexResult:
    """Write the index arrays, the identity names (from an older manifest), the manifest last.

    `index` was read with `unique`: an `.idx` that names a key twice was refused (MXNet
    reads its last line, DALI every line, so no one index says which record the key is)."""
    path = paths.manifest
    if os.path.lexists(path):
        written = _replace_index(paths, manifest, index)
    else:
        written = write_pack_index(paths, manifest, index)
        write_json_atomic(path, manifest)
    return IndexResult(
        path, index.layout, len(index.counts), sum(index.counts), previous, [*written, path]
    )


def _replace_index(paths: PackPaths, manifest: dict[str, Any], index: PackIndex) -> list[str]:
    """Write the index arrays (and identities file) and the manifest of the pack at `paths`
    over those it has, as one commit; return the files written, manifest excluded.

    Written one by one, a run killed between two arrays would leave the new keys beside the
    old labels under the old manifest, which the reader maps as a whole index. Staged
    (`staging_prefix`) and moved through the commit journal instead: after a crash the old
    index is whole, or the journal is there (the reader refuses the pack) and the next run
    (`finish_interrupted`) completes the new one. Old index arrays the new index does not
    have (the identity ranges of a pack no longer insightface) are removed in the commit."""
    staging = staging_prefix(paths)
    try:
        staged = write_pack_index(staging, manifest, index)
        write_json_atomic(staging.manifest, manifest)
        finals = [paths.beside(os.path.basename(p)) for p in staged]
        old = [p for p in paths.arrays.values() if os.path.lexists(p) and p not in finals]
        commit(paths.journal, list(zip(staged, finals)), old, (staging.manifest, paths.manifest))
    except BaseException:
        if not os.path.lexists(paths.journal):  # not committed: the old index stays
            discard_staging(staging)
        raise
    return finals


# --- into another folder ------------------------------------------------------------------


def _index_into(
    target: StrPath, paths: PackPaths, into: str, force: bool, overwrite: bool
) -> IndexResult:
    """Index the pack at `paths` into the folder `into` (see `index_pack`)."""
    refuse_unfinished(paths.prefix)
    source = paths.manifest
    if os.path.lexists(source):
        manifest = read_manifest(source)
        if _index_present(paths, manifest) and not force:
            return _already(source, manifest)
        manifest, index, previous = _again(target, paths, manifest)
    else:
        manifest, index, previous = _described(paths, resolve_source(target)[2])
    links = _links_of(paths, manifest)
    out = PackPaths(os.path.join(into, paths.stem))
    make_folders(into)
    with OutputLock(out):
        finish_interrupted(out)  # a replacement a killed run committed comes first
        refuse_unfinished(out.prefix)
        present = _present_there(out, links)
        if present and not overwrite:
            earlier = _earlier_index(out, links)
            if earlier is None:
                raise RectoolError(_occupied(out, present, paths))
            if _index_present(out, earlier) and not force:
                return _already(out.manifest, earlier)

        def build(staging: PackPaths) -> IndexResult:
            for name, to in links.items():
                make_link(staging.beside(name), to)
            return _write(staging, {**manifest, "links": links}, index, previous)

        staged = replace_beside(out, build)
    final = [os.path.join(into, os.path.basename(p)) for p in staged.written]
    made = [os.path.join(into, name) for name in links]
    return IndexResult(
        out.manifest, staged.layout, staged.shards, staged.samples, previous,
        [*made, *final], links,
    )  # fmt: skip


def _links_of(pack: PackPaths, manifest: dict[str, Any]) -> dict[str, str]:
    """Return {name: absolute path} of each file of the pack at `pack` that its manifest
    names and that stays where it is: shards, their `.idx` and `.crc`, the failures file and
    an identities file (not the index arrays, which are written anew)."""
    names = [n for s in manifest["shards"] for n in (s.get("rec"), s.get("idx"), s.get("crc"))]
    names.append(manifest.get("failures_file"))
    identities = manifest.get("identities")
    if isinstance(identities, dict) and isinstance(identities.get("file"), str):
        names.append(identities["file"])
    folder = os.path.abspath(pack.folder or ".")
    paths = {n: os.path.join(folder, n) for n in names if isinstance(n, str)}
    return {n: p for n, p in paths.items() if os.path.lexists(p)}


def _present_there(out: PackPaths, links: dict[str, str]) -> list[str]:
    """Return the files of a pack at `out` that are there, and any file at a link's name."""
    named = [p for p in (out.beside(n) for n in links) if os.path.lexists(p)]
    return sorted({*output_files(out), *named})


def _earlier_index(out: PackPaths, links: dict[str, str]) -> dict[str, Any] | None:
    """Return the manifest at `out` when `index_pack(into=)` wrote it for the same files (its
    links, and the links there, lead where `links` do), else None: `out` holds another pack."""
    path = out.manifest
    if not os.path.isfile(path):
        return None
    try:
        manifest = read_manifest(path)
    except RectoolError:
        return None
    for name, to in links.items():
        there = out.beside(name)
        if not os.path.islink(there) or os.readlink(there) != to:
            return None
    return manifest if manifest.get("links") == links else None


def _occupied(out: PackPaths, present: list[str], pack: PackPaths) -> str:
    """Return why `index --into` will not write over what is at `out`."""
    if os.path.exists(out.manifest):
        what = f"a pack is already there ({out.manifest}), not an index of {pack}"
    else:
        what = f"{present[0]} is already there"
    return f"{out}: {what}; use --overwrite to replace it, or index into another folder"


def shard_entry(rec: str, idx: str) -> dict[str, Any]:
    """Return the manifest entry of a finished shard, as `pack` writes it (`ShardInfo`): its
    files' sizes and xxh3-128, its records (.idx lines) and first and last key."""
    rec_bytes = os.path.getsize(rec)
    rec_digest = file_digests(rec, [XXH3_128], rec_bytes).hexdigests()[XXH3_128]
    return {
        "rec": os.path.basename(rec),
        "idx": os.path.basename(idx),
        "rec_bytes": rec_bytes,
        field_name("rec", XXH3_128): rec_digest,
        **idx_entry(idx),
    }


def idx_entry(idx: str, algorithms: tuple[str, ...] = (XXH3_128,)) -> dict[str, Any]:
    """Return what a shard's manifest entry says of its `.idx`: records (its lines), bytes,
    digests, first and last key; the file is read once."""
    digests, lines, first, last, size = _idx_facts(idx, algorithms)
    return {
        "records": lines,
        "idx_bytes": size,
        **{field_name("idx", a): h for a, h in digests.items()},
        "first_key": first,
        "last_key": last,
    }


def _idx_facts(
    idx: str, algorithms: tuple[str, ...]
) -> tuple[dict[str, str], int, int | None, int | None, int]:
    """Read an .idx once; return (its digests, lines, first key, last key, bytes)."""
    digests, lines, size, head, tail = Digests(algorithms), 0, 0, b"", b""
    buf = bytearray(_READ_BYTES)
    view = memoryview(buf)
    with os.fdopen(open_checked(idx, "index file")[0], "rb", buffering=0) as f:
        while n := f.readinto(view):
            chunk = view[:n]
            digests.update(chunk)
            lines += buf.count(b"\n", 0, n)
            size += n
            if len(head) < 64:
                head += bytes(chunk[: 64 - len(head)])
            tail = (tail + bytes(chunk[-64:]))[-64:]
    if size and not tail.endswith(b"\n"):
        lines += 1
    first = _key_of(head.split(b"\n", 1)[0]) if size else None
    last = _key_of(tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]) if size else None
    return digests.hexdigests(), lines, first, last, size


def _key_of(line: bytes) -> int | None:
    key = line.split(b"\t", 1)[0].strip()
    return int(key) if key.isdigit() else None


def refresh_shard(paths: PackPaths, number: int) -> list[str]:
    """Describe shard `number` of the format-3 pack at `prefix` again after its `.idx` was
    rebuilt (`rectool reindex`; the `.rec` is unchanged): its manifest entry, the totals and
    the binary index, from the shards as they are now. Call it holding the prefix's lock;
    return the files written."""
    path = paths.manifest
    manifest = read_manifest(path)
    shards = manifest["shards"]
    old = shards[number]
    algorithms = tuple(a for a in (XXH3_128, SHA256) if field_name("idx", a) in old)
    shards[number] = {**old, **idx_entry(paths.beside(old["idx"]), algorithms)}
    index = index_manifest(path, manifest, unique=True)
    totals = manifest.get("totals")
    if isinstance(totals, dict):
        totals["records"] = sum(s["records"] for s in shards)
        if totals.get("images") is not None:
            totals["images"] = sum(index.counts)
    return _write(paths, manifest, index, manifest.get("format_version")).written


def indexed_pack_of(rec: str, idx: str) -> tuple[PackPaths, int] | None:
    """Return (its paths, shard number) of the format-3 pack whose shard `rec` is, with `idx`
    that shard's own `.idx`; None for any other `.rec` (or one whose manifest cannot be read:
    it has no index a reader could use)."""
    for prefix in source_prefixes(rec):
        paths = PackPaths(prefix)
        if not os.path.isfile(paths.manifest):
            continue
        try:
            manifest = read_manifest(paths.manifest)
        except RectoolError:
            continue
        if not _index_present(paths, manifest, sized=False):  # a damaged one: refreshed
            continue
        for number, shard in enumerate(manifest["shards"]):
            own_rec, own_idx = (paths.beside(shard[n]) for n in ("rec", "idx"))
            if _same_path(own_rec, rec) and _same_path(own_idx, idx):
                return paths, number
    return None


def _same_path(a: str, b: str) -> bool:
    """Whether two paths name one file (either may not exist yet)."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def recorded_idx(paths: PackPaths, number: int) -> dict[str, Any]:
    """Return the manifest entry of shard `number` of the pack at `paths`."""
    shards: list[dict[str, Any]] = read_manifest(paths.manifest)["shards"]
    return shards[number]
