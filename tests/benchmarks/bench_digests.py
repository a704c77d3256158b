"""Time the digests a pack's integrity data can use, side by side, single-threaded, in memory.

Whole-file digests (the manifest's, one per shard file) over a 256 MB buffer: SHA-256 (version
1, and `--sha256`), xxh3-128 (version 2), zlib CRC-32; per-record checksums (the `.rec.crc`)
over 100,000 records of 5.8 KB back to back, the way `RecordChecksums.add` and
`damaged_records` take them (one map() over the records of a buffer, no bytecode per record):
zlib CRC-32 (version 1) and xxh3-64 (version 2). The rows are what docs/format.md quotes for
choosing version 2. Not part of `make bench`; run it alone:

    python tests/benchmarks/bench_digests.py [--mb 256] [--records 100000] [--record-kb 5.8]

`run()` returns the figures (GB/s, and seconds per 100k records).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).parent))
from common import best_time  # noqa: E402

from rectool.format.checksums import RecordChecksums  # noqa: E402

REPEATS = 5


def _whole(data, new):
    h = new()
    h.update(data)
    return h.digest()


def _per_record(data, starts, version):
    offsets = np.zeros(0, np.int64)  # RecordChecksums takes the writer's offsets; unused here
    sums = RecordChecksums(offsets, version=version)
    sums.add(data, starts)
    return len(sums.sums)


def run(mb=256, records=100_000, record_kb=5.8, log=print):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, mb << 20, np.uint8).tobytes()
    whole = {
        "sha256": lambda: _whole(data, hashlib.sha256),
        "xxh3-128": lambda: _whole(data, xxhash.xxh3_128),
        "crc32": lambda: zlib.crc32(data),
    }
    out = {"buffer_mb": mb, "whole_gb_per_s": {}, "records": records, "record_bytes": 0}
    for name, fn in whole.items():
        seconds, _ = best_time(REPEATS, fn)
        out["whole_gb_per_s"][name] = round(len(data) / seconds / 1e9, 2)
        log(f"{name:>9} whole buffer: {len(data) / seconds / 1e9:6.2f} GB/s")
    size = int(record_kb * 1000) // 4 * 4
    batch = rng.integers(0, 256, records * size, np.uint8).tobytes()
    starts = list(range(0, len(batch), size))
    out["record_bytes"] = size
    out["per_record_s"] = {}
    for name, version in (("crc32", 1), ("xxh3-64", 2)):
        seconds, count = best_time(REPEATS, lambda v=version: _per_record(batch, starts, v))
        assert count == records
        out["per_record_s"][name] = round(seconds, 4)
        log(
            f"{name:>9} per record: {seconds:.3f} s for {records:,} x {size:,} B "
            f"({len(batch) / seconds / 1e9:.2f} GB/s)"
        )
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--record-kb", type=float, default=5.8)
    args = parser.parse_args()
    print(json.dumps(run(args.mb, args.records, args.record_kb), indent=2))


if __name__ == "__main__":
    main()
