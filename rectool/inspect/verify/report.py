"""What verify reports: the problem kinds, a `Problem`, the `VerifyReport`, and what checks
yield into it (`Found`, `Tally`, `Compared`) through `Findings`."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, SupportsInt

# Where a check puts a problem: (path, key or None, byte offset or None, message).
ProblemAt = tuple[str | os.PathLike[str], SupportsInt | None, SupportsInt | None, str]

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
    "index-file": "a binary index file (.npy array, identities file) is not a regular file, "
    "not a valid array of its dtype and shape, or not a file of names",
    "index-mismatch": "the binary index disagrees with the shards: a sample count, offset, key, "
    "label or identity range differs from the .idx line or record header it was written from",
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
    "identity-name": "two labels share an identity name, or a name cannot name a folder",
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


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a dataset: what (`kind`, see PROBLEM_KINDS), where and why."""

    kind: str
    path: str
    key: int | None
    offset: int | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "key": self.key,
            "offset": self.offset,
            "message": self.message,
        }

    def __str__(self) -> str:
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

    targets: list[str]
    # {"rec", "idx", "records", "rec_bytes"} of each shard
    shards: list[dict[str, Any]] = field(default_factory=list)
    layouts: list[str] = field(default_factory=list)  # one per target
    records: int = 0
    images: int = 0
    rec_bytes: int = 0
    checksums: int = 0  # files compared with a manifest checksum
    # Records compared with their checksum (.rec.crc): in shards whose digest is not a match.
    record_checksums: int = 0
    # The digests verify computed and compared: of whole files ("xxh3-128", "sha256") and of
    # records ("xxh3-64", "crc32"), each named once.
    file_digests: list[str] = field(default_factory=list)
    record_digests: list[str] = field(default_factory=list)
    decoded: int = 0
    seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    # Prefixes whose interrupted replacement verify finished before checking them.
    finished: list[str] = field(default_factory=list)
    # Staging folders that a killed `--overwrite` left beside the targets (not part of a pack).
    staging: list[str] = field(default_factory=list)
    # What the report says that is no problem: a target without a binary index, say.
    notes: list[str] = field(default_factory=list)
    # Per target whose manifest records refused images: {"target", "made_by" ("pack" or
    # "repack"), "refused", "images", "max_failures", "accepted", "failures_file"}
    # (`manifest.pack_refusals`).
    refusals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        """Return True when no problem was found."""
        return self.problem_count == 0

    def renamed(self, shown_as: Callable[[str], str]) -> VerifyReport:
        """Return this report with `shown_as(text)` applied to every path it names: targets,
        shards, problems' paths and messages, replacements finished, staging folders and notes (a
        pack read from a local copy of a URL is named by its URL)."""
        return replace(
            self,
            targets=[shown_as(t) for t in self.targets],
            shards=[
                {**s, "rec": shown_as(s["rec"]), "idx": shown_as(s["idx"])} for s in self.shards
            ],
            problems=[
                replace(p, path=shown_as(p.path), message=shown_as(p.message))
                for p in self.problems
            ],
            finished=[shown_as(p) for p in self.finished],
            staging=[shown_as(s) for s in self.staging],
            notes=[shown_as(n) for n in self.notes],
            refusals=[
                {
                    **r,
                    "target": shown_as(r["target"]),
                    "failures_file": r["failures_file"] and shown_as(r["failures_file"]),
                }
                for r in self.refusals
            ],
        )

    def to_json(self) -> dict[str, Any]:
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
            "notes": self.notes,
            "refusals": self.refusals,
        }


@dataclass(frozen=True)
class Found:
    """`total` problems of one `kind`, found by a check.

    `problems` yields their (path, key, offset, message), lazily: the report keeps only its
    first `keep` problems, so messages past those are never made.
    """

    kind: str
    total: int
    problems: Iterable[ProblemAt]


def one_problem(
    kind: str,
    path: str | os.PathLike[str],
    key: SupportsInt | None,
    offset: SupportsInt | None,
    message: str,
) -> Found:
    """Return the `Found` of one problem of `kind` at `path`, `key`, `offset`."""
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


# What a check yields: problems found, and the work the report counts.
CheckResult = Found | Tally | Compared


class Findings:
    """Collect what checks yield into the report: keep the first `keep` problems, count all."""

    def __init__(self, report: VerifyReport, keep: int) -> None:
        self.report, self.keep = report, keep

    def take(self, items: Iterable[CheckResult]) -> None:
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

    def _add(self, found: Found) -> None:
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
