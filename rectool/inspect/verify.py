"""Verify a dataset: framing, index, headers, manifest checksums, insightface layout, decoding.

`verify_dataset` reports what it finds in the data as `Problem`s, each naming the file, the
record key and the byte offset where they are known; it raises `RectoolError` only when an
input cannot be read at all (no such dataset, a manifest that is not one, an unreadable file).
It works on files written by MXNet, im2rec and insightface as well as by `rectool pack`; a
manifest, when there is one, adds checksums, counts and the class count.

How it reads: what is known about a dataset (`DatasetFacts`) and about each shard
(`ShardFacts`: its index, framing, headers, record keys and layout) is worked out once, then
each check is a function of those facts that yields what it finds (`Found`, and `Tally` for
work the report counts). No check depends on another having run; their order is the order
in which problems are listed.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..build.images import (
    DEFAULT_MAX_PIXELS,
    ImageRefused,
    ImageTooLarge,
    check_container,
    inspect_image,
)
from ..build.manifest import finish_interrupted_source, leftover_staging
from ..build.passthrough import refused_images
from ..doors.inputs import open_input
from ..errors import IndexFormatError, RectoolError
from ..format.checksums import (
    ChecksumFileError,
    algorithm_of,
    checksum_path,
    damaged_records,
    load_checksums,
    show_checksum,
    stale_reason,
)
from ..format.digest import DIGEST_NAMES, FIELD, digests_of, field_name, file_digests
from ..format.keys import FLOAT32_EXACT
from ..reader import (
    DATASET_LAYOUTS,
    IMAGE_HEADER_SIZE,
    MAGIC_BYTES,
    RecordFile,
    parse_index,
    read_index_cache,
    resolve_source,
    source_prefixes,
    unpack_header,
)
from .scan import (
    Framing,
    Headers,
    image_formats,
    insightface_ranges,
    mapped,
    read_headers,
    scan_framing,
)

PROBLEM_KINDS = {
    "truncated": "the file ends inside a record",
    "bad-length": "a part's length runs past the end of the file, yet records follow it",
    "bad-magic": "a part does not begin with the RecordIO magic",
    "bad-cflag": "a part's continuation flag is out of sequence",
    "bad-padding": "the padding after a part is not zero bytes",
    "trailing-garbage": "bytes after the last record are not a record",
    "missing-index": "there is no .idx beside the .rec",
    "empty-index": "the .idx is empty, but the .rec holds records",
    "index-syntax": "an .idx line is not 'key<TAB>offset'",
    "index-offset": "an .idx offset is not the start of a record",
    "unindexed-record": "a record is not in the .idx",
    "duplicate-key": "a key appears on more than one .idx line",
    "duplicate-offset": "two keys point at the same record",
    "stale-index-cache": "the .idx.rtc sidecar cache disagrees with the .idx",
    "bad-header": "the image header does not fit the record",
    "bad-label": "a label is not finite, not integral, or outside the class count",
    "empty-image": "an image record holds no image bytes",
    "not-an-image": "an image record's bytes have no known image signature",
    "id-mismatch": "a record's header id differs from its .idx key (rectool packs write both)",
    "missing-file": "a file the manifest lists is missing",
    "size-mismatch": "a file's size differs from the manifest",
    "checksum-mismatch": "a file's digest (xxh3-128 or SHA-256) differs from the manifest",
    "record-checksum-mismatch": "a record's bytes differ from their checksum taken when packed",
    "checksum-file": "a shard's .rec.crc per-record checksum file is missing, malformed or altered",
    "count-mismatch": "a record count differs from the manifest",
    "key-mismatch": "a shard's first or last key differs from the manifest",
    "manifest": "the manifest contradicts itself or the data's layout",
    "insightface-header": "record 0 of an insightface layout is missing or malformed",
    "insightface-range": "insightface identity ranges are missing, overlap or leave gaps",
    "insightface-label": "an image's label is not the identity whose range holds it",
    "float32-inexact": "a number stored as float32 exceeds 2**24, where float32 is not exact",
    "image-damaged": "an image's bytes fail pack's structural check (truncated, corrupt markers "
    "or chunks)",
    "decode-failed": "an image does not decode",
    "image-too-large": "an image's header declares more pixels than the decode limit",
    "image-size": "an image's size differs from the expected size",
    "image-channels": "an image's channel count differs from the expected one",
}

DEFAULT_KEEP = 1000
_DECODE_BATCH = 256


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a dataset: what (`kind`, see PROBLEM_KINDS), where and why."""

    kind: str
    path: str
    key: int | None
    offset: int | None
    message: str

    def to_json(self):
        return {
            "kind": self.kind,
            "path": self.path,
            "key": self.key,
            "offset": self.offset,
            "message": self.message,
        }

    def __str__(self):
        where = [self.path]
        if self.key is not None:
            where.append(f"key {self.key}")
        if self.offset is not None:
            where.append(f"byte offset {self.offset}")
        return f"{self.kind}: {', '.join(where)}: {self.message}"


@dataclass
class VerifyReport:
    """What `verify_dataset` checked and found.

    `problems` holds the first `keep` problems; `problem_count` and `counts` (by kind) count
    all of them. The dataset is sound when `problem_count` is 0.
    """

    targets: list
    shards: list = field(default_factory=list)  # {"rec", "idx", "records", "rec_bytes"}
    layouts: list = field(default_factory=list)  # one per target
    records: int = 0
    images: int = 0
    rec_bytes: int = 0
    checksums: int = 0  # files compared with a manifest checksum
    # Records compared with their checksum (.rec.crc): in shards whose digest is not a match.
    record_checksums: int = 0
    # The digests verify computed and compared: of whole files ("xxh3-128", "sha256") and of
    # records ("xxh3-64", "crc32"), each named once.
    file_digests: list = field(default_factory=list)
    record_digests: list = field(default_factory=list)
    decoded: int = 0
    seconds: float = 0.0
    problems: list = field(default_factory=list)
    problem_count: int = 0
    counts: Counter = field(default_factory=Counter)
    # Prefixes whose interrupted replacement verify finished before checking them.
    finished: list = field(default_factory=list)
    # Staging folders that a killed `--overwrite` left beside the targets (not part of a pack).
    staging: list = field(default_factory=list)

    @property
    def sound(self):
        """Return True when no problem was found."""
        return self.problem_count == 0

    def to_json(self):
        return {
            "sound": self.sound,
            "targets": self.targets,
            "layouts": self.layouts,
            "shards": self.shards,
            "records": self.records,
            "images": self.images,
            "rec_bytes": self.rec_bytes,
            "checksums": self.checksums,
            "record_checksums": self.record_checksums,
            "digests": {"files": self.file_digests, "records": self.record_digests},
            "decoded": self.decoded,
            "seconds": round(self.seconds, 3),
            "problem_count": self.problem_count,
            "counts": dict(sorted(self.counts.items())),
            "problems": [p.to_json() for p in self.problems],
            "finished_replacements": self.finished,
            "leftover_staging": self.staging,
        }


