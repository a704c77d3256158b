"""Single files out: staged, fsynced and renamed into place, or written through descriptors
that never follow a symlink at their name.

Part of the door out: callers import these from `rectool.doors.output`.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import RectoolError
from .faults import fault_point

if TYPE_CHECKING:
    from typing import TypeAlias

    from _typeshed import ReadableBuffer, StrPath

    # What a file is written from: bytes, text (as UTF-8) or an iterable of bytes.
    Data: TypeAlias = bytes | str | Iterable[bytes | memoryview]

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIRECTORY = getattr(os, "O_DIRECTORY", 0)


# -- errors --------------------------------------------------------------------------------


def output_error(exc: OSError, path: StrPath, doing: str = "cannot write") -> RectoolError:
    """Return the error to raise for `exc` met writing `path`: the file and the real cause
    (`out/x.rec.crc: cannot write (No space left on device)`)."""
    return RectoolError(f"{os.fspath(path)}: {doing} ({exc.strerror or exc})")


# -- single files --------------------------------------------------------------------------


def current_umask() -> int:
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


def fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder or ".", os.O_RDONLY | DIRECTORY | CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def stage_file(path: StrPath, data: Data) -> str:
    """Write `data` (bytes, text as UTF-8, or an iterable of bytes) to a new temporary file
    beside `path`, fsynced; return the temporary's name (see `commit`)."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    tmp = None
    try:
        fault_point("create", path)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
        with open(fd, "wb") as f:
            for part in parts:
                fault_point("write", path)
                f.write(part)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            fault_point("fsync", path)
            os.fsync(f.fileno())
    except BaseException as exc:
        if tmp is not None:
            remove_quietly(tmp)
        if isinstance(exc, OSError):
            raise output_error(exc, path) from None
        raise
    return tmp


def scratch_file(folder: StrPath | None = None) -> BinaryIO:
    """Return a new temporary file in `folder` (the system's temporary folder when None),
    open for reading and writing, without a name (Linux's O_TMPFILE, else removed at once):
    nothing to replace, and nothing left behind once it is closed or the process ends."""
    where = os.fspath(folder) if folder is not None else tempfile.gettempdir()
    try:
        fault_point("create", where)
        return tempfile.TemporaryFile(dir=where)
    except OSError as exc:
        raise output_error(exc, where, "cannot make a temporary file in") from None


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_atomic(path: StrPath, data: Data) -> str:
    """Write `data` (bytes, text as UTF-8, or an iterable of bytes) to `path` so that it is
    complete or absent,
    replacing what is there (for the files a command owns; see `write_output`).

    Raises `RectoolError` naming the cause and the path when it cannot be written.
    """
    path = os.fspath(path)
    tmp = stage_file(path, data)
    rename(tmp, path)
    return path


