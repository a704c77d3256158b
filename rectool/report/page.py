"""Render a `rectool report`: one HTML page with no external resource, and the contact sheet.

The page needs no network and runs no script: thumbnails are JPEG data: URIs, charts inline
SVG (`svgcharts`), and a Content-Security-Policy forbids anything else, so a page that would
reach out fails loudly in a browser. Numbers the tests compare carry `data-value` attributes.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from html import escape
from typing import TYPE_CHECKING

import cv2
import numpy as np

from .. import __version__
from ..text import counted
from .charts import bar_chart

if TYPE_CHECKING:
    from ..inspect.verify import VerifyReport
    from .data import Report
    from .thumbs import SheetRow, Thumb

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
LISTED = 50  # verify problems and reporting problems listed one by one
SHEET_TEXT_WIDTH = 220
LEFT_OUT = "left out: page size limit"  # the problem of a thumbnail left out of the page

STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#111;
padding:0 1em;background:#fff}
h1{font-size:1.6em}h2{border-bottom:2px solid #333;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}
th,td{border:1px solid #999;padding:.2em .6em;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}
th[scope=row]{background:#f2f2f2}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:0 1.5em}
.charts h2{grid-column:1/-1}
.chart{width:100%;height:auto;border:1px solid #ccc}
.chart text{font-size:12px;fill:#000}.chart .value{font-weight:bold}
.chart .axis{font-size:13px}
ul.thumbs{list-style:none;display:flex;flex-wrap:wrap;gap:6px;padding:0;margin:.3em 0 1em}
figure{margin:0;text-align:center;font-size:12px}
figure img{display:block;border:1px solid #666;background:#eee}
.missing{display:flex;align-items:center;justify-content:center;border:1px dashed #666;
font-size:11px;padding:2px;box-sizing:border-box}
.note{border-left:4px solid #333;padding-left:.6em}
code{font-size:.95em}
summary{cursor:pointer;margin:.3em 0}
"""


def render_html(report: Report) -> str:
    """Return the report page: one HTML document with no external resource."""
    title = f"rectool report: {os.path.basename(report.target.rstrip('/')) or report.target}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<header><h1>{escape(title)}</h1>",
        f"<p>Written by rectool {escape(__version__)} from <code>{escape(report.target)}</code>"
        f" (seed {report.options.seed}).</p></header><main>",
        _summary_section(report),
        _charts_section(report),
        _sheet_section(report),
        _refusals_section(report),
        _duplicates_section(report),
    ]
    if report.problems or _left_out(report) or _rows_hidden(report):
        parts.append(_problems_section(report))
    parts.append("</main></body></html>\n")
    return "\n".join(parts)


def _row(name: str, value: object, number: int | float | None = None) -> str:
    data = f' data-value="{number}"' if number is not None else ""
    cls = ' class="n"' if number is not None else ""
    return f'<tr><th scope="row">{escape(name)}</th><td{cls}{data}>{value}</td></tr>'


