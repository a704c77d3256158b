"""Time `rectool report` on a large generated pack against the time to read every header.

The issue asks that a report's time be dominated by reading the headers and the sampled
images, not by the dataset's size. The floor is `dataset_info(sample=0)` (what `rectool info`
does: every header, through the .idx); the report adds the duplicate fingerprints (16 bytes
per image), the sampled thumbnails and the page. The pack holds RECORDS small JPEGs, each made
unique by 8 bytes after its end-of-image marker (decoders ignore them), with one image in a
thousand stored again under another identity; it is written once under .bench-cache/report/.

    python tests/benchmarks/bench_report.py [--records N] [--repeats N]

Exits 1 when the ratio exceeds its limit. `run()` returns the figures for run_all.py.
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import CACHE, best_in_turns  # noqa: E402

from rectool.inspect.info import dataset_info  # noqa: E402
from rectool.report.data import ReportOptions, write_report  # noqa: E402

DEFAULT_RECORDS = 200_000
IDENTITIES = 10_000
RATIO_LIMIT = 3.0
MAGIC = struct.pack("<I", 0xCED7230A)
# (key in run()'s result, what it is, "<=" or ">=", limit): read by run_all.py.
TARGETS = [
    ("ratio", "`rectool report` time / reading every header (info)", "<=", RATIO_LIMIT),
]


def ensure_pack(records=DEFAULT_RECORDS, log=print):
    """Return the .rec of a generated pack of `records` images, writing it once."""
    folder = CACHE / "report"
    rec = folder / f"faces-{records}.rec"
    if rec.exists():
        return rec
    folder.mkdir(parents=True, exist_ok=True)
    log(f"writing {records:,} records to {rec} ...")
    rng = np.random.default_rng(0)
    bases = []
    for _ in range(256):
        image = rng.integers(0, 256, (8, 8, 3), np.uint8)
        image = cv2.resize(image, (40, 48), interpolation=cv2.INTER_LINEAR)
        bases.append(cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 75])[1].tobytes())
    labels = np.sort(rng.integers(0, IDENTITIES, records))
    tmp_rec, tmp_idx = rec.with_suffix(".rec.tmp"), rec.with_suffix(".idx.tmp")
    offset = 0
    with open(tmp_rec, "wb") as out, open(tmp_idx, "w") as index:
        for key in range(records):
            unique = key if key % 1000 != 999 else key - 500  # a copy, often another identity
            image = bases[unique % 256] + struct.pack("<Q", unique)
            payload = struct.pack("<IfQQ", 0, float(labels[key]), key, 0) + image
            if any(payload[i : i + 4] == MAGIC for i in range(0, len(payload) - 3, 4)):
                payload += b"\0"  # shift: this benchmark writes whole records only
            pad = b"\0" * (-len(payload) % 4)
            out.write(MAGIC + struct.pack("<I", len(payload)) + payload + pad)
            index.write(f"{key}\t{offset}\n")
            offset += 8 + len(payload) + len(pad)
    tmp_idx.rename(rec.with_suffix(".idx"))
    tmp_rec.rename(rec)
    return rec


def run(records=DEFAULT_RECORDS, repeats=3, log=print):
    """Measure; return a dict of figures and whether the limit is met."""
    rec = ensure_pack(records, log)
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"

        kept = {}

        def timed(name, fn):
            def call():
                start = time.perf_counter()
                kept[name] = fn()
                return time.perf_counter() - start

            return call

        floor_s, report_s = best_in_turns(
            repeats,
            timed("info", lambda: dataset_info(rec, sample=0)),
            timed(
                "report", lambda: write_report(rec, page, options=ReportOptions(), overwrite=True)
            ),
        )
        info, result = kept["info"], kept["report"]
        size = page.stat().st_size
    ratio = report_s / floor_s
    return {
        "records": info["records"],
        "rec_mb": round(info["rec_bytes"] / 1e6, 1),
        "headers_s": round(floor_s, 3),
        "report_s": round(report_s, 3),
        "ratio": round(ratio, 3),
        "page_mb": round(size / 1e6, 2),
        "duplicates_across": result.report.duplicates.across,
        "hashed": result.report.duplicates.hashed,
        "ratio_limit": RATIO_LIMIT,
        "ok": ratio <= RATIO_LIMIT,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; the best counts")
    args = parser.parse_args(argv)
    f = run(args.records, args.repeats, log=lambda text: print(text, file=sys.stderr))
    print(f"{f['records']:,} records, {f['rec_mb']:,} MB, warm page cache")
    print(f"read every header (info)  {f['headers_s']:>8.3f} s  (the floor)")
    print(
        f"rectool report            {f['report_s']:>8.3f} s  {f['ratio']:.2f}x the floor; "
        f"page {f['page_mb']} MB; {f['duplicates_across']:,} duplicates found after hashing "
        f"{f['hashed']:,} images; limit <= {RATIO_LIMIT}x: {'ok' if f['ok'] else 'MISSED'}"
    )
    return 0 if f["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
