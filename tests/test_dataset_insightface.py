"""The insightface layout, as the package reads it: record 0's header, identity ranges, images
across shards. (The core reader reads a pack in this layout once `rectool index` has written
its binary index; packs without one are the package's.)

Datasets are written by hand (helpers/handmade_datasets.py), never by rectool.
"""

from __future__ import annotations

import pickle

import pytest
from helpers.handmade_datasets import (
    as_pairs,
    expected_pairs,
    image_record,
    images,
    write_insightface,
    write_manifest,
    write_pack,
    write_shard,
)
from helpers.image_files import jpeg_bytes

from rectool import errors as rd
from rectool import open_dataset
from rectool.format.headers import insightface_header, unpack_header
from rectool.format.textindex import load_index
from rectool.reader import RecordFile


def face(key):
    return jpeg_bytes(key, 16, 16)


@pytest.mark.parametrize("header_last", [True, False])
def test_insightface_layout_detected_from_record_0(tmp_path, header_last):
    samples, ranges = write_insightface(
        tmp_path / "train.rec", tmp_path / "train.idx", [3, 1, 4], face, header_last
    )
    for source in (tmp_path / "train.rec", tmp_path):
        ds = open_dataset(source)
        assert ds.layout == "insightface"
        assert len(ds) == 8
        assert as_pairs(ds) == expected_pairs(samples)
        assert ds.keys.tolist() == list(range(1, 9))
        assert ds.labels.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
        assert ds.identity_ranges.tolist() == [[0, 3], [3, 4], [4, 8]] == [list(r) for r in ranges]


def test_insightface_layout_from_the_manifest(tmp_path):
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2, 2], face)
    entries = [{"rec": "f.rec", "idx": "f.idx", "records": 7}]
    write_manifest(tmp_path / "f", entries, "insightface")
    ds = open_dataset(tmp_path / "f")
    assert (ds.layout, len(ds), ds.identity_ranges.tolist()) == ("insightface", 4, [[0, 2], [2, 4]])


def test_layout_can_be_forced(tmp_path):
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2, 2], face)
    everything = open_dataset(tmp_path / "f.rec", layout="images")
    assert len(everything) == 7 and everything.identity_ranges is None
    with pytest.raises(ValueError, match="layout must be one of"):
        open_dataset(tmp_path / "f.rec", layout="faces")


def test_insightface_layout_refused_without_a_header(handmade_shards):
    with pytest.raises(rd.RecordFormatError, match="record 0 is not an insightface header"):
        open_dataset(handmade_shards[0], layout="insightface")


def test_im2rec_pack_label_record_0_is_an_image_not_a_header(tmp_path):
    # im2rec --pack-label: key 0 is an ordinary image with a label vector (flag 2).
    data = images(3)
    items = [(k, data[k], [float(k), 1.0]) for k in range(3)]
    write_pack(tmp_path / "im2rec", [items], manifest=False)
    ds = open_dataset(tmp_path / "im2rec.rec")
    assert ds.layout == "images" and len(ds) == 3
    assert [image for image, _ in ds] == data


@pytest.mark.parametrize(
    "zero, one",
    [
        ([2.0, 3.0, 3.0], 5.0),  # flag 3 (issue 13: a header for the reader, not for `info`)
        ([1.5, 3.0], 5.0),  # a key range that is not whole
        ([2.0, 2.0], [5.0, 1.0]),  # images with label vectors: im2rec --pack-label
    ],
    ids=["flag 3", "not whole", "image labels"],
)
def test_record_0_is_a_header_only_with_flag_2_and_whole_key_bounds(tmp_path, zero, one):
    records = [(0, image_record(b"", zero, 0, 1)), (1, image_record(face(1), one, 1))]
    write_shard(tmp_path / "f.rec", tmp_path / "f.idx", records)
    ds = open_dataset(tmp_path / "f.rec")
    assert (ds.layout, len(ds), ds.identity_ranges) == ("images", 2, None)
    payload, label = ds.raw(0)
    assert payload == b"" and label.tolist() == zero == ds.labels[0].tolist()
    with pytest.raises(rd.RecordFormatError, match="record 0 is not an insightface header"):
        open_dataset(tmp_path / "f.rec", layout="insightface")


def test_insightface_header_gives_the_key_ranges(tmp_path):
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2, 3], face)
    keys, offsets = load_index(tmp_path / "f.idx")
    rf = RecordFile(tmp_path / "f.rec")
    header = insightface_header(lambda j: unpack_header(rf.read_parts(offsets[j])[0]), keys)
    assert header == (range(1, 6), range(6, 8))


def test_insightface_missing_image_key(tmp_path):
    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2, 2], face)
    lines = (tmp_path / "f.idx").read_text().splitlines(keepends=True)
    (tmp_path / "f.idx").write_text("".join(lines[:2] + lines[3:]))  # drops key 3
    with pytest.raises(rd.RectoolError, match="key 3 is not in the index"):
        open_dataset(tmp_path / "f.rec")


def test_insightface_images_across_shards(tmp_path):
    # Keys 1..N spread over two files, header in the second: still one dataset in key order.
    images_ = {k: face(k) for k in range(1, 6)}
    write_shard(
        tmp_path / "a.rec",
        tmp_path / "a.idx",
        [(k, image_record(images_[k], float(k > 2), k)) for k in (1, 2, 3)],
    )
    write_shard(
        tmp_path / "b.rec",
        tmp_path / "b.idx",
        [
            (5, image_record(images_[5], 1.0, 5)),
            (4, image_record(images_[4], 1.0, 4)),
            (6, image_record(b"", [1.0, 3.0], 6)),
            (7, image_record(b"", [3.0, 6.0], 7)),
            (0, image_record(b"", [6.0, 8.0], 0, 1)),
        ],
    )
    ds = open_dataset([tmp_path / "a.rec", tmp_path / "b.rec"])
    assert [image for image, _ in ds] == [images_[k] for k in range(1, 6)]
    assert ds.keys.tolist() == [1, 2, 3, 4, 5]
    assert ds.labels.tolist() == [0, 0, 1, 1, 1]
    assert ds.identity_ranges.tolist() == [[0, 2], [2, 5]]
    assert pickle.loads(pickle.dumps(ds))[3] == ds[3] == (images_[4], 1.0)


def test_insightface_images_alternating_between_shards_are_refused(tmp_path):
    # Keys 1, 3 in one file and 2, 4 in the other: in key order, samples would jump between
    # shards, which no binary index (samples shard by shard) can hold: refused, named.
    images_ = {k: face(k) for k in range(1, 5)}
    write_shard(
        tmp_path / "a.rec",
        tmp_path / "a.idx",
        [(k, image_record(images_[k], float(k), k)) for k in (1, 3)]
        + [(0, image_record(b"", [5.0, 6.0], 0, 1)), (5, image_record(b"", [1.0, 5.0], 5))],
    )
    write_shard(
        tmp_path / "b.rec",
        tmp_path / "b.idx",
        [(k, image_record(images_[k], float(k), k)) for k in (2, 4)],
    )
    with pytest.raises(rd.RectoolError) as caught:
        open_dataset([tmp_path / "a.rec", tmp_path / "b.rec"])
    assert str(caught.value) == (
        f"{tmp_path / 'a.rec'}: the insightface images do not run shard by shard; a binary "
        "index reads samples in shard order"
    )
