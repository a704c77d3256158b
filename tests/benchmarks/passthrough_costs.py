"""Where a pass-through image's time goes: the system calls, and everything else.

Run: `python tests/benchmarks/passthrough_costs.py` (after `make bench` has built the tree).
Times, on a warm page cache, a bare loop of `os.open` + `os.readv` + `os.close` over every
file of the benchmark list, then rectool's block loop (`PassThroughPacker.fill`, structure
check included) over the same list, without writing anything.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import CACHE  # noqa: E402

from rectool.packer.listfile import iter_list  # noqa: E402
from rectool.packer.passthrough import PassThroughPacker  # noqa: E402


def system_calls(paths):
    buffer = memoryview(bytearray(1 << 20))
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.readv(fd, [buffer[64:]])
        os.close(fd)


def blocks(root, items):
    packer = PassThroughPacker(root)
    source = iter(items)
    while (block := packer.fill(source, 1024)) is not None:
        for _ in block.runs():
            pass


def main(repeats=5):
    root, lst = CACHE / "tree-100k", CACHE / "pack-bench" / "tree.lst"
    if not lst.exists():
        sys.exit(f"{lst} is missing: run `make bench` (or bench_pack.py) first")
    with open(lst, encoding="utf-8") as f:
        items = list(iter_list(f, str(lst)))
    paths = [os.path.join(root, item.path) for item in items]
    print(f"{len(items)} images under {root}, warm page cache, best of {repeats}:")
    for name, run in [
        ("open + readv + close, bare loop", lambda: system_calls(paths)),
        ("rectool pass-through blocks (no writes)", lambda: blocks(root, items)),
    ]:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        print(f"  {name:<42} {best / len(items) * 1e6:6.2f} us an image")


if __name__ == "__main__":
    main()
