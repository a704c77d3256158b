"""Walk an identity-per-folder image tree: its identities, images and what was passed over.

Walking the tree uses `os.scandir`: file and folder types come from the directory entries;
each folder is stat-ed once (its device and inode), and symbolic links are resolved. Folders
are read by a pool of threads, which is what matters on network file systems where every
listing waits on a round trip; the result does not depend on the number of threads.

Every folder is listed once, by device and inode, so a walk ends and its memory is bounded
by what it lists, whatever links the tree holds. The tree's real folders are walked first;
then symlinked folders, in path order, round by round (those found inside linked folders in
the next round): a link that leads back to one of its own ancestors is a `symlink_loop`, one
that leads to a folder already listed a `symlink_repeat`, and both are skipped and counted.
Links, to files and to folders, are followed only where their real path stays inside ROOT's
real path; those leading out are skipped as `outside_root` unless `allow_outside_root`
(`rectool list --allow-outside-root`).

A tree that is no image tree is not walked: a ROOT whose real path is the file system's root
or lies in one of the kernel's trees (`SYSTEM_TREES`: /proc, /sys, /dev) is refused, and a
link that leads there is skipped as `outside_root` even with `allow_outside_root`. Walking
`/` would list every file system of the machine, and /proc has no end worth reaching.
"""

from __future__ import annotations

import os
import queue
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError, ListingError, UsageError
from .listfile import is_writable_path, unwritable_paths

if TYPE_CHECKING:
    from _typeshed import StrPath

# `progress(folders_scanned, images_found)`.
Progress = Callable[[int, int], object]

# Extensions OpenCV decodes that image datasets commonly use.
DEFAULT_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")

# Why an entry was passed over: key -> what is counted. Keys are stable (they are the JSON
# summary's keys); the order is the order of the human summary.
SKIP_REASONS = {
    "not_image": "files without an image extension",
    "hidden": "hidden files and folders (name starts with '.')",
    "outside_identity": "entries directly in the root, outside any identity folder",
    "empty_identity": "identity folders without any image",
    "unreadable_folder": "folders that cannot be read",
    "unwritable_name": "names a .lst line cannot hold (tab, newline, CR, not UTF-8, "
    "leading or trailing whitespace)",
    "not_regular": "broken symbolic links and special files",
    "symlink_loop": "symlinked folders that lead back to their own ancestor",
    "symlink_repeat": "symlinked folders that lead to a folder already listed",
    "outside_root": "symbolic links that lead out of ROOT (--allow-outside-root follows them)",
    "subfolder": "subfolders of identities, not scanned without recursion",
    "below_min_per_id": "identities with fewer images than the minimum per identity",
    "above_max_per_id": "images beyond the maximum per identity",
}


# The kernel's trees: their files are not images, some are endless, and they hold the machine.
SYSTEM_TREES = ("/proc", "/sys", "/dev")


def system_tree(real: str) -> str | None:
    """Return what the real path `real` is when it is no image tree (the file system's root,
    or in one of `SYSTEM_TREES`), else None."""
    if real == os.sep:
        return "the file system's root"
    for tree in SYSTEM_TREES:
        if real == tree or real.startswith(tree + os.sep):
            return f"in {tree}, a tree of the kernel's"
    return None


def check_walkable(root: StrPath) -> None:
    """Raise `InputError` when `root` (through any link) is the file system's root or lies
    in one of `SYSTEM_TREES`: no image tree, and walking it lists the whole machine."""
    real = os.path.realpath(root)
    what = system_tree(real)
    if what is not None:
        shown = os.fspath(root)
        target = "" if shown == real else f" ({real})"
        raise InputError(
            f"{shown}: ROOT is {what}{target}, not an image tree; give the folder that holds "
            "one folder per identity"
        )


def default_threads() -> int:
    """Return the default number of scanning threads: 4 per CPU, at most 32."""
    return min(32, 4 * (os.cpu_count() or 1))


def normalize_extensions(exts: Iterable[str]) -> tuple[str, ...]:
    """Return extensions as a sorted tuple of lower-case `.ext` strings ("JPG" -> ".jpg")."""
    normalized = set()
    for ext in exts:
        ext = ext.strip().lower()
        if not ext or ext == ".":
            raise UsageError(f"empty image extension in {list(exts)!r}")
        normalized.add(ext if ext.startswith(".") else "." + ext)
    if not normalized:
        raise UsageError("no image extensions given")
    return tuple(sorted(normalized))


