"""Rebuild a lost or damaged .idx by walking its .rec, resynchronising past damage.

Keys come from the record headers' id field (rectool, im2rec and insightface all write the key
there), or from the record's position with `keys="position"`. Damaged byte ranges are skipped
and reported, never guessed at. When the .rec has a `.rec.crc` file (rectool packs write one),
each record is also compared with its checksum (xxh3-64; CRC-32 in packs of manifest version
1): a record that still frames but whose bytes
changed is indexed (it is where it was) and reported as damaged. Reindexing never changes the
.rec, so its `.rec.crc` and the manifest's checksums of it stay valid.

The `.idx` of a shard of a format-3 pack is what its binary index was made from: when the
rebuilt one differs from the one the manifest records, the shard's manifest entry and the
pack's index are written again from it (`packer/indexing.refresh_shard`), under the prefix's
lock, so that the reader and MXNet read the same records.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..doors.output import OutputLock, check_target, make_folders, write_atomic
from ..errors import RectoolError, UsageError
from ..format.checksums import (
    ChecksumFileError,
    algorithm_of,
    checksum_path,
    damaged_records,
    load_checksums,
    stale_reason,
)
from ..format.digest import DIGEST_NAMES, XXH3_128, digests_of, field_name
from ..format.paths import PackPaths
from ..format.writer import format_index_line
from ..packer.indexing import indexed_pack_of, recorded_idx, refresh_shard
from ..reader import (
    IMAGE_HEADER_SIZE,
    RecordFile,
)
from .scan import Buffer, Damage, mapped, read_headers, scan_framing

if TYPE_CHECKING:
    from _typeshed import StrPath

KEY_SOURCES = ("header", "position")
_INT64_MAX = 2**63 - 1


@dataclass
class ReindexResult:
    """What `reindex` wrote and what it had to leave out.

    `skipped` lists the damaged byte ranges (`scan.Damage`); `unkeyed` the (offset, reason) of
    readable records that could not be given a key; `duplicates` maps each key written more
    than once to its count; `damaged` the (offset, key or None, reason) of records whose bytes
    differ from their checksum in the `.rec.crc` file (`checksums` names it, or is None);
    `checksum_problem` says why that file could not be used.
    """

    rec_path: str
    idx_path: str
    keys_from: str
    records: int = 0
    rec_bytes: int = 0
    skipped: list[Damage] = field(default_factory=list)
    unkeyed: list[tuple[int, str]] = field(default_factory=list)  # (offset, reason)
    duplicates: dict[int, int] = field(default_factory=dict)
    checksums: str | None = None
    # (offset, key or None, reason)
    damaged: list[tuple[int, int | None, str]] = field(default_factory=list)
    checksum_problem: str | None = None
    # The format-3 pack whose shard's .idx this is (its manifest), and the files of its index
    # written again because the .idx changed.
    pack: str | None = None
    pack_files: list[str] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        """Return True when every byte of the .rec was a record, every key is unique and every
        record matches its checksum (when there is a .rec.crc)."""
        return not (
            self.skipped or self.unkeyed or self.duplicates or self.damaged or self.checksum_problem
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rec": self.rec_path,
            "idx": self.idx_path,
            "keys_from": self.keys_from,
            "records": self.records,
            "rec_bytes": self.rec_bytes,
            "sound": self.sound,
            "skipped": [
                {
                    "start": d.start,
                    "end": d.end,
                    "bytes": d.end - d.start,
                    "part": d.part,
                    "kind": d.kind,
                    "reason": d.reason,
                }
                for d in self.skipped
            ],
            "unkeyed": [{"offset": o, "reason": r} for o, r in self.unkeyed],
            "duplicates": {str(k): n for k, n in sorted(self.duplicates.items())},
            "checksums": self.checksums,
            "damaged": [{"offset": o, "key": k, "reason": r} for o, k, r in self.damaged],
            "checksum_problem": self.checksum_problem,
            "pack": self.pack,
            "pack_index_written": self.pack_files,
        }


def _check_records(
    result: ReindexResult,
    buf: Buffer,
    size: int,
    starts: np.ndarray,
    keys: np.ndarray,
    keyed: np.ndarray,
) -> None:
    """Fill `result.damaged` from the .rec.crc beside the .rec, when there is one."""
    path = checksum_path(result.rec_path)
    try:
        entries, _ = load_checksums(path)
    except FileNotFoundError:
        return
    except ChecksumFileError as exc:
        result.checksums, result.checksum_problem = path, str(exc)
        return
    result.checksums = path
    stale = stale_reason(entries, size)
    if stale is not None:
        result.checksum_problem = f"{path}: {stale}"
        return
    named = DIGEST_NAMES[algorithm_of(entries)]
    for i in damaged_records(buf, size, entries):
        offset, length = int(entries["offset"][i]), int(entries["length"][i])
        j = int(np.searchsorted(starts, offset))
        found = j < len(starts) and starts[j] == offset
        key = int(keys[j]) if found and keyed[j] else None
        if offset + length > size:
            why = f"bytes {offset}..{offset + length} run past the end of the file"
        else:
            why = f"bytes {offset}..{offset + length} differ from their {named}"
        if not found:
            why += "; no record starts there any more"
        result.damaged.append((offset, key, f"{why} (record {i} of {os.path.basename(path)})"))


def reindex(
    rec_path: StrPath,
    idx_path: StrPath | None = None,
    keys: str = "header",
    overwrite: bool = False,
) -> ReindexResult:
    """Write an .idx for `rec_path` (default: beside it) from a walk over the .rec.

    Returns a `ReindexResult`. Refuses to replace an existing .idx unless `overwrite`. The
    .idx is written to a temporary file and renamed, so it is whole or absent. Where it is
    the own .idx of a shard of a format-3 pack and differs from the one the manifest records,
    the pack's manifest and binary index are written again to match it.
    """
    if keys not in KEY_SOURCES:
        raise UsageError(f"unknown key source {keys!r}; choose from {', '.join(KEY_SOURCES)}")
    rec_path = os.fspath(rec_path)
    if idx_path is None:
        idx_path = PackPaths.idx_beside(rec_path)
    idx_path = os.fspath(idx_path)
    own = PackPaths.idx_beside(rec_path)
    if os.path.exists(idx_path) and not overwrite:
        raise RectoolError(f"{idx_path}: exists; use --overwrite to replace it")
    if not (os.path.exists(own) and os.path.lexists(idx_path) and os.path.samefile(own, idx_path)):
        check_target(idx_path, overwrite, "index")  # never another shard's .idx
    pack = indexed_pack_of(rec_path, idx_path)
    lock = OutputLock(pack[0]) if pack else contextlib.nullcontext()
    with lock:
        result = _reindex_locked(rec_path, idx_path, keys, pack)
    return result


def _reindex_locked(
    rec_path: str, idx_path: str, keys: str, pack: tuple[PackPaths, int] | None
) -> ReindexResult:
    """`reindex` once the pack the .idx belongs to (if any) is locked."""
    make_folders(os.path.dirname(idx_path))
    result = ReindexResult(rec_path, idx_path, keys)
    with mapped(rec_path) as (buf, size), contextlib.closing(RecordFile(rec_path)) as records:
        framing = scan_framing(buf, size)
        result.rec_bytes = size
        result.skipped = list(framing.damage)
        starts = framing.starts
        if keys == "position":
            chosen = np.arange(len(starts), dtype=np.int64)
            keep = np.ones(len(starts), bool)
        else:
            headers = read_headers(
                buf,
                size,
                starts,
                framing.lengths,
                framing.split,
                lambda offset: records.read_parts(offset)[0],
            )
            short = framing.lengths < IMAGE_HEADER_SIZE
            huge = headers.id > np.uint64(_INT64_MAX)
            keep = ~short & ~huge
            for j in np.flatnonzero(short).tolist():
                result.unkeyed.append(
                    (
                        int(starts[j]),
                        f"a record of {int(framing.lengths[j])} bytes has no image header to "
                        "take a key from",
                    )
                )
            for j in np.flatnonzero(huge).tolist():
                result.unkeyed.append(
                    (int(starts[j]), f"header id {int(headers.id[j])} does not fit an .idx key")
                )
            chosen = headers.id.astype(np.int64)
        _check_records(result, buf, size, starts, chosen, keep)
    kept = chosen[keep], starts[keep].astype(np.int64, copy=False)
    kept_keys, kept_offsets = kept[0].tolist(), kept[1].tolist()
    counts = Counter(kept_keys)
    result.duplicates = {k: n for k, n in counts.items() if n > 1}
    result.records = len(kept_keys)
    text = "".join(map(format_index_line, kept_keys, kept_offsets)).encode("ascii")
    if pack is None:
        write_atomic(idx_path, text)
        return result
    paths, number = pack
    result.pack = paths.manifest
    entry = recorded_idx(paths, number)
    same = entry.get("idx_bytes") == len(text) and entry.get(
        field_name("idx", XXH3_128)
    ) == digests_of(text, [XXH3_128]).get(XXH3_128)
    write_atomic(idx_path, text)
    if not same:  # the pack's binary index was made from the old .idx
        try:
            result.pack_files = refresh_shard(paths, number)
        except RectoolError as exc:
            raise RectoolError(
                f"{idx_path}: written, but the index of the pack {result.pack} could not be "
                f"written to match it ({exc}); the pack still reads the records of the old "
                f".idx: `rectool verify {result.pack}` says what differs"
            ) from None
    return result