@dataclass(frozen=True)
class Found:
    """`total` problems of one `kind`, found by a check.

    `problems` yields their (path, key, offset, message), lazily: the report keeps only its
    first `keep` problems, so messages past those are never made.
    """

    kind: str
    total: int
    problems: Iterable  # of (path, key, offset, message)


def compare_digests(kind, path, expected, actual, suffix=""):
    """Yield what comparing a file's `actual` digests with the manifest's `expected` ones found:
    the tallies, and one `kind` finding naming every digest that differs (then `suffix`)."""
    yield Tally("checksums", 1)
    for algorithm in expected:
        yield Compared("file_digests", algorithm)
    differ = [a for a in expected if actual[a] != expected[a]]
    if differ:
        message = "; ".join(
            f"{DIGEST_NAMES[a]} {actual[a]} differs from the manifest's {expected[a]}"
            for a in differ
        )
        yield _one(kind, path, None, None, message + suffix)


def _one(kind, path, key, offset, message):
    return Found(kind, 1, ((path, key, offset, message),))


@dataclass(frozen=True)
class Compared:
    """A check compared data with an `algorithm` digest: `VerifyReport.<kind>` names it."""

    kind: str  # "file_digests" or "record_digests"
    algorithm: str


@dataclass(frozen=True)
class Tally:
    """Work a check did that the report counts: `VerifyReport.<name>` grows by `n`."""

    name: str
    n: int


class _Findings:
    """Collect what checks yield into the report: keep the first `keep` problems, count all."""

    def __init__(self, report, keep):
        self.report, self.keep = report, keep

    def take(self, items):
        """Record every `Found` and `Tally` of the iterable `items`, as they come."""
        for item in items:
            if isinstance(item, Tally):
                setattr(self.report, item.name, getattr(self.report, item.name) + item.n)
            elif isinstance(item, Compared):
                names = getattr(self.report, item.kind)
                if item.algorithm not in names:
                    names.append(item.algorithm)
            else:
                self._add(item)

    def _add(self, found):
        problems = self.report.problems
        for path, key, offset, message in found.problems:
            if len(problems) >= self.keep:
                break
            problems.append(
                Problem(
                    found.kind,
                    os.fspath(path),
                    None if key is None else int(key),
                    None if offset is None else int(offset),
                    message,
                )
            )
        if found.total:
            self.report.problem_count += found.total
            self.report.counts[found.kind] += found.total


@dataclass
class DecodeOptions:
    """What `--decode` checks: every image decodes; optionally its (height, width) and channels.

    An image whose header declares more than `max_pixels` pixels is not decoded: it is an
    `image-too-large` problem.
    """

    size: tuple | None = None
    channels: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS


def verify_dataset(
    targets, decode=None, workers=None, keep=DEFAULT_KEEP, progress=None, image_check=True
):
    """Check every target (manifest, prefix, .rec, or folder with train.rec); return a report.

    `decode` is a `DecodeOptions` (or None to skip decoding); it decodes every image with
    `workers` threads (default: all cores). Without it, `image_check` walks every image's
    structure as `pack` checks it (`check_image_structure`: "image-damaged" problems).
    `progress(phase, done, total)` is called with phase "bytes" as shards are walked and
    "images" as they decode. Raises `RectoolError` when a target cannot be read.
    """
    if isinstance(targets, (str, os.PathLike)):
        targets = [targets]
    targets = [os.fspath(t) for t in targets]
    if not targets:
        raise RectoolError("no dataset given to verify")
    finished = [p for t in targets for p in finish_interrupted_source(t)]
    resolved = [resolve_source(t) for t in targets]
    staging = sorted({s for t in targets for p in source_prefixes(t) if (s := leftover_staging(p))})
    report = VerifyReport(targets, finished=finished, staging=staging)
    findings = _Findings(report, keep)
    workers = workers or os.cpu_count() or 1
    start = time.perf_counter()
    total_bytes = sum(_size_or_zero(rec) for _, _, shards in resolved for rec, _ in shards)
    done_bytes = 0
    # Digests run on their own thread (hashlib and xxhash release the GIL) during the walk.
    with (
        ThreadPoolExecutor(1, thread_name_prefix="rectool-digest") as hasher,
        ThreadPoolExecutor(workers, thread_name_prefix="rectool-decode") as decoder,
    ):
        for manifest, manifest_path, shards in resolved:
            dataset = DatasetFacts.of(manifest, manifest_path, shards)
            hashes = _ShardHashes(dataset, hasher)
            repeats = repeated_shards(shards)
            layouts, indexes = set(), []
            for number in range(len(shards)):
                if number in repeats:
                    findings.take(check_listed_once(dataset, number, repeats[number]))
                    continue
                layout, index, size = _verify_shard(
                    dataset, number, findings, hashes, decode, decoder, progress, image_check,
                )  # fmt: skip
                layouts.add(layout)
                if index is not None:
                    indexes.append(index)
                done_bytes += size
                if progress is not None:
                    progress("bytes", done_bytes, total_bytes)
            findings.take(hashes.check())
            findings.take(check_totals(dataset))
            findings.take(check_keys_across_shards(indexes))
            layouts.discard(None)
            report.layouts.append("/".join(sorted(layouts)) or "empty")
    report.seconds = time.perf_counter() - start
    return report


