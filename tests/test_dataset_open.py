"""The core reader's open_dataset: a format-3 pack by prefix or manifest, and refusing the rest.

Runs against `rectool.reader`, and through tests/test_emit.py against the emitted standalone
copy in a process where rectool cannot be imported (see helpers/reader_under_test.py). Packs
are written by hand (helpers/handmade_datasets.py), never by rectool. What the package opens
besides (a bare .rec, lists of shards, older packs) is tests/test_dataset_packs.py's.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from helpers.handmade_datasets import as_pairs, expected_pairs, images, write_pack
from helpers.reader_under_test import rd


@pytest.fixture
def pack(tmp_path):
    """Three shards of 4, 3 and 5 JPEGs, keys out of order, labels 0.0 .. 11.0: format 3."""
    keys = [40, 3, 17, 8, 100, 5, 6, 7, 1, 0, 9, 2]
    items = [(key, image, float(n)) for n, (key, image) in enumerate(zip(keys, images(12)))]
    samples = write_pack(tmp_path / "faces", [items[:4], items[4:7], items[7:]], index=True)
    return tmp_path / "faces", samples


def test_open_by_prefix_or_manifest(pack):
    prefix, samples = pack
    for source in (prefix, str(prefix), f"{prefix}.manifest.json", Path(f"{prefix}.manifest.json")):
        ds = rd.open_dataset(source)
        assert len(ds) == 12
        assert as_pairs(ds) == expected_pairs(samples)
        assert ds.layout == "images"
        assert ds.manifest_path == f"{prefix}.manifest.json"


def test_empty_dataset(tmp_path):
    write_pack(tmp_path / "empty", [[]], index=True)
    ds = rd.open_dataset(tmp_path / "empty")
    assert len(ds) == 0 and list(ds) == []
    assert ds.labels.shape == (0,)


# --- what the core does not open: a message naming `rectool index` ---------------------------


def test_a_bare_rec_a_list_or_nothing_is_not_a_pack_it_opens(pack, tmp_path):
    prefix, _ = pack
    write_pack(tmp_path / "bare", [[(0, images(1)[0], 0.0)]], manifest=False)
    for source in (tmp_path / "bare.rec", tmp_path / "bare", f"{prefix}-00000.rec", tmp_path / "x"):
        with pytest.raises(rd.NotIndexedError) as caught:
            rd.open_dataset(source)
        assert str(caught.value) == (
            f"{source}: no rectool pack here (no {source}.manifest.json); a .rec without one "
            "gets its manifest and index from `rectool index`"
        )
        assert isinstance(caught.value, rd.InputError)
    with pytest.raises(TypeError):
        rd.open_dataset([f"{prefix}-00000.rec"])


@pytest.mark.parametrize("version", [1, 2])
def test_a_pack_without_a_binary_index_is_refused_naming_rectool_index(tmp_path, version):
    write_pack(tmp_path / "old", [[(0, images(1)[0], 0.0)]])
    manifest = edit_manifest(tmp_path / "old", lambda d: d.update(format_version=version))
    with pytest.raises(rd.NotIndexedError) as caught:
        rd.open_dataset(tmp_path / "old")
    assert str(caught.value) == (
        f"{manifest}: a pack without a binary index (manifest format {version}); write one with "
        f"`rectool index {manifest}`"
    )


def test_a_newer_manifest_is_refused(pack):
    manifest = edit_manifest(pack[0], lambda d: d.update(format_version=4))
    with pytest.raises(rd.InputError, match="manifest format version 4 is newer than this reader"):
        rd.open_dataset(manifest)


# --- missing files -----------------------------------------------------------------------------


def test_missing_rec(pack):
    prefix, _ = pack
    os.unlink(f"{prefix}-00001.rec")
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value) == f"{prefix}-00001.rec: record file not found"


@pytest.mark.parametrize("name", ["offsets", "keys", "labels"])
def test_missing_index_array(pack, name):
    prefix, _ = pack
    os.unlink(f"{prefix}.{name}.npy")
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value) == f"{prefix}.{name}.npy: index array not found"


# --- hostile and damaged inputs ------------------------------------------------------------------


def edit_manifest(prefix, edit):
    path = Path(f"{prefix}.manifest.json")
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("name", ["../../x/y.rec", "/etc/hostname", "sub/a.rec", "..", ""])
def test_manifest_shard_paths_must_be_plain_names_in_its_folder(pack, tmp_path, name):
    prefix, _ = pack
    secret = tmp_path / "secret.rec"
    secret.write_bytes(b"SECRET CONTENTS")
    if name == "/etc/hostname":
        name = str(secret)
    manifest = edit_manifest(prefix, lambda d: d["shards"][1].update(rec=name))
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value) == (
        f"{manifest}: manifest field 'shards[1].rec' must be a plain file name in its folder, "
        "listed once"
    )


@pytest.mark.parametrize("name", ["offsets", "keys", "labels"])
@pytest.mark.parametrize("file", ["../faces.offsets.npy", "/etc/hostname", None, 7, "\ud800"])
def test_manifest_index_files_must_be_plain_names_in_its_folder(pack, name, file):
    manifest = edit_manifest(pack[0], lambda d: d["index"][name].update(file=file))
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value) == (
        f"{manifest}: manifest field 'index.{name}.file' must be a plain file name in its folder"
    )


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["shards"][2].update(rec=None), "shards[2].rec"),
        (lambda d: d.update(shards="x"), "shards"),
        (lambda d: d.update(shards=[]), "shards"),
        (lambda d: d["shards"].__setitem__(1, "a.rec"), "shards[1].rec"),
        (lambda d: d.update(format_version="3"), "format_version"),
        (lambda d: d.update(format_version=-1), "format_version"),
        (lambda d: d["index"].update(samples=[4, 3]), "index.samples"),
        (lambda d: d["index"].update(samples="12"), "index.samples"),
        (lambda d: d["index"].update(samples=[4, -3, 5]), "index.samples[1]"),
        (lambda d: d["index"].update(samples=[4, 3.0, 5]), "index.samples[1]"),
        (lambda d: d["index"].update(samples=[4, True, 5]), "index.samples[1]"),
        (lambda d: d["index"].pop("keys"), "index.keys.file"),
        (lambda d: d.update(index=[]), "index.samples"),
    ],
)
def test_manifest_fields_are_checked_and_named(pack, edit, field):
    # The fields the core reads; those only rectool's commands read (identities, totals,
    # layout, each .idx ...) are rectool's to check (tests/test_manifest_schema.py).
    manifest = edit_manifest(pack[0], edit)
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(manifest)
    assert str(caught.value).startswith(f"{manifest}: manifest field {field!r} must be ")


def test_manifest_listing_one_shard_twice_is_refused(pack):
    manifest = edit_manifest(pack[0], lambda d: d["shards"].append(dict(d["shards"][0])))
    with pytest.raises(rd.InputError, match=r"'shards\[3\].rec' must be .*, listed once"):
        rd.open_dataset(manifest)


@pytest.mark.parametrize("text", ["", "[1, 2]", '{"format": "other"}', "{" * 100_000, "\xff"])
def test_a_manifest_that_is_not_one_is_refused(pack, text):
    manifest = Path(f"{pack[0]}.manifest.json")
    manifest.write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff" else b"\xff")
    with pytest.raises(rd.InputError, match=f"^{manifest}: not a rectool manifest"):
        rd.open_dataset(manifest)


@pytest.mark.parametrize("which", ["rec", "manifest", "offsets", "labels"])
def test_a_fifo_in_place_of_a_file_is_refused_not_read(pack, which, no_hang):
    prefix, _ = pack
    path = {
        "rec": f"{prefix}-00001.rec",
        "manifest": f"{prefix}.manifest.json",
        "offsets": f"{prefix}.offsets.npy",
        "labels": f"{prefix}.labels.npy",
    }[which]
    os.unlink(path)
    os.mkfifo(path)
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value).startswith(f"{path}: not a regular file")


def test_a_folder_in_place_of_a_rec_is_refused(pack):
    prefix, _ = pack
    os.unlink(f"{prefix}-00001.rec")
    os.mkdir(f"{prefix}-00001.rec")
    with pytest.raises(rd.InputError, match="00001.rec: not a regular file"):
        rd.open_dataset(prefix)


@pytest.mark.parametrize("suffix", [".pack-state.json", ".commit-journal.json"])
def test_an_unfinished_or_half_replaced_pack_is_refused(pack, suffix):
    prefix, _ = pack
    Path(f"{prefix}{suffix}").write_text("{}")
    with pytest.raises(rd.RectoolError, match=f"{prefix}{suffix}"):
        rd.open_dataset(prefix)


# --- a hostile binary index: the reader's own errors, never numpy's, never a pickle -------------


def save(path, array, allow_pickle=False):
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=allow_pickle)


class WritesAFile:
    """Unpickling this writes a file: proof that a pickle ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "a pickle ran"))


