"""SIGTERM is an interruption of rectool itself, not of the worker processes it forks."""

import subprocess
import sys


def test_bench_workers_stopped_by_their_pool_print_no_traceback(small_pack):
    """The pool stops its forked workers with SIGTERM; they inherit rectool's SIGTERM handler,
    which must end them quietly there (it printed a `Terminated` traceback per worker)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rectool",
            "bench",
            str(small_pack.manifest),
            "--seconds",
            "0.1",
            "--samples",
            "3",
            "-j",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
