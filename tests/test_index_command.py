"""`rectool index`: the manifest and binary index (format 3) of a pack made by im2rec, insightface
or an older rectool, written beside it; the core reader then opens it and reads what MXNet reads
through the `.idx`."""

from __future__ import annotations

import json
import os
import pickle
import random
import struct
import subprocess

import numpy as np
import pytest
import xxhash
from click.testing import CliRunner
from helpers.handmade_datasets import (
    frame,
    image_record,
    write_insightface,
    write_pack,
    write_shard,
)
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree
from helpers.mxnet_oracle import MX_FACE_DATASET, MX_READ_ALL, im2rec_path, oracle_python, run_mxnet

from rectool import reader
from rectool.cli import cli
from rectool.dataset.packs import PackDataset
from rectool.format.binindex import read_identities


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def indexed(target, *more):
    """Run `rectool index TARGET --json`; return its document."""
    result = invoke("index", target, "--json", *more)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def files_of(folder):
    """{name: bytes} of every file in `folder`."""
    return {p: open(os.path.join(folder, p), "rb").read() for p in sorted(os.listdir(folder))}


def read_all(ds):
    """Every (image bytes, label) of a dataset, labels as lists or floats."""
    return [(image, np.asarray(label).tolist()) for image, label in map(ds.raw, range(len(ds)))]


# arcface_torch's MXFaceDataset, with MXNet doing the reading.
# --- packs made by others, read as MXNet reads them ----------------------------------------------


@pytest.mark.oracle
@pytest.mark.parametrize("pack_label", [False, True], ids=["scalar", "pack-label"])
def test_an_im2rec_pack_reads_as_mxnet_reads_it(tmp_path, pack_label):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["ann", "bob", "cyd"], 3, height=20, width=16)
    random.Random(3).shuffle(items)  # im2rec keeps the list's order: keys out of order
    if pack_label:
        items = [(index, [label, index / 4], rel) for index, label, rel in items]
    write_list(tmp_path / "faces.lst", items)
    subprocess.run(
        [str(oracle_python()), im2rec_path(), str(tmp_path / "faces"), str(root),
         "--num-thread", "1", *(["--pack-label"] if pack_label else [])],
        check=True,
        capture_output=True,
    )  # fmt: skip
    rec, idx = tmp_path / "faces.rec", tmp_path / "faces.idx"
    before = rec.read_bytes(), idx.read_bytes()
    with pytest.raises(reader.NotIndexedError, match="rectool index"):
        reader.open_dataset(tmp_path / "faces")
    doc = indexed(rec)
    assert (doc["manifest"], doc["layout"], doc["samples"]) == (
        f"{tmp_path}/faces.manifest.json", "images", 9,
    )  # fmt: skip
    assert (rec.read_bytes(), idx.read_bytes()) == before  # read, never changed
    expected = run_mxnet(MX_READ_ALL, {"rec": str(rec), "idx": str(idx)})
    ds = reader.open_dataset(tmp_path / "faces")
    assert ds.keys.tolist() == [key for key, _, _, _ in expected] == [i for i, _, _ in items]
    assert read_all(ds) == [(image, label) for _, image, label, _ in expected]
    assert ds.labels.tolist() == [label for _, _, label, _ in expected]


@pytest.mark.oracle
@pytest.mark.parametrize("header_last", [True, False], ids=["header-last", "header-first"])
def test_an_insightface_folder_reads_as_mxface_dataset_reads_it(tmp_path, header_last):
    folder = tmp_path / "faces_emore"
    folder.mkdir()
    pictures = [jpeg_bytes(k, 12, 10) for k in range(12)]
    write_insightface(
        folder / "train.rec", folder / "train.idx", [3, 5, 4], lambda k: pictures[k - 1],
        header_last=header_last,
    )  # fmt: skip
    doc = indexed(folder)
    assert (doc["layout"], doc["samples"], doc["previous_format_version"]) == (
        "insightface", 12, None,
    )  # fmt: skip
    samples, ranges = run_mxnet(
        MX_FACE_DATASET, {"rec": str(folder / "train.rec"), "idx": str(folder / "train.idx")}
    )
    ds = reader.open_dataset(folder / "train")
    assert [(int(k), *ds[n]) for n, k in enumerate(ds.keys)] == samples
    assert ds.labels.tolist() == [label for _, _, label in samples]
    package = PackDataset(folder)  # the package reads the same index, and the ranges
    assert package.indexed and package.layout == "insightface"
    assert package.identity_ranges.tolist() == ranges == [[0, 3], [3, 8], [8, 12]]