def _summary_section(report: Report) -> str:
    info, manifest = report.info, report.manifest or {}
    rows = [
        _row("Target", f"<code>{escape(report.target)}</code>"),
        _row(
            "Manifest",
            f"<code>{escape(info['manifest'])}</code>" if info.get("manifest") else "none",
        ),
        _row(
            "Layout",
            escape(info["layout"] + (", label vectors" if info.get("label_vectors") else "")),
        ),
        _row("Shards", f"{info['shards']:,}", info["shards"]),
        _row("Records", f"{info['records']:,}", info["records"]),
        _row("Images", f"{info['images']:,}", info["images"]),
    ]
    if info.get("identities") is None:
        rows.append(_row("Identities", "labels are not integral class ids"))
    else:
        classes = info.get("classes")
        of = f" (of {counted(classes, 'class')})" if classes is not None else ""
        rows.append(_row("Identities", f"{info['identities']:,}{of}", info["identities"]))
    sizes = info.get("image_bytes")
    if sizes:
        rows.append(_row("Image bytes", f"{sizes['total']:,}", sizes["total"]))
    rows.append(_row(".rec bytes", f"{info['rec_bytes']:,}", info["rec_bytes"]))
    encodings = ", ".join(f"{escape(k)} {n:,}" for k, n in info["encodings"].items())
    rows.append(_row("Encodings", encodings or "none"))
    if manifest:
        rows.append(_row("Packed by", f"rectool {escape(str(manifest.get('rectool_version')))}"))
        date = manifest.get("created") or manifest.get("date")
        rows.append(_row("Pack date", escape(str(date)) if date else "not recorded"))
        options = manifest.get("options") or {}
        text = ", ".join(
            f"{escape(str(k))}={escape(json.dumps(v, ensure_ascii=False))}"
            for k, v in options.items()
        )
        rows.append(_row("Pack options", f"<code>{text}</code>" if text else "none"))
        if manifest.get("list"):
            rows.append(_row("List", f"<code>{escape(str(manifest['list']))}</code>"))
        failures = (manifest.get("totals") or {}).get("failures")
        if failures is not None:
            rows.append(_row("Refused by the pack", f"{failures:,}", failures))
    rows.append(_row("Verify", _verify_text(report.verify)))
    damage = info.get("damage")
    if damage:
        rows.append(
            _row(
                "Damaged records",
                f"<strong>{damage['records']:,}</strong> cannot be read, left out of every "
                f"figure and image here; {escape(damage['advice'])}",
                damage["records"],
            )
        )
    out = ['<section id="summary" aria-labelledby="summary-h">', '<h2 id="summary-h">Summary</h2>']
    out.append('<table id="summary-table"><caption>The dataset at a glance</caption>')
    out += rows
    out.append("</table>")
    if damage:
        out.append(
            '<table id="damage-list"><caption>The first damaged records</caption><tr>'
            '<th scope="col">File</th><th scope="col">Key</th><th scope="col">Byte offset</th>'
            '<th scope="col">Why it cannot be read</th></tr>'
        )
        for d in damage["first"]:
            key = "" if d["key"] is None else f"{d['key']}"
            out.append(
                f"<tr><td><code>{escape(d['file'])}</code></td><td>{key}</td>"
                f'<td class="n" data-value="{d["offset"]}">{d["offset"]:,}</td>'
                f"<td>{escape(d['reason'])}</td></tr>"
            )
        if damage["records"] > len(damage["first"]):
            more = damage["records"] - len(damage["first"])
            out.append(f'<tr><td colspan="4">and {more:,} more</td></tr>')
        out.append("</table>")
    if report.verify is not None and not report.verify.sound:
        out.append(
            '<table id="verify-problems"><caption>Verify: the first problems</caption>'
            '<tr><th scope="col">Kind</th><th scope="col">Where and what</th></tr>'
        )
        for problem in report.verify.problems[:LISTED]:
            out.append(f"<tr><td>{escape(problem.kind)}</td><td>{escape(str(problem))}</td></tr>")
        out.append("</table>")
    out.append("</section>")
    return "\n".join(out)


def _verify_text(verify: VerifyReport | None) -> str:
    if verify is None:
        return "not run (use --verify)"
    what = "framing, index, headers, checksums" + (", decoding" if verify.decoded else "")
    if verify.sound:
        return f"sound: no problems found ({escape(what)})"
    counts = ", ".join(f"{escape(k)} {n:,}" for k, n in sorted(verify.counts.items()))
    return f"<strong>{counted(verify.problem_count, 'problem')}</strong> ({counts}); checked {what}"


