"""Any dataset the package reads, on the reader's own `RecordDataset`.

`open_dataset` takes what the commands take: a manifest, a pack prefix, a .rec, a folder with
`train.rec` or one pack, a list of .rec paths, or a URL (read through `rectool.remote`). A pack
with a binary index (format 3) is the core's dataset: its arrays mapped as the emitted reader
maps them. Any other pack (im2rec's, insightface's, an older rectool's, bare shards) gets the
same index built in memory from its `.idx` files and record 0 (`format.binindex.index_shards`),
which is what `rectool index` writes to disk for it. Either way reads go through the core.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from ..format.binindex import index_shards, read_identities
from ..format.headers import Header, header_labels, shard_numbers, unpack_header
from ..reader import (
    DATASET_LAYOUTS,
    DECODE_MODES,
    DEFAULT_MAX_PIXELS,
    RecordDataset,
    RecordFile,
    RecordFormatError,
    RectoolError,
    check_max_pixels,
    load_array,
)
from .sources import resolve_source

if TYPE_CHECKING:
    from collections.abc import Callable

    from numpy.typing import NDArray

    from .sources import Source

    Decode = str | Callable[[bytes], Any] | None

URL = re.compile(r"(s3|gs|az|abfs|https?)://", re.I)


def open_dataset(
    source: Source,
    decode: Decode = None,
    *,
    layout: str | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    **remote: Any,
) -> PackDataset:
    """Open a packed dataset for training; return a `PackDataset`.

    `source`: a manifest, pack prefix, .rec, list of .rec paths or insightface folder; or the
    URL of a manifest (s3://, gs://, https://...), read through a local shard cache by
    `rectool.remote` (`remote`: its `cache_dir=`, `cache_limit=`; docs/remote.md).
    `decode`: None (image bytes), "bgr", "rgb", "gray" or a function of the bytes. `layout`
    ("images" or "insightface") comes from the manifest or record 0. `max_pixels`: images whose
    header declares more pixels are refused before decoding (`ImageTooLargeError`).
    """
    if isinstance(source, str) and URL.match(source):
        try:
            from ..remote import open_remote
        except ImportError:
            raise RectoolError(
                f"reading {source} needs the remote extra: pip install '.[remote]' in a "
                "checkout of rectool"
            ) from None
        return open_remote(source, decode=decode, layout=layout, max_pixels=max_pixels, **remote)
    if remote:
        raise TypeError(f"open_dataset() got options for a remote pack: {', '.join(remote)}")
    return PackDataset(source, decode, layout=layout, max_pixels=max_pixels)


class PackDataset(RecordDataset):
    """The reader's `RecordDataset` over any source `open_dataset` takes, with what the package
    adds: `shards` [(rec, idx)], `manifest`, `header(i)`, `shard_ids`, `shard_bounds`,
    `identity_ranges` (insightface) and `identities` (names, read when asked for)."""

    def __init__(
        self,
        source: Source,
        decode: Decode = None,
        layout: str | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        if not (decode is None or decode in DECODE_MODES or callable(decode)):
            raise ValueError(f"decode must be None, one of {DECODE_MODES} or a function")
        if layout is not None and layout not in DATASET_LAYOUTS:
            raise ValueError(f"layout must be one of {DATASET_LAYOUTS}, not {layout!r}")
        self.max_pixels, self.decode = check_max_pixels(max_pixels), decode
        self._source, self._layout_arg = source, layout
        found = resolve_source(source)  # a bare .rec has no manifest: its path is None
        self.manifest, self.manifest_path, self.shards = found  # type: ignore[assignment]
        self._identity_ranges: NDArray[np.int64] | None = None
        self._ranges_file: str | None = None
        if self.indexed:
            self._open()  # the core reader's, its shards through `_open_shard`
            entry = self.manifest["index"].get("identity_ranges")  # type: ignore[index]
            if self.layout == "insightface" and isinstance(entry, dict):
                folder = os.path.dirname(self.manifest_path or "")
                self._ranges_file = os.path.join(folder, str(entry.get("file")))
            return
        self._build_index()

    def __enter__(self) -> PackDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def indexed(self) -> bool:
        """Whether the pack's binary index is read (format 3, the layout it was written for)."""
        doc = self.manifest or {}
        return (
            doc.get("format_version", 0) >= 3
            and doc.get("index") is not None
            and self._layout_arg in (None, doc.get("layout") or "images")
        )

    def _build_index(self) -> None:
        files = [self._open_shard(rec) for rec, _ in self.shards]
        claim = self._layout_arg or (self.manifest or {}).get("layout")
        try:
            index = index_shards(
                files,
                [idx for _, idx in self.shards],
                (self.manifest or {}).get("shards"),
                # A manifest's claim of images is checked against record 0, not obeyed.
                self._layout_arg or ("insightface" if claim == "insightface" else None),
                self.manifest_path,
                labels=False,
            )
        finally:
            for rf in files:
                rf.close()
        if index.layout == "insightface" and claim == "images":
            raise RecordFormatError(
                "the manifest says layout images, but record 0 is an insightface header "
                "(open with layout='images' to read it as images)", self.shards[0][0], key=0,
            )  # fmt: skip
        self.layout, self._identity_ranges = index.layout, index.identity_ranges
        for a in (index.offsets, index.keys, index.identity_ranges):
            if a is not None:
                a.flags.writeable = False
        self._files, self.offsets, self.keys, self._labels = files, index.offsets, index.keys, None
        self._bounds = [0, *itertools.accumulate(index.counts)]
        self._count = self._bounds[-1]

    def _open_shard(self, rec: str) -> RecordFile:
        """Return the `RecordFile` of a shard (rectool.remote's downloads it on first use)."""
        return super()._open_shard(rec)

    def __getstate__(self) -> dict[str, Any]:
        if self.indexed:  # its arrays are mapped again on arrival, its shards checked the same
            keep = ("_source", "_layout_arg", "decode", "max_pixels", "_manifest_id", "_files")
            return {"reopen": True, **{k: self.__dict__[k] for k in keep}}
        return {**self.__dict__, "_labels": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.pop("reopen", False):
            self.__init__(  # type: ignore[misc]
                state["_source"], state["decode"], state["_layout_arg"], state["max_pixels"]
            )
            if self._manifest_id != state["_manifest_id"] or len(self._files) != len(
                state["_files"]
            ):
                raise RectoolError(f"{self.manifest_path}: the pack was replaced; open it again")
            self._files = state["_files"]  # each refuses a shard replaced since it was opened
        else:
            self.__dict__.update(state)

    def __repr__(self) -> str:
        where = self.manifest_path or self.shards[0][0]
        more = f" + {len(self.shards) - 1} shards" if len(self.shards) > 1 else ""
        return (
            f"RecordDataset({where!r}{more}, {len(self)} samples, layout={self.layout!r}, "
            f"decode={self.decode!r})"
        )

    @property
    def shard_files(self) -> list[RecordFile]:
        """Each shard's `RecordFile`, as `shards` lists them (mapped on first read)."""
        return list(self._files)

    @property
    def shard_bounds(self) -> list[int]:
        """Shard s holds samples `shard_bounds[s]` to `shard_bounds[s + 1] - 1`. A copy."""
        return list(self._bounds)

    @property
    def shard_ids(self) -> NDArray[Any]:
        """Every sample's shard number (an index into `shards`), made when asked for."""
        ids = shard_numbers([b - a for a, b in zip(self._bounds, self._bounds[1:])])
        ids.flags.writeable = False
        return ids

    def shard_of(self, i: int) -> int:
        """Return the shard number of sample `i` (0 <= i < len)."""
        return bisect.bisect_right(self._bounds, i) - 1

    @property
    def labels(self) -> NDArray[Any]:
        """Every sample's label: from the binary index, else read from the record headers once
        (float32 (N,), (N, k), or objects where widths differ)."""
        if self._labels is None:
            self._labels = header_labels(self._files, self.shard_ids, self.offsets, self.keys)
        return self._labels

    def raw(self, i: int) -> tuple[bytes, Any]:
        """Return sample `i` undecoded: (image bytes, label): the binary index's label, or in a
        pack without one (until `labels` has gathered them), its record header's."""
        if self._labels is not None:
            return super().raw(i)
        s, i = self._locate(i)
        rf, offset, key = self._files[s], self.offsets.item(i), self.keys.item(i)
        head, image = unpack_header(rf.read_parts(offset, key)[0], rf.path, offset, key)
        return image, (head.label if head.flag == 0 else head.label.copy())

    def header(self, i: int) -> Header:
        """Return the `Header` of sample `i` (flag, label, id, id2)."""
        s, i = self._locate(i)
        rf, offset, key = self._files[s], self.offsets.item(i), self.keys.item(i)
        return unpack_header(rf.read_parts(offset, key)[0], rf.path, offset, key)[0]

    @property
    def identity_ranges(self) -> NDArray[np.int64] | None:
        """The insightface identities as an int64 (K, 2) array [start, end) of samples; None in
        the images layout."""
        if self._identity_ranges is None and self._ranges_file is not None:
            ranges = load_array(self._ranges_file, "identity_ranges", None, ("<i8", (2,)))
            bad = (
                (ranges.shape[1] != 2)
                | (ranges[:, 0] < 0)
                | (ranges[:, 0] > ranges[:, 1])
                | (ranges[:, 1] > len(self))
            )
            if bad.any():
                raise RectoolError(
                    f"{self._ranges_file}: identity {int(np.argmax(bad))} holds the sample "
                    f"range {ranges[int(np.argmax(bad))].tolist()}, outside 0..{len(self)}"
                )
            self._identity_ranges = ranges
        return self._identity_ranges

    @property
    def identities(self) -> dict[int, str] | None:
        """The pack's identity names {label: name}, read from their file when asked for."""
        if self.manifest is None or self.manifest_path is None:
            return None
        return read_identities(self.manifest_path, self.manifest)
