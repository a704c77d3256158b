"""`rectool list` output read by the real MXNet 1.9.1: im2rec.py packs it, MXNet reads it back."""

from __future__ import annotations

import os
import subprocess

import pytest
from click.testing import CliRunner
from helpers.image_trees import face_tree, make_mixed_tree
from helpers.mxnet_oracle import im2rec_path, oracle_python, run_mxnet

from rectool.cli import cli
from rectool.packer.listfile import read_list

pytestmark = pytest.mark.oracle

MX_READ_PACK = """
from mxnet import recordio
out = {}
for rec, idx in DATA:
    r = recordio.MXIndexedRecordIO(idx, rec, 'r')
    for key in r.keys:
        header, payload = recordio.unpack(r.read_idx(key))
        out.setdefault(rec, []).append((key, float(header.label), int(header.id), payload))
    r.close()
emit(out)
"""

MX_IMAGE_ITER = """
import mxnet as mx
it = mx.image.ImageIter(
    batch_size=1, data_shape=(3, 12, 10), path_imglist=DATA['lst'], path_root=DATA['root'],
    shuffle=False,
)
labels = []
for batch in it:
    labels.append(float(batch.label[0].asnumpy()[0]))
emit(labels)
"""


def rectool_list(*args):
    result = CliRunner().invoke(cli, ["list", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def im2rec_pack(prefix, root, *options):
    """Run im2rec.py's pack step on PREFIX*.lst; return its output."""
    proc = subprocess.run(
        [str(oracle_python()), im2rec_path(), str(prefix), str(root), *options],
        capture_output=True,
        text=True,
        timeout=600,
        # im2rec opens the list in the locale's encoding: the list is UTF-8.
        env={**os.environ, "PYTHONUTF8": "1", "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lst should have" not in proc.stdout
    assert "Parsing lst met error" not in proc.stdout
    assert "error" not in proc.stdout.lower(), proc.stdout[-3000:]
    return proc.stdout


def test_im2rec_packs_our_list_with_unicode_names_byte_for_byte(tmp_path):
    root = tmp_path / "faces"
    files = make_mixed_tree(root)
    work = tmp_path / "work"
    work.mkdir()
    rectool_list(root, work / "faces.lst", "-q")
    items = read_list(work / "faces.lst")
    assert any(not item.path.isascii() for item in items)
    im2rec_pack(work / "faces", root, "--pass-through")
    records = run_mxnet(MX_READ_PACK, [(str(work / "faces.rec"), str(work / "faces.idx"))])
    got = records[str(work / "faces.rec")]
    expected = [
        (
            item.index,
            item.label,
            item.index,
            files["alice/01.jpg" if item.path == "bob/link.jpg" else item.path],
        )
        for item in items
    ]
    assert got == expected


def test_im2rec_packs_split_lists_with_unique_keys_and_imageiter_reads_them(tmp_path):
    root = tmp_path / "faces"
    face_tree(root, identities=6, per_identity=3)
    work = tmp_path / "work"
    work.mkdir()
    rectool_list(
        root,
        work / "faces.lst",
        "--shuffle",
        "--seed",
        "2",
        "--val-ratio",
        "0.34",
        "--split-by",
        "identity",
        "-q",
    )
    # Re-encoding (no --pass-through) makes im2rec decode every image with OpenCV.
    im2rec_pack(work / "faces", root)
    lists = {name: read_list(work / f"faces_{name}.lst") for name in ("train", "val")}
    pairs = [(str(work / f"faces_{n}.rec"), str(work / f"faces_{n}.idx")) for n in lists]
    records = run_mxnet(MX_READ_PACK, pairs)
    for name, items in lists.items():
        got = records[str(work / f"faces_{name}.rec")]
        assert [(key, label, id1) for key, label, id1, _ in got] == [
            (item.index, item.label, item.index) for item in items
        ]
        assert all(payload[:2] == b"\xff\xd8" for *_, payload in got)
    keys = [key for recs in records.values() for key, *_ in recs]
    assert sorted(keys) == list(range(18))
    train_labels = {item.label for item in lists["train"]}
    val_labels = {item.label for item in lists["val"]}
    assert len(val_labels) == 2 and not train_labels & val_labels
    labels = run_mxnet(MX_IMAGE_ITER, {"lst": str(work / "faces_val.lst"), "root": str(root)})
    assert labels == [item.label for item in lists["val"]]
