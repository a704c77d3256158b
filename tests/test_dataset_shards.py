"""A pack's shards as RecordDataset shows them (`shard_ids`, `shard_bounds`) and `rectool
index-cache` on packs whose names meet: what an adversarial review found, each test failing on
the code it reviewed.
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


def counting_writes(monkeypatch):
    from rectool.format import indexcache

    real, log = indexcache.write_atomic, []

    def write_atomic(path, body):
        log.append(os.path.basename(os.fspath(path)))
        return real(path, body)

    monkeypatch.setattr(indexcache, "write_atomic", write_atomic)
    return log


def test_index_cache_twice_writes_nothing_when_a_shard_cache_is_the_dataset_cache_path(
    tmp_path, monkeypatch
):
    """A manifest train.manifest.json whose first shard is train.rec/train.idx (insightface's
    names, with more shards added by hand): the shard cache train.idx.rtc and the dataset cache
    PREFIX.idx.rtc are one path. Each run writes one over the other, so neither is ever
    current: every `rectool index-cache` renames a new file over the one a job maps."""
    from rectool.format.indexcache import write_index_caches

    manifest = hand_pack(tmp_path, ["train", "train-1"])
    write_index_caches(manifest)
    log = counting_writes(monkeypatch)
    done = write_index_caches(manifest)
    assert log == []  # all current: nothing renamed over a mapped file
    assert done.written == [] and done.kept == [
        f"{tmp_path}/train.idx.rtc",
        f"{tmp_path}/train-1.idx.rtc",
    ]


def test_index_cache_reports_a_cache_it_left_as_it_is_as_left_not_written(tmp_path):
    """`rectool index-cache` prints "Wrote PATH." for caches it now leaves untouched (and its
    --json help says "the caches written"): a user cannot tell what it did."""
    from click.testing import CliRunner

    from rectool.cli import cli

    manifest = hand_pack(tmp_path, ["train-0", "train-1"])
    first = CliRunner().invoke(cli, ["index-cache", manifest])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(cli, ["index-cache", manifest])
    assert again.exit_code == 0, again.output
    assert "Wrote" not in again.output, again.output


def insightface_out_of_shard_order(folder):
    """An insightface pack whose images 1..3 are in shard 1 and 4..5 in shard 0: samples do not
    run shard by shard, so reads look each sample's shard up in `shard_ids`."""
    n, k = 5, 2  # images 1..5; identities 0: 1..3, 1: 4..5 (keys 6, 7); header at key 0
    header = (0, image_record(b"", [n + 1.0, n + 1.0 + k], 0, 1))
    faces = {key: (key, image_record(b"face%d" % key, float(key > 3), key)) for key in range(1, 6)}
    ids = [(6, image_record(b"", [1.0, 4.0], 6)), (7, image_record(b"", [4.0, 6.0], 7))]
    groups = [[header, faces[4], faces[5]], [faces[1], faces[2], faces[3]], ids]
    entries = []
    for number, records in enumerate(groups):
        stem = f"faces-{number:05d}"
        write_shard(folder / f"{stem}.rec", folder / f"{stem}.idx", records)
        entries.append({"rec": f"{stem}.rec", "idx": f"{stem}.idx", "records": len(records),
                        "rec_bytes": os.path.getsize(folder / f"{stem}.rec")})  # fmt: skip
    doc = {"format": "rectool-manifest", "format_version": 1, "layout": "insightface",
           "shards": entries, "totals": {"records": 8}}  # fmt: skip
    (folder / "faces.manifest.json").write_text(json.dumps(doc))
    return os.fspath(folder / "faces.manifest.json")


def test_writing_into_the_public_shard_ids_cannot_change_what_a_read_returns(tmp_path):
    """`shard_ids` is public now and hands out the very table `_locate` reads (writeable, unlike
    `keys` and `offsets`, which the dataset makes read-only): a caller that writes into it,
    say to renumber shards for its own sampler, makes ds[i] read another shard's bytes."""
    from rectool.reader import open_dataset

    ds = open_dataset(insightface_out_of_shard_order(tmp_path))
    assert ds.layout == "insightface" and ds.shard_bounds is None
    want = [(b"face1", 0.0), (b"face2", 0.0), (b"face3", 0.0), (b"face4", 1.0), (b"face5", 1.0)]
    assert [ds[i] for i in range(5)] == want
    ids = ds.shard_ids
    try:
        ids[:] = 2 - ids  # the caller's own numbering, in place
    except ValueError:
        pass  # read-only: the fix
    got = []
    for i in range(5):
        try:
            got.append(ds[i])
        except Exception as exc:  # noqa: BLE001  # the read of another shard fails
            got.append(type(exc).__name__)
    assert got == want


def test_writing_into_the_public_shard_bounds_cannot_change_what_a_read_returns(tmp_path):
    """`shard_bounds` returns the dataset's own list, which `_locate` bisects."""
    from rectool.reader import open_dataset

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
    from rectool.reader import open_dataset

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