@dataclass(frozen=True)
class Identity:
    """One identity folder: its name and its images' paths relative to the root, in order."""

    name: str
    images: tuple[str, ...]


@dataclass
class TreeWalk:
    """What `walk_tree` found: identities with images, in name order, and what it skipped."""

    root: Path
    identities: list[Identity]
    # reason (a key of SKIP_REASONS) -> sorted paths relative to the root
    skipped: dict[str, list[str]]
    folders: int = 0

    @property
    def image_count(self) -> int:
        """Return the number of images found."""
        return sum(len(identity.images) for identity in self.identities)


@dataclass(frozen=True)
class _Folder:
    """A folder to scan: the identity it belongs to, where it is, and its ancestors' paths."""

    identity: int
    path: str
    rel: str
    ancestors: tuple[str, ...]


@dataclass
class _FolderScan:
    folder: _Folder
    images: list[str] = field(default_factory=list)
    subfolders: list[_Folder] = field(default_factory=list)
    # symlinked subfolders, walked in a later round
    links: list[_Folder] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (reason, path)
    error: OSError | None = None
    repeat: bool = False  # the folder was listed already (reached again through a link)


class _Scanner:
    """Scan folders: classify every entry with what `os.scandir` already knows."""

    def __init__(
        self, exts: Iterable[str], recursive: bool, root: str, allow_outside_root: bool = False
    ) -> None:
        self.exts = frozenset(exts)
        self.recursive = recursive
        self.allow_outside_root = allow_outside_root
        self._real_root = os.path.realpath(root)
        self._below_root = os.path.join(self._real_root, "")
        # (st_dev, st_ino) of ancestors, computed only when a symlinked folder needs them.
        self._keys: dict[str, tuple[int, int]] = {}
        # (st_dev, st_ino) of every folder listed: none is listed twice.
        self.visited: set[tuple[int, int]] = set()

    def leads_out(self, entry: os.DirEntry[str]) -> bool:
        """Return whether a symbolic link entry's real path is outside ROOT (and not allowed)."""
        real = os.path.realpath(entry.path)
        if system_tree(real) is not None:  # never followed: see the module's docstring
            return True
        if self.allow_outside_root:
            return False
        return real != self._real_root and not real.startswith(self._below_root)

    def folder_key(self, path: str) -> tuple[int, int]:
        key = self._keys.get(path)
        if key is None:
            st = os.stat(path)
            key = self._keys[path] = (st.st_dev, st.st_ino)
        return key

    def is_loop(self, entry: os.DirEntry[str], ancestors: Iterable[str]) -> bool:
        """Return whether a symlinked folder entry is one of `ancestors` (paths)."""
        st = entry.stat()  # follows the link; DirEntry caches it from is_dir()
        key = (st.st_dev, st.st_ino)
        return any(self.folder_key(path) == key for path in ancestors)

    def scan_batch(self, folders: Iterable[_Folder]) -> list[_FolderScan]:
        return [self.scan(folder) for folder in folders]

    def scan(self, folder: _Folder) -> _FolderScan:
        result = _FolderScan(folder)
        skipped, exts, rel = result.skipped, self.exts, folder.rel
        names = []
        try:
            st = os.stat(folder.path)
            key = (st.st_dev, st.st_ino)
            # One walk at a time adds to `visited`, and it reaches each real folder once.
            if key in self.visited:
                result.repeat = True
                return result
            self.visited.add(key)
            with os.scandir(folder.path) as entries:
                for entry in entries:
                    name = entry.name
                    if name[0] == ".":
                        skipped.append(("hidden", f"{rel}/{name}"))
                        continue
                    # One question per entry in the usual case, answered from the entry's
                    # type (no stat) unless it is a symbolic link.
                    try:
                        dot = name.rfind(".")
                        if dot > 0 and name[dot:].lower() in exts:
                            if entry.is_file():
                                if entry.is_symlink() and self.leads_out(entry):
                                    skipped.append(("outside_root", f"{rel}/{name}"))
                                else:
                                    names.append(name)
                            elif entry.is_dir():
                                self._add_subfolder(result, entry)
                            else:
                                skipped.append(("not_regular", f"{rel}/{name}"))
                        elif entry.is_dir():
                            self._add_subfolder(result, entry)
                        else:
                            skipped.append(("not_image", f"{rel}/{name}"))
                    except OSError:
                        skipped.append(("not_regular", f"{rel}/{name}"))
        except OSError as exc:
            # A folder that cannot be read to the end contributes nothing but its error.
            return _FolderScan(folder, error=exc)
        bad = unwritable_paths(names)
        if bad:
            skipped.extend(("unwritable_name", f"{rel}/{name}") for name in bad)
            refused = set(bad)
            names = [name for name in names if name not in refused]
        prefix = rel + "/"
        result.images = [prefix + name for name in names]
        return result

    def _add_subfolder(self, result: _FolderScan, entry: os.DirEntry[str]) -> None:
        folder, rel = result.folder, f"{result.folder.rel}/{entry.name}"
        if not is_writable_path(entry.name):
            result.skipped.append(("unwritable_name", rel))
        elif not self.recursive:
            result.skipped.append(("subfolder", rel))
        elif entry.is_symlink():
            if self.leads_out(entry):
                result.skipped.append(("outside_root", rel))
            elif self.is_loop(entry, folder.ancestors):
                result.skipped.append(("symlink_loop", rel))
            else:
                result.links.append(
                    _Folder(folder.identity, entry.path, rel, folder.ancestors + (entry.path,))
                )
        else:
            result.subfolders.append(
                _Folder(folder.identity, entry.path, rel, folder.ancestors + (entry.path,))
            )