def _format_2(pack):
    """Turn a pack rectool wrote into the format-2 pack an older rectool wrote: the manifest
    holds the identity names, no index and no index files."""
    manifest = json.loads(pack.manifest.read_text())
    folder = pack.manifest.parent
    names = read_identities(str(pack.manifest), manifest)
    for entry in [*manifest.pop("index").values(), manifest["identities"]]:
        if isinstance(entry, dict):
            os.unlink(folder / entry["file"])
    manifest.update(format_version=2, identities={str(k): v for k, v in names.items()})
    pack.manifest.write_text(json.dumps(manifest, indent=2))
    return manifest


@pytest.mark.oracle
def test_a_format_2_pack_is_upgraded_in_place_keeping_its_fields(small_pack):
    old = _format_2(small_pack)
    with pytest.raises(reader.NotIndexedError, match="manifest format 2"):
        reader.open_dataset(small_pack.manifest)
    result = invoke("index", small_pack.manifest)
    assert result.exit_code == 0, result.output
    prefix = str(small_pack.manifest)[: -len(".manifest.json")]
    assert result.stderr == (
        f"Wrote {small_pack.manifest} (format 2 before) and its index: 12 samples in 1 shard, "
        "layout images.\n"
    )
    new = json.loads(small_pack.manifest.read_text())
    assert new["format_version"] == 3
    assert {k: v for k, v in new.items() if k not in ("format_version", "identities", "index")} == {
        k: v for k, v in old.items() if k not in ("format_version", "identities")
    }
    assert new["identities"]["file"] == "faces.identities.json"
    assert new["identities"]["count"] == 3
    assert read_identities(str(small_pack.manifest), new) == {0: "alice", 1: "bob", 2: "carol"}
    assert sorted(os.listdir(small_pack.manifest.parent)) == sorted(
        ["faces.rec", "faces.idx", "faces.rec.crc", "faces.manifest.json", "faces.failures.jsonl",
         *(f"faces.{n}.npy" for n in ("offsets", "keys", "labels")), "faces.identities.json"]
    )  # fmt: skip
    expected = run_mxnet(MX_READ_ALL, {"rec": small_pack.r, "idx": small_pack.i})
    ds = reader.open_dataset(prefix)
    assert read_all(ds) == [(image, label) for _, image, label, _ in expected]
    assert ds.labels.tolist() == [0.0] * 4 + [1.0] * 4 + [2.0] * 4
    verified = invoke("verify", small_pack.manifest)
    assert verified.exit_code == 0, verified.output


def test_a_numbered_set_of_shards_without_a_manifest(handmade_shards):
    prefix = handmade_shards.prefix
    doc = indexed(prefix)
    assert (doc["shards"], doc["samples"], doc["layout"]) == (3, 12, "images")
    manifest = json.loads(open(f"{prefix}.manifest.json").read())
    # A hand-written format-1 manifest was there: its fields stay, its version is 3.
    assert manifest["format_version"] == 3 and doc["previous_format_version"] == 1
    ds = reader.open_dataset(prefix)
    assert read_all(ds) == [(s.image, s.label) for s in handmade_shards.samples]
    assert [ds.location(i) for i in range(12)] == [
        (s.rec, s.offset, s.key) for s in handmade_shards.samples
    ]