def _size_or_zero(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# -- a dataset: what is known, and the checks across its shards ------------------------------
@dataclass(frozen=True)
class DatasetFacts:
    """A dataset's manifest (or None) and shards; `entries[n]` is shard n's manifest entry.

    `entries` are all None when there is no manifest or it lists another number of shards.
    """

    manifest: dict | None
    manifest_path: str | None
    shards: list  # of (rec, idx)
    entries: list
    classes: int | None

    @classmethod
    def of(cls, manifest, manifest_path, shards):
        entries = (manifest or {}).get("shards") or []
        if len(entries) != len(shards):
            entries = [None] * len(shards)
        return cls(manifest, manifest_path, shards, entries, (manifest or {}).get("classes"))


def repeated_shards(shards):
    """Return {shard number: number of the shard listed first} for each .rec listed again."""
    first, repeats = {}, {}
    for number, (rec, _) in enumerate(shards):
        seen = first.setdefault(os.path.realpath(rec), number)
        if seen != number:
            repeats[number] = seen
    return repeats


def check_listed_once(dataset, number, first):
    """Shard `number`'s .rec is the one shard `first` already lists."""
    rec = dataset.shards[number][0]
    yield _one(
        "manifest",
        dataset.manifest_path or rec,
        None,
        None,
        f"lists {rec} twice (shards {first} and {number}); readers would serve each of "
        "its records twice",
    )


def expected_digests(entry, file):
    """Return {algorithm: hex} of the digests a manifest `entry` gives `file` ("rec", "idx",
    "crc"): xxh3-128 and/or SHA-256 (version 2), SHA-256 (version 1)."""
    found = {a: (entry or {}).get(field_name(file, a)) for a in FIELD}
    return {a: h for a, h in found.items() if h}


class _ShardHashes:
    """The digests of each file whose manifest entry gives some (and the size it has),
    computed on the `hasher` thread while the shards are walked: each file read once.

    A .rec is hashed from the mapping its shard's checks walk (`start`), so the hashing
    thread, not the walk, faults its pages in, and no byte is copied to be hashed; a .rec
    whose shard is not walked is read from its file (`check`).
    """

    def __init__(self, dataset, hasher):
        self.expected, self.futures = {}, {}  # path -> {algorithm: hex}, path -> future
        self._hasher, self._mapped = hasher, {}  # .rec path -> algorithms, until `start`
        for (rec, idx), entry in zip(dataset.shards, dataset.entries):
            if entry is None:
                continue
            for path, file in ((rec, "rec"), (idx, "idx")):
                expected = expected_digests(entry, file)
                if (
                    expected
                    and _size_or_zero(path) == entry.get(f"{file}_bytes")
                    and os.path.exists(path)
                ):
                    self.expected[path] = expected
                    if file == "rec":
                        self._mapped[path] = list(expected)
                    else:
                        self.futures[path] = hasher.submit(_hexdigests, path, list(expected))

    def start(self, path, buf, size):
        """Start hashing the .rec `path` from its mapping `buf` (`size` bytes); a view of it
        keeps it mapped until the hashing is done with it."""
        algorithms = self._mapped.pop(path, None)
        if algorithms is not None and size == os.path.getsize(path):
            # The view is taken here: the mapping cannot be closed before it is hashed.
            view = memoryview(buf)[:size]
            self.futures[path] = self._hasher.submit(_view_hexdigests, view, algorithms)
        elif algorithms is not None:
            self.futures[path] = self._hasher.submit(_hexdigests, path, algorithms)

    def matches(self, path):
        """Return True when `path`'s digests were computed and are all the manifest's (waits
        for them)."""
        future = self.futures.get(path)
        if future is None:
            return False
        try:
            return future.result() == self.expected[path]
        except (OSError, RectoolError):  # reported by `check`
            return False

    def check(self):
        """Each file's digests are the manifest's. Raises `RectoolError` for an unreadable one."""
        for path, algorithms in self._mapped.items():  # shards not walked: read their files
            self.futures[path] = self._hasher.submit(_hexdigests, path, algorithms)
        self._mapped = {}
        for path, future in self.futures.items():
            try:
                actual = future.result()
            except OSError as exc:
                raise RectoolError(f"{path}: cannot read ({exc.strerror or exc})") from None
            yield from compare_digests("checksum-mismatch", path, self.expected[path], actual)


def _hexdigests(path, algorithms):
    return file_digests(path, algorithms).hexdigests()


def _view_hexdigests(view, algorithms):
    with view:
        return digests_of(view, algorithms)


def check_totals(dataset):
    """The manifest's totals are the sums of its shards' entries."""
    manifest, path = dataset.manifest, dataset.manifest_path
    if manifest is None:
        return
    shards = manifest["shards"]  # read_manifest checked every field used here
    totals = manifest.get("totals") or {}
    checks = [("shards", len(shards))]
    for name in ("records", "rec_bytes"):  # null: not recorded, as a missing field
        if all(s.get(name) is not None for s in shards):
            checks.append((name, sum(s[name] for s in shards)))
    for name, actual in checks:
        if totals.get(name) is not None and totals[name] != actual:
            yield _one(
                "manifest",
                path,
                None,
                None,
                f"totals.{name} is {totals[name]} but its shards add up to {actual}",
            )


def check_keys_across_shards(indexes):
    """No key is in two shards' .idx (`indexes`: the `ShardIndex` of each shard that has one)."""
    if len(indexes) < 2:
        return
    keys = np.concatenate([i.keys for i in indexes])
    shard_of = np.concatenate([np.full(len(i.keys), n) for n, i in enumerate(indexes)])
    line_of = np.concatenate([np.arange(1, len(i.keys) + 1) for i in indexes])
    order = np.argsort(keys, kind="stable")
    sk, ss = keys[order], shard_of[order]
    clash = np.flatnonzero((sk[1:] == sk[:-1]) & (ss[1:] != ss[:-1]))

    def problems():
        for i in clash.tolist():
            a, b = order[i], order[i + 1]
            first, second = indexes[shard_of[a]], indexes[shard_of[b]]
            yield (
                second.path,
                keys[b],
                second.offsets[line_of[b] - 1],
                f"key {keys[b]} is also in {first.path} (line {line_of[a]}); "
                "keys must be unique across a dataset's shards",
            )

    yield Found("duplicate-key", len(clash), problems())


# -- a shard: what is known about it -----------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ShardIndex:
    """A shard's .idx as parsed: `lines[i]` is the line number of (`keys[i]`, `offsets[i]`).

    `bad_lines` holds (line number, its first 80 bytes) of each line that is not
    'key<TAB>offset'; there are some only when the strict parser refused the file and it was
    parsed leniently, as MXNet would.
    """

    path: str
    keys: np.ndarray
    offsets: np.ndarray
    lines: np.ndarray
    bad_lines: tuple = ()


@dataclass(frozen=True, eq=False)
class FoundLayout:
    """How a shard's records are found laid out (what `build.layout.Layout` wrote): `name` is
    "images" or "insightface".

    For insightface, `header` is record 0's row and `span` its label (a, b): images are keys
    1..a-1, identities keys a..b-1. `images` marks the records that hold images; `classes` is
    the class count labels must stay below (the manifest's, or the identities record 0
    announces), or None when unknown.
    """

    name: str
    header: int | None
    span: tuple | None
    images: np.ndarray
    classes: int | None


def decide_layout(keys, starts, headers, read_record, classes):
    """Return the `FoundLayout` of records with these keys, starts and headers.

    The rule is the reader's (`scan.insightface_ranges`); a manifest's claim does not change
    it (`check_layout` reports a manifest that disagrees).
    `classes`: the manifest's class count, or None.
    """
    ranges = insightface_ranges(keys, starts, headers, read_record)
    if ranges is None:
        return FoundLayout("images", None, None, np.ones(len(headers), bool), classes)
    a, b = ranges[1].start, ranges[1].stop
    header = int(np.flatnonzero(keys == 0)[-1])
    return FoundLayout("insightface", header, (a, b), ~((keys == 0) | (keys >= a)), b - a)


@dataclass(frozen=True, eq=False)
class ShardFacts:
    """What is known about one .rec/.idx pair, worked out once by `read_shard`.

    `buf` (the mapped .rec, `size` bytes) and `read_record(offset)` are valid while the shard
    is open. Arrays are per record found by the framing walk, in file order: `keys` is each
    record's key (from the .idx, its last line winning; else its header id), `indexed` whether
    an .idx line points at it; `index_hit[i]` whether .idx line i points at a record.
    `sound` marks complete headers with no stray label; `unknown_signature` the image records
    (sound, non-empty) whose bytes have no known image signature.
    """

    dataset: DatasetFacts
    rec: str
    idx: str
    entry: dict | None
    size: int
    buf: object  # mmap, or b"" for an empty file
    read_record: Callable  # offset -> the record's bytes, split parts rejoined
    index: ShardIndex | None
    framing: Framing
    headers: Headers
    keys: np.ndarray
    indexed: np.ndarray | None
    index_hit: np.ndarray | None
    layout: FoundLayout
    sound: np.ndarray
    unknown_signature: np.ndarray

    @cached_property
    def _key_by_offset(self):
        return dict(zip(self.index.offsets.tolist(), self.index.keys.tolist()))  # last line wins

    def key_at(self, offset):
        """Return the key the .idx gives the record starting at `offset`, else None."""
        if self.index is None:
            return None
        return self._key_by_offset.get(offset)


def read_shard(dataset, number, buf, size, read_record):
    """Return the `ShardFacts` of shard `number`, whose .rec is mapped as `buf` of `size` bytes.

    Raises `RectoolError` when the .idx exists but cannot be read.
    """
    rec, idx = dataset.shards[number]
    index = read_index(idx)
    framing = scan_framing(buf, size, None if index is None else index.offsets)
    starts = framing.starts
    h = read_headers(buf, size, starts, framing.lengths, framing.split, read_record)
    keys = h.id.astype(np.int64)
    indexed = index_hit = None
    if index is not None:
        pos = np.searchsorted(starts, index.offsets)
        index_hit = pos < len(starts)
        index_hit[index_hit] = starts[pos[index_hit]] == index.offsets[index_hit]
        keys[pos[index_hit]] = index.keys[index_hit]  # later lines overwrite earlier ones
        indexed = np.zeros(len(starts), bool)
        indexed[pos[index_hit]] = True
    entry = dataset.entries[number]
    layout = decide_layout(keys, starts, h, read_record, dataset.classes)
    # MXNet's pack zeroes the header's float whenever labels follow it.
    sound = h.complete & ~((h.flag > 0) & (h.label != 0))
    rows = np.flatnonzero(layout.images & sound & (h.image > 0))
    formats = image_formats(buf, size, starts, h, framing.split, rows, read_record)
    unknown = rows[np.equal(formats, None)]
    return ShardFacts(
        dataset, rec, idx, entry, size, buf, read_record, index, framing, h, keys, indexed,
        index_hit, layout, sound, unknown,
    )  # fmt: skip


def read_index(idx):
    """Parse the .idx at `idx`; return its `ShardIndex`, or None when there is none."""
    if not os.path.exists(idx):
        return None
    try:
        with open_input(idx, "index file") as f:
            data = f.read()
    except OSError as exc:
        raise RectoolError(f"{idx}: cannot read ({exc.strerror or exc})") from None
    try:
        keys, offsets = parse_index(data, idx)
    except IndexFormatError:
        return _parse_index_leniently(idx, data)
    return ShardIndex(idx, keys, offsets, np.arange(1, len(keys) + 1))


def _parse_index_leniently(idx, data):
    """Parse what can be parsed, as MXNet would (`int()` of two tab-separated fields)."""
    keys, offsets, lines, bad = [], [], [], []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw and number > data.count(b"\n"):
            break  # the empty remainder after the final newline
        fields = raw.strip().split(b"\t")
        try:
            key, offset = int(fields[0]), int(fields[1])
            if offset < 0 or not (-(2**63) <= key < 2**63) or offset >= 2**63:
                raise ValueError
        except (ValueError, IndexError):
            bad.append((number, raw[:80]))
            continue
        keys.append(key)
        offsets.append(offset)
        lines.append(number)
    return ShardIndex(
        idx,
        np.array(keys, np.int64),
        np.array(offsets, np.int64),
        np.array(lines),
        tuple(bad),
    )


# -- a shard: its checks, in the order they report ----------------------------------------------
def _verify_shard(dataset, number, findings, hashes, decode, decoder, progress, image_check=True):
    """Run every check of shard `number`; return (layout name, its `ShardIndex`, bytes).

    `hashes` (`_ShardHashes`) hashes the .rec from the mapping the checks walk, beside them.
    """
    rec, _ = dataset.shards[number]
    if not os.path.exists(rec):
        if dataset.manifest is None:
            raise RectoolError(f"{rec}: record file not found")
        findings.take([_one("missing-file", rec, None, None, "listed in the manifest, missing")])
        return None, None, 0
    with mapped(rec) as (buf, size), RecordFile(rec) as records:
        hashes.start(rec, buf, size)
        facts = read_shard(dataset, number, buf, size, records.read_at)
        for check in (
            check_index_file(facts),
            check_framing(facts),
            check_index(facts),
            check_layout(facts),
            check_headers(facts),
            check_manifest_entry(facts),
            check_record_checksums(facts, hashes.matches),
        ):
            findings.take(check)
        report, records_found = findings.report, len(facts.framing.starts)
        report.shards.append(
            {"rec": rec, "idx": facts.idx, "records": records_found, "rec_bytes": size}
        )
        report.records += records_found
        report.images += int(facts.layout.images.sum())
        report.rec_bytes += size
        if decode is None and image_check:  # decoding checks the structure first
            findings.take(check_image_structure(facts))
        if decode is not None:
            rows = decodable_rows(facts)
            for item in check_decoding(facts, rows, decode, decoder):
                findings.take([item])
                if progress is not None and isinstance(item, Tally):
                    progress("images", report.decoded, len(rows))
    return facts.layout.name, facts.index, size


def check_index_file(facts):
    """The .idx exists, every line parses, and its sidecar cache (if any) agrees with it."""
    idx, index = facts.idx, facts.index
    if index is None:
        kind = "missing-file" if facts.entry is not None else "missing-index"
        yield _one(
            kind, idx, None, None, f"no index; rebuild it with `rectool reindex {facts.rec}`"
        )
        return
    yield Found(
        "index-syntax",
        len(index.bad_lines),
        ((idx, None, None, f"line {number}: expected 'key<TAB>offset' with integers, got {raw!r}")
         for number, raw in index.bad_lines),
    )  # fmt: skip
    try:
        cached = read_index_cache(idx)
    except (OSError, ValueError):
        cached = None
    if cached is None:
        return
    if not (np.array_equal(cached[0], index.keys) and np.array_equal(cached[1], index.offsets)):
        yield _one(
            "stale-index-cache",
            idx + ".rtc",
            None,
            None,
            "the sidecar cache matches the .idx's size and time but not its content; "
            "delete it (readers would use its offsets)",
        )


def check_framing(facts):
    """Every byte of the .rec is a record: magic, lengths, continuation flags, zero padding."""
    rec, size, framing = facts.rec, facts.size, facts.framing
    damage = framing.damage
    for d in damage:
        key = facts.key_at(d.start)
        last = d is damage[-1] and d.end == size
        indexed_after = (
            facts.index is not None and bool((facts.index.offsets >= d.start).any()) and key is None
        )
        short_tail = d.part + 8 > size and d.part == d.start
        tail = bytes(facts.buf[d.start : min(size, d.start + 4)])
        looks_like_start = short_tail and MAGIC_BYTES.startswith(tail)
        if (
            last
            and key is None
            and not indexed_after
            and (d.kind in ("bad-magic", "bad-cflag") or (short_tail and not looks_like_start))
        ):
            yield _one(
                "trailing-garbage",
                rec,
                None,
                d.start,
                f"{size - d.start} bytes after the last record are not a record",
            )
            continue
        skipped = f"bytes {d.start}..{d.end} ({d.end - d.start} bytes) are unreadable"
        where = f" (part at byte {d.part})" if d.part != d.start else ""
        yield _one(d.kind, rec, key, d.start, f"{d.reason}{where}; {skipped}")
    for start, part in framing.bad_padding:
        where = "" if part == start else f" of the part at byte {part}"
        yield _one(
            "bad-padding", rec, facts.key_at(start), start, f"the padding{where} is not zero bytes"
        )


def check_index(facts):
    """The .idx fits the .rec: every offset a record start, every record indexed, keys unique."""
    if facts.index is None:
        return
    index, idx = facts.index, facts.idx
    keys, offsets, lines = index.keys, index.offsets, index.lines
    starts, ends = facts.framing.starts, facts.framing.ends
    damage_starts = {d.start for d in facts.framing.damage}

    miss = np.flatnonzero(~facts.index_hit)
    miss = [i for i in miss.tolist() if int(offsets[i]) not in damage_starts]
    yield Found(
        "index-offset",
        len(miss),
        ((idx, keys[i], int(offsets[i]),
          f"line {lines[i]}: {_describe_offset(facts, int(offsets[i]))}")
         for i in miss),
    )  # fmt: skip

    unindexed = np.flatnonzero(~facts.indexed)
    if not len(keys) and len(unindexed):
        yield _one(
            "empty-index",
            idx,
            None,
            None,
            f"no lines, but {os.path.basename(facts.rec)} holds {len(unindexed)} records; "
            f"rebuild it with `rectool reindex {facts.rec} --overwrite`",
        )
        unindexed = unindexed[:0]

    def unindexed_problems():
        for j in unindexed.tolist():
            header_id = int(facts.headers.id[j]) if facts.headers.complete[j] else None
            named = f" (header id {header_id})" if header_id is not None else ""
            yield (
                facts.rec,
                header_id,
                starts[j],
                f"the record at byte {starts[j]}{named}, {ends[j] - starts[j]} bytes, "
                f"is not in {os.path.basename(idx)}",
            )

    yield Found("unindexed-record", len(unindexed), unindexed_problems())

    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    repeated = np.flatnonzero(sk[1:] == sk[:-1]) + 1

    def duplicate_problems():
        for i in repeated.tolist():
            first, again = order[i - 1], order[i]
            yield (
                idx,
                keys[again],
                offsets[again],
                f"line {lines[again]} repeats the key of line {lines[first]} "
                f"(offsets {offsets[first]} and {offsets[again]}); readers keep the last",
            )

    yield Found("duplicate-key", len(repeated), duplicate_problems())

    order = np.argsort(offsets, kind="stable")
    so = offsets[order]
    shared = np.flatnonzero(so[1:] == so[:-1]) + 1
    shared = shared[keys[order[shared]] != keys[order[shared - 1]]].tolist()  # no loop per line

    def shared_problems():
        for i in shared:
            first, again = order[i - 1], order[i]
            yield (
                idx,
                keys[again],
                offsets[again],
                f"line {lines[again]} points at the same record as line {lines[first]} "
                f"(key {keys[first]})",
            )

    yield Found("duplicate-offset", len(shared), shared_problems())


def _describe_offset(facts, offset):
    starts, ends, size = facts.framing.starts, facts.framing.ends, facts.size
    if offset >= size:
        return f"offset {offset} is past the end of the file ({size} bytes)"
    j = int(np.searchsorted(starts, offset, side="right")) - 1
    if j >= 0 and offset < ends[j]:
        key = int(facts.keys[j])
        return (
            f"offset {offset} is inside the record at byte {starts[j]} (key {key}), "
            "not at a record start"
        )
    for d in facts.framing.damage:
        if d.start <= offset < d.end:
            return f"offset {offset} is inside unreadable bytes {d.start}..{d.end}"
    return f"offset {offset} is not a record start"


def check_layout(facts):
    """An insightface layout is whole (record 0, identity ranges, labels, `property` file), and
    the manifest names the layout the records have.

    The layout is the reader's rule's; the manifest's claim does not change it. A manifest
    that says insightface over records whose record 0 is no such header is an
    "insightface-header" problem (they are checked as the images layout, as every reader
    reads them); one that says images over an insightface header is a "manifest" problem.
    """
    layout = facts.layout
    if layout.header is not None:
        yield from _check_insightface(facts)
    claimed = facts.dataset.manifest.get("layout") if facts.entry is not None else None
    if claimed not in DATASET_LAYOUTS or claimed == layout.name:
        return
    if layout.header is None:
        yield _not_a_header(facts)
    else:
        yield _one(
            "manifest",
            facts.dataset.manifest_path,
            None,
            None,
            f"says layout {claimed}, but {facts.rec} has an insightface header record 0",
        )


def _not_a_header(facts):
    """Name what record 0 (and key 1) hold, when a manifest says insightface but they do not."""
    h, keys, starts = facts.headers, facts.keys, facts.framing.starts
    zero, one = np.flatnonzero(keys == 0), np.flatnonzero(keys == 1)
    says = (
        "the manifest says layout insightface, but record 0 is not its header (flag 2, no image "
        "bytes, whole-number labels [N+1, N+1+K], key 1 with one label)"
    )
    if not zero.size:
        return _one("insightface-header", facts.rec, None, None, f"{says}: there is no record 0")
    j = int(zero[-1])
    flag = int(h.flag[j])
    if not h.complete[j]:
        held = "a header cut short"
    elif flag == 0:
        held = f"flag 0, {int(h.image[j])} image bytes, label {float(h.label[j])!r}"
    else:
        labels = ", ".join(repr(float(x)) for x in (h.label0[j], h.label1[j])[:flag])
        more = ", ..." if flag > 2 else ""
        held = f"flag {flag}, {int(h.image[j])} image bytes, labels [{labels}{more}]"
    if one.size and h.complete[one[-1]]:
        held += f"; key 1 has flag {int(h.flag[one[-1]])}"
    return _one("insightface-header", facts.rec, 0, starts[j], f"{says}: it has {held}")


def _check_insightface(facts):
    h, rec, layout = facts.headers, facts.rec, facts.layout
    starts, keys, j = facts.framing.starts, facts.keys, layout.header
    a, b = layout.span
    if b > FLOAT32_EXACT:
        yield _one(
            "float32-inexact",
            rec,
            0,
            starts[j],
            f"record 0's label [{a}, {b}] needs keys above {FLOAT32_EXACT:,}, "
            "where float32 labels are not exact",
        )
    images, identities = a - 1, b - a
    declared = facts.dataset.classes
    if declared is not None and declared != identities:
        yield _one(
            "manifest",
            facts.dataset.manifest_path,
            None,
            None,
            f"says {declared} classes, but record 0 of {rec} announces {identities} identities",
        )
    by_key = np.full(b, -1, np.int64)
    inside = (keys >= 0) & (keys < b)
    by_key[keys[inside]] = np.flatnonzero(inside)
    outside = np.flatnonzero(~inside)
    yield Found(
        "insightface-range",
        len(outside),
        ((rec, keys[i], starts[i],
          f"key {keys[i]} is outside the layout's keys 0..{b - 1} that record 0 announces")
         for i in outside.tolist()),
    )  # fmt: skip
    missing = np.flatnonzero(by_key[1:] < 0) + 1

    def missing_problems():
        for k in missing.tolist():
            if k < a:
                what = f"image key {k} (of 1..{images})"
            else:
                what = f"identity key {k} (of {a}..{b - 1})"
            yield rec, k, None, f"{what} is missing; record 0 announces it"

    yield Found("insightface-range", len(missing), missing_problems())
    ids = by_key[a:]
    present = ids >= 0
    rows = ids[present]
    not_ranges = rows[~(h.complete[rows] & (h.flag[rows] == 2))]
    yield Found(
        "insightface-range",
        len(not_ranges),
        ((rec, keys[i], starts[i],
          f"identity record has flag {h.flag[i]}, expected 2 (a [start, end) label pair)")
         for i in not_ranges.tolist()),
    )  # fmt: skip
    if len(missing) or len(not_ranges):
        return
    lo, hi = h.label0[ids].astype(np.float64), h.label1[ids].astype(np.float64)
    expect_lo = np.concatenate(([1.0], hi[:-1]))
    wrong = (lo != np.round(lo)) | (hi != np.round(hi)) | (lo != expect_lo) | (hi < lo)
    if identities:
        wrong[-1] |= hi[-1] != a
    wrong = np.flatnonzero(wrong)

    def range_problems():
        for i in wrong.tolist():
            if lo[i] != expect_lo[i]:
                after = "the first image, 1" if i == 0 else f"{hi[i - 1]:g}"
                why = f"starts at {lo[i]:g} instead of {after}"
            elif hi[i] < lo[i]:
                why = "ends before it starts"
            elif lo[i] != round(lo[i]) or hi[i] != round(hi[i]):
                why = "is not a range of integral keys"
            else:
                why = f"is the last range and should end at {a}, after the last image"
            yield rec, a + i, starts[ids[i]], f"identity range [{lo[i]:g}, {hi[i]:g}) {why}"

    yield Found("insightface-range", len(wrong), range_problems())
    if wrong.size:
        return
    owner = np.repeat(np.arange(identities), (hi - lo).astype(np.int64))
    image_rows = by_key[1:a]
    labels = h.label0[image_rows]
    with np.errstate(invalid="ignore"):
        mismatch = np.flatnonzero(h.complete[image_rows] & (labels != owner))

    def label_problems():
        for i in mismatch.tolist():
            yield (
                rec,
                i + 1,
                starts[image_rows[i]],
                f"label {float(labels[i])!r}, but the key lies in the range of identity "
                f"{owner[i]} (key {a + owner[i]})",
            )

    yield Found("insightface-label", len(mismatch), label_problems())
    yield from _check_property(facts, identities)


def _check_property(facts, identities):
    path = os.path.join(os.path.dirname(facts.rec), "property")
    try:
        with open_input(path, "property file", "ascii", max_bytes=1 << 16) as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError, RectoolError):
        return
    first = text.split(",")[0]
    if first.strip().isdigit() and int(first) != identities:
        yield _one(
            "insightface-header",
            path,
            None,
            None,
            f"says {int(first)} classes, but record 0 announces {identities} identities",
        )