def write_json_atomic(path: StrPath, document: Any) -> str:
    """Write `document` as indented UTF-8 JSON to `path`, complete or absent."""
    return write_atomic(path, json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def rename(src: str, dst: str, step: str = "rename") -> None:
    """Move `src` over `dst` (atomic on one file system); errors name the cause and `dst`.

    `step` names it for `fault_point`: "rename" (a temporary into place: removed on an
    error), "shard" (a finished shard's final name), "swap" or "manifest" (a commit's)."""
    try:
        fault_point(step, dst)
        os.replace(src, dst)
    except BaseException as exc:
        if step in ("rename", "journal"):  # `src` is a temporary: never left behind
            remove_quietly(src)
        if isinstance(exc, OSError):
            raise output_error(exc, dst) from None
        raise


def remove(path: str) -> bool:
    """Remove the file at `path` if there is one; return whether one was removed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        raise RectoolError(f"{path}: is a folder, not a file rectool wrote") from None
    except OSError as exc:
        raise output_error(exc, path) from None
    return True


def remove_tree(path: str) -> None:
    """Remove a folder rectool made (a staging folder), never following a link out of it."""
    import shutil

    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def truncate(path: str, size: int) -> None:
    """Cut the file rectool was writing at `path` to `size` bytes (resuming it), never
    through a symlink."""
    fd = open_existing(path, os.O_WRONLY)
    try:
        fault_point("write", path)
        os.ftruncate(fd, size)
    except OSError as exc:
        raise output_error(exc, path) from None
    finally:
        os.close(fd)


def set_mtime(path: str, ns: int) -> None:
    """Set the access and modification times of a file rectool keeps to `ns` nanoseconds (a
    `mirror/` copy's folder: when it was last used); a file gone already is no error."""
    _utime(path, lambda: (ns, ns))


def set_used(path: str, ns: int) -> None:
    """Set the access time of a file rectool keeps to `ns` nanoseconds (a cached shard: when it
    was last used, for least-recently-used eviction), leaving its modification time as it is:
    a write to the file is what changes that (`remote/cache.py` checks a file again when it
    changes). A file gone already is no error."""
    _utime(path, lambda: (ns, os.stat(path).st_mtime_ns))


def _utime(path: str, times: Callable[[], tuple[int, int]]) -> None:
    """Set `path`'s (access, modification) times to `times()` in nanoseconds, if it exists."""
    try:
        os.utime(path, ns=times())
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise output_error(exc, path) from None


def remove_empty_folder(folder: str) -> None:
    """Remove `folder` if it is empty (one a failed run made and wrote nothing into)."""
    try:
        os.rmdir(folder)
    except OSError:
        pass


def make_folders(folder: str) -> None:
    """Create `folder` and its parents when missing; errors name the cause and the folder."""
    if not folder:
        return
    try:
        os.makedirs(folder, exist_ok=True)
    except FileExistsError:
        raise RectoolError(f"{folder}: exists and is not a folder") from None
    except OSError as exc:
        where = exc.filename or folder  # the part of the path that failed
        raise RectoolError(f"{where}: {exc.strerror or exc}") from None


def make_link(path: StrPath, target: str) -> str:
    """Create a symbolic link at `path`, which must not exist (a staging folder's name), to
    `target`; return `path`. For `rectool index --into`: links to shards that stay where they
    are, moved into place by `commit` with the rest of the output."""
    path = os.fspath(path)
    try:
        fault_point("create", path)
        os.symlink(target, path)
    except OSError as exc:
        raise output_error(exc, path) from None
    return path


def create_new(path: StrPath, flags: int = os.O_WRONLY) -> int:
    """Return a descriptor of a new, empty file at `path`, replacing what is there.

    A symlink (or anything else) at the name is removed, not followed: O_EXCL creates the file.
    """
    path = os.fspath(path)
    try:
        fault_point("create", path)
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise RectoolError(f"{path}: is a folder; cannot create a file there") from None
    except OSError as exc:
        raise output_error(exc, path) from None
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | CLOEXEC, 0o666)
    except OSError as exc:
        raise output_error(exc, path) from None


def open_existing(path: StrPath, flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """Return a descriptor of the file at `path` (created if absent), never through a symlink."""
    try:
        return os.open(os.fspath(path), flags | os.O_CREAT | NOFOLLOW | CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RectoolError(f"{path}: is a symlink; refusing to write through it") from None
        raise output_error(exc, path) from None


def open_lock_file(path: StrPath) -> int:
    """Return a descriptor of the lock file at `path` (created empty if absent, never through
    a symlink), to `flock` (the shard cache's locks: rectool.remote.cache)."""
    return open_existing(path, os.O_RDWR)


def write_fd(fd: int, data: ReadableBuffer, path: str) -> None:
    """Write all of `data` to the descriptor `fd` of `path` (a failure names the file)."""
    view = memoryview(data)
    try:
        fault_point("write", path)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        raise output_error(exc, path) from None


def fsync_fd(fd: int, path: str) -> None:
    """fsync the descriptor `fd` of `path` (a failure names the file)."""
    try:
        fault_point("fsync", path)
        os.fsync(fd)
    except OSError as exc:
        raise output_error(exc, path) from None


def discard_stream(fd: int) -> None:
    """Point the descriptor `fd` (a stdout that failed) at /dev/null, so nothing is written
    through it again (Python flushes its buffer at exit)."""
    devnull = os.open(os.devnull, os.O_WRONLY | CLOEXEC)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