def test_a_foreign_manifest_describes_each_shard_as_pack_does(tmp_path):
    prefix = tmp_path / "many"
    pictures = [jpeg_bytes(k, 8, 8) for k in range(6)]
    samples = write_pack(
        prefix,
        [[(k, pictures[k], float(k)) for k in range(s * 3, s * 3 + 3)] for s in range(2)],
        manifest=False,
    )
    doc = indexed(prefix)
    assert doc["previous_format_version"] is None
    manifest = json.loads(open(f"{prefix}.manifest.json").read())
    for number, shard in enumerate(manifest["shards"]):
        rec, idx = f"{prefix}-{number:05d}.rec", f"{prefix}-{number:05d}.idx"
        assert shard == {
            "rec": os.path.basename(rec),
            "idx": os.path.basename(idx),
            "records": 3,
            "rec_bytes": os.path.getsize(rec),
            "rec_xxh3_128": xxhash.xxh3_128(open(rec, "rb").read()).hexdigest(),
            "idx_bytes": os.path.getsize(idx),
            "idx_xxh3_128": xxhash.xxh3_128(open(idx, "rb").read()).hexdigest(),
            "first_key": 3 * number,
            "last_key": 3 * number + 2,
        }
    assert manifest["totals"] == {
        "shards": 2, "records": 6, "images": 6, "failures": None,
        "rec_bytes": sum(os.path.getsize(s.rec) for s in samples[::3]),
    }  # fmt: skip
    assert (manifest["layout"], manifest["format_version"], manifest["list"]) == ("images", 3, None)
    verified = invoke("verify", prefix)
    assert verified.exit_code == 0, verified.output


# --- already indexed, --force, --json, the renamed command ----------------------------------------


def test_a_pack_already_indexed_is_left_as_it_is(small_pack):
    folder = small_pack.manifest.parent
    before = files_of(folder)
    stamps = {p: os.stat(folder / p).st_mtime_ns for p in before}
    result = invoke("index", small_pack.manifest)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == (
        f"{small_pack.manifest}: already indexed (manifest format 3); wrote nothing (--force "
        "writes the index again).\n"
    )
    assert files_of(folder) == before
    assert {p: os.stat(folder / p).st_mtime_ns for p in before} == stamps


def test_force_writes_the_same_index_again(small_pack):
    folder = small_pack.manifest.parent
    before = files_of(folder)
    doc = indexed(small_pack.manifest, "--force")
    assert doc["already_indexed"] is False
    assert doc["written"][-1] == str(small_pack.manifest)
    assert files_of(folder) == before  # the same shards give the same bytes


def test_an_index_file_gone_is_written_again(small_pack):
    os.unlink(small_pack.manifest.parent / "faces.labels.npy")
    doc = indexed(small_pack.rec)
    assert doc["already_indexed"] is False
    assert reader.open_dataset(small_pack.manifest).labels.tolist()[4] == 1.0


def test_json_is_one_document(tmp_path):
    write_pack(tmp_path / "one", [[(7, b"x", 2.0), (9, b"y", 3.0)]], manifest=False)
    result = invoke("index", tmp_path / "one.rec", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert set(doc) == {
        "manifest", "layout", "shards", "samples", "previous_format_version",
        "already_indexed", "written", "links", "seconds",
    }  # fmt: skip
    assert doc["written"] == [f"{tmp_path}/one.{n}.npy" for n in ("offsets", "keys", "labels")] + [
        f"{tmp_path}/one.manifest.json"
    ]


def test_index_cache_still_runs_index_and_says_it_is_renamed(tmp_path):
    write_pack(tmp_path / "one", [[(7, b"x", 2.0)]], manifest=False)
    result = invoke("index-cache", tmp_path / "one")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "`rectool index-cache` is renamed `rectool index`; the old name goes in the next release.",
        f"Wrote {tmp_path}/one.manifest.json (no manifest before) and its index: 1 sample in "
        "1 shard, layout images.",
    ]
    assert len(reader.open_dataset(tmp_path / "one")) == 1
    assert "index-cache" not in invoke("--help").output


# --- what cannot be indexed ---------------------------------------------------------------------


def test_not_a_dataset_is_exit_2(tmp_path):
    result = invoke("index", tmp_path / "nothing")
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: {tmp_path}/nothing: no dataset here (looked for {tmp_path}/nothing.manifest.json, "
        f"{tmp_path}/nothing.rec, {tmp_path}/nothing-00000.rec)\n"
    )
    assert os.listdir(tmp_path) == []


