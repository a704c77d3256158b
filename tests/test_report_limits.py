"""`report --max-bytes`: the written page is within the limit whatever the number of
identities, and what the page says it left out is what it left out. Progress is reported."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import image_record, write_shard
from helpers.image_files import jpeg_bytes
from test_report import parse

from rectool.cli import cli
from rectool.report.data import ReportOptions, write_report

IDENTITIES, PER = 400, 5


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A shard of IDENTITIES identities with PER distinct 64x64 images each."""
    tmp = tmp_path_factory.mktemp("many")
    records = [
        (k, image_record(jpeg_bytes(k, 64, 64), float(k // PER))) for k in range(IDENTITIES * PER)
    ]
    write_shard(tmp / "m.rec", tmp / "m.idx", records)
    return tmp / "m.rec"


def report(target, out, max_bytes):
    args = ["--identities", IDENTITIES, "--per-identity", PER, "--max-bytes", max_bytes]
    return invoke("report", target, "-o", out, *args)


def left_out_counts(html):
    """(thumbnails left out as the page counts them, as its statement says)."""
    counted = sum(int(a["data-left-out"]) for _, a in html.attrs if "data-left-out" in a)
    stated = [int(a["data-value"]) for t, a in html.attrs if a.get("id") == "left-out"]
    text = "".join(html.text)
    said = re.findall(r"([\d,]+) thumbnails? left out to keep the page within ([\d,]+) bytes", text)
    return counted, stated, said


@pytest.mark.parametrize("limit", [600_000, 1_000_000])
def test_page_is_within_max_bytes_and_its_counts_are_true(many, tmp_path, limit):
    out = tmp_path / "r.html"
    result = report(many, out, limit)
    assert result.exit_code == 0, result.output
    assert out.stat().st_size <= limit
    html = parse(out.read_text(encoding="utf-8"))
    shown = len([a for s, a in html.images if s == "contact-sheet"])
    counted, stated, said = left_out_counts(html)
    assert shown and counted  # some thumbnails fit, some did not
    assert stated == [counted]
    assert said == [(f"{counted:,}", f"{limit:,}")]
    rows = [h for tag, h in html.headings if tag == "h4"]
    assert len(rows) == IDENTITIES + 4  # the sample, 2 smallest, 2 largest: all shown
    assert shown + counted == len(rows) * PER  # every sampled image is shown or counted
    # Left-out thumbnails are one count per row, never one placeholder each.
    assert not [a for t, a in html.attrs if "missing" in a.get("class", "")]


def test_rows_are_left_out_when_even_the_text_is_over(many, tmp_path):
    out = tmp_path / "r.html"
    result = report(many, out, "30KB")
    assert result.exit_code == 0, result.output
    assert out.stat().st_size <= 30_000
    html = parse(out.read_text(encoding="utf-8"))
    assert not [a for s, a in html.images if s == "contact-sheet"]
    counted, stated, said = left_out_counts(html)
    assert stated == [counted] and said == [(f"{counted:,}", "30,000")]
    hidden = [int(a["data-value"]) for t, a in html.attrs if a.get("id") == "rows-hidden"]
    rows = [h for tag, h in html.headings if tag == "h4"]
    assert hidden and hidden[0] + len(rows) == IDENTITIES + 4
    assert counted == len(rows) * PER


def test_a_limit_below_the_text_is_an_error_not_a_larger_page(many, tmp_path):
    out = tmp_path / "r.html"
    result = report(many, out, "2KB")
    assert result.exit_code == 1
    assert result.output.startswith("Error: --max-bytes 2,000 is too small")
    assert "Traceback" not in result.output
    assert not out.exists()


def test_progress_is_reported_through_a_callback(many, tmp_path):
    calls = []
    options = ReportOptions(identities=10, per_identity=3, max_bytes=1_000_000)
    progress = lambda phase, *a: calls.append(a) if phase == "thumbnails" else None  # noqa: E731
    write_report(many, tmp_path / "r.html", options=options, progress=progress)
    total = (10 + 4) * 3
    assert calls[-1] == (total, total)
    assert [done for done, _ in calls] == list(range(1, total + 1))
