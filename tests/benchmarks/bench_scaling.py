"""How verify, info, report and repack scale: time and memory per record at 1M and 10M records.

Run: `python tests/benchmarks/bench_scaling.py [--records N ...] [--folder DIR] [--keep]`.
Issue 22 asks that these commands hold no per-record Python objects for the whole run. On
bench_scale.py's synthetic packs (176-byte records of a valid 8x8 JPEG, ~21 images an identity, with
the binary index `rectool index` writes; default 1,000,000 and 10,000,000 records, generated outside
the repository and deleted afterwards), each command runs through the CLI from a warm page cache,
and its peak **anonymous** memory (RssAnon, sampled from /proc every 10 ms) is reported beside its
peak RSS: the mapped .rec's pages count in RSS though they are the page cache's. The figure that
shows scaling is the anonymous bytes per record at the largest size, and how it grows from the
smallest: flat per record means memory linear in the pack, with no per-record objects beyond numpy
columns. No limit is set here (the issue names none); the figures go to docs/benchmarks.md.

`run()` returns the figures for run_all.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_scale import generate  # noqa: E402
from common import RECTOOL  # noqa: E402

SIZES = (1_000_000, 10_000_000)
TARGETS: list = []  # measured, not limited (see the docstring)


def _status_kib(pid, fields):
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in fields:
            out[name] = int(value.split()[0])
    return out


def measure(cmd):
    """Run `cmd`; return (seconds, peak RssAnon MiB, peak RSS MiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    anon = hwm = 0
    while proc.poll() is None:
        got = _status_kib(proc.pid, ("RssAnon", "VmHWM"))
        anon, hwm = max(anon, got.get("RssAnon", 0)), max(hwm, got.get("VmHWM", 0))
        time.sleep(0.01)
    seconds = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode not in (0, 3):
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{err[-2000:]}")
    return seconds, anon / 1024, hwm / 1024


def commands(prefix, out):
    return {
        "verify": [*RECTOOL, "verify", str(prefix), "-q"],
        "info": [*RECTOOL, "info", str(prefix)],
        "report": [*RECTOOL, "report", str(prefix), "-o", str(out / "report.html")],
        "repack_identity": [*RECTOOL, "repack", str(prefix), str(out / "identity"), "-q"],
        "repack_shuffle": [
            *RECTOOL,
            "repack",
            str(prefix),
            str(out / "shuffle"),
            "-q",
            "--order",
            "shuffle",
        ],
    }


def run(sizes=SIZES, folder=None, keep=False, log=print):
    base = Path(folder or tempfile.mkdtemp(prefix="rectool-scaling-"))
    result = {"sizes": list(sizes), "commands": {}}
    try:
        for records in sizes:
            where = base / f"pack-{records}"
            prefix = generate(where, records, log=log)
            subprocess.run(["cat", f"{prefix}.rec", f"{prefix}.idx"], stdout=subprocess.DEVNULL)
            for name, cmd in commands(prefix, where).items():
                seconds, anon, rss = measure(cmd)
                row = result["commands"].setdefault(name, {})
                row[str(records)] = {
                    "seconds": round(seconds, 2),
                    "peak_anon_mib": round(anon, 1),
                    "peak_rss_mib": round(rss, 1),
                    "anon_bytes_per_record": round(anon * 2**20 / records, 1),
                    "us_per_record": round(seconds * 1e6 / records, 3),
                }
                log(
                    f"{name} of {records:,} records: {seconds:.1f} s, peak anonymous "
                    f"{anon:,.0f} MiB ({anon * 2**20 / records:.0f} B a record), peak RSS "
                    f"{rss:,.0f} MiB"
                )
            if not keep:
                shutil.rmtree(where, ignore_errors=True)
    finally:
        if not keep and folder is None:
            shutil.rmtree(base, ignore_errors=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--folder", help="where the packs go (outside the repository)")
    parser.add_argument("--keep", action="store_true", help="keep the generated packs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = run(args.records, args.folder, args.keep)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
