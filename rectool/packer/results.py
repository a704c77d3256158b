"""What a pack reports: `PackResult` (a whole pack), `ShardResult` (one shard of a plan), and the
`Refusal`s of the images that were not packed, as the failures file holds them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..doors.failures import open_failures
from .shardfile import ShardInfo


@dataclass(frozen=True)
class Refusal:
    """An image that was not packed: its list line, index, path and why."""

    line: int
    index: int
    path: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "index": self.index, "path": self.path, "reason": self.reason}


# What a run did to a pack: `PackResult.outcome`.
PACKED = "packed"  # packed from the first list item
RESUMED = "resumed"  # continued an interrupted pack after `resumed_from` list items
COMPLETE = "complete"  # nothing to do: the pack was already complete, made the same way
FINALIZED = "finalized"  # shards packed one by one were checked and given a manifest


@dataclass
class PackResult:
    """What `pack_images` did; `outcome` is one of PACKED, RESUMED, COMPLETE, FINALIZED."""

    manifest_path: str
    manifest: dict[str, Any]
    images: int
    failures: int
    failures_path: str
    refused: list[Refusal]  # the first refusals
    resumed_from: int = 0
    outcome: str = PACKED

    @property
    def accepted(self) -> bool:
        """Return True when no more images were refused than `max_failures` allows."""
        return self.failures <= self.manifest["options"]["max_failures"]

    @property
    def max_failures(self) -> int:
        return self.manifest["options"]["max_failures"]

    @property
    def shard_paths(self) -> list[str]:
        """Return each shard's .rec, in the manifest's folder as `manifest_path` names it."""
        folder = os.path.dirname(self.manifest_path)
        return [os.path.join(folder, s["rec"]) for s in self.manifest["shards"]]

    def to_json(self) -> dict[str, Any]:
        """Return the result as plain data (what `rectool pack --json` prints)."""
        totals = self.manifest["totals"]
        return {
            "outcome": self.outcome,
            "manifest": self.manifest_path,
            "shards": self.shard_paths,
            "images": self.images,
            "records": totals["records"],
            "rec_bytes": totals["rec_bytes"],
            "failures": self.failures,
            "failures_file": self.failures_path,
            "max_failures": self.max_failures,
            "accepted": self.accepted,
            "resumed_from": self.resumed_from,
            "refused": [r.to_json() for r in self.refused],
        }


@dataclass
class ShardResult:
    """What packing one shard of a plan did (`pack_images(..., only_shard=K)`)."""

    shard: int
    shards: int  # in the plan
    info: ShardInfo
    failures: int
    failures_path: str
    refused: list[Refusal]
    resumed_from: int = 0
    max_failures: int = 0

    @property
    def accepted(self) -> bool:
        """Return True when this shard refused no more images than `max_failures` allows.

        A task is judged by its own shard, so the exit status of a job-array task tells its
        own truth; `finalize_pack` judges the whole pack."""
        return self.failures <= self.max_failures

    @property
    def rec_path(self) -> str:
        """Return the shard's .rec, in the folder `failures_path` names."""
        return os.path.join(os.path.dirname(self.failures_path), self.info.rec)

    def to_json(self) -> dict[str, Any]:
        """Return the result as plain data (what `rectool pack --only-shard K --json` prints)."""
        return {
            "shard": self.shard,
            "shards": self.shards,
            "rec": self.rec_path,
            "records": self.info.records,
            "failures": self.failures,
            "failures_file": self.failures_path,
            "max_failures": self.max_failures,
            "accepted": self.accepted,
            "resumed_from": self.resumed_from,
            "refused": [r.to_json() for r in self.refused],
        }


def read_failures_file(path: str) -> list[Refusal]:
    with open_failures(path, follow=False) as failures:
        # Without `bad_lines` every entry is set, and a pack's failures file holds pack lines.
        return [Refusal(**failure.entry) for failure in failures]  # type: ignore[arg-type]
