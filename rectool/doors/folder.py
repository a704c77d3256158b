"""A tree written under one folder (`unpack`), never outside it.

Part of the door out: callers import `OutputFolder` from `rectool.doors.output`.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING

from ..errors import RectoolError
from .faults import fault_point
from .files import CLOEXEC, DIRECTORY, NOFOLLOW, make_folders, output_error, write_fd

if TYPE_CHECKING:
    from _typeshed import StrPath


class OutputFolder:
    """Files written under one folder (`unpack`'s OUT_DIR), never outside it.

    Every folder on the way is opened with O_NOFOLLOW relative to its parent's descriptor,
    and every file is created with O_EXCL: a symlink planted in the tree (to a folder or at a
    file's name) is refused, never followed, and an existing file is never replaced.
    """

    def __init__(self, root: StrPath) -> None:
        self.root = os.fspath(root)
        make_folders(self.root)
        try:
            self._fd: int | None = os.open(self.root, os.O_RDONLY | DIRECTORY | CLOEXEC)
        except OSError as exc:
            raise output_error(exc, self.root) from None
        self._folders: dict[str, int] = {}

    def _folder(self, name: str) -> int:
        fd = self._folders.get(name)
        if fd is not None:
            return fd
        if not _plain(name):
            raise RectoolError(f"{name!r}: not a plain folder name inside {self.root}")
        where = os.path.join(self.root, name)
        try:
            os.mkdir(name, 0o777, dir_fd=self._fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise output_error(exc, where) from None
        try:
            fd = os.open(name, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC, dir_fd=self._fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise RectoolError(
                    f"{where}: is a symlink or not a folder; refusing to write through it"
                ) from None
            raise output_error(exc, where) from None
        self._folders[name] = fd
        return fd

    def write_new(self, folder: str, name: str, data: bytes, resume: bool = False) -> bool:
        """Write `data` to the new file FOLDER/NAME under the root, whole or not at all;
        return False when `resume` found it there already with these bytes (kept as it is).

        The bytes go to a hidden `.NAME.partial` first, then are linked to NAME (a link never
        replaces a file), so a file with its final name is always complete; an existing one
        is refused, or with `resume` compared byte for byte.
        """
        if not _plain(name):
            raise RectoolError(f"{name!r}: not a plain file name inside {self.root}")
        where = os.path.join(self.root, folder, name)
        dir_fd = self._folder(folder)
        if resume and self._same_file(dir_fd, name, where, data):
            return False
        partial = f".{name}.partial"
        try:
            fault_point("create", where)
            try:
                os.unlink(partial, dir_fd=dir_fd)  # what a killed run was writing
            except FileNotFoundError:
                pass
            fd = os.open(
                partial,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC,
                0o666,
                dir_fd=dir_fd,
            )
        except OSError as exc:
            raise output_error(exc, where) from None
        try:
            try:
                write_fd(fd, data, where)
            finally:
                os.close(fd)
            fault_point("rename", where)
            os.link(partial, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            raise RectoolError(
                f"{where}: exists; unpack into an empty folder (or add --resume)"
            ) from None
        except OSError as exc:
            raise output_error(exc, where) from None
        finally:
            try:
                os.unlink(partial, dir_fd=dir_fd)
            except OSError:
                pass
        return True

    def _same_file(self, dir_fd: int, name: str, where: str, data: bytes) -> bool:
        """Return True when NAME holds exactly `data`; False when there is no NAME; raise
        when it holds anything else (never replaced)."""
        try:
            fd = os.open(name, os.O_RDONLY | NOFOLLOW | CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RectoolError(f"{where}: is a symlink; refusing to write through it") from None
            raise output_error(exc, where, "cannot read") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            same = stat.S_ISREG(st.st_mode) and st.st_size == len(data)
            same = same and f.read(len(data) + 1) == bytes(data)
        if not same:
            raise RectoolError(
                f"{where}: exists with other bytes than this record; it is never replaced "
                "(unpack into an empty folder)"
            )
        return True

    def close(self) -> None:
        for fd in self._folders.values():
            os.close(fd)
        self._folders = {}
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(name: str) -> bool:
    """Return True when `name` is one file name the file system can be given (no path, no
    NUL, encodable: a lone surrogate from a JSON escape is not)."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        return False
    try:
        os.fsencode(name)
    except UnicodeEncodeError:
        return False
    return True
