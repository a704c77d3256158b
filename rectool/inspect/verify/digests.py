"""The digests verify compares: whole files' with the manifest's (`ShardHashes`, computed beside
the walk; `compare_digests`), and each record's with its `.rec.crc` (`check_record_checksums`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np

from ...errors import RectoolError
from ...format.checksums import (
    ChecksumFileError,
    checksum_path,
    damaged_in_table,
    scan_checksums,
    show_checksum,
)
from ...format.digest import DIGEST_NAMES, FIELD, field_name, file_digests
from .facts import DatasetFacts, ShardFacts, size_or_zero
from .report import CheckResult, Compared, Found, ProblemAt, Tally, one_problem


def compare_digests(
    kind: str,
    path: str,
    expected: Mapping[str, str],
    actual: Mapping[str, str],
    suffix: str = "",
) -> Iterator[CheckResult]:
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
        yield one_problem(kind, path, None, None, message + suffix)


def expected_digests(entry: Mapping[str, Any] | None, file: str) -> dict[str, str]:
    """Return {algorithm: hex} of the digests a manifest `entry` gives `file` ("rec", "idx",
    "crc"): xxh3-128 and/or SHA-256 (version 2), SHA-256 (version 1)."""
    found = {a: (entry or {}).get(field_name(file, a)) for a in FIELD}
    return {a: h for a, h in found.items() if h}


class ShardHashes:
    """The digests of each file whose manifest entry gives some (and the size it has),
    computed on the `hasher` thread while the shards are walked: each file read once.

    A .rec is hashed as its shard's checks start (`start`), from its file: the hashing
    thread reads it beside the walk (which reads the same pages through a bounded window);
    a .rec whose shard is not walked is hashed at the end (`check`).
    """

    def __init__(self, dataset: DatasetFacts, hasher: Executor) -> None:
        self.expected: dict[str, dict[str, str]] = {}  # path -> {algorithm: hex}
        self.futures: dict[str, Future[dict[str, str]]] = {}  # path -> its digests
        self._hasher = hasher
        self._mapped: dict[str, list[str]] = {}  # .rec path -> algorithms, until `start`
        for (rec, idx), entry in zip(dataset.shards, dataset.entries):
            if entry is None:
                continue
            for path, file in ((rec, "rec"), (idx, "idx")):
                expected = expected_digests(entry, file)
                if (
                    expected
                    and size_or_zero(path) == entry.get(f"{file}_bytes")
                    and os.path.exists(path)
                ):
                    self.expected[path] = expected
                    if file == "rec":
                        self._mapped[path] = list(expected)
                    else:
                        self.futures[path] = hasher.submit(_hexdigests, path, list(expected))

    def start(self, path: str) -> None:
        """Start hashing the .rec `path` (read from its file into one reused buffer: its pages
        are never mapped into this process, so they do not count in its RSS)."""
        algorithms = self._mapped.pop(path, None)
        if algorithms is not None:
            self.futures[path] = self._hasher.submit(_hexdigests, path, algorithms)

    def matches(self, path: str) -> bool:
        """Return True when `path`'s digests were computed and are all the manifest's (waits
        for them)."""
        future = self.futures.get(path)
        if future is None:
            return False
        try:
            return future.result() == self.expected[path]
        except (OSError, RectoolError):  # reported by `check`
            return False

    def check(self) -> Iterator[CheckResult]:
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


def _hexdigests(path: str, algorithms: list[str]) -> dict[str, str]:
    return file_digests(path, algorithms).hexdigests()


def _checksum_file(facts: ShardFacts) -> tuple[str | None, dict[str, str], Found | None]:
    """Return (path, {algorithm: hex} the manifest expects, problem or None) of the shard's
    .rec.crc; path is None when it has none (files packed by other tools, or before rectool
    had one) or the manifest names it wrongly (the problem says so)."""
    named = (facts.entry or {}).get("crc")
    if named is None:
        path = checksum_path(facts.rec)
        return (path, {}, None) if os.path.exists(path) else (None, {}, None)
    if not isinstance(named, str) or os.path.basename(named) != named or named in ("", ".."):
        manifest_path = facts.dataset.manifest_path
        assert manifest_path is not None  # the shard has a manifest entry
        return (
            None,
            {},
            one_problem(
                "manifest",
                manifest_path,
                None,
                None,
                f"the checksum file of {facts.rec} is named {named!r}, not a file name beside it",
            ),
        )
    path = os.path.join(os.path.dirname(facts.rec), named)
    return path, expected_digests(facts.entry, "crc"), None


def check_record_checksums(
    facts: ShardFacts, digests_match: Callable[[str], bool]
) -> Iterator[CheckResult]:
    """Compare every record with its checksum from the .rec.crc file, when there is one:
    xxh3-64 (version 2) or zlib CRC-32 (version 1), as the file says.

    Only where the shard's digests do not already vouch for every byte: they differ from
    the manifest, or were not computed (no manifest, or a shard of another size);
    `digests_match(path)` tells (waiting for the digests if need be). On the 100k
    benchmark pack the CRC-32 pass took about a quarter of verify's time; a sound shard whose
    digest matches has no damaged record to find. The .rec.crc itself is always read and its
    digests compared, a block of entries at a time (`scan_checksums`: none of it is held).
    """
    path, expected, problem = _checksum_file(facts)
    if problem is not None:
        yield problem
    if path is None:
        return
    try:
        table, actual = scan_checksums(path, list(expected))
    except FileNotFoundError:
        yield one_problem(
            "checksum-file",
            path,
            None,
            None,
            "listed in the manifest, missing; records cannot be checked one by one",
        )
        return
    except ChecksumFileError as exc:
        yield one_problem("checksum-file", path, None, None, str(exc).removeprefix(f"{path}: "))
        return
    if expected:
        untrusted = "; its record checksums cannot be trusted and were not used"
        yield from compare_digests("checksum-file", path, expected, actual, untrusted)
        if any(actual[a] != expected[a] for a in expected):
            return
    size = facts.size
    stale = table.stale_reason(size)
    if not expected and stale is not None:
        # Nothing vouches for the table, and it does not fit: another file's, say (a
        # .rec written again by another tool beside it). With the manifest's word for
        # the table, a size that differs is damage, and its records are compared.
        yield one_problem("checksum-file", path, None, None, f"{stale}; records not compared")
        return
    if facts.entry is not None and digests_match(facts.rec):
        return
    bad, damaged = damaged_in_table(facts.window, table)
    algorithm = table.algorithm
    named = DIGEST_NAMES[algorithm]
    yield Tally("record_checksums", table.count)
    yield Compared("record_digests", algorithm)
    starts = facts.framing.starts

    def problems() -> Iterator[ProblemAt]:
        for k, i in enumerate(bad):
            offset, length = int(damaged["offset"][k]), int(damaged["length"][k])
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
                f"({show_checksum(damaged, k)} when packed); the record is damaged",
            )

    yield Found("record-checksum-mismatch", len(bad), problems())
