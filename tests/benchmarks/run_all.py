"""Run every side-by-side benchmark and write the table to docs/benchmarks.md (`make bench`).

Each `bench_*.py` module has `run(...) -> dict`; `TARGETS` below names, per benchmark, the
ratios the issues promise: (key path in the result, what, "<=" or ">=", limit). The table
shows ratios, not absolute times: this machine is shared and noisy, so only figures measured
side by side in one run mean anything.

`--update --only NAME...` re-runs some benchmarks and keeps the others' results from the page
(each result carries the day and command of its run, `"run"`, which the page states): a long
full run is not needed to refresh the rows a change touched, and no row is ever quoted under
another run's date.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import REPO, oracle_python  # noqa: E402
from tree import ensure_tree  # noqa: E402

BENCHMARKS = {
    "list": lambda log: _module("bench_list").run(ensure_tree(log=log), log=log),
    "index": lambda log: _module("bench_index").run(),
    "pack": lambda log: _module("bench_pack").run(log=log),
    "verify": lambda log: _module("bench_verify").run(log=log),
    "read": lambda log: _module("bench_read").run(log=log),
    "report": lambda log: _module("bench_report").run(log=log),
    "train": lambda log: _module("bench_train").run(log=log),
    "repack": lambda log: _module("bench_repack").run(log=log),
    "scale": lambda log: _module("bench_scale").run(log=log),
    "scaling": lambda log: _module("bench_scaling").run(log=log),
    "scaling_10m": lambda log: _module("bench_scaling").run_against(10_000_000, 1_000_000, log=log),
    "scaling_42m": lambda log: _module("bench_scaling").run_against(
        42_000_000, 1_000_000, log=log, only=["list"]
    ),
    "remote": lambda log: _module("bench_remote").run(log=log),
    "recordio": lambda log: _module("bench_recordio").run(),
    "archives": lambda log: _module("bench_archives").run(log=log),
}


OPT_IN = {"scaling_10m", "scaling_42m"}  # half an hour each: --only, not `make bench`


def _module(name):
    return importlib.import_module(name)


TARGETS = {
    "list": [
        ("ratios.im2rec_over_rectool_cli", "im2rec --list time / `rectool list` time", ">=", 5),
        ("ratios.rectool_cli_over_find", "`rectool list` time / `find -type f` time", "<=", 5),
    ],
    "index": [
        ("cold_s", "parse a 6M-line .idx text (seconds)", "<=", 0.5),
        ("mxnet_over_cold", "MXNet .idx open time / ours, parsing the text", ">=", 1),
    ],
    "pack": _module("bench_pack").TARGETS,
    "verify": _module("bench_verify").TARGETS,
    "report": _module("bench_report").TARGETS,
    "train": _module("bench_train").TARGETS,
    "repack": _module("bench_repack").TARGETS,
    "scale": _module("bench_scale").TARGETS,
    "scaling": _module("bench_scaling").TARGETS,
    "scaling_10m": _module("bench_scaling").TARGETS_10M,
    "scaling_42m": _module("bench_scaling").TARGETS_42M,
    "remote": _module("bench_remote").TARGETS,
    "archives": _module("bench_archives").TARGETS,
    "recordio": [
        ("ratio", "random read_idx: rectool.recordio / mxnet.recordio", ">=", 5),
    ],
    "read": [
        ("raw_vs_mxnet", "random raw reads: ours / MXNet read_idx + unpack", ">=", 5),
        ("raw_vs_bare", "random raw reads: ours / bare mmap + struct loop", ">=", 0.5),
        ("decoded_vs_gluon", "decoded reads: ours / gluon ImageRecordDataset", ">=", 3),
        ("loader_vs_iter", "DataLoader 2 workers: ours / ImageRecordIter 2 threads", ">=", 2),
        (
            "batch_decoder_vs_iter",
            "DataLoader 2 workers + BatchDecoder: ours / ImageRecordIter 2 threads",
            ">=",
            2,
        ),
        ("raw_vs_folder", "random raw reads: ours / one file per sample (ImageFolder)", ">=", 1),
        ("decoded_vs_folder", "decoded reads: ours / one file per sample (ImageFolder)", ">=", 1),
    ],
}


def _lookup(result, path):
    for part in path.split("."):
        if not isinstance(result, dict) or part not in result:
            return None
        result = result[part]
    return result


def versions():
    """Return the versions that matter for the figures."""
    import cv2
    import numpy

    mxnet = (
        subprocess.run(
            [oracle_python(), "-c", "import mxnet; print(mxnet.__version__)"],
            capture_output=True,
            text=True,
            check=False,
        )
        .stdout.strip()
        .splitlines()
    )
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    import rectool

    return {
        "rectool": rectool.__version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "opencv": cv2.__version__,
        "torch": torch_version,
        "mxnet (oracle)": mxnet[-1] if mxnet else "unknown",
    }


def machine():
    """Return a one-line description of this machine."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    system = f"{platform.system()} {platform.release()}"
    return f"{os.cpu_count()} cores ({model}), {memory:.0f} GiB, {system}"


