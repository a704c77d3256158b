"""repack hands the binary index what it wrote (issue 38): each shard's offsets as its writer
kept them, the keys, and the images' labels where each is one scalar; the .idx and the
records' headers are then not read back (`binindex.Written`), and the index is the one read
back from the files, array for array. A few records of each shard are still checked
(`headers.check_shard`); a label vector, a record framed again or a resumed run read back.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers.handmade_datasets import MAGIC, index_arrays, write_pack
from helpers.image_files import jpeg_bytes

from rectool.errors import RecordFormatError, RectoolError
from rectool.format import binindex
from rectool.format.binindex import Written, index_manifest
from rectool.repack.pipeline import RepackOptions, repack


def source(prefix, vector=False, split=False):
    """Write a two-shard pack of 15 records over 4 identities, one not an image (refused);
    with `split`, it holds the magic word (a record split in two)."""
    images = [jpeg_bytes(k, 10 + 3 * (k % 5), 8 + 2 * (k % 4)) for k in range(14)]
    images.append(MAGIC * 2 + b"abcd" if split else b"not an image")

    def label(k, classes):
        return [float(k % classes), 0.5 * k] if vector else float(k % classes)

    write_pack(
        prefix,
        [
            [(k, images[k], label(k, 4)) for k in range(8)],
            [(k, images[k], label(k, 3)) for k in range(8, 15)],
        ],
    )


def read_back(prefix):
    """Return (the manifest, the arrays written, the index read back from the files)."""
    manifest, written = index_arrays(prefix)
    return manifest, written, index_manifest(f"{prefix}.manifest.json", manifest)


def assert_index_is_the_files(prefix):
    manifest, written, index = read_back(prefix)
    assert manifest["index"]["samples"] == index.counts
    assert written["offsets"].tolist() == index.offsets.tolist()
    assert written["keys"].tolist() == index.keys.tolist()
    assert written["labels"].dtype == np.float32
    assert written["labels"].tolist() == index.labels.astype(np.float32).tolist()
    ranges = written.get("identity_ranges")
    expected = index.identity_ranges
    assert (ranges is None) == (expected is None)
    if ranges is not None:
        assert ranges.tolist() == expected.tolist()


@pytest.fixture
def reads(monkeypatch, tmp_path):
    """Count what is read back of the output (under tmp_path/out) to index it: .idx files,
    and header labels (records). (The sources, without a binary index, are read so.)"""
    seen = {"idx": 0, "labels": 0}
    load_index, header_labels = binindex.load_index, binindex.header_labels
    out = str(tmp_path / "out")

    def counted_load_index(path):
        seen["idx"] += os.fspath(path).startswith(out)
        return load_index(path)

    def counted_header_labels(files, shard_of, offsets, keys):
        if files[0].path.startswith(out):
            seen["labels"] += len(offsets)
        return header_labels(files, shard_of, offsets, keys)

    monkeypatch.setattr(binindex, "load_index", counted_load_index)
    monkeypatch.setattr(binindex, "header_labels", counted_header_labels)
    return seen


# Option sets whose every image gets one scalar label: nothing is read back.
SCALAR = {
    "identity": RepackOptions(),
    "shuffle": RepackOptions(order="shuffle", seed=7),
    "relabel": RepackOptions(min_per_id=4, order="shuffle", seed=2),
    "keep labels": RepackOptions(keep_labels=True, drop_ids="1"),
    "shards by count": RepackOptions(shard_records=4, order="shuffle", seed=1),
    "shards by bytes": RepackOptions(shard_bytes=900),
    "one record a shard": RepackOptions(shard_records=1),
    "insightface": RepackOptions(layout="insightface", min_per_id=2),
    "no check": RepackOptions(check="none", order="shuffle", seed=4),
}


@pytest.mark.parametrize("name", SCALAR)
def test_the_index_handed_over_is_the_one_read_back(tmp_path, reads, name):
    options = SCALAR[name]
    if options.drop_ids:
        (tmp_path / "drop.txt").write_text(f"{options.drop_ids}\n")
        options = RepackOptions(keep_labels=True, drop_ids=str(tmp_path / "drop.txt"))
    source(tmp_path / "src")
    result = repack([tmp_path / "src"], tmp_path / "out" / "r", options)
    assert result.images > 0
    # The identity records of the insightface layout (one a class) are read, no image's.
    identity_records = result.classes if options.layout == "insightface" else 0
    assert reads == {"idx": 0, "labels": identity_records}
    assert_index_is_the_files(tmp_path / "out" / "r")


@pytest.mark.parametrize(
    "vector, options",
    [
        (True, RepackOptions(order="shuffle", seed=3)),  # the images layout keeps vectors
        (False, RepackOptions(layout="insightface", pack_label=True)),
    ],
    ids=["label vectors kept", "pack-label"],
)
def test_label_vectors_are_read_back_from_the_headers(tmp_path, reads, vector, options):
    source(tmp_path / "src", vector=vector)
    result = repack([tmp_path / "src"], tmp_path / "out" / "r", options)
    # Keys and offsets handed over; the images' labels read from their headers.
    assert reads["idx"] == 0 and reads["labels"] >= result.images
    assert_index_is_the_files(tmp_path / "out" / "r")
    _, written, _ = read_back(tmp_path / "out" / "r")
    assert written["labels"].ndim == 2


def test_a_record_framed_again_has_its_labels_read_back(tmp_path, reads):
    # A split record carried as it is (no check) is framed again, its label shape unread.
    source(tmp_path / "src", split=True)
    options = RepackOptions(check="none", order="shuffle", seed=2)
    result = repack([tmp_path / "src"], tmp_path / "out" / "r", options)
    assert result.images == 15
    assert reads == {"idx": 0, "labels": 15}
    assert_index_is_the_files(tmp_path / "out" / "r")


def test_a_split_record_refused_keeps_the_hand_over(tmp_path, reads):
    source(tmp_path / "src", split=True)
    result = repack([tmp_path / "src"], tmp_path / "out" / "r", RepackOptions(order="shuffle"))
    assert (result.images, result.failures) == (14, 1)
    assert reads == {"idx": 0, "labels": 0}
    assert_index_is_the_files(tmp_path / "out" / "r")


def test_a_resumed_repack_reads_its_index_back(tmp_path, reads):
    # The shards a killed run finished are known from their files only: the index is read.
    source(tmp_path / "src")
    options = RepackOptions(shard_records=4, order="shuffle", seed=6)
    repack([tmp_path / "src"], tmp_path / "ref" / "r", options)

    def killed_after_two(info, paths):
        if info.rec.endswith("-00001.rec"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack(
            [tmp_path / "src"], tmp_path / "out" / "r", options, on_shard_finished=killed_after_two
        )
    reads.update(idx=0, labels=0)
    repack([tmp_path / "src"], tmp_path / "out" / "r", options, resume=True)
    assert reads == {"idx": 4, "labels": 14}
    assert_index_is_the_files(tmp_path / "out" / "r")
    for suffix in (".offsets.npy", ".keys.npy", ".labels.npy"):
        assert (tmp_path / "out" / f"r{suffix}").read_bytes() == (
            tmp_path / "ref" / f"r{suffix}"
        ).read_bytes()


def finished_pack(tmp_path):
    source(tmp_path / "src")
    repack([tmp_path / "src"], tmp_path / "out" / "r", RepackOptions(order="shuffle", seed=1))
    path = str(tmp_path / "out" / "r.manifest.json")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    return path, manifest, index_manifest(path, manifest)


def test_a_few_records_of_each_shard_are_still_checked(tmp_path):
    # Offsets handed over that are not where the records start: refused, as a stale .idx is.
    path, manifest, index = finished_pack(tmp_path)
    wrong = Written([index.offsets + 4], index.keys, index.labels)
    with pytest.raises(RecordFormatError, match="stale or belongs to another .rec"):
        index_manifest(path, manifest, wrong)
    # The same arrays as read back give the same index.
    same = index_manifest(path, manifest, Written([index.offsets], index.keys, index.labels))
    assert same.offsets.tolist() == index.offsets.tolist()
    assert same.labels.tolist() == index.labels.tolist()


@pytest.mark.parametrize("what", ["keys", "labels"])
def test_a_hand_over_of_another_length_is_refused(tmp_path, what):
    path, manifest, index = finished_pack(tmp_path)
    keys = index.keys[:-1] if what == "keys" else index.keys
    labels = index.labels[:-1] if what == "labels" else index.labels
    with pytest.raises(RectoolError, match="this is a bug in rectool"):
        index_manifest(path, manifest, Written([index.offsets], keys, labels))


@pytest.mark.parametrize("layout", ["images", "insightface"])
def test_an_output_of_no_image_is_handed_over_too(tmp_path, reads, layout):
    write_pack(tmp_path / "src", [[(0, b"not an image", 0.0), (1, b"nor this", 1.0)]])
    options = RepackOptions(layout=layout, max_failures=1.0)
    result = repack([tmp_path / "src"], tmp_path / "out" / "r", options)
    assert (result.images, result.failures) == (0, 2)
    assert reads["idx"] == 0
    assert_index_is_the_files(tmp_path / "out" / "r")
