"""The insightface layout in both label shapes: a scalar identity an image (faces_emore, ms1m)
or, with `--pack-label`, a label vector, identity first (Glint360K, WebFace42M).

Each shape is packed by `rectool pack`, compared byte for byte with what insightface's own
`RecBuilder` writes under the real MXNet, read back by rectool (the package and the core
reader), by arcface_torch's `MXFaceDataset` and by `unpack_glint360k.py` (both under MXNet),
and verified sound.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import image_record, images, write_shard
from helpers.image_files import write_list, write_pack_tree
from helpers.mxnet_oracle import MX_FACE_DATASET, UNPACK_GLINT360K, run_mxnet

from rectool import open_dataset
from rectool import reader as core
from rectool.cli import cli
from rectool.inspect.verify import verify_dataset
from rectool.packer.layout import image_label
from rectool.packer.packing import PackOptions, pack_images

NAMES = ["ann", "bob", "cid"]
PER_IDENTITY = 3
# shape -> (each image's list labels, from its identity and its number; --pack-label)
SHAPES = {
    "scalar": (lambda c, n: c, False),
    "vector": (lambda c, n: [c, 0.25 * n], True),
    "vector-of-one": (lambda c, n: [c], True),
}


@pytest.fixture(params=list(SHAPES))
def shape(request):
    return request.param


def faces(tmp_path, shape):
    """A tree of NAMES x PER_IDENTITY JPEGs and its list, lines in reverse order (the layout
    groups them by identity); return (root, list, [(identity, labels, image bytes)] in the
    order the pack keys them 1..N)."""
    labels_of, _ = SHAPES[shape]
    root = tmp_path / "tree"
    items = write_pack_tree(root, NAMES, PER_IDENTITY)
    lines = [(i, labels_of(c, i % PER_IDENTITY), rel) for i, c, rel in items]
    lst = write_list(tmp_path / "faces.lst", lines[::-1])
    written = sorted(lines[::-1], key=lambda line: _first(line[1]))  # stable, as the layout
    return root, lst, [(_first(lab), lab, (root / rel).read_bytes()) for _, lab, rel in written]


def _first(labels):
    return labels[0] if isinstance(labels, list) else labels


def pack(tmp_path, shape, *extra):
    root, lst, expected = faces(tmp_path, shape)
    prefix = tmp_path / "out" / "train"
    args = ["pack", str(lst), str(root), str(prefix), "--layout", "insightface", "--quiet"]
    args += ["--pack-label"] if SHAPES[shape][1] else []
    result = CliRunner().invoke(cli, [*args, *extra])
    assert result.exit_code == 0, result.output
    return prefix, expected


def paths(prefix):
    return {"rec": f"{prefix}.rec", "idx": f"{prefix}.idx"}


# insightface's RecBuilder (recognition/arcface_mxnet/common/rec_builder.py) as it writes a
# pack of encoded images: each identity's images at keys 1..N, then one record per identity
# ([first key, end key)), then record 0 (flag 2 from its label pair, id2 1), through MXNet.
REC_BUILDER = """
import mxnet as mx
writer = mx.recordio.MXIndexedRecordIO(DATA["idx"], DATA["rec"], "w")
widx, identities = 1, []
for images in DATA["identities"]:
    first = widx
    for labels, image in images:
        writer.write_idx(widx, mx.recordio.pack(mx.recordio.IRHeader(0, labels, widx, 0), image))
        widx += 1
    identities.append((first, widx))
id_idx = widx
for pair in identities:
    writer.write_idx(widx, mx.recordio.pack(mx.recordio.IRHeader(0, pair, widx, 0), b""))
    widx += 1
