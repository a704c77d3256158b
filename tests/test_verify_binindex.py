"""`rectool verify` on a pack's binary index (format 3): each `.npy` array and the identities file
are checked against the manifest and against the shards they were written from.

Expected rows, keys and offsets come from the .idx text (helpers/rec_files.py) and from arrays
written here with np.save; the byte offset of a row in an .npy file is counted from its end
(the data is last), never taken from the code under test.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import xxhash
from click.testing import CliRunner
from helpers.rec_files import make_pack, xor_byte

from rectool.cli import cli
from rectool.inspect.verify import verify_dataset

V1_PACK = Path(__file__).parent / "fixtures" / "v1pack"
ROW_BYTES = {"offsets": 8, "keys": 8, "labels": 4}


def found(report):
    return [(p.kind, p.path, p.key, p.offset) for p in report.problems]


def npy(pack, name):
    """Return the path of the pack's `name` index file (`faces.offsets.npy`, ...)."""
    return str(pack.manifest.parent / f"faces.{name}.npy")


def row_at(path, row, rows, row_bytes):
    """Return the byte offset of row `row` in an .npy file of `rows` rows (its data is last)."""
    return os.path.getsize(path) - (rows - row) * row_bytes


def rewrite(pack, name, array, field="index"):
    """Save `array` as the pack's `name` file and give the manifest its size and digest: an
    index that is whole and consistent, and says something else than the shards."""
    path = npy(pack, name)
    np.save(path, array)
    data = Path(path).read_bytes()
    doc = json.loads(pack.manifest.read_text())
    entry = doc[field][name] if field == "index" else doc[field]
    entry["bytes"], entry["xxh3_128"] = len(data), xxhash.xxh3_128_hexdigest(data)
    pack.manifest.write_text(json.dumps(doc))


# -- sound packs, and packs without a binary index ------------------------------------------------


def test_a_sound_pack_checks_every_index_file(small_pack):
    report = verify_dataset(small_pack.manifest)
    assert report.sound, report.problems
    assert report.notes == []
    assert report.checksums == 7  # .rec, .idx, .rec.crc, 3 arrays, the identities file


