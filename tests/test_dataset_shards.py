"""A pack's shards as the package's PackDataset shows them (`shard_ids`, `shard_bounds`): what
an adversarial review found, each test failing on the code it reviewed.
"""

from __future__ import annotations

import json
import os

from helpers.handmade_datasets import image_record, write_shard


def hand_pack(folder, stems, per=5, layout="images", name="train"):
    """Shards `stems` (`per` records each, keys running on) under NAME.manifest.json."""
    entries, key = [], 0
    for stem in stems:
        records = [(k, image_record(b"img%d" % k, float(k), k)) for k in range(key, key + per)]
        key += per
        write_shard(folder / f"{stem}.rec", folder / f"{stem}.idx", records)
        entries.append({"rec": f"{stem}.rec", "idx": f"{stem}.idx", "records": per,
                        "rec_bytes": os.path.getsize(folder / f"{stem}.rec")})  # fmt: skip
    doc = {"format": "rectool-manifest", "format_version": 1, "layout": layout,
           "shards": entries, "totals": {"records": key}}  # fmt: skip
    manifest = folder / f"{name}.manifest.json"
    manifest.write_text(json.dumps(doc))
    return os.fspath(manifest)


def test_writing_into_the_public_shard_ids_cannot_change_what_a_read_returns(tmp_path):
    """`shard_ids` is public: a caller that writes into it, say to renumber shards for its own
    sampler, must not make ds[i] read another shard's bytes."""
    from rectool import open_dataset

    ds = open_dataset(hand_pack(tmp_path, ["train-0", "train-1", "train-2"], per=2))
    want = [(b"img%d" % k, float(k)) for k in range(6)]
    assert [ds[i] for i in range(6)] == want
    ids = ds.shard_ids
    assert ids.tolist() == [0, 0, 1, 1, 2, 2]
    try:
        ids[:] = 2 - ids  # the caller's own numbering, in place
    except ValueError:
        pass  # read-only
    got = []
    for i in range(6):
        try:
            got.append(ds[i])
        except Exception as exc:  # noqa: BLE001  # the read of another shard fails
            got.append(type(exc).__name__)
    assert got == want


def test_writing_into_the_public_shard_bounds_cannot_change_what_a_read_returns(tmp_path):
    """`shard_bounds` returns the dataset's own list, which `_locate` bisects."""
    from rectool import open_dataset

    ds = open_dataset(hand_pack(tmp_path, ["train-0", "train-1"]))
    want = [(b"img%d" % k, float(k)) for k in range(10)]
    assert [ds[i] for i in range(10)] == want
    bounds = ds.shard_bounds
    assert bounds == [0, 5, 10]
    bounds[1] = 10  # e.g. a caller turning bounds into ends for its own use
    got = []
    for i in range(10):
        try:
            got.append(ds[i])
        except Exception as exc:  # noqa: BLE001
            got.append(type(exc).__name__)
    assert got == want


def test_writing_into_shard_ids_of_an_images_pack_cannot_change_its_labels(tmp_path):
    """Where samples run shard by shard, `shard_ids` is made on first use and then kept: the
    labels are read through it."""
    from rectool import open_dataset

    ds = open_dataset(hand_pack(tmp_path, ["train-0", "train-1"]))
    ids = ds.shard_ids
    try:
        ids[:] = 0
    except ValueError:
        pass
    try:
        labels = ds.labels.tolist()
    except Exception as exc:  # noqa: BLE001
        labels = type(exc).__name__
    assert labels == [float(k) for k in range(10)]
