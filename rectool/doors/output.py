"""The one door out: every file rectool writes goes through this module.

- `write_atomic`: a temporary file made with `mkstemp` (O_EXCL: a name planted in advance,
  a symlink say, is never followed), fsync, then a rename; the file gets the mode of a normally
  created one (0666 less the umask), not mkstemp's 0600. For files a command owns (a pack's
  manifest, state and checksum files) that it replaces as part of its job.
- `write_output`: the same for a file the user names (`-o FILE`): an existing file is never
  replaced without `overwrite`, a file of a pack never (unless that pack is the command's job),
  and a missing folder is created.
- `create_new`/`open_existing`: descriptors for files written in place (`.partial` shards,
  failures) that never follow a symlink at their name.
- `OutputLock`: one `flock` on `PREFIX.lock` for every command that writes under PREFIX:
  exclusive for a whole run (pack, --finalize, repack, Dask's client), shared by the
  `--only-shard` tasks of one plan, which each also lock their own shard.
- `commit`: a multi-file output moved into place as one unit. A journal written first (the
  commit point) lists every move and removal; after a crash at any instant the old output is
  whole (no journal yet) or `finish_commit` rolls the journal forward to the new one.
- `OutputFolder`: a tree written under one folder (unpack) through descriptors opened with
  O_NOFOLLOW, so a link planted inside it never leads a file outside.
- `fault_point`: the public fault-injection hook, called at every step (create, write, fsync,
  rename, journal, swap, manifest), set by `set_fault_hook` or `RECTOOL_OUTPUT_FAULT`.

`tests/test_output_door.py` fails when another module renames, links or opens files for
writing itself.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import stat
import tempfile
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import RectoolError
from ..reader import JOURNAL_SUFFIX  # the reader refuses a prefix that has one

if TYPE_CHECKING:
    from typing import TypeAlias

    from _typeshed import ReadableBuffer, StrPath

    # What a file is written from: bytes, text (as UTF-8) or an iterable of bytes.
    Data: TypeAlias = bytes | str | Iterable[bytes]

LOCK_SUFFIX = ".lock"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

# -- fault injection -----------------------------------------------------------------------

FAULT_ENV = "RECTOOL_OUTPUT_FAULT"
FAULT_STEPS = ("create", "write", "fsync", "rename", "shard", "journal", "swap", "manifest")
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


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder or ".", os.O_RDONLY | _DIRECTORY | _CLOEXEC)
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
            _remove_quietly(tmp)
        if isinstance(exc, OSError):
            raise output_error(exc, path) from None
        raise
    return tmp


def _remove_quietly(path: str) -> None:
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
            _remove_quietly(src)
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
    """Set the modification time of a file rectool keeps to `ns` nanoseconds (a cached shard:
    when it was last used, for least-recently-used eviction); a file gone already is no error."""
    try:
        os.utime(path, ns=(ns, ns))
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


# Files that make up a pack, by how their names end (see manifest.py for where they come from).
PACK_FILE_ENDINGS = (
    ".rec",
    ".idx",
    ".idx.rtc",
    ".rec.crc",
    ".manifest.json",
    ".failures.jsonl",
    ".pack-state.json",
    ".partial",
    LOCK_SUFFIX,
    JOURNAL_SUFFIX,
)


def pack_file_reason(path: str) -> str | None:
    """Return why the existing file at `path` belongs to a pack (None when it does not).

    A `.rec` or `.idx` with its other half beside it is a shard; any file that a manifest in
    the same folder names, or that ends like a pack's files next to a manifest, is a pack's.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        return None
    folder, name = os.path.split(path)
    stem, ext = os.path.splitext(path)
    if ext in (".rec", ".idx") and os.path.exists(stem + (".idx" if ext == ".rec" else ".rec")):
        return f"{name} is a shard of a pack ({os.path.basename(stem)}.rec/.idx)"
    if name.endswith(PACK_FILE_ENDINGS):
        try:
            manifests = [n for n in os.listdir(folder or ".") if n.endswith(".manifest.json")]
        except OSError:
            manifests = []
        for manifest in manifests[:64]:
            base = manifest[: -len(".manifest.json")]
            if name.startswith(base) and name.endswith(PACK_FILE_ENDINGS):
                return f"{name} belongs to the pack {os.path.join(folder, base)}"
    return None