writer.write_idx(0, mx.recordio.pack(mx.recordio.IRHeader(0, (id_idx, widx), 0, 1), b""))
writer.close()
emit(None)
"""


@pytest.mark.oracle
def test_pack_writes_the_bytes_insightface_writes(tmp_path, shape):
    prefix, expected = pack(tmp_path, shape)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    by_identity = [[(lab, data) for c, lab, data in expected if c == k] for k in range(3)]
    run_mxnet(REC_BUILDER, {**paths(theirs / "train"), "identities": by_identity})
    for suffix in (".rec", ".idx"):
        ours = prefix.with_suffix(suffix).read_bytes()
        assert ours == (theirs / f"train{suffix}").read_bytes(), suffix
    assert (prefix.parent / "property").read_text() == "3,40,32\n"
    manifest = json.loads(prefix.with_suffix(".manifest.json").read_text())
    assert (manifest["layout"], manifest["options"]["pack_label"]) == (
        "insightface",
        SHAPES[shape][1],
    )


def test_rectool_reads_both_shapes(tmp_path, shape):
    prefix, expected = pack(tmp_path, shape)
    labels = np.array([lab for _, lab, _ in expected], np.float32)
    ranges = [[0, 3], [3, 6], [6, 9]]
    ds = open_dataset(prefix)
    assert (ds.layout, len(ds), ds.identity_ranges.tolist()) == ("insightface", 9, ranges)
    assert ds.keys.tolist() == list(range(1, 10))
    assert ds.labels.shape == labels.shape and (ds.labels == labels).all()
    assert [image for image, _ in ds] == [data for _, _, data in expected]
    assert [np.asarray(label).tolist() for _, label in ds] == labels.tolist()
    reader = core.open_dataset(f"{prefix}.manifest.json")
    assert reader.labels.shape == labels.shape and (reader.labels == labels).all()
    assert [reader.raw(i)[0] for i in range(len(reader))] == [d for _, _, d in expected]


@pytest.mark.oracle
def test_mxface_dataset_reads_both_shapes(tmp_path, shape):
    prefix, expected = pack(tmp_path, shape)
    samples, ranges = run_mxnet(MX_FACE_DATASET, paths(prefix))
    assert samples == [(k, data, float(c)) for k, (c, _, data) in enumerate(expected, 1)]
    assert ranges == [[0, 3], [3, 6], [6, 9]]


@pytest.mark.oracle
def test_unpack_glint360k_reads_the_vector_shapes(tmp_path):
    for shape in ("vector", "vector-of-one"):
        prefix, expected = pack(tmp_path / shape, shape)
        unpacked = run_mxnet(UNPACK_GLINT360K, paths(prefix))
        assert unpacked == [(k, int(c), data) for k, (c, _, data) in enumerate(expected, 1)]


@pytest.mark.oracle
def test_unpack_glint360k_cannot_read_the_scalar_shape(tmp_path):
    # Why the vector shape exists: insightface's tool indexes each image's label.
    prefix, _ = pack(tmp_path, "scalar")
    with pytest.raises(AssertionError, match="'float' object is not subscriptable"):
        run_mxnet(UNPACK_GLINT360K, paths(prefix))


def test_verify_finds_both_shapes_sound(tmp_path, shape):
    prefix, _ = pack(tmp_path, shape)
    report = verify_dataset(f"{prefix}.manifest.json")
    assert report.problems == []
    result = CliRunner().invoke(cli, ["verify", f"{prefix}.manifest.json"])
    assert result.exit_code == 0, result.output
    assert "layout insightface" in result.output


def test_verify_names_a_vector_label_outside_its_identity(tmp_path):
    prefix, _ = pack(tmp_path, "vector")
    rec = prefix.with_suffix(".rec")
    keys, offsets = zip(*(map(int, line.split()) for line in open(f"{prefix}.idx")))
    at = offsets[keys.index(2)] + 8 + 24  # key 2's first label, the identity: 0 -> 2
    data = bytearray(rec.read_bytes())
    data[at : at + 4] = np.float32(2).tobytes()
    rec.write_bytes(bytes(data))
    kinds = {p.kind for p in verify_dataset(str(rec)).problems}
    assert "insightface-label" in kinds


def test_reencoded_images_keep_their_label_vectors(tmp_path):
    # Re-encoding frames images in worker threads' results, not in pass-through blocks.
    prefix, expected = pack(tmp_path, "vector", "--resize", "16", "--workers", "2")
    ds = open_dataset(prefix)
    assert ds.labels.tolist() == [lab for _, lab, _ in expected]


def test_a_kill_among_the_images_of_a_vector_pack_resumes_after_them(tmp_path):
    from rectool.packer.manifest import STATE_SUFFIX
    from rectool.packer.packing import validate_list

    root, lst, _ = faces(tmp_path, "vector")
    options = PackOptions(layout="insightface", pack_label=True)
    pack_images(lst, root, tmp_path / "ref" / "train", options)
    reference = {p.name: p.read_bytes() for p in (tmp_path / "ref").iterdir()}
    # As if killed after 7 of the 9 images: each has flag 2 (two labels), as identity
    # records do, but image bytes; resuming keeps them.
    out = tmp_path / "out"
    out.mkdir()
    idx_lines = reference["train.idx"].splitlines(keepends=True)
    cut = int(idx_lines[7].split(b"\t")[1])
    (out / "train.idx.partial").write_bytes(b"".join(idx_lines[:7]))
    (out / "train.rec.partial").write_bytes(reference["train.rec"][:cut])
    (out / "train.failures.jsonl.partial").write_bytes(b"")
    digest, _ = validate_list(str(lst), "insightface", pack_label=True)
    state = {
        "list_sha256": digest,
        "root": os.path.abspath(root),
        "options": options.byte_options(),
    }
    (out / ("train" + STATE_SUFFIX)).write_text(json.dumps(state))
    result = pack_images(lst, root, out / "train", options, resume=True)
    assert result.resumed_from == 7
    got = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(got) == sorted(reference)
    assert [name for name in reference if got[name] != reference[name]] == []


def test_without_pack_label_a_vector_list_writes_the_identity_alone(tmp_path):
    # As in the images layout (and im2rec): the first label, unless --pack-label.
    root, lst, expected = faces(tmp_path, "vector")
    prefix = tmp_path / "o" / "train"
    args = ["pack", str(lst), str(root), str(prefix), "--layout", "insightface", "--quiet"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    ds = open_dataset(prefix)
    assert ds.labels.ndim == 1 and ds.labels.tolist() == [c for c, _, _ in expected]


def test_the_identity_must_be_a_label_vectors_first_label(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, NAMES, 1)
    lst = write_list(tmp_path / "f.lst", [(i, [0.5, float(c)], rel) for i, c, rel in items])
    args = ["pack", str(lst), str(root), str(tmp_path / "o" / "t"), "--layout", "insightface"]
    result = CliRunner().invoke(cli, [*args, "--pack-label"])
    assert result.exit_code != 0
    assert f"{lst}: line 1: --layout insightface needs one non-negative integer label, " in (
        result.output
    )
    assert "the identity, as the first label, got [0.5, 0.0]" in result.output
    assert not (tmp_path / "o" / "t.rec").exists()


def test_a_handmade_pack_of_label_vectors_is_insightface(tmp_path):
    # Written by hand as Glint360K is laid out: images with [identity, x], identity records.
    data = images(3)
    records = [(k, image_record(data[k - 1], [float(k > 1), 7.0], k)) for k in (1, 2, 3)]
    records += [(4, image_record(b"", [1.0, 2.0], 4)), (5, image_record(b"", [2.0, 4.0], 5))]
    records += [(0, image_record(b"", [4.0, 6.0], 0, 1))]
    write_shard(tmp_path / "train.rec", tmp_path / "train.idx", records)
    ds = open_dataset(tmp_path)
    assert (ds.layout, len(ds), ds.identity_ranges.tolist()) == ("insightface", 3, [[0, 1], [1, 3]])
    assert ds.labels.tolist() == [[0, 7], [1, 7], [1, 7]]


def test_rectool_index_gives_a_handmade_vector_pack_its_binary_index(tmp_path):
    # A Glint360K-like folder made by others: `rectool index`, then the core reader and verify.
    data = images(4)
    records = [(k, image_record(data[k - 1], [float(k > 2), 0.5 * k], k)) for k in (1, 2, 3, 4)]
    records += [(5, image_record(b"", [1.0, 3.0], 5)), (6, image_record(b"", [3.0, 5.0], 6))]
    records += [(0, image_record(b"", [5.0, 7.0], 0, 1))]
    write_shard(tmp_path / "train.rec", tmp_path / "train.idx", records)
    (tmp_path / "property").write_text("2,20,24\n")
    result = CliRunner().invoke(cli, ["index", str(tmp_path)])
    assert result.exit_code == 0, result.output
    manifest = tmp_path / "train.manifest.json"
    assert json.loads(manifest.read_text())["layout"] == "insightface"
    reader = core.open_dataset(manifest)
    assert reader.labels.tolist() == [[0, 0.5], [0, 1], [1, 1.5], [1, 2]]
    assert [reader.raw(i)[0] for i in range(4)] == data
    assert np.load(tmp_path / "train.identity_ranges.npy").tolist() == [[0, 2], [2, 4]]
    assert verify_dataset(str(manifest)).problems == []


def test_label_vectors_and_a_header_lookalike_without_identity_records_are_images(tmp_path):
    # Record 0 looks like a header, but key 2 (its first "identity") is an image: an im2rec
    # --pack-label pack, every record a sample.
    data = images(3)
    records = [(0, image_record(b"", [2.0, 3.0], 0)), (1, image_record(data[0], [5.0, 1.0], 1))]
    records += [(2, image_record(data[1], [1.0, 3.0], 2))]
    write_shard(tmp_path / "f.rec", tmp_path / "f.idx", records)
    ds = open_dataset(tmp_path / "f.rec")
    assert (ds.layout, len(ds), ds.identity_ranges) == ("images", 3, None)


@pytest.mark.parametrize(
    "identity, vector, pack_label, written",
    [
        (3, None, False, 3.0),  # scalar stays scalar
        (3, None, True, [3.0]),  # scalar to vector: the identity alone
        (3, np.array([9.0, 0.5, 2.0], np.float32), True, [3.0, 0.5, 2.0]),  # identity replaced
        (3, np.array([9.0, 0.5], np.float32), False, 3.0),  # vector to scalar
    ],
    ids=["scalar", "to-vector", "vector", "to-scalar"],
)
def test_image_label_converts_between_the_shapes(identity, vector, pack_label, written):
    assert image_label(identity, vector, pack_label) == written
