"""Build a dataset's report: one self-contained HTML page a person can open, read and share.

`build_report` gathers what the page shows: `dataset_info` (the numbers of `rectool info`,
read from every record header), a seeded sample of identities decoded at reduced scale into
small JPEG thumbnails, the pack's refusals (its failures file), exact duplicate images across
identities, and optionally a `verify_dataset` result. `report_page` turns that into the page
and the contact-sheet image.

Cost: the headers (as `rectool info`), 16 more bytes read per image for the duplicate
fingerprints, and the sampled images. Memory: the per-image arrays of `dataset_info` plus about
60 bytes per image here (shard, offset, label, size, two fingerprint words, a sort order);
payloads are hashed one at a time, only where size and fingerprint collide.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field

import cv2
import numpy as np

from ..doors.inputs import dataset_path, open_checked, read_regular
from ..doors.output import JOURNAL_SUFFIX, OutputFiles
from ..errors import RecordFormatError, RectoolError, UsageError
from ..format.keys import shared_offsets
from ..inspect.info import dataset_info
from ..reader import DEFAULT_MAX_PIXELS, ImageTooLargeError, imdecode
from .page import LEFT_OUT, page_thumbs, render_html, render_rows, render_sheet

DEFAULT_IDENTITIES = 12
DEFAULT_PER_IDENTITY = 8
DEFAULT_THUMB = 96
DEFAULT_MAX_BYTES = 5_000_000
DEFAULT_SAMPLE = 200
EXTREMES = 2  # smallest and largest identities shown beside the sample
REFUSALS_SHOWN = 50
DUPLICATES_SHOWN = 20
MEMBERS_SHOWN = 6  # copies listed per duplicate group
REASONS_KEPT = 200  # distinct refusal reasons counted one by one; the rest as "other"
SOURCE_LIMIT = 64 << 20  # refused source files larger than this are not read for a thumbnail
# Room kept for the page's text (tables are bounded by the *_SHOWN limits) when thumbnails
# are fitted into --max-bytes.
TEXT_RESERVE = 400_000
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
class Thumb:
    """One thumbnail: the JPEG (None when the image did not decode) and what it shows."""

    alt: str
    caption: str
    jpeg: bytes | None = None
    pixels: np.ndarray | None = None
    problem: str | None = None


@dataclass
class SheetRow:
    """A row of the contact sheet: one identity and thumbnails of its images."""

    group: str  # "sample", "smallest" or "largest"
    label: object
    name: str | None
    count: int
    thumbs: list


@dataclass
class Refusals:
    """What the pack's failures file says, or why it could not be read (`note`)."""

    path: str | None = None
    total: int = 0
    reasons: Counter = field(default_factory=Counter)
    rows: list = field(default_factory=list)  # (line, path, reason, Thumb or None, note)
    bad_lines: list = field(default_factory=list)  # line numbers that are not JSON objects
    note: str | None = None


@dataclass
class Duplicates:
    """Byte-identical images: groups spanning identities (the first kept) and counts."""

    groups: list = field(default_factory=list)  # (digest, copies, [(label, where)], Thumb)
    across: int = 0  # groups whose copies carry more than one label
    across_images: int = 0
    within: int = 0  # groups inside one identity
    hashed: int = 0  # images hashed in full (fingerprint collisions)


@dataclass
class Report:
    """Everything the page shows."""

    target: str
    options: ReportOptions
    info: dict
    manifest: dict | None
    rows: list
    refusals: Refusals
    duplicates: Duplicates
    size_histogram: list  # (label, count)
    verify: object = None
    problems: list = field(default_factory=list)  # things that went wrong while reporting
    left_out: int = 0  # thumbnails left out of the page to stay within max_bytes
    rows_shown: int | None = None  # sheet rows on the page (None: all); the sheet image has all