def test_an_idx_that_points_past_the_rec_is_exit_1_naming_the_place(tmp_path):
    write_pack(tmp_path / "p", [[(1, b"a", 0.0), (2, b"b", 0.0)]], manifest=False)
    size = os.path.getsize(tmp_path / "p.rec")
    (tmp_path / "p.idx").write_text(f"1\t0\n2\t{size + 64}\n")
    result = invoke("index", tmp_path / "p.rec")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {tmp_path}/p.rec, key 2, byte offset {size + 64}: ")
    assert "Traceback" not in result.output
    assert sorted(os.listdir(tmp_path)) == ["p.idx", "p.rec"]  # nothing written


def test_a_damaged_record_header_is_named_by_key_and_offset(tmp_path):
    records = [(k, image_record(b"img%d" % k, float(k % 7), k)) for k in range(10)]
    write_shard(tmp_path / "big.rec", tmp_path / "big.idx", records)  # records of 36 bytes
    with open(tmp_path / "big.rec", "r+b") as f:
        f.seek(3 * 36)
        f.write(b"\0\0\0\0")  # record 3's magic: not among the records checked first
    result = invoke("index", tmp_path / "big")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {tmp_path}/big.rec, key 3, byte offset 108: ")
    assert not (tmp_path / "big.manifest.json").exists()


def test_a_missing_idx_is_exit_2_naming_it(tmp_path):
    write_pack(tmp_path / "p", [[(1, b"a", 0.0)]], manifest=False)
    os.unlink(tmp_path / "p.idx")
    result = invoke("index", tmp_path / "p.rec")
    assert result.exit_code == 2
    assert f"{tmp_path}/p.idx" in result.stderr and "Traceback" not in result.output


def test_a_shard_of_an_indexed_pack_is_not_a_pack_of_its_own(handmade_shards):
    prefix = handmade_shards.prefix
    result = invoke("index", f"{prefix}-00001.rec")
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: {prefix}-00001.rec: a shard of the pack {prefix}; index the pack "
        f"({prefix}.manifest.json), not one of its shards\n"
    )


def test_a_read_only_folder_is_refused_naming_into(tmp_path, monkeypatch):
    write_pack(tmp_path / "ro", [[(1, b"a", 0.0)]], manifest=False)
    real_access = os.access

    def access(path, mode, **kwargs):  # the folder as a read-only mount shows it
        if os.fspath(path) == str(tmp_path) and mode & os.W_OK:
            return False
        return real_access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)
    result = invoke("index", tmp_path / "ro.rec")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path}: read-only; `rectool index` writes the manifest and index beside "
        "the shards (ro.manifest.json, .npy arrays). Write them into a folder you can write "
        "with --into FOLDER: the shards stay where they are, linked from there\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["ro.idx", "ro.rec"]


def test_shards_linked_into_a_writable_folder_are_indexed_there(tmp_path):
    source, there = tmp_path / "readonly", tmp_path / "here"
    source.mkdir(), there.mkdir()
    samples = write_pack(source / "p", [[(5, b"a", 1.0), (6, b"b", 2.0)]], manifest=False)
    for name in ("p.rec", "p.idx"):
        os.symlink(source / name, there / name)
    indexed(there / "p.rec")
    assert sorted(os.listdir(source)) == ["p.idx", "p.rec"]
    assert read_all(reader.open_dataset(there / "p")) == [(s.image, s.label) for s in samples]


def test_a_pack_being_written_is_refused(tmp_path):
    write_pack(tmp_path / "p", [[(1, b"a", 0.0)]], manifest=False)
    (tmp_path / "p.pack-state.json").write_text("{}")
    result = invoke("index", tmp_path / "p.rec")
    assert result.exit_code == 1
    assert "an unfinished pack" in result.stderr
    assert not (tmp_path / "p.manifest.json").exists()


# --- the binary index reads as the text index does (from the deleted .rtc cache tests) -----------


