"""open_dataset: resolving a prefix, manifest, .rec or shard list, and refusing bad ones.

Runs against `rectool.reader`, and through tests/test_emit.py against the emitted standalone
copy in a process where rectool cannot be imported (see helpers/reader_under_test.py). Datasets
are written by hand (helpers/handmade_datasets.py), never by rectool.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.handmade_datasets import (
    as_pairs,
    expected_pairs,
    images,
    write_pack,
)
from helpers.reader_under_test import rd


def test_open_by_prefix_manifest_rec_and_shard_list(handmade_shards):
    prefix, samples = handmade_shards
    shards = [f"{prefix}-{n:05d}.rec" for n in range(3)]
    for source in (prefix, f"{prefix}.manifest.json", shards, [os.fspath(p) for p in shards]):
        ds = rd.open_dataset(source)
        assert len(ds) == 12
        assert as_pairs(ds) == expected_pairs(samples)
        assert ds.layout == "images"
    one = rd.open_dataset(shards[1])
    assert as_pairs(one) == expected_pairs(samples[4:7])


def test_empty_dataset(tmp_path):
    write_pack(tmp_path / "empty", [[]])
    ds = rd.open_dataset(tmp_path / "empty")
    assert len(ds) == 0 and list(ds) == []
    assert ds.labels.shape == (0,)


# --- missing, stale and mismatched files -----------------------------------------------------


def test_missing_rec(handmade_shards):
    prefix, _ = handmade_shards
    os.unlink(f"{prefix}-00001.rec")
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value) == f"{prefix}-00001.rec: record file not found"


def test_missing_idx(handmade_shards):
    prefix, _ = handmade_shards
    os.unlink(f"{prefix}-00002.idx")
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value) == f"{prefix}-00002.idx: index file not found"


def test_missing_dataset(tmp_path):
    with pytest.raises(rd.RectoolError, match="no dataset here"):
        rd.open_dataset(tmp_path / "nothing")


def test_idx_pointing_past_the_end_of_the_rec(tmp_path):
    data = images(3)
    write_pack(tmp_path / "a", [[(k, data[k], 0.0) for k in range(3)]], manifest=False)
    size = os.path.getsize(tmp_path / "a.rec")
    with open(tmp_path / "a.idx", "a") as f:
        f.write(f"3\t{size + 64}\n")
    with pytest.raises(rd.RecordFormatError) as caught:
        rd.open_dataset(tmp_path / "a.rec")
    error = caught.value
    assert (error.path, error.offset, error.key) == (str(tmp_path / "a.rec"), size + 64, 3)
    assert f"the index {tmp_path / 'a.idx'} is stale or belongs to another .rec" in str(error)


def test_idx_of_another_file(tmp_path):
    data = images(4)
    write_pack(tmp_path / "a", [[(k, data[k], 0.0) for k in range(2)]], manifest=False)
    write_pack(tmp_path / "b", [[(k, image, 0.0) for k, image in enumerate(data)]], manifest=False)
    os.replace(tmp_path / "b.idx", tmp_path / "a.idx")
    with pytest.raises(rd.RecordFormatError) as caught:
        rd.open_dataset(tmp_path / "a.rec")
    assert caught.value.path == str(tmp_path / "a.rec")
    assert "is stale or belongs to another .rec (rebuild it from the .rec)" in str(caught.value)


def test_stale_idx_against_the_manifest(handmade_shards):
    prefix, _ = handmade_shards
    idx = f"{prefix}-00001.idx"
    with open(idx) as f:
        lines = f.readlines()
    with open(idx, "w") as f:
        f.writelines(lines[:2])
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value) == (
        f"{idx}: 2 index lines, but the manifest {prefix}.manifest.json lists 3 records for "
        "this shard: the .idx or the manifest is stale"
    )


def test_rec_changed_after_packing(handmade_shards):
    prefix, _ = handmade_shards
    with open(f"{prefix}-00000.rec", "ab") as f:
        f.write(b"\0" * 8)
    with pytest.raises(
        rd.RectoolError, match="bytes, but the manifest .* lists .*: the file changed"
    ):
        rd.open_dataset(prefix)


# --- hostile and damaged inputs (issue 12) ---------------------------------------------------


def edit_manifest(prefix, edit):
    path = Path(f"{prefix}.manifest.json")
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("name", ["../../x/y.rec", "/etc/hostname", "sub/a.rec", "..", ""])
def test_manifest_shard_paths_must_be_plain_names_in_its_folder(handmade_shards, tmp_path, name):
    prefix, _ = handmade_shards
    secret = tmp_path / "secret.rec"
    secret.write_bytes(b"SECRET CONTENTS")
    if name == "/etc/hostname":
        name = str(secret)
    manifest = edit_manifest(prefix, lambda d: d["shards"][1].update(rec=name))
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(manifest)
    message = str(caught.value)
    assert message == (
        f"{manifest}: manifest field 'shards[1].rec' must be a plain file name in the "
        "manifest's folder"
    )


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["shards"][0].pop("idx"), "shards[0].idx"),
        (lambda d: d["shards"][2].update(rec=None), "shards[2].rec"),
        (lambda d: d.update(shards="x"), "shards"),
        (lambda d: d["shards"][0].update(records="many"), "shards[0].records"),
        (lambda d: d["shards"][0].update(rec_bytes=-1), "shards[0].rec_bytes"),
        (lambda d: d["shards"].__setitem__(1, "a.rec"), "shards[1]"),
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
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value).startswith(f"{manifest}: manifest field {field!r} must be ")


@pytest.mark.parametrize("field", ["rec", "idx"])
def test_a_shard_name_holding_a_lone_surrogate_is_refused_naming_it(handmade_shards, field):
    """JSON's \\ud800 escape alone is half a UTF-16 pair, no text: no file can be opened by
    such a name (a UnicodeEncodeError in os.open). Refused as any bad name is."""
    manifest = edit_manifest(handmade_shards[0], lambda d: d["shards"][1].update({field: "\ud800"}))
    assert b"\\ud800" in manifest.read_bytes()
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value) == (
        f"{manifest}: manifest field 'shards[1].{field}' must be a plain file name in the "
        "manifest's folder"
    )


def test_manifest_listing_one_shard_twice_is_refused(handmade_shards):
    manifest = edit_manifest(handmade_shards[0], lambda d: d["shards"].append(dict(d["shards"][0])))
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value) == (
        f"{manifest}: manifest lists the shard file "
        f"{Path(f'{handmade_shards.prefix}-00000.rec').name!r} twice"
    )


def test_a_shard_given_twice_is_refused(handmade_shards):
    rec = f"{handmade_shards[0]}-00000.rec"
    with pytest.raises(rd.RectoolError, match="a shard is listed twice"):
        rd.open_dataset([rec, rec])


@pytest.mark.parametrize("which", ["rec", "idx", "manifest", "rtc"])
def test_a_fifo_in_place_of_a_file_is_refused_not_read(handmade_shards, which, no_hang):
    prefix, _ = handmade_shards
    path = {
        "rec": f"{prefix}-00001.rec",
        "idx": f"{prefix}-00001.idx",
        "manifest": f"{prefix}.manifest.json",
        "rtc": f"{prefix}-00001.idx.rtc",
    }[which]
    if os.path.exists(path):
        os.unlink(path)
    os.mkfifo(path)
    if which == "rtc":  # an optional sidecar: a FIFO there is ignored, never opened blocking
        assert len(rd.open_dataset(prefix)) == 12
        return
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value).startswith(f"{path}: not a regular file")


def test_a_folder_in_place_of_a_rec_is_refused(handmade_shards):
    prefix, _ = handmade_shards
    os.unlink(f"{prefix}-00001.rec")
    os.mkdir(f"{prefix}-00001.rec")
    with pytest.raises(rd.RectoolError, match="00001.rec: not a regular file"):
        rd.open_dataset(prefix)


def test_an_empty_index_beside_a_full_rec_is_refused(handmade_shards):
    prefix, _ = handmade_shards
    Path(f"{prefix}-00001.idx").write_bytes(b"")
    manifest = edit_manifest(prefix, lambda d: d["shards"][1].update(records=None))
    with pytest.raises(rd.RectoolError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value).startswith(f"{prefix}-00001.idx: empty index beside ")


def test_an_offset_past_the_end_of_the_rec_is_refused_at_open(tmp_path):
    data = images(5)
    samples = write_pack(tmp_path / "c", [[(k, data[k], 0.0) for k in range(5)]], manifest=False)
    size = os.path.getsize(tmp_path / "c.rec")
    lines = [f"{s.key}\t{s.offset}\n" for s in samples]
    lines[1] = f"1\t{size + 1024}\n"  # the farthest offset: checked at open
    (tmp_path / "c.idx").write_text("".join(lines))
    with pytest.raises(rd.RecordFormatError) as caught:
        rd.open_dataset(tmp_path / "c.rec")
    assert (caught.value.key, caught.value.offset) == (1, size + 1024)
