"""`rectool repack` side by side with `cp` of the source .rec and .idx; peak memory on 1M records.

Run: `python tests/benchmarks/bench_repack.py [--repeats N] [--memory-records N]`. On the 100k
benchmark pack (the pass-through pack of `tree.py`'s tree, built once under
`.bench-cache/repack/`), end to end through the CLI from a warm page cache, timed in turns with
its peers. A repack fsyncs what it wrote before naming it (a crash leaves no half-written pack),
so its peer is `cp` of the .rec and .idx followed by `sync` of the two copies: targets from issue
38, an identity-order repack within 1.5x of that, a seeded global shuffle within 2x. Plain `cp`
is timed beside them as information, and so is the xxh3-128 of the .rec (the `xxhash` package,
as the writer computes it): the manifest carries that digest of the output. So are the CPU
seconds (user and system, the least of the turns) of the copies and repacks: on a shared
machine a slow spell moves them less than the wall times. Memory: the peak
RSS of repacking a synthetic source of `--memory-records` small valid JPEG records (default
1,000,000; `bench_scale.generate`), with a shuffle.

Exits 1 when a limit is missed. `run()` returns the figures for run_all.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_scale import generate  # noqa: E402
from common import CACHE, RECTOOL, best_in_turns, timed  # noqa: E402
from tree import ensure_tree  # noqa: E402

WORK = CACHE / "repack"
IDENTITY_LIMIT = 1.5  # against cp + sync: issue 38
SHUFFLE_LIMIT = 2.0
MEMORY_RECORDS = 1_000_000
HASH_FILE = (
    "import mmap, sys, xxhash\n"
    "with open(sys.argv[1], 'rb') as f:\n"
    "    xxhash.xxh3_128(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)).hexdigest()"
)
# (key in run()'s result, what it is, "<=" or ">=", limit): read by run_all.py.
TARGETS = [
    ("ratios.identity_over_cp_sync", "repack --order identity / (cp + sync)", "<=", IDENTITY_LIMIT),
    ("ratios.shuffle_over_cp_sync", "repack --order shuffle / (cp + sync)", "<=", SHUFFLE_LIMIT),
    ("ratios.identity_over_cp", "repack --order identity / cp, not durable", None, None),
    ("ratios.shuffle_over_cp", "repack --order shuffle / cp, not durable", None, None),
]


def ensure_source(log=print):
    """Return the prefix of the pass-through pack of the benchmark tree, packing it once."""
    root = ensure_tree(log=log)
    WORK.mkdir(parents=True, exist_ok=True)
    prefix = WORK / "src"
    if Path(f"{prefix}.manifest.json").exists():
        return prefix
    log(f"packing {root} into {prefix} ...")
    lst = WORK / "src.lst"
    subprocess.run([*RECTOOL, "list", str(root), str(lst), "-q"], check=True)
    subprocess.run(
        [*RECTOOL, "pack", str(lst), str(root), str(prefix), "-q", "--overwrite"], check=True
    )
    return prefix


def synthetic_source(records, log=print):
    """Write (once) a pack of `records` valid 8x8 JPEG records (`bench_scale.generate`: 176
    bytes a record, identities of ~21 images); return its prefix.

    Valid images, since repack refuses what `pack` would refuse: a source of records that are
    not images would time the refusals instead of the copy.
    """
    folder = WORK / f"synthetic-{records}"
    prefix = folder / "scale"
    if Path(f"{prefix}.manifest.json").exists():
        return prefix
    log(f"writing {records:,} synthetic records to {prefix}.rec ...")
    shutil.rmtree(folder, ignore_errors=True)
    return generate(folder, records, log=log)


def _children_cpu():
    """Return the user and system CPU seconds of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _records_written(prefix):
    """Return the number of records the manifest of a finished repack names."""
    with open(f"{prefix}.manifest.json", encoding="utf-8") as f:
        return sum(shard["records"] for shard in json.load(f)["shards"])