def insightface_in_shards(folder, header_first=False):
    """An insightface pack cut into 3 shards with a format-1 manifest: header and images 1..7
    first, then images 8..12, then the identity records (key 0 last in shard 0, as insightface
    writes it, or first)."""
    prefix = os.fspath(folder / "faces")
    rec, idx = f"{prefix}-tmp.rec", f"{prefix}-tmp.idx"
    write_insightface(rec, idx, [3, 4, 5], lambda k: b"face%d" % k)
    blob = open(rec, "rb").read()
    lines = [tuple(map(int, line.split())) for line in open(idx)]
    order = sorted(lines, key=lambda line: line[1])
    ends = dict(zip([o for _, o in order], [o for _, o in order[1:]] + [len(blob)]))
    records = {}
    for key, offset in lines:
        (lrec,) = struct.unpack_from("<I", blob, offset + 4)
        records[key] = blob[offset + 8 : offset + 8 + (lrec & ((1 << 29) - 1))]
        assert ends[offset] - offset == 8 + (-(-(lrec & ((1 << 29) - 1)) // 4) * 4)
    os.remove(rec), os.remove(idx)
    first = [0, *range(1, 8)] if header_first else [*range(1, 8), 0]
    entries = []
    for number, keys in enumerate([first, list(range(8, 13)), list(range(13, 16))]):
        stem = f"{prefix}-{number:05d}"
        write_shard(stem + ".rec", stem + ".idx", [(k, records[k]) for k in keys])
        entries.append({"rec": os.path.basename(stem + ".rec"),
                        "idx": os.path.basename(stem + ".idx"), "records": len(keys),
                        "rec_bytes": os.path.getsize(stem + ".rec")})  # fmt: skip
    doc = {"format": "rectool-manifest", "format_version": 1, "layout": "insightface",
           "shards": entries, "totals": {"records": 16}}  # fmt: skip
    with open(f"{prefix}.manifest.json", "w") as f:
        json.dump(doc, f)
    return prefix


def everything(ds):
    """What a user reads of a dataset, a pickled copy and negative indices included."""
    n, copy = len(ds), pickle.loads(pickle.dumps(ds))
    return {
        "len": n,
        "samples": read_all(ds),
        "copy": read_all(copy),
        "places": [ds.location(i) for i in range(n)],
        "negative": [ds.location(-i) for i in range(1, n + 1)],
        "labels": np.asarray(ds.labels).tolist(),
        "copy labels": np.asarray(copy.labels).tolist(),
    }


def package_views(ds):
    """What only the package's dataset adds: shard numbers, identity ranges, layout."""
    ranges = ds.identity_ranges
    return {
        "shard ids": np.asarray(ds.shard_ids).tolist(),
        "ranges": None if ranges is None else ranges.tolist(),
        "layout": ds.layout,
    }


@pytest.mark.parametrize("kind", ["images", "insightface", "insightface header first", "vectors"])
def test_every_view_of_a_pack_is_the_same_from_the_binary_index_as_from_the_text(tmp_path, kind):
    if kind == "images":
        prefix = os.fspath(tmp_path / "many")
        items = [[(k, b"img%d" % k, float(k % 7)) for k in range(s * 7, s * 7 + 7)]
                 for s in range(4)]  # fmt: skip
        write_pack(prefix, items, manifest=False)
    elif kind.startswith("insightface"):
        prefix = insightface_in_shards(tmp_path, header_first=kind != "insightface")
    else:
        prefix = os.fspath(tmp_path / "vectors")
        items = [[(k, b"v%d" % k, [float(k), float(k % 3)]) for k in range(s * 9, s * 9 + 9)]
                 for s in range(4)]  # fmt: skip
        write_pack(prefix, items)
    text = PackDataset(prefix)
    assert not text.indexed
    from_text = everything(text), package_views(text)
    indexed(prefix)
    package = PackDataset(prefix)
    assert package.indexed
    assert (everything(reader.open_dataset(prefix)), package_views(package)) == from_text
    assert everything(package) == from_text[0]
    if kind.startswith("insightface"):
        assert from_text[1]["layout"] == "insightface" and from_text[0]["len"] == 12
        assert from_text[1]["ranges"] == [[0, 3], [3, 7], [7, 12]]


def test_insightface_keys_out_of_order_index_as_in_order(tmp_path):
    pictures = [jpeg_bytes(k, 8, 8) for k in range(8)]
    ordered, shuffled = tmp_path / "ordered", tmp_path / "shuffled"
    for folder in (ordered, shuffled):
        folder.mkdir()
        expected, ranges = write_insightface(
            folder / "train.rec", folder / "train.idx", [3, 1, 4], lambda k: pictures[k - 1]
        )
    lines = (shuffled / "train.idx").read_bytes().splitlines(keepends=True)
    (shuffled / "train.idx").write_bytes(b"".join(lines[::-1]))
    indexed(ordered), indexed(shuffled)
    a, b = (reader.open_dataset(f / "train") for f in (ordered, shuffled))
    assert read_all(a) == read_all(b) == [(s.image, s.label) for s in expected]
    assert PackDataset(shuffled).identity_ranges.tolist() == [list(r) for r in ranges]


def test_labels_across_chunks_match_the_headers_with_a_split_record(tmp_path):
    n = (1 << 20) + 50  # past the first chunk of 2**20 records that labels are gathered in
    rec, idx = tmp_path / "big.rec", tmp_path / "big.idx"
    payload = struct.pack("<I", 0xCED7230A) * 2  # aligned magic words: a record split in parts
    split = frame(image_record(b"abcd" + payload, 3.5, 1 << 20))
    with open(rec, "wb") as f:  # 36-byte records written with numpy, one split among them
        words = np.zeros((n, 9), "<u4")
        words[:, 0], words[:, 1] = 0xCED7230A, 28
        words[:, 3] = (np.arange(n) % 1000).astype(np.float32).view("<u4")
        words[:, 4] = np.arange(n)
        f.write(words[: 1 << 20].tobytes() + split + words[(1 << 20) + 1 :].tobytes())
    offsets = np.arange(n, dtype=np.int64) * 36
    offsets[(1 << 20) + 1 :] += len(split) - 36
    with open(idx, "w") as f:
        f.writelines(f"{k}\t{o}\n" for k, o in enumerate(offsets.tolist()))
    indexed(rec)
    ds = reader.open_dataset(tmp_path / "big")
    expected = (np.arange(n) % 1000).astype(np.float32)
    expected[1 << 20] = 3.5
    assert ds.labels.dtype == np.float32 and np.array_equal(ds.labels, expected)
    assert ds.raw(1 << 20) == (b"abcd" + payload, 3.5)
    assert np.array_equal(ds.offsets, offsets)


def test_labels_of_different_widths_cannot_be_indexed(tmp_path):
    write_pack(tmp_path / "mixed", [[(1, b"a", 1.0), (2, b"b", [1.0, 2.0])]], manifest=False)
    result = invoke("index", tmp_path / "mixed")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path}/mixed: the records hold labels of different widths; a binary index "
        "holds one float32 label, or one vector width, a sample\n"
    )
    assert not (tmp_path / "mixed.manifest.json").exists()


