"""Time parsing a 6,000,000-line .idx: rectool's `load_index` vs MXNet.

The limit (issue 14): parsing a 6M-line .idx from its text must take under 0.5 s on this
machine (MXNet's `MXIndexedRecordIO` takes about 6 s, and again in every forked DataLoader
worker). rectool's own packs are read through their binary index (format 3) and parse no text;
the text is parsed where a pack has none yet (a foreign pack opened by the package, `rectool
index`, `verify`). The .idx is built once and kept under `.bench-cache/index/`; it is in the
OS page cache for every contender, MXNet included. Also timed: numpy's bulk text parser
(`np.fromstring`, rectool's previous parser and still its fallback for .idx files whose line
widths vary at random).

    python tests/benchmarks/bench_index.py [--lines N] [--mxnet-runs N] [--no-mxnet]

Exits 1 when either load exceeds the limit. `run()` returns the figures for run_all.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import CACHE, best_time  # noqa: E402

from rectool.format.textindex import load_index  # noqa: E402

CACHE_DIR = CACHE / "index"
REPO_ORACLE = CACHE.parent / ".venv-oracle" / "bin" / "python"
LINES = 6_000_000
LIMIT_S = 0.5
OUR_REPEATS = 3

# Only the constructor is timed; importing MXNet takes seconds of its own.
MXNET_OPEN = """
import sys, time
from mxnet import recordio
idx, rec = sys.argv[1], sys.argv[2]
start = time.perf_counter()
r = recordio.MXIndexedRecordIO(idx, rec, "r")
elapsed = time.perf_counter() - start
print(elapsed, len(r.keys))
r.close()
"""


def oracle_python():
    """Return the MXNet interpreter, or None when it is not built (MXNet is then skipped)."""
    configured = os.environ.get("RECTOOL_ORACLE_PYTHON")
    path = Path(configured) if configured else REPO_ORACLE
    return path if path.exists() else None


def build_index(lines=LINES, folder=CACHE_DIR):
    """Return (idx, rec) paths of a `lines`-line .idx, building it once; the .rec is empty."""
    folder.mkdir(parents=True, exist_ok=True)
    idx = folder / f"bench-{lines}.idx"
    rec = folder / f"bench-{lines}.rec"
    if not idx.exists():
        # Keys 0..N-1 and the offsets of records of 4 KB to 60 KB, as a real face dataset has.
        rng = np.random.default_rng(6)
        sizes = 8 + 24 + (rng.integers(4_000, 60_000, lines, dtype=np.int64) + 3) // 4 * 4
        offsets = np.concatenate(([0], np.cumsum(sizes[:-1])))
        text = "".join(f"{k}\t{o}\n" for k, o in zip(range(lines), offsets.tolist()))
        tmp = idx.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text, encoding="ascii", newline="\n")
        os.replace(tmp, idx)
    rec.touch()
    return idx, rec


def time_mxnet(idx, rec, runs):
    """Return MXNet's best open time in seconds and its key count, or (None, None) without MXNet."""
    python = oracle_python()
    if python is None or runs < 1:
        return None, None
    best, count = float("inf"), None
    for _ in range(runs):
        proc = subprocess.run(
            [str(python), "-c", MXNET_OPEN, str(idx), str(rec)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        elapsed, count = proc.stdout.split()[-2:]
        best = min(best, float(elapsed))
    return best, int(count)


def run(lines=LINES, mxnet_runs=1, repeats=OUR_REPEATS):
    """Build (or reuse) the .idx, time every contender and return the figures as a dict."""
    idx, rec = build_index(lines)
    cold_s, (keys, offsets) = best_time(repeats, lambda: load_index(idx))
    if len(keys) != lines or keys[-1] != lines - 1 or not (np.diff(offsets) > 0).all():
        raise RuntimeError(f"{idx}: parsed {len(keys)} keys, expected 0..{lines - 1}")

    data = idx.read_bytes()
    bulk_s, _ = best_time(repeats, lambda: np.fromstring(data, np.int64, sep=" "))

    mxnet_s, mxnet_count = time_mxnet(idx, rec, mxnet_runs)
    if mxnet_count is not None and mxnet_count != lines:
        raise RuntimeError(f"MXNet read {mxnet_count} keys from {idx}, expected {lines}")

    return {
        "benchmark": "index",
        "lines": lines,
        "idx_bytes": idx.stat().st_size,
        "idx": str(idx),
        "cold_s": cold_s,
        "numpy_bulk_s": bulk_s,
        "mxnet_s": mxnet_s,
        "mxnet_over_cold": None if mxnet_s is None else mxnet_s / cold_s,
        "limit_s": LIMIT_S,
        "ok": cold_s < LIMIT_S,
    }


def render(result):
    """Return the result as a small text table."""

    def ratio(seconds):
        if result["mxnet_s"] is None:
            return "n/a"
        return f"{result['mxnet_s'] / seconds:.1f}x"

    mxnet = "not run" if result["mxnet_s"] is None else f"{result['mxnet_s']:.3f} s"
    rows = [
        (
            "rectool load_index",
            f"{result['cold_s']:.3f} s",
            ratio(result["cold_s"]),
        ),
        (
            "numpy np.fromstring(sep=' ') alone",
            f"{result['numpy_bulk_s']:.3f} s",
            ratio(result["numpy_bulk_s"]),
        ),
        ("mxnet MXIndexedRecordIO(idx, rec, 'r')", mxnet, "1.0x" if result["mxnet_s"] else ""),
    ]
    lines = [
        f".idx: {result['lines']:,} lines, {result['idx_bytes'] / 1e6:.1f} MB ({result['idx']})",
        f"{'':40} {'time':>10} {'mxnet/ours':>11}",
        *(f"{name:40} {t:>10} {r:>11}" for name, t, r in rows),
        f"limit: parse < {result['limit_s']} s: {'PASS' if result['ok'] else 'FAIL'}",
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=LINES)
    parser.add_argument("--mxnet-runs", type=int, default=1)
    parser.add_argument("--no-mxnet", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.lines, mxnet_runs=0 if args.no_mxnet else args.mxnet_runs)
    print(render(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
