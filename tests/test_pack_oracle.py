"""Packs read by the real MXNet 1.9.1: ImageRecordIter, gluon, im2rec and arcface's reader."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from helpers.image_files import encode, image_array, jpeg_bytes, write_list, write_pack_tree
from helpers.mxnet_oracle import im2rec_path, oracle_python, run_mxnet

from rectool.packer.packing import PackOptions, pack_images

pytestmark = pytest.mark.oracle


@pytest.fixture
def tree_with_bad_files(tmp_path):
    root = tmp_path / "tree"
    good = jpeg_bytes(500, 32, 32)
    extra = [
        ("bob/zero.jpg", b"", 1),
        ("bob/truncated.jpg", good[: len(good) // 2], 1),
        ("carol/readme.jpg", b"not an image", 2),
        ("carol/ok.png", encode(image_array(9, 32, 32), ".png"), 2),
    ]
    items = write_pack_tree(root, ["alice", "bob", "carol"], 5, height=32, width=32, extra=extra)
    lst = write_list(tmp_path / "faces.lst", items)
    bad = {"bob/zero.jpg", "bob/truncated.jpg", "carol/readme.jpg"}
    good_items = [(i, label, rel) for i, label, rel in items if rel not in bad]
    return root, lst, good_items


MX_IMAGE_RECORD_ITER = """
import cv2, os
import numpy as np
import mxnet as mx
it = mx.io.ImageRecordIter(
    path_imgrec=DATA["rec"], path_imgidx=DATA["idx"], data_shape=(3, 32, 32), batch_size=1,
    shuffle=False, preprocess_threads=1, round_batch=False,
)
out = []
for batch in it:
    data = batch.data[0].asnumpy()[0]
    out.append((float(batch.label[0].asnumpy()[0]), data.astype("uint8").tobytes()))
emit(out)
"""


def expected_rgb_chw(root, rel):
    """Decode a source file in the oracle's OpenCV, as MXNet does: RGB, CHW."""
    return run_mxnet(
        "import cv2\n"
        "img = cv2.imread(DATA)\n"
        "emit(cv2.cvtColor(img, cv2.COLOR_BGR2RGB).transpose(2, 0, 1).tobytes())",
        str(root / rel),
    )


def test_image_record_iter_reads_pack_of_tree_with_bad_files(tree_with_bad_files, tmp_path):
    root, lst, good = tree_with_bad_files
    result = pack_images(lst, root, tmp_path / "p", PackOptions(max_failures=3))
    assert result.failures == 3
    got = run_mxnet(
        MX_IMAGE_RECORD_ITER, {"rec": str(tmp_path / "p.rec"), "idx": str(tmp_path / "p.idx")}
    )
    assert [label for label, _ in got] == [float(label) for _, label, _ in good]
    for (_, pixels), (_, _, rel) in zip(got, good):
        assert pixels == expected_rgb_chw(root, rel), rel


MX_GLUON_DATASET = """
import mxnet as mx
ds = mx.gluon.data.vision.ImageRecordDataset(DATA)
out = []
for i in range(len(ds)):
    img, label = ds[i]
    out.append((float(label), img.shape, img.asnumpy().transpose(2, 0, 1).tobytes()))
emit(out)
"""


def test_gluon_image_record_dataset_reads_pack(tree_with_bad_files, tmp_path):
    root, lst, good = tree_with_bad_files
    pack_images(lst, root, tmp_path / "g", PackOptions(max_failures=3))
    got = run_mxnet(MX_GLUON_DATASET, str(tmp_path / "g.rec"))
    assert [(label, shape) for label, shape, _ in got] == [
        (float(label), (32, 32, 3)) for _, label, _ in good
    ]
    for (_, _, pixels), (_, _, rel) in zip(got, good):
        assert pixels == expected_rgb_chw(root, rel), rel


def test_pass_through_bytes_equal_im2rec(tree_with_bad_files, tmp_path):
    root, _, good = tree_with_bad_files
    im2rec_dir = tmp_path / "im2rec"
    im2rec_dir.mkdir()
    write_list(im2rec_dir / "faces.lst", good)
    subprocess.run(
        [
            str(oracle_python()),
            im2rec_path(),
            str(im2rec_dir / "faces"),
            str(root),
            "--pass-through",
            "--num-thread",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    pack_images(im2rec_dir / "faces.lst", root, tmp_path / "ours" / "faces")
    assert (tmp_path / "ours" / "faces.rec").read_bytes() == (im2rec_dir / "faces.rec").read_bytes()
    assert (tmp_path / "ours" / "faces.idx").read_bytes() == (im2rec_dir / "faces.idx").read_bytes()


# What insightface's arcface_torch `MXFaceDataset` does, with MXNet doing the reading.
MX_FACE_DATASET = """
import numbers
import numpy as np
import mxnet as mx
rec = mx.recordio.MXIndexedRecordIO(DATA["idx"], DATA["rec"], "r")
header, _ = mx.recordio.unpack(rec.read_idx(0))
assert header.flag > 0
imgidx = np.array(range(1, int(header.label[0])))
out = []
for idx in imgidx:
    header, img = mx.recordio.unpack(rec.read_idx(int(idx)))
    label = header.label
    if not isinstance(label, numbers.Number):
        label = label[0]
    out.append((int(idx), float(label), mx.image.imdecode(img).shape))
identities = []
header0, _ = mx.recordio.unpack(rec.read_idx(0))
for key in range(int(header0.label[0]), int(header0.label[1])):
    h, body = mx.recordio.unpack(rec.read_idx(key))
    identities.append((key, [float(x) for x in h.label], len(body)))
emit((out, identities))
"""


def test_mxface_dataset_reads_insightface_layout(tree_with_bad_files, tmp_path):
    root, lst, good = tree_with_bad_files
    pack_images(
        lst, root, tmp_path / "ins" / "train", PackOptions(layout="insightface", max_failures=3)
    )
    images, identities = run_mxnet(
        MX_FACE_DATASET,
        {"rec": str(tmp_path / "ins" / "train.rec"), "idx": str(tmp_path / "ins" / "train.idx")},
    )
    labels = sorted(label for _, label, _ in good)
    assert images == [(key, float(label), (32, 32, 3)) for key, label in enumerate(labels, 1)]
    n = len(good)
    counts = [labels.count(c) for c in range(3)]
    starts = [1 + sum(counts[:c]) for c in range(3)]
    assert identities == [
        (n + 1 + c, [float(starts[c]), float(starts[c] + counts[c])], 0) for c in range(3)
    ]
    assert (tmp_path / "ins" / "property").read_text() == "3,32,32\n"


def test_im2rec_cannot_refuse_what_we_refuse(tree_with_bad_files, tmp_path):
    """The peer's failure mode, shown: im2rec --pass-through packs the zero-byte file."""
    root, lst, _ = tree_with_bad_files
    shutil.copy(lst, tmp_path / "peer.lst")
    subprocess.run(
        [
            str(oracle_python()),
            im2rec_path(),
            str(tmp_path / "peer"),
            str(root),
            "--pass-through",
            "--num-thread",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    sizes = run_mxnet(
        "from mxnet import recordio\n"
        "r = recordio.MXIndexedRecordIO(DATA + '.idx', DATA + '.rec', 'r')\n"
        "emit([len(recordio.unpack(r.read_idx(k))[1]) for k in r.keys])",
        str(tmp_path / "peer"),
    )
    assert 0 in sizes  # an empty image record, which ImageRecordIter cannot decode
