"""Safe output files: whole or absent, never through a planted link, and one writer a prefix.

- `write_atomic`: a temporary file made with `mkstemp` (O_EXCL: a name planted in advance,
  a symlink say, is never followed), fsync, then a rename; the file gets the mode of a normally
  created one (0666 less the umask), not mkstemp's 0600.
- `create_new`/`open_existing`: descriptors for files written in place (`.partial` shards,
  failures) that never follow a symlink at their name.
- `OutputLock`: an exclusive `flock` on `PREFIX.lock`, held for a whole pack run.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile

from .errors import RectoolError

LOCK_SUFFIX = ".lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def current_umask():
    """Return the process's umask without changing it (Linux), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path, data):
    """Write `data` (bytes, or text as UTF-8) to `path` so that it is complete or absent.

    Raises `RectoolError` naming the path when it cannot be written.
    """
    path = os.fspath(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    folder, name = os.path.split(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise RectoolError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return path


def write_json_atomic(path, document):
    """Write `document` as indented UTF-8 JSON to `path`, complete or absent."""
    return write_atomic(path, json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def create_new(path, flags=os.O_WRONLY):
    """Return a descriptor of a new, empty file at `path`, replacing what is there.

    A symlink (or anything else) at the name is removed, not followed: O_EXCL creates the file.
    """
    path = os.fspath(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise RectoolError(f"{path}: is a folder; cannot create a file there") from None
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o666)


def open_existing(path, flags=os.O_WRONLY | os.O_APPEND):
    """Return a descriptor of the file at `path` (created if absent), never through a symlink."""
    try:
        return os.open(os.fspath(path), flags | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RectoolError(f"{path}: is a symlink; refusing to write through it") from None
        raise


class OutputLock:
    """An exclusive lock on the output `PREFIX` for one run: `PREFIX.lock`, holding its pid.

    A second run on the same prefix is refused at once (`RectoolError` naming the prefix and
    the holder's pid). The kernel releases a `flock` when its process dies, so a lock left by
    a killed run never blocks the next; the file is removed when the lock is released.
    """

    def __init__(self, prefix):
        self.prefix = os.fspath(prefix)
        self.path = self.prefix + LOCK_SUFFIX
        self._fd = None

    def acquire(self):
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
            except OSError as exc:
                raise RectoolError(f"{self.path}: cannot lock ({exc.strerror or exc})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                os.close(fd)
                who = f"pid {holder}" if holder.isdigit() else "another process"
                raise RectoolError(
                    f"{self.prefix}: another rectool run ({who}) is writing this output "
                    f"(lock {self.path}); wait for it to finish or stop it"
                ) from None
            # The file may have been removed by the holder that just released it: lock the
            # file that is at the name now.
            try:
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def release(self):
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # while still locked: no run can hold this file after us
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
