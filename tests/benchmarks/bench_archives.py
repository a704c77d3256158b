"""`rectool pack` from an archive ROOT, side by side with packing the tree it holds (issue 39).

Run: `python tests/benchmarks/bench_archives.py` (or `make bench`). On the 100k benchmark tree
and its tar (`tar --sort=name cf`, cached) and tar.gz (`gzip -6` of that tar), timed in turns:

- pack from the `.tar` / pack from the tree: <= 1.0 (no open, fstat and close per image);
- (`tar xf` + pack the extracted tree) / pack from the `.tar`: >= 1.5 (what extracting costs);
- pack from the `.tar.gz` / `gzip -dc > /dev/null`: <= 1.5 (a pack reads the stream once).

Every pack is the default pass-through pack with `--workers 2`, from the same list; each run
starts from an empty output folder (and an empty extraction folder), untimed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_pack import fresh, ours_cmd, write_list  # noqa: E402
from common import CACHE, best_in_turns, timed  # noqa: E402
from tree import ensure_tree  # noqa: E402

WORK = CACHE / "archive-bench"


def ensure_archives(root, log=print):
    """Return (tar, tar.gz) of the tree, made once and cached beside it."""
    tar, gz = WORK / "tree.tar", WORK / "tree.tar.gz"
    marker = WORK / "archives.complete"
    if marker.exists() and tar.exists() and gz.exists():
        return tar, gz
    WORK.mkdir(parents=True, exist_ok=True)
    log("making the benchmark tree's tar and tar.gz")
    subprocess.run(["tar", "--sort=name", "-cf", str(tar), "-C", str(root), "."], check=True)
    with open(gz, "wb") as out:
        subprocess.run(["gzip", "-6", "-c", str(tar)], stdout=out, check=True)
    marker.write_text("done\n")
    return tar, gz


def run(repeats=3, log=print):
    """Time every side of the comparisons in turns; return seconds and ratios."""
    root = ensure_tree(log=log)
    tar, gz = ensure_archives(root, log)
    lst = WORK / "tree.lst"
    n = write_list(root, lst)
    r = {"images": n, "tar_bytes": tar.stat().st_size, "tar_gz_bytes": gz.stat().st_size}
    out = WORK / "out" / "p"
    extracted = WORK / "extracted"

    def pack(where):
        return timed(ours_cmd(lst, where, out), prepare=fresh(out))[0]

    def extract_then_pack():
        shutil.rmtree(extracted, ignore_errors=True)
        extracted.mkdir(parents=True)
        fresh(out)()
        seconds = timed(["tar", "xf", str(tar), "-C", str(extracted)])[0]
        return seconds + timed(ours_cmd(lst, extracted, out))[0]

    def gunzip():
        return timed(["sh", "-c", f"gzip -dc '{gz}' > /dev/null"])[0]

    log(f"pack {n} images from the tree, its .tar, tar xf + pack, its .tar.gz, gzip -dc")
    times = best_in_turns(
        repeats,
        lambda: pack(root),
        lambda: pack(tar),
        extract_then_pack,
        lambda: pack(gz),
        gunzip,
    )
    shutil.rmtree(extracted, ignore_errors=True)
    shutil.rmtree(out.parent, ignore_errors=True)
    keys = ["pack_tree_s", "pack_tar_s", "extract_and_pack_s", "pack_tar_gz_s", "gunzip_s"]
    r.update(zip(keys, times))
    r["tar_over_tree"] = r["pack_tar_s"] / r["pack_tree_s"]
    r["extract_and_pack_over_tar"] = r["extract_and_pack_s"] / r["pack_tar_s"]
    r["tar_gz_over_gunzip"] = r["pack_tar_gz_s"] / r["gunzip_s"]
    return r


# (key in run()'s result, what it is, ">=" / "<=", limit): run_all.py.
TARGETS = [
    ("tar_over_tree", "pack from the .tar / pack from the tree", "<=", 1.0),
    ("extract_and_pack_over_tar", "(tar xf + pack) / pack from the .tar", ">=", 1.5),
    ("tar_gz_over_gunzip", "pack from the .tar.gz / gzip -dc > /dev/null", "<=", 1.5),
]


def render(r):
    """Return the result table as text, one line per target."""
    lines = [f"archive benchmark: {r['images']} images"]
    for key, label, op, target in TARGETS:
        ok = r[key] >= target if op == ">=" else r[key] <= target
        verdict = "PASS" if ok else "FAIL"
        lines.append(f"  {label:<48} {r[key]:6.2f}  (target {op} {target:g}: {verdict})")
    lines.append("  raw: " + json.dumps({k: round(v, 2) for k, v in r.items() if k.endswith("_s")}))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    result = run(args.repeats, log=lambda m: print(m, file=sys.stderr))
    print(render(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
