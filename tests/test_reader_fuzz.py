"""Mutated .rec/.idx/.npy/manifest bytes: the readers raise only their own errors, never hang.

A format-3 pack (two shards, a record split at a magic word, its binary index), the same
without its index (format 1, a multi-label record) and an insightface .rec are written once per
example, one of their files is damaged (bytes overwritten, cut short, or bytes inserted), then
each is opened (the format-3 pack by the core reader and by the package, the others by the
package) and every sample read, decoded, and its labels and identity ranges gathered.
Whatever happens must be a `RectoolError` (or nothing). An alarm fails an example that blocks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from helpers.handmade_datasets import MAGIC, write_insightface, write_pack
from helpers.image_files import jpeg_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rectool import open_dataset
from rectool import reader as core
from rectool.reader import RectoolError

FILES = [
    "faces-00000.rec",
    "faces-00001.idx",
    "faces.manifest.json",
    "g-00001.rec",
    "g.manifest.json",
    "g.offsets.npy",
    "g.keys.npy",
    "g.labels.npy",
    "f.rec",
    "f.idx",
]


def build(folder):
    images = [jpeg_bytes(k, 12, 10) for k in range(5)]
    split = images[0][:8] + MAGIC + images[0][8:]  # a magic word at an aligned offset: split
    write_pack(
        folder / "faces",
        [[(0, split, 0.0), (1, images[1], 1.0)], [(7, images[2], [1.0, 2.0]), (3, images[3], 3.0)]],
    )
    shards = [[(0, images[4], 0.0), (1, images[1], 1.0)], [(7, split, 2.0), (3, images[3], 3.0)]]
    write_pack(folder / "g", shards, index=True)
    write_insightface(folder / "f.rec", folder / "f.idx", [2, 1], lambda k: images[k % 5])


def mutate(data, kind, at, blob):
    at = at % (len(data) + 1)
    if kind == "overwrite":
        return data[:at] + blob + data[at + len(blob) :]
    if kind == "cut":
        return data[:at]
    return data[:at] + blob + data[at:]


def read_everything(source):
    ds = open_dataset(source, decode="bgr")
    samples = [ds[i] for i in range(len(ds))]
    return samples, ds.labels, ds.identity_ranges, open_dataset(source, layout="images").labels


def read_with_the_core(source):
    ds = core.open_dataset(source, decode="bgr")
    return [ds[i] for i in range(len(ds))], ds.labels.tolist(), ds.keys.tolist()


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    name=st.sampled_from(FILES),
    kind=st.sampled_from(["overwrite", "cut", "insert"]),
    at=st.integers(0, 10**6),
    blob=st.one_of(
        st.binary(min_size=1, max_size=8),
        st.sampled_from([MAGIC, b"\xff" * 4, b"\0" * 4, b"\n", b"\t", b"-1", b'"', b"null"]),
    ),
)
def test_damaged_files_raise_only_rectool_errors(alarm, name, kind, at, blob):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build(folder)
        path = folder / name
        path.write_bytes(mutate(path.read_bytes(), kind, at, blob))
        alarm(20)
        for read, source in (
            (read_everything, folder / "faces"),
            (read_everything, folder / "f.rec"),
            (read_everything, folder / "g"),
            (read_with_the_core, folder / "g"),
        ):
            try:
                read(source)
            except RectoolError:
                pass


def test_the_unmutated_files_read_whole(tmp_path):
    build(tmp_path)
    ds = open_dataset(tmp_path / "faces", decode="bgr")
    assert len(ds) == 4 and all(ds[i][0].ndim == 3 for i in range(4))
    assert len(open_dataset(tmp_path / "f.rec")) == 3
    assert np.array_equal(open_dataset(tmp_path / "f.rec").identity_ranges, [[0, 2], [2, 3]])
    samples, labels, keys = read_with_the_core(tmp_path / "g")
    assert labels == [0.0, 1.0, 2.0, 3.0] and keys == [0, 1, 7, 3]
    assert all(image.ndim == 3 for image, _ in samples)
