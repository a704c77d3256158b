"""What one 448x448 source JPEG costs to turn into a 112-pixel one, step by step.

Run: `python tests/benchmarks/jpeg_costs.py` (after `make bench` has built the large tree).
It explains the "4x sources" row of bench_pack: decoding at 1/4 scale skips most of the
inverse DCT and upsampling, but not the entropy decoding of the whole file, which a
grayscale 1/8-scale decode (the least libjpeg can do) shows as a floor.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from bench_pack import LARGE_IMAGES  # noqa: E402
from common import CACHE  # noqa: E402

GRAY_8 = cv2.IMREAD_REDUCED_GRAYSCALE_8


def main(count=800, repeats=5):
    root = CACHE / f"tree-large-{LARGE_IMAGES}"
    if not root.exists():
        sys.exit(f"{root} is missing: run `make bench` (or bench_pack.py) first")
    paths = sorted(str(p) for p in root.rglob("*.jpg"))[:count]
    datas = [Path(p).read_bytes() for p in paths]
    reduced = [cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_REDUCED_COLOR_4) for d in datas]
    full = [cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR) for d in datas]
    quality = [cv2.IMWRITE_JPEG_QUALITY, 95]
    steps = [
        ("full decode (the bare loop)", lambda d, k: cv2.imdecode(d, cv2.IMREAD_COLOR)),
        ("resize 448 -> 112 (the bare loop)", lambda d, k: cv2.resize(full[k], (112, 112))),
        ("decode at 1/4 scale (rectool)", lambda d, k: cv2.imdecode(d, cv2.IMREAD_REDUCED_COLOR_4)),
        ("grayscale 1/8 decode: the floor", lambda d, k: cv2.imdecode(d, GRAY_8)),
        ("encode 112x112 q95 (both)", lambda d, k: cv2.imencode(".jpg", reduced[k], quality)),
    ]
    arrays = [np.frombuffer(d, np.uint8) for d in datas]
    size = sum(map(len, datas)) / len(datas)
    print(f"{len(datas)} JPEGs from {root} ({size / 1024:.1f} KiB on average), one thread:")
    for name, step in steps:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for k, data in enumerate(arrays):
                step(data, k)
            best = min(best, time.perf_counter() - start)
        print(f"  {name:<40} {best / len(arrays) * 1e6:8.1f} us an image")
    print(f"  (OpenCV {cv2.__version__}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