def check_headers(facts):
    """Every image header fits its record; labels are integral class ids; images are images."""
    h, starts, rec, keys = facts.headers, facts.framing.starts, facts.rec, facts.keys
    lengths = facts.framing.lengths
    incomplete = np.flatnonzero(~h.complete)

    def incomplete_problems():
        for j in incomplete.tolist():
            n = int(lengths[j])
            if n < IMAGE_HEADER_SIZE:
                why = f"the record of {n} bytes is shorter than the 24-byte image header"
            else:
                why = (
                    f"the header announces {h.flag[j]} float32 labels but only "
                    f"{n - IMAGE_HEADER_SIZE} bytes follow it"
                )
            yield rec, keys[j], starts[j], why

    yield Found("bad-header", len(incomplete), incomplete_problems())

    odd = np.flatnonzero(h.complete & ~facts.sound)

    def odd_problems():
        for j in odd.tolist():
            yield (
                rec,
                keys[j],
                starts[j],
                f"flag {h.flag[j]} announces labels after the header, but the header's own "
                f"label is {float(h.label[j])!r} instead of 0.0",
            )

    yield Found("bad-header", len(odd), odd_problems())
    images = facts.layout.images & facts.sound
    yield _check_labels(facts, images)

    empty = np.flatnonzero(images & (h.image == 0))
    yield Found(
        "empty-image",
        len(empty),
        ((rec, keys[j], starts[j], "no image bytes after the header") for j in empty.tolist()),
    )
    split, buf, bad = facts.framing.split, facts.buf, facts.unknown_signature

    def signature_problems():
        for j in bad.tolist():
            at = int(starts[j]) + 8 + IMAGE_HEADER_SIZE + 4 * int(h.flag[j])
            first = bytes(buf[at : at + min(8, int(h.image[j]))])
            where = "" if not split[j] else " (split record)"
            yield (
                rec,
                keys[j],
                starts[j],
                f"image bytes{where} start with {first.hex(' ')}: no known image signature",
            )

    yield Found("not-an-image", len(bad), signature_problems())


