"""What `rectool pack` says: its summaries, the shard plan, and what an interrupted run kept."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypedDict

from ..text import counted, plural

if TYPE_CHECKING:
    from _typeshed import StrPath

    from ..packer.options import PackOptions
    from ..packer.results import PackResult, ShardResult
    from .progress import Seen


def has_output(prefix: str) -> bool:
    from ..packer.manifest import output_files

    return bool(output_files(prefix))


def interrupted_message(
    prefix: str,
    seen: Seen,
    overwrite: bool,
    finalize: bool,
    only_shard: int | None,
    status: int = 130,
    unit: str = "list item",
) -> str:
    """Say what an interrupted pack (or repack) kept and how to continue it; `status` 143 says
    it was terminated (SIGTERM), 130 interrupted (Ctrl-C)."""
    from ..format.paths import PackPaths
    from ..remote.store import is_url

    word = "Terminated (SIGTERM)" if status == 143 else "Interrupted"
    if is_url(prefix):  # packed in a staging folder, removed; the manifest is uploaded last
        return (
            f"{word}: no pack was written to {prefix} (its manifest is uploaded last) and the "
            "staging folder was removed; run the command again to start over."
        )
    if os.path.exists(PackPaths(prefix).journal):
        return (
            f"{word}: the new pack at {prefix} was complete and is being moved into place; "
            "run the command again (or `rectool verify` on it) to finish that."
        )
    if overwrite:  # the run packed beside the old files (see `replace_beside`)
        return (
            f"{word}: the pack at {prefix} is unchanged; the new one was not finished and its "
            f"staging folder was removed (run the command again to start it over)."
        )
    if finalize:
        return f"{word}: no manifest was written for {prefix}; run --finalize again."
    where = prefix if only_shard is None else f"shard {only_shard} of {prefix}"
    total = f" of {seen['total']:,}" if seen["total"] is not None else ""
    return (
        f"{word} after {seen['done']:,}{total} {plural(unit)}: what was packed is kept "
        f"({where}: finished shards and .partial files).\n"
        "Run the same command with --resume to continue it."
    )


class ShardPlan(TypedDict):
    """A list's shard plan as `pack --plan --json` prints it."""

    items: int
    shard_records: int | None
    shards: list[list[int]]


def shard_plan(list_file: StrPath, options: PackOptions) -> ShardPlan:
    """Return the shard plan of a list as JSON-ready data (list lines are 1-based)."""
    from ..packer.packing import plan_list

    plan = plan_list(list_file, options)
    return {
        "items": sum(len(r) for r in plan),
        "shard_records": options.shard_records,
        "shards": [[r.start, r.stop] for r in plan],
    }


def render_plan(plan: ShardPlan) -> str:
    """Return the human form of a `shard_plan`: the list lines of each shard."""
    shards, lines = counted(len(plan["shards"]), "shard"), counted(plan["items"], "list line")
    rows = [
        f"  shard {number}: lines {first + 1}-{last}"
        for number, (first, last) in enumerate(plan["shards"])
    ]
    return "\n".join([f"{shards} of {lines}:", *rows])


def render_shard_result(shard: ShardResult) -> str:
    """Return the human summary of packing one shard."""
    info = shard.info
    lines = [
        f"Packed shard {shard.shard} of {shard.shards}: {counted(info.records, 'image')} in "
        f"{shard.rec_path}, {shard.failures:,} refused ({shard.failures_path}). "
        "Run --finalize once every shard is packed."
    ]
    if not shard.accepted:
        lines.append(
            f"More than --max-failures {shard.max_failures} refused in this shard: exit status 3."
        )
    return "\n".join(lines)


def render_pack_summary(result: PackResult, shown: int = 10) -> str:
    """Return the human summary of a pack."""
    from ..packer.results import COMPLETE, FINALIZED, RESUMED

    shards = result.manifest["shards"]
    totals = result.manifest["totals"]
    verb = {COMPLETE: "Already packed", FINALIZED: "Finalized"}.get(result.outcome, "Packed")
    lines = [
        f"{verb} {counted(result.images, 'image')} into {counted(len(shards), 'shard')} "
        f"({totals['rec_bytes'] / 1e6:,.1f} MB); "
        f"manifest {result.manifest_path}"
    ]
    unnamed = result.manifest.get("identities") is None and result.outcome != COMPLETE
    if unnamed and result.manifest.get("list") == "-":  # a list file's map is found beside it
        lines.append(
            "No label map: the manifest names no identities (for a list on stdin, give "
            "--labels FILE to both: `rectool list DIR - --labels FILE` writes it)."
        )
    if result.outcome == RESUMED:
        lines.append(f"Resumed after {counted(result.resumed_from, 'list item')} done earlier.")
    elif result.outcome == COMPLETE:
        lines.append("Nothing to do: the pack was already complete, made the same way.")
    elif result.outcome == FINALIZED:
        lines.append(
            f"Checked {counted(len(shards), 'shard')} packed one by one and wrote the manifest."
        )
    if result.failures:
        refused = counted(result.failures, "image")
        lines.append(f"Refused {refused} (all listed in {result.failures_path}):")
        lines += [f"  line {r.line}: {r.path}: {r.reason}" for r in result.refused[:shown]]
        if result.failures > shown:
            lines.append(f"  ... and {result.failures - shown:,} more")
        if not result.accepted:
            lines.append(f"More than --max-failures {result.max_failures} refused: exit status 3.")
    return "\n".join(lines)


def refused_too_many(result: PackResult | ShardResult) -> str:
    """Return why a pack (or a shard) exits 3."""
    return f"more than --max-failures {result.max_failures} refused ({result.failures:,})"


def render_result(result: PackResult | ShardResult) -> str:
    """Return the human summary of a pack, or of one shard of its plan."""
    from ..packer.results import ShardResult

    if isinstance(result, ShardResult):
        return render_shard_result(result)
    return render_pack_summary(result)
