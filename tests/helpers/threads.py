"""Where another thread of this process is: for tests that must act while it blocks."""

from __future__ import annotations

import os
import sys


def sleeping(thread):
    """Return whether `thread` (a `threading.Thread`) sleeps in the kernel: in a system call
    that waits (a lock, a sleep, `flock`), state S in /proc."""
    with open(f"/proc/{os.getpid()}/task/{thread.native_id}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] == b"S"


def blocked_in(thread, code, bound=10**8):
    """Wait until `thread` sleeps in the kernel inside a call of `code` (a function's
    `__code__`); return False if it did not within `bound` looks (a bound, not a clock)."""
    for _ in range(bound):
        frame = sys._current_frames().get(thread.ident)
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
        if frame is not None and sleeping(thread):
            return True
        os.sched_yield()
    return False
