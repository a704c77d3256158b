"""`rectool.repack.pipeline`: merging, filtering, relabelling, ordering and converting packs.

Expected values come from the sources as written by hand (helpers/handmade_datasets.py) or from
packing the trees themselves, never from the code under test.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from contextlib import closing

import numpy as np
import pytest
from helpers.handmade_datasets import MAGIC, frame, image_record, write_insightface, write_pack
from helpers.image_files import encode, image_array, jpeg_bytes, write_list, write_pack_tree
from hypothesis import given, settings
from hypothesis import strategies as st

from rectool.dataset.packs import open_dataset
from rectool.errors import RectoolError, UsageError
from rectool.inspect.verify import verify_dataset
from rectool.packer import manifest as manifest_module
from rectool.packer.images import Transform
from rectool.packer.listfile import write_label_map
from rectool.packer.listing import list_images
from rectool.packer.packing import PackOptions, pack_images
from rectool.repack import copier as copier_module
from rectool.repack import pipeline as repack_module
from rectool.repack import run as run_module
from rectool.repack.pipeline import RepackOptions, repack


def pack_tree(tmp_path, name, identities, per_identity=3, first_seed=0, layout="images"):
    """Pack a tree of `identities` folders with a label map; return (prefix, {image: name})."""
    root = tmp_path / f"{name}-tree"
    items = []
    images = {}
    for label, identity in enumerate(identities):
        (root / identity).mkdir(parents=True)
        for n in range(per_identity):
            # Distinct, deterministic images: crc32 of the name (hash() of a str is salted).
            seed = first_seed * 7919 + zlib.crc32(identity.encode()) % 99991 * 10 + n
            data = jpeg_bytes(seed, 20, 16)
            rel = f"{identity}/{n}.jpg"
            (root / rel).write_bytes(data)
            items.append((len(items), label, rel))
            images[data] = identity
    lst = write_list(tmp_path / f"{name}.lst", items)
    write_label_map(tmp_path / f"{name}.labels.tsv", dict(enumerate(identities)))
    prefix = tmp_path / "packs" / name
    pack_images(lst, root, prefix, PackOptions(layout=layout))
    return prefix, images


def samples(prefix):
    with closing(open_dataset(prefix)) as ds:
        return [(bytes(image), float(label)) for image, label in ds]


def sound(prefix):
    report = verify_dataset([str(prefix)])
    return report.sound, [str(p) for p in report.problems][:3]


# -- bytes ----------------------------------------------------------------------------------------


def test_identity_repack_writes_exactly_the_records_dmlc_would(tmp_path):
    images = [jpeg_bytes(k, 12, 10) for k in range(6)]
    # Labels out of order and with a gap: identity order groups them, relabelling closes it.
    labels = [7.0, 3.0, 7.0, 3.0, 9.0, 3.0]
    write_pack(tmp_path / "src", [[(k + 10, images[k], labels[k]) for k in range(6)]])
    repack([tmp_path / "src"], tmp_path / "out", RepackOptions())
    order = [1, 3, 5, 0, 2, 4]  # label 3, then 7, then 9; source order within
    new = {3.0: 0.0, 7.0: 1.0, 9.0: 2.0}
    expected = b"".join(
        frame(image_record(images[k], new[labels[k]], key)) for key, k in enumerate(order)
    )
    assert (tmp_path / "out.rec").read_bytes() == expected
    offsets = np.cumsum([0] + [len(frame(image_record(images[k], 0.0, 0))) for k in order])
    assert (tmp_path / "out.idx").read_text() == "".join(
        f"{key}\t{offsets[key]}\n" for key in range(6)
    )


def test_records_holding_the_magic_word_are_framed_again(tmp_path):
    tricky = [MAGIC * 3 + b"abcd", b"xy" + MAGIC + b"zz", b"abcd" + MAGIC, jpeg_bytes(1)]
    write_pack(tmp_path / "src", [[(k, image, float(k % 2)) for k, image in enumerate(tricky)]])
    repack([tmp_path / "src"], tmp_path / "out", RepackOptions(order="source", check="none"))
    expected = b"".join(
        frame(image_record(image, float(k % 2), k)) for k, image in enumerate(tricky)
    )
    assert (tmp_path / "out.rec").read_bytes() == expected
    assert [image for image, _ in samples(tmp_path / "out")] == tricky


def test_label_vectors_keep_their_width_with_the_first_label_replaced(tmp_path):
    images = [jpeg_bytes(k, 12, 10) for k in range(3)]
    write_pack(tmp_path / "src", [[(k, images[k], [5.0 - k, 0.5]) for k in range(3)]])
    repack([tmp_path / "src"], tmp_path / "out", RepackOptions(order="source", check="none"))
    expected = b"".join(frame(image_record(images[k], [float(2 - k), 0.5], k)) for k in range(3))
    assert (tmp_path / "out.rec").read_bytes() == expected


def test_payloads_are_copied_unchanged_and_output_is_sound(tmp_path):
    a, images = pack_tree(tmp_path, "a", ["ann", "bob", "cyd"], 4)
    result = repack(
        [a], tmp_path / "out" / "x", RepackOptions(order="shuffle", seed=5, check="none")
    )
    assert result.images == 12
    got = samples(tmp_path / "out" / "x")
    assert sorted(image for image, _ in got) == sorted(images)
    assert sound(tmp_path / "out" / "x") == (True, [])


# -- merging --------------------------------------------------------------------------------------


def union_labels(tmp_path, trees):
    """Copy every tree into one, list it with `rectool list` and pack it; return
    {image: label}."""
    union = tmp_path / "union"
    for tree in trees:
        for path in sorted(tree.rglob("*.jpg")):
            target = union / path.parent.name / f"{tree.name}-{path.name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    list_images(union, tmp_path / "union.lst")
    pack_images(tmp_path / "union.lst", union, tmp_path / "union-pack")
    return {image: label for image, label in samples(tmp_path / "union-pack")}


def test_merge_by_offset_equals_packing_the_union_of_the_trees(tmp_path):
    a, _ = pack_tree(tmp_path, "a", ["ann", "bob"], 3)
    b, _ = pack_tree(tmp_path, "b", ["cyd", "dan"], 2, first_seed=7)
    repack([a, b], tmp_path / "ab", RepackOptions(order="source"))
    expected = union_labels(tmp_path, [tmp_path / "a-tree", tmp_path / "b-tree"])
    got = samples(tmp_path / "ab")
    assert len(got) == 10
    assert {image: label for image, label in got} == expected
    assert (tmp_path / "ab.labels.tsv").read_text() == "0\tann\n1\tbob\n2\tcyd\n3\tdan\n"


def test_merge_by_name_unifies_identities_as_the_union_tree(tmp_path):
    a, _ = pack_tree(tmp_path, "a", ["ann", "bob", "dan"], 2)
    b, _ = pack_tree(tmp_path, "b", ["bob", "cyd"], 3, first_seed=50)
    result = repack([a, b], tmp_path / "ab", RepackOptions(labels_by="name"))
    assert result.classes == 4
    expected = union_labels(tmp_path, [tmp_path / "a-tree", tmp_path / "b-tree"])
    assert {image: label for image, label in samples(tmp_path / "ab")} == expected
    assert (tmp_path / "ab.labels.tsv").read_text() == "0\tann\n1\tbob\n2\tcyd\n3\tdan\n"
    manifest = json.loads((tmp_path / "ab.manifest.json").read_text())
    assert manifest["identities"]["file"] == "ab.identities.json"
    names = json.loads((tmp_path / "ab.identities.json").read_text())
    assert names == {"0": "ann", "1": "bob", "2": "cyd", "3": "dan"}
    assert (tmp_path / "ab.relabel.tsv").read_text().splitlines() == [
        "source\tsource_label\tlabel\tidentity",
        f"{a}\t0\t0\tann",
        f"{a}\t1\t1\tbob",
        f"{a}\t2\t3\tdan",
        f"{b}\t0\t1\tbob",
        f"{b}\t1\t2\tcyd",
    ]


def test_names_from_a_label_map_beside_an_im2rec_pack(tmp_path):
    write_pack(tmp_path / "old", [[(0, b"a0", 0.0), (1, b"b0", 1.0)]], manifest=False)
    (tmp_path / "old.labels.tsv").write_text("0\tbob\n1\tann\n")
    write_pack(tmp_path / "new", [[(0, b"a1", 0.0)]])
    (tmp_path / "new.labels.tsv").write_text("0\tann\n")
    os.unlink(tmp_path / "new.manifest.json")
    repack(
        [tmp_path / "old.rec", tmp_path / "new.rec"],
        tmp_path / "m",
        RepackOptions(labels_by="name", order="source", check="none"),
    )
    assert samples(tmp_path / "m") == [(b"a0", 1.0), (b"b0", 0.0), (b"a1", 0.0)]
    assert (tmp_path / "m.labels.tsv").read_text() == "0\tann\n1\tbob\n"


def test_merge_by_name_needs_names(tmp_path):
    write_pack(tmp_path / "src", [[(0, b"x", 0.0)]])
    with pytest.raises(UsageError, match="needs identity names"):
        repack([tmp_path / "src"], tmp_path / "out", RepackOptions(labels_by="name", check="none"))
    assert not list(tmp_path.glob("out*"))


# -- filters and relabelling ---------------------------------------------------------------------


def counted_pack(tmp_path, counts):
    """A hand-written pack: identity j has counts[j] images; return the images by label."""
    items, by_label = [], {}
    for label, count in enumerate(counts):
        for n in range(count):
            image = jpeg_bytes(1000 * label + n, 8, 8)
            items.append((len(items), image, float(label)))
            by_label.setdefault(label, []).append(image)
    write_pack(tmp_path / "src", [items])
    return by_label


def test_min_and_max_per_identity_then_contiguous_labels(tmp_path):
    by_label = counted_pack(tmp_path, [1, 4, 2, 5])
    result = repack([tmp_path / "src"], tmp_path / "out", RepackOptions(min_per_id=2, max_per_id=3))
    assert samples(tmp_path / "out") == [
        (by_label[1][0], 0.0),
        (by_label[1][1], 0.0),
        (by_label[1][2], 0.0),
        (by_label[2][0], 1.0),
        (by_label[2][1], 1.0),
        (by_label[3][0], 2.0),
        (by_label[3][1], 2.0),
        (by_label[3][2], 2.0),
    ]
    assert result.report["steps"]["min_per_id"] == 1
    assert result.report["steps"]["max_per_id"] == 3
    assert (tmp_path / "out.relabel.tsv").read_text().splitlines()[1:] == [
        f"{tmp_path / 'src'}\t1\t0\t",
        f"{tmp_path / 'src'}\t2\t1\t",
        f"{tmp_path / 'src'}\t3\t2\t",
    ]


def test_max_per_id_random_pick_is_seeded(tmp_path):
    counted_pack(tmp_path, [6, 6])

    def pick(seed, name):
        options = RepackOptions(max_per_id=2, pick="random", seed=seed)
        repack([tmp_path / "src"], tmp_path / name, options)
        return samples(tmp_path / name)

    first = pick(1, "a")
    assert pick(1, "b") == first
    assert any(pick(seed, f"s{seed}") != first for seed in range(2, 6))
    assert [label for _, label in first] == [0.0, 0.0, 1.0, 1.0]


def test_keep_labels_leaves_gaps(tmp_path):
    counted_pack(tmp_path, [1, 2, 2])
    repack([tmp_path / "src"], tmp_path / "out", RepackOptions(min_per_id=2, keep_labels=True))
    assert [label for _, label in samples(tmp_path / "out")] == [1.0, 1.0, 2.0, 2.0]


def test_keep_and_drop_ids_by_name_or_label(tmp_path):
    a, images = pack_tree(tmp_path, "a", ["ann", "bob", "cyd", "dan"], 2)
    (tmp_path / "keep.txt").write_text("bob\n# a comment\n\n3\n")
    repack([a], tmp_path / "kept", RepackOptions(keep_ids=str(tmp_path / "keep.txt")))
    got = samples(tmp_path / "kept")
    assert [images[image] for image, _ in got] == ["bob", "bob", "dan", "dan"]
    assert [label for _, label in got] == [0.0, 0.0, 1.0, 1.0]
    assert (tmp_path / "kept.labels.tsv").read_text() == "0\tbob\n1\tdan\n"
    (tmp_path / "drop.txt").write_text("ann\n")
    repack([a], tmp_path / "dropped", RepackOptions(drop_ids=str(tmp_path / "drop.txt")))
    assert sorted({images[i] for i, _ in samples(tmp_path / "dropped")}) == ["bob", "cyd", "dan"]


def test_unknown_identities_are_an_error_before_anything_is_written(tmp_path):
    a, _ = pack_tree(tmp_path, "a", ["ann", "bob"], 2)
    (tmp_path / "keep.txt").write_text("bob\neve\n7\n")
    with pytest.raises(RectoolError, match=r"keep.txt: 2 unknown identities: line 2: 'eve'"):
        repack([a], tmp_path / "out" / "x", RepackOptions(keep_ids=str(tmp_path / "keep.txt")))
    assert not (tmp_path / "out").exists()


def test_sample_identities_and_images_are_seeded_and_sized(tmp_path):
    counted_pack(tmp_path, [2] * 10)
    one = repack([tmp_path / "src"], tmp_path / "i1", RepackOptions(sample=0.3, seed=4))
    again = repack([tmp_path / "src"], tmp_path / "i2", RepackOptions(sample=0.3, seed=4))
    assert one.classes == again.classes == 3 and one.images == 6
    assert samples(tmp_path / "i1") == samples(tmp_path / "i2")
    images = repack(
        [tmp_path / "src"], tmp_path / "m", RepackOptions(sample=0.25, sample_by="images")
    )
    assert images.images == 5


def test_shuffle_is_a_seeded_permutation(tmp_path):
    counted_pack(tmp_path, [5, 5, 5])
    repack([tmp_path / "src"], tmp_path / "s1", RepackOptions(order="shuffle", seed=1))
    repack([tmp_path / "src"], tmp_path / "s2", RepackOptions(order="shuffle", seed=1))
    repack([tmp_path / "src"], tmp_path / "s3", RepackOptions(order="shuffle", seed=2))
    ordered = samples(tmp_path / "src")
    first = samples(tmp_path / "s1")
    assert (tmp_path / "s1.rec").read_bytes() == (tmp_path / "s2.rec").read_bytes()
    assert first != ordered and sorted(first) == sorted(ordered)
    assert samples(tmp_path / "s3") != first


@pytest.mark.parametrize("order", ["identity", "shuffle"])
def test_letting_go_of_the_source_mappings_mid_copy_changes_no_byte(tmp_path, monkeypatch, order):
    # Two source shards and a record holding the magic word (framed again).
    images = [jpeg_bytes(k, 12, 10) for k in range(14)] + [MAGIC * 2 + b"abcd"]
    write_pack(
        tmp_path / "src",
        [
            [(k, images[k], float(k % 4)) for k in range(8)],
            [(k, images[k], float(k % 3)) for k in range(8, 15)],
        ],
    )
    options = RepackOptions(order=order, seed=5)
    repack([tmp_path / "src"], tmp_path / "kept", options)
    monkeypatch.setattr(run_module, "BATCH_RECORDS", 3)
    monkeypatch.setattr(copier_module, "RELEASE_BYTES", 1)  # after every window
    monkeypatch.setattr(copier_module, "SHUFFLE_RELEASE_BYTES", 1)
    released = []
    monkeypatch.setattr(
        copier_module.RecordCopier, "_release_if_due", counting(released, "_release_if_due")
    )
    repack([tmp_path / "src"], tmp_path / "released", options)
    assert len([mapped for mapped in released if mapped >= 1]) >= 3  # let go, then mapped again
    for suffix in (".rec", ".idx", ".rec.crc"):
        kept = (tmp_path / f"kept{suffix}").read_bytes()
        assert (tmp_path / f"released{suffix}").read_bytes() == kept, suffix


def test_records_kept_as_they_lie_are_handed_over_in_large_views(tmp_path, monkeypatch):
    # Keys 0..9 in identity order, labels already 0..2: the output repeats the source's bytes,
    # but for record 6 (source key 60, written as key 6).
    images = [jpeg_bytes(k, 12, 10) for k in range(10)]
    labels = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    keys = [60 if k == 6 else k for k in range(10)]
    write_pack(tmp_path / "src", [[(keys[k], images[k], labels[k]) for k in range(10)]])
    monkeypatch.setattr(copier_module, "BATCH_BYTES", 64)  # a copy: one record at a time
    calls = []
    add_run = run_module.ShardWriter.add_run

    def recording(self, data, keys, starts, positions):
        # A view of the read-only source mapping, or a copy (a batch buffer, writable).
        view = isinstance(data, memoryview) and data.readonly
        calls.append(("view" if view else "copy", len(starts)))
        return add_run(self, data, keys, starts, positions)

    monkeypatch.setattr(run_module.ShardWriter, "add_run", recording)
    repack([tmp_path / "src"], tmp_path / "out", RepackOptions())
    expected = b"".join(frame(image_record(images[k], labels[k], k)) for k in range(10))
    assert (tmp_path / "out.rec").read_bytes() == expected
    # Records 0-5 and 7-9 lie as they are written: two views; record 6 is copied and patched.
    assert calls == [("view", 6), ("copy", 1), ("view", 3)]


def counting(calls, name):
    """Return a method that records each call, then runs `RecordCopier.<name>`."""
    original = getattr(copier_module.RecordCopier, name)

    def method(self, *args):
        calls.append(self._mapped)
        return original(self, *args)

    return method


# -- layouts -------------------------------------------------------------------------------------


def test_insightface_source_to_images_layout_has_only_images(tmp_path):
    folder = tmp_path / "faces_emore"
    folder.mkdir()
    images = {k: jpeg_bytes(k, 16, 14) for k in range(1, 8)}
    write_insightface(folder / "train.rec", folder / "train.idx", [3, 0, 4], images.get)
    (folder / "property").write_text("3,16,14\n")
    result = repack([folder], tmp_path / "out", RepackOptions())
    got = samples(tmp_path / "out")
    # The empty identity 1 is gone: labels 0, 2 become 0, 1.
    assert got == [(images[k], 0.0) for k in (1, 2, 3)] + [(images[k], 1.0) for k in (4, 5, 6, 7)]
    assert result.classes == 2
    with closing(open_dataset(tmp_path / "out")) as ds:
        assert ds.layout == "images" and len(ds) == 7
        assert ds.keys.tolist() == list(range(7))


def test_images_to_insightface_layout_with_property(tmp_path):
    a, images = pack_tree(tmp_path, "a", ["ann", "bob", "cyd"], 3)
    (tmp_path / "drop.txt").write_text("bob\n")
    options = RepackOptions(layout="insightface", drop_ids=str(tmp_path / "drop.txt"))
    repack([a], tmp_path / "ins" / "train", options)
    with closing(open_dataset(tmp_path / "ins" / "train")) as ds:
        assert ds.layout == "insightface"
        assert ds.identity_ranges.tolist() == [[0, 3], [3, 6]]
        assert [images[bytes(i)] for i, _ in ds] == ["ann"] * 3 + ["cyd"] * 3
        assert ds.keys.tolist() == list(range(1, 7))
    assert (tmp_path / "ins" / "property").read_text() == "2,20,16\n"
    assert sound(tmp_path / "ins" / "train") == (True, [])


def test_insightface_layout_needs_identity_order(tmp_path):
    counted_pack(tmp_path, [1])
    with pytest.raises(UsageError, match="needs --order identity"):
        repack(
            [tmp_path / "src"], tmp_path / "o", RepackOptions(layout="insightface", order="shuffle")
        )


def test_insightface_key_limit_is_checked_before_writing(tmp_path, monkeypatch):
    counted_pack(tmp_path, [3, 3])
    import rectool.packer.layout

    monkeypatch.setattr(rectool.packer.layout, "FLOAT32_EXACT", 8)
    with pytest.raises(RectoolError, match="6 images \\+ 2 identities need 9"):
        repack([tmp_path / "src"], tmp_path / "o" / "train", RepackOptions(layout="insightface"))
    assert not (tmp_path / "o").exists()


def test_shards_by_records_and_by_size(tmp_path):
    counted_pack(tmp_path, [4, 4, 3])
    repack([tmp_path / "src"], tmp_path / "r", RepackOptions(shard_records=4))
    with closing(open_dataset(tmp_path / "r")) as ds:
        assert len(ds.shards) == 3 and len(ds) == 11
    repack([tmp_path / "src"], tmp_path / "b", RepackOptions(shard_bytes=200))
    with closing(open_dataset(tmp_path / "b")) as ds:
        assert len(ds.shards) > 1
    assert samples(tmp_path / "r") == samples(tmp_path / "b") == samples(tmp_path / "src")
    # Resharding changes no header here (keys 0..10, labels in order): the same record bytes.
    resharded = b"".join(p.read_bytes() for p in sorted(tmp_path.glob("r-*.rec")))
    assert resharded == (tmp_path / "src.rec").read_bytes()
    assert sound(tmp_path / "r") == sound(tmp_path / "b") == (True, [])


# -- duplicates and overlap ----------------------------------------------------------------------


def test_dedupe_keeps_the_first_copy_and_reports_shared_images(tmp_path):
    x, y, z = b"same-x", b"same-y", b"unique"
    write_pack(
        tmp_path / "src",
        [[(0, x, 0.0), (1, x, 0.0), (2, z, 0.0), (3, x, 0.0), (4, y, 1.0), (5, y, 2.0)]],
    )
    result = repack([tmp_path / "src"], tmp_path / "out", RepackOptions(dedupe=True, check="none"))
    assert samples(tmp_path / "out") == [(x, 0.0), (z, 0.0), (y, 1.0), (y, 2.0)]
    lines = [json.loads(line) for line in open(tmp_path / "out.failures.jsonl")]
    assert [(e["key"], e["reason"], e["detail"]) for e in lines] == [
        (1, "duplicate", f"byte-identical to key 0 of {tmp_path / 'src'}, kept"),
        (3, "duplicate", f"byte-identical to key 0 of {tmp_path / 'src'}, kept"),
    ]
    report = json.loads((tmp_path / "out.report.json").read_text())
    assert report["removed_per_identity"] == {"0": {"duplicate": 2, "overlap": 0}}
    assert report["shared_across_identities"]["groups"] == 1
    assert [e["key"] for e in report["shared_across_identities"]["first_groups"][0]] == [4, 5]
    assert result.accepted


def test_drop_overlap_removes_images_of_an_evaluation_set(tmp_path):
    shared = [jpeg_bytes(k, 12, 10) for k in range(3)]
    write_pack(
        tmp_path / "src", [[(k, shared[k % 3] + b"%d" % (k // 3), float(k % 2)) for k in range(6)]]
    )
    write_pack(tmp_path / "eval", [[(40, shared[1] + b"1", 0.0), (41, shared[2] + b"0", 0.0)]])
    result = repack(
        [tmp_path / "src"],
        tmp_path / "out",
        RepackOptions(drop_overlap=(str(tmp_path / "eval"),), check="none"),
    )
    assert result.images == 4
    lines = [json.loads(line) for line in open(tmp_path / "out.failures.jsonl")]
    assert [(e["key"], e["reason"], e["detail"]) for e in lines] == [
        (2, "overlap", f"byte-identical to key 41 of {tmp_path / 'eval'}"),
        (4, "overlap", f"byte-identical to key 40 of {tmp_path / 'eval'}"),
    ]
    assert result.report["removed_per_identity"] == {
        "0": {"duplicate": 0, "overlap": 2},
    }


# -- re-encoding, determinism, resume -------------------------------------------------------------


def test_reencode_resizes_and_does_not_depend_on_workers(tmp_path):
    a, _ = pack_tree(tmp_path, "a", ["ann", "bob"], 5)
    for workers in (1, 3):
        options = RepackOptions(transform=Transform(resize=8), workers=workers, order="shuffle")
        repack([a], tmp_path / f"w{workers}", options)
    assert (tmp_path / "w1.rec").read_bytes() == (tmp_path / "w3.rec").read_bytes()
    with closing(open_dataset(tmp_path / "w1", decode="bgr")) as ds:
        assert {image.shape for image, _ in ds} == {(10, 8, 3)}


def test_reencode_refusals_are_listed_and_counted(tmp_path):
    good = jpeg_bytes(3, 12, 10)
    write_pack(tmp_path / "src", [[(0, good, 0.0), (1, b"not an image", 0.0), (2, good, 1.0)]])
    options = RepackOptions(transform=Transform(quality=80), layout="insightface")
    result = repack([tmp_path / "src"], tmp_path / "o" / "train", options)
    assert result.images == 2 and not result.accepted
    (line,) = [json.loads(x) for x in open(tmp_path / "o" / "train.failures.jsonl")]
    assert (line["stage"], line["key"], line["position"]) == ("write", 1, 1)
    with closing(open_dataset(tmp_path / "o" / "train")) as ds:
        assert ds.identity_ranges.tolist() == [[0, 1], [1, 2]]


def test_output_exists_needs_overwrite_and_resume_of_a_complete_pack_is_a_no_op(tmp_path):
    counted_pack(tmp_path, [2, 2])
    repack([tmp_path / "src"], tmp_path / "out")
    before = (tmp_path / "out.rec").read_bytes()
    with pytest.raises(
        RectoolError,
        match=r"a complete pack is already here .*; use --overwrite to replace it, or --resume",
    ):
        repack([tmp_path / "src"], tmp_path / "out")
    again = repack([tmp_path / "src"], tmp_path / "out", resume=True)
    assert again.images == 4 and (tmp_path / "out.rec").read_bytes() == before
    repack([tmp_path / "src"], tmp_path / "out", RepackOptions(min_per_id=3), overwrite=True)
    assert samples(tmp_path / "out") == []


KILL_AT = """
import os, signal, sys
from rectool.repack import pipeline as m, run
from rectool.packer.images import Transform
run.BATCH_RECORDS = 7
run.REENCODE_CHUNK = 5
sources, prefix, kill_at, layout, reencode = sys.argv[1:-4], sys.argv[-4], int(sys.argv[-3]), \
    sys.argv[-2], sys.argv[-1] == "1"
