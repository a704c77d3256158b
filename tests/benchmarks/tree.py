"""Generate and cache the benchmark tree: identity folders of small face-crop-like JPEGs.

The default tree is 100,000 JPEGs of 112x112 pixels (about 6 KB each) in 2,000 identity
folders of 50 images, under `.bench-cache/tree-100k/`. Every benchmark reuses it:

    sys.path.insert(0, str(Path(__file__).parent))
    from tree import ensure_tree
    root = ensure_tree()

A marker file beside the tree (`tree-100k.complete`) is written last, so a tree whose
generation was interrupted is deleted and generated again; a lock file lets several
benchmarks ask for the same tree at once. Run `python tests/benchmarks/tree.py --help`.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".bench-cache"
DEFAULT_IMAGES = 100_000
DEFAULT_IDENTITIES = 2_000
SIDE = 112
QUALITY = 90
# Bump when the generated content changes, so cached trees are regenerated.
VERSION = 1
_GRID = np.mgrid[0:SIDE, 0:SIDE].astype(np.int32)


def tree_path(images=DEFAULT_IMAGES, identities=DEFAULT_IDENTITIES):
    """Return where the tree of that size is cached (`tree-100k` for the default one)."""
    if (images, identities) == (DEFAULT_IMAGES, DEFAULT_IDENTITIES):
        return CACHE / "tree-100k"
    return CACHE / f"tree-{images}-{identities}"


def identity_name(number):
    """Return the folder name of identity `number`."""
    return f"id{number:05d}"


def image_counts(images, identities):
    """Return how many images each identity gets: as even as possible, extras go first."""
    base, extra = divmod(images, identities)
    return [base + (1 if number < extra else 0) for number in range(identities)]


def _face_like(rng, identity_rng_state):
    """Return one 112x112 BGR image: an identity's gradient and oval, plus per-image noise."""
    ident = np.random.default_rng(identity_rng_state)
    colour = ident.integers(40, 200, size=3, dtype=np.int16)
    gx, gy = ident.integers(-3, 4, size=2)
    y, x = _GRID
    half = SIDE // 2
    cy, cx = half + rng.integers(-8, 9), half + rng.integers(-8, 9)
    oval = ((x - cx) * 48) ** 2 + ((y - cy) * 38) ** 2 < (38 * 48) ** 2
    image = colour[None, None, :] + ((gx * (x - half) + gy * (y - half)) // 4)[..., None]
    image = image + (oval * 30)[..., None]
    # The noise amplitude sets the JPEG size: 18..34 averages about 6 KB at quality 90.
    amp = int(rng.integers(18, 35))
    image = image + rng.integers(-amp, amp + 1, size=(SIDE, SIDE, 3), dtype=np.int16)
    return np.clip(image, 0, 255).astype(np.uint8)


def _write_identities(job):
    """Write the images of a range of identities; return the bytes written."""
    root, first, counts, seed = job
    written = 0
    params = [cv2.IMWRITE_JPEG_QUALITY, QUALITY]
    for number, count in enumerate(counts, start=first):
        folder = Path(root) / identity_name(number)
        folder.mkdir()
        rng = np.random.default_rng([seed, number])
        for index in range(count):
            ok, encoded = cv2.imencode(".jpg", _face_like(rng, [seed, number, 1 << 20]), params)
            if not ok:
                raise RuntimeError("cv2.imencode failed")
            data = encoded.tobytes()
            (folder / f"{index:04d}.jpg").write_bytes(data)
            written += len(data)
    return written


def generate_tree(root, images, identities, seed=0, processes=2):
    """Write a fresh tree at `root` (which must not exist); return the bytes written."""
    root = Path(root)
    root.mkdir(parents=True)
    counts = image_counts(images, identities)
    step = max(1, identities // (processes * 8))
    jobs = [
        (str(root), first, counts[first : first + step], seed)
        for first in range(0, identities, step)
    ]
    with ProcessPoolExecutor(max_workers=processes) as pool:
        return sum(pool.map(_write_identities, jobs))


def ensure_tree(images=DEFAULT_IMAGES, identities=DEFAULT_IDENTITIES, processes=2, log=None):
    """Return the path of a complete cached tree, generating it first if needed."""
    if not 1 <= identities <= images:
        raise ValueError("need 1 <= identities <= images")
    root = tree_path(images, identities)
    marker = root.with_name(root.name + ".complete")
    expected = {"version": VERSION, "images": images, "identities": identities}
    CACHE.mkdir(exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and json.loads(marker.read_text()).get("version") == VERSION:
            return root
        if root.exists():
            shutil.rmtree(root)
        marker.unlink(missing_ok=True)
        if log:
            log(f"generating {images:,} images in {identities:,} folders under {root} ...")
        start = time.perf_counter()
        size = generate_tree(root, images, identities, processes=processes)
        # Written last: its presence means the tree is complete.
        marker.write_text(json.dumps({**expected, "bytes": size}) + "\n")
        if log:
            elapsed = time.perf_counter() - start
            log(f"done in {elapsed:.1f} s, {size / images / 1024:.1f} KiB per image on average")
    return root


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES)
    parser.add_argument("--identities", type=int, default=DEFAULT_IDENTITIES)
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    root = ensure_tree(
        args.images,
        args.identities,
        processes=args.processes,
        log=lambda text: print(text, file=sys.stderr),
    )
    print(root)


if __name__ == "__main__":
    main()
