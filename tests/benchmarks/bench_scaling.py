"""How the whole chain scales on a tree of N images: time, memory and silence per command.

Run: `python tests/benchmarks/bench_scaling.py [--scale 20k|200k|1m|2m|10m|42m] [--images N]
[--commands list ...] [--folder DIR] [--keep] [--json]`. Issue 37 measured `list`, `pack`,
`verify`, `info`, `report` and `repack` on trees of hard links to 2,000 tiny valid JPEGs
(16x16, about 700 bytes), in identity folders of 20 images; this builds the same tree itself
(outside the repository, deleted afterwards unless --keep), runs each command through the CLI
on it in turn (`pack` on what `list` wrote, the others on that pack) and reports, per command:
wall time, peak RSS (GNU time's maximum resident set size, the largest process: pack's workers
included), peak anonymous memory of the command's own process (RssAnon, sampled from /proc
every 20 ms), both per image, time per image, and the longest silence on stderr: the longest
stretch with no line, from the start to the first line, between lines (each timestamped as it
is read from a pipe that is not a terminal, as in a CI log) and from the last line to the exit.

`--scale 10m --against 1m` runs both sizes and prints, per command, the ratio of the time per
image (the issue's "within 1.2x": `run_all.py --only scaling_10m`, not part of `make bench`:
about half an hour) and the anonymous memory each added image costs.

The default, 1,000,000 images (what `make bench` runs), takes about two minutes; the issue's
limits speak of 2M (`--scale 2m`: peak RSS < 150 MB for `list`, < 400 MB for the others; no
silence over 10 s); `--scale 42m --commands list` is WebFace42M's shape for `list` (about
half an hour, most of it linking and deleting the tree; `run_all.py --only scaling_42m` runs
it against 1M and writes its rows). Files are read from a warm page cache.
`run()` returns the figures for run_all.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import RECTOOL  # noqa: E402

SCALES = {
    "20k": 20_000,
    "200k": 200_000,
    "1m": 1_000_000,
    "2m": 2_000_000,
    "10m": 10_000_000,
    "42m": 42_000_000,  # WebFace42M's shape: with --commands list (the 42M row)
}
DEFAULT_IMAGES = SCALES["1m"]  # what `make bench` runs: the "1M every run"
SOURCES = 2_000  # distinct JPEGs the tree links to
PER_IDENTITY = 20
SIDE = 16
SILENCE_LIMIT_S = 10.0
COMMANDS = ("list", "pack", "verify", "info", "report", "repack")
TARGETS = [  # holds at every scale: the "never silent for more than 10 s"
    ("longest_silence_s", "longest silence on stderr of any command (seconds)", "<=", 10),
    *(
        (f"commands.{name}.peak_rss_mib", f"`{name}` peak RSS (MiB) at the run's size", None, 0)
        for name in COMMANDS
    ),
]


TARGETS_10M = [  # `run_all.py --only scaling_10m`: 10M images against 1M
    *(
        (f"per_image_ratio.{name}", f"`{name}` time per image, 10M / 1M", "<=", 1.2)
        for name in COMMANDS
    ),
    *(
        (f"marginal_anon_bytes.{name}", f"`{name}` anonymous bytes an added image", None, 0)
        for name in COMMANDS
    ),
    ("longest_silence_s", "longest silence on stderr of any command at 10M (seconds)", "<=", 10),
]


TARGETS_42M = [  # `run_all.py --only scaling_42m`: WebFace42M's shape for `list`, against 1M
    ("commands.list.peak_rss_mib", "`list` of 42M images: peak RSS (MiB)", None, 0),
    ("per_image_ratio.list", "`list` time per image, 42M / 1M", "<=", 1.2),
    ("marginal_anon_bytes.list", "`list` anonymous bytes an added image, 42M / 1M", None, 0),
    ("longest_silence_s", "longest silence on stderr of `list` at 42M (seconds)", "<=", 10),
]


def make_sources(folder, count=SOURCES):
    """Write `count` distinct valid 16x16 JPEGs; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for k in range(count):
        pixels = rng.integers(0, 256, (SIDE, SIDE, 3), np.uint8)
        ok, data = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, 80])
        assert ok
        path = folder / f"{k:04d}.jpg"
        path.write_bytes(data.tobytes())
        paths.append(path)
    return paths


def build_tree(root, images, log=print):
    """Hard-link `images` images into identity folders of PER_IDENTITY under `root`."""
    sources = make_sources(root.parent / "sources")
    start = time.perf_counter()
    folder = None
    for k in range(images):
        if k % PER_IDENTITY == 0:
            folder = root / f"id{k // PER_IDENTITY:07d}"
            folder.mkdir(parents=True)
        os.link(sources[k % SOURCES], folder / f"{k % PER_IDENTITY:02d}.jpg")
    log(f"tree of {images:,} images linked in {time.perf_counter() - start:.1f} s")


def _anon_kib(pid):
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"^RssAnon:\s+(\d+)", text, re.M)
    return int(found.group(1)) if found else 0


