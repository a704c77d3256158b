"""What `rectool pack` says: its summaries, the shard plan, and what an interrupted run kept."""

from __future__ import annotations

import os


def has_output(prefix):
    from ..build.manifest import output_files

    return bool(output_files(prefix))


def interrupted_message(prefix, seen, overwrite, finalize, only_shard):
    """Say what an interrupted pack kept and how to continue it."""
    from ..build.manifest import journal_path

    if os.path.exists(journal_path(prefix)):
        return (
            f"Interrupted: the new pack at {prefix} was complete and is being moved into place; "
            "run the command again (or `rectool verify` on it) to finish that."
        )
    if overwrite:  # the run packed beside the old files (see `_replaces`)
        return (
            f"Interrupted: the pack at {prefix} is unchanged; the new one was not finished "
            "(run the command again to start it over)."
        )
    if finalize:
        return f"Interrupted: no manifest was written for {prefix}; run --finalize again."
    where = prefix if only_shard is None else f"shard {only_shard} of {prefix}"
    total = f" of {seen['total']:,}" if seen["total"] is not None else ""
    return (
        f"Interrupted after {seen['done']:,}{total} list items: what was packed is kept "
        f"({where}: finished shards and .partial files).\n"
        "Run the same command with --resume to continue it."
    )


def shard_plan(list_file, options):
    """Return the shard plan of a list as JSON-ready data (list lines are 1-based)."""
    from ..build.packing import plan_list

    plan = plan_list(list_file, options)
    return {
        "items": sum(len(r) for r in plan),
        "shard_records": options.shard_records,
        "shards": [[r.start, r.stop] for r in plan],
    }


def render_shard_result(shard):
    """Return the human summary of packing one shard."""
    lines = [
        f"Packed shard {shard.shard} of {shard.shards}: {shard.info.records:,} images in "
        f"{shard.rec_path}, {shard.failures:,} refused ({shard.failures_path}). "
        "Run --finalize once every shard is packed."
    ]
    if not shard.accepted:
        lines.append(
            f"More than --max-failures {shard.max_failures} refused in this shard: exit status 3."
        )
    return "\n".join(lines)


def render_pack_summary(result, shown=10):
    """Return the human summary of a pack."""
    from ..build.packing import COMPLETE, FINALIZED, RESUMED

    shards = result.manifest["shards"]
    totals = result.manifest["totals"]
    verb = {COMPLETE: "Already packed", FINALIZED: "Finalized"}.get(result.outcome, "Packed")
    lines = [
        f"{verb} {result.images:,} images into {len(shards)} shard"
        f"{'s' if len(shards) != 1 else ''} ({totals['rec_bytes'] / 1e6:,.1f} MB); "
        f"manifest {result.manifest_path}"
    ]
    if result.outcome == RESUMED:
        lines.append(f"Resumed after {result.resumed_from:,} list items done earlier.")
    elif result.outcome == COMPLETE:
        lines.append("Nothing to do: the pack was already complete, made the same way.")
    elif result.outcome == FINALIZED:
        noun = "shard" if len(shards) == 1 else "shards"
        lines.append(f"Checked {len(shards)} {noun} packed one by one and wrote the manifest.")
    if result.failures:
        noun = "image" if result.failures == 1 else "images"
        lines.append(f"Refused {result.failures:,} {noun} (all listed in {result.failures_path}):")
        lines += [f"  line {r.line}: {r.path}: {r.reason}" for r in result.refused[:shown]]
        if result.failures > shown:
            lines.append(f"  ... and {result.failures - shown:,} more")
        if not result.accepted:
            lines.append(f"More than --max-failures {result.max_failures} refused: exit status 3.")
    return "\n".join(lines)