def progress(done, total, refused):
    if done >= kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
options = m.RepackOptions(order="shuffle" if layout == "images" else "identity", seed=3,
                          check="none", layout=layout,
                          shard_records=10 if layout == "images" else None,
                          transform=Transform(quality=70) if reencode else None, workers=2,
                          max_failures=100)
m.repack(sources, prefix, options, resume=os.path.exists(prefix + ".pack-state.json"),
         progress=progress)
"""


@pytest.mark.parametrize(
    "layout, reencode", [("images", False), ("insightface", False), ("images", True)]
)
def test_resume_after_kill_9_gives_the_same_bytes(tmp_path, layout, reencode):
    items = [
        (k, b"broken" if k % 9 == 4 else jpeg_bytes(k, 12, 10), float(k % 5)) for k in range(60)
    ]
    write_pack(tmp_path / "src", [items])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    reference = tmp_path / "ref" / "train"
    base = [sys.executable, "-c", KILL_AT, str(tmp_path / "src")]
    layout_args = [layout, "1" if reencode else "0"]
    done = subprocess.run([*base, str(reference), "1000", *layout_args], env=env)
    assert done.returncode == 0
    prefix = tmp_path / "run" / "train"
    for kill_at in (8, 22, 23, 41, 1000):
        proc = subprocess.run([*base, str(prefix), str(kill_at), *layout_args], env=env)
        assert proc.returncode == (0 if kill_at == 1000 else -9)
    names = sorted(p.name for p in reference.parent.iterdir())
    assert sorted(p.name for p in prefix.parent.iterdir()) == names
    for name in names:
        if name.endswith((".json", ".jsonl", ".tsv")):
            continue  # they name the output folder
        assert (prefix.parent / name).read_bytes() == (reference.parent / name).read_bytes(), name
    report = json.loads((prefix.parent / "train.report.json").read_text())
    assert report["images"] == (53 if reencode else 60)


def test_out_prefix_over_a_source_is_refused_even_with_overwrite(tmp_path):
    counted_pack(tmp_path, [2])
    before = (tmp_path / "src.rec").read_bytes()
    with pytest.raises(UsageError, match="would write over .*src.rec, a file of source"):
        repack([tmp_path / "src"], tmp_path / "src", overwrite=True)
    assert (tmp_path / "src.rec").read_bytes() == before


def test_resume_after_a_kill_just_before_the_manifest(tmp_path, monkeypatch):
    good = jpeg_bytes(3, 12, 10)
    write_pack(tmp_path / "src", [[(0, good, 0.0), (1, b"not an image", 0.0), (2, good, 1.0)]])
    options = RepackOptions(transform=Transform(quality=80), layout="insightface")
    reference = repack([tmp_path / "src"], tmp_path / "ref" / "train", options)
    real = manifest_module.write_json_atomic

    def killed_before_manifest(path, document):
        if str(path).endswith(".manifest.json"):
            raise KeyboardInterrupt
        return real(path, document)

    monkeypatch.setattr(manifest_module, "write_json_atomic", killed_before_manifest)
    with pytest.raises(KeyboardInterrupt):
        repack([tmp_path / "src"], tmp_path / "run" / "train", options)
    monkeypatch.setattr(manifest_module, "write_json_atomic", real)
    resumed = repack([tmp_path / "src"], tmp_path / "run" / "train", options, resume=True)
    assert (resumed.images, resumed.failures) == (reference.images, reference.failures) == (2, 1)
    index = ("train.offsets.npy", "train.keys.npy", "train.labels.npy")
    index += ("train.identity_ranges.npy",)  # the binary index, written before the manifest
    for name in ("train.rec", "train.idx", "train.failures.jsonl", "property", *index):
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()


def test_resume_with_other_options_is_refused(tmp_path, monkeypatch):
    counted_pack(tmp_path, [2, 2])
    real = manifest_module.write_json_atomic

    def killed_before_manifest(path, document):
        if str(path).endswith(".manifest.json"):
            raise KeyboardInterrupt
        return real(path, document)

    monkeypatch.setattr(manifest_module, "write_json_atomic", killed_before_manifest)
    with pytest.raises(KeyboardInterrupt):
        repack([tmp_path / "src"], tmp_path / "out", RepackOptions(seed=1))
    monkeypatch.setattr(manifest_module, "write_json_atomic", real)
    with pytest.raises(
        RectoolError, match="cannot resume: the interrupted repack used different options"
    ):
        repack([tmp_path / "src"], tmp_path / "out", RepackOptions(seed=2), resume=True)


def test_a_source_that_does_not_open_is_named(tmp_path):
    counted_pack(tmp_path, [1])
    with pytest.raises(RectoolError, match="source .*nowhere: .*no dataset here"):
        repack([tmp_path / "src", tmp_path / "nowhere"], tmp_path / "out")
    assert not list(tmp_path.glob("out*"))


def test_labels_that_are_not_class_ids_are_refused(tmp_path):
    write_pack(tmp_path / "src", [[(0, b"a", 0.0), (1, b"b", 2.5)]])
    with pytest.raises(RectoolError, match=r"src.rec: record key 1 at byte \d+: label 2.5"):
        repack([tmp_path / "src"], tmp_path / "out")


def test_plan_state_is_numpy_arrays(tmp_path):
    """Memory stays flat: the per-record state is arrays, not Python objects per record."""
    counted_pack(tmp_path, [3, 3])
    sources = [repack_module.Source(tmp_path / "src")]
    catalog = repack_module.build_catalog(sources)
    plan = repack_module.plan_repack(sources, catalog, RepackOptions())
    for array in (catalog.source, catalog.sample, catalog.label, plan.rows, plan.new_label):
        assert isinstance(array, np.ndarray) and array.dtype != object


def test_png_and_odd_payloads_pass_through_unchanged_with_check_none(tmp_path):
    png = encode(image_array(3, 9, 7), ".png")
    odd = b"\x00" * 5 + struct.pack("<I", 0xCED7230A) + b"\x01" * 3  # unaligned magic
    write_pack(tmp_path / "src", [[(0, png, 0.0), (1, odd, 1.0)]])
    repack([tmp_path / "src"], tmp_path / "out", RepackOptions(check="none"))
    assert samples(tmp_path / "out") == [(png, 0.0), (odd, 1.0)]


def test_write_pack_tree_helper_still_matches(tmp_path):
    # The pack of a tree and its repack in identity order hold the same samples.
    items = write_pack_tree(tmp_path / "t", ["a", "b"], 3)
    lst = write_list(tmp_path / "t.lst", items)
    pack_images(lst, tmp_path / "t", tmp_path / "p")
    repack([tmp_path / "p"], tmp_path / "q")
    assert samples(tmp_path / "q") == samples(tmp_path / "p")


@settings(max_examples=25, deadline=None)
@given(
    labels=st.lists(st.integers(0, 5), min_size=1, max_size=30),
    min_per_id=st.one_of(st.none(), st.integers(1, 4)),
    max_per_id=st.one_of(st.none(), st.integers(1, 4)),
)
def test_filters_and_relabelling_match_a_plain_python_rule(
    tmp_path_factory, labels, min_per_id, max_per_id
):
    tmp_path = tmp_path_factory.mktemp("prop")
    items = [(k, b"image %d" % k, float(label)) for k, label in enumerate(labels)]
    write_pack(tmp_path / "src", [items])
    options = RepackOptions(min_per_id=min_per_id, max_per_id=max_per_id, check="none")
    repack([tmp_path / "src"], tmp_path / "out", options)
    counts = {label: labels.count(label) for label in labels}
    kept, taken = [], {}
    for _, image, label in items:
        if min_per_id and counts[label] < min_per_id:
            continue
        if max_per_id and taken.get(label, 0) >= max_per_id:
            continue
        taken[label] = taken.get(label, 0) + 1
        kept.append((image, label))
    new = {label: n for n, label in enumerate(sorted({label for _, label in kept}))}
    expected = sorted(((image, float(new[label])) for image, label in kept), key=lambda s: s[1])
    assert samples(tmp_path / "out") == expected


@pytest.mark.parametrize("order, budget", [("identity", 1), ("shuffle", 1 << 40)])
def test_a_shuffle_keeps_its_scattered_pages_mapped_longer(tmp_path, monkeypatch, order, budget):
    # A shuffle's windows touch blocks all over the source: it lets them go by its own, larger
    # budget (SHUFFLE_RELEASE_BYTES), an identity-order copy by RELEASE_BYTES.
    write_pack(tmp_path / "src", [[(k, jpeg_bytes(k, 12, 10), float(k % 3)) for k in range(12)]])
    monkeypatch.setattr(run_module, "BATCH_RECORDS", 3)
    monkeypatch.setattr(copier_module, "RELEASE_BYTES", 1)
    monkeypatch.setattr(copier_module, "SHUFFLE_RELEASE_BYTES", 1 << 40)
    budgets, let_go = [], []
    real_init, real_let_go = copier_module.RecordCopier.__init__, copier_module.RecordCopier._let_go

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        budgets.append(self.release_bytes)

    def counted_let_go(self):
        let_go.append(1)
        real_let_go(self)

    monkeypatch.setattr(copier_module.RecordCopier, "__init__", init)
    monkeypatch.setattr(copier_module.RecordCopier, "_let_go", counted_let_go)
    repack([tmp_path / "src"], tmp_path / "out", RepackOptions(order=order, seed=1))
    assert budgets == [budget]
    assert (len(let_go) >= 2) == (order == "identity")  # windows let go; a shuffle's never here
