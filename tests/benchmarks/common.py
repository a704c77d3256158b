"""Shared pieces of the side-by-side benchmarks: paths, the oracle, timing, tables."""

from __future__ import annotations

import compileall
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".bench-cache"
RECTOOL = [sys.executable, "-m", "rectool"]


def compile_rectool():
    """Compile rectool's bytecode beside its sources (`__pycache__`, ignored by git), once.

    An installed rectool has it (pip compiles a wheel's modules as it installs them), and the
    CLI's timed runs should start as that one does: this checkout, run with
    PYTHONDONTWRITEBYTECODE set, would otherwise compile its modules again on every run (0.1 to
    0.25 s of each, here).
    """
    compileall.compile_dir(REPO / "rectool", quiet=1)


compile_rectool()


def oracle_python():
    """Return the MXNet 1.9.1 interpreter (`RECTOOL_ORACLE_PYTHON` or `.venv-oracle`)."""
    configured = os.environ.get("RECTOOL_ORACLE_PYTHON")
    path = Path(configured) if configured else REPO / ".venv-oracle" / "bin" / "python"
    if not path.exists():
        sys.exit(f"MXNet oracle missing at {path}: run `make oracle` first")
    return str(path)


def im2rec_script():
    """Return the path of im2rec.py inside the oracle's MXNet wheel."""
    out = subprocess.run(
        [oracle_python(), "-c", "import mxnet, os; print(os.path.dirname(mxnet.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return os.path.join(out.stdout.strip().splitlines()[-1], "tools", "im2rec.py")


def timed(cmd, cwd=None, env=None, prepare=None):
    """Run a command; return (seconds, its peak RSS in MiB). `prepare()` runs untimed.

    The peak is the child's own VmHWM, sampled from /proc while it runs: rusage's ru_maxrss
    would report this (large) benchmark process, whose high-water mark a forked child
    inherits and keeps across exec.
    """
    if prepare:
        prepare()
    peak_kib = 0
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        status = Path(f"/proc/{proc.pid}/status")
        while proc.poll() is None:
            peak_kib = max(peak_kib, _vm_hwm_kib(status))
            time.sleep(0.01)
        seconds = time.perf_counter() - start
        if proc.returncode not in (0, 3):
            err.seek(0)
            raise RuntimeError(
                f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                f"{err.read().decode(errors='replace')[-3000:]}"
            )
    return seconds, peak_kib / 1024


def _vm_hwm_kib(status):
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def best_time(repeats, fn):
    """Return (best wall time in seconds, last result) of `repeats` calls of `fn`."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def cpu_timed(cmd, prepare=None):
    """Run a command; return (wall seconds, CPU seconds): user + system time of it and of every
    process it waited for (its workers), from this process's RUSAGE_CHILDREN before and after."""
    if prepare:
        prepare()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = timed(cmd)[0]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def best_in_turns(runs, *fns):
    """Return the smallest result of each of `fns` (seconds, say), called in turns (a, b, a, b,
    ...), so that a slow spell of the machine falls on every side alike."""
    best = [float("inf")] * len(fns)
    for _ in range(runs):
        for k, fn in enumerate(fns):
            best[k] = min(best[k], fn())
    return best


def ratio_line(name, ours, peer, peer_name, target=None, better="lower"):
    """Return one table row: times and ratio, with PASS/FAIL against `target` when given."""
    ratio = peer / ours if better == "lower" else ours / peer
    verdict = ""
    if target is not None:
        verdict = "PASS" if ratio >= target else "FAIL"
        verdict = f"  (target >= {target:g}x: {verdict})"
    return f"{name:<44} ours {ours:8.2f}s  {peer_name} {peer:8.2f}s  ratio {ratio:6.2f}x{verdict}"
