"""A manifest says when and by which rectool version a pack was made; the report shows it."""

import datetime
import json
import subprocess
import sys

import pytest
from helpers.rec_files import make_pack

from rectool import __version__
from rectool.errors import UsageError
from rectool.packer.manifest import created_time


def test_created_is_now_in_utc_without_source_date_epoch():
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    stamp = created_time({})
    after = datetime.datetime.now(datetime.timezone.utc)
    when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc
    )
    assert before <= when <= after


def test_source_date_epoch_fixes_the_instant():
    assert created_time({"SOURCE_DATE_EPOCH": "0"}) == "1970-01-01T00:00:00Z"
    assert created_time({"SOURCE_DATE_EPOCH": "1764547200"}) == "2025-12-01T00:00:00Z"


def test_a_source_date_epoch_that_is_no_number_is_a_usage_error():
    with pytest.raises(UsageError, match="SOURCE_DATE_EPOCH='yesterday'"):
        created_time({"SOURCE_DATE_EPOCH": "yesterday"})


def test_pack_records_date_and_version_and_the_report_shows_them(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    made = make_pack(tmp_path)
    manifest = json.loads(made.manifest.read_text())
    assert manifest["created"] == "2023-11-14T22:13:20Z"
    assert manifest["rectool_version"] == __version__
    html = tmp_path / "r.html"
    subprocess.run(
        [sys.executable, "-m", "rectool", "report", str(made.manifest), "-o", str(html)],
        check=True,
        capture_output=True,
    )
    page = html.read_text()
    assert "2023-11-14T22:13:20Z" in page
    assert "not recorded" not in page
