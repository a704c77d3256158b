"""`repack --layout insightface [--pack-label]` converts between the two label shapes of the
insightface layout: a scalar identity an image (faces_emore, ms1m) and a float32 vector,
identity first (Glint360K, WebFace42M).

The output is compared byte for byte (`.rec`, `.idx`, the binary index, `property`) with what
`rectool pack` writes for the same images in the same order, and read under the real MXNet
by arcface_torch's `MXFaceDataset` and insightface's `unpack_glint360k.py` logic.
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import closing

import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import (
    MAGIC,
    frame,
    image_record,
    images,
    write_manifest,
    write_shard,
)
from helpers.image_files import write_list, write_pack_tree
from helpers.mxnet_oracle import MX_FACE_DATASET, UNPACK_GLINT360K, run_mxnet

from rectool.cli import cli
from rectool.dataset.packs import open_dataset
from rectool.errors import RectoolError
from rectool.inspect.verify import verify_dataset
from rectool.repack import run as repack_run
from rectool.repack.pipeline import RepackOptions, repack

NAMES = ["ann", "bob", "cid"]
PER_IDENTITY = 3
# What a pack of each shape is: its list's labels (from identity c and image number n) and
# whether it is packed with --pack-label.
SHAPES = {
    "scalar": (lambda c, n: c, False),
    "vector": (lambda c, n: [c, 0.25 * n], True),
    "vector-of-one": (lambda c, n: [c], True),
}
# What a repack of a source of each shape writes, by --pack-label: the shape pack writes.
CONVERTED = {
    ("scalar", False): "scalar",
    ("scalar", True): "vector-of-one",  # a scalar becomes the identity alone
    ("vector", False): "scalar",  # a vector keeps its identity
    ("vector", True): "vector",  # and its other labels
    ("vector-of-one", False): "scalar",
    ("vector-of-one", True): "vector-of-one",
}
INDEX = ("offsets", "keys", "labels", "identity_ranges")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def tree(tmp_path, payloads=None):
    """Write NAMES x PER_IDENTITY images under tmp_path/tree (JPEGs, or `payloads(i)`);
    return (root, [(index, identity, relpath)])."""
    root = tmp_path / "tree"
    items = write_pack_tree(root, NAMES, PER_IDENTITY)
    if payloads is not None:
        for i, _, rel in items:
            (root / rel).write_bytes(payloads(i))
    return root, items


def pack(tmp_path, root, items, shape, *extra, name=None):
    """Pack the tree in the insightface layout, labels of `shape` (list lines reversed: the
    layout groups them by identity); return the prefix."""
    labels_of, pack_label = SHAPES[shape]
    name = name or shape
    lines = [(i, labels_of(c, i % PER_IDENTITY), rel) for i, c, rel in items]
    lst = write_list(tmp_path / f"{name}.lst", lines[::-1])
    prefix = tmp_path / name / "train"
    args = ["pack", lst, root, prefix, "--layout", "insightface", "--quiet", *extra]
    result = run(*args, *(["--pack-label"] if pack_label else []))
    assert result.exit_code == 0, result.output
    return prefix


def files(prefix):
    """Return {name: bytes} of what decides a pack's records: .rec, .idx, the binary index
    and `property`."""
    names = [".rec", ".idx", *(f".{array}.npy" for array in INDEX)]
    out = {suffix: prefix.parent.joinpath(prefix.name + suffix).read_bytes() for suffix in names}
    out["property"] = (prefix.parent / "property").read_bytes()
    return out


def repack_cli(source, prefix, pack_label, *extra):
    args = ["repack", source, prefix, "--layout", "insightface", "--quiet", *extra]
    result = run(*args, *(["--pack-label"] if pack_label else []))
    assert result.exit_code == 0, result.output
    return prefix


def paths(prefix):
    return {"rec": f"{prefix}.rec", "idx": f"{prefix}.idx"}


@pytest.mark.parametrize(
    "source, pack_label", list(CONVERTED), ids=[f"{s}-to-{CONVERTED[s, p]}" for s, p in CONVERTED]
)
def test_repack_writes_the_bytes_pack_writes_in_that_shape(tmp_path, source, pack_label):
    root, items = tree(tmp_path)
    packed = pack(tmp_path, root, items, source)
    expected = pack(tmp_path, root, items, CONVERTED[source, pack_label], name="expected")
    out = repack_cli(packed, tmp_path / "out" / "train", pack_label)
    assert files(out) == files(expected)
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert (manifest["layout"], manifest["options"]["pack_label"]) == ("insightface", pack_label)
    assert verify_dataset(str(out.with_suffix(".manifest.json"))).problems == []


@pytest.mark.parametrize("source, pack_label", [("scalar", True), ("vector", False)])
def test_records_split_at_the_magic_word_convert_as_pack_frames_them(tmp_path, source, pack_label):
    # Payloads holding the dmlc magic word at aligned offsets, so that each record is split
    # in parts: the copier cannot patch those in place; it frames them again, as pack does.
    root, items = tree(tmp_path, lambda i: b"img!" + MAGIC + b"\xff" * 4 * i + MAGIC + b"!" * i)
    none = ("--check", "none")
    packed = pack(tmp_path, root, items, source, *none)
    expected = pack(tmp_path, root, items, CONVERTED[source, pack_label], *none, name="expected")
    first_part = int.from_bytes(packed.with_suffix(".rec").read_bytes()[4:8], "little")
    assert first_part >> 29 == 1  # the first part of a split record, as dmlc splits it
    out = repack_cli(packed, tmp_path / "out" / "train", pack_label, *none)
    assert files(out) == files(expected)


@pytest.mark.parametrize("source, pack_label", [("scalar", True), ("vector", False)])
def test_reencoding_writes_the_shape_asked(tmp_path, source, pack_label):
    # Re-encoded images are framed by the worker threads' consumer, not by the copier.
    root, items = tree(tmp_path)
    packed = pack(tmp_path, root, items, source)
    resize = ("--resize", "16")
    expected = pack(tmp_path, root, items, CONVERTED[source, pack_label], *resize, name="expected")
    out = repack_cli(packed, tmp_path / "out" / "train", pack_label, *resize, "--workers", "2")
    assert files(out) == files(expected)


@pytest.mark.oracle
def test_mxnet_reads_a_scalar_pack_repacked_to_label_vectors(tmp_path):
    root, items = tree(tmp_path)
    out = repack_cli(pack(tmp_path, root, items, "scalar"), tmp_path / "out" / "train", True)
    with closing(open_dataset(out)) as ds:
        expected = [(k, image, int(label[0])) for k, (image, label) in enumerate(ds, 1)]
    assert [label for _, _, label in expected] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    samples, ranges = run_mxnet(MX_FACE_DATASET, paths(out))
    assert samples == [(k, image, float(c)) for k, image, c in expected]
    assert ranges == [[0, 3], [3, 6], [6, 9]]
    # insightface's unpack_glint360k.py reads `label[0]` of each image: the vector shape.
    assert run_mxnet(UNPACK_GLINT360K, paths(out)) == [(k, c, image) for k, image, c in expected]


@pytest.mark.oracle
def test_mxface_dataset_reads_a_vector_pack_repacked_to_scalars(tmp_path):
    root, items = tree(tmp_path)
    out = repack_cli(pack(tmp_path, root, items, "vector"), tmp_path / "out" / "train", False)
    with closing(open_dataset(out)) as ds:
        assert ds.labels.ndim == 1
        expected = [(k, image, float(label)) for k, (image, label) in enumerate(ds, 1)]
    samples, ranges = run_mxnet(MX_FACE_DATASET, paths(out))
    assert samples == expected and ranges == [[0, 3], [3, 6], [6, 9]]


def test_the_images_layout_keeps_each_records_label_vector(tmp_path):
    # As before --pack-label came to repack: a vector source's images keep their vectors.
    root, items = tree(tmp_path)
    packed = pack(tmp_path, root, items, "vector")
    result = run("repack", packed, tmp_path / "out" / "train", "--quiet")
    assert result.exit_code == 0, result.output
    with closing(open_dataset(packed)) as ds:
        labels = ds.labels.tolist()
    assert len({label[1] for label in labels}) == 3
    with closing(open_dataset(tmp_path / "out" / "train")) as ds:
        assert (ds.layout, ds.labels.tolist()) == ("images", labels)


def test_pack_label_without_the_insightface_layout_is_a_usage_error(tmp_path):
    root, items = tree(tmp_path)
    packed = pack(tmp_path, root, items, "scalar")
    result = run("repack", packed, tmp_path / "out" / "train", "--pack-label")
    assert result.exit_code == 2
    assert result.output.endswith(
        "Error: --pack-label chooses the label shape of --layout insightface; the images "
        "layout keeps each record's labels as its source holds them\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "layout_args, written",
    [
        (("--layout", "insightface", "--pack-label"), "a vector of one label"),
        ((), "one scalar label"),  # the images layout keeps each source's shape
    ],
    ids=["insightface-vectors", "images"],
)
def test_sources_written_with_different_label_widths_are_refused_before_writing(
    tmp_path, layout_args, written
):
    # A pack's labels have one width; a merge that would mix them is refused up front
    # (the images layout used to write the records, then fail on the binary index).
    root, items = tree(tmp_path)
    scalar = pack(tmp_path, root, items, "scalar")
    vector = pack(tmp_path, root, items, "vector")
    result = run("repack", scalar, vector, tmp_path / "out" / "train", *layout_args)
    assert result.exit_code == 2, result.output
    assert (
        f"Error: sources {scalar} and {vector} would be written with labels of different "
        f"widths ({written} and a vector of 2 labels an image); a pack's labels have one "
        "width: repack them apart, or write one scalar label an image (--layout insightface "
        "without --pack-label)\n"
    ) in result.output
    assert not (tmp_path / "out").exists()


def test_sources_of_both_shapes_merge_into_scalars(tmp_path):
    root, items = tree(tmp_path)
    scalar = pack(tmp_path, root, items, "scalar")
    vector = pack(tmp_path, root, items, "vector")
    out = tmp_path / "out" / "train"
    result = run("repack", scalar, vector, out, "--layout", "insightface", "--quiet")
    assert result.exit_code == 0, result.output
    with closing(open_dataset(out)) as ds:
        assert ds.labels.tolist() == [c for c in range(6) for _ in range(PER_IDENTITY)]


def test_resume_continues_a_conversion_and_refuses_the_other_shape(tmp_path, monkeypatch):
    root, items = tree(tmp_path)
    packed = pack(tmp_path, root, items, "scalar")
    options = RepackOptions(layout="insightface", pack_label=True)
    reference = tmp_path / "ref" / "train"
    repack([packed], reference, options)
    monkeypatch.setattr(repack_run, "BATCH_RECORDS", 4)  # progress after each 4 records

    def interrupted(done, total, refused):
        if 4 <= done < total:
            raise KeyboardInterrupt

    out = tmp_path / "out" / "train"
    with pytest.raises(KeyboardInterrupt):
        repack([packed], out, options, progress=interrupted)
    assert not out.with_suffix(".manifest.json").exists()
    scalars = RepackOptions(layout="insightface")
    with pytest.raises(RectoolError, match="cannot resume: the interrupted repack used different"):
        repack([packed], out, scalars, resume=True)
    result = repack([packed], out, options, resume=True)
    assert result.resumed_from == 4
    assert files(out) == files(reference)


def test_resume_after_the_images_of_two_labels_keeps_them_all(tmp_path, monkeypatch):
    # Images with two labels have flag 2, as identity records do, but image bytes: a resume
    # cuts the identity records an interrupted run wrote after them, and keeps every image.
    root, items = tree(tmp_path)
    packed = pack(tmp_path, root, items, "vector")
    options = RepackOptions(layout="insightface", pack_label=True)
    reference = tmp_path / "ref" / "train"
    repack([packed], reference, options)
    monkeypatch.setattr(repack_run, "BATCH_RECORDS", 4)

    def interrupted(done, total, refused):
        if done >= 4:
            raise KeyboardInterrupt

    out = tmp_path / "out" / "train"
    with pytest.raises(KeyboardInterrupt):
        repack([packed], out, options, progress=interrupted)
    # As if killed after the 9 images and 2 of the 3 identity records.
    idx_lines = reference.with_suffix(".idx").read_bytes().splitlines(keepends=True)
    cut = int(idx_lines[11].split(b"\t")[1])
    rec = reference.with_suffix(".rec").read_bytes()
    assert [int(line.split(b"\t")[0]) for line in idx_lines[9:11]] == [10, 11]
    out.parent.joinpath("train.rec.partial").write_bytes(rec[:cut])
    out.parent.joinpath("train.idx.partial").write_bytes(b"".join(idx_lines[:11]))
    result = repack([packed], out, options, resume=True)
    assert result.resumed_from == 9
    assert files(out) == files(reference)


def test_a_new_head_keeps_id2_across_shards_and_split_records(tmp_path):
    # Records of another shape get a new head joined to their image bytes; a split record is
    # framed again. Both keep the header's id2, from any shard; expected bytes are framed by
    # hand, as dmlc frames them.
    data = [*images(5), b"img!" + MAGIC + b"\xff" * 8]  # the last one split at MAGIC
    labels = [0, 0, 1, 1, 2, 2]
    records = [(k, image_record(data[k], float(labels[k]), k, 100 + k)) for k in range(6)]
    source = tmp_path / "src"
    entries = []
    for number, part in enumerate((records[:3], records[3:])):
        stem = tmp_path / f"src-{number:05d}"
        write_shard(f"{stem}.rec", f"{stem}.idx", part)
        entries.append({"rec": stem.name + ".rec", "idx": stem.name + ".idx", "records": 3})
    write_manifest(source, entries, "images")
    options = RepackOptions(layout="insightface", check="none")
    shapes = {True: lambda label: [float(label)], False: float}  # by --pack-label
    for pack_label, out in ((True, "vectors"), (False, "scalars")):
        prefix = tmp_path / out / "train"
        repack([source], prefix, dataclasses.replace(options, pack_label=pack_label))
        label_of = shapes[pack_label]
        expected = b"".join(
            frame(image_record(data[k], label_of(labels[k]), k + 1, 100 + k)) for k in range(6)
        )
        rec = prefix.with_suffix(".rec").read_bytes()
        assert rec[: len(expected)] == expected
        with closing(open_dataset(prefix)) as ds:
            assert len(ds) == 6 and ds.identity_ranges.tolist() == [[0, 2], [2, 4], [4, 6]]
        source = prefix  # then back to scalars, from the vectors
