"""A dataset opened before `pack --overwrite` and read after it must not serve the new pack.

`open_dataset` maps the pack's index and notes each shard's file (device, inode, size,
modification time); reads map the .rec by path (and so does every DataLoader worker, forked or
handed a pickled dataset). A file replaced in between would be read with the old index: the
reader refuses a file other than the one it noted.
"""

from __future__ import annotations

import pickle

import pytest
from helpers.image_files import write_list, write_pack_tree

import rectool
from rectool import reader as rd
from rectool.packer.packing import PackOptions, pack_images


def pack(tmp_path, name, height, overwrite=False, shard_records=None):
    root = tmp_path / name
    items = write_pack_tree(root, ["ann", "bob"], 6, height=height)
    lst = write_list(tmp_path / f"{name}.lst", items)
    options = PackOptions(workers=1, shard_records=shard_records)
    pack_images(lst, root, tmp_path / "out" / "faces", options, overwrite=overwrite)
    return tmp_path / "out" / "faces"


def message(prefix):
    return f"{prefix}.rec was replaced after it was opened; open again"


def test_a_dataset_read_after_an_overwrite_refuses_the_new_files(tmp_path):
    prefix = pack(tmp_path, "old", height=40)
    old = [bytes(image) for image, _ in rd.open_dataset(prefix)]
    ds = rd.open_dataset(prefix)  # indexed, not read yet: nothing mapped
    pack(tmp_path, "new", height=48, overwrite=True)  # same prefix, other images
    assert bytes(rd.open_dataset(prefix)[0][0]) != old[0]
    with pytest.raises(rd.RectoolError) as caught:
        ds[0]
    assert str(caught.value) == message(prefix)


def test_a_dataset_mapped_before_an_overwrite_keeps_reading_the_old_files(tmp_path):
    prefix = pack(tmp_path, "old", height=40)
    ds = rd.open_dataset(prefix)
    first = bytes(ds[0][0])  # mapped: the mapping holds the old file
    pack(tmp_path, "new", height=48, overwrite=True)
    assert bytes(ds[0][0]) == first
    ds.close()  # mapping again would find the new file
    with pytest.raises(rd.RectoolError, match="was replaced after it was opened"):
        ds[0]


@pytest.mark.parametrize("opener", [rd.open_dataset, rectool.open_dataset])
@pytest.mark.parametrize("shards", [None, 4])  # the new pack: one shard again, or three
def test_a_worker_given_the_pickled_dataset_refuses_the_new_pack(tmp_path, opener, shards):
    """A spawn worker unpickling the dataset after `pack --overwrite` refuses the new pack at
    once: its labels and length are the new pack's, its shards may be more or fewer (a worker
    once read the old shards with the new index, and an IndexError ended iteration early)."""
    prefix = pack(tmp_path, "old", height=40)
    ds = opener(prefix)
    ds[0]  # mapped in the parent: it keeps reading the old file
    state = pickle.dumps(ds)  # as a spawn worker receives it
    pack(tmp_path, "new", height=48, overwrite=True, shard_records=shards)
    ds[1]
    with pytest.raises(rd.RectoolError, match="the pack was replaced; open it again"):
        pickle.loads(state)


def test_the_same_file_opens_again(tmp_path):
    prefix = pack(tmp_path, "old", height=40)
    ds = rd.open_dataset(prefix)
    expected = [bytes(ds[i][0]) for i in range(len(ds))]
    ds.close()
    assert [bytes(image) for image, _ in pickle.loads(pickle.dumps(ds))] == expected
    assert [bytes(ds[i][0]) for i in range(len(ds))] == expected


@pytest.mark.parametrize("change", ["cut", "grown"])
def test_a_shard_of_another_size_than_its_manifest_is_refused_at_open(tmp_path, change):
    # A shard copied in after packing (or cut by a full disk) with the index of the old one:
    # the manifest's rec_bytes says so before a read would map offsets into other bytes.
    prefix = pack(tmp_path, "old", height=40)
    rec = tmp_path / "out" / "faces.rec"
    data = rec.read_bytes()
    rec.write_bytes(data[:-4] if change == "cut" else data + bytes(4))
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(prefix)
    size = len(data) + (-4 if change == "cut" else 4)
    assert str(caught.value) == (
        f"{rec}: {size:,} bytes, not the {len(data)} its manifest says: the shard was "
        "replaced or cut after packing"
    )
