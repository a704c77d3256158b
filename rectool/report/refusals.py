"""Read the pack's refusals from its failures file, with thumbnails of the refused sources."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..doors.failures import KINDS, open_failures
from ..doors.inputs import dataset_path, read_regular
from ..errors import RectoolError
from .thumbs import Thumb, ThumbBudget, thumbnail

if TYPE_CHECKING:
    from .data import ReportOptions

REFUSALS_SHOWN = 50
REASONS_KEPT = 200  # distinct refusal reasons counted one by one; the rest as "other"
SOURCE_LIMIT = 64 << 20  # refused source files larger than this are not read for a thumbnail


@dataclass
class Refusals:
    """What the pack's failures file says, or why it could not be read (`note`)."""

    path: str | None = None
    total: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    # (list line, path, reason, thumbnail, why there is none)
    rows: list[tuple[int | None, str, str, Thumb | None, str | None]] = field(default_factory=list)
    bad_lines: list[int] = field(default_factory=list)  # numbers of the lines that are not refusals
    note: str | None = None


def read_refusals(
    manifest: Mapping[str, Any] | None,
    manifest_path: str | None,
    options: ReportOptions,
    budget: ThumbBudget,
    reduce: int,
) -> Refusals:
    """Read the pack's failures file (one JSON object a line); say so when it cannot be."""
    out = Refusals()
    if manifest is None or manifest_path is None:  # (None together: no manifest)
        out.note = "No manifest: the refusals of the pack that wrote this data are not known."
        return out
    name = manifest.get("failures_file")
    if not name:
        out.note = "The manifest names no failures file."
        return out
    folder = os.path.dirname(manifest_path) or "."
    try:
        # Named inside the dataset: it must be a file in the dataset's folder, nowhere else.
        out.path = dataset_path(folder, str(name), "failures file")
    except RectoolError as exc:
        out.note = f"The failures file is not read: {exc}."
        return out
    if not os.path.lexists(out.path):
        expected = (manifest.get("totals") or {}).get("failures")
        said = f" (the manifest counts {expected:,} refusals)" if expected else ""
        out.note = f"The failures file {out.path} is missing{said}."
        return out
    try:
        failures = open_failures(out.path, KINDS, bad_lines=True, within=folder)
    except RectoolError as exc:
        out.note = f"The failures file cannot be read: {exc}."
        return out
    with failures:
        for failure in failures:
            entry = failure.entry
            if entry is None:  # a blank line is no line; any other is listed
                if not failure.text.isspace() and len(out.bad_lines) < REFUSALS_SHOWN:
                    out.bad_lines.append(failure.number)
                continue
            out.total += 1
            reason = entry["reason"]
            if reason in out.reasons or len(out.reasons) < REASONS_KEPT:
                out.reasons[reason] += 1
            else:
                out.reasons["(other reasons)"] += 1
            if len(out.rows) < REFUSALS_SHOWN:
                # A pack's refusal names its list line and path; a repack's, neither.
                line, path = (entry["line"], entry["path"]) if "line" in entry else (None, "")
                thumb, note = _source_thumb(path, line, options, reduce)
                out.rows.append((line, path, reason, thumb and budget.admit(thumb), note))
    return out


def _source_thumb(
    path: str, line: int | None, options: ReportOptions, reduce: int
) -> tuple[Thumb | None, str | None]:
    """Return (Thumb or None, note) for a refused image, if its source file is still there.

    The path comes from the failures file: only a path inside --images-root is read."""
    if options.images_root is None:
        return None, "source folder not given (--images-root)"
    try:
        source = dataset_path(options.images_root, path, "refused image path")
        data, _ = read_regular(
            source, "refused image", max_bytes=SOURCE_LIMIT, within=options.images_root
        )
    except RectoolError as exc:
        if not os.path.lexists(os.path.join(options.images_root, path)):
            return None, "source not found"
        if "bytes, over" in str(exc):
            return None, "source too large to show"
        return None, "source outside --images-root or not a regular file"
    thumb = thumbnail(data, options, reduce, f"refused image {path} (list line {line})", "")
    if thumb.jpeg is None:
        return None, "source does not decode"
    return thumb, None