@dataclass
class ReportResult:
    """What `write_report` wrote."""

    html: str | None
    html_bytes: int
    sheet: str | None
    report: Report

    def to_json(self):
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
    target, html_path=None, sheet_path=None, options=ReportOptions(), overwrite=False,
    progress=None, shown_as=None,
):  # fmt: skip
    """Build the report of `target`; write the page to `html_path`, the sheet to `sheet_path`.

    Either path may be None, not both. The page is at most `options.max_bytes` bytes: the
    thumbnails that do not fit are left out (counted on the page), then contact-sheet rows.
    `progress(done, total)`, when given, is called as the thumbnails are made. `shown_as(text)`
    renames the paths the page shows (a local copy's: by its URL; see `build_report`).
    The files are written as one output (both or neither, each whole); an existing file is
    replaced only with `overwrite`, a pack's file never.
    Raises `RectoolError` when the dataset cannot be read or an output may not be written,
    `UsageError` for a sheet format other than .jpg/.png.
    """
    if html_path is None and sheet_path is None:
        raise UsageError("nothing to write: give an HTML output, a sheet, or both")
    if sheet_path is not None and os.path.splitext(os.fspath(sheet_path))[1].lower() not in (
        SHEET_FORMATS
    ):
        raise UsageError(f"{sheet_path}: the sheet must be a .jpg or .png file")
    first = os.fspath(html_path if html_path is not None else sheet_path)
    output = OutputFiles(_journal_beside(first), overwrite, "report")
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


def fit_page(report):
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


def count_left_out(report):
    """Count the thumbnails the page leaves out to stay within --max-bytes."""
    return sum(t.problem == LEFT_OUT for t in page_thumbs(report))


def _journal_beside(path):
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}{JOURNAL_SUFFIX}")


def build_report(target, options=ReportOptions(), progress=None, shown_as=None):
    """Gather what the report of `target` shows; raise `RectoolError` when it cannot be read.

    `progress(done, total)`, when given, is called as the contact sheet's thumbnails are made.
    `shown_as(text)`, when given, renames the target, manifest and failures file it names."""
    images = _ImageTable()
    info = dataset_info(
        target, sample=options.sample, on_shard=images.add, max_pixels=options.max_pixels
    )
    images.finish()
    manifest = _manifest_of(info)
    names = (manifest or {}).get("identities") or {}
    problems = []
    budget = _ThumbBudget(options.max_bytes)
    reduce = _reduction(info, options.thumb)
    decoded = {}  # image number -> (jpeg, pixels, problem): each image is decoded once
    with _Payloads(images) as payloads:

        def thumb_of(i, alt, caption):
            if i not in decoded:
                try:
                    data = payloads.image(i)
                except RectoolError as exc:
                    problems.append(f"{alt}: {exc}")
                    decoded[i] = (None, None, "unreadable record")
                else:
                    thumb = _thumbnail(data, options, reduce, alt, caption)
                    if thumb.problem:
                        problems.append(f"{alt}: {thumb.problem}")
                    decoded[i] = (thumb.jpeg, thumb.pixels, thumb.problem)
            return budget.admit(Thumb(alt, caption, *decoded[i]))

        rows = _sheet_rows(images, names, options, thumb_of, progress)
        duplicates = _find_duplicates(images, payloads, names, thumb_of)
    refusals = _read_refusals(manifest, info.get("manifest"), options, budget, reduce)
    verify = None
    if options.verify:
        from ..inspect.verify import DecodeOptions, verify_dataset

        decode = DecodeOptions(max_pixels=options.max_pixels) if options.decode else None
        verify = verify_dataset(target, decode=decode)
    if shown_as is not None:  # read from a local copy of a URL: named by the URL
        info = {**info, "manifest": info.get("manifest") and shown_as(info["manifest"])}
        refusals.path = refusals.path and shown_as(refusals.path)
        refusals.note = refusals.note and shown_as(refusals.note)
        target = shown_as(os.fspath(target))
    report = Report(
        target=os.fspath(target),
        options=options,
        info=info,
        manifest=manifest,
        rows=rows,
        refusals=refusals,
        duplicates=duplicates,
        size_histogram=_size_histogram(images.sizes),
        verify=verify,
        problems=problems,
        left_out=budget.left_out,
    )
    report.left_out = count_left_out(report)
    return report