def path_key(path: str) -> list[str]:
    """Return the sort key of a relative path: its components, so `a/b` sorts before `a.b`."""
    return path.split("/")


class Skipped:
    """What a walk passed over, by reason (a key of SKIP_REASONS): how many, and their paths.

    All the paths, or with `keep` only the first `keep` in path order: what a summary shows,
    in memory that does not grow with the tree. `finish` sorts them and returns them.
    """

    def __init__(self, keep: int | None = None) -> None:
        self.keep = keep
        self.counts = dict.fromkeys(SKIP_REASONS, 0)
        self.paths: dict[str, list[str]] = {reason: [] for reason in SKIP_REASONS}

    def add(self, reason: str, path: str) -> None:
        self.counts[reason] += 1
        paths = self.paths[reason]
        paths.append(path)
        if self.keep is not None and len(paths) >= 2 * self.keep + 1024:
            paths.sort(key=path_key)
            del paths[self.keep :]

    def finish(self) -> dict[str, list[str]]:
        for paths in self.paths.values():
            paths.sort(key=path_key)
            if self.keep is not None:
                del paths[self.keep :]
        return self.paths


# `images(identity, paths)`: the images found in one folder of identity number `identity`.
ImageSink = Callable[[int, list[str]], object]
# `report(folders_scanned, images_found, identity_folders_read, identity_folders)`.
WalkReport = Callable[[int, int, int, int], object]


@dataclass
class WalkedTree:
    """What `walk_folders` found besides the images it handed on, per identity number."""

    root: Path
    names: list[str]  # identity folder names, in code-point order: identity i is names[i]
    nested: bytearray  # 1 where some of an identity's images are in its subfolders
    unreadable: bytearray  # 1 where an identity folder could not be read (or is listed twice)
    folders: int  # folders read


class _Todo:
    """Folders left to read, depth first: subfolders found, then identity folders in name order."""

    def __init__(self, folder_of: Callable[[int], _Folder], identities: Sequence[int]) -> None:
        self.folder_of, self.identities, self.next = folder_of, identities, 0
        self.stack: list[_Folder] = []

    def __len__(self) -> int:
        return len(self.stack) + len(self.identities) - self.next

    def push(self, subfolders: Sequence[_Folder]) -> None:
        self.stack.extend(reversed(subfolders))

    def pop(self) -> _Folder | None:
        if self.stack:
            return self.stack.pop()
        if self.next < len(self.identities):
            self.next += 1
            return self.folder_of(self.identities[self.next - 1])
        return None

    def take(self, count: int) -> list[_Folder]:
        taken: list[_Folder] = []
        while len(taken) < count and (folder := self.pop()) is not None:
            taken.append(folder)
        return taken


