"""Side by side on the benchmark tree: `rectool list`, im2rec's `--list --recursive`, `find`.

Targets (issue 3): rectool at least 5x faster than
`python -m mxnet.tools.im2rec PREFIX ROOT --list --recursive`, and within 5x of
`find ROOT -type f`. Each command runs several times, alternating, and the best time counts
(the tree is in the page cache after the first run, for all three alike).

rectool is timed as the `rectool list` command (a fresh interpreter: its imports count), and
as the library call `list_images` in this warm interpreter (scan and write only), with the
default threads and with one. The targets are checked on the command; the exit status is 1
when one is missed. Last, a scan with 1 ms added to every folder listing (a stand-in for a
network file system) shows what the threads are for.

    python tests/benchmarks/bench_list.py [--images N --identities K] [--repeats R]

The last line printed is the result as one JSON object (`run()` returns it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import oracle_python  # noqa: E402
from tree import DEFAULT_IDENTITIES, DEFAULT_IMAGES, ensure_tree  # noqa: E402

from rectool.packer import listing as listing_module  # noqa: E402
from rectool.packer.listfile import read_list  # noqa: E402
from rectool.packer.listing import default_threads, list_images  # noqa: E402

IM2REC_FASTER_BY = 5.0
WITHIN_FIND = 5.0


def rectool_command():
    """Return the `rectool` console script beside this interpreter, else `python -m rectool`."""
    script = Path(sys.executable).with_name("rectool")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rectool"]


def time_command(cmd, cwd=None):
    """Run `cmd` (output discarded); return its wall-clock seconds."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return seconds


def time_library(root, out, threads=None):
    start = time.perf_counter()
    list_images(root, out, threads=threads, overwrite=True)
    return time.perf_counter() - start


def time_scan_with_latency(root, threads, latency=0.001):
    """Return seconds to scan `root` when every folder listing first waits `latency` seconds.

    A stand-in for a network file system, where opening a folder is a round trip: it shows
    what the threads buy there (here, on a local disk with a warm cache, they buy nothing).
    """
    real = os.scandir

    def slow_scandir(path="."):
        time.sleep(latency)
        return real(path)

    listing_module.os.scandir = slow_scandir
    try:
        start = time.perf_counter()
        listing_module.walk_tree(root, threads=threads)
        return time.perf_counter() - start
    finally:
        listing_module.os.scandir = real


def check_same_images(ours, theirs):
    """Check that rectool and im2rec list the same images with the same folder labels."""
    mine = {(item.path, item.label) for item in read_list(ours)}
    im2rec = {(item.path, item.label) for item in read_list(theirs)}
    if mine != im2rec:
        raise AssertionError(f"the lists differ: {len(mine ^ im2rec)} lines in one only")
    return len(mine)


def run(tree_path, repeats=5, im2rec_repeats=3, log=print):
    """Time the three listers on `tree_path`; return the figures and whether targets are met."""
    root = str(tree_path)
    python = oracle_python()
    with tempfile.TemporaryDirectory(prefix="bench-list-") as tmp:
        ours = os.path.join(tmp, "ours.lst")
        commands = {
            "find": ["find", root, "-type", "f"],
            "rectool_cli": [*rectool_command(), "list", root, ours, "--quiet", "--overwrite"],
            "im2rec": [python, "-m", "mxnet.tools.im2rec", os.path.join(tmp, "im2rec"), root]
            + ["--list", "--recursive"],
        }
        times = {name: [] for name in [*commands, "rectool_library", "rectool_library_1"]}
        for round_ in range(repeats):
            for name, cmd in commands.items():
                if name == "im2rec" and round_ >= im2rec_repeats:
                    continue
                times[name].append(time_command(cmd, cwd=tmp))
            lib = os.path.join(tmp, "lib.lst")
            times["rectool_library"].append(time_library(root, lib))
            times["rectool_library_1"].append(time_library(root, lib, threads=1))
        images = check_same_images(ours, os.path.join(tmp, "im2rec.lst"))
    best = {name: min(values) for name, values in times.items()}
    latency = {threads: time_scan_with_latency(root, threads) for threads in (1, default_threads())}
    ratios = {
        "im2rec_over_rectool_cli": best["im2rec"] / best["rectool_cli"],
        "rectool_cli_over_find": best["rectool_cli"] / best["find"],
        "im2rec_over_rectool_library": best["im2rec"] / best["rectool_library"],
        "rectool_library_over_find": best["rectool_library"] / best["find"],
    }
    targets = {
        f"im2rec >= {IM2REC_FASTER_BY:g}x rectool": ratios["im2rec_over_rectool_cli"]
        >= IM2REC_FASTER_BY,
        f"rectool <= {WITHIN_FIND:g}x find": ratios["rectool_cli_over_find"] <= WITHIN_FIND,
    }
    for name, seconds in best.items():
        log(f"{name:>16}: {seconds:7.3f} s  (best of {len(times[name])})")
    for name, value in ratios.items():
        log(f"{name:>28}: {value:6.2f}")
    for threads, seconds in latency.items():
        log(f"scan with 1 ms per folder listing, {threads:>2} threads: {seconds:6.3f} s")
    for name, ok in targets.items():
        log(f"target {name}: {'met' if ok else 'MISSED'}")
    return {
        "benchmark": "list",
        "tree": root,
        "images": images,
        "threads": default_threads(),
        "cpus": os.cpu_count(),
        "seconds": {name: round(value, 4) for name, value in best.items()},
        "ratios": {name: round(value, 2) for name, value in ratios.items()},
        "scan_with_1ms_latency_s": {str(k): round(v, 3) for k, v in latency.items()},
        "targets": targets,
        "passed": all(targets.values()),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES)
    parser.add_argument("--identities", type=int, default=DEFAULT_IDENTITIES)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    root = ensure_tree(args.images, args.identities, log=lambda t: print(t, file=sys.stderr))
    result = run(root, repeats=args.repeats)
    print(json.dumps(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
