"""rectool's reader and writer against the real MXNet 1.9.1 `recordio`, in both directions."""

from __future__ import annotations

from contextlib import closing

import pytest
from helpers.framing_cases import image_record_cases, raw_payload_cases
from helpers.mxnet_oracle import run_mxnet

from rectool.format.headers import unpack_header
from rectool.format.records import IndexedRecordFile, iter_records
from rectool.format.writer import pack_image_record
from rectool.packer.writers import IndexedRecordWriter, RecordWriter
from rectool.reader import RecordFile

pytestmark = pytest.mark.oracle

MX_WRITE_RAW = """
from mxnet import recordio
w = recordio.MXRecordIO(DATA['rec'], 'w')
for payload in DATA['payloads']:
    w.write(payload)
w.close()
emit(None)
"""

MX_READ_RAW = """
from mxnet import recordio
r = recordio.MXRecordIO(DATA['rec'], 'r')
out = []
while True:
    item = r.read()
    if item is None:
        break
    out.append(item)
r.close()
emit(out)
"""

MX_WRITE_IMAGES = """
from mxnet import recordio
w = recordio.MXIndexedRecordIO(DATA['idx'], DATA['rec'], 'w')
for key, label, id1, id2, image in DATA['records']:
    w.write_idx(key, recordio.pack(recordio.IRHeader(0, label, id1, id2), image))
w.close()
emit(None)
"""

MX_READ_IMAGES = """
import numpy as np
from mxnet import recordio
r = recordio.MXIndexedRecordIO(DATA['idx'], DATA['rec'], 'r')
out = []
for key in r.keys:
    header, image = recordio.unpack(r.read_idx(key))
    label = header.label
    label = [float(x) for x in label] if isinstance(label, np.ndarray) else float(label)
    out.append((key, header.flag, label, header.id, header.id2, image))
r.close()
emit(out)
"""


def as_mxnet_label(label):
    return [float(x) for x in label] if isinstance(label, list) else float(label)


def test_rectool_reads_what_mxnet_writes_raw(tmp_path):
    payloads = [p for _, p in raw_payload_cases()]
    rec = tmp_path / "mx.rec"
    run_mxnet(MX_WRITE_RAW, {"rec": str(rec), "payloads": payloads})
    with closing(RecordFile(rec)) as f:
        got = [record for _, record in iter_records(f)]
    assert len(got) == len(payloads)
    for (name, expected), actual in zip(raw_payload_cases(), got):
        assert actual == expected, name


def test_mxnet_reads_what_rectool_writes_raw(tmp_path):
    cases = raw_payload_cases()
    rec = tmp_path / "ours.rec"
    with RecordWriter(rec) as w:
        for _, payload in cases:
            w.write(payload)
    got = run_mxnet(MX_READ_RAW, {"rec": str(rec)})
    assert len(got) == len(cases)
    for (name, expected), actual in zip(cases, got):
        assert actual == expected, name


def test_raw_rec_bytes_equal_mxnet(tmp_path):
    payloads = [p for _, p in raw_payload_cases()]
    run_mxnet(MX_WRITE_RAW, {"rec": str(tmp_path / "mx.rec"), "payloads": payloads})
    with RecordWriter(tmp_path / "ours.rec") as w:
        for payload in payloads:
            w.write(payload)
    assert (tmp_path / "ours.rec").read_bytes() == (tmp_path / "mx.rec").read_bytes()


def write_ours(tmp_path, records):
    with IndexedRecordWriter(tmp_path / "ours.rec", tmp_path / "ours.idx") as w:
        for key, label, id1, id2, image in records:
            w.write(key, pack_image_record(image, label, id1, id2))


def test_image_records_bytes_equal_mxnet(tmp_path):
    records = image_record_cases()
    run_mxnet(
        MX_WRITE_IMAGES,
        {"rec": str(tmp_path / "mx.rec"), "idx": str(tmp_path / "mx.idx"), "records": records},
    )
    write_ours(tmp_path, records)
    assert (tmp_path / "ours.rec").read_bytes() == (tmp_path / "mx.rec").read_bytes()
    assert (tmp_path / "ours.idx").read_bytes() == (tmp_path / "mx.idx").read_bytes()


def test_rectool_reads_mxnet_image_records(tmp_path):
    records = image_record_cases()
    run_mxnet(
        MX_WRITE_IMAGES,
        {"rec": str(tmp_path / "mx.rec"), "idx": str(tmp_path / "mx.idx"), "records": records},
    )
    with IndexedRecordFile(tmp_path / "mx.rec", tmp_path / "mx.idx") as f:
        assert f.keys.tolist() == [r[0] for r in records]
        for key, label, id1, id2, image in records:
            header, body = unpack_header(f.read(key))
            assert body == image
            assert (header.id, header.id2) == (id1, id2)
            if isinstance(label, list):
                assert header.flag == len(label)
                assert header.label.tolist() == label
            else:
                assert header.flag == 0
                assert header.label == label


def test_mxnet_reads_rectool_image_records(tmp_path):
    records = image_record_cases()
    write_ours(tmp_path, records)
    got = run_mxnet(
        MX_READ_IMAGES, {"rec": str(tmp_path / "ours.rec"), "idx": str(tmp_path / "ours.idx")}
    )
    expected = [
        (key, len(label) if isinstance(label, list) else 0, as_mxnet_label(label), i1, i2, img)
        for key, label, i1, i2, img in records
    ]
    assert got == expected
