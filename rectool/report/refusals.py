"""Read the pack's refusals from its failures file, with thumbnails of the refused sources."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

from ..doors.inputs import dataset_path, open_checked, read_regular
from ..errors import RectoolError
from .thumbs import thumbnail

REFUSALS_SHOWN = 50
REASONS_KEPT = 200  # distinct refusal reasons counted one by one; the rest as "other"
SOURCE_LIMIT = 64 << 20  # refused source files larger than this are not read for a thumbnail


@dataclass
class Refusals:
    """What the pack's failures file says, or why it could not be read (`note`)."""

    path: str | None = None
    total: int = 0
    reasons: Counter = field(default_factory=Counter)
    rows: list = field(default_factory=list)  # (line, path, reason, Thumb or None, note)
    bad_lines: list = field(default_factory=list)  # line numbers that are not JSON objects
    note: str | None = None


def read_refusals(manifest, manifest_path, options, budget, reduce):
    """Read the pack's failures file (one JSON object a line); say so when it cannot be."""
    out = Refusals()
    if manifest is None:
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
        fd, _ = open_checked(out.path, "failures file", within=folder)
    except RectoolError as exc:
        out.note = f"The failures file cannot be read: {exc}."
        return out
    with os.fdopen(fd, "rb") as f:
        for number, line in enumerate(_bounded_lines(f), 1):
            if line is None or not line.strip():
                if line is None and len(out.bad_lines) < REFUSALS_SHOWN:
                    out.bad_lines.append(number)
                continue
            try:
                entry = json.loads(line.decode("utf-8", "replace"))
                if not isinstance(entry, dict):
                    raise ValueError
            except ValueError:
                if len(out.bad_lines) < REFUSALS_SHOWN:
                    out.bad_lines.append(number)
                continue
            out.total += 1
            reason = str(entry.get("reason", "no reason given"))
            if reason in out.reasons or len(out.reasons) < REASONS_KEPT:
                out.reasons[reason] += 1
            else:
                out.reasons["(other reasons)"] += 1
            if len(out.rows) < REFUSALS_SHOWN:
                path = str(entry.get("path", ""))
                thumb, note = _source_thumb(path, entry.get("line"), options, reduce)
                out.rows.append(
                    (entry.get("line"), path, reason, thumb and budget.admit(thumb), note)
                )
    return out


# A failures line longer than this is a bad line (a refusal's line is a few hundred bytes).
MAX_FAILURES_LINE = 1 << 20


def _bounded_lines(f):
    """Yield the lines of a binary file, None for one over `MAX_FAILURES_LINE` bytes (read
    past, never held whole)."""
    while line := f.readline(MAX_FAILURES_LINE + 1):
        if len(line) > MAX_FAILURES_LINE and not line.endswith(b"\n"):
            while (rest := f.readline(MAX_FAILURES_LINE)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


def _source_thumb(path, line, options, reduce):
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
