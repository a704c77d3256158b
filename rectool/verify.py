"""Verify a dataset: framing, index, headers, manifest checksums, insightface layout, decoding.

`verify_dataset` reports what it finds in the data as `Problem`s, each naming the file, the
record key and the byte offset where they are known; it raises `RectoolError` only when an
input cannot be read at all (no such dataset, a manifest that is not one, an unreadable file).
It works on files written by MXNet, im2rec and insightface as well as by `rectool pack`; a
manifest, when there is one, adds checksums, counts and the class count.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .checksums import (
    ChecksumFileError,
    checksum_path,
    damaged_records,
    load_checksums,
    stale_reason,
)
from .errors import IndexFormatError, RectoolError
from .images import ImageRefused, inspect_image
from .reader import (
    IMAGE_HEADER_SIZE,
    MAGIC_BYTES,
    RecordFile,
    parse_index,
    read_index_cache,
    resolve_source,
    unpack_header,
)
from .scan import image_formats, insightface_header, mapped, read_headers, scan_framing

# float32 holds every integer up to 2**24 exactly, and no further.
FLOAT32_EXACT = 2**24

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
    "checksum-mismatch": "a file's SHA-256 differs from the manifest",
    "record-checksum-mismatch": "a record's bytes differ from their CRC-32 taken when packed",
    "checksum-file": "a shard's .rec.crc per-record checksum file is missing, malformed or altered",
    "count-mismatch": "a record count differs from the manifest",
    "key-mismatch": "a shard's first or last key differs from the manifest",
    "manifest": "the manifest contradicts itself or the data's layout",
    "insightface-header": "record 0 of an insightface layout is missing or malformed",
    "insightface-range": "insightface identity ranges are missing, overlap or leave gaps",
    "insightface-label": "an image's label is not the identity whose range holds it",
    "float32-inexact": "a number stored as float32 exceeds 2**24, where float32 is not exact",
    "decode-failed": "an image does not decode",
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
    # Records compared with their CRC-32 (.rec.crc): in shards whose SHA-256 is not a match.
    record_checksums: int = 0
    decoded: int = 0
    seconds: float = 0.0
    problems: list = field(default_factory=list)
    problem_count: int = 0
    counts: Counter = field(default_factory=Counter)

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
            "decoded": self.decoded,
            "seconds": round(self.seconds, 3),
            "problem_count": self.problem_count,
            "counts": dict(sorted(self.counts.items())),
            "problems": [p.to_json() for p in self.problems],
        }


class _Findings:
    """Collect problems: keep the first `keep`, count every one."""

    def __init__(self, report, keep):
        self.report, self.keep = report, keep

    def room(self):
        return max(0, self.keep - len(self.report.problems))

    def add(self, kind, path, key, offset, message):
        self.count(kind, 1)
        if len(self.report.problems) < self.keep:
            key = None if key is None else int(key)
            offset = None if offset is None else int(offset)
            self.report.problems.append(Problem(kind, os.fspath(path), key, offset, message))

    def count(self, kind, n):
        if not n:
            return
        self.report.problem_count += n
        self.report.counts[kind] += n

    def add_many(self, kind, total, problems):
        """Count `total` problems of `kind`; keep those the iterable `problems` yields in room."""
        kept = 0
        for path, key, offset, message in problems:
            if len(self.report.problems) >= self.keep:
                break
            self.report.problems.append(
                Problem(
                    kind,
                    os.fspath(path),
                    None if key is None else int(key),
                    None if offset is None else int(offset),
                    message,
                )
            )
            kept += 1
        self.count(kind, total)


@dataclass
class DecodeOptions:
    """What `--decode` checks: every image decodes; optionally its (height, width) and channels."""

    size: tuple | None = None
    channels: int | None = None


def verify_dataset(targets, decode=None, workers=None, keep=DEFAULT_KEEP, progress=None):
    """Check every target (manifest, prefix, .rec, or folder with train.rec); return a report.

    `decode` is a `DecodeOptions` (or None to skip decoding); it decodes every image with
    `workers` threads (default: all cores). `progress(phase, done, total)` is called with phase
    "bytes" as shards are walked and "images" as they decode. Raises `RectoolError` when a
    target cannot be read.
    """
    if isinstance(targets, (str, os.PathLike)):
        targets = [targets]
    targets = [os.fspath(t) for t in targets]
    if not targets:
        raise RectoolError("no dataset given to verify")
    resolved = [resolve_source(t) for t in targets]
    report = VerifyReport(targets)
    findings = _Findings(report, keep)
    workers = workers or os.cpu_count() or 1
    start = time.perf_counter()
    total_bytes = sum(_size_or_zero(rec) for _, _, shards in resolved for rec, _ in shards)
    done_bytes = 0
    # Checksums run on their own thread (hashlib releases the GIL) while the walk goes on.
    with (
        ThreadPoolExecutor(1, thread_name_prefix="rectool-sha256") as hasher,
        ThreadPoolExecutor(workers, thread_name_prefix="rectool-decode") as decoder,
    ):
        for manifest, manifest_path, shards in resolved:
            dataset = _DatasetCheck(findings, report, manifest, manifest_path, shards)
            hashes = dataset.start_hashing(hasher)
            layouts = set()
            for number, (rec, idx) in enumerate(shards):
                if dataset.listed_before(number):
                    continue
                check = _ShardCheck(dataset, number, rec, idx)
                layouts.add(check.run(decode, decoder, progress))
                done_bytes += check.size
                if progress is not None:
                    progress("bytes", done_bytes, total_bytes)
            dataset.finish(hashes)
            layouts.discard(None)
            report.layouts.append("/".join(sorted(layouts)) or "empty")
    report.seconds = time.perf_counter() - start
    return report


def _size_or_zero(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def sha256_of(path, chunk=4 << 20):
    """Return the hex SHA-256 of a file, reading into one reused buffer."""
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


class _DatasetCheck:
    """The checks that span a dataset's shards: manifest totals, checksums, keys across shards."""

    def __init__(self, findings, report, manifest, manifest_path, shards):
        self.findings, self.report = findings, report
        self.manifest, self.manifest_path, self.shards = manifest, manifest_path, shards
        entries = (manifest or {}).get("shards") or []
        self.entries = entries if len(entries) == len(shards) else [None] * len(shards)
        self.classes = (manifest or {}).get("classes")
        self.keys = []  # (idx path, keys, offsets) per shard, for duplicates across shards
        self.hashes = {}  # (path, expected SHA-256) -> future, from start_hashing
        self._seen = {}  # real path of each shard's .rec -> its number

    def listed_before(self, number):
        """Report and return True when shard `number`'s .rec was already listed."""
        rec = self.shards[number][0]
        real = os.path.realpath(rec)
        first = self._seen.setdefault(real, number)
        if first == number:
            return False
        self.findings.add(
            "manifest",
            self.manifest_path or rec,
            None,
            None,
            f"lists {rec} twice (shards {first} and {number}); readers would serve each of "
            "its records twice",
        )
        return True

    def start_hashing(self, hasher):
        """Submit the checksums the manifest can confirm; return {(path, expected): future}."""
        futures = {}
        for (rec, idx), entry in zip(self.shards, self.entries):
            if entry is None:
                continue
            for path, field_name, size_name in ((rec, "rec_sha256", "rec_bytes"),
                                                 (idx, "idx_sha256", "idx_bytes")):  # fmt: skip
                expected = entry.get(field_name)
                if (
                    expected
                    and _size_or_zero(path) == entry.get(size_name)
                    and os.path.exists(path)
                ):
                    futures[(path, expected)] = hasher.submit(sha256_of, path)
        self.hashes = futures
        return futures

    def sha256_matches(self, path, expected):
        """Return True when `path`'s SHA-256 was computed and is `expected` (waits for it)."""
        future = self.hashes.get((path, expected)) if expected else None
        if future is None:
            return False
        try:
            return future.result() == expected
        except OSError:  # reported by `finish`
            return False

    def finish(self, hashes):
        for (path, expected), future in hashes.items():
            try:
                actual = future.result()
            except OSError as exc:
                raise RectoolError(f"{path}: cannot read ({exc.strerror or exc})") from None
            self.report.checksums += 1
            if actual != expected:
                self.findings.add(
                    "checksum-mismatch",
                    path,
                    None,
                    None,
                    f"SHA-256 {actual} differs from the manifest's {expected}",
                )
        if self.manifest is not None:
            self._check_totals()
        if len(self.keys) > 1:
            self._check_keys_across_shards()

    def _check_totals(self):
        manifest, path = self.manifest, self.manifest_path
        shards = manifest.get("shards") or []
        totals = manifest.get("totals") or {}
        checks = [
            ("shards", len(shards)),
            ("records", sum(s.get("records", 0) for s in shards)),
            ("rec_bytes", sum(s.get("rec_bytes", 0) for s in shards)),
        ]
        for name, actual in checks:
            if name in totals and totals[name] != actual:
                self.findings.add(
                    "manifest",
                    path,
                    None,
                    None,
                    f"totals.{name} is {totals[name]} but its shards add up to {actual}",
                )

    def _check_keys_across_shards(self):
        keys = np.concatenate([k for _, k, _ in self.keys])
        shard_of = np.concatenate([np.full(len(k), n) for n, (_, k, _) in enumerate(self.keys)])
        line_of = np.concatenate([np.arange(1, len(k) + 1) for _, k, _ in self.keys])
        order = np.argsort(keys, kind="stable")
        sk, ss = keys[order], shard_of[order]
        clash = np.flatnonzero((sk[1:] == sk[:-1]) & (ss[1:] != ss[:-1]))

        def problems():
            for i in clash.tolist():
                a, b = order[i], order[i + 1]
                first, second = self.keys[shard_of[a]], self.keys[shard_of[b]]
                yield (
                    second[0],
                    keys[b],
                    second[2][line_of[b] - 1],
                    f"key {keys[b]} is also in {first[0]} (line {line_of[a]}); "
                    "keys must be unique across a dataset's shards",
                )

        self.findings.add_many("duplicate-key", len(clash), problems())


