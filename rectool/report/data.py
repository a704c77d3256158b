"""Build a dataset's report: one self-contained HTML page a person can open, read and share.

`build_report` gathers what the page shows: `dataset_info` (the numbers of `rectool info`:
from the binary index of a format-3 pack, else from every record header), a seeded sample of
identities decoded at reduced scale into small JPEG thumbnails, the pack's refusals (its
failures file), exact duplicate images across identities, and optionally a `verify_dataset`
result. `report_page` turns that into the page and the contact-sheet image.

Cost: one pass over each shard in file order through a bounded window (`RecWindow`) for each
image's size, encoding and duplicate fingerprint (`images.scan_images`), and the sampled
images. Memory: with a binary index, the index's mapped arrays and about 12 bytes per image
here (size, fingerprint), 20 more while duplicates are sorted; payloads are hashed one at a
time, only where fingerprints collide.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from ..dataset.packs import PackDataset
from ..doors.output import JOURNAL_SUFFIX, OutputFiles
from ..errors import RectoolError, UsageError
from ..format.binindex import read_identities
from ..format.window import RecWindow
from ..inspect.info import damage_summary, dataset_info, value_summary
from ..reader import DEFAULT_MAX_PIXELS
from .charts import log_bins
from .duplicates import DUPLICATES_SHOWN as DUPLICATES_SHOWN
from .duplicates import MEMBERS_SHOWN as MEMBERS_SHOWN
from .duplicates import Duplicates, find_duplicates
from .images import ImageTable, OpenRec, Payloads, scan_images
from .page import LEFT_OUT, page_thumbs, render_html, render_rows, render_sheet
from .refusals import REASONS_KEPT as REASONS_KEPT
from .refusals import REFUSALS_SHOWN as REFUSALS_SHOWN
from .refusals import SOURCE_LIMIT as SOURCE_LIMIT
from .refusals import Refusals, read_refusals
from .thumbs import EXTREMES as EXTREMES
from .thumbs import TEXT_RESERVE as TEXT_RESERVE
from .thumbs import SheetRow as SheetRow
from .thumbs import Thumb, ThumbBudget, reduction, sheet_rows, thumbnail

if TYPE_CHECKING:
    from _typeshed import StrPath

    from ..inspect.verify import VerifyReport

# progress(phase, done, total): "labels", "sample", "records", "bytes", "duplicates",
# "thumbnails" as they go; shown_as(text): the paths in it renamed.
ReportProgress = Callable[[str, int, int | None], object]
ShownAs = Callable[[str], str]

DEFAULT_IDENTITIES = 12
DEFAULT_PER_IDENTITY = 8
DEFAULT_THUMB = 96
DEFAULT_MAX_BYTES = 5_000_000
DEFAULT_SAMPLE = 200
SHEET_FORMATS = (".jpg", ".jpeg", ".png")


@dataclass(frozen=True)
class ReportOptions:
    """What a report samples and how large it may grow."""

    seed: int = 0
    identities: int = DEFAULT_IDENTITIES
    per_identity: int = DEFAULT_PER_IDENTITY
    thumb: int = DEFAULT_THUMB
    sample: int = DEFAULT_SAMPLE
    max_bytes: int = DEFAULT_MAX_BYTES
    images_root: str | None = None
    verify: bool = False
    decode: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS  # larger images get no thumbnail, and are not decoded


@dataclass
class Report:
    """Everything the page shows."""

    target: str
    options: ReportOptions
    info: dict[str, Any]  # `dataset_info`'s (its manifest path renamed by `shown_as`)
    manifest: dict[str, Any] | None
    rows: list[SheetRow]
    refusals: Refusals
    duplicates: Duplicates
    size_histogram: list[tuple[str, int]]  # (label, count)
    identity_histogram: list[tuple[str, int]]  # (images, identities) in log-spaced bins
    verify: VerifyReport | None = None
    problems: list[str] = field(default_factory=list)  # things that went wrong while reporting
    left_out: int = 0  # thumbnails left out of the page to stay within max_bytes
    rows_shown: int | None = None  # sheet rows on the page (None: all); the sheet image has all


@dataclass
class ReportResult:
    """What `write_report` wrote."""

    html: str | None
    html_bytes: int
    sheet: str | None
    report: Report

    def to_json(self) -> dict[str, Any]:
        """Return what `rectool report --json` prints."""
        info = self.report.info
        return {
            "html": None if self.html is None else os.fspath(self.html),
            "html_bytes": self.html_bytes if self.html else None,
            "sheet": None if self.sheet is None else os.fspath(self.sheet),
            "images": info["images"],
            "identities": info.get("identities"),
            "refusals": self.report.refusals.total,
            "images_under_several_identities": self.report.duplicates.across,
            "damage": info.get("damage"),
        }


def write_report(
    target: StrPath,
    html_path: StrPath | None = None,
    sheet_path: StrPath | None = None,
    options: ReportOptions = ReportOptions(),
    overwrite: bool = False,
    progress: ReportProgress | None = None,
    shown_as: ShownAs | None = None,
) -> ReportResult:
    """Build the report of `target`; write the page to `html_path`, the sheet to `sheet_path`.

    Either path may be None, not both. The page is at most `options.max_bytes` bytes: the
    thumbnails that do not fit are left out (counted on the page), then contact-sheet rows.
    `progress(phase, done, total)`, when given, is called as each phase goes on. `shown_as(text)`
    renames the paths the page shows (a local copy's: by its URL; see `build_report`).
    The files are written as one output (both or neither, each whole); an existing file is
    replaced only with `overwrite`, a pack's file never.
    Raises `RectoolError` when the dataset cannot be read or an output may not be written,
    `UsageError` for a sheet format other than .jpg/.png.
    """
    first = html_path if html_path is not None else sheet_path
    if first is None:
        raise UsageError("nothing to write: give an HTML output, a sheet, or both")
    if sheet_path is not None and os.path.splitext(os.fspath(sheet_path))[1].lower() not in (
        SHEET_FORMATS
    ):
        raise UsageError(f"{sheet_path}: the sheet must be a .jpg or .png file")
    output = OutputFiles(_journal_beside(os.fspath(first)), overwrite, "report")
    for path in (html_path, sheet_path):
        if path is not None:
            output.check(path)  # before the work: a refusal costs nothing
    report = build_report(target, options, progress, shown_as)
    size = 0
    with output:
        if html_path is not None:
            page = fit_page(report)
            output.add(html_path, page)
            size = len(page)
        if sheet_path is not None:
            kind = os.path.splitext(os.fspath(sheet_path))[1]
            ok, encoded = cv2.imencode(kind, render_sheet(report))
            if not ok:
                raise RectoolError(f"{sheet_path}: cannot encode the contact sheet")
            output.add(sheet_path, encoded.tobytes())
    return ReportResult(
        None if html_path is None else os.fspath(html_path),
        size,
        None if sheet_path is None else os.fspath(sheet_path),
        report,
    )


def fit_page(report: Report) -> bytes:
    """Render the page as UTF-8 within `report.options.max_bytes`: leave out thumbnails (the
    last ones first) until it fits, then contact-sheet rows; raise `RectoolError` when even
    the page's text is over the limit. Sets `report.left_out` to what the page says."""
    limit = report.options.max_bytes
    page = render_html(report).encode("utf-8")
    while len(page) > limit:
        excess = len(page) - limit
        freed = 0
        for thumb in reversed(list(page_thumbs(report))):  # the last ones first
            if freed >= excess:
                break
            if thumb.jpeg is not None:
                freed += (len(thumb.jpeg) + 2) // 3 * 4 + 200
                thumb.jpeg, thumb.problem = None, LEFT_OUT
        if not freed:
            shown = len(report.rows) if report.rows_shown is None else report.rows_shown
            if not shown:
                raise RectoolError(
                    f"--max-bytes {limit:,} is too small for the page's text alone "
                    f"({len(page):,} bytes with no thumbnail); raise --max-bytes"
                )
            # Each row costs about the same: drop as many as the excess needs (one at least).
            per_row = max(1, len(render_rows(report, shown)) // shown)
            report.rows_shown = max(0, shown - max(1, -(-excess // per_row)))
        page = render_html(report).encode("utf-8")
    report.left_out = count_left_out(report)
    return page


def count_left_out(report: Report) -> int:
    """Count the thumbnails the page leaves out to stay within --max-bytes."""
    return sum(t.problem == LEFT_OUT for t in page_thumbs(report))


def _journal_beside(path: str) -> str:
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}{JOURNAL_SUFFIX}")


def build_report(
    target: StrPath,
    options: ReportOptions = ReportOptions(),
    progress: ReportProgress | None = None,
    shown_as: ShownAs | None = None,
    open_rec: OpenRec = RecWindow,
) -> Report:
    """Gather what the report of `target` shows; raise `RectoolError` when it cannot be read.

    `progress(phase, done, total)`, when given, is called as each phase starts and goes on.
    `shown_as(text)`, when given, renames the target, manifest, failures file and verify's
    paths it names. `open_rec(path)` opens the window each shard is read through.

    A pack with a binary index is described from it (label statistics answer even when its
    .rec cannot be read); its .rec is read once, front to back through the window, for what
    the index cannot say (image sizes, encodings, duplicates), and for the thumbnails."""
    report = progress or _no_progress
    images = ImageTable()
    info: dict[str, Any] = dataset_info(
        target, options.sample, images.add, options.max_pixels, report, open_rec
    )
    indexed = info["index"] == "binary"
    if indexed:
        with PackDataset(info["manifest"]) as ds:
            images = ImageTable.from_index(ds)
            info = _scanned(info, images, open_rec, report)
    else:
        images.finish()
        scan_images(images, open_rec, report)  # (info read every header, and its damage)
    manifest = _manifest_of(info)
    named = None if manifest is None else read_identities(info["manifest"], manifest)
    names = {str(label): name for label, name in (named or {}).items()}
    problems: list[str] = []
    budget = ThumbBudget(options.max_bytes)
    reduce = reduction(info, options.thumb)
    # image number -> (jpeg, pixels, problem): each image is decoded once
    decoded: dict[int, tuple[bytes | None, np.ndarray | None, str | None]] = {}
    with Payloads(images, open_rec) as payloads:

        def thumb_of(i: int, alt: str, caption: str) -> Thumb:
            if i not in decoded:
                try:
                    data = payloads.image(i)
                except RectoolError as exc:
                    problems.append(f"{alt}: {exc}")
                    decoded[i] = (None, None, "unreadable record")
                else:
                    thumb = thumbnail(data, options, reduce, alt, caption)
                    if thumb.problem:
                        problems.append(f"{alt}: {thumb.problem}")
                    decoded[i] = (thumb.jpeg, thumb.pixels, thumb.problem)
            return budget.admit(Thumb(alt, caption, *decoded[i]))

        rows = sheet_rows(images, names, options, thumb_of, lambda d, t: report("thumbnails", d, t))
        report("duplicates", 0, None)

        def hashed(done: int, candidates: int) -> None:
            report("duplicates", done, candidates)

        duplicates = find_duplicates(images, payloads, names, thumb_of, hashed)
        report("duplicates", duplicates.hashed, duplicates.hashed)
    refusals = read_refusals(manifest, info.get("manifest"), options, budget, reduce)
    verify = None
    if options.verify:
        from ..inspect.verify import DecodeOptions, verify_dataset

        decode = DecodeOptions(max_pixels=options.max_pixels) if options.decode else None
        verify = verify_dataset(target, decode=decode)
    if shown_as is not None:  # read from a local copy of a URL: named by the URL
        info = {**info, "manifest": info.get("manifest") and shown_as(info["manifest"])}
        refusals.path = refusals.path and shown_as(refusals.path)
        refusals.note = refusals.note and shown_as(refusals.note)
        verify = None if verify is None else verify.renamed(shown_as)
        target = shown_as(os.fspath(target))
    page = Report(
        target=os.fspath(target),
        options=options,
        info=info,
        manifest=manifest,
        rows=rows,
        refusals=refusals,
        duplicates=duplicates,
        size_histogram=_size_histogram(images.sizes[images.sizes >= 0]),
        identity_histogram=_identity_histogram(images),
        verify=verify,
        problems=problems,
        left_out=budget.left_out,
    )
    page.left_out = count_left_out(page)
    return page


def _no_progress(phase: str, done: int, total: int | None) -> None:
    pass


def _scanned(
    info: dict[str, Any], images: ImageTable, open_rec: OpenRec, progress: ReportProgress
) -> dict[str, Any]:
    """Scan an indexed pack's images (`scan_images`); return its description with the
    figures the scan makes exact (every image's bytes and encoding, every unreadable one)."""
    found = scan_images(images, open_rec, progress)
    sizes = images.sizes[images.sizes >= 0]
    damage = [(rec, key, offset, reason) for rec, key, offset, reason in found.damage]
    summary = damage_summary(info["target"], damage)
    if summary is not None:
        summary["records"] = found.damaged
    return {
        **info,
        "image_bytes": value_summary(sizes),
        "encodings": dict(found.encodings.most_common()),
        "payload_sample": None,
        "damage": summary,
    }


def _manifest_of(info: dict[str, Any]) -> dict[str, Any] | None:
    if not info.get("manifest"):
        return None
    from ..format.manifest import read_manifest

    return read_manifest(info["manifest"])


# --- charts -----------------------------------------------------------------------------------


def _identity_histogram(images: ImageTable) -> list[tuple[str, int]]:
    """Bin the identities by how many images each has: log-spaced (`log_bins`), so a long
    tail shows; none where the labels are not class ids."""
    if not images.integral or not len(images.labels):
        return []
    return log_bins(np.unique(images.labels, return_counts=True)[1])


def _size_histogram(sizes: np.ndarray, bins: int = 12) -> list[tuple[str, int]]:
    """Bin image sizes in bytes: log-spaced edges when they spread over a factor of 20."""
    if not len(sizes):
        return []
    low, high = int(sizes.min()), int(sizes.max())
    if low == high:
        return [(f"{low:,}", len(sizes))]
    if low > 0 and high / low > 20:
        edges = np.geomspace(low, high + 1, bins + 1)
    else:
        edges = np.linspace(low, high + 1, bins + 1)
    edges = np.unique(np.round(edges).astype(np.int64))
    counts, _ = np.histogram(sizes, edges)
    return [
        (f"{_bytes_label(lo, hi - lo)}-{_bytes_label(hi - 1, hi - lo)}", int(c))
        for lo, hi, c in zip(edges[:-1].tolist(), edges[1:].tolist(), counts.tolist())
    ]


def _bytes_label(n: int, width: int) -> str:
    """Write a bin edge as precisely as the bin's width needs: 4,312, 4.3k or 43k."""
    if n < 1000 or width < 100:
        return f"{n:,}"
    return f"{n / 1000:,.1f}k" if width < 1000 else f"{n / 1000:,.0f}k"
