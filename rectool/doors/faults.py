"""Fault injection for the door out: `fault_point` runs at every step of every output.

Tests set a hook (`set_fault_hook`) or, in a process of their own, `RECTOOL_OUTPUT_FAULT`; both
reach every write because every write goes through `rectool.doors.output`.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable

FAULT_ENV = "RECTOOL_OUTPUT_FAULT"
FAULT_STEPS = (
    "create",
    "write",
    "fsync",
    "flush",
    "rename",
    "shard",
    "journal",
    "swap",
    "manifest",
)
_fault_hook: Callable[[str, str], None] | None = None
_fault_counts: dict[str, int] = {}
_FAULT_SPEC = os.environ.get(FAULT_ENV)  # read once: fault_point runs on every write


def set_fault_hook(hook: Callable[[str, str], None] | None) -> None:
    """Call `hook(step, path)` at every step of every output (None: no hook); for tests.

    The hook may raise (an `OSError` of a full disk, say) or kill the process there.
    """
    global _fault_hook
    _fault_hook = hook


def fault_point(step: str, path: str) -> None:
    """Run the fault hook, and `RECTOOL_OUTPUT_FAULT=STEP:N:ACTION` (for subprocess tests).

    ACTION is `kill` (SIGKILL), `term` (SIGTERM) or `enospc` (an OSError of a full disk),
    at the Nth time STEP is reached (from 1).
    """
    if _fault_hook is not None:
        _fault_hook(step, path)
    spec = _FAULT_SPEC
    if not spec:
        return
    want, _, rest = spec.partition(":")
    if want != step:
        return
    count, _, action = rest.partition(":")
    _fault_counts[step] = seen = _fault_counts.get(step, 0) + 1
    if seen != int(count or 1):
        return
    if action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    os.kill(os.getpid(), signal.SIGTERM if action == "term" else signal.SIGKILL)