def test_a_sound_insightface_pack_checks_its_identity_ranges(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    report = verify_dataset(pack.manifest)
    assert report.sound, report.problems
    assert report.checksums == 8  # .rec, .idx, .rec.crc, 4 arrays, the identities file


def test_a_version_1_pack_is_sound_with_a_note(tmp_path):
    shutil.copytree(V1_PACK, tmp_path / "v1")
    manifest = tmp_path / "v1" / "faces.manifest.json"
    report = verify_dataset(manifest)
    assert report.sound, report.problems
    assert report.notes == [
        f"{manifest} has no binary index (manifest format 1); its .idx text was checked. "
        f"`rectool index {manifest}` writes one"
    ]
    result = CliRunner().invoke(cli, ["verify", str(manifest)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1:] == [
        "Sound: no problems found.",
        f"Note: {report.notes[0]}.",
    ]


def test_a_foreign_rec_is_sound_with_a_note(small_pack):
    small_pack.manifest.unlink()
    report = verify_dataset(small_pack.rec)
    assert report.sound, report.problems
    assert report.notes == [
        f"{small_pack.rec} has no binary index (no manifest: im2rec's, insightface's or bare "
        f"shards); its .idx text was checked. `rectool index {small_pack.rec}` writes one"
    ]
    document = json.loads(CliRunner().invoke(cli, ["verify", str(small_pack.rec), "--json"]).stdout)
    assert document["notes"] == report.notes and document["sound"] is True


# -- the files: there, whole, valid ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["offsets", "keys", "labels"])
def test_a_flipped_byte_in_an_array_is_a_digest_and_a_row_mismatch(small_pack, name):
    path = npy(small_pack, name)
    size = os.path.getsize(path)
    xor_byte(Path(path), size - 1, 0x01)  # the top byte of the last row (little-endian)
    report = verify_dataset(small_pack.manifest)
    key, offset = small_pack.lines[11]
    assert found(report) == [
        ("checksum-mismatch", path, None, None),
        ("index-mismatch", path, key, size - ROW_BYTES[name]),
    ]
    digest = xxhash.xxh3_128_hexdigest(Path(path).read_bytes())
    assert report.problems[0].message.startswith(f"xxh3-128 {digest} differs from the manifest's")
    if name == "offsets":
        assert report.problems[1].message == (
            f"sample 11: faces.offsets.npy holds offset {offset + (1 << 56)}, but line 12 of "
            f"faces.idx gives {offset}"
        )


def test_a_flipped_byte_in_an_array_header_is_found(small_pack):
    path = npy(small_pack, "offsets")
    xor_byte(Path(path), 0, 0x01)  # the magic: \x93NUMPY
    report = verify_dataset(small_pack.manifest)
    assert [(p.kind, p.path) for p in report.problems] == [
        ("checksum-mismatch", path),
        ("index-file", path),
    ]
    assert "not a offsets index array" in report.problems[1].message


def test_a_truncated_array_is_a_size_mismatch_and_not_an_array(small_pack):
    path = npy(small_pack, "keys")
    size = os.path.getsize(path)
    os.truncate(path, size - 8)
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [
        ("size-mismatch", path, None, None),
        ("index-file", path, None, None),
    ]
    assert report.problems[0].message == f"{size - 8} bytes; the manifest says {size}"
    assert report.problems[1].message == f"{size - 8:,} bytes, not the (12,) its header says"


def test_a_missing_array_is_a_missing_file(small_pack):
    path = npy(small_pack, "labels")
    os.unlink(path)
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [("missing-file", path, None, None)]
    assert "`rectool index`" in report.problems[0].message


def test_a_fifo_in_place_of_an_array_is_refused_without_hanging(small_pack):
    path = npy(small_pack, "offsets")
    os.unlink(path)
    os.mkfifo(path)
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [("index-file", path, None, None)]
    assert "not a regular file" in report.problems[0].message


class Mkdir:
    """Unpickled, it makes a folder: the proof that a pickle ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_an_object_array_is_refused_and_its_pickle_never_runs(small_pack, tmp_path):
    marker = tmp_path / "pickle-ran"
    rewrite(small_pack, "keys", np.array([Mkdir(str(marker))] * 12, dtype=object))
    assert Path(npy(small_pack, "keys")).read_bytes().count(b"mkdir")  # the pickle is there
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [("index-file", npy(small_pack, "keys"), None, None)]
    assert report.problems[0].message.startswith(
        "the keys index must be 12 rows of int64, not (12,) object"
    )
    assert not marker.exists()


def test_an_array_of_another_dtype_is_refused(small_pack):
    labels = np.arange(12, dtype=np.float64)
    rewrite(small_pack, "labels", labels)
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [("index-file", npy(small_pack, "labels"), None, None)]
    assert "must be 12 rows of float32, not (12,) float64" in report.problems[0].message


# -- the rows: what the shards say ----------------------------------------------------------------


def test_swapped_offsets_are_two_row_mismatches(small_pack):
    offsets = np.array([o for _, o in small_pack.lines], np.int64)
    offsets[[2, 3]] = offsets[[3, 2]]
    rewrite(small_pack, "offsets", offsets)
    report = verify_dataset(small_pack.manifest)
    path = npy(small_pack, "offsets")
    (k2, o2), (k3, o3) = small_pack.lines[2], small_pack.lines[3]
    assert found(report) == [
        ("index-mismatch", path, k2, row_at(path, 2, 12, 8)),
        ("index-mismatch", path, k3, row_at(path, 3, 12, 8)),
    ]
    assert [p.message for p in report.problems] == [
        f"sample 2: faces.offsets.npy holds offset {o3}, but line 3 of faces.idx gives {o2}",
        f"sample 3: faces.offsets.npy holds offset {o2}, but line 4 of faces.idx gives {o3}",
    ]


def test_a_changed_label_is_a_row_mismatch(small_pack):
    labels = np.array([float(label) for _, label, _ in small_pack.items], np.float32)
    was = float(labels[4])
    labels[4] = 7.0
    rewrite(small_pack, "labels", labels)
    report = verify_dataset(small_pack.manifest)
    path = npy(small_pack, "labels")
    key, offset = small_pack.lines[4]
    assert found(report) == [("index-mismatch", path, key, row_at(path, 4, 12, 4))]
    assert report.problems[0].message == (
        f"sample 4 (record at byte {offset} of faces.rec): faces.labels.npy holds 7.0, the "
        f"record's header {was!r}"
    )


def test_labels_of_another_width_than_the_headers_are_mismatches(tmp_path):
    pack = make_pack(tmp_path, pack_label=True)  # every record a label vector of one
    labels = np.array([float(label) for _, label, _ in pack.items], np.float32)
    rewrite(pack, "labels", labels)  # (12,): one scalar a sample
    report = verify_dataset(pack.manifest)
    assert report.counts == {"index-mismatch": 12}
    assert report.problems[0].message.endswith(
        "the record's header holds 1 labels; faces.labels.npy holds one label a sample"
    )


def test_a_changed_label_vector_is_a_row_mismatch(tmp_path):
    pack = make_pack(tmp_path, pack_label=True)
    labels = np.array([[float(label)] for _, label, _ in pack.items], np.float32)
    was = labels[6].tolist()
    labels[6] = [9.5]
    rewrite(pack, "labels", labels)
    report = verify_dataset(pack.manifest)
    path = npy(pack, "labels")
    assert found(report) == [("index-mismatch", path, pack.lines[6][0], row_at(path, 6, 12, 4))]
    assert report.problems[0].message.endswith(f"holds [9.5], the record's header {was!r}")


def test_rows_are_numbered_across_shards(tmp_path):
    pack = make_pack(tmp_path, shard_records=5)  # shards of 5, 5 and 2
    labels = np.array([float(label) for _, label, _ in pack.items], np.float32)
    labels[11] += 1  # the last shard's second sample
    rewrite(pack, "labels", labels)
    report = verify_dataset(pack.manifest)
    path = npy(pack, "labels")
    assert [(p.kind, p.path, p.offset) for p in report.problems] == [
        ("index-mismatch", path, row_at(path, 11, 12, 4))
    ]
    assert report.problems[0].message.startswith("sample 11 (record at byte ")
    assert "of faces-00002.rec)" in report.problems[0].message


def test_changed_identity_ranges_are_row_mismatches(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")  # 3 identities of 4 images, keys 1..12
    ranges = np.array([[0, 4], [4, 8], [8, 12]], np.int64)
    ranges[1] = [4, 7]
    rewrite(pack, "identity_ranges", ranges)
    report = verify_dataset(pack.manifest)
    path = npy(pack, "identity_ranges")
    assert found(report) == [("index-mismatch", path, 14, row_at(path, 1, 3, 16))]
    assert report.problems[0].message == (
        "identity 1: holds samples [4, 7], but its identity record (key 14) gives keys [5, 9), "
        "samples [4, 8]"
    )


def test_an_insightface_index_without_identity_ranges_is_a_mismatch(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    doc = json.loads(pack.manifest.read_text())
    del doc["index"]["identity_ranges"]
    pack.manifest.write_text(json.dumps(doc))
    report = verify_dataset(pack.manifest)
    assert found(report) == [("index-mismatch", str(pack.manifest), None, None)]
    assert "names no identity_ranges file" in report.problems[0].message


# -- the identities file --------------------------------------------------------------------------


def test_an_identities_file_that_is_not_names_is_found(small_pack):
    path = small_pack.manifest.parent / "faces.identities.json"
    path.write_text('["alice", "bob"]')
    report = verify_dataset(small_pack.manifest)
    assert [(p.kind, p.path) for p in report.problems] == [
        ("size-mismatch", str(path)),
        ("index-file", str(path)),
    ]
    assert report.problems[1].message.startswith("not an identities file")


def test_an_identities_file_with_another_count_is_a_mismatch(small_pack):
    path = small_pack.manifest.parent / "faces.identities.json"
    doc = json.loads(small_pack.manifest.read_text())
    doc["identities"]["count"] = 4
    small_pack.manifest.write_text(json.dumps(doc))
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [("index-mismatch", str(path), None, None)]
    assert report.problems[0].message == "holds 3 names; the manifest says 4"


def test_labels_of_no_width_are_refused(small_pack):
    rewrite(small_pack, "labels", np.zeros((12, 0), np.float32))
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [("index-file", npy(small_pack, "labels"), None, None)]
    assert "the labels index must be 12 rows of float32, not (12, 0) float32" in (
        report.problems[0].message
    )


def as_version_2(pack):
    """Rewrite a pack's manifest as version 2 wrote it: no index, the names in the manifest."""
    doc = json.loads(pack.manifest.read_text())
    names = json.loads((pack.manifest.parent / doc["identities"]["file"]).read_text())
    doc["format_version"], doc["identities"] = 2, names
    del doc["index"]
    pack.manifest.write_text(json.dumps(doc))
    return names


def test_a_version_2_pack_is_sound_with_a_note(small_pack):
    as_version_2(small_pack)
    report = verify_dataset(small_pack.manifest)
    assert report.sound, report.problems
    assert report.checksums == 3  # .rec, .idx, .rec.crc: no index files
    assert report.notes == [
        f"{small_pack.manifest} has no binary index (manifest format 2); its .idx text was "
        f"checked. `rectool index {small_pack.manifest}` writes one"
    ]
