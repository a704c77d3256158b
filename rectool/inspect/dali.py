"""Write the one .idx that NVIDIA DALI's `fn.readers.mxnet` needs for a dataset's shards."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from ..dataset.packs import PackDataset
from ..doors.output import check_target, write_output
from ..errors import InputError

if TYPE_CHECKING:
    from _typeshed import StrPath


def write_dali_index(source: StrPath, path: StrPath, overwrite: bool = False) -> list[str]:
    """Write DALI's index for the dataset at `source` to `path`; return the .rec paths.

    DALI reads its list of .rec files as one stream, so its index holds offsets counted from
    the start of the first file (keys are ignored). Pass the returned paths as `path`, in
    that order. DALI treats every record as a sample, so the insightface layout is refused:
    pack for DALI with the images layout. An existing file at `path` is replaced only with
    `overwrite`, and never a pack's own file (its .idx, say).
    """
    check_target(path, overwrite, "DALI index")
    ds = PackDataset(source)
    if ds.layout != "images":  # a pack DALI cannot use as it is: exit 2, as the table says
        raise InputError(
            f"{ds.shards[0][0]}: DALI reads every record as a sample, including the header and "
            "identity records of the insightface layout; pack with --layout images for DALI"
        )
    assert ds.shard_bounds is not None  # the images layout reads samples shard by shard
    counts = np.diff(ds.shard_bounds)
    sizes = [os.path.getsize(rec) for rec, _ in ds.shards]
    base = np.repeat(np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64), counts)
    pairs = zip(ds.keys.tolist(), (ds.offsets + base).tolist())
    text = "".join(f"{key}\t{offset}\n" for key, offset in pairs)
    write_output(os.fspath(path), text, overwrite, "DALI index")
    return [rec for rec, _ in ds.shards]
