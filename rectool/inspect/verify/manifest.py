"""The checks of a dataset against its manifest: each shard listed once, the totals, and each
shard as its entry says (sizes, counts, first and last keys, header ids)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import RectoolError
from ...format.binindex import read_identities
from ...format.manifest import identity_name_problems
from .facts import DatasetFacts, ShardFacts
from .report import Found, ProblemAt, one_problem


def repeated_shards(shards: Sequence[tuple[str, str]]) -> dict[int, int]:
    """Return {shard number: number of the shard listed first} for each .rec listed again."""
    first: dict[str, int] = {}
    repeats: dict[int, int] = {}
    for number, (rec, _) in enumerate(shards):
        seen = first.setdefault(os.path.realpath(rec), number)
        if seen != number:
            repeats[number] = seen
    return repeats


def check_listed_once(dataset: DatasetFacts, number: int, first: int) -> Iterator[Found]:
    """Shard `number`'s .rec is the one shard `first` already lists."""
    rec = dataset.shards[number][0]
    yield one_problem(
        "manifest",
        dataset.manifest_path or rec,
        None,
        None,
        f"lists {rec} twice (shards {first} and {number}); readers would serve each of "
        "its records twice",
    )


def check_totals(dataset: DatasetFacts) -> Iterator[Found]:
    """The manifest's totals are the sums of its shards' entries."""
    manifest, path = dataset.manifest, dataset.manifest_path
    if manifest is None or path is None:  # one is None when the other is
        return
    shards = manifest["shards"]  # read_manifest checked every field used here
    totals = manifest.get("totals") or {}
    checks = [("shards", len(shards))]
    for name in ("records", "rec_bytes"):  # null: not recorded, as a missing field
        if all(s.get(name) is not None for s in shards):
            checks.append((name, sum(s[name] for s in shards)))
    for name, actual in checks:
        if totals.get(name) is not None and totals[name] != actual:
            yield one_problem(
                "manifest",
                path,
                None,
                None,
                f"totals.{name} is {totals[name]} but its shards add up to {actual}",
            )


def check_manifest_entry(facts: ShardFacts) -> Iterator[Found]:
    """The shard is as its manifest entry says: sizes, counts, first and last keys, ids.

    (Whether it has the layout the manifest names is `check_layout`'s question.)
    """
    entry, rec, idx = facts.entry, facts.rec, facts.idx
    if entry is None:
        return
    for path, size_name in ((rec, "rec_bytes"), (idx, "idx_bytes")):
        if entry.get(size_name) is not None and os.path.exists(path):
            actual = os.path.getsize(path)
            if actual != entry[size_name]:
                yield one_problem(
                    "size-mismatch",
                    path,
                    None,
                    None,
                    f"{actual} bytes; the manifest says {entry[size_name]}",
                )
    index = facts.index
    expected = entry.get("records")
    if expected is not None:
        found = len(facts.framing.starts)
        if found != expected:
            yield one_problem(
                "count-mismatch", rec, None, None, f"{found} records; the manifest says {expected}"
            )
        if index is not None and len(index.keys) != expected:
            yield one_problem(
                "count-mismatch",
                idx,
                None,
                None,
                f"{len(index.keys)} entries; the manifest says {expected}",
            )
    if index is not None and len(index.keys):
        for name, actual in (("first_key", index.keys[0]), ("last_key", index.keys[-1])):
            if entry.get(name) is not None and entry[name] != int(actual):
                yield one_problem(
                    "key-mismatch",
                    idx,
                    int(actual),
                    None,
                    f"the {name.replace('_', ' ')} is {int(actual)}; "
                    f"the manifest says {entry[name]}",
                )
        yield _check_ids(facts)


def _check_ids(facts: ShardFacts) -> Found:
    """rectool writes each record's key as its header id; they must agree."""
    keys, starts, differ = facts.keys, facts.framing.starts, facts.id_mismatch

    def problems() -> Iterator[ProblemAt]:
        for j in differ.tolist():
            header = facts.header(j)
            assert header is not None  # a complete header
            yield (
                facts.idx,
                keys[j],
                starts[j],
                f"the .idx gives key {keys[j]} to the record at byte "
                f"{starts[j]}, whose header id is {header.id}",
            )

    return Found("id-mismatch", len(differ), problems())


def pack_refusals(dataset: DatasetFacts, target: str) -> dict[str, Any] | None:
    """Return what the manifest records of images refused when packing `target` (refused,
    images, max_failures, accepted: not more than allowed, failures_file), or None when it
    records none. Refusals are no problem of the bytes: the report says them beside its
    verdict (a pack against the wrong ROOT is sound bytes of almost nothing)."""
    manifest, path = dataset.manifest, dataset.manifest_path
    if manifest is None or path is None:
        return None
    totals = manifest.get("totals") or {}
    refused = totals.get("failures")
    if not refused:
        return None
    allowed = (manifest.get("options") or {}).get("max_failures")
    accepted = manifest.get("accepted")
    if accepted is None:  # packs made before the field: as the run judged it
        accepted = allowed is None or refused <= allowed
    name = manifest.get("failures_file")
    return {
        "target": target,
        "made_by": "repack" if manifest.get("sources") is not None else "pack",
        "refused": refused,
        "images": totals.get("images"),
        "max_failures": allowed,
        "accepted": accepted,
        "failures_file": os.path.join(os.path.dirname(path), name) if name else None,
    }


def check_identity_names(dataset: DatasetFacts) -> Iterator[Found]:
    """Each label's identity name is a folder name, and no two labels share one: `unpack`
    writes a folder per name, `repack --labels-by name` merges by name."""
    manifest, path = dataset.manifest, dataset.manifest_path
    if manifest is None or path is None:
        return
    try:
        names = read_identities(path, manifest) or {}
    except RectoolError:  # an unreadable identities file: `check_index_files` names it
        return
    where = path
    named = manifest.get("identities")
    if isinstance(named, dict) and isinstance(named.get("file"), str):
        where = os.path.join(os.path.dirname(path), named["file"])
    found = [
        (where, None, None, f"{message} (unpack writes a folder per name)")
        for _, message in identity_name_problems(names)
    ]
    yield Found("identity-name", len(found), iter(found))
