"""The lock on an output prefix: one `flock` on `PREFIX.lock` for every command that writes
under PREFIX.

Part of the door out: callers import `OutputLock` from `rectool.doors.output`.
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import TYPE_CHECKING, NoReturn

from ..errors import RectoolError
from ..format.paths import PackPaths
from .files import CLOEXEC, NOFOLLOW

if TYPE_CHECKING:
    from _typeshed import StrPath


class OutputLock:
    """The lock on the output `PREFIX`: `PREFIX.lock`, holding its holder's pid.

    Exclusive (the default) for a run that writes the whole prefix; `shared=True` for the
    `--only-shard` tasks of one plan, which may run together but never beside a whole run.
    A task started by a run that holds the exclusive lock (Dask's client) joins it with the
    `token` the holder wrote (`OutputLock.token`). A refusal names the holder's pid and never
    suggests an option: the only safe move is to wait for the other run or stop it. The
    kernel releases a `flock` when its process dies, so a lock left by a killed run never
    blocks the next; an exclusive holder removes the file when it lets go.
    """

    def __init__(
        self, prefix: StrPath | PackPaths, shared: bool = False, token: str | None = None
    ) -> None:
        self.prefix = os.fspath(prefix)
        self.path = PackPaths.of(prefix).lock
        self.shared = shared
        self.join_token = token
        self.token: str | None = None
        self._fd: int | None = None

    def _refuse(self, fd: int) -> NoReturn:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").split()
        os.close(fd)
        who = f"pid {holder[0]}" if holder and holder[0].isdigit() else "another process"
        raise RectoolError(
            f"{self.prefix}: another rectool run ({who}) is writing this output "
            f"(lock {self.path}); wait for it to finish or stop it"
        )

    def acquire(self) -> OutputLock:
        if self.join_token is not None:
            return self._join()
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | NOFOLLOW | CLOEXEC, 0o666)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise RectoolError(f"{self.path}: is a symlink; remove it") from None
                raise RectoolError(f"{self.path}: cannot lock ({exc.strerror or exc})") from None
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                self._refuse(fd)
            # The file may have been removed by the holder that just released it: lock the
            # file that is at the name now.
            try:
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        if not self.shared:
            self.token = os.urandom(8).hex()
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {self.token}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def _join(self) -> OutputLock:
        """Join the exclusive lock that the run which started this task holds."""
        try:
            fd = os.open(self.path, os.O_RDONLY | NOFOLLOW | CLOEXEC)
        except OSError:
            fd = None
        held = False
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                held = True
            words = os.pread(fd, 64, 0).decode("ascii", "replace").split()
            os.close(fd)
            held = held and len(words) == 2 and words[1] == self.join_token
        if not held:
            raise RectoolError(
                f"{self.prefix}: the run that started this task no longer holds the lock "
                f"{self.path}; this task writes nothing"
            )
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        last = not self.shared
        if self.shared:  # the last of the shard tasks removes the file, as a whole run does
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                last = True
            except BlockingIOError:
                pass
        if last:
            try:
                os.unlink(self.path)  # while still locked: no run can hold this file after us
            except OSError:
                pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
