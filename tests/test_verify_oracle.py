"""verify, reindex, info and unpack on files the real MXNet 1.9.1 wrote, split records included."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers.image_files import jpeg_bytes
from helpers.mxnet_oracle import run_mxnet
from helpers.rec_files import MAGIC, idx_lines, part_length, xor_byte

from rectool.cli import cli
from rectool.inspect.info import dataset_info
from rectool.inspect.reindex import reindex
from rectool.inspect.unpack import unpack_dataset
from rectool.inspect.verify import verify_dataset

pytestmark = pytest.mark.oracle

MX_WRITE = """
import numpy as np
from mxnet import recordio
w = recordio.MXIndexedRecordIO(DATA['idx'], DATA['rec'], 'w')
for key, label, image in DATA['records']:
    if isinstance(label, list):
        label = np.array(label, dtype=np.float32)
    w.write_idx(key, recordio.pack(recordio.IRHeader(0, label, key, 0), image))
w.close()
emit(None)
"""

MX_READ = """
from mxnet import recordio
r = recordio.MXIndexedRecordIO(DATA['idx'], DATA['rec'], 'r')
out = {key: recordio.unpack(r.read_idx(key))[1] for key in r.keys}
r.close()
emit(out)
"""


def images_with_magic(count):
    """JPEG bytes with the RecordIO magic at aligned payload offsets: MXNet must split them."""
    out = []
    for n in range(count):
        image = jpeg_bytes(n)
        if n % 2:
            # The 24-byte header puts image offset 8 at payload offset 32, a 4-byte boundary.
            image = image[:8] + MAGIC + image[12:16] + MAGIC + image[20:]
        out.append(image)
    return out


@pytest.fixture
def mxnet_split(tmp_path):
    rec, idx = tmp_path / "mx.rec", tmp_path / "mx.idx"
    images = images_with_magic(6)
    records = [(key, float(key % 3), image) for key, image in enumerate(images)]
    run_mxnet(MX_WRITE, {"rec": str(rec), "idx": str(idx), "records": records})
    return rec, idx, images


def test_verify_passes_on_mxnet_file_with_split_records(mxnet_split):
    rec, idx, images = mxnet_split
    offset = idx_lines(idx)[1][1]
    assert part_length(rec, offset)[0] == 1  # MXNet really split record 1
    result = CliRunner().invoke(cli, ["verify", str(rec), "--decode"])
    assert result.exit_code == 0, result.output
    report = verify_dataset(rec)
    assert report.sound
    assert (report.records, report.images, report.layouts) == (6, 6, ["images"])


def test_reindex_reproduces_mxnet_idx(mxnet_split, tmp_path):
    rec, idx, _ = mxnet_split
    result = reindex(rec, tmp_path / "again.idx")
    assert result.sound
    assert (tmp_path / "again.idx").read_bytes() == idx.read_bytes()


def test_unpack_and_info_on_mxnet_file(mxnet_split, tmp_path):
    rec, _, images = mxnet_split
    unpack_dataset(rec, tmp_path / "out")
    for key, image in enumerate(images):
        assert (tmp_path / "out" / str(key % 3) / f"{key}.jpg").read_bytes() == image
    info = dataset_info(rec)
    assert (info["records"], info["identities"], info["layout"]) == (6, 3, "images")


def test_mxnet_reads_an_index_recovered_from_a_damaged_file(mxnet_split, tmp_path):
    rec, idx, images = mxnet_split
    lines = idx_lines(idx)
    xor_byte(rec, lines[2][1], 0x01)  # record 2 loses its magic
    report = verify_dataset(rec)
    assert [(p.kind, p.key, p.offset) for p in report.problems] == [("bad-magic", 2, lines[2][1])]
    result = reindex(rec, idx, overwrite=True)
    assert [(d.start, d.end) for d in result.skipped] == [(lines[2][1], lines[3][1])]
    read = run_mxnet(MX_READ, {"rec": str(rec), "idx": str(idx)})
    assert read == {key: image for key, image in enumerate(images) if key != 2}


def insightface_by_mxnet(tmp_path, counts, ranges=None):
    """Write the face-dataset layout with MXNet as insightface does: record 0 written last."""
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    records, key = [], 1
    for label, count in enumerate(counts):
        for _ in range(count):
            records.append((key, float(label), jpeg_bytes(key)))
            key += 1
    n, start = key - 1, 1
    for label, count in enumerate(counts):
        pair = ranges[label] if ranges else [float(start), float(start + count)]
        records.append((n + 1 + label, pair, b""))
        start += count
    records.append((0, [float(n + 1), float(n + 1 + len(counts))], b""))
    run_mxnet(MX_WRITE, {"rec": str(rec), "idx": str(idx), "records": records})
    return rec, idx


def test_verify_passes_on_mxnet_insightface_layout(tmp_path):
    rec, _ = insightface_by_mxnet(tmp_path, [3, 1, 2])
    report = verify_dataset(tmp_path, decode=None)
    assert report.sound, report.problems
    assert (report.layouts, report.records, report.images) == (["insightface"], 10, 6)
    info = dataset_info(rec)
    assert (info["layout"], info["images"], info["identities"]) == ("insightface", 6, 3)


def test_verify_catches_overlapping_ranges_in_mxnet_insightface_layout(tmp_path):
    rec, idx = insightface_by_mxnet(tmp_path, [3, 1, 2], ranges=[[1, 4], [3, 5], [5, 7]])
    offset = dict(idx_lines(idx))[8]
    report = verify_dataset(rec)
    assert [(p.kind, p.key, p.offset) for p in report.problems] == [
        ("insightface-range", 8, offset)
    ]
    assert report.problems[0].message == "identity range [3, 5) starts at 3 instead of 4"
