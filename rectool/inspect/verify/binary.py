"""The binary index checks (format 3): each `.npy` array and the identities file are the files
the manifest names (size, xxh3-128), valid arrays of their dtype and shape, and say what the
shards say: offsets and keys the `.idx` lines', labels the record headers', identity ranges the
identity records'.

What is known about the files is read once (`read_binary_index`, a `BinaryIndex`); each check
is a function of it and of a shard's facts. Arrays are mapped through the reader's own
`load_array` (its header read and checked before anything is mapped: a pickle never runs) and
compared shard by shard, as numpy columns.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...errors import InputError, RectoolError
from ...format.binindex import has_binary_index, read_identities
from ...format.digest import XXH3_128, file_digests
from ...format.window import ascending
from ...reader import INDEX_ARRAYS, load_array, open_regular
from .columns import flatnonzero_chunked
from .digests import compare_digests
from .facts import DatasetFacts, ShardFacts, held_rows
from .index import rising
from .report import CheckResult, Found, ProblemAt, one_problem

# Each array's (dtype, allowed dimensions): the reader's, and insightface's identity ranges.
ARRAY_KINDS = {**INDEX_ARRAYS, "identity_ranges": ("<i8", (2,))}


@dataclass(frozen=True, eq=False)
class IndexFile:
    """One file of a pack's binary index, as found: `name` ("offsets", ..., "identities"),
    its manifest `entry` ({"file", "bytes", "xxh3_128"}), and what reading it gave.

    `unusable` says why the file cannot be read at all (missing: `missing`); `digests` are
    computed only when its size is the manifest's. `array` is the mapped array (None when it
    is not a valid one: `invalid` says why); its data starts at byte `data_start`.
    """

    name: str
    path: str
    entry: Mapping[str, Any]
    size: int | None
    missing: bool = False
    unusable: str | None = None
    digests: Mapping[str, str] | None = None
    array: np.ndarray | None = None
    data_start: int = 0
    invalid: str | None = None

    def at(self, row: int) -> int:
        """Return the byte offset in the file of the array's row `row`."""
        assert self.array is not None
        return self.data_start + row * self.array[:1].nbytes


@dataclass(frozen=True, eq=False)
class BinaryIndex:
    """A pack's binary index as found beside its manifest: its files (`files`, by name), the
    samples of each shard (`samples`, the manifest's) and where each shard's begin
    (`bounds`), its `layout` ("insightface" when it names identity ranges or the manifest
    says so: samples are then image keys 1..N) and the identity names' file (`identities`,
    with `names_count` names read, or `names_invalid`)."""

    manifest_path: str
    samples: list[int]
    bounds: list[int]
    layout: str
    claimed: str | None  # the manifest's layout
    files: dict[str, IndexFile]
    identities: IndexFile | None
    names_count: int | None = None
    names_invalid: str | None = None


def no_index_note(target: str, dataset: DatasetFacts) -> str:
    """Say that a dataset has no binary index, and what writes one (a note, not a problem)."""
    if dataset.manifest is None:
        why = "no manifest: im2rec's, insightface's or bare shards"
    else:
        why = f"manifest format {dataset.manifest.get('format_version', 0)}"
    return (
        f"{target} has no binary index ({why}); its .idx text was checked. "
        f"`rectool index {target}` writes one"
    )


def read_binary_index(dataset: DatasetFacts) -> BinaryIndex | None:
    """Read what is known about the dataset's binary index; None when it has none.

    Each file is opened as a regular file, hashed when its size is the manifest's, and mapped
    as an array by the reader's `load_array` (an object array is refused from its header).
    """
    if not has_binary_index(dataset.manifest):
        return None
    manifest, path = dataset.manifest, dataset.manifest_path
    assert manifest is not None and path is not None  # a manifest names the index
    index, folder = manifest["index"], os.path.dirname(path)
    samples = [int(n) for n in index["samples"]]  # read_manifest checked them
    bounds = np.concatenate(([0], np.cumsum(samples, dtype=np.int64))).tolist()
    files = {}
    for name in ARRAY_KINDS:
        entry = index.get(name)
        if isinstance(entry, dict):
            length = None if name == "identity_ranges" else bounds[-1]
            files[name] = _read_array(name, os.path.join(folder, entry["file"]), entry, length)
    identities = names_count = names_invalid = None
    named = manifest.get("identities")
    if isinstance(named, dict) and "file" in named:
        identities = read_index_file("identities", os.path.join(folder, named["file"]), named)
        if identities.unusable is None and not identities.missing:
            try:
                names_count = len(read_identities(path, manifest) or {})
            except InputError as exc:
                names_invalid = str(exc).removeprefix(f"{identities.path}: ")
    claimed = manifest.get("layout")
    layout = "insightface" if "identity_ranges" in files or claimed == "insightface" else "images"
    return BinaryIndex(
        path, samples, bounds, layout, claimed, files, identities, names_count, names_invalid
    )


