"""What a strict JPEG check costs: libjpeg-turbo's warnings as errors, against OpenCV's decode.

Run: `python tests/benchmarks/jpeg_strict_costs.py [--count N] [--repeats N]`.

OpenCV decodes a JPEG whose entropy-coded data is damaged into a damaged picture and only
prints libjpeg's "Corrupt JPEG data" warning; simplejpeg's `strict=True` raises on it. This
times, on one thread, the best of `--repeats` runs taken in turns, over `--count` generated
JPEGs of 112x112 and of 448x448 (quality 90):

- OpenCV's 1/8-scale grayscale decode (what `--check decode` ran before);
- OpenCV's full decode (what `verify --decode` ran before);
- simplejpeg's strict decode at 1/8 scale in grayscale (what both run now), and in full;
- rectool's `check_image(data, "decode")` and `inspect_image(data)`, structure walk included;
- PyTurboJPEG, when it can be imported (it needs the system's libturbojpeg).

It also says whether simplejpeg's full BGR decode equals OpenCV's, pixel for pixel.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import simplejpeg

sys.path.insert(0, str(Path(__file__).parent))
from common import best_in_turns  # noqa: E402

from rectool.packer.images import check_image, check_jpeg_data, inspect_image  # noqa: E402


def make_jpegs(count, side, seed=0):
    """Return `count` face-like JPEGs (a gradient, an oval, noise) of side x side, quality 90."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side]
    half, scale = side // 2, side / 112
    out = []
    for _ in range(count):
        colour = rng.integers(40, 200, size=3, dtype=np.int16)
        gx, gy = rng.integers(-3, 4, size=2)
        oval = ((x - half) * 48) ** 2 + ((y - half) * 38) ** 2 < (38 * 48 * scale) ** 2
        image = (
            colour
            + ((gx * (x - half) + gy * (y - half)) // (4 * scale)).astype(np.int16)[..., None]
        )
        image = image + (oval * 30)[..., None]
        amp = int(rng.integers(18, 35))
        image = image + rng.integers(-amp, amp + 1, size=(side, side, 3), dtype=np.int16)
        image = np.clip(image, 0, 255).astype(np.uint8)
        ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        out.append(buf.tobytes())
    return out


def candidates():
    steps = [
        (
            "OpenCV gray 1/8 (old --check decode)",
            lambda d, a: cv2.imdecode(a, cv2.IMREAD_REDUCED_GRAYSCALE_8),
        ),
        (
            "OpenCV full, unchanged (old verify --decode)",
            lambda d, a: cv2.imdecode(a, cv2.IMREAD_UNCHANGED),
        ),
        ("simplejpeg strict gray 1/8 (check_jpeg_data)", lambda d, a: check_jpeg_data(d)),
        ("simplejpeg strict full BGR", lambda d, a: simplejpeg.decode_jpeg(d, "BGR")),
        ("check_image(d, 'decode') (--check decode)", lambda d, a: check_image(d, "decode")),
        ("inspect_image(d) (verify --decode)", lambda d, a: inspect_image(d)),
    ]
    try:
        from turbojpeg import TJFLAG_STOPONWARNING, TJPF_BGR, TurboJPEG

        jpeg = TurboJPEG()
        steps.append(
            (
                "PyTurboJPEG stop-on-warning full BGR",
                lambda d, a: jpeg.decode(d, TJPF_BGR, flags=TJFLAG_STOPONWARNING),
            )
        )
    except (ImportError, OSError, RuntimeError) as exc:
        print(f"  (PyTurboJPEG not timed: {exc})")
    return steps


def timed_loop(step, pairs):
    """Return a function that runs `step` over every (bytes, array) pair and returns seconds."""

    def run():
        start = time.perf_counter()
        for data, array in pairs:
            step(data, array)
        return time.perf_counter() - start

    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cv2.setNumThreads(1)
    steps = candidates()
    for side in (112, 448):
        datas = make_jpegs(args.count, side)
        arrays = [np.frombuffer(d, np.uint8) for d in datas]
        size = sum(map(len, datas)) / len(datas)
        print(f"{len(datas)} JPEGs of {side}x{side}, q90 ({size / 1024:.1f} KiB on average):")
        pairs = list(zip(datas, arrays))

        # In turns, so that a busy spell of the machine falls on every candidate alike.
        best = best_in_turns(args.repeats, *(timed_loop(step, pairs) for _, step in steps))
        for (name, _), seconds in zip(steps, best):
            per = seconds / len(datas) * 1e6
            ratio = seconds / best[0]
            print(f"  {name:<46} {per:8.1f} us an image  {ratio:5.2f}x")
        same = sum(
            np.array_equal(simplejpeg.decode_jpeg(d, "BGR"), cv2.imdecode(a, cv2.IMREAD_COLOR))
            for d, a in zip(datas, arrays)
        )
        print(f"  simplejpeg BGR == OpenCV IMREAD_COLOR, pixel for pixel: {same}/{len(datas)}")
    print(
        f"  (OpenCV {cv2.__version__}, simplejpeg {simplejpeg.__version__}, "
        f"{os.cpu_count()} CPUs, one thread)"
    )


if __name__ == "__main__":
    main()
