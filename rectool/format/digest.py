"""SHA-256 of files: the one helper behind the manifest's checksums, pack's resume and verify."""

from __future__ import annotations

import hashlib
import os

from ..doors.inputs import open_checked

_CHUNK = 4 << 20


def sha256_hasher(path, size=None):
    """Return a `hashlib.sha256` object fed the first `size` bytes of `path` (all when None).

    Reads into one reused buffer (no allocation per block); the caller may keep feeding it.
    Stops early at the end of a file shorter than `size`. Opened by `inputs.open_checked`
    (a FIFO or device is refused, as `RectoolError`).
    """
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    left = size
    with os.fdopen(open_checked(path, "file")[0], "rb", buffering=0) as f:
        while left is None or left > 0:
            n = f.readinto(view if left is None or left >= _CHUNK else view[:left])
            if not n:
                break
            h.update(view[:n])
            if left is not None:
                left -= n
    return h


def sha256_file(path):
    """Return the hex SHA-256 of a file."""
    return sha256_hasher(path).hexdigest()
