"""Draw bar charts as inline SVG text: axes, labels and the number on every bar.

The charts of `rectool report` are read on a page with no scripts, so each is a complete SVG
element that states its numbers in text (a reader can check them, a screen reader can say them)
and never relies on colour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 720, 320
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 16, 34, 98


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