def check_target(path: StrPath, overwrite: bool = False, what: str = "output") -> str:
    """Refuse to write the user-named `path` over what is there: a file without `overwrite`,
    a pack's file, a folder or a link (never followed). Return the path."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        return path
    if os.path.islink(path):
        raise RectoolError(f"{path}: is a symlink; refusing to write the {what} through it")
    if os.path.isdir(path):
        raise RectoolError(f"{path}: is a folder; give a file name for the {what}")
    reason = pack_file_reason(path)
    if reason is not None:
        raise RectoolError(
            f"{path}: exists and {reason}; refusing to replace it with the {what} "
            "(choose another name)"
        )
    if not overwrite:
        raise RectoolError(f"{path}: exists; use --overwrite to replace it")
    return path


def write_output(path: StrPath, data: Data, overwrite: bool = False, what: str = "output") -> str:
    """Write a user-named output file whole: refused over an existing one without
    `overwrite` (and over a pack's file, a link or a folder always); its folder is created.

    Without `overwrite` the file is linked into place, so a file that appears meanwhile is
    still never replaced.
    """
    path = check_target(path, overwrite, what)
    make_folders(os.path.dirname(path))
    tmp = stage_file(path, data)
    if overwrite:
        rename(tmp, path)
        return path
    try:
        fault_point("rename", path)
        os.link(tmp, path)
    except FileExistsError:
        raise RectoolError(f"{path}: exists; use --overwrite to replace it") from None
    except OSError as exc:
        raise output_error(exc, path) from None
    finally:
        _remove_quietly(tmp)
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
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o666)
    except OSError as exc:
        raise output_error(exc, path) from None


def open_existing(path: StrPath, flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """Return a descriptor of the file at `path` (created if absent), never through a symlink."""
    try:
        return os.open(os.fspath(path), flags | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
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
    devnull = os.open(os.devnull, os.O_WRONLY | _CLOEXEC)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


# -- locks ---------------------------------------------------------------------------------


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

    def __init__(self, prefix: StrPath, shared: bool = False, token: str | None = None) -> None:
        self.prefix = os.fspath(prefix)
        self.path = self.prefix + LOCK_SUFFIX
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
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o666)
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
            fd = os.open(self.path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
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


# -- multi-file commits --------------------------------------------------------------------


def commit(
    journal: str,
    moves: Iterable[tuple[StrPath, StrPath]],
    removals: Iterable[StrPath] = (),
    last: tuple[StrPath, StrPath] | None = None,
) -> None:
    """Move staged files into place as one unit; old or new output whole after any crash.

    `moves`: (staged, final) pairs; `removals`: old files the new output does not have;
    `last`: a (staged, final) pair moved after everything else (a manifest, which says the
    output is complete). The journal at `journal` is written first: once it exists the new
    output is committed, and `finish_commit` (which every writer of the output, and
    `verify`, runs when it finds the journal) completes what a crash interrupted.
    """
    doc = {
        "moves": [[os.fspath(staged), os.fspath(final)] for staged, final in moves],
        "removals": [os.fspath(r) for r in removals],
        "last": None if last is None else [os.fspath(last[0]), os.fspath(last[1])],
    }
    tmp = stage_file(journal, json.dumps(doc, indent=1) + "\n")
    rename(tmp, journal, "journal")
    _fsync_folder(os.path.dirname(journal))
    _roll_forward(journal, doc)


def _roll_forward(journal: str, doc: dict[str, Any]) -> None:
    # Every step is idempotent: a move whose source is gone was done, a removal of a missing
    # file too; so a crash at any instant here is finished by running this again.
    last = doc.get("last")
    if last and os.path.exists(last[0]):
        remove(last[1])  # the old "complete" mark goes first: a half swap never looks whole
    folders: set[str] = set()
    for staged, final in doc["moves"]:
        if os.path.lexists(staged):
            rename(staged, final, "swap")
            folders.add(os.path.dirname(final))
    for old in doc["removals"]:
        fault_point("swap", old)
        remove(old)
    if last and os.path.lexists(last[0]):
        rename(last[0], last[1], "manifest")
        folders.add(os.path.dirname(last[1]))
    for folder in folders:
        _fsync_folder(folder)
    remove(journal)
    for staged, _ in doc["moves"] + ([last] if last else []):
        try:
            os.rmdir(os.path.dirname(staged))  # a staging folder, now empty
        except OSError:
            pass


def read_journal(journal: str) -> dict[str, Any] | None:
    """Return the commit journal at `journal`, None when there is none."""
    try:
        fd = os.open(journal, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise RectoolError(f"{journal}: cannot read the commit journal ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise RectoolError(f"{journal}: not a regular file (a commit journal must be one)")
        data = f.read(64 << 20)
    try:
        doc = json.loads(data)
        ok = isinstance(doc, dict) and all(
            isinstance(doc.get(k), list) for k in ("moves", "removals")
        )
        ok = ok and all(
            isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m)
            for m in doc["moves"] + ([doc["last"]] if doc.get("last") else [])
        )
        ok = ok and all(isinstance(p, str) for p in doc["removals"])
    except (ValueError, RecursionError):
        ok = False
    if not ok:
        raise RectoolError(f"{journal}: not a rectool commit journal; remove it by hand")
    return doc


def finish_commit(journal: str) -> bool:
    """Complete the commit an interrupted run left at `journal`; return whether there was one.

    Only paths beside the journal (or in the hidden staging folder beside it) are touched.
    """
    doc = read_journal(journal)
    if doc is None:
        return False
    folder = os.path.realpath(os.path.dirname(journal) or ".")
    for path in [p for m in doc["moves"] for p in m] + doc["removals"] + (doc["last"] or []):
        real = os.path.realpath(os.path.dirname(path) or ".")
        if real != folder and os.path.dirname(real) != folder:
            raise RectoolError(f"{journal}: names {path}, outside its folder; remove it by hand")
    _roll_forward(journal, doc)
    return True


class OutputFiles:
    """Several user-named files written as one output (a list, its splits, its label map).

    `add(path, data)` stages each file beside its target; leaving the `with` block without an
    error commits them all through one journal (`commit`); an error removes what was staged
    and leaves the old files as they were.
    """

    def __init__(self, journal: str, overwrite: bool = False, what: str = "output") -> None:
        self.journal, self.overwrite, self.what = os.fspath(journal), overwrite, what
        self.staged: list[tuple[str, str]] = []

    def __enter__(self) -> OutputFiles:
        finish_commit(self.journal)
        return self

    def check(self, path: StrPath) -> str:
        """Refuse `path` now (before any work) when it may not be written."""
        return check_target(path, self.overwrite, self.what)

    def add(self, path: StrPath, data: Data) -> str:
        path = self.check(path)
        make_folders(os.path.dirname(path))
        self.staged.append((stage_file(path, data), path))
        return path

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            try:
                if not self.overwrite:
                    for _, path in self.staged:
                        self.check(path)  # appeared meanwhile
                commit(self.journal, self.staged)
                return
            except BaseException:
                if not os.path.lexists(self.journal):  # past the commit point: rolled forward
                    self._discard()  # by the next run, so what is staged must stay
                raise
        self._discard()

    def _discard(self) -> None:
        for tmp, _ in self.staged:
            _remove_quietly(tmp)
        self.staged = []


# -- trees ---------------------------------------------------------------------------------


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
            self._fd: int | None = os.open(self.root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
        except OSError as exc:
            raise output_error(exc, self.root) from None
        self._folders: dict[str, int] = {}

    def _folder(self, name: str) -> int:
        fd = self._folders.get(name)
        if fd is not None:
            return fd
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise RectoolError(f"{name!r}: not a plain folder name inside {self.root}")
        where = os.path.join(self.root, name)
        try:
            os.mkdir(name, 0o777, dir_fd=self._fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise output_error(exc, where) from None
        try:
            fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=self._fd)
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
        where = os.path.join(self.root, folder, name)
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise RectoolError(f"{name!r}: not a plain file name inside {self.root}")
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
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
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
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
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
