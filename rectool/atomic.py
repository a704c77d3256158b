"""Write a whole file or none of it: a temporary file, fsync, then a rename."""

from __future__ import annotations

import json
import os

from .errors import RectoolError


def write_atomic(path, data):
    """Write `data` (bytes, or text as UTF-8) to `path` so that it is complete or absent.

    Raises `RectoolError` naming the path when it cannot be written.
    """
    path = os.fspath(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise RectoolError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return path


def write_json_atomic(path, document):
    """Write `document` as indented UTF-8 JSON to `path`, complete or absent."""
    return write_atomic(path, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