def test_an_idx_naming_a_key_twice_is_refused(tmp_path):
    """MXNet reads a repeated key's last line, DALI every line: no one index says which record
    the key is, so `rectool index` refuses rather than write one `verify` would reject."""
    write_pack(tmp_path / "p", [[(1, b"a", 0.0), (2, b"b", 0.0), (3, b"c", 1.0)]], manifest=False)
    lines = (tmp_path / "p.idx").read_text().splitlines()
    (tmp_path / "p.idx").write_text("\n".join([*lines, lines[1]]) + "\n")
    result = invoke("index", tmp_path / "p.rec")
    assert result.exit_code == 1
    assert "key 2 is on more than one line of the .idx files" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["p.idx", "p.rec"]  # nothing written


def test_an_insightface_record_0_naming_keys_past_any_index_is_a_clean_error(tmp_path):
    folder = tmp_path / "ins"
    folder.mkdir()
    rec, idx = folder / "train.rec", folder / "train.idx"
    write_insightface(rec, idx, [2, 3], lambda k: b"face%d" % k)
    offset = int(
        next(line for line in idx.read_text().splitlines() if line.startswith("0\t")).split()[1]
    )
    with open(rec, "r+b") as f:  # record 0's label pair [N + 1, N + 1 + K] -> [1e30, 1e30 + 5]
        f.seek(offset + 8 + 24)
        f.write(struct.pack("<ff", 1e30, 1e30 + 5))
    for args in (["index", folder], ["index", "--json", folder]):
        result = invoke(*args)
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output
    assert json.loads(result.stdout)["exit"] == 1
    assert not (folder / "train.manifest.json").exists()
