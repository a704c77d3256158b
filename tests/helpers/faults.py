"""Faults injected through the standard library, not through rectool's private functions.

Linux: a file descriptor's path is read from /proc/self/fd, so that only writes to the named
files are touched (the test runner's own output is not).
"""

from __future__ import annotations

import errno
import os
import time

import pytest


def fd_path(fd):
    """The path a file descriptor is open on, or '' when it has none."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _patch_writes(monkeypatch, suffix, before_write):
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to tell which file a write goes to")
    real_write = os.write

    def write(fd, data):
        if fd_path(fd).endswith(suffix):
            before_write(fd, data)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def fail_writes(monkeypatch, suffix, code=errno.ENOSPC):
    """Make every os.write to a file whose path ends with `suffix` fail with OSError(code)."""

    def fail(fd, data):
        raise OSError(code, os.strerror(code))

    _patch_writes(monkeypatch, suffix, fail)


def slow_writes(monkeypatch, suffix, seconds):
    """Make every os.write to a file whose path ends with `suffix` take `seconds` longer.

    For tests whose outcome must not depend on it: a writer thread that lags the thread
    filling its buffers makes buffer reuse races likely, never required.
    """
    _patch_writes(monkeypatch, suffix, lambda fd, data: time.sleep(seconds))
