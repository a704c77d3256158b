"""The readers against the real MXNet 1.9.1: im2rec's files and the insightface layout.

MXNet reads the same files through `MXIndexedRecordIO` + `recordio.unpack` (and arcface's
`MXFaceDataset` logic), through the .idx; the core reader, through the binary index (written by
`rectool index` for im2rec's files, by `pack` for rectool's), and the package's reader must
give the same samples and labels, in the same order.
"""

from __future__ import annotations

import random
import subprocess

import numpy as np
import pytest
from helpers.image_files import write_list, write_pack_tree
from helpers.mxnet_oracle import MX_FACE_DATASET, MX_READ_ALL, im2rec_path, oracle_python, run_mxnet

from rectool import open_dataset as open_pack
from rectool.packer.indexing import index_pack
from rectool.packer.packing import PackOptions, pack_images
from rectool.reader import open_dataset

pytestmark = pytest.mark.oracle


@pytest.fixture
def shuffled_tree(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["ann", "bob", "cyd", "dan"], 4, height=36, width=28)
    random.Random(5).shuffle(items)  # im2rec keeps the list's order
    return root, items


@pytest.mark.parametrize("pack_label", [False, True], ids=["scalar", "pack-label"])
def test_reads_im2rec_files_as_mxnet_does(shuffled_tree, tmp_path, pack_label):
    root, items = shuffled_tree
    if pack_label:
        items = [(index, [label, index / 4], rel) for index, label, rel in items]
    write_list(tmp_path / "faces.lst", items)
    args = ["--pack-label"] if pack_label else []
    subprocess.run(
        [
            str(oracle_python()),
            im2rec_path(),
            str(tmp_path / "faces"),
            str(root),
            "--num-thread",
            "1",
            "--quality",
            "90",
            *args,
        ],
        check=True,
        capture_output=True,
    )
    rec, idx = tmp_path / "faces.rec", tmp_path / "faces.idx"
    before = {p: p.read_bytes() for p in (rec, idx)}
    expected = run_mxnet(MX_READ_ALL, {"rec": str(rec), "idx": str(idx), "decode": True})
    index_pack(rec)
    assert {p: p.read_bytes() for p in (rec, idx)} == before  # indexing changes neither
    ds = open_dataset(tmp_path / "faces")
    rgb = open_dataset(tmp_path / "faces", decode="rgb")
    pack = open_pack(rec)
    assert ds.layout == "images" and pack.indexed
    assert len(pack) == len(ds)
    for (ours, our_label), (package, package_label) in zip(ds, pack):
        assert ours == package and np.array_equal(our_label, package_label)
    assert ds.keys.tolist() == [key for key, *_ in expected] == [i for i, _, _ in items]
    for n, (_, image, label, mx_rgb) in enumerate(expected):
        ours_image, ours_label = ds[n]
        assert ours_image == image
        if pack_label:
            assert ours_label.tolist() == label
            assert ds.labels[n].tolist() == label
        else:
            assert ours_label == label == ds.labels[n]
        decoded = rgb[n][0]
        assert decoded.shape == mx_rgb.shape == (36, 28, 3)
        # MXNet bundles its own OpenCV; two builds may round a pixel differently.
        assert np.abs(decoded.astype(int) - mx_rgb).mean() < 1


# arcface_torch's MXFaceDataset, with MXNet doing the reading.
def test_insightface_layout_as_mxface_dataset_reads_it(shuffled_tree, tmp_path):
    root, items = shuffled_tree
    write_list(tmp_path / "faces.lst", items)
    options = PackOptions(layout="insightface")
    pack_images(tmp_path / "faces.lst", root, tmp_path / "ins" / "train", options)
    rec = tmp_path / "ins" / "train.rec"
    samples, ranges = run_mxnet(
        MX_FACE_DATASET, {"rec": str(rec), "idx": str(tmp_path / "ins" / "train.idx")}
    )
    core = open_dataset(tmp_path / "ins" / "train")
    for ds in (core, *(open_pack(s) for s in (rec, tmp_path / "ins" / "train", tmp_path / "ins"))):
        assert ds.layout == "insightface"
        assert [(int(k), *ds[n]) for n, k in enumerate(ds.keys)] == samples
        assert ds.labels.tolist() == [label for _, _, label in samples]
        if ds is not core:
            assert ds.identity_ranges.tolist() == ranges == [[0, 4], [4, 8], [8, 12], [12, 16]]