def _check_labels(facts, images):
    label, classes = facts.headers.label0, facts.layout.classes
    with np.errstate(invalid="ignore"):
        bad = images & ~np.isfinite(label)
        known = images & np.isfinite(label)
        if classes is not None:
            bad |= known & ((label != np.round(label)) | (label < 0) | (label >= classes))
    bad = np.flatnonzero(bad)

    def problems():
        for j in bad.tolist():
            value = float(label[j])
            if not np.isfinite(value):
                why = f"label {value!r} is not a number"
            elif value != round(value):
                why = f"label {value!r} is not an integral class id"
            else:
                why = f"label {value!r} is outside the {classes} classes 0..{classes - 1}"
            yield facts.rec, facts.keys[j], facts.framing.starts[j], why

    return Found("bad-label", len(bad), problems())


def check_manifest_entry(facts):
    """The shard is as its manifest entry says: sizes, counts, first and last keys, ids.

    (Whether it has the layout the manifest names is `check_layout`'s question.)
    """
    entry, rec, idx = facts.entry, facts.rec, facts.idx
    if entry is None:
        return
    for path, size_name in ((rec, "rec_bytes"), (idx, "idx_bytes")):
        if entry.get(size_name) is not None and os.path.exists(path):
            actual = os.path.getsize(path)
            if actual != entry[size_name]:
                yield _one(
                    "size-mismatch",
                    path,
                    None,
                    None,
                    f"{actual} bytes; the manifest says {entry[size_name]}",
                )
    index = facts.index
    expected = entry.get("records")
    if expected is not None:
        found = len(facts.framing.starts)
        if found != expected:
            yield _one(
                "count-mismatch", rec, None, None, f"{found} records; the manifest says {expected}"
            )
        if index is not None and len(index.keys) != expected:
            yield _one(
                "count-mismatch",
                idx,
                None,
                None,
                f"{len(index.keys)} entries; the manifest says {expected}",
            )
    if index is not None and len(index.keys):
        for name, actual in (("first_key", index.keys[0]), ("last_key", index.keys[-1])):
            if entry.get(name) is not None and entry[name] != int(actual):
                yield _one(
                    "key-mismatch",
                    idx,
                    int(actual),
                    None,
                    f"the {name.replace('_', ' ')} is {int(actual)}; "
                    f"the manifest says {entry[name]}",
                )
        yield _check_ids(facts)


