"""Time random `read_idx` through rectool.recordio against MXNet 1.9.1's mxnet.recordio.

The .rec (RECORDS records of 2-4 KB, keys 0..N-1, written by rectool.recordio) is built under
`.bench-cache/recordio/`; both sides read the same READS keys in the same random order, with
the file in the OS page cache. Each side's time is the best of REPEATS passes in each of ROUNDS
processes, the two sides' processes taking turns so that a change in the machine's load falls
on both; the open (the .idx parse) is not timed.

    python tests/benchmarks/bench_recordio.py [--records N] [--reads N]

Prints both rates and the ratio; exits 1 when rectool is under 5x MXNet's rate.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import CACHE, oracle_python  # noqa: E402

from rectool import recordio  # noqa: E402

REPEATS = 5
ROUNDS = 3
TIMED = """
import sys, time
import numpy as np
{import_line}
idx, rec, order = sys.argv[1], sys.argv[2], np.load(sys.argv[3]).tolist()
r = recordio.MXIndexedRecordIO(idx, rec, "r")
best = float("inf")
for _ in range({repeats}):
    start = time.perf_counter()
    for key in order:
        r.read_idx(key)
    best = min(best, time.perf_counter() - start)
print(best)
"""


def build(records):
    folder = CACHE / "recordio"
    folder.mkdir(parents=True, exist_ok=True)
    idx, rec = folder / f"bench-{records}.idx", folder / f"bench-{records}.rec"
    if not rec.exists():
        rng = np.random.default_rng(0)
        w = recordio.MXIndexedRecordIO(str(idx), str(rec) + ".tmp", "w")
        for key in range(records):
            body = rng.integers(0, 256, int(rng.integers(2048, 4096)), dtype=np.uint8)
            w.write_idx(
                key, recordio.pack(recordio.IRHeader(0, key % 1000, key, 0), body.tobytes())
            )
        w.close()
        Path(str(rec) + ".tmp").rename(rec)
    return idx, rec


def timed(python, import_line, idx, rec, order):
    code = TIMED.format(import_line=import_line, repeats=REPEATS)
    out = subprocess.run(
        [str(python), "-c", code, str(idx), str(rec), str(order)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[-1])


def run(records=50_000, reads=20_000):
    """Return {"rectool_s", "mxnet_s", "ratio", "reads"} for `reads` random read_idx calls."""
    idx, rec = build(records)
    order = CACHE / "recordio" / "order.npy"
    np.save(order, np.random.default_rng(1).integers(0, records, reads))
    python = oracle_python()
    ours = theirs = float("inf")
    for _ in range(ROUNDS):
        ours = min(ours, timed(sys.executable, "from rectool import recordio", idx, rec, order))
        theirs = min(theirs, timed(python, "from mxnet import recordio", idx, rec, order))
    return {"rectool_s": ours, "mxnet_s": theirs, "ratio": theirs / ours, "reads": reads}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--reads", type=int, default=20_000)
    args = parser.parse_args()
    started = time.perf_counter()
    f = run(args.records, args.reads)
    print(
        f"random read_idx, {f['reads']:,} reads of {args.records:,} records: "
        f"rectool {f['reads'] / f['rectool_s']:,.0f}/s, MXNet {f['reads'] / f['mxnet_s']:,.0f}/s, "
        f"{f['ratio']:.1f}x ({time.perf_counter() - started:.0f} s in all)"
    )
    return 0 if f["ratio"] >= 5 else 1


if __name__ == "__main__":
    sys.exit(main())
