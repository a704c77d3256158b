"""A pack's files and its manifest: when each of a pack's files may exist.

The names are `format/paths.PackPaths`'s (shards, `.partial`s, failures, state, stdin copy,
staging folder, binary index, identities, manifest); here, the rules over them: which files
a pack at OUT_PREFIX may have written, when it may be replaced or resumed, how `--overwrite`
swaps a new pack in, and the manifest, written last. `pack`, `repack`, `--finalize` and Dask
all go through it.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .. import __version__
from ..dataset.sources import source_prefixes
from ..doors.inputs import read_state
from ..doors.output import (
    OutputLock,
    commit,
    finish_commit,
    make_folders,
    remove,
    remove_tree,
    rename,
    same_place,
    stage_file,
    write_json_atomic,
)
from ..errors import InputError, RectoolError, UsageError
from ..format.binindex import Written, index_manifest, write_pack_index
from ..format.paths import LOCK_SUFFIX, PARTIAL_SUFFIX, STATE_SUFFIX, PackPaths
from ..reader import MANIFEST_FORMAT, MANIFEST_VERSION

if TYPE_CHECKING:
    from _typeshed import StrPath, SupportsRead

    from ..dataset.sources import Source
    from .images import Transform
    from .shardfile import ShardInfo

T = TypeVar("T")


class ManifestOptions(Protocol):
    """What a manifest records of a pack's or a repack's options (`PackOptions`,
    `RepackOptions`)."""

    @property
    def layout(self) -> str: ...
    @property
    def transform(self) -> Transform | None: ...
    @property
    def workers(self) -> int: ...
    @property
    def max_failures(self) -> int | float: ...
    @property
    def sha256(self) -> bool: ...
    def byte_options(self) -> dict[str, Any]: ...


def write_manifest(
    paths: PackPaths, manifest: dict[str, Any], written: Written | None = None
) -> None:
    """Write the manifest of the pack at `paths`, the mark that it is complete; before it, the
    pack's binary index (format 3: `.npy` arrays the reader maps, read from the finished
    shards, or `written`: what their writer hands over) and the file of its identity names,
    both named in the manifest."""
    write_pack_index(paths, manifest, index_manifest(paths.manifest, manifest, written))
    write_json_atomic(paths.manifest, manifest)


def output_files(prefix: StrPath | PackPaths) -> list[str]:
    """Return every file a pack to `prefix` may have written (existing ones only)."""
    paths = PackPaths.of(prefix)
    names = [paths.rec, paths.idx, paths.failures, paths.state, paths.stdin_copy]
    names += [*paths.arrays.values(), paths.identities]
    # (Not PREFIX.labels.tsv: beside a list of the same name, it is pack's input.)
    names += [paths.relabel, paths.report, paths.checksums, paths.manifest]
    names += paths.numbered_files()
    names += [paths.partial(n) for n in list(names)]
    names += paths.temporaries()
    return sorted({n for n in names if os.path.exists(n)})


def refuse_inputs_among_outputs(
    paths: PackPaths, inputs: Mapping[str, StrPath | None], also: Iterable[str] = ()
) -> None:
    """Raise `UsageError` when an input (`{what: path}`: the list, the label map) is at the
    name of a file the pack at `paths` writes (or of a file in `also`: a repack's label map):
    the pack would replace it, `--overwrite` or not. ("-", stdin, and None are no file.)"""
    written = [paths.rec, paths.idx, paths.failures, paths.state, paths.stdin_copy, *also]
    written += [*paths.arrays.values(), paths.identities, paths.relabel, paths.report]
    written += [paths.checksums, paths.manifest, paths.journal]
    written += [paths.partial(name) for name in written]
    places = {same_place(name) for name in written}
    folder = same_place(paths.folder or ".")
    numbered = re.escape(paths.stem) + r"-[0-9]+\.(?:rec|idx|rec\.crc|plan\.json)(?:\.partial)?"
    for what, path in inputs.items():
        if path is None or os.fspath(path) == "-":
            continue
        place = same_place(path)
        shard = os.path.dirname(place) == folder and re.fullmatch(numbered, os.path.basename(place))
        if place in places or shard:
            raise UsageError(
                f"{os.fspath(path)}: the {what} is also a file of the pack {paths.prefix}; "
                f"the pack would replace it: move the {what}, or pack to another prefix"
            )


def remove_stale_temporaries(paths: PackPaths) -> None:
    """Remove the temporary files a killed run of the pack at `paths` left."""
    for name in paths.temporaries():
        remove(name)


def finish_interrupted(prefix: StrPath | PackPaths) -> bool:
    """Complete a replacement of the pack at `prefix` that a killed run committed but did not
    finish; return whether there was one. Call it holding the prefix's lock."""
    return finish_commit(PackPaths.of(prefix).journal)


def finish_interrupted_source(source: Source) -> list[str]:
    """Finish the interrupted replacement of the pack `source` (what `open_dataset` takes)
    names, under its lock; return the prefixes finished (`verify` runs this first)."""
    if isinstance(source, (list, tuple)):
        candidates = {p for s in source for p in source_prefixes(os.fspath(s))}
    else:
        candidates = set(source_prefixes(os.fspath(source)))
    finished = []
    for paths in [PackPaths(prefix) for prefix in sorted(candidates)]:
        if os.path.lexists(paths.journal):
            with OutputLock(paths):
                if finish_interrupted(paths):
                    finished.append(paths.prefix)
    return finished


def staging_prefix(paths: PackPaths) -> PackPaths:
    """Return the paths of a fresh pack in a hidden folder beside `paths`
    (`.NAME.overwrite/NAME`), where `--overwrite` builds the new pack; what a killed run left
    there is removed first."""
    remove_tree(paths.staging)
    make_folders(paths.staging)
    return paths.staged


def leftover_staging(prefix: StrPath | PackPaths) -> str | None:
    """Return the staging folder a killed `--overwrite` left beside `prefix` (no journal: the
    pack at `prefix` is the old one, whole), or None."""
    paths = PackPaths.of(prefix)
    if os.path.isdir(paths.staging) and not os.path.lexists(paths.journal):
        return paths.staging
    return None


def discard_staging(staging: PackPaths) -> None:
    """Remove the staging folder of `staging_prefix` and everything a failed run put there."""
    remove_tree(staging.folder)


def replace_beside(paths: PackPaths, build: Callable[[PackPaths], T]) -> T:
    """Build a new pack beside the one at `paths`, then swap it in; return what `build` did.

    `build(staging)` writes the whole new pack at a staging prefix (`staging_prefix`). The old
    pack stays whole until the new one is: a failure or an interruption before the commit
    point removes what was staged; after it (`swap_in`'s journal), the replacement is kept for
    `finish_interrupted` to complete. pack and repack --overwrite both go through here.
    """
    staging = staging_prefix(paths)
    try:
        result = build(staging)
        swap_in(staging, paths)
    except BaseException:
        if not os.path.exists(paths.journal):  # not committed: the old pack stays
            discard_staging(staging)
        raise
    return result


def swap_in(staging: PackPaths, paths: PackPaths) -> None:
    """Replace the pack at `paths` with the complete one at `staging` (see `staging_prefix`).

    One commit (`output.commit`): its journal lists every move (the binary index among
    them), the old files the new pack does not have (more shards, an identities file, the
    insightface identity ranges), and the new manifest, moved last. After a
    crash at any instant the old pack is whole, or the journal is there and
    `finish_interrupted` completes the new one.
    """
    folder = paths.folder or "."
    staged = staging.folder
    new_names = sorted(os.listdir(staged))
    for name in [n for n in new_names if n.endswith(LOCK_SUFFIX)]:
        remove(os.path.join(staged, name))  # a lock a killed task left: not part of a pack
        new_names.remove(name)
    old = set(output_files(paths)) - {os.path.join(folder, n) for n in new_names}
    manifest_name = os.path.basename(paths.manifest)
    moves = [
        (os.path.join(staged, n), os.path.join(folder, n)) for n in new_names if n != manifest_name
    ]
    last = (os.path.join(staged, manifest_name), paths.manifest)
    commit(paths.journal, moves, sorted(old), last)


def shard_files(shard: PackPaths) -> list[str]:
    """Return the files of one planned shard (`--only-shard`; `paths.shard(k)`) that exist,
    `.partial`s included."""
    names = [shard.rec, shard.idx, shard.failures, shard.state, shard.checksums]
    names += [shard.partial(n) for n in names]
    names.append(shard.plan)
    return [n for n in names if os.path.exists(n)]


def prepare_outputs(paths: PackPaths, resume: bool, overwrite: bool) -> None:
    """Make way for a pack at `paths`: remove an old one (`overwrite`), keep an interrupted
    one that a state file describes (`resume`), else refuse to write over files.

    A killed run's temporaries (`.NAME.XXXX.tmp`, never renamed into place) are no output:
    when they are all there is (a kill while the state file, the first, was written), they
    are removed and the pack starts, with or without `resume`."""
    prefix = paths.prefix
    existing = output_files(paths)
    if set(existing) <= set(paths.temporaries()):
        remove_stale_temporaries(paths)
        return
    if overwrite:
        for name in existing:
            remove(name)
        return
    if resume:
        if not os.path.exists(paths.state):
            raise RectoolError(
                f"{prefix}: files exist but no {STATE_SUFFIX} records how they were made; "
                "cannot resume safely (use --overwrite to start again)"
            )
        return
    partial = [n for n in existing if n.endswith(PARTIAL_SUFFIX) or n.endswith(STATE_SUFFIX)]
    if partial:
        raise RectoolError(
            f"{partial[0]}: an interrupted pack left files here; "
            "use --resume to continue it or --overwrite to start again"
        )
    if os.path.exists(paths.manifest):
        raise RectoolError(
            f"{prefix}: a complete pack is already here ({paths.manifest}); use "
            "--overwrite to replace it, or --resume to keep it when it was made from the same "
            "list and options"
        )
    raise RectoolError(
        f"{existing[0]}: a file of pack {prefix} is already here, with no manifest; "
        "use --overwrite to replace it"
    )


def is_complete(paths: PackPaths) -> bool:
    """Return True when the pack at `paths` has its manifest and no state file."""
    return os.path.exists(paths.manifest) and not os.path.exists(paths.state)


def copy_stream(stream: SupportsRead[str] | SupportsRead[bytes], paths: PackPaths) -> str:
    """Copy a list read from `stream` beside the pack (so it can be resumed); return its path."""
    target = paths.stdin_copy
    rename(stage_file(target, _chunks_of(stream)), target)
    return target


def _chunks_of(
    stream: SupportsRead[str] | SupportsRead[bytes], size: int = 1 << 20
) -> Iterable[bytes]:
    while block := stream.read(size):
        yield block.encode("utf-8") if isinstance(block, str) else block


def source_state(list_digest: str, root: StrPath, options: ManifestOptions) -> dict[str, Any]:
    """Return what a pack is made from, compared on --resume: list, ROOT and byte options."""
    return {
        "list_sha256": list_digest,
        "root": os.path.abspath(root),
        "options": options.byte_options(),
    }


def manifest_source(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Return the `source_state` a complete pack was made from, as its manifest records it
    (options without the ones that do not change the bytes)."""
    source = dict(manifest.get("source") or {})
    options = dict(manifest.get("options") or {})
    for name in ("workers", "max_failures", "sha256"):
        options.pop(name, None)
    options.setdefault("allow_outside_root", False)  # packs made before the option
    source["options"] = options
    return source


def check_resume_state(state_path: str, state: Mapping[str, Any]) -> None:
    """Raise naming what differs when the interrupted pack's state file is not `state`."""
    saved = read_state(state_path, "pack state file")
    for field, kind in (("list_sha256", str), ("root", str), ("options", dict)):
        if not isinstance(saved.get(field), (kind, type(None))):
            raise InputError(
                f"{state_path}: not a pack state file: {field} is not a {kind.__name__}"
            )
    check_same_source(state_path, saved, state, "interrupted pack")


# How each byte option is given at the command line, for messages.
_OPTION_NAMES = {
    "check": "--check",
    "pack_label": "--pack-label",
    "shard_bytes": "--shard-size",
    "shard_records": "--shard-records",
    "layout": "--layout",
    "allow_outside_root": "--allow-outside-root",
    "resize": "--resize",
    "center_crop": "--center-crop",
    "quality": "--quality",
    "encoding": "--encoding",
    "color": "--color",
}


def check_same_source(
    path: str, saved: Mapping[str, Any], state: Mapping[str, Any], what: str
) -> None:
    """Raise naming each way `state` differs from the `saved` one of the pack at `path`."""
    differences = []
    if saved.get("list_sha256") != state["list_sha256"]:
        was = saved.get("list_sha256") or "not recorded"
        differences.append(
            f"the list differs (sha256 {state['list_sha256'][:16]}... now, "
            f"{was[:16]}{'...' if saved.get('list_sha256') else ''} in the {what})"
        )
    if saved.get("root") != state["root"]:
        differences.append(
            f"ROOT differs ({state['root']} now, {saved.get('root') or 'not recorded'} "
            f"in the {what})"
        )
    differences += option_differences(state["options"], saved.get("options") or {}, what)
    if differences:
        raise RectoolError(
            f"{path}: cannot resume: {'; '.join(differences)}. "
            "Resume with the same list, ROOT and options, or start again with --overwrite"
        )


def option_differences(
    now_options: Mapping[str, Any], was_options: Mapping[str, Any], what: str
) -> list[str]:
    """Return how byte options `now_options` differ from those `what` was made with, each
    named as the command line gives it ("--resize differs (16 now, not given in the ...)")."""
    differences = []
    now, was = _flat_options(now_options), _flat_options(was_options)
    if (now_options.get("transform") is None) != (was_options.get("transform") is None):
        differences.append(
            f"re-encoding differs ({_show_transform(now_options)} now, "
            f"{_show_transform(was_options)} in the {what})"
        )
        now, was = (
            _flat_options({**now_options, "transform": None}),
            _flat_options({**was_options, "transform": None}),
        )
    for name in sorted(set(now) | set(was), key=list(_OPTION_NAMES).index):
        if now.get(name) != was.get(name):
            differences.append(
                f"{_OPTION_NAMES[name]} differs ({_show(now.get(name))} now, "
                f"{_show(was.get(name))} in the {what})"
            )
    return differences


def _flat_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return byte options as {name: value}, a re-encoding's fields among them (pass-through:
    none of them)."""
    flat = {k: v for k, v in options.items() if k != "transform" and k in _OPTION_NAMES}
    flat.update(options.get("transform") or {})
    return flat


def _show_transform(options: Mapping[str, Any]) -> str:
    transform = options.get("transform")
    if transform is None:
        return "pass-through"
    return " ".join(f"{_OPTION_NAMES[k]} {_show(v)}" for k, v in transform.items())


def _show(value: object) -> str:
    if value is None:
        return "not given"
    return json.dumps(value)


def created_time(environ: Mapping[str, str] = os.environ) -> str:
    """Return when a pack is made, UTC in ISO 8601 to the second: now, or `SOURCE_DATE_EPOCH`
    when set (reproducible builds' convention: the same inputs then give the same manifest)."""
    epoch = environ.get("SOURCE_DATE_EPOCH")
    try:
        when = float(epoch) if epoch else time.time()
    except ValueError:
        raise UsageError(f"SOURCE_DATE_EPOCH={epoch!r} is not a number of seconds") from None
    return datetime.datetime.fromtimestamp(int(when), datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def build_manifest(
    options: ManifestOptions,
    list_path: str | None,
    paths: PackPaths,
    shards: Iterable[ShardInfo],
    images: int,
    failures: int,
    classes: int | None,
    identities: Mapping[int, str] | None,
    source: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Return the manifest of a pack (`shards`: their `ShardInfo`s); `list_path` "-" is stdin.

    A repack has no list and no ROOT: `list_path` and `source` None (it adds its `sources`).
    """
    entries = [s.to_json() for s in shards]
    if classes is None and identities is not None:
        classes = len(identities)
    document = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_VERSION,
        "rectool_version": __version__,
        "created": created_time(),
        "layout": options.layout,
        "options": {
            **options.byte_options(),
            "transform": asdict(options.transform) if options.transform else None,
            "workers": options.workers,
            "max_failures": options.max_failures,
            "sha256": options.sha256,  # each file's SHA-256 too (the manifest's shards give it)
        },
        "list": None if list_path is None else os.path.basename(list_path),  # "-": stdin
        # What --resume compares (the options are above).
        "source": None if source is None else {k: source[k] for k in ("list_sha256", "root")},
        "shards": entries,
        "totals": {
            "shards": len(entries),
            "records": sum(s["records"] for s in entries),
            "images": images,
            "rec_bytes": sum(s["rec_bytes"] for s in entries),
            "failures": failures,
        },
        "failures_file": os.path.basename(paths.failures),
        # False: more images were refused than --max-failures allows (the run exited 3).
        "accepted": failures <= options.max_failures,
        "classes": classes,
        "identities": {str(k): v for k, v in sorted(identities.items())} if identities else None,
    }
    if source is None:
        del document["source"]
    return document