# --- reading the pack: the only code here that knows the reader's and scanner's internals ---


class _ImageTable:
    """Every image of the dataset as parallel arrays: shard, record offset, label, size."""

    def __init__(self):
        self.recs, self._parts = [], []

    def add(self, rec, facts):
        """Take one shard's facts from `dataset_info(on_shard=...)`."""
        number = len(self.recs)
        self.recs.append(rec)
        n = len(facts["offsets"])
        offsets = np.asarray(facts["offsets"], np.int64)  # one per key (the last line wins)
        count, _, offset = shared_offsets(np.arange(n), offsets)
        if count:  # a report of one record shown once per key would run on for every key
            raise RectoolError(
                f"{rec}: byte offset {offset} is named by "
                f"{int(np.count_nonzero(offsets == offset)):,} keys of its index"
                + (f" ({count - 1:,} other offsets too)" if count > 1 else "")
                + "; each record has one key, so report refuses it (`rectool verify` lists them)"
            )
        self._parts.append(
            (
                np.full(n, number, np.int32),
                np.asarray(facts["offsets"], np.int64),
                np.asarray(facts["labels"], np.float64),
                np.asarray(facts["sizes"], np.int64),
            )
        )

    def finish(self):
        columns = list(zip(*self._parts)) or [[np.zeros(0, t)] for t in ("i4", "i8", "f8", "i8")]
        self.shard, self.offsets, self.labels, self.sizes = (np.concatenate(c) for c in columns)
        self._parts = None
        self.integral = bool(
            len(self.labels)
            and np.isfinite(self.labels).all()
            and (self.labels == np.round(self.labels)).all()
        )

    def __len__(self):
        return len(self.offsets)

    def where(self, i):
        """Say where image `i` is, for people: file name and byte offset."""
        return f"{os.path.basename(self.recs[self.shard[i]])} byte {int(self.offsets[i]):,}"

    def label(self, i):
        value = float(self.labels[i])
        return int(value) if self.integral else value