def test_an_object_array_whose_pickle_would_write_a_file_is_refused_unrun(pack, tmp_path):
    prefix, _ = pack
    proof = tmp_path / "pickle-ran"
    array = np.empty(12, dtype=object)
    array[:] = [WritesAFile(proof)] * 12
    save(f"{prefix}.offsets.npy", array, allow_pickle=True)
    pickle.loads(pickle.dumps(WritesAFile(tmp_path / "control")))  # the payload works...
    assert (tmp_path / "control").read_text() == "a pickle ran"
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(prefix)
    assert "the offsets index must be 12 rows of int64, not (12,) object" in str(caught.value)
    assert not proof.exists()  # ...and never ran


@pytest.mark.parametrize(
    ("name", "array", "why"),
    [
        ("offsets", np.arange(12, dtype="<i4"), "(12,) int32"),
        ("offsets", np.arange(12, dtype="<u8"), "(12,) uint64"),
        ("offsets", np.arange(12, dtype=">i8"), "(12,) >i8"),
        ("offsets", np.arange(11, dtype="<i8"), "(11,) int64"),
        ("offsets", np.arange(13, dtype="<i8"), "(13,) int64"),
        ("offsets", np.zeros((12, 2), dtype="<i8"), "(12, 2) int64"),
        ("offsets", np.zeros((), dtype="<i8"), "() int64"),
        ("keys", np.arange(12, dtype="<f8"), "(12,) float64"),
        ("labels", np.zeros(12, dtype="<f8"), "(12,) float64"),
        ("labels", np.zeros((12, 2, 1), dtype="<f4"), "(12, 2, 1) float32"),
        ("labels", np.zeros(12, dtype="U3"), "(12,) <U3"),
        ("labels", np.asfortranarray(np.zeros((12, 2), dtype="<f4")), "(12, 2) float32"),
    ],
)
def test_an_index_array_of_another_dtype_or_shape_is_refused(pack, name, array, why):
    prefix, _ = pack
    save(f"{prefix}.{name}.npy", array)
    with pytest.raises(rd.InputError) as caught:
        rd.open_dataset(prefix)
    assert str(caught.value).startswith(f"{prefix}.{name}.npy: the {name} index must be 12 rows")
    assert why in str(caught.value) and "rebuild it with `rectool index`" in str(caught.value)


