"""The listing of `rectool list` as it was before issue 37 (commit 6563706): a frozen oracle.

`walk.py` and `splits.py` of that commit, verbatim but for imports, so that the streaming
listing can be checked to write the same bytes on any tree. `listed_bytes` returns what
`rectool list` wrote then: {file-name suffix: bytes} and the label map's bytes.
"""

# ruff: noqa

from __future__ import annotations

import os
import queue
import random
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path
from typing import Any

from rectool.errors import InputError, ListingError, UsageError
from rectool.packer.listfile import (
    format_list_lines,
    is_writable_path,
    label_map_text,
    unwritable_paths,
)

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


def _path_key(path: str) -> list[str]:
    return path.split("/")


def even_chunks(items: Sequence[Any], count: int) -> list[Any]:
    """Split `items` into exactly `count` contiguous runs whose lengths differ by at most 1."""
    bounds = [len(items) * i // count for i in range(count + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(count)]


def _batches(items: Sequence[Any], count: int) -> list[Any]:
    """Split `items` into at most `count` contiguous, nearly equal, non-empty lists."""
    return even_chunks(items, max(1, min(count, len(items)))) if items else []


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
    (see the module's docstring).

    Raises `InputError` for a ROOT that is no image tree (`check_walkable`), `ListingError`
    when the root itself cannot be read.
    """
    check_walkable(root)
    root = Path(root)
    adaptive = threads is None
    threads = default_threads() if threads is None else threads
    if threads < 1:
        raise UsageError(f"threads must be at least 1, got {threads}")
    root_path = os.fspath(root)
    scanner = _Scanner(normalize_extensions(exts), recursive, root_path, allow_outside_root)
    skipped: dict[str, list[str]] = {reason: [] for reason in SKIP_REASONS}
    names: list[str] = []
    linked: set[str] = set()
    try:
        st = os.stat(root_path)
        scanner.visited.add((st.st_dev, st.st_ino))
        with os.scandir(root_path) as entries:
            for entry in entries:
                name = entry.name
                if name[0] == ".":
                    skipped["hidden"].append(name)
                elif not _is_dir(entry):
                    skipped["outside_identity"].append(name)
                elif not is_writable_path(name):
                    skipped["unwritable_name"].append(name)
                elif entry.is_symlink() and scanner.leads_out(entry):
                    skipped["outside_root"].append(name)
                elif entry.is_symlink() and scanner.is_loop(entry, (root_path,)):
                    skipped["symlink_loop"].append(name)
                else:
                    names.append(name)
                    if entry.is_symlink():
                        linked.add(name)
    except OSError as exc:
        raise ListingError(f"cannot read the root folder {root_path}: {exc.strerror}") from exc
    names.sort()
    folders: list[_Folder] = []
    links: list[_Folder] = []
    for i, name in enumerate(names):
        path = os.path.join(root_path, name)
        (links if name in linked else folders).append(_Folder(i, path, name, (root_path, path)))
    images: list[list[str]] = [[] for _ in names]
    nested = [False] * len(names)
    unreadable = [False] * len(names)
    scanned = found = 0

    def merge(result: _FolderScan) -> None:
        nonlocal scanned, found
        folder = result.folder
        links.extend(result.links)
        if result.repeat:
            skipped["symlink_repeat"].append(folder.rel)
            if folder.rel == names[folder.identity]:
                unreadable[folder.identity] = True  # not empty: listed under another name
            return
        scanned += 1
        if result.error is not None:
            skipped["unreadable_folder"].append(folder.rel)
            if folder.rel == names[folder.identity]:
                unreadable[folder.identity] = True
        if folder.rel != names[folder.identity]:
            nested[folder.identity] = True
        images[folder.identity].extend(result.images)
        found += len(result.images)
        for reason, path in result.skipped:
            skipped[reason].append(path)

    report = lambda: progress and progress(scanned, found)  # noqa: E731
    if folders:
        if adaptive and threads > 1:
            folders = _run_while_fast(scanner, folders, merge, report)
        if folders:
            _run(scanner, folders, threads, merge, report)
    # Then symlinked folders, round by round in path order, each walked to the end before the
    # next: which path lists a folder reached several ways does not depend on the threads.
    while links:
        batch = sorted(links, key=lambda folder: _path_key(folder.rel))
        links.clear()
        for link in batch:
            _run(scanner, [link], 1 if adaptive else threads, merge, report)
    identities: list[Identity] = []
    for i, name in enumerate(names):
        paths = images[i]
        if not paths:
            if not unreadable[i]:
                skipped["empty_identity"].append(name)
            continue
        paths.sort(key=_path_key if nested[i] else None)
        identities.append(Identity(name, tuple(paths)))
    for paths in skipped.values():
        paths.sort(key=_path_key)
    return TreeWalk(root, identities, skipped, scanned)


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
    folders: list[_Folder],
    merge: Callable[[_FolderScan], None],
    report: Callable[[], object],
) -> list[_Folder]:
    """Scan identity folders on this thread while they list fast; return those left to scan."""
    pending = list(reversed(folders))
    spent = 0.0
    done = 0
    clock = listing_clock
    while pending:
        started = clock()
        result = scanner.scan(pending.pop())
        spent += clock() - started
        done += 1
        merge(result)
        pending.extend(reversed(result.subfolders))
        report()
        if done % _PROBE_FOLDERS == 0:
            if spent / _PROBE_FOLDERS > SLOW_LISTING_SECONDS:
                return list(reversed(pending))
            spent = 0.0
    return []


def _run(
    scanner: _Scanner,
    folders: list[_Folder],
    threads: int,
    merge: Callable[[_FolderScan], None],
    report: Callable[[], object],
) -> None:
    """Scan `folders` and every subfolder they lead to on `threads` threads; merge results."""
    if threads == 1:
        pending = list(reversed(folders))
        while pending:
            result = scanner.scan(pending.pop())
            merge(result)
            pending.extend(reversed(result.subfolders))
            report()
        return
    # Batches, not one task per folder: a hand-off between threads costs more than reading a
    # small cached folder, so a few tasks per thread keep the pool busy at a fraction of it.
    done: queue.SimpleQueue[Future[list[_FolderScan]]] = queue.SimpleQueue()
    outstanding = 0
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rectool-scan") as pool:

        def submit(batch: list[_Folder]) -> None:
            nonlocal outstanding
            try:
                future = pool.submit(scanner.scan_batch, batch)
            except RuntimeError as exc:  # a thread could not start: memory (its stack) ran out
                raise MemoryError(f"cannot start a thread to read folders: {exc}") from exc
            future.add_done_callback(done.put)
            outstanding += 1

        for batch in _batches(folders, threads * 4):
            submit(batch)
        while outstanding:
            results = done.get().result()
            outstanding -= 1
            subfolders: list[_Folder] = []
            for result in results:
                merge(result)
                subfolders.extend(result.subfolders)
            for batch in _batches(subfolders, threads):
                submit(batch)
            report()


# A list's row: (index, label, path relative to the root).
Row = tuple[int, int, str]
SPLIT_BY = ("image", "identity")
SPLITS = ("train", "val", "test")


@dataclass
class Listing:
    """A tree's lists: the rows of each output list, the label map, and what was passed over.

    `lists` maps a file-name suffix to rows `(index, label, path)`: `""` for a single list,
    `"_train"`, `"_val"`, `"_test"` for splits, `"_0"`, `"_1"`... for chunks, and
    `"_0_train"`... for both. `identities` maps label -> identity folder name.
    """

    root: Path
    identities: dict[int, str]
    lists: dict[str, list[Row]]
    skipped: dict[str, list[str]]
    folders: int = 0
    seed: int | None = None
    written: dict[str, str] = field(default_factory=dict)
    label_map: str | None = None

    @property
    def image_count(self) -> int:
        """Return the number of images listed, over all lists."""
        return sum(len(rows) for rows in self.lists.values())

    def summary(self) -> dict[str, Any]:
        """Return the summary as plain data (what `rectool list --json` prints)."""
        return {
            "root": os.fspath(self.root),
            "images": self.image_count,
            "identities": len(self.identities),
            "folders_scanned": self.folders,
            "lists": {
                path: {"images": len(self.lists[suffix]), "suffix": suffix}
                for suffix, path in self.written.items()
            },
            "label_map": self.label_map,
            "seed": self.seed,
            "skipped": {reason: len(paths) for reason, paths in self.skipped.items()},
            "skipped_examples": {
                reason: [display_path(p) for p in paths[:5]]
                for reason, paths in self.skipped.items()
                if paths
            },
        }


def display_path(path: str) -> str:
    """Return a path as printable text: undecodable bytes as `\\xNN`, tabs/newlines escaped."""
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def resolve_ratios(
    train: float | None = None, val: float | None = None, test: float | None = None
) -> tuple[float, float, float] | None:
    """Return the (train, val, test) fractions, or None when the list is not split.

    A missing ratio takes what the others leave: train first, then val (as im2rec, whose val
    list gets the rest), then test. The three must add up to 1; train 1 alone means no split.
    """
    if train is None and val is None and test is None:
        return None
    for name, value in (("train", train), ("val", val), ("test", test)):
        if value is not None and not 0 <= value <= 1:
            raise UsageError(f"the {name} ratio must be between 0 and 1, got {value}")
    given = [(n, v) for n, v in (("train", train), ("val", val), ("test", test)) if v is not None]
    total = sum(v for _, v in given)
    terms = " + ".join(f"--{name}-ratio {value:g}" for name, value in given)
    must = "the train, val and test ratios must add up to 1"
    if total > 1 + 1e-6:
        raise UsageError(f"{must}: {terms} = {total:g} > 1")
    if len(given) == 3 and abs(total - 1) > 1e-6:
        raise UsageError(f"{must}: {terms} = {total:g}")
    if train is None:
        train = 1 - (val or 0) - (test or 0)
    elif val is None:
        val = 1 - train - (test or 0)
    elif test is None:
        test = 1 - train - val
    val, test = val or 0.0, test or 0.0
    if min(train, val, test) < -1e-9 or abs(train + val + test - 1) > 1e-6:
        raise UsageError(
            f"the train, val and test ratios must add up to 1, got {train:g} + {val:g} + {test:g}"
        )
    train, val, test = (max(0.0, r) for r in (train, val, test))
    if train >= 1 - 1e-9:
        return None
    return train, val, test


def list_suffixes(chunks: int, ratios: tuple[float, float, float] | None) -> list[str]:
    """Return the file-name suffixes of the lists `make_listing` makes with these options,
    in its order: one per chunk, each cut into the splits with a positive ratio."""
    prefixes = [f"_{number}" for number in range(chunks)] if chunks > 1 else [""]
    if ratios is None:
        return prefixes
    splits = [split for split, ratio in zip(SPLITS, ratios) if ratio > 0]
    return [f"{prefix}_{split}" for prefix in prefixes for split in splits]


def _cut(count: int, ratios: tuple[float, float, float]) -> list[int]:
    """Return the end of each split's run when `count` things are cut by `ratios`."""
    train, val, _ = ratios
    ends = [round(count * train), round(count * (train + val)), count]
    return [min(end, count) for end in ends]


def make_listing(
    scan: TreeWalk,
    *,
    min_per_id: int = 1,
    max_per_id: int | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    train_ratio: float | None = None,
    val_ratio: float | None = None,
    test_ratio: float | None = None,
    split_by: str = "image",
    chunks: int = 1,
) -> Listing:
    """Assign labels and indices to a tree walk's images and cut them into lists.

    Identities with fewer than `min_per_id` images are dropped; of larger ones only the first
    `max_per_id` images (in path order) are kept. Labels count the remaining identities in name
    order. With `shuffle`, the rows are shuffled with `random.Random(seed)` (a random seed when
    None; `Listing.seed` tells which). Indices run 0..N-1 in that order.

    `chunks` cuts the rows into that many nearly equal runs; ratios (see `resolve_ratios`)
    then cut each chunk into train, val and test: by image (runs of rows, as im2rec) or by
    identity (whole identities, so no identity is in two splits; the ratios then count
    identities, taken in name order or, with `shuffle`, in shuffled order).
    """
    ratios = resolve_ratios(train_ratio, val_ratio, test_ratio)
    check_listing_options(min_per_id, max_per_id, shuffle, seed, split_by, chunks, ratios)
    skipped = {reason: list(paths) for reason, paths in scan.skipped.items()}
    kept: list[tuple[str, tuple[str, ...]]] = []
    for identity in scan.identities:
        if len(identity.images) < min_per_id:
            skipped["below_min_per_id"].append(identity.name)
            continue
        chosen = identity.images
        if max_per_id is not None and len(chosen) > max_per_id:
            skipped["above_max_per_id"].extend(chosen[max_per_id:])
            chosen = chosen[:max_per_id]
        kept.append((identity.name, chosen))
    labels = list(chain.from_iterable(repeat(label, len(p)) for label, (_, p) in enumerate(kept)))
    paths = list(chain.from_iterable(p for _, p in kept))
    if shuffle:
        if seed is None:
            seed = random.SystemRandom().randrange(2**32)
        rng = random.Random(seed)
        # Drawn first, so that the identity split does not change with the number of images.
        identity_order: Sequence[int] = rng.sample(range(len(kept)), len(kept))
        order = list(range(len(paths)))
        rng.shuffle(order)
        labels = [labels[i] for i in order]
        paths = [paths[i] for i in order]
    else:
        identity_order = range(len(kept))
    rows = list(zip(range(len(paths)), labels, paths))
    split_of: dict[int, str] | None = None
    if ratios is not None and split_by == "identity":
        ends = _cut(len(kept), ratios)
        split_of = {}
        for position, label in enumerate(identity_order):
            split_of[label] = next(s for s, end in zip(SPLITS, ends) if position < end)
    lists: dict[str, list[Row]] = {}
    for number, chunk in enumerate(even_chunks(rows, chunks)):
        prefix = f"_{number}" if chunks > 1 else ""
        if ratios is None:
            lists[prefix] = chunk
            continue
        if split_of is None:
            ends = _cut(len(chunk), ratios)
            runs = dict(zip(SPLITS, (chunk[a:b] for a, b in zip([0, *ends], ends))))
        else:
            runs = {s: [row for row in chunk if split_of[row[1]] == s] for s in SPLITS}
        for split, ratio in zip(SPLITS, ratios):
            if ratio > 0:
                lists[f"{prefix}_{split}"] = runs[split]
    identities = {label: name for label, (name, _) in enumerate(kept)}
    return Listing(scan.root, identities, lists, skipped, scan.folders, seed if shuffle else None)


def check_listing_options(
    min_per_id: int,
    max_per_id: int | None,
    shuffle: bool,
    seed: int | None,
    split_by: str,
    chunks: int,
    ratios: tuple[float, float, float] | None,
) -> None:
    if min_per_id < 1:
        raise UsageError(f"--min-per-id must be at least 1, got {min_per_id}")
    if max_per_id is not None and max_per_id < min_per_id:
        raise UsageError(f"--max-per-id {max_per_id} is below --min-per-id {min_per_id}")
    if seed is not None and not shuffle:
        raise UsageError("--seed needs --shuffle")
    if split_by not in SPLIT_BY:
        raise UsageError(f"--split-by must be one of {', '.join(SPLIT_BY)}, got {split_by!r}")
    if split_by != "image" and ratios is None:
        raise UsageError(
            f"--split-by {split_by} needs --train-ratio, --val-ratio or --test-ratio (below 1)"
        )
    if chunks < 1:
        raise UsageError(f"--chunks must be at least 1, got {chunks}")


def listed_bytes(
    root, exts=DEFAULT_EXTENSIONS, recursive=True, threads=1, allow_outside_root=False, **options
):
    """Return ({suffix: list bytes}, label map bytes) as the old `rectool list` wrote them."""
    listing = make_listing(
        walk_tree(root, exts, recursive, threads, None, allow_outside_root), **options
    )
    lists = {
        suffix: format_list_lines(rows).encode("utf-8") for suffix, rows in listing.lists.items()
    }
    return lists, label_map_text(listing.identities).encode("utf-8"), listing