def read_index_file(name: str, path: str, entry: Mapping[str, Any]) -> IndexFile:
    """Return what is found of a file of the index: its size and (if the manifest's) digests.
    (`unpack` refuses an index changed after packing by it too.)"""
    if not os.path.lexists(path):
        return IndexFile(name, path, entry, None, missing=True)
    try:
        fd, st = open_regular(path, f"{name} file")
    except RectoolError as exc:
        return IndexFile(name, path, entry, None, unusable=str(exc).removeprefix(f"{path}: "))
    os.close(fd)
    digests = None
    if entry.get("bytes") in (None, st.st_size) and entry.get("xxh3_128"):
        try:
            digests = file_digests(path, [XXH3_128]).hexdigests()
        except (OSError, RectoolError) as exc:
            return IndexFile(name, path, entry, st.st_size, unusable=f"cannot read ({exc})")
    return IndexFile(name, path, entry, st.st_size, digests=digests)


def _read_array(name: str, path: str, entry: Mapping[str, Any], length: int | None) -> IndexFile:
    found = read_index_file(name, path, entry)
    if found.missing or found.unusable is not None:
        return found
    try:
        array = load_array(path, name, length, ARRAY_KINDS[name])
    except InputError as exc:
        return replace(found, invalid=str(exc).removeprefix(f"{path}: "))
    shape = "x".join(map(str, array.shape))
    if name == "identity_ranges" and array.shape[1:] != (2,):
        return replace(found, invalid=f"holds a {shape} array, not one [start, end) pair a row")
    assert found.size is not None  # a regular file
    return replace(found, array=array, data_start=found.size - array.nbytes)


def check_index_files(binary: BinaryIndex) -> Iterator[CheckResult]:
    """Every file of the binary index is there, a regular file of the manifest's size and
    xxh3-128, and a valid array of its dtype and shape (the identities file: names)."""
    every = [*binary.files.values(), *([binary.identities] if binary.identities else [])]
    for found in every:
        if found.missing:
            yield one_problem(
                "missing-file", found.path, None, None,
                f"the pack's {found.name} file, listed in the manifest, is missing; "
                "`rectool index` writes it again",
            )  # fmt: skip
            continue
        if found.unusable is not None:
            yield one_problem("index-file", found.path, None, None, found.unusable)
            continue
        expected = found.entry.get("bytes")
        if expected is not None and found.size != expected:
            yield one_problem(
                "size-mismatch", found.path, None, None,
                f"{found.size} bytes; the manifest says {expected}",
            )  # fmt: skip
        if found.digests is not None:
            want = {XXH3_128: found.entry["xxh3_128"]}
            yield from compare_digests("checksum-mismatch", found.path, want, found.digests)
        if found.invalid is not None:
            yield one_problem("index-file", found.path, None, None, found.invalid)
    names = binary.identities
    if names is None:
        return
    if binary.names_invalid is not None:
        yield one_problem("index-file", names.path, None, None, binary.names_invalid)
    elif binary.names_count is not None and names.entry.get("count") not in (
        None,
        binary.names_count,
    ):
        yield one_problem(
            "index-mismatch", names.path, None, None,
            f"holds {binary.names_count} names; the manifest says {names.entry['count']}",
        )  # fmt: skip


def check_index_layout(binary: BinaryIndex, layouts: set[str]) -> Iterator[Found]:
    """The index has identity ranges exactly when the pack is insightface's (`layouts`: those
    of the shards read)."""
    ranges = binary.files.get("identity_ranges")
    if ranges is not None and layouts and "insightface" not in layouts:
        yield one_problem(
            "index-mismatch", ranges.path, None, None,
            "the binary index holds identity ranges, but no shard has an insightface record 0",
        )  # fmt: skip
    elif ranges is None and "insightface" in layouts and binary.claimed != "images":
        yield one_problem(
            "index-mismatch", binary.manifest_path, None, None,
            "the pack has an insightface record 0, but its binary index names no "
            "identity_ranges file (readers would read it as images); `rectool index` writes one",
        )  # fmt: skip


