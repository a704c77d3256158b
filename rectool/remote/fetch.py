"""Requests of a process forked after obstore ran: made by a fresh helper process.

obstore runs its requests on a tokio runtime whose threads a forked child does not inherit:
in a Loader worker forked from a process that had opened a pack on S3, a request would hang
for ever (obstore says it is not fork-safe; tests/test_remote_cache.py met it). Such a process
hands each download (and manifest read, and upload) to one helper of its own, a Python
started by `subprocess` running `main` (not multiprocessing: a daemonic Loader worker may not
have multiprocessing children), which downloads into the cache while the worker holds the
shard's lock.
A job and its answer travel as pickles over the helper's stdin and stdout.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..errors import RectoolError

if TYPE_CHECKING:
    from .cache import CachedObject, ShardCache

T = TypeVar("T")

_helper: tuple[int, subprocess.Popen[bytes]] | None = None  # (pid, Popen) of this process's helper
_helper_lock = threading.Lock()


def download_elsewhere(cache: ShardCache, obj: CachedObject) -> None:
    """Run `cache.download(obj)` in this process's helper; raise what it raised."""
    run_elsewhere(cache.download, obj)
    cache.downloads += 1


def run_elsewhere(function: Callable[..., T], *args: object) -> T:
    """Return `function(*args)` run in this process's helper (both must pickle); raise what
    it raised."""
    global _helper
    with _helper_lock:
        if _helper is None or _helper[0] != os.getpid() or _helper[1].poll() is not None:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            process = subprocess.Popen(
                [sys.executable, "-c", "from rectool.remote.fetch import main; main()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            _helper = (os.getpid(), process)
        stdin, stdout = _helper[1].stdin, _helper[1].stdout
        try:
            if stdin is None or stdout is None:  # (never: both are pipes)
                raise ValueError("no pipe to the helper")
            pickle.dump((function, args), stdin)
            stdin.flush()
            kind, value = pickle.load(stdout)
        except Exception as exc:  # a dead helper, or a job that does not pickle
            raise RectoolError(f"the download helper failed ({exc})") from None
    if kind == "error":
        raise value
    return value  # what `function` returned, unpickled


def main() -> None:
    """Serve download jobs from stdin until it closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            function, args = pickle.load(stdin)
        except EOFError:
            return
        try:
            answer: tuple[str, object] = ("ok", function(*args))
        except RectoolError as exc:
            answer = ("error", exc)
        except Exception as exc:
            answer = ("error", RectoolError(f"{type(exc).__name__}: {exc}"))
        pickle.dump(answer, stdout)
        stdout.flush()