def walk_tree(
    root: StrPath,
    exts: Iterable[str] = DEFAULT_EXTENSIONS,
    recursive: bool = True,
    threads: int | None = None,
    progress: Progress | None = None,
    allow_outside_root: bool = False,
) -> TreeWalk:
    """Walk the folder tree at `root`; return its identities, their images and what was passed over.

    `exts` are the image extensions (case-insensitive). With `recursive`, images in subfolders
    of an identity folder belong to it; without, such subfolders are skipped and counted.
    `threads` folders are read at once. By default (`threads=None`) folders are read on the
    calling thread while listings are fast (a local or cached disk, where threads only contend
    for the GIL) and on `default_threads()` threads once they prove slow (a network file
    system, where latency dominates). `progress`, if given, is
    called from the calling thread as `progress(folders_scanned, images_found)`. Links that
    lead out of ROOT are skipped unless `allow_outside_root`; every folder is listed once
    (see the module's docstring). The whole tree is held in memory: `rectool list` walks
    with `walk_folders`, which hands each folder's images on instead.

    Raises `InputError` for a ROOT that is no image tree (`check_walkable`), `ListingError`
    when the root itself cannot be read.
    """
    skipped = Skipped()
    images: dict[int, list[str]] = {}
    walked = walk_folders(
        root,
        lambda identity, paths: images.setdefault(identity, []).extend(paths),
        skipped,
        exts,
        recursive,
        threads,
        progress and (lambda folders, found, _read, _of: progress(folders, found)),
        allow_outside_root,
    )
    identities: list[Identity] = []
    for i, name in enumerate(walked.names):
        paths = images.pop(i, None)
        if not paths:
            if not walked.unreadable[i]:
                skipped.add("empty_identity", name)
            continue
        paths.sort(key=path_key if walked.nested[i] else None)
        identities.append(Identity(name, tuple(paths)))
    return TreeWalk(walked.root, identities, skipped.finish(), walked.folders)


def walk_folders(
    root: StrPath,
    images: ImageSink,
    skipped: Skipped,
    exts: Iterable[str] = DEFAULT_EXTENSIONS,
    recursive: bool = True,
    threads: int | None = None,
    report: WalkReport | None = None,
    allow_outside_root: bool = False,
) -> WalkedTree:
    """Walk the folder tree at `root` as `walk_tree` does, holding none of its images.

    Each folder's images go to `images(identity, paths)` as it is read (unsorted; identity i
    is the i-th identity folder name in code-point order), what is passed over to `skipped`;
    an identity folder without images is for the caller to count. The walk holds the identity
    names and the folders waiting to be read, never more than a few folders' images (a
    thread's batch each). `report`, if given, is called on the calling thread as
    `report(folders_scanned, images_found, identity_folders_read, identity_folders)`.
    """
    check_walkable(root)
    root = Path(root)
    adaptive = threads is None
    threads = default_threads() if threads is None else threads
    if threads < 1:
        raise UsageError(f"threads must be at least 1, got {threads}")
    root_path = os.fspath(root)
    scanner = _Scanner(normalize_extensions(exts), recursive, root_path, allow_outside_root)
    names: list[str] = []
    linked: set[str] = set()
    try:
        st = os.stat(root_path)
        scanner.visited.add((st.st_dev, st.st_ino))
        with os.scandir(root_path) as entries:
            for entry in entries:
                name = entry.name
                if name[0] == ".":
                    skipped.add("hidden", name)
                elif not _is_dir(entry):
                    skipped.add("outside_identity", name)
                elif not is_writable_path(name):
                    skipped.add("unwritable_name", name)
                elif entry.is_symlink() and scanner.leads_out(entry):
                    skipped.add("outside_root", name)
                elif entry.is_symlink() and scanner.is_loop(entry, (root_path,)):
                    skipped.add("symlink_loop", name)
                else:
                    names.append(name)
                    if entry.is_symlink():
                        linked.add(name)
    except OSError as exc:
        raise ListingError(f"cannot read the root folder {root_path}: {exc.strerror}") from exc
    names.sort()

    def folder_of(i: int) -> _Folder:
        path = os.path.join(root_path, names[i])
        return _Folder(i, path, names[i], (root_path, path))

    real = array("q", (i for i, name in enumerate(names) if name not in linked))
    links = [folder_of(i) for i, name in enumerate(names) if name in linked]
    nested = bytearray(len(names))
    unreadable = bytearray(len(names))
    scanned = found = identities_read = 0

    def merge(result: _FolderScan) -> None:
        nonlocal scanned, found, identities_read
        folder = result.folder
        links.extend(result.links)
        top = folder.rel == names[folder.identity]
        identities_read += top
        if result.repeat:
            skipped.add("symlink_repeat", folder.rel)
            if top:
                unreadable[folder.identity] = 1  # not empty: listed under another name
            return
        scanned += 1
        if result.error is not None:
            skipped.add("unreadable_folder", folder.rel)
            if top:
                unreadable[folder.identity] = 1
        if not top:
            nested[folder.identity] = 1
        if result.images:
            images(folder.identity, result.images)
            found += len(result.images)
        for reason, path in result.skipped:
            skipped.add(reason, path)

    def progress() -> None:
        if report is not None:
            report(scanned, found, identities_read, len(names))

    todo = _Todo(folder_of, real)
    if adaptive and threads > 1:
        _run_while_fast(scanner, todo, merge, progress)
    _run(scanner, todo, threads, merge, progress)
    # Then symlinked folders, round by round in path order, each walked to the end before the
    # next: which path lists a folder reached several ways does not depend on the threads.
    while links:
        batch = sorted(links, key=lambda folder: path_key(folder.rel))
        links.clear()
        for link in batch:
            todo = _Todo(folder_of, ())
            todo.push([link])
            _run(scanner, todo, 1 if adaptive else threads, merge, progress)
    return WalkedTree(root, names, nested, unreadable, scanned)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


