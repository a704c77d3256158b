"""Write a dataset's images back out as an identity-per-folder tree.

Each image becomes `OUT_DIR/<identity>/<key>.<ext>`: the identity is the name the manifest's
label map gives the label (else the label itself), the key is the record's .idx key and the
extension comes from the image's signature. The bytes are the stored bytes, so unpacking a
pass-through pack gives back the original files byte for byte; only their names are new (the
.rec does not store them).

A shard with a `.rec.crc` file (rectool packs write one) has every record compared with its
checksum (xxh3-64; CRC-32 in packs of manifest version 1) before anything is written: a
damaged record stops the unpack with an error naming it, so that no damaged image is ever
written as if it were sound.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dataset.headers import insightface_header
from ..dataset.sources import resolve_source
from ..doors.output import OutputFolder
from ..errors import RectoolError
from ..format.binindex import read_identities
from ..format.checksums import (
    ChecksumFileError,
    checksum_path,
    damaged_records,
    load_checksums,
    stale_reason,
)
from ..format.keys import last_line_wins, refuse_shared_offsets
from ..format.records import IndexedRecordFile
from ..packer.images import sniff_format
from ..reader import unpack_header
from ..text import counted
from .scan import mapped

if TYPE_CHECKING:
    from _typeshed import StrPath

    from ..reader import Header

EXTENSIONS: dict[str | None, str] = {
    "jpeg": ".jpg",
    "png": ".png",
    "bmp": ".bmp",
    "gif": ".gif",
    "webp": ".webp",
    "tiff": ".tif",
    None: ".bin",
}


class DamagedRecordsError(RectoolError):
    """Records whose bytes differ from their checksum: unpacking them would write damaged images.

    `damaged` lists (rec path, key or None, byte offset) of every one found.
    """

    def __init__(self, message: str, damaged: list[tuple[str, int | None, int]]) -> None:
        super().__init__(message)
        self.damaged = damaged


@dataclass
class UnpackResult:
    """What `unpack_dataset` wrote."""

    out_dir: str
    layout: str = "empty"  # "images" or "insightface" (both, "/"-joined, when shards differ)
    images: int = 0
    identities: int = 0
    bytes: int = 0
    unknown_format: int = 0  # images written as .bin: no known image signature
    kept: int = 0  # with resume: images an earlier run had written, found whole

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def unpack_dataset(
    target: StrPath,
    out_dir: StrPath,
    progress: Callable[[int, int], object] | None = None,
    resume: bool = False,
) -> UnpackResult:
    """Write every image of the dataset at `target` under `out_dir`; return an `UnpackResult`.

    Only image records are written (the insightface layout's header and identity records are
    not images). A key repeated in an .idx is written once, from its last line, as readers
    resolve it. Existing files are never overwritten; with `resume`, one already holding its
    record's bytes (what an interrupted run wrote) is kept. `progress(done, total)` is called as
    images are written.
    """
    manifest, manifest_path, shards = resolve_source(target)
    names = {}
    if manifest is not None and manifest_path is not None:
        names = read_identities(manifest_path, manifest) or {}
    out_dir = os.fspath(out_dir)
    result = UnpackResult(out_dir)
    folders: dict[float, str] = {}
    opened = [IndexedRecordFile(rec, idx) for rec, idx in shards]
    out = None
    try:
        _refuse_damaged(opened)
        plans = [_plan(f) for f in opened]
        result.layout = "/".join(sorted({layout for layout, _, _ in plans})) or "empty"
        total = sum(len(keys) for _, keys, _ in plans)
        out = OutputFolder(out_dir)  # never writes through a link planted inside it
        done = 0
        for records, (_, keys, offsets) in zip(opened, plans):
            for key, offset in zip(keys.tolist(), offsets.tolist()):
                header, image = unpack_header(
                    records.rec.read_at(offset, key), records.rec.path, offset
                )
                label = header.label if header.flag == 0 else header.label[0]
                folder = folders.get(float(label))
                if folder is None:
                    folder = folders[float(label)] = _folder_name(label, names)
                kind = sniff_format(image[:16])
                result.unknown_format += kind is None
                written = out.write_new(folder, f"{key}{EXTENSIONS[kind]}", image, resume)
                result.kept += not written
                result.images += 1
                result.bytes += len(image)
                done += 1
                if progress is not None and (done % 256 == 0 or done == total):
                    progress(done, total)
    finally:
        for f in opened:
            f.close()
        if out is not None:
            out.close()
    result.identities = len(folders)
    return result


def _refuse_damaged(opened: Sequence[IndexedRecordFile], shown: int = 5) -> None:
    """Raise `DamagedRecordsError` when a record differs from its checksum in a .rec.crc file."""
    damaged: list[tuple[str, int | None, int]] = []
    for records in opened:
        rec = records.rec.path
        path = checksum_path(rec)
        try:
            entries, _ = load_checksums(path)
        except FileNotFoundError:
            continue  # packed by another tool: nothing to compare with
        except ChecksumFileError as exc:
            raise RectoolError(
                f"{exc}; cannot check the records against it (`rectool verify` says more; "
                "delete it to unpack without per-record checks)"
            ) from None
        with mapped(rec) as (buf, size):
            stale = stale_reason(entries, size)
            if stale is not None:
                raise RectoolError(
                    f"{path}: {stale} (`rectool verify` says more; delete it to unpack "
                    "without per-record checks)"
                )
            bad = damaged_records(buf, size, entries)
        key_of = dict(zip(records.offsets.tolist(), records.keys.tolist()))
        for i in bad:
            offset = int(entries["offset"][i])
            damaged.append((rec, key_of.get(offset), offset))
    if damaged:
        n = len(damaged)
        named = "; ".join(
            f"{rec} key {key} at byte offset {offset}" for rec, key, offset in damaged[:shown]
        )
        more = f" and {n - shown} more" if n > shown else ""
        raise DamagedRecordsError(
            f"{counted(n, 'damaged record')} (bytes differ from the checksum taken "
            f"when packed): {named}{more}; nothing was written. `rectool verify` lists them all",
            damaged,
        )


def _plan(records: IndexedRecordFile) -> tuple[str, np.ndarray, np.ndarray]:
    """Return the layout and the (keys, offsets) of the image records to write, one per key,
    in file order.

    The layout is `reader.insightface_header`'s; in the insightface layout every image key
    record 0 announces must be in the index, as the reader requires.
    """
    keys, offsets = last_line_wins(records.keys, records.offsets)
    refuse_shared_offsets(records.idx_path, keys, offsets, "unpack")  # one file per record
    rf = records.rec

    def read(line: int) -> tuple[Header, bytes]:
        offset = int(offsets[line])
        return unpack_header(rf.read_at(offset, int(keys[line])), rf.path, offset)

    ranges = insightface_header(read, keys)
    if ranges is None:
        return "images", keys, offsets
    wanted = ranges[0]
    images = (keys >= wanted.start) & (keys < wanted.stop)
    if images.sum() < len(wanted):  # (one line per key: a key missing leaves a gap)
        present = np.zeros(len(wanted), bool)
        present[keys[images] - wanted.start] = True
        raise RectoolError(
            f"{records.idx_path}: key {wanted.start + int(np.argmin(present))} is not in the "
            f"index, but record 0 says image keys up to {wanted[-1]} exist"
        )
    return "insightface", keys[images], offsets[images]


def _folder_name(label: float, names: dict[int, str]) -> str:
    label = float(label)
    text = str(int(label)) if label.is_integer() else repr(label)
    name = names.get(int(label)) if label.is_integer() else None
    # A label map names folders that `rectool list` read; anything else cannot be one.
    if not name or name in (".", "..") or "/" in name or "\0" in name or os.sep in name:
        return text
    return name