class _ShardCheck:
    """Every check of one .rec/.idx pair."""

    def __init__(self, dataset, number, rec, idx):
        self.dataset, self.findings = dataset, dataset.findings
        self.rec, self.idx = rec, idx
        self.entry = dataset.entries[number]
        self.size = 0
        self.classes = dataset.classes
        self._keys_by_offset = None

    # -- driver -----------------------------------------------------------------------------
    def run(self, decode, decoder, progress):
        """Check the shard; return the layout found ("plain", "insightface", "multi-label")."""
        rec, entry = self.rec, self.entry
        if not os.path.exists(rec):
            if self.dataset.manifest is None:
                raise RectoolError(f"{rec}: record file not found")
            self.findings.add("missing-file", rec, None, None, "listed in the manifest, missing")
            return None
        with mapped(rec) as (buf, size), RecordFile(rec) as records:
            self.size = size
            self.index = self._read_index()
            self.framing = scan_framing(buf, size, None if self.index is None else self.index[1])
            f = self.framing
            self.headers = read_headers(buf, size, f.starts, f.lengths, f.split, records.read_at)
            self.keys = self._record_keys()
            self._check_damage(buf)
            if self.index is not None:
                self._check_index()
            layout = self._detect_layout()
            self._check_headers(buf, size)
            if entry is not None:
                self._check_against_manifest(layout)
            self._check_record_checksums(buf, size)
            report = self.dataset.report
            report.shards.append(
                {"rec": rec, "idx": self.idx, "records": len(f.starts), "rec_bytes": size}
            )
            report.records += len(f.starts)
            report.images += int(self.image_mask.sum())
            report.rec_bytes += size
            if decode is not None:
                self._decode(records, decode, decoder, progress)
        return layout

    # -- the index --------------------------------------------------------------------------
    def _read_index(self):
        idx = self.idx
        if not os.path.exists(idx):
            kind = "missing-file" if self.entry is not None else "missing-index"
            self.findings.add(
                kind, idx, None, None, f"no index; rebuild it with `rectool reindex {self.rec}`"
            )
            return None
        try:
            with open(idx, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise RectoolError(f"{idx}: cannot read ({exc.strerror or exc})") from None
        try:
            keys, offsets = parse_index(data, idx)
            lines = np.arange(1, len(keys) + 1)
        except IndexFormatError:
            keys, offsets, lines = self._parse_index_leniently(data)
        self._check_index_cache(keys, offsets)
        self.dataset.keys.append((idx, keys, offsets))
        return keys, offsets, lines

    def _parse_index_leniently(self, data):
        """Parse what can be parsed, as MXNet would (`int()` of two tab-separated fields)."""
        keys, offsets, lines = [], [], []
        for number, raw in enumerate(data.split(b"\n"), start=1):
            if not raw and number > data.count(b"\n"):
                break  # the empty remainder after the final newline
            fields = raw.strip().split(b"\t")
            try:
                key, offset = int(fields[0]), int(fields[1])
                if offset < 0 or not (-(2**63) <= key < 2**63) or offset >= 2**63:
                    raise ValueError
            except (ValueError, IndexError):
                self.findings.add(
                    "index-syntax",
                    self.idx,
                    None,
                    None,
                    f"line {number}: expected 'key<TAB>offset' with integers, got {raw[:80]!r}",
                )
                continue
            keys.append(key)
            offsets.append(offset)
            lines.append(number)
        return np.array(keys, np.int64), np.array(offsets, np.int64), np.array(lines)

    def _check_index_cache(self, keys, offsets):
        try:
            cached = read_index_cache(self.idx)
        except (OSError, ValueError):
            cached = None
        if cached is None:
            return
        if not (np.array_equal(cached[0], keys) and np.array_equal(cached[1], offsets)):
            self.findings.add(
                "stale-index-cache",
                self.idx + ".rtc",
                None,
                None,
                "the sidecar cache matches the .idx's size and time but not its content; "
                "delete it (readers would use its offsets)",
            )

    def _record_keys(self):
        """Return each record's key: from the .idx (last line wins), else from its header id."""
        keys = self.headers.id.astype(np.int64)
        self.indexed = self.index_hit = None
        if self.index is not None:
            idx_keys, offsets, _ = self.index
            starts = self.framing.starts
            pos = np.searchsorted(starts, offsets)
            hit = pos < len(starts)
            hit[hit] = starts[pos[hit]] == offsets[hit]
            keys[pos[hit]] = idx_keys[hit]  # later lines overwrite earlier ones
            self.indexed = np.zeros(len(starts), bool)
            self.indexed[pos[hit]] = True
            self.index_hit = hit
        return keys

    def _key_at(self, offset):
        """Return the key the .idx gives the record starting at `offset`, else None."""
        if self.index is None:
            return None
        if self._keys_by_offset is None:
            keys, offsets, _ = self.index
            self._keys_by_offset = dict(zip(offsets.tolist(), keys.tolist()))  # last line wins
        return self._keys_by_offset.get(offset)

    # -- per-record checksums -----------------------------------------------------------------
    def _checksum_file(self):
        """Return (path, SHA-256 the manifest expects or None) of the shard's .rec.crc, or
        (None, None) when it has none (files packed by other tools, or before rectool had one)."""
        named = (self.entry or {}).get("crc")
        if named is None:
            path = checksum_path(self.rec)
            return (path, None) if os.path.exists(path) else (None, None)
        if not isinstance(named, str) or os.path.basename(named) != named or named in ("", ".."):
            self.findings.add(
                "manifest",
                self.dataset.manifest_path,
                None,
                None,
                f"the checksum file of {self.rec} is named {named!r}, not a file name beside it",
            )
            return None, None
        return os.path.join(os.path.dirname(self.rec), named), self.entry.get("crc_sha256")

    def _check_record_checksums(self, buf, size):
        """Compare every record with its CRC-32 from the .rec.crc file, when there is one.

        Only where the shard's SHA-256 does not already vouch for every byte: it differs from
        the manifest, or was not computed (no manifest, or a shard of another size). On the
        100k benchmark pack the CRC pass took about a quarter of verify's time; a sound shard
        whose SHA-256 matches has no damaged record to find. The .rec.crc itself is always
        read and its SHA-256 compared (it is small).
        """
        path, expected = self._checksum_file()
        if path is None:
            return
        findings = self.findings
        try:
            entries, actual = load_checksums(path)
        except FileNotFoundError:
            findings.add(
                "checksum-file", path, None, None, "listed in the manifest, missing; "
                "records cannot be checked one by one"
            )  # fmt: skip
            return
        except ChecksumFileError as exc:
            findings.add("checksum-file", path, None, None, str(exc).removeprefix(f"{path}: "))
            return
        if expected is not None:
            self.dataset.report.checksums += 1
            if actual != expected:
                findings.add(
                    "checksum-file",
                    path,
                    None,
                    None,
                    f"SHA-256 {actual} differs from the manifest's {expected}; "
                    "its record checksums cannot be trusted and were not used",
                )
                return
        stale = stale_reason(entries, size)
        if expected is None and stale is not None:
            # Nothing vouches for the table, and it does not fit: another file's, say (a
            # .rec written again by another tool beside it). With the manifest's word for
            # the table, a size that differs is damage, and its records are compared.
            findings.add("checksum-file", path, None, None, f"{stale}; records not compared")
            return
        if self.entry is not None and self.dataset.sha256_matches(
            self.rec, self.entry.get("rec_sha256")
        ):
            return
        bad = damaged_records(buf, size, entries)
        self.dataset.report.record_checksums += len(entries)
        starts = self.framing.starts

        def problems():
            for i in bad:
                offset, length = int(entries["offset"][i]), int(entries["length"][i])
                key = self._key_at(offset)
                if key is None:  # not in the .idx: the header id of a record found there
                    j = int(np.searchsorted(starts, offset))
                    if j < len(starts) and starts[j] == offset:
                        key = int(self.keys[j])
                if offset + length > size:
                    why = f"bytes {offset}..{offset + length} run past the end of the file"
                else:
                    why = f"bytes {offset}..{offset + length} differ from their CRC-32"
                yield (
                    self.rec,
                    key,
                    offset,
                    f"record {i} of {os.path.basename(path)}: {why} "
                    f"({entries['crc'][i]:08x} when packed); the record is damaged",
                )

        findings.add_many("record-checksum-mismatch", len(bad), problems())

    def _check_damage(self, buf):
        size = self.size
        damage = self.framing.damage
        for d in self.framing.damage:
            key = self._key_at(d.start)
            last = d is damage[-1] and d.end == size
            indexed_after = (
                self.index is not None and bool((self.index[1] >= d.start).any()) and key is None
            )
            short_tail = d.part + 8 > size and d.part == d.start
            tail = bytes(buf[d.start : min(size, d.start + 4)])
            looks_like_start = short_tail and MAGIC_BYTES.startswith(tail)
            if (
                last
                and key is None
                and not indexed_after
                and (d.kind in ("bad-magic", "bad-cflag") or (short_tail and not looks_like_start))
            ):
                self.findings.add(
                    "trailing-garbage",
                    self.rec,
                    None,
                    d.start,
                    f"{size - d.start} bytes after the last record are not a record",
                )
                continue
            skipped = f"bytes {d.start}..{d.end} ({d.end - d.start} bytes) are unreadable"
            where = f" (part at byte {d.part})" if d.part != d.start else ""
            self.findings.add(d.kind, self.rec, key, d.start, f"{d.reason}{where}; {skipped}")
        for start, part in self.framing.bad_padding:
            where = "" if part == start else f" of the part at byte {part}"
            self.findings.add(
                "bad-padding",
                self.rec,
                self._key_at(start),
                start,
                f"the padding{where} is not zero bytes",
            )

    def _check_index(self):
        keys, offsets, lines = self.index
        starts, ends = self.framing.starts, self.framing.ends
        findings, idx = self.findings, self.idx
        damage_starts = {d.start for d in self.framing.damage}

        miss = np.flatnonzero(~self.index_hit)
        miss = [i for i in miss.tolist() if int(offsets[i]) not in damage_starts]

        def offset_problems():
            for i in miss:
                offset = int(offsets[i])
                yield idx, keys[i], offset, f"line {lines[i]}: {self._describe_offset(offset)}"

        findings.add_many("index-offset", len(miss), offset_problems())

        unindexed = np.flatnonzero(~self.indexed)
        if not len(keys) and len(unindexed):
            findings.add(
                "empty-index",
                idx,
                None,
                None,
                f"no lines, but {os.path.basename(self.rec)} holds {len(unindexed)} records; "
                f"rebuild it with `rectool reindex {self.rec} --overwrite`",
            )
            unindexed = unindexed[:0]

        def unindexed_problems():
            for j in unindexed.tolist():
                header_id = int(self.headers.id[j]) if self.headers.complete[j] else None
                named = f" (header id {header_id})" if header_id is not None else ""
                yield (
                    self.rec,
                    header_id,
                    starts[j],
                    f"the record at byte {starts[j]}{named}, {ends[j] - starts[j]} bytes, "
                    f"is not in {os.path.basename(idx)}",
                )

        findings.add_many("unindexed-record", len(unindexed), unindexed_problems())

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

        findings.add_many("duplicate-key", len(repeated), duplicate_problems())

        order = np.argsort(offsets, kind="stable")
        so = offsets[order]
        shared = np.flatnonzero(so[1:] == so[:-1]) + 1
        shared = [i for i in shared.tolist() if keys[order[i]] != keys[order[i - 1]]]

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

        findings.add_many("duplicate-offset", len(shared), shared_problems())

    def _describe_offset(self, offset):
        starts, ends, size = self.framing.starts, self.framing.ends, self.size
        if offset >= size:
            return f"offset {offset} is past the end of the file ({size} bytes)"
        j = int(np.searchsorted(starts, offset, side="right")) - 1
        if j >= 0 and offset < ends[j]:
            key = int(self.keys[j])
            return (
                f"offset {offset} is inside the record at byte {starts[j]} (key {key}), "
                "not at a record start"
            )
        for d in self.framing.damage:
            if d.start <= offset < d.end:
                return f"offset {offset} is inside unreadable bytes {d.start}..{d.end}"
        return f"offset {offset} is not a record start"

    # -- headers, labels, layout ------------------------------------------------------------
    def _detect_layout(self):
        h = self.headers
        self.image_mask = np.ones(len(h), bool)
        claimed = self.entry is not None and self.dataset.manifest.get("layout") == "insightface"
        j = insightface_header(self.keys, h, claimed)
        if j is not None:
            return self._check_insightface(j)
        if claimed:
            zero = np.flatnonzero(self.keys == 0)
            self.findings.add(
                "insightface-header",
                self.rec,
                0 if zero.size else None,
                self.framing.starts[zero[-1]] if zero.size else None,
                "the manifest says layout insightface, but there is no record 0 with flag 2",
            )
        if (h.complete & (h.flag > 0)).any():
            return "multi-label"
        return "plain"

    def _check_headers(self, buf, size):
        h, starts, rec = self.headers, self.framing.starts, self.rec
        findings = self.findings
        incomplete = np.flatnonzero(~h.complete)
        lengths = self.framing.lengths

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
                yield rec, self.keys[j], starts[j], why

        findings.add_many("bad-header", len(incomplete), incomplete_problems())

        # MXNet's pack zeroes the header's float whenever labels follow it.
        odd = np.flatnonzero(h.complete & (h.flag > 0) & (h.label != 0))

        def odd_problems():
            for j in odd.tolist():
                yield (
                    rec,
                    self.keys[j],
                    starts[j],
                    f"flag {h.flag[j]} announces labels after the header, but the header's own "
                    f"label is {float(h.label[j])!r} instead of 0.0",
                )

        findings.add_many("bad-header", len(odd), odd_problems())
        sound = h.complete.copy()
        sound[odd] = False
        images = self.image_mask & sound
        self._check_labels(images)

        empty = np.flatnonzero(images & (h.image == 0))
        findings.add_many(
            "empty-image",
            len(empty),
            ((rec, self.keys[j], starts[j], "no image bytes after the header")
             for j in empty.tolist()),
        )  # fmt: skip
        self._check_signatures(buf, size, images & (h.image > 0))

    def _check_labels(self, images):
        h, classes = self.headers, self.classes
        label = h.label0
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
                yield self.rec, self.keys[j], self.framing.starts[j], why

        self.findings.add_many("bad-label", len(bad), problems())

    def _check_signatures(self, buf, size, mask):
        """Check that each image begins with a known image signature."""
        f, rows = self.framing, np.flatnonzero(mask)
        with RecordFile(self.rec) as records:
            formats = image_formats(
                buf, size, f.starts, self.headers, f.split, rows, records.read_at
            )
        bad = [int(j) for j, kind in zip(rows.tolist(), formats) if kind is None]
        self.bad_signature = set(bad)

        def problems():
            for j in bad:
                at = int(f.starts[j]) + 8 + IMAGE_HEADER_SIZE + 4 * int(self.headers.flag[j])
                first = bytes(buf[at : at + min(8, int(self.headers.image[j]))])
                where = "" if not f.split[j] else " (split record)"
                yield (
                    self.rec,
                    self.keys[j],
                    f.starts[j],
                    f"image bytes{where} start with {first.hex(' ')}: no known image signature",
                )

        self.findings.add_many("not-an-image", len(bad), problems())

    def _check_insightface(self, j):
        """Check the face-dataset layout around header record `j`; return "insightface"."""
        h, rec, findings = self.headers, self.rec, self.findings
        starts, keys = self.framing.starts, self.keys
        a, b = float(h.label0[j]), float(h.label1[j])
        if not (np.isfinite(a) and np.isfinite(b) and a == int(a) and b == int(b) and 1 <= a <= b):
            findings.add(
                "insightface-header",
                rec,
                0,
                starts[j],
                f"record 0's label [{a!r}, {b!r}] is not a range [N+1, N+1+K] of keys",
            )
            return "insightface"
        a, b = int(a), int(b)
        if b > FLOAT32_EXACT:
            findings.add(
                "float32-inexact",
                rec,
                0,
                starts[j],
                f"record 0's label [{a}, {b}] needs keys above {FLOAT32_EXACT:,}, "
                "where float32 labels are not exact",
            )
        images, identities = a - 1, b - a
        declared = self.classes
        if declared is not None and declared != identities:
            findings.add(
                "manifest",
                self.dataset.manifest_path,
                None,
                None,
                f"says {declared} classes, but record 0 of {rec} announces {identities} identities",
            )
        self.classes = identities
        by_key = np.full(b, -1, np.int64)
        inside = (keys >= 0) & (keys < b)
        by_key[keys[inside]] = np.flatnonzero(inside)
        is_meta = (keys == 0) | (keys >= a)
        self.image_mask = ~is_meta
        outside = np.flatnonzero(~inside)
        findings.add_many(
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

        findings.add_many("insightface-range", len(missing), missing_problems())
        ids = by_key[a:]
        present = ids >= 0
        rows = ids[present]
        not_ranges = rows[~(h.complete[rows] & (h.flag[rows] == 2))]
        findings.add_many(
            "insightface-range",
            len(not_ranges),
            ((rec, keys[i], starts[i],
              f"identity record has flag {h.flag[i]}, expected 2 (a [start, end) label pair)")
             for i in not_ranges.tolist()),
        )  # fmt: skip
        if len(missing) or len(not_ranges):
            return "insightface"
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

        findings.add_many("insightface-range", len(wrong), range_problems())
        if wrong.size:
            return "insightface"
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

        findings.add_many("insightface-label", len(mismatch), label_problems())
        self._check_property(identities)
        return "insightface"

    def _check_property(self, identities):
        path = os.path.join(os.path.dirname(self.rec), "property")
        try:
            with open(path, encoding="ascii") as f:
                text = f.read().strip()
        except (OSError, UnicodeDecodeError):
            return
        first = text.split(",")[0]
        if first.strip().isdigit() and int(first) != identities:
            self.findings.add(
                "insightface-header",
                path,
                None,
                None,
                f"says {int(first)} classes, but record 0 announces {identities} identities",
            )

    # -- the manifest -----------------------------------------------------------------------
    def _check_against_manifest(self, layout):
        entry, findings = self.entry, self.findings
        rec, idx = self.rec, self.idx
        for path, size_name in ((rec, "rec_bytes"), (idx, "idx_bytes")):
            if size_name in entry and os.path.exists(path):
                actual = os.path.getsize(path)
                if actual != entry[size_name]:
                    findings.add(
                        "size-mismatch",
                        path,
                        None,
                        None,
                        f"{actual} bytes; the manifest says {entry[size_name]}",
                    )
        expected = entry.get("records")
        if expected is not None:
            found = len(self.framing.starts)
            if found != expected:
                findings.add(
                    "count-mismatch",
                    rec,
                    None,
                    None,
                    f"{found} records; the manifest says {expected}",
                )
            if self.index is not None and len(self.index[0]) != expected:
                findings.add(
                    "count-mismatch",
                    idx,
                    None,
                    None,
                    f"{len(self.index[0])} entries; the manifest says {expected}",
                )
        if self.index is not None and len(self.index[0]):
            keys = self.index[0]
            for name, actual in (("first_key", keys[0]), ("last_key", keys[-1])):
                if name in entry and entry[name] != int(actual):
                    findings.add(
                        "key-mismatch",
                        idx,
                        int(actual),
                        None,
                        f"the {name.replace('_', ' ')} is {int(actual)}; "
                        f"the manifest says {entry[name]}",
                    )
            self._check_ids()
        declared = self.dataset.manifest.get("layout")
        if declared == "images" and layout == "insightface":
            findings.add(
                "manifest",
                self.dataset.manifest_path,
                None,
                None,
                f"says layout images, but {rec} has an insightface header record 0",
            )

    def _check_ids(self):
        """rectool writes each record's key as its header id; they must agree."""
        h = self.headers
        ok = self.indexed & h.complete
        differ = np.flatnonzero(ok & (h.id.astype(np.int64) != self.keys))
        self.findings.add_many(
            "id-mismatch",
            len(differ),
            ((self.idx, self.keys[j], self.framing.starts[j],
              f"the .idx gives key {self.keys[j]} to the record at byte "
              f"{self.framing.starts[j]}, whose header id is {h.id[j]}")
             for j in differ.tolist()),
        )  # fmt: skip

    # -- decoding ---------------------------------------------------------------------------
    def _decode(self, records, options, decoder, progress):
        h = self.headers
        mask = self.image_mask & h.complete & (h.image > 0)
        rows = [j for j in np.flatnonzero(mask).tolist() if j not in self.bad_signature]
        starts = self.framing.starts
        batches = [rows[i : i + _DECODE_BATCH] for i in range(0, len(rows), _DECODE_BATCH)]
        futures = [
            decoder.submit(_decode_batch, records, [int(starts[j]) for j in b], options)
            for b in batches
        ]
        report = self.dataset.report
        total = len(rows)
        for batch, future in zip(batches, futures):
            for i, kind, message in future.result():
                j = batch[i]
                self.findings.add(kind, self.rec, self.keys[j], starts[j], message)
            report.decoded += len(batch)
            if progress is not None:
                progress("images", report.decoded, total)


def _decode_batch(records, offsets, options):
    """Decode the images at `offsets`; return [(position in batch, kind, message)]."""
    out = []
    for i, offset in enumerate(offsets):
        _, image = unpack_header(records.read_at(offset))
        problem = check_decoded(image, options)
        if problem is not None:
            out.append((i, *problem))
    return out


def check_decoded(image, options):
    """Decode one image as `pack --check decode` does; return None, or (kind, message)."""
    try:
        height, width, channels = inspect_image(image)
    except ImageRefused as refusal:
        return "decode-failed", refusal.reason
    if options.size is not None and (height, width) != tuple(options.size):
        want = f"{options.size[0]}x{options.size[1]}"
        return "image-size", f"{height}x{width} (height x width), expected {want}"
    if options.channels is not None and channels != options.channels:
        return "image-channels", f"{channels} channels, expected {options.channels}"
    return None