# A cached local folder of face crops lists in about 0.1 ms; a network file system takes a
# millisecond or more, and then reading folders on many threads pays.
SLOW_LISTING_SECONDS = 0.0005
_PROBE_FOLDERS = 16
# What times folder listings: an injection point, so that tests can give listings a latency
# without sleeping (and without depending on how busy the machine is).
listing_clock = time.perf_counter


def _run_while_fast(
    scanner: _Scanner,
    todo: _Todo,
    merge: Callable[[_FolderScan], None],
    report: Callable[[], object],
) -> None:
    """Scan folders on this thread while they list fast; leave the rest in `todo`."""
    spent = 0.0
    done = 0
    clock = listing_clock
    while (folder := todo.pop()) is not None:
        started = clock()
        result = scanner.scan(folder)
        spent += clock() - started
        done += 1
        merge(result)
        todo.push(result.subfolders)
        report()
        if done % _PROBE_FOLDERS == 0:
            if spent / _PROBE_FOLDERS > SLOW_LISTING_SECONDS:
                return
            spent = 0.0


# Folders a thread reads per task at most: few enough that the images in flight stay a few
# folders' worth a thread, many enough that a hand-off costs little beside the reading.
_BATCH = 64


def _run(
    scanner: _Scanner,
    todo: _Todo,
    threads: int,
    merge: Callable[[_FolderScan], None],
    report: Callable[[], object],
) -> None:
    """Scan the folders in `todo` and every subfolder they lead to on `threads` threads."""
    if threads == 1:
        while (folder := todo.pop()) is not None:
            result = scanner.scan(folder)
            merge(result)
            todo.push(result.subfolders)
            report()
        return
    if not len(todo):
        return
    # Batches, not one task per folder: a hand-off between threads costs more than reading a
    # small cached folder, so a few tasks per thread keep the pool busy at a fraction of it.
    # At most 4 a thread are in flight, so the walk holds no more images than they find.
    done: queue.SimpleQueue[Future[list[_FolderScan]]] = queue.SimpleQueue()
    outstanding = 0
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rectool-scan") as pool:

        def fill() -> None:
            nonlocal outstanding
            while outstanding < threads * 4:
                size = max(1, min(_BATCH, len(todo) // (threads * 4)))
                batch = todo.take(size)
                if not batch:
                    return
                try:
                    future = pool.submit(scanner.scan_batch, batch)
                except RuntimeError as exc:  # a thread could not start: memory (its stack)
                    raise MemoryError(f"cannot start a thread to read folders: {exc}") from exc
                future.add_done_callback(done.put)
                outstanding += 1

        fill()
        while outstanding:
            results = done.get().result()
            outstanding -= 1
            for result in results:
                merge(result)
                todo.push(result.subfolders)
            fill()
            report()