def measure(cmd):
    """Run `cmd` under GNU time; return its figures (seconds, peak RSS and anonymous MiB,
    longest silence on stderr in seconds) and the lines it wrote there."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        start = time.perf_counter()
        proc = subprocess.Popen(
            ["/usr/bin/time", "-v", "-o", timing.name, *cmd],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        stamps, lines = [], []

        def read():
            for line in proc.stderr:
                stamps.append(time.perf_counter())
                lines.append(line.decode(errors="replace").rstrip())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        anon = 0
        child = None
        while proc.poll() is None:
            if child is None:  # the command itself, under time
                kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
                try:
                    child = int(kids.read_text().split()[0])
                except (OSError, IndexError, ValueError):
                    child = None
            if child is not None:
                anon = max(anon, _anon_kib(child))
            time.sleep(0.02)
        end = time.perf_counter()
        reader.join()
        report = timing.read()
    if proc.returncode not in (0, 3):
        raise RuntimeError(
            f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n" + "\n".join(lines[-30:])
        )
    rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report).group(1))
    edges = [start, *stamps, end]
    silence = max(b - a for a, b in zip(edges, edges[1:]))
    return {
        "seconds": end - start,
        "peak_rss_mib": rss_kib / 1024,
        "peak_anon_mib": anon / 1024,
        "longest_silence_s": silence,
        "stderr_lines": len(lines),
    }, lines


def commands(root, work):
    lst, prefix = work / "faces.lst", work / "pack" / "faces"
    return [
        ("list", [*RECTOOL, "list", str(root), str(lst)]),
        ("pack", [*RECTOOL, "pack", str(lst), str(root), str(prefix)]),
        ("verify", [*RECTOOL, "verify", str(prefix)]),
        ("info", [*RECTOOL, "info", str(prefix)]),
        ("report", [*RECTOOL, "report", str(prefix), "-o", str(work / "report.html")]),
        ("repack", [*RECTOOL, "repack", str(prefix), str(work / "repacked" / "faces")]),
    ]


def run(images=DEFAULT_IMAGES, folder=None, keep=False, log=print, only=None):
    """Build a tree of `images` images, run the chain on it (`only`: these commands, in the
    chain's order; `pack` needs `list`, the others `pack`); return the figures."""
    base = Path(folder or tempfile.mkdtemp(prefix="rectool-scaling-"))
    result = {"images": images, "identities": images // PER_IDENTITY, "commands": {}}
    try:
        root = base / "tree"
        build_tree(root, images, log)
        subprocess.run(["find", str(root), "-type", "f"], stdout=subprocess.DEVNULL, check=True)
        for name, cmd in commands(root, base):
            if only and name not in only:
                continue
            figures, _ = measure(cmd)
            row = {
                "seconds": round(figures["seconds"], 2),
                "us_per_image": round(figures["seconds"] * 1e6 / images, 2),
                "peak_rss_mib": round(figures["peak_rss_mib"], 1),
                "rss_bytes_per_image": round(figures["peak_rss_mib"] * 2**20 / images, 1),
                "peak_anon_mib": round(figures["peak_anon_mib"], 1),
                "anon_bytes_per_image": round(figures["peak_anon_mib"] * 2**20 / images, 1),
                "longest_silence_s": round(figures["longest_silence_s"], 2),
            }
            result["commands"][name] = row
            log(
                f"{name} of {images:,} images: {row['seconds']:.1f} s "
                f"({row['us_per_image']} us an image), peak RSS {row['peak_rss_mib']:,.0f} MiB "
                f"({row['rss_bytes_per_image']:.0f} B an image), peak anonymous "
                f"{row['peak_anon_mib']:,.0f} MiB, longest silence {row['longest_silence_s']} s"
            )
        rows = result["commands"].values()
        result["longest_silence_s"] = max(r["longest_silence_s"] for r in rows)
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    return result


def run_against(images, against, folder=None, keep=False, log=print, only=None):
    """Run the chain at `against` images, then at `images` (each on its own tree); return the
    larger run's figures with the smaller's under "against" and, per command, the ratio of the
    time per image (`per_image_ratio`: <= 1.2 is the issue's "linear") and the anonymous memory
    each added image costs (`marginal_anon_bytes`: the difference of the peaks over the
    difference of the images, the interpreter's base cancelled)."""
    base = Path(folder or tempfile.mkdtemp(prefix="rectool-scaling-"))
    small = run(against, base / "small", keep, log, only)
    result = run(images, base / "large", keep, log, only)
    result["against"] = small
    result["per_image_ratio"], result["marginal_anon_bytes"] = {}, {}
    for name, row in result["commands"].items():
        low = small["commands"][name]
        ratio = row["us_per_image"] / low["us_per_image"]
        marginal = (row["peak_anon_mib"] - low["peak_anon_mib"]) * 2**20 / (images - against)
        result["per_image_ratio"][name] = round(ratio, 2)
        result["marginal_anon_bytes"][name] = round(marginal, 1)
        log(f"{name}: time per image {images:,} / {against:,} = {ratio:.2f}; {marginal:.0f} B "
            "of anonymous memory an added image")  # fmt: skip
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=list(SCALES), help="tree size (default 1m)")
    parser.add_argument("--images", type=int, help="tree size in images (overrides --scale)")
    parser.add_argument("--folder", help="where the tree and packs go (outside the repository)")
    parser.add_argument("--keep", action="store_true", help="keep the tree and packs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--commands", nargs="+", choices=COMMANDS, help="run only these (42m: list alone)"
    )
    parser.add_argument(
        "--against", choices=list(SCALES), help="also run this smaller size first; print ratios"
    )
    args = parser.parse_args()
    images = args.images or SCALES[args.scale or "1m"]
    log = (lambda text: print(text, file=sys.stderr)) if args.json else print
    if args.against:
        against = SCALES[args.against]
        result = run_against(images, against, args.folder, args.keep, log, args.commands)
    else:
        result = run(images, args.folder, args.keep, log, args.commands)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
