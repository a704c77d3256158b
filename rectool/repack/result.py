"""What a repack did: `RepackResult`, and what `rectool repack --json` prints."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class RepackResult:
    """What `repack` did."""

    manifest_path: str
    manifest: dict[str, Any]
    images: int
    classes: int
    failures: int  # images not written: removed duplicates/overlap, refused re-encodes
    failures_path: str
    report_path: str
    report: dict[str, Any]
    resumed_from: int = 0

    @property
    def accepted(self) -> bool:
        """Return True when no more images were refused than `max_failures` allows.

        Only re-encoding refuses images; removals asked for (--dedupe, --drop-overlap) are
        not refusals.
        """
        return self.report["refused"] <= self.manifest["options"]["max_failures"]

    def to_json(self) -> dict[str, Any]:
        """Return what `rectool repack --json` prints."""
        totals = self.manifest["totals"]
        return {
            "manifest": self.manifest_path,
            "shards": [
                os.path.join(os.path.dirname(self.manifest_path), s["rec"])
                for s in self.manifest["shards"]
            ],
            "images": self.images,
            "classes": self.classes,
            "records": totals["records"],
            "rec_bytes": totals["rec_bytes"],
            "steps": self.report["steps"],
            "removed": self.report["removed"],
            "refused": self.report["refused"],
            "shared_across_identities": self.report["shared_across_identities"]["groups"],
            "failures_file": self.failures_path,
            "report": self.report_path,
            "accepted": self.accepted,
            "resumed_from": self.resumed_from,
        }