class _Payloads:
    """Read image bytes and fingerprints from the shards (memory maps, opened once)."""

    def __init__(self, images):
        from ..reader import RecordFile

        self.images = images
        self.files = [RecordFile(rec) for rec in images.recs]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in self.files:
            f.close()

    def image(self, i):
        """Return the image bytes of image `i` (labels and header stripped)."""
        from ..reader import unpack_header

        rec = self.files[self.images.shard[i]]
        offset = int(self.images.offsets[i])
        return bytes(unpack_header(rec.read_at(offset), rec.path, offset)[1])

    def fingerprints(self):
        """Return an (n, 2) uint64 array: 8 bytes from the middle and the end of each image.

        Whole records are read in place, vectorised; split records are read one by one.
        """
        from ..inspect.scan import mapped
        from ..reader import LENGTH_BITS, LENGTH_MASK

        images = self.images
        out = np.zeros((len(images), 2), np.uint64)
        spread = np.arange(8)
        for number, rec in enumerate(images.recs):
            rows = np.flatnonzero(images.shard == number)
            if not len(rows):
                continue
            offsets, sizes = images.offsets[rows], images.sizes[rows]
            with mapped(rec) as (buf, size):
                data = np.frombuffer(buf, np.uint8, size)
                words = np.frombuffer(buf, "<u4", size // 4)
                try:
                    lrec = words[offsets // 4 + 1].astype(np.int64)
                    end = offsets + 8 + (lrec & LENGTH_MASK)
                    fast = ((lrec >> LENGTH_BITS) == 0) & (sizes >= 8) & (end <= size)
                    for chunk in np.array_split(np.flatnonzero(fast), max(1, len(rows) // 65536)):
                        tail = data[(end[chunk] - 8)[:, None] + spread]
                        middle = data[(end[chunk] - sizes[chunk] // 2 - 4)[:, None] + spread]
                        out[rows[chunk], 0] = middle.copy().view("<u8")[:, 0]
                        out[rows[chunk], 1] = tail.copy().view("<u8")[:, 0]
                finally:
                    del data, words
            for j in np.flatnonzero(~fast & (sizes > 0)).tolist():
                # The same bytes the vectorised path takes, so that a split copy still matches.
                image = self.image(int(rows[j]))
                n = len(image)
                middle = image[n - n // 2 - 4 :][:8] if n >= 8 else image
                out[rows[j], 0] = int.from_bytes(middle.ljust(8, b"\0"), "little")
                out[rows[j], 1] = int.from_bytes(image[-8:].ljust(8, b"\0"), "little")
        return out


def _manifest_of(info):
    if not info.get("manifest"):
        return None
    from ..reader import read_manifest

    return read_manifest(info["manifest"])


# --- sampling and thumbnails ------------------------------------------------------------------


class _ThumbBudget:
    """Admit thumbnails into the page while their base64 text fits within the page budget."""

    def __init__(self, max_bytes):
        self.room = max(0, max_bytes - TEXT_RESERVE)
        self.left_out = 0

    def admit(self, thumb):
        if thumb.jpeg is None:
            return thumb
        cost = (len(thumb.jpeg) + 2) // 3 * 4 + 200  # base64 plus the <img> tag around it
        if cost <= self.room:
            self.room -= cost
        else:
            thumb.jpeg = None
            thumb.problem = LEFT_OUT
            self.left_out += 1
        return thumb


_REDUCED = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}


def _reduction(info, thumb):
    """Pick the JPEG decoder's scale (1/2/4/8) from the most common sampled size."""
    for key in info["dimensions"]["counts"]:
        try:
            height, width = (int(v) for v in key.split("x")[:2])
        except ValueError:
            continue
        for factor in (8, 4, 2):
            if min(height, width) // factor >= thumb:
                return factor
        return 1
    return 1


def _thumbnail(data, options, reduce, alt, caption):
    """Decode `data` at reduced scale (through the decode guard), fit it in a square of
    `options.thumb` pixels, encode it as a small JPEG."""
    size = options.thumb
    try:
        array = imdecode(data, _REDUCED[reduce], options.max_pixels)
    except ImageTooLargeError:
        return Thumb(alt, caption, problem="not decoded: more pixels than --max-pixels")
    except RecordFormatError:
        return Thumb(alt, caption, problem="does not decode")
    height, width = array.shape[:2]
    if reduce > 1 and max(height, width) < size:
        # The scale was chosen for the most common size; this image is smaller than that, and
        # reduced it would be drawn below the thumbnail size: decode it whole instead.
        return _thumbnail(data, options, 1, alt, caption)
    scale = size / max(height, width)
    if scale < 1:
        shape = (max(1, round(width * scale)), max(1, round(height * scale)))
        array = cv2.resize(array, shape, interpolation=cv2.INTER_AREA)
    ok, encoded = cv2.imencode(".jpg", array, [cv2.IMWRITE_JPEG_QUALITY, 80])
    if not ok:
        return Thumb(alt, caption, problem="cannot encode a thumbnail")
    return Thumb(alt, caption, encoded.tobytes(), array)


def _sheet_rows(images, names, options, thumb_of, progress=None):
    """Choose the sampled identities (seeded) and the smallest and largest; decode their thumbs."""
    if not len(images):
        return []
    rng = np.random.default_rng(options.seed)
    if not images.integral:
        # Labels are not class ids: one row of images sampled from the whole dataset.
        count = min(options.per_identity * max(1, options.identities), len(images))
        picks = np.sort(rng.choice(len(images), count, replace=False))
        thumbs = []
        for done, i in enumerate(picks.tolist(), 1):
            thumbs.append(thumb_of(int(i), f"image at {images.where(i)}", images.where(i)))
            if progress is not None:
                progress(done, len(picks))
        return [SheetRow("sample", None, None, len(images), thumbs)]
    labels = images.labels.astype(np.int64)
    values, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    chosen = np.sort(rng.choice(len(values), min(options.identities, len(values)), replace=False))
    by_size = np.lexsort((values, counts))  # fewest images first, ties by label
    groups = [("sample", chosen.tolist())]
    extremes = min(EXTREMES, len(values))
    groups.append(("smallest", by_size[:extremes].tolist()))
    groups.append(("largest", np.lexsort((values, -counts))[:extremes].tolist()))
    plan = []
    for group, picked in groups:
        for k in picked:
            members = order[starts[k] : starts[k] + counts[k]]
            if len(members) > options.per_identity:
                members = np.sort(rng.choice(members, options.per_identity, replace=False))
            plan.append((group, k, members))
    total, done, rows = sum(len(m) for *_, m in plan), 0, []
    for group, k, members in plan:
        label = int(values[k])
        name = names.get(str(label))
        who = f"identity {label}" + (f" ({name})" if name else "")
        thumbs = []
        for i in members.tolist():
            thumbs.append(thumb_of(i, f"{who}, image at {images.where(i)}", _caption(label, name)))
            done += 1
            if progress is not None:
                progress(done, total)
        rows.append(SheetRow(group, label, name, int(counts[k]), thumbs))
    return rows


def _caption(label, name):
    return f"{label} {name}" if name else f"{label}"


# --- exact duplicates -------------------------------------------------------------------------


def _find_duplicates(images, payloads, names, thumb_of):
    """Find byte-identical images: equal (size, fingerprint) first, then a full blake2b."""
    result = Duplicates()
    n = len(images)
    if n < 2:
        return result
    prints = payloads.fingerprints()
    sizes = images.sizes
    order = np.lexsort((prints[:, 1], prints[:, 0], sizes))
    s, a, b = sizes[order], prints[order, 0], prints[order, 1]
    same = (s[1:] == s[:-1]) & (a[1:] == a[:-1]) & (b[1:] == b[:-1]) & (s[1:] > 0)
    # Runs of equal fingerprints: candidates, hashed in full one run at a time.
    edges = np.flatnonzero(np.diff(np.concatenate([[False], same, [False]]).astype(np.int8)))
    for start, stop in zip(edges[::2].tolist(), (edges[1::2] + 1).tolist()):
        run = order[start:stop]
        digests = {}
        for i in run.tolist():
            digest = hashlib.blake2b(payloads.image(i), digest_size=16).hexdigest()
            digests.setdefault(digest, []).append(i)
            result.hashed += 1
        for digest, members in sorted(digests.items(), key=lambda item: min(item[1])):
            if len(members) < 2:
                continue
            members.sort()
            labels = {images.label(i) for i in members}
            if len(labels) < 2:
                result.within += 1
                continue
            result.across += 1
            result.across_images += len(members)
            if len(result.groups) < DUPLICATES_SHOWN:
                copies = [(images.label(i), images.where(i)) for i in members[:MEMBERS_SHOWN]]
                idents = ", ".join(
                    _caption(label, names.get(str(label))) for label in sorted(labels)[:8]
                )
                first = members[0]
                thumb = thumb_of(
                    first,
                    f"image stored {len(members)} times, under identities {idents}",
                    f"{len(members)} copies",
                )
                result.groups.append((digest, len(members), copies, thumb))
    return result


# --- refusals ---------------------------------------------------------------------------------


def _read_refusals(manifest, manifest_path, options, budget, reduce):
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
    thumb = _thumbnail(data, options, reduce, f"refused image {path} (list line {line})", "")
    if thumb.jpeg is None:
        return None, "source does not decode"
    return thumb, None


# --- charts -----------------------------------------------------------------------------------


def _size_histogram(sizes, bins=12):
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


def _bytes_label(n, width):
    """Write a bin edge as precisely as the bin's width needs: 4,312, 4.3k or 43k."""
    if n < 1000 or width < 100:
        return f"{n:,}"
    return f"{n / 1000:,.1f}k" if width < 1000 else f"{n / 1000:,.0f}k"
