"""`run_all.py --update --only X`: re-run some benchmarks, keep the others, name each run."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))

import figures  # noqa: E402
import run_all  # noqa: E402

TODAY = datetime.date(2026, 3, 4)
OLD_PAGE = """# Benchmarks

Written by `make bench` on 2026-01-02; every figure below comes from that one run.

## Raw results

```json
{"index": {"cold_s": 0.25, "mxnet_over_cold": 3},
 "recordio": {"ratio": 7.5}}
```
"""


@pytest.fixture
def page(tmp_path, monkeypatch):
    path = tmp_path / "benchmarks.md"
    path.write_text(OLD_PAGE, encoding="utf-8")
    monkeypatch.setattr(run_all, "versions", lambda: {"rectool": "test"})
    monkeypatch.setattr(run_all, "machine", lambda: "a test machine")
    monkeypatch.setitem(run_all.BENCHMARKS, "recordio", lambda log: {"ratio": 4.0})
    return path


def _raw(path):
    text = path.read_text(encoding="utf-8")
    start = text.index("```json\n", text.index("## Raw results")) + len("```json\n")
    return json.loads(text[start : text.index("\n```", start)])


def test_update_reruns_only_the_named_benchmarks_and_keeps_the_rest(page, monkeypatch):
    run_all.main(["--only", "recordio", "--update", "--output", str(page)], today=TODAY)
    raw = _raw(page)
    assert raw["index"]["cold_s"] == 0.25
    assert raw["index"]["run"] == {"date": "2026-01-02", "command": "make bench"}
    assert raw["recordio"]["ratio"] == 4.0
    assert raw["recordio"]["run"] == {
        "date": "2026-03-04",
        "command": "python tests/benchmarks/run_all.py --update --only recordio",
    }
    text = page.read_text(encoding="utf-8")
    assert (
        "| recordio | random read_idx: rectool.recordio / mxnet.recordio | 4.00 | >= 5 | MISSED |"
        in text
    )
    assert "| index | parse a 6M-line .idx text (seconds) | 0.25 |" in text
    assert (
        "Runs: index: `make bench` on 2026-01-02; recordio: "
        "`python tests/benchmarks/run_all.py --update --only recordio` on 2026-03-04." in text
    )
    monkeypatch.setenv(figures.BENCHMARKS_ENV, str(page))
    assert figures.date("index") == "2026-01-02"
    assert figures.date("recordio") == "2026-03-04"


def test_without_update_the_page_holds_only_this_run(page, monkeypatch):
    run_all.main(["--only", "recordio", "--output", str(page)], today=TODAY)
    assert set(_raw(page)) == {"recordio"}
    assert (
        "Written by `python tests/benchmarks/run_all.py --only recordio` on 2026-03-04; every"
        in (page.read_text(encoding="utf-8"))
    )


def test_update_needs_only(page):
    with pytest.raises(SystemExit):
        run_all.main(["--update", "--output", str(page)], today=TODAY)


def test_a_row_without_a_limit_is_information_not_a_verdict(monkeypatch):
    # Issue 38: non-durable peers (`tar cf`, `cp` without sync) stay on the page as information.
    monkeypatch.setitem(
        run_all.TARGETS,
        "pack",
        [("a", "ours / durable peer", "<=", 1.3), ("b", "ours / peer, not durable", None, None)],
    )
    rows = run_all.table({"pack": {"a": 1.5, "b": 2.25}})
    assert rows[2:] == [
        "| pack | ours / durable peer | 1.50 | <= 1.3 | MISSED |",
        "| pack | ours / peer, not durable | 2.25 | | information |",
    ]


def test_pack_and_repack_are_held_to_durable_peers():
    import bench_pack
    import bench_repack

    limits = {key: (op, limit) for key, _, op, limit in bench_pack.TARGETS + bench_repack.TARGETS}
    assert limits["ratio_pass_through_vs_tar_sync"] == ("<=", 1.3)
    assert limits["ratio_pass_through_vs_tar"] == (None, None)
    assert limits["speedup_pass_through_vs_im2rec_cpu"] == (">=", 4.0)
    assert limits["ratios.identity_over_cp_sync"] == ("<=", 1.5)
    assert limits["ratios.shuffle_over_cp_sync"] == ("<=", 2.0)
    assert limits["ratios.identity_over_cp"] == (None, None)