def _check_ids(facts):
    """rectool writes each record's key as its header id; they must agree."""
    h, keys, starts = facts.headers, facts.keys, facts.framing.starts
    differ = np.flatnonzero(facts.indexed & h.complete & (h.id.astype(np.int64) != keys))
    return Found(
        "id-mismatch",
        len(differ),
        ((facts.idx, keys[j], starts[j],
          f"the .idx gives key {keys[j]} to the record at byte "
          f"{starts[j]}, whose header id is {h.id[j]}")
         for j in differ.tolist()),
    )  # fmt: skip


def _checksum_file(facts):
    """Return (path, {algorithm: hex} the manifest expects, problem or None) of the shard's
    .rec.crc; path is None when it has none (files packed by other tools, or before rectool
    had one) or the manifest names it wrongly (the problem says so)."""
    named = (facts.entry or {}).get("crc")
    if named is None:
        path = checksum_path(facts.rec)
        return (path, {}, None) if os.path.exists(path) else (None, {}, None)
    if not isinstance(named, str) or os.path.basename(named) != named or named in ("", ".."):
        return (
            None,
            {},
            _one(
                "manifest",
                facts.dataset.manifest_path,
                None,
                None,
                f"the checksum file of {facts.rec} is named {named!r}, not a file name beside it",
            ),
        )
    path = os.path.join(os.path.dirname(facts.rec), named)
    return path, expected_digests(facts.entry, "crc"), None


