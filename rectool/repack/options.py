"""How to repack: `RepackOptions`, and the check that refuses options that cannot work together."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import RectoolError, UsageError
from ..format.digest import sha256_file
from ..packer.images import DEFAULT_MAX_PIXELS, Transform
from ..packer.layout import layout_named
from ..redaction import safe_url
from ..remote.store import is_url
from . import selection

LABELS_BY = ("offset", "name")


@dataclass(frozen=True)
class RepackOptions:
    """How to repack; every field but `workers` and `max_failures` can change the bytes."""

    labels_by: str = "offset"  # offset: source after source; name: unified by identity name
    keep_ids: str | None = None  # a file of names or labels, one a line
    drop_ids: str | None = None
    min_per_id: int | None = None
    max_per_id: int | None = None
    pick: str = "first"  # which images --max-per-id keeps: first | random
    sample: float | None = None  # fraction kept, of identities or images
    sample_by: str = "identities"
    seed: int = 0
    keep_labels: bool = False
    order: str = "identity"
    layout: str = "images"
    # --layout insightface: each image's label a float32 vector, identity first (Glint360K,
    # WebFace42M), else one scalar, the identity (faces_emore); the images layout keeps each
    # record's labels as its source holds them.
    pack_label: bool = False
    shard_bytes: int | None = None
    shard_records: int | None = None
    dedupe: bool = False
    # Datasets or verification sets (.bin) whose images are removed.
    drop_overlap: tuple[str, ...] = ()
    transform: Transform | None = None
    # What is refused when copying: "structure" (as pack: empty, truncated, not an image) or
    # "none" (every record carried as it is).
    check: str = "structure"
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_failures: int | float = 0  # a count, or a share from 0 to 1 (`allowed_failures`)
    max_pixels: int = DEFAULT_MAX_PIXELS  # re-encoding: larger images refused before decoding
    # The manifest gives each file's SHA-256 beside its xxh3-128 (.rec/.idx bytes unchanged).
    sha256: bool = False

    def byte_options(self) -> dict[str, Any]:
        """Return the options that determine the output bytes (compared on --resume)."""
        doc = asdict(self)
        for name in ("workers", "max_failures", "max_pixels", "sha256"):  # safety, not bytes
            doc.pop(name)
        # A URL as written in the manifest: without its credentials or signature (`safe_url`).
        doc["drop_overlap"] = [
            safe_url(p) if is_url(p) else os.path.abspath(p) for p in self.drop_overlap
        ]
        for name in ("keep_ids", "drop_ids"):
            if doc[name]:
                doc[name] = _file_digest(doc[name])
        return doc


def check_repack_options(options: RepackOptions) -> None:
    """Refuse options that cannot work together."""
    if options.check not in ("structure", "none"):
        raise UsageError(f"unknown --check {options.check!r}: repack checks structure or none")
    layout = layout_named(options.layout)
    if options.labels_by not in LABELS_BY:
        raise UsageError(f"unknown --labels-by {options.labels_by!r}")
    if options.order not in selection.ORDERS:
        raise UsageError(f"unknown order {options.order!r}")
    if layout.numbered and options.order != "identity":
        raise UsageError(
            "--layout insightface stores each identity's images as one key range: "
            "it needs --order identity"
        )
    layout.check_options(options)
    if options.pack_label and not layout.numbered:
        raise UsageError(
            "--pack-label chooses the label shape of --layout insightface; the images layout "
            "keeps each record's labels as its source holds them"
        )
    if options.sample is not None and not 0 < options.sample <= 1:
        raise UsageError("--keep-fraction must be a fraction in (0, 1]")
    if options.sample_by not in selection.SAMPLE_UNITS:
        raise UsageError(f"unknown --fraction-of {options.sample_by!r}")
    if options.pick not in selection.PICKS:
        raise UsageError(f"unknown --pick {options.pick!r}")
    if options.keep_ids and options.drop_ids:
        raise UsageError("give --keep-ids or --drop-ids, not both")
    if options.workers < 1:
        raise UsageError("--workers must be at least 1")


def _file_digest(path: str) -> str:
    try:
        return sha256_file(path)
    except RectoolError:
        if not os.path.lexists(path):
            raise RectoolError(f"{path}: identity list not found") from None
        raise
