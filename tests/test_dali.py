"""NVIDIA DALI's `fn.readers.mxnet` on rectool shards: the recipe of docs/training.md, run for real.

DALI runs CPU-only (`device_id=None`) in its own interpreter, found at $RECTOOL_DALI_PYTHON or
`.venv-dali/bin/python`; without it these tests are skipped. To set one up:

    python3 -m venv .venv-dali && .venv-dali/bin/pip install nvidia-dali-cuda120 numpy
"""

from __future__ import annotations

import os
import pickle
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers.handmade_datasets import MAGIC, write_insightface, write_pack
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree

from rectool.inspect.dali import write_dali_index
from rectool.packer.packing import PackOptions, pack_images
from rectool.reader import RectoolError, open_dataset

REPO = Path(__file__).resolve().parents[1]


def dali_python():
    configured = os.environ.get("RECTOOL_DALI_PYTHON")
    path = Path(configured) if configured else REPO / ".venv-dali" / "bin" / "python"
    return path if path.exists() else None


pytestmark = pytest.mark.skipif(
    dali_python() is None,
    reason="DALI not installed: set RECTOOL_DALI_PYTHON or create .venv-dali (see this file)",
)

# The pipeline of docs/training.md, CPU-only; one sample per run so an epoch is exact.
DALI_READ = textwrap.dedent(
    """
    import pickle, sys
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    recs, idx, decode = pickle.loads(sys.stdin.buffer.read())

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipeline():
        data, labels = fn.readers.mxnet(
            path=recs, index_path=[idx], random_shuffle=False, name="reader"
        )
        if decode:
            data = fn.decoders.image(data, device="cpu", output_type=types.RGB)
        return data, labels

    pipe = pipeline()
    pipe.build()
    out = []
    for _ in range(pipe.epoch_size("reader")):
        data, labels = pipe.run()
        out.append((np.array(data[0]), np.array(labels[0]).tolist()))
    sys.stdout.buffer.write(pickle.dumps(out))
    """
)


def dali_read(recs, idx, decode=False):
    proc = subprocess.run(
        [str(dali_python()), "-c", DALI_READ],
        input=pickle.dumps(([str(r) for r in recs], str(idx), decode)),
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    return pickle.loads(proc.stdout)


@pytest.mark.parametrize("pack_label", [False, True])
def test_dali_reads_a_sharded_rectool_pack_sample_for_sample(tmp_path, pack_label):
    items = write_pack_tree(tmp_path / "tree", ["ann", "bob", "cyd"], 4)
    if pack_label:
        items = [(index, [label, 0.25], rel) for index, label, rel in items]
    lst = write_list(tmp_path / "faces.lst", items)
    options = PackOptions(shard_records=5, pack_label=pack_label)
    pack_images(lst, tmp_path / "tree", tmp_path / "out" / "faces", options)
    ds = open_dataset(tmp_path / "out" / "faces")
    assert ds.location(11)[0] == str(tmp_path / "out" / "faces-00002.rec")  # 3 shards of 5
    recs = write_dali_index(tmp_path / "out" / "faces", tmp_path / "dali.idx")
    got = dali_read(recs, tmp_path / "dali.idx")
    assert len(got) == len(ds) == 12
    for (payload, label), (image, ours) in zip(got, ds):
        assert payload.tobytes() == image
        assert label == (ours.tolist() if pack_label else [ours])


def test_dali_rejoins_split_records_as_we_do(tmp_path):
    tricky = [MAGIC * 3 + b"abcd", b"xy" + MAGIC + b"zz", jpeg_bytes(1), b"abcd" + MAGIC]
    write_pack(tmp_path / "s", [[(k, image, float(k)) for k, image in enumerate(tricky)]])
    recs = write_dali_index(tmp_path / "s", tmp_path / "s.dali.idx")
    got = dali_read(recs, tmp_path / "s.dali.idx")
    assert [payload.tobytes() for payload, _ in got] == tricky
    assert [label for _, label in got] == [[0.0], [1.0], [2.0], [3.0]]


def test_dali_cpu_decoding_matches_ours(tmp_path):
    items = write_pack_tree(tmp_path / "tree", ["ann", "bob"], 3, height=48, width=40)
    lst = write_list(tmp_path / "f.lst", items)
    pack_images(lst, tmp_path / "tree", tmp_path / "f")
    recs = write_dali_index(tmp_path / "f", tmp_path / "f.dali.idx")
    got = dali_read(recs, tmp_path / "f.dali.idx", decode=True)
    ds = open_dataset(tmp_path / "f", decode="rgb")
    for (image, _), (ours, _) in zip(got, ds):
        assert image.shape == ours.shape == (48, 40, 3)
        # Two JPEG decoders may round differently, never by much.
        assert np.abs(image.astype(int) - ours).mean() < 2


def test_dali_takes_insightface_header_records_for_samples(tmp_path):
    """Why the guide says DALI needs the images layout: it returns every record."""
    write_insightface(tmp_path / "train.rec", tmp_path / "train.idx", [2, 3], jpeg_bytes)
    got = dali_read([tmp_path / "train.rec"], tmp_path / "train.idx")
    assert len(got) == 5 + 2 + 1  # images, identity records, header record
    assert sum(payload.size == 0 for payload, _ in got) == 3
    with pytest.raises(RectoolError, match="pack with --layout images for DALI"):
        write_dali_index(tmp_path / "train.rec", tmp_path / "x.idx")
