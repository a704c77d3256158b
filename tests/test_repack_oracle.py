"""Repacked packs read by their consumers: MXNet 1.9.1 (recordio, ImageRecordIter), arcface's
`MXFaceDataset` logic, and DALI's `fn.readers.mxnet` (CPU)."""

from __future__ import annotations

import pytest
from helpers.handmade_datasets import write_insightface
from helpers.image_files import jpeg_bytes
from helpers.mxnet_oracle import run_mxnet
from test_dali import dali_python, dali_read

from rectool.inspect.dali import write_dali_index
from rectool.repack.pipeline import RepackOptions, repack

pytestmark = pytest.mark.oracle

IDENTITIES = [3, 0, 2, 4]  # images per identity; identity 1 has none


def images(key):
    return jpeg_bytes(key, 24, 24)


@pytest.fixture
def insightface_download(tmp_path):
    """An insightface folder as downloads come: header record last, an empty identity."""
    folder = tmp_path / "faces_emore"
    folder.mkdir()
    write_insightface(folder / "train.rec", folder / "train.idx", IDENTITIES, images)
    (folder / "property").write_text("4,24,24\n")
    # Source image key k has label: identity of k; empty identity 1 is relabelled away.
    labels = [label for label, count in enumerate(IDENTITIES) for _ in range(count)]
    new = {0: 0, 2: 1, 3: 2}
    return folder, {images(k + 1): float(new[label]) for k, label in enumerate(labels)}


MX_RECORDIO = """
import mxnet as mx
rec = mx.recordio.MXIndexedRecordIO(DATA["idx"], DATA["rec"], "r")
out = []
for key in rec.keys:
    header, image = mx.recordio.unpack(rec.read_idx(key))
    out.append((int(key), float(header.label), int(header.id), bytes(image)))
emit(out)
"""

MX_IMAGE_RECORD_ITER = """
import mxnet as mx
it = mx.io.ImageRecordIter(
    path_imgrec=DATA["rec"], path_imgidx=DATA["idx"], data_shape=(3, 24, 24), batch_size=1,
    shuffle=False, preprocess_threads=1, round_batch=False,
)
emit([float(batch.label[0].asnumpy()[0]) for batch in it])
"""


def test_mxnet_reads_a_shuffled_images_layout_repack(insightface_download, tmp_path):
    folder, expected = insightface_download
    repack([folder], tmp_path / "out", RepackOptions(order="shuffle", seed=7))
    paths = {"rec": str(tmp_path / "out.rec"), "idx": str(tmp_path / "out.idx")}
    records = run_mxnet(MX_RECORDIO, paths)
    assert [key for key, _, _, _ in records] == list(range(9))
    assert [key for key, _, _, _ in records] == [record_id for _, _, record_id, _ in records]
    assert {image: label for _, label, _, image in records} == expected
    assert sorted(image for *_, image in records) != [image for *_, image in records]
    labels = run_mxnet(MX_IMAGE_RECORD_ITER, paths)
    assert labels == [label for _, label, _, _ in records]


MX_FACE_DATASET = """
import numbers
import numpy as np
import mxnet as mx
rec = mx.recordio.MXIndexedRecordIO(DATA["idx"], DATA["rec"], "r")
header, _ = mx.recordio.unpack(rec.read_idx(0))
assert header.flag > 0
out = []
for idx in np.array(range(1, int(header.label[0]))):
    h, image = mx.recordio.unpack(rec.read_idx(int(idx)))
    label = h.label if isinstance(h.label, numbers.Number) else h.label[0]
    out.append((bytes(image), float(label)))
ranges = []
for key in range(int(header.label[0]), int(header.label[1])):
    h, body = mx.recordio.unpack(rec.read_idx(key))
    ranges.append(([float(x) for x in h.label], len(body)))
emit((out, ranges))
"""


def test_mxface_dataset_reads_an_insightface_repack_of_a_merge(insightface_download, tmp_path):
    folder, expected = insightface_download
    # A second source after the first: its labels follow (offset merge), relabelled 3, 4.
    other = tmp_path / "other"
    other.mkdir()
    write_insightface(other / "train.rec", other / "train.idx", [1, 2], lambda k: images(50 + k))
    expected = {**expected, images(51): 3.0, images(52): 4.0, images(53): 4.0}
    repack([folder, other], tmp_path / "ins" / "train", RepackOptions(layout="insightface"))
    got, ranges = run_mxnet(
        MX_FACE_DATASET,
        {"rec": str(tmp_path / "ins" / "train.rec"), "idx": str(tmp_path / "ins" / "train.idx")},
    )
    assert len(got) == 12 and dict(got) == expected
    assert [label for _, label in got] == sorted(label for _, label in got)
    assert ranges == [
        ([1.0, 4.0], 0),
        ([4.0, 6.0], 0),
        ([6.0, 10.0], 0),
        ([10.0, 11.0], 0),
        ([11.0, 13.0], 0),
    ]
    assert (tmp_path / "ins" / "property").read_text() == "5,24,24\n"


@pytest.mark.skipif(dali_python() is None, reason="DALI not installed (see tests/test_dali.py)")
def test_dali_counts_exactly_the_images_of_an_images_layout_repack(insightface_download, tmp_path):
    folder, expected = insightface_download
    # What DALI makes of the download itself: header and identity records as samples.
    assert len(dali_read([folder / "train.rec"], folder / "train.idx")) == 9 + 4 + 1
    repack([folder], tmp_path / "dali", RepackOptions(order="shuffle", seed=1, shard_records=4))
    recs = write_dali_index(tmp_path / "dali", tmp_path / "dali.all.idx")
    got = dali_read(recs, tmp_path / "dali.all.idx")
    assert len(got) == 9
    assert {payload.tobytes(): label for payload, label in got} == {
        image: [label] for image, label in expected.items()
    }