def check_record_checksums(facts, digests_match):
    """Compare every record with its checksum from the .rec.crc file, when there is one:
    xxh3-64 (version 2) or zlib CRC-32 (version 1), as the file says.

    Only where the shard's digests do not already vouch for every byte: they differ from
    the manifest, or were not computed (no manifest, or a shard of another size);
    `digests_match(path)` tells (waiting for the digests if need be). On the 100k
    benchmark pack the CRC-32 pass took about a quarter of verify's time; a sound shard whose
    digest matches has no damaged record to find. The .rec.crc itself is always read and its
    digests compared (it is small).
    """
    path, expected, problem = _checksum_file(facts)
    if problem is not None:
        yield problem
    if path is None:
        return
    try:
        entries, actual = load_checksums(path, list(expected))
    except FileNotFoundError:
        yield _one(
            "checksum-file", path, None, None, "listed in the manifest, missing; "
            "records cannot be checked one by one"
        )  # fmt: skip
        return
    except ChecksumFileError as exc:
        yield _one("checksum-file", path, None, None, str(exc).removeprefix(f"{path}: "))
        return
    if expected:
        untrusted = "; its record checksums cannot be trusted and were not used"
        yield from compare_digests("checksum-file", path, expected, actual, untrusted)
        if any(actual[a] != expected[a] for a in expected):
            return
    size = facts.size
    stale = stale_reason(entries, size)
    if not expected and stale is not None:
        # Nothing vouches for the table, and it does not fit: another file's, say (a
        # .rec written again by another tool beside it). With the manifest's word for
        # the table, a size that differs is damage, and its records are compared.
        yield _one("checksum-file", path, None, None, f"{stale}; records not compared")
        return
    if facts.entry is not None and digests_match(facts.rec):
        return
    bad = damaged_records(facts.buf, size, entries)
    algorithm = algorithm_of(entries)
    named = DIGEST_NAMES[algorithm]
    yield Tally("record_checksums", len(entries))
    yield Compared("record_digests", algorithm)
    starts = facts.framing.starts

    def problems():
        for i in bad:
            offset, length = int(entries["offset"][i]), int(entries["length"][i])
            key = facts.key_at(offset)
            if key is None:  # not in the .idx: the header id of a record found there
                j = int(np.searchsorted(starts, offset))
                if j < len(starts) and starts[j] == offset:
                    key = int(facts.keys[j])
            if offset + length > size:
                why = f"bytes {offset}..{offset + length} run past the end of the file"
            else:
                why = f"bytes {offset}..{offset + length} differ from their {named}"
            yield (
                facts.rec,
                key,
                offset,
                f"record {i} of {os.path.basename(path)}: {why} "
                f"({show_checksum(entries, i)} when packed); the record is damaged",
            )

    yield Found("record-checksum-mismatch", len(bad), problems())


