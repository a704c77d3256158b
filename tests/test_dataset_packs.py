"""The package's open_dataset (`rectool.open_dataset`, `PackDataset`): every source the core
reader refuses (a bare .rec, a list of shards, a pack of format 1 or 2), read through the .idx
and each record's header, with the package's additions (shards, header(), labels of any width).

Datasets are written by hand (helpers/handmade_datasets.py), never by rectool.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers.handmade_datasets import (
    MAGIC,
    as_pairs,
    expected_pairs,
    images,
    write_pack,
    write_shard,
)

from rectool import open_dataset
from rectool import reader as core
from rectool.errors import RecordFormatError, RectoolError
from rectool.reader import RecordFile

MAGIC_FLOAT = float(np.frombuffer(MAGIC, "<f4")[0])


def edit_manifest(prefix, edit):
    path = Path(f"{prefix}.manifest.json")
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    return path


def test_open_by_prefix_manifest_rec_and_shard_list(handmade_shards):
    prefix, samples = handmade_shards
    shards = [f"{prefix}-{n:05d}.rec" for n in range(3)]
    for source in (prefix, f"{prefix}.manifest.json", shards, [os.fspath(p) for p in shards]):
        ds = open_dataset(source)
        assert len(ds) == 12
        assert as_pairs(ds) == expected_pairs(samples)
        assert ds.layout == "images"
    one = open_dataset(shards[1])
    assert as_pairs(one) == expected_pairs(samples[4:7])


def test_missing_idx(handmade_shards):
    prefix, _ = handmade_shards
    os.unlink(f"{prefix}-00002.idx")
    with pytest.raises(RectoolError) as caught:
        open_dataset(prefix)
    assert str(caught.value) == f"{prefix}-00002.idx: index file not found"


def test_idx_pointing_past_the_end_of_the_rec(tmp_path):
    data = images(3)
    write_pack(tmp_path / "a", [[(k, data[k], 0.0) for k in range(3)]], manifest=False)
    size = os.path.getsize(tmp_path / "a.rec")
    with open(tmp_path / "a.idx", "a") as f:
        f.write(f"3\t{size + 64}\n")
    with pytest.raises(RecordFormatError) as caught:
        open_dataset(tmp_path / "a.rec")
    error = caught.value
    assert (error.path, error.offset, error.key) == (str(tmp_path / "a.rec"), size + 64, 3)
    assert f"the index {tmp_path / 'a.idx'} is stale or belongs to another .rec" in str(error)


def test_idx_of_another_file(tmp_path):
    data = images(4)
    write_pack(tmp_path / "a", [[(k, data[k], 0.0) for k in range(2)]], manifest=False)
    write_pack(tmp_path / "b", [[(k, image, 0.0) for k, image in enumerate(data)]], manifest=False)
    os.replace(tmp_path / "b.idx", tmp_path / "a.idx")
    with pytest.raises(RecordFormatError) as caught:
        open_dataset(tmp_path / "a.rec")
    assert caught.value.path == str(tmp_path / "a.rec")
    assert "is stale or belongs to another .rec (rebuild it from the .rec)" in str(caught.value)


def test_stale_idx_against_the_manifest(handmade_shards):
    prefix, _ = handmade_shards
    idx = f"{prefix}-00001.idx"
    with open(idx) as f:
        lines = f.readlines()
    with open(idx, "w") as f:
        f.writelines(lines[:2])
    with pytest.raises(RectoolError) as caught:
        open_dataset(prefix)
    assert str(caught.value) == (
        f"{idx}: 2 index lines, but the manifest {prefix}.manifest.json lists 3 records for "
        "this shard: the .idx or the manifest is stale"
    )


def test_rec_changed_after_packing(handmade_shards):
    prefix, _ = handmade_shards
    with open(f"{prefix}-00000.rec", "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(RectoolError, match="bytes, but the manifest .* lists .*: the file changed"):
        open_dataset(prefix)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["shards"][0].pop("idx"), "shards[0].idx"),
        (lambda d: d["shards"][2].update(rec=None), "shards[2].rec"),
        (lambda d: d.update(shards="x"), "shards"),
        (lambda d: d["shards"][0].update(records="many"), "shards[0].records"),
        (lambda d: d["shards"][0].update(rec_bytes=-1), "shards[0].rec_bytes"),
        (lambda d: d["shards"].__setitem__(1, "a.rec"), "shards[1].rec"),
        (lambda d: d.update(format_version="1"), "format_version"),
    ],
    ids=[
        "no idx",
        "rec null",
        "shards a string",
        "records a word",
        "negative size",
        "shard a string",
        "version a string",
    ],
)
def test_manifest_fields_are_checked_and_named(handmade_shards, edit, field):
    # The fields a reader reads; those only rectool's commands read (identities, totals, ...)
    # are rectool's to check (tests/test_manifest_schema.py).
    manifest = edit_manifest(handmade_shards[0], edit)
    with pytest.raises(RectoolError) as caught:
        open_dataset(manifest)
    assert str(caught.value).startswith(f"{manifest}: manifest field {field!r} must be ")


def test_a_shard_given_twice_is_refused(handmade_shards):
    rec = f"{handmade_shards[0]}-00000.rec"
    with pytest.raises(RectoolError, match="a shard is listed twice"):
        open_dataset([rec, rec])


def test_an_empty_index_beside_a_full_rec_is_refused(handmade_shards):
    prefix, _ = handmade_shards
    Path(f"{prefix}-00001.idx").write_bytes(b"")
    manifest = edit_manifest(prefix, lambda d: d["shards"][1].update(records=None))
    with pytest.raises(RectoolError) as caught:
        open_dataset(manifest)
    assert str(caught.value).startswith(f"{prefix}-00001.idx: empty index beside ")


def test_an_offset_past_the_end_of_the_rec_is_refused_at_open(tmp_path):
    data = images(5)
    samples = write_pack(tmp_path / "c", [[(k, data[k], 0.0) for k in range(5)]], manifest=False)
    size = os.path.getsize(tmp_path / "c.rec")
    lines = [f"{s.key}\t{s.offset}\n" for s in samples]
    lines[1] = f"1\t{size + 1024}\n"  # the farthest offset: checked at open
    (tmp_path / "c.idx").write_text("".join(lines))
    with pytest.raises(RecordFormatError) as caught:
        open_dataset(tmp_path / "c.rec")
    assert (caught.value.key, caught.value.offset) == (1, size + 1024)


def test_missing_dataset(tmp_path):
    with pytest.raises(RectoolError, match="no dataset here"):
        open_dataset(tmp_path / "nothing")


def test_each_samples_shard_is_public(handmade_shards):
    # Shards of 4, 3 and 5 samples (conftest.py): what the DALI index and repack read.
    prefix, samples = handmade_shards
    ds = open_dataset(prefix)
    assert ds.shard_bounds == [0, 4, 7, 12]
    assert ds.shard_ids.tolist() == [0] * 4 + [1] * 3 + [2] * 5
    assert [rf.path for rf in ds.shard_files] == [f"{prefix}-{n:05d}.rec" for n in range(3)]
    assert [ds.shard_files[int(ds.shard_ids[i])].path for i in range(12)] == [
        s.rec for s in samples
    ]


def test_labels_never_read_image_bytes(handmade_shards, monkeypatch):
    ds = open_dataset(handmade_shards[0])

    def no_reads(*args, **kwargs):
        raise AssertionError("a whole record was read")

    monkeypatch.setattr(RecordFile, "read_parts", no_reads)
    assert ds.labels.tolist() == [float(n) for n in range(12)]


def test_multi_label_records(tmp_path):
    data = images(5)
    items = [(k, data[k], [k, 0.5, -2.0]) for k in range(5)]
    write_pack(tmp_path / "m", [items])
    ds = open_dataset(tmp_path / "m")
    assert ds.labels.dtype == np.float32 and ds.labels.shape == (5, 3)
    for k in range(5):
        image, label = ds[k]
        assert image == data[k]
        assert label.dtype == np.float32 and label.tolist() == [k, 0.5, -2.0]
        assert label.flags.writeable
        assert ds.labels[k].tolist() == [k, 0.5, -2.0]
        assert ds.header(k).flag == 3


def test_mixed_label_widths_give_an_object_array(tmp_path):
    data = images(3)
    write_pack(tmp_path / "x", [[(0, data[0], 1.0), (1, data[1], [2.0, 3.0]), (2, data[2], [4.0])]])
    labels = open_dataset(tmp_path / "x").labels
    assert labels.dtype == object
    assert labels[0] == 1.0
    assert labels[1].tolist() == [2.0, 3.0] and labels[2].tolist() == [4.0]


def test_split_records_read_whole(tmp_path):
    """Payloads with the magic at aligned offsets are split into parts (FORMAT-NOTES §1)."""
    # IRHeader is 24 bytes, so image offset 0 is record offset 24: aligned.
    tricky = [MAGIC + b"abcd" + MAGIC + MAGIC, b"xy" + MAGIC + b"zz", b"abcd" + MAGIC, MAGIC]
    items = [(k, image, float(k)) for k, image in enumerate(tricky)]
    items.append((9, b"plain", [MAGIC_FLOAT, 7.0]))  # the magic inside the label vector
    write_pack(tmp_path / "s", [items])
    ds = open_dataset(tmp_path / "s")
    assert [image for image, _ in ds] == [*tricky, b"plain"]
    assert ds.labels.dtype == object
    assert ds.labels[:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert ds[4][1].view("<u4")[0] == 0xCED7230A


def test_corrupt_record_names_file_offset_and_key(tmp_path):
    data = images(5)
    samples = write_pack(
        tmp_path / "c", [[(k + 10, data[k], 0.0) for k in range(5)]], manifest=False
    )
    # Record 1 is none of the records checked at open (first, middle, last, farthest).
    with open(tmp_path / "c.rec", "r+b") as f:
        f.seek(samples[1].offset)
        f.write(b"\xde\xad\xbe\xef")
    ds = open_dataset(tmp_path / "c.rec")
    assert ds[0] == (data[0], 0.0)
    for read in (lambda: ds[1], lambda: ds.labels):
        with pytest.raises(RecordFormatError) as caught:
            read()
        error = caught.value
        assert (error.path, error.offset, error.key) == (samples[1].rec, samples[1].offset, 11)
        assert str(error) == (
            f"{samples[1].rec}, key 11, byte offset {samples[1].offset}: "
            "bad magic 0xefbeadde (expected 0xced7230a)"
        )


def test_record_too_short_for_its_header(tmp_path):
    write_shard(tmp_path / "t.rec", tmp_path / "t.idx", [(0, b"\0" * 24), (1, b"short")])
    ds = open_dataset(tmp_path / "t.rec")
    with pytest.raises(RecordFormatError) as caught:
        ds[1]
    assert (caught.value.key, caught.value.offset) == (1, 32)
    assert "record of 5 bytes, too short for its 24-byte image header" in str(caught.value)


def test_a_format_3_pack_reads_the_same_through_the_core_and_the_package(tmp_path):
    items = [(k, image, float(k)) for k, image in enumerate(images(5))]
    samples = write_pack(tmp_path / "p", [items[:2], items[2:]], index=True)
    pack, ds = open_dataset(tmp_path / "p"), core.open_dataset(tmp_path / "p")
    assert pack.indexed and as_pairs(pack) == as_pairs(ds) == expected_pairs(samples)
    assert pack.labels.tolist() == ds.labels.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert pack.shard_bounds == [0, 2, 5]
    assert [pack.location(i) for i in range(5)] == [ds.location(i) for i in range(5)]