def _table(
    table_id: str, caption: str, headers: Iterable[str], rows: Iterable[Iterable[object]]
) -> str:
    out = [f'<table id="{table_id}"><caption>{escape(caption)}</caption><tr>']
    out += [f'<th scope="col">{escape(h)}</th>' for h in headers]
    out.append("</tr>")
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, int):
                cells.append(f'<td class="n" data-value="{cell}">{cell:,}</td>')
            else:
                cells.append(f"<td>{escape(str(cell))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _numbers(table: str) -> str:
    """Fold a chart's table of numbers under the chart (the bars carry the same numbers)."""
    return f"<details><summary>The chart's numbers as a table</summary>{table}</details>"


def _charts_section(report: Report) -> str:
    info = report.info
    out = [
        '<section id="charts" aria-labelledby="charts-h" class="charts">',
        '<h2 id="charts-h">Charts</h2>',
    ]
    out.append('<div class="chart-block"><h3 id="per-identity-h">Images per identity</h3>')
    per = info.get("images_per_identity")
    if per:
        # Log-spaced bins from the labels (the long tail shows), else `info`'s fixed ones.
        bars = report.identity_histogram or [
            (row["images"], row["identities"]) for row in per["histogram"]
        ]
        counts = [v for _, v in bars]
        log = max(counts) > 20 * max(1, min(counts))
        out.append(
            f"<p>min {per['min']:,}, median {per['median']:g}, mean {per['mean']:,}, "
            f"max {per['max']:,} images per identity.</p>"
        )
        out.append(
            bar_chart(
                "chart-per-identity",
                "Identities by number of images",
                bars,
                "images per identity (log-spaced bins)",
                "identities",
                log=log,
            )
        )
        out.append(
            _numbers(
                _table(
                    "per-identity-table",
                    "Identities by number of images",
                    ["Images per identity", "Identities"],
                    bars,
                )
            )
        )
    elif not info["images"]:  # (no label to call integral or not)
        out.append("<p>No images.</p>")
    else:
        out.append("<p>Not shown: the labels are not integral class ids.</p>")
    out.append('</div><div class="chart-block"><h3 id="dimensions-h">Image dimensions</h3>')
    dims = info["dimensions"]
    if dims["sampled"]:
        top = list(dims["counts"].items())[:10]
        spread = _dimension_spread(dims["counts"])
        out.append(
            f"<p>From a sample of {counted(dims['sampled'], 'image')} spread over the dataset "
            f"(height x width x channels). {escape(spread)}</p>"
        )
        out.append(
            bar_chart(
                "chart-dimensions",
                "Most common image sizes in the sample",
                top,
                "height x width x channels",
                "sampled images",
            )
        )
        out.append(
            _numbers(
                _table(
                    "dimensions-table", "Most common image sizes", ["Size", "Sampled images"], top
                )
            )
        )
    else:
        out.append("<p>No image was sampled.</p>")
    out.append('</div><div class="chart-block"><h3 id="bytes-h">Image bytes</h3>')
    sizes = info.get("image_bytes")
    if sizes:
        out.append(
            f"<p>min {sizes['min']:,}, median {sizes['median']:,.0f}, mean {sizes['mean']:,}, "
            f"max {sizes['max']:,} bytes per image.</p>"
        )
        hist = report.size_histogram
        log = max(c for _, c in hist) > 20 * max(1, min(c for _, c in hist if c) or 1)
        out.append(
            bar_chart(
                "chart-bytes",
                "Images by payload size",
                hist,
                "image bytes" + (" (k = 1,000)" if any("k" in b for b, _ in hist) else ""),
                "images",
                log=log,
            )
        )
        table = _table("bytes-table", "Images by payload size", ["Bytes", "Images"], hist)
        out.append(_numbers(table))
    else:
        out.append("<p>No images.</p>")
    out.append("</div></section>")
    return "\n".join(out)


def _dimension_spread(counts: Mapping[str, int]) -> str:
    sizes = []
    for key in counts:
        try:
            sizes.append(tuple(int(v) for v in key.split("x")[:2]))
        except ValueError:
            continue
    if not sizes:
        return "No sampled image decoded."
    heights, widths = [h for h, _ in sizes], [w for _, w in sizes]
    text = (
        f"Heights {min(heights):,} to {max(heights):,} pixels, widths {min(widths):,} to "
        f"{max(widths):,}; {counted(len(counts), 'distinct size')}."
    )
    if "undecodable" in counts:
        bad = counts["undecodable"]
        text += f" {counted(bad, 'sampled image')} did not decode."
    if "too large" in counts:
        many = counts["too large"]
        verb = "declares" if many == 1 else "declare"
        text += f" {many:,} {verb} more pixels than --max-pixels (not decoded)."
    return text


def page_thumbs(report: Report) -> Iterator[Thumb]:
    """The thumbnails the page shows, in page order (left-out ones included)."""
    for row in _shown_rows(report):
        yield from row.thumbs
    for *_, thumb, _ in report.refusals.rows:
        if thumb is not None:
            yield thumb
    for *_, thumb in report.duplicates.groups:
        if thumb is not None:
            yield thumb


def _shown_rows(report: Report) -> list[SheetRow]:
    return report.rows if report.rows_shown is None else report.rows[: report.rows_shown]


def _rows_hidden(report: Report) -> int:
    return len(report.rows) - len(_shown_rows(report))


def _left_out(report: Report) -> int:
    return sum(t.problem == LEFT_OUT for t in page_thumbs(report))


def _figure(thumb: Thumb | None, size: int) -> str:
    if thumb is None:
        return ""
    caption = f"<figcaption>{escape(thumb.caption)}</figcaption>" if thumb.caption else ""
    if thumb.jpeg is None and thumb.problem == LEFT_OUT:
        return f'<span class="left-out" data-left-out="1">{escape(LEFT_OUT)}</span>'
    if thumb.jpeg is None or thumb.pixels is None:  # (they are None together)
        return (
            f'<figure><div class="missing" style="width:{size}px;height:{size}px" role="img" '
            f'aria-label="{escape(thumb.alt)}: {escape(thumb.problem or "")}">'
            f"{escape(thumb.problem or '')}</div>{caption}</figure>"
        )
    height, width = thumb.pixels.shape[:2]
    data = base64.b64encode(thumb.jpeg).decode("ascii")
    return (
        f'<figure><img src="data:image/jpeg;base64,{data}" alt="{escape(thumb.alt)}" '
        f'width="{width}" height="{height}">{caption}</figure>'
    )


def _sheet_section(report: Report) -> str:
    out = [
        '<section id="contact-sheet" aria-labelledby="sheet-h">',
        '<h2 id="sheet-h">Contact sheet</h2>',
    ]
    if not report.rows:
        out.append("<p>No images.</p></section>")
        return "\n".join(out)
    out.append(render_rows(report, report.rows_shown))
    hidden = _rows_hidden(report)
    if hidden:
        out.append(
            f'<p class="note" id="rows-hidden" data-value="{hidden}">'
            f"{counted(hidden, 'more identity')} "
            "not shown, to keep the page within --max-bytes (a --sheet image shows them all).</p>"
        )
    out.append("</section>")
    return "\n".join(out)


SHEET_HEADINGS = {
    "sample": "A sample of identities (seed {seed})",
    "smallest": "The smallest identities",
    "largest": "The largest identities",
}


def render_rows(report: Report, shown: int | None = None) -> str:
    """Return the contact sheet's first `shown` rows (all when None) as HTML. The thumbnails
    left out to keep the page small are one count per row, not one placeholder each."""
    size, out, group = report.options.thumb, [], None
    for row in report.rows if shown is None else report.rows[:shown]:
        if row.group != group:
            group = row.group
            heading = SHEET_HEADINGS[group].format(seed=report.options.seed)
            out.append(f'<h3 id="sheet-{group}">{escape(heading)}</h3>')
        if row.label is None:
            heading = f"Images sampled from all {row.count:,}"
        else:
            name = f" ({row.name})" if row.name else ""
            heading = f"Identity {row.label}{name}: {counted(row.count, 'image')}"
        out.append(f'<h4 class="identity">{escape(heading)}</h4><ul class="thumbs">')
        shown_thumbs = [t for t in row.thumbs if t.problem != LEFT_OUT]
        out += [f"<li>{_figure(t, size)}</li>" for t in shown_thumbs]
        left = len(row.thumbs) - len(shown_thumbs)
        if left:
            thumbs = counted(left, "thumbnail")
            out.append(f'<li class="left-out" data-left-out="{left}">{thumbs} left out</li>')
        out.append("</ul>")
    return "\n".join(out)


def _refusals_section(report: Report) -> str:
    ref = report.refusals
    out = [
        '<section id="refusals" aria-labelledby="refusals-h">',
        '<h2 id="refusals-h">Refusals</h2>',
    ]
    if ref.note:
        out.append(f'<p class="note">{escape(ref.note)}</p></section>')
        return "\n".join(out)
    out.append(
        f"<p>{counted(ref.total, 'image')} refused by the pack, from "
        f"<code>{escape(ref.path or '')}</code>.</p>"  # a path, unless there is a note
    )
    if ref.bad_lines:
        lines = ", ".join(str(n) for n in ref.bad_lines)
        out.append(
            '<p class="note">Lines of the failures file that are not refusals (not JSON, or '
            f"not of its shape): {lines}.</p>"
        )
    if ref.total:
        out.append(
            _table(
                "refusal-reasons",
                "Refusals by reason",
                ["Reason", "Images"],
                ref.reasons.most_common(),
            )
        )
        shown = len(ref.rows)
        out.append(
            f'<table id="refusal-list"><caption>The first {shown:,} refusals</caption><tr>'
            '<th scope="col">List line</th><th scope="col">Path</th><th scope="col">Reason</th>'
            '<th scope="col">Image</th></tr>'
        )
        for line, path, reason, thumb, note in ref.rows:
            image = _figure(thumb, report.options.thumb) if thumb else escape(note or "")
            out.append(
                f'<tr><td class="n">{escape(str(line))}</td><td><code>{escape(path)}</code></td>'
                f"<td>{escape(reason)}</td><td>{image}</td></tr>"
            )
        out.append("</table>")
    out.append("</section>")
    return "\n".join(out)


def _duplicates_section(report: Report) -> str:
    dup = report.duplicates
    out = [
        '<section id="duplicates" aria-labelledby="duplicates-h">',
        '<h2 id="duplicates-h">Exact duplicates across identities</h2>',
        f'<p id="duplicates-count" data-value="{dup.across}">{counted(dup.across, "image")} '
        f"{'is' if dup.across == 1 else 'are'} stored byte for byte under more than one "
        f"identity ({counted(dup.across_images, 'copy', 'copies')} in all); "
        f"{counted(dup.within, 'more image')} {'is' if dup.within == 1 else 'are'} repeated "
        "within one identity. Found by payload size and fingerprint, confirmed by BLAKE2b of "
        f"{counted(dup.hashed, 'candidate image')}.</p>",
    ]
    if dup.groups:
        out.append(
            '<table id="duplicate-list"><caption>Images under several identities</caption><tr>'
            '<th scope="col">Image</th><th scope="col">Copies</th>'
            '<th scope="col">Identities and records</th><th scope="col">BLAKE2b</th></tr>'
        )
        for digest, copies, members, thumb in dup.groups:
            listed = "<br>".join(
                f"identity {escape(str(label))}: {escape(where)}" for label, where in members
            )
            if copies > len(members):
                listed += f"<br>and {copies - len(members):,} more"
            out.append(
                f"<tr><td>{_figure(thumb, report.options.thumb)}</td>"
                f'<td class="n">{copies:,}</td><td>{listed}</td><td><code>{digest}</code></td></tr>'
            )
        out.append("</table>")
    out.append("</section>")
    return "\n".join(out)


def _problems_section(report: Report) -> str:
    out = [
        '<section id="problems" aria-labelledby="problems-h">',
        '<h2 id="problems-h">Problems met while reporting</h2><ul>',
    ]
    out += [f"<li>{escape(p)}</li>" for p in report.problems[:LISTED]]
    if len(report.problems) > LISTED:
        out.append(f"<li>and {len(report.problems) - LISTED:,} more</li>")
    left_out = _left_out(report)
    if left_out:
        out.append(
            f'<li id="left-out" data-value="{left_out}">{counted(left_out, "thumbnail")} left out '
            f"to keep the page within {report.options.max_bytes:,} bytes (raise --max-bytes)</li>"
        )
    hidden = _rows_hidden(report)
    if hidden:
        out.append(
            f"<li>{counted(hidden, 'contact-sheet row')} left out to keep the page within "
            f"{report.options.max_bytes:,} bytes (raise --max-bytes)</li>"
        )
    out.append("</ul></section>")
    return "\n".join(out)


# --- the contact sheet as an image ------------------------------------------------------------


# What each contact-sheet row is, under its image count.
SHEET_GROUPS = {"sample": "(sampled)", "smallest": "(fewest)", "largest": "(most)"}


def sheet_caption(row: SheetRow) -> list[str]:
    """Return the three lines beside a contact-sheet row: who, their name, how many images."""
    who = "images sampled" if row.label is None else f"identity {row.label}"
    of = "in the dataset" if row.label is None else SHEET_GROUPS[row.group]
    return [who, _ascii(row.name or ""), f"{counted(row.count, 'image')} {of}"]


def render_sheet(report: Report) -> np.ndarray:
    """Draw the contact sheet: a row per identity, its label and name, then its thumbnails."""
    size, pad, text_w = report.options.thumb, 4, SHEET_TEXT_WIDTH
    rows = report.rows
    cols = max([len(r.thumbs) for r in rows] + [1])
    height = max(1, len(rows)) * (size + pad) + pad
    width = text_w + cols * (size + pad) + pad
    sheet = np.full((height, width, 3), 255, np.uint8)
    if not rows:
        cv2.putText(sheet, "no images", (6, 22), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1)
    for r, row in enumerate(rows):
        top = pad + r * (size + pad)
        for k, text in enumerate(sheet_caption(row)):
            y = top + 18 + 18 * k
            cv2.putText(sheet, text[:28], (6, y), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1)
        for c, thumb in enumerate(row.thumbs):
            x = text_w + pad + c * (size + pad)
            if thumb.pixels is None:
                cv2.rectangle(sheet, (x, top), (x + size - 1, top + size - 1), (0, 0, 0), 1)
                cv2.line(sheet, (x, top), (x + size - 1, top + size - 1), (0, 0, 0), 1)
                continue
            h, w = thumb.pixels.shape[:2]
            sheet[top : top + h, x : x + w] = thumb.pixels
    return sheet


def _ascii(text: str) -> str:
    return text.encode("ascii", "replace").decode("ascii")