def sample_lines(facts: ShardFacts, layout: str) -> slice | np.ndarray | None:
    """Return the .idx lines (from 0) of a shard's samples, in sample order, in the index's
    `layout`: every line (images: `slice(None)`); image keys 1..N, each at its last line
    (insightface).
    None when they are unknown: no .idx, or a layout the records do not have (other checks
    report those)."""
    index = facts.index
    if index is None:
        return None
    if layout == "images":
        return slice(None)  # every line: views of the .idx's columns, no copy
    if facts.layout.span is None or not len(index.keys):
        return None
    images = facts.layout.span[0] - 1
    if rising(index.keys):  # as a pack writes them: keys 1..N are one run of lines
        first = int(np.searchsorted(index.keys, 1))
        run = index.keys[first : first + images]
        if len(run) == images and (not images or (run[0] == 1 and run[-1] == images)):
            return slice(first, first + images)  # rising integers from 1 to N: each once
        return None  # a missing image key: an insightface-range problem
    want = np.arange(1, images + 1, dtype=np.int64)
    order = np.argsort(index.keys, kind="stable")
    found = np.searchsorted(index.keys, want, "right", sorter=order) - 1
    lines = order[np.maximum(found, 0)]
    if (index.keys[lines] != want).any():
        return None  # a missing image key: an insightface-range problem
    return lines


def check_index_arrays(facts: ShardFacts, binary: BinaryIndex, number: int) -> Iterator[Found]:
    """Shard `number`'s rows of the binary index say what the shard says: its sample count,
    each sample's offset and key its .idx line's, its label its record header's, and (in an
    insightface pack) the identity ranges its identity records'."""
    lines = sample_lines(facts, binary.layout)
    if lines is None:  # no .idx, or no insightface record 0: other checks say so
        return
    assert facts.index is not None  # `sample_lines` found lines
    keys, offsets = facts.index.keys[lines], facts.index.offsets[lines]
    count, listed = len(keys), binary.samples[number]
    if count != listed:
        yield one_problem(
            "index-mismatch", binary.manifest_path, None, None,
            f"index.samples[{number}] is {listed}, but {facts.idx} holds {count} samples; "
            "`rectool index` writes the index again",
        )  # fmt: skip
        return
    start = binary.bounds[number]
    for name, expected in (("offsets", offsets), ("keys", keys)):
        found = binary.files.get(name)
        if found is not None and found.array is not None:
            yield _compare_column(facts, found, start, expected, keys, lines)
    found = binary.files.get("labels")
    if found is not None and found.array is not None:
        yield _compare_labels(facts, found, start, offsets, keys)
    ranges = binary.files.get("identity_ranges")
    if ranges is not None and ranges.array is not None and facts.layout.span is not None:
        yield from _compare_ranges(facts, ranges)


def _compare_column(
    facts: ShardFacts,
    found: IndexFile,
    start: int,
    expected: np.ndarray,
    keys: np.ndarray,
    lines: slice | np.ndarray,
) -> Found:
    """Compare `found`'s rows from `start` with the .idx's column `expected`."""
    assert found.array is not None and facts.index is not None
    column = found.array[start : start + len(expected)]
    bad = flatnonzero_chunked(len(expected), lambda lo, hi: column[lo:hi] != expected[lo:hi])
    idx = os.path.basename(facts.idx)

    def problems() -> Iterator[ProblemAt]:
        assert facts.index is not None
        line_numbers = facts.index.lines[lines] if len(bad) else ()
        for i in bad.tolist():
            yield (
                found.path,
                keys[i],
                found.at(start + i),
                f"sample {start + i}: {os.path.basename(found.path)} holds {found.name[:-1]} "
                f"{int(column[i])}, but line {int(line_numbers[i])} of {idx} gives "
                f"{int(expected[i])}",
            )

    return Found("index-mismatch", len(bad), problems())


def _compare_labels(
    facts: ShardFacts, found: IndexFile, start: int, offsets: np.ndarray, keys: np.ndarray
) -> Found:
    """Compare `found`'s labels from `start` with the headers of the records at `offsets`
    (those that start a record with a whole header; the others are other checks'), a chunk
    of samples at a time."""
    assert found.array is not None
    labels = found.array[start : start + len(offsets)]
    width = labels.shape[1] if labels.ndim == 2 else 0
    starts, h = facts.framing.starts, facts.headers
    bad = flatnonzero_chunked(
        len(offsets), lambda lo, hi: _labels_differ(facts, labels[lo:hi], offsets[lo:hi], width)
    )
    name = os.path.basename(found.path)

    def shown(values: Any) -> str:
        return repr(float(values)) if np.ndim(values) == 0 else repr(np.asarray(values).tolist())

    def problems() -> Iterator[ProblemAt]:
        for i in bad.tolist():
            at = int(offsets[i])
            j = int(np.searchsorted(starts, at))  # a record starts there (others are not bad)
            flag = int(h.flag[j])
            if flag != width:
                held = "one label (flag 0)" if not flag else f"{flag} labels"
                want = "one label a sample" if not width else f"{width} labels a sample"
                why = f"the record's header holds {held}; {name} holds {want}"
            else:
                header = _header_labels(facts, np.array([j]), width)[0]
                why = f"{name} holds {shown(labels[i])}, the record's header {shown(header)}"
            yield (found.path, keys[i], found.at(start + i), f"sample {start + i} (record at "
                   f"byte {at} of {os.path.basename(facts.rec)}): {why}")  # fmt: skip

    return Found("index-mismatch", len(bad), problems())