def table(results):
    """Return the Markdown rows of every target of every benchmark that ran."""
    rows = ["| benchmark | ratio | measured | target | verdict |", "|---|---|---|---|---|"]
    for name, result in results.items():
        if "error" in result:
            rows.append(f"| {name} | (failed: {result['error']}) | | | |")
            continue
        for key, what, op, limit in TARGETS[name]:
            value = _lookup(result, key)
            if value is None:
                continue
            if op is None:  # information beside a target's row: no limit of its own
                rows.append(f"| {name} | {what} | {value:.2f} | | information |")
                continue
            ok = value >= limit if op == ">=" else value <= limit
            rows.append(
                f"| {name} | {what} | {value:.2f} | {op} {limit:g} | {'met' if ok else 'MISSED'} |"
            )
    return rows


def previous_results(path):
    """The raw results on an earlier page, each stamped with its run (page date, `make bench`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    start = text.index("```json\n", text.index("## Raw results")) + len("```json\n")
    results = json.loads(text[start : text.index("\n```", start)])
    header = re.search(r"Written by `([^`]+)` on (\d{4}-\d{2}-\d{2})", text)
    command, day = header.groups() if header else ("make bench", "unknown day")
    for result in results.values():
        result.setdefault("run", {"date": day, "command": command})
    return results


def runs_sentence(results):
    """Say which run measured which benchmarks: one run, or each run and its benchmarks."""
    runs = {}
    for name, result in results.items():
        run = result.get("run", {})
        runs.setdefault((run.get("date"), run.get("command")), []).append(name)
    if len(runs) == 1:
        (day, command), _ = runs.popitem()
        return (
            f"Written by `{command}` on {day}; every figure below comes from that one run, "
            "each comparison measured side by side with its peer."
        )
    parts = [
        f"{', '.join(names)}: `{command}` on {day}"
        for (day, command), names in sorted(runs.items(), key=lambda item: str(item[0]))
    ]
    return (
        "Measured in several runs; every figure of one benchmark comes from one run, each "
        "comparison measured side by side with its peer. Runs: " + "; ".join(parts) + "."
    )


def write_markdown(results, path):
    lines = [
        "# Benchmarks",
        "",
        runs_sentence(results),
        "",
        f"Machine: {machine()}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()) + ".",
        "",
        "This machine is shared and noisy: absolute times drift between runs, so the table "
        "promises ratios (ours / peer or peer / ours as labelled), not seconds.",
        "",
        *table(results),
        "",
        "## Raw results",
        "",
        "```json",
        json.dumps(results, indent=2, default=str),
        "```",
        "",
    ]
    Path(path).write_text("\n".join(lines), encoding="utf-8")


def main(argv=None, today=None):
    """Run the benchmarks; `today` (a date) stamps their run (tests pass one)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHMARKS), help="run only these")
    parser.add_argument("--output", default=str(REPO / "docs" / "benchmarks.md"))
    parser.add_argument(
        "--update", action="store_true", help="keep the other benchmarks' results from --output"
    )
    args = parser.parse_args(argv)
    if args.update and not args.only:
        parser.error("--update needs --only")
    command = (
        "make bench"
        if not args.only
        else "python tests/benchmarks/run_all.py "
        + ("--update " if args.update else "")
        + f"--only {' '.join(args.only)}"
    )
    run = {"date": (today or datetime.date.today()).isoformat(), "command": command}

    def log(message):
        print(message, file=sys.stderr, flush=True)

    results = previous_results(args.output) if args.update else {}
    for name in args.only or [name for name in BENCHMARKS if name not in OPT_IN]:
        log(f"== {name}")
        try:
            results[name] = BENCHMARKS[name](log)
        except Exception as exc:  # one failing benchmark must not hide the others' figures
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["run"] = run
        log(json.dumps(results[name], default=str))
    results = {name: results[name] for name in BENCHMARKS if name in results}
    write_markdown(results, args.output)
    print("\n".join(table(results)))
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