def run(repeats=3, memory_records=MEMORY_RECORDS, log=print):
    source = ensure_source(log=log)
    rec, idx = Path(f"{source}.rec"), Path(f"{source}.idx")
    size_mb = rec.stat().st_size / 1e6
    # Warm the page cache.
    subprocess.run(["cat", str(rec), str(idx)], stdout=subprocess.DEVNULL, check=True)
    out = WORK / "out"

    def clean():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)

    cpu: dict[str, float] = {}  # the least CPU seconds of each kind of run

    def counted(name, run):
        """Return `run` (which times commands), noting the CPU seconds of its commands."""

        def counted_run():
            before = _children_cpu()
            seconds = run()
            cpu[name] = min(cpu.get(name, float("inf")), _children_cpu() - before)
            return seconds

        return counted_run

    def cp():
        return timed(["cp", str(rec), str(idx), str(out)], prepare=clean)[0]

    def cp_sync():
        # What a copy costs once it is on the disk, as a repack's output is when it ends.
        copied = timed(["cp", str(rec), str(idx), str(out)], prepare=clean)[0]
        return copied + timed(["sync", str(out / rec.name), str(out / idx.name)])[0]

    def repack(*options):
        cmd = [*RECTOOL, "repack", str(source), str(out / "r"), "-q", *options]
        return lambda: timed(cmd, prepare=clean)[0]

    def checksum():
        # The manifest carries every shard's xxh3-128: what hashing the output alone costs.
        return timed([sys.executable, "-c", HASH_FILE, str(rec)])[0]

    cp_s, cp_sync_s, xxh_s, identity_s, shuffle_s = best_in_turns(
        repeats,
        cp,
        counted("cp_sync", cp_sync),
        checksum,
        counted("repack_identity", repack("--order", "identity")),
        counted("repack_shuffle", repack("--order", "shuffle", "--seed", "1")),
    )
    synthetic = synthetic_source(memory_records, log=log)
    memory_out = WORK / "memory-out"
    shutil.rmtree(memory_out, ignore_errors=True)
    memory_s, peak_mib = timed(
        [*RECTOOL, "repack", str(synthetic), str(memory_out / "r"), "-q", "--order", "shuffle"]
    )
    written = _records_written(memory_out / "r")
    if written != memory_records:  # a run that refused records did not time the copy
        raise RuntimeError(f"the memory repack wrote {written:,} of {memory_records:,} records")
    shutil.rmtree(memory_out, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    result = {
        "rec_mb": round(size_mb, 1),
        "seconds": {
            "cp": round(cp_s, 3),
            "cp_sync": round(cp_sync_s, 3),
            "xxh3_128": round(xxh_s, 3),
            "repack_identity": round(identity_s, 3),
            "repack_shuffle": round(shuffle_s, 3),
        },
        "cpu_seconds": {name: round(seconds, 3) for name, seconds in cpu.items()},
        "ratios": {
            "identity_over_cp": round(identity_s / cp_s, 2),
            "shuffle_over_cp": round(shuffle_s / cp_s, 2),
            "xxh3_128_over_cp": round(xxh_s / cp_s, 2),
            # The targets: against a copy that is on the disk, as a repack's output is.
            "identity_over_cp_sync": round(identity_s / cp_sync_s, 2),
            "shuffle_over_cp_sync": round(shuffle_s / cp_sync_s, 2),
        },
        "memory": {
            "records": memory_records,
            "peak_rss_mib": round(peak_mib, 1),
            "seconds": round(memory_s, 2),
        },
    }
    log(
        f"cp then sync of the {size_mb:,.0f} MB .rec and its .idx (on the disk, as a repack's "
        f"output): {cp_sync_s:.2f} s; repack identity {identity_s:.2f} s "
        f"({identity_s / cp_sync_s:.2f}x, limit {IDENTITY_LIMIT:g}x), shuffle {shuffle_s:.2f} s "
        f"({shuffle_s / cp_sync_s:.2f}x, limit {SHUFFLE_LIMIT:g}x)"
    )
    log(
        f"information: cp alone {cp_s:.2f} s (repack {identity_s / cp_s:.2f}x, shuffled "
        f"{shuffle_s / cp_s:.2f}x); xxh3-128 of the .rec alone {xxh_s:.2f} s"
    )
    log(
        f"information: CPU seconds (user and system, least of the turns): cp + sync "
        f"{cpu['cp_sync']:.2f}, repack identity {cpu['repack_identity']:.2f}, shuffle "
        f"{cpu['repack_shuffle']:.2f}"
    )
    log(
        f"repack --order shuffle of {memory_records:,} synthetic records: peak RSS "
        f"{peak_mib:,.0f} MiB, {memory_s:.1f} s"
    )
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-records", type=int, default=MEMORY_RECORDS)
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args(argv)
    result = run(args.repeats, args.memory_records)
    if args.json:
        print(json.dumps(result, indent=2))
    ratios = result["ratios"]
    missed = (
        ratios["identity_over_cp_sync"] > IDENTITY_LIMIT
        or ratios["shuffle_over_cp_sync"] > SHUFFLE_LIMIT
    )
    return int(missed)


if __name__ == "__main__":
    sys.exit(main())