@pytest.mark.parametrize("cut", [0, 5, 9, 60, 127, 128 + 8 * 11, -1])
def test_a_truncated_index_array_is_refused(pack, cut):
    prefix, _ = pack
    path = Path(f"{prefix}.offsets.npy")
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut >= 0 else data + b"\0" * 8)
    with pytest.raises(rd.InputError, match=f"^{path}: "):
        rd.open_dataset(prefix)


@pytest.mark.parametrize(
    "header",
    [
        b"{'descr': '<i8', 'fortran_order': False, 'shape': (-12,), }",
        b"{'descr': '<i8', 'fortran_order': False, 'shape': (12, -1), }",
        b"{'descr': '<i8', 'fortran_order': False, 'shape': (12,), 'x': __import__('os'), }",
        b"{'descr': '<i8', 'fortran_order': False, 'shape': (12, }",
        b"{#descr': '<i8', 'fortran_order': False, 'shape': (12,), }",
        b"{'descr': '|O', 'fortran_order': False, 'shape': (12,), }",
        b"[" * 5000 + b"]" * 5000,
    ],
)
def test_a_crafted_npy_header_is_refused_by_the_reader(pack, header):
    prefix, _ = pack
    path = Path(f"{prefix}.offsets.npy")
    body = np.arange(12, dtype="<i8").tobytes()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + body)
    with pytest.raises(rd.InputError, match=f"^{path}: "):
        rd.open_dataset(prefix)


def offsets_of(prefix):
    return np.load(f"{prefix}.offsets.npy").tolist()


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (lambda size: size + 64, "record cut short: expected a part header, found the end of the"),
        (lambda size: 1 << 62, "record cut short: expected a part header, found the end of the"),
        (lambda size: -8, "not a record start (a negative or not 4-byte aligned offset)"),
        (lambda size: -(1 << 63), "not a record start (a negative or not 4-byte aligned offset)"),
        (lambda size: 6, "not a record start (a negative or not 4-byte aligned offset)"),
        (lambda size: 4, "bad magic 0x"),
    ],
    ids=["past the end", "far past the end", "negative", "most negative", "unaligned", "inside"],
)
def test_an_offset_the_rec_does_not_hold_is_refused_where_it_is_read(pack, bad, reason):
    prefix, samples = pack
    offsets = offsets_of(prefix)
    size = os.path.getsize(samples[5].rec)
    offsets[5] = bad(size)
    save(f"{prefix}.offsets.npy", np.array(offsets, "<i8"))
    for decode in (None, "rgb"):
        ds = rd.open_dataset(prefix, decode=decode)
        assert ds[4][1] == 4.0 and ds[6][1] == 6.0  # its neighbours still read
        with pytest.raises(rd.RecordFormatError) as caught:
            ds[5]
        error = caught.value
        assert (error.path, error.offset, error.key) == (samples[5].rec, offsets[5], samples[5].key)
        assert error.reason.startswith(reason)


def test_labels_of_no_width_are_refused(pack):
    prefix, _ = pack
    save(f"{prefix}.labels.npy", np.zeros((12, 0), dtype="<f4"))
    with pytest.raises(
        rd.InputError, match=r"labels index must be 12 rows of float32, not \(12, 0\)"
    ):
        rd.open_dataset(prefix)


def test_samples_a_shard_must_be_its_records(pack):
    """The index's split of samples among shards must be the manifest's record counts (images
    layout): with [5, 2, 5] sample 4 was read from shard 0 at another sample's offset."""
    prefix, _ = pack
    edit_manifest(prefix, lambda d: d["index"].update(samples=[5, 2, 5]))
    with pytest.raises(rd.InputError, match=r"index.samples\[0\] is 5, the shard 4"):
        rd.open_dataset(prefix)


def test_a_shard_must_hold_the_samples_the_index_gives_it(pack):
    prefix, _ = pack
    edit_manifest(prefix, lambda d: d["shards"][2].update(records=6))
    with pytest.raises(rd.InputError, match=r"index.samples\[2\] is 5, the shard 6"):
        rd.open_dataset(prefix)
