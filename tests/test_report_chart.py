"""The report's images-per-identity chart: log-spaced bins that show a long tail at any size."""

from __future__ import annotations

import re
from html import unescape

import numpy as np
from helpers.handmade_datasets import images, write_pack
from hypothesis import given
from hypothesis import strategies as st

from rectool.report.charts import MAX_BINS, log_bins
from rectool.report.data import ReportOptions, write_report

DASH = "\u2013"


def long_tail():
    """Images per identity as face datasets have them: a few identities with thousands of
    images, some with tens to hundreds, most with a handful."""
    handful = np.repeat([1, 2, 3, 4, 5], [900, 700, 500, 300, 100])
    return np.concatenate([[4800, 2600, 1100], np.arange(30, 330, 10), handful])


def test_a_long_tail_shows_in_labelled_log_spaced_bins():
    assert log_bins(long_tail()) == [
        ("1", 900),
        ("2", 700),
        (f"3{DASH}5", 900),
        (f"6{DASH}10", 0),
        (f"11{DASH}20", 0),
        (f"21{DASH}50", 3),
        (f"51{DASH}100", 5),
        (f"101{DASH}200", 10),
        (f"201{DASH}500", 12),
        (f"501{DASH}1,000", 0),
        (f"1,001{DASH}2,000", 1),
        (f"2,001{DASH}5,000", 2),
    ]


def test_identities_of_21_to_100_images_get_seven_bars_not_two():
    # The 100k demo pack: fixed bins 21-50 and 51-100 drew it as two bars.
    counts = np.repeat(np.arange(21, 101), 25)
    assert log_bins(counts) == [
        (f"21{DASH}25", 125),
        (f"26{DASH}30", 125),
        (f"31{DASH}40", 250),
        (f"41{DASH}50", 250),
        (f"51{DASH}60", 250),
        (f"61{DASH}80", 500),
        (f"81{DASH}100", 500),
    ]


def test_few_identities_get_few_bars():
    assert log_bins([1, 3, 3, 5, 13]) == [
        ("1", 1),
        (f"2{DASH}3", 2),
        (f"4{DASH}10", 1),
        (f"11{DASH}30", 1),
    ]
    assert log_bins([7] * 10) == [(f"7{DASH}8", 10)]
    assert log_bins([]) == []


def _range(label):
    low, _, high = label.replace(",", "").partition(DASH)
    return int(low), int(high or low)


@given(st.lists(st.integers(1, 10**11), min_size=1, max_size=300))
def test_bins_hold_every_value_in_its_labelled_range(values):
    bars = log_bins(values)
    ranges = [_range(label) for label, _ in bars]
    assert 1 <= len(bars) <= MAX_BINS
    assert sum(n for _, n in bars) == len(values)
    assert all(b == a + 1 for (_, a), (b, _) in zip(ranges, ranges[1:]))  # no gap, no overlap
    assert all(low <= high for low, high in ranges)
    assert ranges[0][0] <= min(values) <= ranges[0][1] and bars[0][1] > 0
    assert ranges[-1][0] <= max(values) <= ranges[-1][1] and bars[-1][1] > 0
    for (low, high), (_, n) in zip(ranges, bars):
        assert n == sum(low <= v <= high for v in values)
    tops = [high for _, high in ranges]
    assert all(b / a <= 10 for a, b in zip(tops, tops[1:]))  # a decade a bin at the coarsest


def test_the_page_draws_and_tabulates_the_long_tail(tmp_path):
    counts = [2000, 700, 160, 90, 40, 30, *[1] * 30, *[2] * 20, *[3] * 12, *[4] * 6]
    data = images(len(counts))  # one image a label, repeated: only the labels matter here
    items = [
        (key, data[label], float(label))
        for key, label in enumerate(np.repeat(np.arange(len(counts)), counts).tolist())
    ]
    write_pack(tmp_path / "faces", [items])
    html = tmp_path / "report.html"
    write_report(tmp_path / "faces", html, options=ReportOptions(identities=2, per_identity=1))
    page = html.read_text(encoding="utf-8")
    expected = log_bins(counts)
    assert expected == [  # 74 identities: 8 bars (Sturges), tops 1, 3, 10, 30, ...
        ("1", 30),
        (f"2{DASH}3", 32),
        (f"4{DASH}10", 6),
        (f"11{DASH}30", 1),
        (f"31{DASH}100", 2),
        (f"101{DASH}300", 1),
        (f"301{DASH}1,000", 1),
        (f"1,001{DASH}3,000", 1),
    ]
    chart = re.search(r'<svg id="chart-per-identity".*?</svg>', page, re.S).group(0)
    bars = re.findall(r'<rect class="bar"[^>]*><title>([^<]*): ([0-9,]+)</title>', chart)
    assert [(unescape(label), int(n.replace(",", ""))) for label, n in bars] == expected
    assert "images per identity (log-spaced bins)" in chart
    assert "identities (log scale)" in chart  # 30 against 1: the value axis is logarithmic
    table = re.search(r'<table id="per-identity-table".*?</table>', page, re.S).group(0)
    cells = [unescape(c) for c in re.findall(r"<t[dh][^>]*>([^<]*)</t[dh]>", table)]
    assert cells[2:] == [x for label, n in expected for x in (label, f"{n:,}")]
