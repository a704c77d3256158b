"""The docs' performance figures, read from docs/benchmarks.md (which `make bench` writes).

The pages quote figures only through cog blocks that call these functions, so `make docs`
regenerates them from the last benchmark run and `make test` (tests/test_docs_figures.py)
fails when a page and docs/benchmarks.md disagree:

    <!-- [[[cog
    from figures import table
    table(("pack", "pass-through: im2rec time / ours"))
    ]]] -->
    <!-- [[[end]]] -->
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
# Another benchmarks page (a test makes one that disagrees with the docs).
BENCHMARKS_ENV = "RECTOOL_BENCHMARKS_MD"
# A row with a target (met or MISSED) or without one (information).
ROW = re.compile(
    r"^\| (\w+) \| (.+?) \| ([\d.]+) \| (?:([<>]=) ([\d.]+) )?\| (met|MISSED|information) \|$"
)


def _text():
    return Path(os.environ.get(BENCHMARKS_ENV, BENCHMARKS)).read_text(encoding="utf-8")


def rows():
    """{(benchmark, what): (measured, op, limit, verdict)} for every row of the table."""
    found = {}
    for line in _text().splitlines():
        match = ROW.match(line)
        if match:
            name, what, measured, op, limit, verdict = match.groups()
            found[(name, what)] = (measured, op, limit, verdict)
    return found


def row(benchmark, what):
    """The table's row, or KeyError naming it (a renamed row fails `make docs`)."""
    table_rows = rows()
    if (benchmark, what) not in table_rows:
        raise KeyError(f"docs/benchmarks.md has no row {benchmark!r} | {what!r}")
    return table_rows[(benchmark, what)]


def raw(path):
    """A value of the raw results (the JSON under "## Raw results"), by dotted key path."""
    text = _text()
    start = text.index("```json\n", text.index("## Raw results")) + len("```json\n")
    value = json.loads(text[start : text.index("\n```", start)])
    for part in path.split("."):
        value = value[part]
    return value


def date(benchmark):
    """The day of the run that measured `benchmark` (`run_all.py --update` re-runs some)."""
    run = raw(benchmark).get("run")
    if run:
        return run["date"]
    return re.search(r"on (\d{4}-\d{2}-\d{2});", _text()).group(1)


def table(*keys):
    """Write (with cog) a Markdown table of the named rows, row names as in the source."""
    import cog

    days = ", ".join(sorted({date(benchmark) for benchmark, _ in keys}))
    cog.outl(f"| benchmark | ratio (`make bench`, {days}) | measured | target | verdict |")
    cog.outl("|---|---|---|---|---|")
    for benchmark, what in keys:
        measured, op, limit, verdict = row(benchmark, what)
        target = f" {op} {limit} " if op else " "
        cog.outl(f"| {benchmark} | {what} | {measured} |{target}| {verdict} |")


def rate(path):
    """A rate of the raw results, rounded to three figures: 17,400."""
    value = float(raw(path))
    digits = max(0, len(str(int(value))) - 3)
    return f"{round(value, -digits):,.0f}"
