"""Adversarial review of the index-cache, shard-name and demo-folder commits (d0e7112..6e8c55d).

Each test is one defect found: it fails on the code under review and passes once it is fixed.
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


# --- index-cache: "a current cache is left as it is" ------------------------------------------


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
    written = write_index_caches(manifest)
    assert log == []  # all current: nothing renamed over a mapped file
    assert len(set(written)) == len(written)  # and no path reported twice


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


# --- the public shard names of RecordDataset ----------------------------------------------------


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


# --- the demo's folder --------------------------------------------------------------------------


def test_the_demo_never_writes_through_a_marker_that_is_a_link(tmp_path):
    """A folder whose .rectool-demo is a link to a user's file (planted, or a dotfiles manager
    linking every dotfile): `fresh_folder` accepts it as the demo's and writes its marker text
    through the link, over the user's file."""
    from rectool.demo import MARKER, fresh_folder

    victim = tmp_path / "bashrc"
    victim.write_text("years of aliases")
    out = tmp_path / "demo"
    out.mkdir()
    (out / MARKER).symlink_to(victim)
    try:
        fresh_folder(out)
    except SystemExit:
        pass  # refused: fine
    assert victim.read_text() == "years of aliases"


def test_the_demo_refuses_a_marker_that_is_a_folder_with_a_message(tmp_path):
    """.rectool-demo a folder: an IsADirectoryError traceback instead of the demo's refusal."""
    from rectool.demo import MARKER, fresh_folder

    out = tmp_path / "demo"
    (out / MARKER).mkdir(parents=True)
    (out / MARKER / "notes.txt").write_text("mine")
    try:
        fresh_folder(out)
    except SystemExit:
        pass
    assert (out / MARKER / "notes.txt").read_text() == "mine"


# --- the remote pack's index cache, written once under a lock -----------------------------------


def test_a_remote_pack_opens_when_its_optional_index_cache_cannot_be_locked(
    remote_pack, tmp_path, monkeypatch
):
    """The dataset cache only saves time: before write_once, a cache that could not be written
    was skipped. Now the open fails outright when its lock cannot be opened (here a folder left
    at PREFIX.idx.rtc.download; likewise a link, EACCES or EROFS on a shared cache folder)."""
    from rectool import open_dataset
    from rectool.remote import Retry
    from rectool.remote import dataset as dataset_module

    monkeypatch.setattr(dataset_module, "INDEX_CACHE_MIN_RECORDS", 10)
    retry = Retry(sleep=lambda s: None, jitter=False)
    first = open_dataset(remote_pack.url, cache_dir=str(tmp_path / "cache"), retry=retry)
    want = first.keys.tolist()
    cache = next(
        os.path.join(root, name)
        for root, _, names in os.walk(tmp_path / "cache")
        for name in names
        if name.endswith(".idx.rtc")
    )
    os.remove(cache)
    os.remove(cache + ".download")  # the lock the first open left
    os.mkdir(cache + ".download")  # what is there instead of a lock file
    ds = open_dataset(remote_pack.url, cache_dir=str(tmp_path / "cache"), retry=retry)
    assert ds.keys.tolist() == want
