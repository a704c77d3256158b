"""Draw bar charts as inline SVG text: axes, labels and the number on every bar.

The charts of `rectool report` are read on a page with no scripts, so each is a complete SVG
element that states its numbers in text (a reader can check them, a screen reader can say them)
and never relies on colour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

import numpy as np

WIDTH, HEIGHT = 720, 320
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 16, 34, 98

# Log-spaced bins: each decade's bin tops, in tenths (12: 1.2, 1.2 x 10, ...), finest first.
# `log_bins` takes the finest series that covers the values in as many bars as Sturges' rule
# gives n values (log2(n) + 1), from MIN_BINS to MAX_BINS, so the shape shows at any size:
# 2,000 identities of 21 to 100 images get 7 bars (21-25, ..., 81-100), a long tail of 1 to
# 5,000 gets 12 (1, 2, 3-5, 6-10, ..., 2,001-5,000), 5 identities no more than 4.
BIN_SERIES = (
    (10, 12, 15, 20, 25, 30, 40, 50, 60, 80),
    (10, 15, 20, 30, 50, 70),
    (10, 20, 30, 50),
    (10, 20, 50),
    (10, 30),
    (10,),
)
MIN_BINS, MAX_BINS = 4, 12  # (more than MAX_BINS only past 10**11, a decade a bin)


def log_bins(values: Any) -> list[tuple[str, int]]:
    """Return (label, count) bars of positive integers `values` (images per identity) in
    log-spaced bins from the one holding the smallest to the one holding the largest, at most
    MAX_BINS (fewer for few values: see BIN_SERIES).

    Bins between are kept when empty (a gap is part of the shape). A label is the bin's
    integer range, `21–25`, or its one value, `1`.
    """
    counts = np.asarray(values, np.int64)
    if not len(counts):
        return []
    low, high = int(counts.min()), int(counts.max())
    if low < 1:
        raise ValueError(f"log_bins takes positive integers, got {low}")
    most = min(MAX_BINS, max(MIN_BINS, math.ceil(math.log2(len(counts))) + 1))
    for series in BIN_SERIES:
        tops = _tops(series, high)
        first = int(np.searchsorted(tops, low))  # the bin holding `low`: the first top >= it
        if len(tops) - first <= most:
            break
    bottoms = [1, *(top + 1 for top in tops[:-1])]
    per_bin = np.bincount(np.searchsorted(tops, counts), minlength=len(tops))
    bars = []
    for bottom, top, n in zip(bottoms[first:], tops[first:], per_bin[first:].tolist()):
        label = _number(top) if bottom == top else f"{_number(bottom)}\u2013{_number(top)}"
        bars.append((label, int(n)))
    return bars


def _tops(series: Sequence[int], high: int) -> list[int]:
    """Return the distinct bin tops of `series` (tenths, a decade's) from 1 up to the first
    that reaches `high`."""
    tops: list[int] = []
    scale = 1
    while not tops or tops[-1] < high:
        for tenths in series:
            top = -(-tenths * scale // 10)  # rounded up: 1.2 and 1.5 are 2, 2.5 is 3
            if not tops or top > tops[-1]:
                tops.append(top)
            if top >= high:
                break
        scale *= 10
    return tops


def bar_chart(
    chart_id: str,
    title: str,
    bars: Sequence[tuple[str, int | float]],
    x_label: str,
    y_label: str,
    log: bool = False,
) -> str:
    """Return an SVG bar chart of `bars`, a list of (category label, value >= 0).

    `log` draws the value axis on a log10 scale (bars of value 0 are then empty). The chart is
    labelled by its <title> (`title`) for assistive technology; every bar carries its value.
    """
    values = [max(0, v) for _, v in bars]
    top = max(values, default=0) or 1
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    if log:
        decades = max(1, math.ceil(math.log10(max(top, 1)) + 1e-9))
        ticks: list[int | float] = [10**d for d in range(decades + 1)]

        def scale(v: int | float) -> float:
            return 0.0 if v < 1 else (math.log10(v) + 0.3) / (decades + 0.3)

        # A bar of 1 gets a visible stub: the axis starts at 10**-0.3 ~= 0.5.
    else:
        step = _nice_step(top)
        ticks = [step * i for i in range(int(math.ceil(top / step)) + 1)]

        def scale(v: int | float) -> float:
            return v / ticks[-1]

    out = [
        f'<svg id="{escape(chart_id)}" class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" aria-labelledby="{escape(chart_id)}-title">',
        f'<title id="{escape(chart_id)}-title">{escape(title)}</title>',
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>',
    ]
    base = MARGIN_TOP + plot_h
    for tick in ticks:
        y = base - scale(tick) * plot_h
        out.append(
            f'<line x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{WIDTH - MARGIN_RIGHT}" y2="{y:.1f}" '
            'stroke="#ddd"/>'
            f'<text x="{MARGIN_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
            f"{_number(tick)}</text>"
        )
    n = max(1, len(bars))
    slot = plot_w / n
    bar_w = max(2.0, slot * 0.7)
    rotate = n > 8
    for i, ((label, _), value) in enumerate(zip(bars, values)):
        x = MARGIN_LEFT + i * slot + (slot - bar_w) / 2
        h = scale(value) * plot_h
        cx = x + bar_w / 2
        out.append(
            f'<rect class="bar" x="{x:.1f}" y="{base - h:.1f}" width="{bar_w:.1f}" '
            f'height="{h:.1f}" fill="#36c" stroke="#123"><title>{escape(str(label))}: '
            f"{_number(value)}</title></rect>"
            f'<text x="{cx:.1f}" y="{base - h - 4:.1f}" text-anchor="middle" class="value">'
            f"{_number(value)}</text>"
        )
        if rotate:
            out.append(
                f'<text x="{cx:.1f}" y="{base + 12:.1f}" text-anchor="end" class="tick" '
                f'transform="rotate(-40 {cx:.1f} {base + 12:.1f})">{escape(str(label))}</text>'
            )
        else:
            out.append(
                f'<text x="{cx:.1f}" y="{base + 16:.1f}" text-anchor="middle" class="tick">'
                f"{escape(str(label))}</text>"
            )
    out.append(
        f'<line x1="{MARGIN_LEFT}" y1="{base}" x2="{WIDTH - MARGIN_RIGHT}" y2="{base}" '
        'stroke="#000"/>'
        f'<line x1="{MARGIN_LEFT}" y1="{MARGIN_TOP}" x2="{MARGIN_LEFT}" y2="{base}" '
        'stroke="#000"/>'
        f'<text x="{MARGIN_LEFT + plot_w / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle" '
        f'class="axis">{escape(x_label)}</text>'
        f'<text x="14" y="{MARGIN_TOP + plot_h / 2:.1f}" text-anchor="middle" class="axis" '
        f'transform="rotate(-90 14 {MARGIN_TOP + plot_h / 2:.1f})">'
        f"{escape(y_label + (' (log scale)' if log else ''))}</text>"
        "</svg>"
    )
    return "".join(out)


def _nice_step(top: int | float) -> int | float:
    """Return a round tick step (1, 2 or 5 times a power of ten) giving about 5 ticks."""
    raw = top / 5
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 5, 10):
        if raw <= m * power:
            return max(1, m * power)
    return max(1, 10 * power)


def _number(value: int | float) -> str:
    value = int(value) if float(value).is_integer() else value
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"
