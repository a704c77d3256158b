"""List a tree in memory bounded by its identities, not its images (issue 37).

`spool_tree` walks the tree (`walk.walk_folders`) and puts each folder's image paths on an
unnamed scratch file (`PathSpool`) instead of in memory; what stays in memory is a few numbers
and the name of each identity. `plan_lists` then labels the identities and cuts the rows into
the lists `splits.make_listing` would make, from the counts alone; `ListRows` writes each
list's lines, reading the spool back one identity at a time (its images sorted as the walk
sorts them) or, shuffled, from every path held in one bytes array (about 16 bytes an image
besides the paths: a shuffled list needs every line before its first). The bytes written are
those of `make_listing` and `listfile.format_list_lines` over `walk_tree`'s result.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import IO, Any

import numpy as np

from .splits import SPLITS, cut_runs, list_suffixes
from .walk import DEFAULT_EXTENSIONS, Skipped, WalkReport, path_key, walk_folders

# The passed-over paths a summary shows at most, per reason.
EXAMPLES = 5
# Lines are written in blocks of about this many bytes.
_BLOCK_BYTES = 1 << 16
_BLOCK_ROWS = 1 << 14
_SHUFFLE_STEP = 1 << 20
# `phase(name, done, total)`: a step of the listing after the walk ("shuffle", "gather",
# "write"), as `rectool.commands.progress.PhaseLog` takes it.
Phase = Callable[[str, int, int | None], object]


class PathSpool:
    """The image paths of each identity, on a scratch file rather than in memory.

    `add(identity, paths)` appends a folder's paths (UTF-8 lines); `paths(identity)` reads
    back all of an identity's, in the order they came. Memory: 24 bytes an identity, and an
    entry for each folder of an identity that came apart from its others (nested folders read
    on several threads, folders reached through links).
    """

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.start = array("q")
        self.size = array("q")
        self.count = array("q")
        self.more: dict[int, list[tuple[int, int]]] = {}
        self.end = 0
        self._reading = False

    def _grow(self, identity: int) -> None:
        extra = max(identity + 1, 2 * len(self.count)) - len(self.count)
        for column in (self.start, self.size, self.count):
            column.extend(repeat(0, extra))

    def add(self, identity: int, paths: list[str]) -> None:
        if identity >= len(self.count):
            self._grow(identity)
        data = ("\n".join(paths) + "\n").encode("utf-8")
        self.file.write(data)
        if not self.count[identity]:
            self.start[identity] = self.end
            self.size[identity] = len(data)
        elif self.start[identity] + self.size[identity] == self.end:
            self.size[identity] += len(data)
        else:
            self.more.setdefault(identity, []).append((self.end, len(data)))
        self.count[identity] += len(paths)
        self.end += len(data)

    def images(self, identity: int) -> int:
        """Return the number of images of `identity`."""
        return self.count[identity] if identity < len(self.count) else 0

    def paths(self, identity: int) -> list[str]:
        """Return the paths of `identity`, in the order they were added."""
        if not self._reading:
            self.file.flush()
            self._reading = True
        segments = [(self.start[identity], self.size[identity]), *self.more.get(identity, ())]
        paths: list[str] = []
        for start, size in segments:
            self.file.seek(start)
            paths += self.file.read(size).decode("utf-8").split("\n")[:-1]
        return paths


@dataclass
class SpooledTree:
    """A walked tree whose images are on a `PathSpool`: what `plan_lists` needs."""

    root: Path
    names: list[str]
    nested: bytearray
    unreadable: bytearray
    folders: int
    spool: PathSpool
    skipped: Skipped


def spool_tree(
    root: Any,
    scratch: IO[bytes],
    exts: Any = DEFAULT_EXTENSIONS,
    recursive: bool = True,
    threads: int | None = None,
    report: WalkReport | None = None,
    allow_outside_root: bool = False,
) -> SpooledTree:
    """Walk `root` (see `walk.walk_tree`), its image paths going to the file `scratch`."""
    spool = PathSpool(scratch)
    skipped = Skipped(keep=EXAMPLES)
    walked = walk_folders(
        root, spool.add, skipped, exts, recursive, threads, report, allow_outside_root
    )
    return SpooledTree(
        walked.root,
        walked.names,
        walked.nested,
        walked.unreadable,
        walked.folders,
        spool,
        skipped,
    )


@dataclass(frozen=True)
class Part:
    """A list to write: rows `start`..`stop` of the final order, those of split `split` only
    (a shuffled split by identity) or all (None). `suffix` None: rows not written."""

    suffix: str | None
    start: int
    stop: int
    split: int | None = None


@dataclass
class ListPlan:
    """The labelled identities and the lists to write: everything but the lines."""

    kept: array  # identity numbers kept, in label order
    first: np.ndarray  # the first row of each label in index order, then the row count
    parts: list[Part]
    sizes: dict[str, int]  # suffix: rows
    order: np.ndarray | None  # shuffled: row k of the output is row order[k] in label order
    split_of: np.ndarray | None  # a split by identity: label -> index into SPLITS
    seed: int | None

    @property
    def rows(self) -> int:
        return int(self.first[-1])


def plan_lists(
    tree: SpooledTree,
    *,
    min_per_id: int = 1,
    max_per_id: int | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    ratios: tuple[float, float, float] | None = None,
    split_by: str = "image",
    chunks: int = 1,
    phase: Phase | None = None,
) -> ListPlan:
    """Label `tree`'s identities and cut its rows into lists as `make_listing` does.

    Counts identities without images and those below `min_per_id` in `tree.skipped`; images
    beyond `max_per_id` are counted as `ListRows` reads them. A shuffle tells `phase`
    ("shuffle", rows done, rows) as it goes.
    """
    kept = array("q")
    counts = array("q")
    for i, name in enumerate(tree.names):
        count = tree.spool.images(i)
        if not count:
            if not tree.unreadable[i]:
                tree.skipped.add("empty_identity", name)
        elif count < min_per_id:
            tree.skipped.add("below_min_per_id", name)
        else:
            kept.append(i)
            counts.append(count if max_per_id is None else min(count, max_per_id))
    first = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(np.frombuffer(counts, dtype=np.int64), out=first[1:])
    total, identities = int(first[-1]), len(kept)
    order = None
    identity_order: Any = range(identities)
    if shuffle:
        if seed is None:
            seed = random.SystemRandom().randrange(2**32)
        rng = random.Random(seed)
        # As make_listing draws them: the identities first, then the rows (the same swaps as
        # shuffling a list, on 8 bytes a row).
        identity_order = rng.sample(range(identities), identities)
        order = shuffle_rows(rng, total, phase)
    split_of = None
    if ratios is not None and split_by == "identity":
        split_ends = np.asarray(cut_runs(identities, ratios), dtype=np.int64)
        split_of = np.empty(identities, dtype=np.int8)
        split_of[np.asarray(identity_order, dtype=np.int64)] = np.searchsorted(
            split_ends, np.arange(identities), side="right"
        )
    parts: list[Part] = []
    bounds = [total * i // chunks for i in range(chunks + 1)]
    for number in range(chunks):
        start, stop = bounds[number], bounds[number + 1]
        prefix = f"_{number}" if chunks > 1 else ""
        if ratios is None:
            parts.append(Part(prefix, start, stop))
            continue
        names = [f"{prefix}_{s}" if ratio > 0 else None for s, ratio in zip(SPLITS, ratios)]
        if split_of is not None and order is not None:
            parts += [Part(name, start, stop, s) for s, name in enumerate(names) if name]
            continue
        if split_of is None:
            cuts = [start + end for end in cut_runs(stop - start, ratios)]
        else:  # in label order the splits are runs: labels below the first end are train...
            ends = cut_runs(identities, ratios)
            cuts = [min(max(int(first[end]), start), stop) for end in ends[:2]] + [stop]
        parts += [Part(name, a, b) for name, a, b in zip(names, [start, *cuts], cuts)]
    sizes = {suffix: 0 for suffix in list_suffixes(chunks, ratios)}
    for part in parts:
        if part.suffix is not None:
            sizes[part.suffix] += _part_rows(part, first, order, split_of)
    return ListPlan(kept, first, parts, sizes, order, split_of, seed if shuffle else None)


def shuffle_rows(
    rng: random.Random, total: int, phase: Phase | None = None, step: int = _SHUFFLE_STEP
) -> np.ndarray:
    """Return `range(total)` shuffled by `rng` as `rng.shuffle(list(range(total)))` shuffles
    it, in 8 bytes a row, telling `phase("shuffle", done, total)` every `step` swaps."""
    rows = array("q", range(total))
    # Random.shuffle's own loop and draws (Random._randbelow: getrandbits of n's bit length
    # until below n), run in steps so that a long shuffle is not silent: the same permutation
    # (tests/test_list_stream.py checks it against random.shuffle).
    getrandbits = rng.getrandbits

    def randbelow(n: int) -> int:
        bits = n.bit_length()
        r = getrandbits(bits)
        while r >= n:
            r = getrandbits(bits)
        return r

    top = total - 1
    if phase is not None:
        phase("shuffle", 0, total)
    while top > 0:
        low = max(0, top - step)
        for i in range(top, low, -1):
            j = randbelow(i + 1)
            rows[i], rows[j] = rows[j], rows[i]
        top = low
        if phase is not None:
            phase("shuffle", total - top if top else total, total)
    return np.frombuffer(rows, dtype=np.int64)


def _labels_of(rows: np.ndarray, first: np.ndarray) -> np.ndarray:
    return np.searchsorted(first, rows, side="right") - 1


def _part_rows(
    part: Part, first: np.ndarray, order: np.ndarray | None, split_of: np.ndarray | None
) -> int:
    if part.split is None or order is None or split_of is None:
        return part.stop - part.start
    rows = 0
    for lo in range(part.start, part.stop, _BLOCK_ROWS):
        labels = _labels_of(order[lo : min(part.stop, lo + _BLOCK_ROWS)], first)
        rows += int(np.count_nonzero(split_of[labels] == part.split))
    return rows


class ListRows:
    """The lines of each part of a `ListPlan`, as blocks of UTF-8 bytes.

    Parts are read in order (`part_lines`); unshuffled, each identity's paths are read back
    from the spool when its first row is due, so only one identity's are held. `phase`, if
    given, is told ("write", lines written, lines) before the first line and every block,
    and, shuffled, ("gather", rows read back, rows) before.
    """

    def __init__(
        self,
        tree: SpooledTree,
        plan: ListPlan,
        max_per_id: int | None,
        phase: Phase | None = None,
    ) -> None:
        self.tree, self.plan, self.max_per_id = tree, plan, max_per_id
        self.phase = phase
        self.lines_out = sum(plan.sizes.values())
        self.label = 0  # the next identity to read
        self.row = 0  # the row of lines[0]
        self.lines: list[str] = []
        self.done = 0
        self._paths: tuple[bytearray, np.ndarray] | None = None

    def _identity_paths(self, label: int) -> list[str]:
        """Return the paths of label `label`'s identity, sorted, beyond-max ones counted."""
        identity = self.plan.kept[label]
        paths = self.tree.spool.paths(identity)
        paths.sort(key=path_key if self.tree.nested[identity] else None)
        if self.max_per_id is not None and len(paths) > self.max_per_id:
            for path in paths[self.max_per_id :]:
                self.tree.skipped.add("above_max_per_id", path)
            del paths[self.max_per_id :]
        return paths

    def _advance(self, count: int) -> None:
        self.done += count
        if self.phase is not None:
            self.phase("write", self.done, self.lines_out)

    def part_lines(self, part: Part) -> Iterator[bytes]:
        """Yield the lines of `part`, after reading past the rows before it."""
        if self.plan.order is not None:
            self._all_paths()
        if not self.done and self.phase is not None:
            self.phase("write", 0, self.lines_out)
        if self.plan.order is None:
            yield from self._in_order(part)
        else:
            yield from self._shuffled(part)

    def finish(self) -> None:
        """Read past the rows after the last part (their images beyond the maximum count)."""
        if self.plan.order is None:
            for _ in self._in_order(Part(None, self.plan.rows, self.plan.rows)):
                pass
        else:
            self._all_paths()

    def _in_order(self, part: Part) -> Iterator[bytes]:
        block: list[str] = []
        size = 0
        row = part.start
        kept = len(self.plan.kept)
        while True:
            # Identities are read in label order, each once: those before `row` (rows of no
            # part) are read past, so that their images beyond the maximum are counted.
            while row >= self.row + len(self.lines) and self.label < kept:
                self.row += len(self.lines)
                label, base = self.label, self.row
                paths = self._identity_paths(label)
                self.lines = [f"{base + k}\t{label}\t{path}\n" for k, path in enumerate(paths)]
                self.label += 1
            if row >= part.stop:
                break
            lines = self.lines[row - self.row : part.stop - self.row]
            row += len(lines)
            if part.suffix is not None:
                block += lines
                size += sum(map(len, lines))
                if size >= _BLOCK_BYTES:
                    self._advance(len(block))
                    yield "".join(block).encode("utf-8")
                    block, size = [], 0
        if block:
            self._advance(len(block))
            yield "".join(block).encode("utf-8")

    def _all_paths(self) -> tuple[bytearray, np.ndarray]:
        """Return every kept path in label order, as one bytes array and its row offsets."""
        if self._paths is None:
            spool = self.tree.spool
            room = sum(spool.size[i] for i in self.plan.kept)
            blob = bytearray(room)
            offsets = np.zeros(self.plan.rows + 1, dtype=np.int64)
            end = row = 0
            if self.phase is not None:
                self.phase("gather", 0, self.plan.rows)
            for label in range(len(self.plan.kept)):
                if self.phase is not None and label % 4096 == 0:
                    self.phase("gather", row, self.plan.rows)
                encoded = [path.encode("utf-8") for path in self._identity_paths(label)]
                data = b"".join(encoded)
                blob[end : end + len(data)] = data
                lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
                offsets[row + 1 : row + 1 + len(encoded)] = end + np.cumsum(lengths)
                end += len(data)
                row += len(encoded)
            if self.phase is not None:
                self.phase("gather", row, self.plan.rows)
            self._paths = (blob, offsets)
        return self._paths

    def _shuffled(self, part: Part) -> Iterator[bytes]:
        blob, offsets = self._all_paths()
        order, first, split_of = self.plan.order, self.plan.first, self.plan.split_of
        assert order is not None
        view = memoryview(blob)
        for lo in range(part.start, part.stop, _BLOCK_ROWS):
            hi = min(part.stop, lo + _BLOCK_ROWS)
            rows = order[lo:hi]
            labels = _labels_of(rows, first)
            ks = np.arange(lo, hi)
            if part.split is not None and split_of is not None:
                keep = split_of[labels] == part.split
                ks, rows, labels = ks[keep], rows[keep], labels[keep]
            if part.suffix is None or not len(ks):
                continue
            starts, stops = offsets[rows].tolist(), offsets[rows + 1].tolist()
            yield b"".join(
                [
                    b"%d\t%d\t%b\n" % (k, label, bytes(view[a:b]))
                    for k, label, a, b in zip(ks.tolist(), labels.tolist(), starts, stops)
                ]
            )
            self._advance(len(ks))
