"""How to pack: `PackOptions`, and the checks of the options and of OUT_PREFIX before a run.

`allowed_failures` turns `--max-failures` (a count or a share) into the count a run allows.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import UsageError
from .images import CHECK_MODES, DEFAULT_MAX_PIXELS, Transform
from .layout import layout_named


@dataclass(frozen=True)
class PackOptions:
    """How to pack; every field but `workers` can change the bytes written."""

    transform: Transform | None = None  # None: pass the original bytes through
    check: str = "structure"  # pass-through check: one of images.CHECK_MODES
    pack_label: bool = False
    shard_bytes: int | None = None
    shard_records: int | None = None
    layout: str = "images"
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_failures: int | float = 0  # a count, or a share from 0 to 1 (`allowed_failures`)
    allow_outside_root: bool = False  # pack list paths that leave ROOT (absolute, `..`)
    # Images whose header declares more pixels are refused before decoding (--check none: kept).
    max_pixels: int = DEFAULT_MAX_PIXELS
    # The manifest gives each file's SHA-256 beside its xxh3-128 (.rec/.idx bytes unchanged).
    sha256: bool = False

    def byte_options(self) -> dict[str, Any]:
        """Return the options that determine the output bytes (compared on --resume).

        Not `max_pixels`: a safety limit like `max_failures`; what it refuses is listed in the
        failures file.
        """
        doc = asdict(self)
        for name in ("workers", "max_failures", "max_pixels", "sha256"):
            doc.pop(name)
        return doc


def check_prefix(prefix: str | os.PathLike[str]) -> str:
    """Return `prefix` as a string; raise `UsageError` when it names a folder (`""`, `.`,
    `..`, `out/`), which would give hidden files such as `out/.rec`."""
    prefix = os.fspath(prefix)
    if os.path.basename(prefix) in ("", ".", ".."):
        raise UsageError(
            f"OUT_PREFIX {prefix!r} names a folder, not the start of file names; "
            "give one such as out/faces (for out/faces.rec, out/faces.idx)"
        )
    return prefix


def allowed_failures(max_failures: int | float, total: int) -> int:
    """Return the refusals allowed among `total` images: `max_failures` itself (a count), or
    that share of them rounded down (a float from 0 to 1, `--max-failures 0.1%`)."""
    if isinstance(max_failures, float):
        return int(max_failures * total)
    return max_failures


def check_pack_options(options: PackOptions) -> None:
    limit = options.max_failures
    if (
        isinstance(limit, bool)
        or not isinstance(limit, (int, float))
        or not (0 <= limit and (isinstance(limit, int) or limit <= 1))
    ):
        raise UsageError(f"max_failures must be a count or a share from 0 to 1, not {limit!r}")
    layout_named(options.layout).check_options(options)
    if options.check not in CHECK_MODES:
        raise UsageError(f"unknown check {options.check!r}; choose from {', '.join(CHECK_MODES)}")
    if options.workers < 1:
        raise UsageError("--workers must be at least 1")