# -- decoding ---------------------------------------------------------------------------------
def decodable_rows(facts):
    """Return the rows `check_decoding` decodes: image records with image bytes of a known
    signature (the others are reported by `check_headers`)."""
    h = facts.headers
    mask = facts.layout.images & h.complete & (h.image > 0)
    mask[facts.unknown_signature] = False
    return np.flatnonzero(mask).tolist()


def check_image_structure(facts):
    """Every image passes the structural check `pack` runs on what it packs (`--check
    structure`): JPEG markers up to the scan and an end-of-image marker after it, every PNG
    chunk and its CRC, every header's dimensions (`images.check_container`; no decoding, and
    no pixel budget: that is `--decode --max-pixels`'s).

    The images are those `check_decoding` would decode whose header is sound (empty records,
    unknown signatures and bad headers are `check_headers`' problems); insightface's record 0
    and identity records are none.
    Whole records are checked in the mapped file, the JPEG walk over all of them at once.
    """
    rows = np.asarray(decodable_rows(facts), np.int64)
    rows = rows[facts.sound[rows]]  # where a bad header puts the image is unknown
    if not len(rows):
        return
    h, starts, split = facts.headers, facts.framing.starts, facts.framing.split
    reasons = {}  # row -> reason
    whole = rows[~split[rows]]
    if len(whole):
        heads = starts[whole] + 8 + IMAGE_HEADER_SIZE + 4 * h.flag[whole].astype(np.int64)
        ends = heads + h.image[whole].astype(np.int64)
        u8 = np.frombuffer(facts.buf, np.uint8, facts.size)
        try:
            refused = refused_images(u8, heads, ends, _check_structure, _NO_PIXEL_LIMIT)
        finally:
            del u8  # a view of the mapping: it could not be closed
        for k, refusal in refused.items():
            reasons[int(whole[k])] = refusal.reason
    for j in rows[split[rows]].tolist():
        _, image = unpack_header(facts.read_record(int(starts[j])))
        try:
            _check_structure(bytes(image), "structure", _NO_PIXEL_LIMIT)
        except ImageRefused as refusal:
            reasons[j] = refusal.reason
    bad = sorted(reasons)
    yield Found(
        "image-damaged",
        len(bad),
        ((facts.rec, facts.keys[j], starts[j], reasons[j]) for j in bad),
    )


_NO_PIXEL_LIMIT = 1 << 62


def _check_structure(data, mode, max_pixels):
    check_container(data, max_pixels)


def check_decoding(facts, rows, options, decoder):
    """Every image at `rows` decodes (to the size and channels `options` ask for).

    Batches decode on the `decoder` pool; a `Tally` of "decoded" follows each batch's findings.
    """
    starts = facts.framing.starts
    batches = [rows[i : i + _DECODE_BATCH] for i in range(0, len(rows), _DECODE_BATCH)]
    futures = [
        decoder.submit(_decode_batch, facts.read_record, [int(starts[j]) for j in b], options)
        for b in batches
    ]
    for batch, future in zip(batches, futures):
        for i, kind, message in future.result():
            j = batch[i]
            yield _one(kind, facts.rec, facts.keys[j], starts[j], message)
        yield Tally("decoded", len(batch))


def _decode_batch(read_record, offsets, options):
    """Decode the images at `offsets`; return [(position in batch, kind, message)]."""
    out = []
    for i, offset in enumerate(offsets):
        _, image = unpack_header(read_record(offset))
        problem = check_decoded(image, options)
        if problem is not None:
            out.append((i, *problem))
    return out


def check_decoded(image, options):
    """Decode one image as `pack --check decode` does; return None, or (kind, message)."""
    try:
        height, width, channels = inspect_image(image, options.max_pixels)
    except ImageTooLarge as refusal:
        return "image-too-large", refusal.reason
    except ImageRefused as refusal:
        return "decode-failed", refusal.reason
    if options.size is not None and (height, width) != tuple(options.size):
        want = f"{options.size[0]}x{options.size[1]}"
        return "image-size", f"{height}x{width} (height x width), expected {want}"
    if options.channels is not None and channels != options.channels:
        return "image-channels", f"{channels} channels, expected {options.channels}"
    return None
