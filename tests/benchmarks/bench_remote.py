"""First-epoch Loader throughput from a local S3 server with a cold cache, against local disk.

A pack of `--images` 112x112 JPEGs in shards of 2,000 (packed once under
`.bench-cache/remote/`) is uploaded to moto's S3 server on 127.0.0.1 (tests/helpers/servers.py).
In turns (best of `--repeats`):

- **local**: `open_dataset(local manifest)`, `Loader(workers=2, batch_size=128)`, one epoch;
- **s3 cold**: `open_dataset("s3://...", cache_dir=<empty folder>)`, the same Loader, one epoch:
  open, labels, prefetching and every download inside the time;
- **s3 cold + 50 ms**: the same with the server waiting 50 ms before every answer.

Ratios are images/s of the remote runs over local's (>= 0.8 and >= 0.7 promised).

    python tests/benchmarks/bench_remote.py [--images 24000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: helpers.servers
from common import CACHE  # noqa: E402

TARGETS = [
    ("cold_over_local", "first epoch, Loader: S3 cold cache / local disk (images/s)", ">=", 0.8),
    (
        "cold_latency_over_local",
        "first epoch, Loader: S3 cold cache, 50 ms a request / local disk (images/s)",
        ">=",
        0.7,
    ),
]
SHARD_RECORDS, SIDE, BATCH, WORKERS = 2_000, 112, 128, 2


def ensure_pack(images, log=print):
    """Return the manifest of a pack of `images` synthetic JPEGs, packed once."""
    folder = CACHE / "remote" / f"{images}"
    manifest = folder / "out" / "faces.manifest.json"
    if manifest.exists():
        return manifest
    log(f"writing {images:,} JPEGs and packing them under {folder} ...")
    root, rng = folder / "tree", np.random.default_rng(0)
    lines = []
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    for i in range(images):
        identity = i // 50
        (root / f"{identity:05d}").mkdir(parents=True, exist_ok=True)
        base = (np.sin(xx / (5 + i % 7)) + np.cos(yy / (4 + identity % 9))) * 60 + 128
        noise = rng.normal(0, 12, (SIDE, SIDE, 3))
        image = np.clip(base[..., None] + noise, 0, 255).astype(np.uint8)
        rel = f"{identity:05d}/{i:06d}.jpg"
        cv2.imwrite(str(root / rel), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        lines.append(f"{i}\t{identity:f}\t{rel}\n")
    lst = folder / "faces.lst"
    lst.write_text("".join(lines), encoding="utf-8")
    out = folder / "out" / "faces"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rectool",
            "pack",
            str(lst),
            str(root),
            str(out),
            "-q",
            "--shard-records",
            str(SHARD_RECORDS),
            "--overwrite",
        ],
        check=True,
    )
    return manifest


def epoch(ds):
    """Return the seconds of one Loader epoch over `ds`, construction included, and its count."""
    from rectool.training import Loader

    start = time.perf_counter()
    n = 0
    with Loader(ds, batch_size=BATCH, workers=WORKERS, seed=0, size=(SIDE, SIDE)) as loader:
        for images, _ in loader:
            n += len(images)
    return time.perf_counter() - start, n


def run(images=24_000, repeats=2, log=print):
    from helpers.servers import S3Server, no_wait, use_env

    from rectool import open_dataset
    from rectool.remote import Retry

    manifest = ensure_pack(images, log)
    server = S3Server()
    restore = use_env(server.env)
    scratch = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    try:
        server.upload_folder("bench", manifest.parent, "packs/")
        url = "s3://bench/packs/faces.manifest.json"

        def local():
            start = time.perf_counter()
            seconds, n = epoch(open_dataset(str(manifest)))
            return time.perf_counter() - start, n

        def cold(latency):
            cache = scratch / f"cache-{time.monotonic_ns()}"
            server.faults.latency = latency
            try:
                start = time.perf_counter()
                ds = open_dataset(url, cache_dir=str(cache), retry=Retry(sleep=no_wait))
                _, n = epoch(ds)
                return time.perf_counter() - start, n
            finally:
                server.faults.latency = 0.0
                shutil.rmtree(cache, ignore_errors=True)

        best = {"local": None, "cold": None, "cold_latency": None}
        for turn in range(repeats):
            for name, fn in (
                ("local", local),
                ("cold", lambda: cold(0.0)),
                ("cold_latency", lambda: cold(0.05)),
            ):
                seconds, n = fn()
                assert n == images, (name, n)
                log(f"turn {turn}: {name}: {seconds:.2f} s, {n / seconds:,.0f} images/s")
                best[name] = seconds if best[name] is None else min(best[name], seconds)
    finally:
        restore()
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    rec_bytes = sum(p.stat().st_size for p in manifest.parent.glob("*.rec"))
    return {
        "images": images,
        "shards": -(-images // SHARD_RECORDS),
        "rec_mb": round(rec_bytes / 1e6, 1),
        "images_per_s": {k: round(images / v) for k, v in best.items()},
        "cold_over_local": best["local"] / best["cold"],
        "cold_latency_over_local": best["local"] / best["cold_latency"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=24_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(run(args.images, args.repeats, log=print), indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
