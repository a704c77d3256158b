"""Label a tree walk's identities, number its images, and cut them into split and chunk lists.

Identities get labels 0..K-1 in code-point order of their folder names, so a tree always gives
the same labels; images are listed by identity, then by path (unless shuffled), and numbered
0..N-1 in that order before any split, so indices stay unique across the train/val/test lists
and chunks.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .walk import TreeWalk

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
    # Rows of each list, and how many paths were passed over by reason: by default counted
    # from `lists` and `skipped`; a streamed listing (`streamlist`) holds no rows and keeps
    # only a few example paths.
    sizes: dict[str, int] = field(default_factory=dict)
    passed: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.sizes:
            self.sizes = {suffix: len(rows) for suffix, rows in self.lists.items()}
        if not self.passed:
            self.passed = {reason: len(paths) for reason, paths in self.skipped.items()}

    @property
    def image_count(self) -> int:
        """Return the number of images listed, over all lists."""
        return sum(self.sizes.values())

    def summary(self) -> dict[str, Any]:
        """Return the summary as plain data (what `rectool list --json` prints)."""
        return {
            "root": os.fspath(self.root),
            "images": self.image_count,
            "identities": len(self.identities),
            "folders_scanned": self.folders,
            "lists": {
                path: {"images": self.sizes[suffix], "suffix": suffix}
                for suffix, path in self.written.items()
            },
            "label_map": self.label_map,
            "seed": self.seed,
            "skipped": dict(self.passed),
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


def even_chunks(items: Sequence[Any], count: int) -> list[Any]:
    """Split `items` into exactly `count` contiguous runs whose lengths differ by at most 1."""
    bounds = [len(items) * i // count for i in range(count + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(count)]


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
    # The ratio not given takes the rest: within 1e-9 of 0 (0.7 + 0.3 leaves 5.6e-17), none.
    rest = lambda r: 0.0 if abs(r) < 1e-9 else r  # noqa: E731
    if train is None:
        train = rest(1 - (val or 0) - (test or 0))
    elif val is None:
        val = rest(1 - train - (test or 0))
    elif test is None:
        test = rest(1 - train - val)
    val, test = val or 0.0, test or 0.0
    if min(train, val, test) < 0 or abs(train + val + test - 1) > 1e-6:
        raise UsageError(
            f"the train, val and test ratios must add up to 1, got {train:g} + {val:g} + {test:g}"
        )
    if not val and not test:  # all to train: no split (a val or test ratio given is one)
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


def cut_runs(count: int, ratios: tuple[float, float, float]) -> list[int]:
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
        ends = cut_runs(len(kept), ratios)
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
            ends = cut_runs(len(chunk), ratios)
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