def _labels_differ(
    facts: ShardFacts, labels: np.ndarray, offsets: np.ndarray, width: int
) -> np.ndarray:
    """Return which of `labels` (of samples at `offsets`, `width` labels a sample) are not
    the headers' of the records there: a record there with a whole header holds other
    labels, or another number of them."""
    starts, h = facts.framing.starts, facts.headers
    rows = np.searchsorted(starts, offsets)
    known = rows < len(starts)
    known[known] = starts[rows[known]] == offsets[known]
    rows = np.where(known, rows, 0)
    flags = np.zeros(len(rows), np.int64)
    if len(starts):  # (else no offset is known)
        known &= h.complete[rows]
        flags = h.flag[rows].astype(np.int64)
    other_width = known & (flags != width)
    same = np.flatnonzero(known & (flags == width))
    expected = _header_labels(facts, rows[same], width)
    got = labels[same]
    with np.errstate(invalid="ignore"):
        equal = (got == expected) | (np.isnan(got) & np.isnan(expected))
    if width:
        equal = equal.all(axis=1)
    bad = other_width
    bad[same[~equal]] = True
    return bad


def _header_labels(facts: ShardFacts, rows: np.ndarray, width: int) -> np.ndarray:
    """Return the labels in the headers of the records at framing `rows`, whose flag is
    `width`: the header's float (width 0), else its `width` float32 labels, (n, width)."""
    h = facts.headers
    if not width:
        return h.label0[rows]  # (flag 0: the header's float)
    out = np.zeros((len(rows), width), np.float32)
    split = facts.framing.split[rows]
    whole = np.flatnonzero(~split)
    if len(whole):
        # Read a window's batch of records at a time, in file order.
        order = ascending(rows[whole])
        if order is not None:
            whole = whole[order]
        words = np.frombuffer(facts.buf, "<u4", facts.size // 4)
        done = 0
        try:
            for batch in held_rows(facts.window, facts.framing, rows[whole]):
                # A whole record's labels follow its part header (2 words) and image header (6).
                at = facts.framing.starts[batch] // 4 + 8
                dest = whole[done : done + len(batch)]
                out[dest] = words[at[:, None] + np.arange(width)].view(np.float32)
                done += len(batch)
        finally:
            del words
    for i in np.flatnonzero(split).tolist():
        record = facts.read_record(int(facts.framing.starts[rows[i]]))
        out[i] = np.frombuffer(record, np.float32, width, 24)
    return out


def _compare_ranges(facts: ShardFacts, found: IndexFile) -> Iterator[Found]:
    """The identity ranges are the identity records' label pairs, less one (keys 1..N are
    samples 0..N-1); when the identity records are whole (else the layout check reports)."""
    assert found.array is not None and facts.layout.span is not None
    a, b = facts.layout.span
    h, keys = facts.headers, facts.keys
    by_key = np.full(b - a, -1, np.int64)
    inside = (keys >= a) & (keys < b)
    by_key[keys[inside] - a] = np.flatnonzero(inside)  # later records win, as later lines
    if (by_key < 0).any() or not (h.complete[by_key] & (h.flag[by_key] == 2)).all():
        return
    pairs = np.stack((h.label0[by_key], h.label1[by_key]), axis=1).astype(np.float64)
    if (pairs != np.round(pairs)).any():
        return
    expected = pairs.astype(np.int64) - 1
    ranges = found.array
    if len(ranges) != len(expected):
        yield one_problem(
            "index-mismatch", found.path, None, None,
            f"holds {len(ranges)} identity ranges, but record 0 of {facts.rec} announces "
            f"{len(expected)} identities",
        )  # fmt: skip
        return
    bad = np.flatnonzero((ranges != expected).any(axis=1))

    def problems() -> Iterator[ProblemAt]:
        for j in bad.tolist():
            held, want = ranges[j].tolist(), expected[j].tolist()
            yield (
                found.path,
                a + j,
                found.at(j),
                f"identity {j}: holds samples {held}, but its identity record (key {a + j}) "
                f"gives keys [{want[0] + 1}, {want[1] + 1}), samples {want}",
            )

    yield Found("index-mismatch", len(bad), problems())
