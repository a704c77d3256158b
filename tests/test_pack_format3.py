"""Every writer of a pack writes format 3: `pack`, `repack`, `--finalize` and Dask.

Each pack is read twice: by hand (the `.idx` text parsed, the `.rec` framing and image headers
unpacked with `struct`) and through the core reader (`rectool.reader.open_dataset`), which
maps the `.npy` index the writer wrote. Every sample must give the same bytes, label, key
and offset both ways, and every index file must be what the manifest names (size, xxh3-128).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree
from helpers.rec_files import NAMES, idx_lines, make_pack

from rectool.cli import cli
from rectool.packer.listfile import write_label_map
from rectool.packer.packing import PackOptions, finalize_pack, pack_images
from rectool.reader import open_dataset
from rectool.repack.pipeline import RepackOptions, repack

MAGIC = 0xCED7230A


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def record_at(data, offset):
    """Return the record whose first part starts at `offset`, its parts rejoined, by hand."""
    parts = []
    while True:
        magic, lrec = struct.unpack_from("<II", data, offset)
        assert magic == MAGIC, f"no record at byte {offset}"
        cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
        parts.append(data[offset + 8 : offset + 8 + length])
        offset += 8 + length + (-length % 4)
        if cflag in (0, 3):
            return struct.pack("<I", MAGIC).join(parts)


def header_of(record):
    """Return (label: a float or a list of floats, image bytes) of an image record."""
    flag, label, _, _ = struct.unpack_from("<IfQQ", record)
    if flag:
        return list(struct.unpack_from(f"<{flag}f", record, 24)), record[24 + 4 * flag :]
    return label, record[24:]


def read_by_hand(manifest_path):
    """Return the samples of a pack [(rec, offset, key, image, label)] in reader order, and its
    identity ranges (insightface: [first, end) of samples) or None."""
    manifest = json.loads(Path(manifest_path).read_text())
    folder = Path(manifest_path).parent
    samples, ranges = [], None
    for shard in manifest["shards"]:
        rec = folder / shard["rec"]
        data = rec.read_bytes()
        lines = idx_lines(folder / shard["idx"])
        if manifest["layout"] == "insightface":
            head = dict(lines)
            first, end = header_of(record_at(data, head[0]))[0]
            lines = [(k, o) for k, o in lines if 1 <= k < first]
            ranges = [
                [int(x) - 1 for x in header_of(record_at(data, head[k]))[0]]
                for k in range(int(first), int(end))
            ]
        for key, offset in lines:
            label, image = header_of(record_at(data, offset))
            samples.append((str(rec), offset, key, image, label))
    return samples, ranges


def check_format_3(manifest_path, layout="images"):
    """Check the pack's manifest and index files, then read every sample both ways."""
    manifest = json.loads(Path(manifest_path).read_text())
    folder = Path(manifest_path).parent
    assert (manifest["format_version"], manifest["layout"]) == (3, layout)
    samples, ranges = read_by_hand(manifest_path)
    index = manifest["index"]
    names = ["offsets", "keys", "labels"] + (["identity_ranges"] if ranges else [])
    assert sorted(k for k in index if k != "samples") == sorted(names)
    for name in names:
        data = (folder / index[name]["file"]).read_bytes()
        assert index[name]["file"] == Path(manifest_path).name.replace(
            ".manifest.json", f".{name}.npy"
        )
        assert index[name]["bytes"] == len(data)
        assert index[name]["xxh3_128"] == xxhash.xxh3_128_hexdigest(data)
    load = {n: np.load(folder / index[n]["file"], allow_pickle=False) for n in names}
    assert load["offsets"].tolist() == [s[1] for s in samples]
    assert load["keys"].tolist() == [s[2] for s in samples]
    if ranges is not None:
        assert load["identity_ranges"].tolist() == ranges
    per_shard = [sum(s[0].endswith("/" + sh["rec"]) for s in samples) for sh in manifest["shards"]]
    assert index["samples"] == per_shard

    ds = open_dataset(manifest_path)  # the core reader: the mapped index, nothing else
    assert len(ds) == len(samples) > 0
    for i, (rec, offset, key, image, label) in enumerate(samples):
        got_image, got_label = ds.raw(i)
        assert bytes(got_image) == image
        assert np.asarray(got_label).tolist() == label
        assert ds.location(i) == (rec, offset, key)
    assert ds.labels.tolist() == [s[4] for s in samples]
    ds.close()
    return manifest, samples


def vector_tree(tmp_path):
    """A tree whose list gives each image two labels (`--pack-label` writes them all)."""
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a", "b"], 3)
    vectors = [(i, [float(label), 0.5 * i], rel) for i, label, rel in items]
    return root, write_list(tmp_path / "v.lst", vectors)


# -- pack ----------------------------------------------------------------------------------------


def test_pack_writes_format_3_shard_by_shard(tmp_path):
    pack = make_pack(tmp_path, shard_records=5)
    manifest, samples = check_format_3(pack.manifest)
    assert len(manifest["shards"]) == 3 and len(samples) == 12
    names = tmp_path / "out" / "faces.identities.json"
    assert json.loads(names.read_text()) == {str(i): n for i, n in enumerate(NAMES)}
    assert manifest["identities"]["count"] == 3


def test_pack_writes_format_3_for_the_insightface_layout(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    _, samples = check_format_3(pack.manifest, "insightface")
    assert [s[2] for s in samples] == list(range(1, 13))  # the images: keys 1..N only


def test_pack_writes_label_vectors_as_one_row_a_sample(tmp_path):
    root, lst = vector_tree(tmp_path)
    pack_images(lst, root, tmp_path / "out" / "v", PackOptions(pack_label=True))
    _, samples = check_format_3(tmp_path / "out" / "v.manifest.json")
    assert samples[1][4] == [0.0, 0.5]


def test_the_cli_pack_writes_format_3(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a", "b"], 2)
    lst = write_list(tmp_path / "c.lst", items)
    result = invoke("pack", lst, root, tmp_path / "out" / "c", "-q", "--shard-records", "3")
    assert result.exit_code == 0, result.output
    check_format_3(tmp_path / "out" / "c.manifest.json")


# -- repack --------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["images", "insightface"])
def test_repack_writes_format_3(tmp_path, layout):
    pack = make_pack(tmp_path)
    options = RepackOptions(layout=layout, shard_records=None if layout != "images" else 5)
    result = repack([pack.manifest], tmp_path / "re" / "r", options)
    _, samples = check_format_3(result.manifest_path, layout)
    assert len(samples) == 12
    assert json.loads((tmp_path / "re" / "r.identities.json").read_text()) == {
        str(i): n for i, n in enumerate(NAMES)
    }


def test_repack_of_a_format_3_source_plans_without_opening_a_shard(tmp_path, monkeypatch):
    """Planning takes the labels from the source's mapped index: a `.rec` opened before the
    plan is made (to read its headers) fails this test."""
    from rectool.reader import RecordFile
    from rectool.repack import pipeline

    pack = make_pack(tmp_path)
    planned, opened = [], []
    plan_repack, open_rec = pipeline.plan_repack, RecordFile.open

    def spy_plan(*args, **kwargs):
        planned.append(True)
        return plan_repack(*args, **kwargs)

    def spy_open(self):
        if not planned:
            opened.append(self.path)
        return open_rec(self)

    monkeypatch.setattr(pipeline, "plan_repack", spy_plan)
    monkeypatch.setattr(RecordFile, "open", spy_open)
    result = repack([pack.manifest], tmp_path / "re" / "r", RepackOptions(sample=0.5, seed=1))
    assert planned and result.images > 0
    assert opened == []
    check_format_3(result.manifest_path)


# -- --only-shard + --finalize, and Dask ---------------------------------------------------------


def test_finalize_writes_format_3(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a", "b", "c"], 3)
    lst = write_list(tmp_path / "f.lst", items)
    write_label_map(tmp_path / "f.labels.tsv", {0: "a", 1: "b", 2: "c"})
    prefix = tmp_path / "out" / "f"
    for number in (2, 0, 1):
        pack_images(lst, root, prefix, PackOptions(shard_records=4), only_shard=number)
    assert not (tmp_path / "out" / "f.offsets.npy").exists()  # only the finalize writes it
    result = finalize_pack(lst, root, prefix, PackOptions(shard_records=4))
    manifest, samples = check_format_3(result.manifest_path)
    assert len(manifest["shards"]) == 3 and len(samples) == 9
    assert manifest["identities"]["count"] == 3


def test_dask_writes_format_3(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    from rectool.packer.distributed import pack_on_dask

    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a", "b"], 4)
    lst = write_list(tmp_path / "d.lst", items)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        result = pack_on_dask(
            lst, root, tmp_path / "out" / "d", PackOptions(shard_records=3),
            scheduler=cluster.scheduler_address,
        )  # fmt: skip
    manifest, samples = check_format_3(result.manifest_path)
    assert len(manifest["shards"]) == 3 and len(samples) == 8


# -- --overwrite: the index is part of the pack's committed files --------------------------------


def pack_files(folder):
    """Return the names of the files in `folder` (no lock, no hidden staging, and not the
    insightface layout's `property`, a file of the folder rather than of the pack)."""
    skip = ("property",)
    return sorted(
        n for n in os.listdir(folder) if not n.endswith(".lock") and n[0] != "." and n not in skip
    )


@pytest.mark.parametrize("command", ["pack", "repack"])
def test_overwrite_leaves_no_file_of_the_old_pack_that_the_new_one_lacks(tmp_path, command):
    """An insightface pack with names, replaced by an images pack without: its identity
    ranges and identities file go with the rest of the old pack."""
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a", "b", "c"], 2)
    lst = write_list(tmp_path / "faces.lst", items)
    write_label_map(tmp_path / "faces.labels.tsv", {0: "a", 1: "b", 2: "c"})
    prefix = tmp_path / "out" / "faces"
    old = invoke("pack", lst, root, prefix, "-q", "--layout", "insightface")
    assert old.exit_code == 0, old.output
    before = pack_files(prefix.parent)
    assert {"faces.identity_ranges.npy", "faces.identities.json"} <= set(before)
    if command == "pack":
        bare = write_list(tmp_path / "bare.lst", items)  # no label map beside it
        new = invoke("pack", bare, root, prefix, "-q", "--overwrite")
    else:
        plain = tmp_path / "plain" / "p"
        assert (
            invoke("pack", write_list(tmp_path / "p.lst", items), root, plain, "-q").exit_code == 0
        )
        new = invoke("repack", plain, prefix, "-q", "--overwrite")
    assert new.exit_code == 0, new.output
    after = pack_files(prefix.parent)
    wanted = ["faces.idx", "faces.keys.npy", "faces.labels.npy", "faces.manifest.json"]
    wanted += ["faces.offsets.npy", "faces.rec", "faces.rec.crc"]
    extra = ["faces.failures.jsonl"]
    if command == "repack":
        extra += ["faces.relabel.tsv", "faces.report.json"]
    assert after == sorted(wanted + extra)
    manifest, samples = check_format_3(f"{prefix}.manifest.json")
    assert manifest["identities"] is None and len(samples) == 6


def test_overwrite_by_a_smaller_pack_replaces_every_index_file(tmp_path):
    """A pack of 12 samples replaced by one of 4: each index array is the new pack's."""
    big = make_pack(tmp_path, shard_records=5)
    prefix = Path(str(big.manifest)[: -len(".manifest.json")])
    root = tmp_path / "small"
    items = write_pack_tree(root, ["x"], 4)
    lst = write_list(tmp_path / "small.lst", items)
    result = invoke("pack", lst, root, prefix, "-q", "--overwrite")
    assert result.exit_code == 0, result.output
    manifest, samples = check_format_3(big.manifest)
    assert len(samples) == 4 and len(manifest["shards"]) == 1
    assert manifest["identities"] is None
    assert not list(prefix.parent.glob("faces-0000*"))
    assert not (prefix.parent / "faces.identities.json").exists()


@pytest.mark.parametrize("limit", ["bytes", "values"])
def test_identity_names_rectool_could_not_read_back_fail_the_pack(tmp_path, monkeypatch, limit):
    """The names are written only as a file `read_identities` reads: a pack whose names pass
    its bounds fails, naming the file, and leaves no pack that could not be read."""
    from rectool.errors import RectoolError
    from rectool.format import binindex

    if limit == "bytes":
        monkeypatch.setattr(binindex, "MAX_IDENTITIES_BYTES", 20)
    else:
        monkeypatch.setattr(binindex, "json_values", _json_values_at_most(4))
    with pytest.raises(RectoolError, match="3 identity names cannot be written as a file that"):
        make_pack(tmp_path)
    assert not (tmp_path / "out" / "faces.manifest.json").exists()
    assert not (tmp_path / "out" / "faces.identities.json").exists()


def _json_values_at_most(limit):
    from rectool import reader

    def check(data, path, what):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(reader, "MAX_JSON_VALUES", limit)
            return reader.json_values(data, path, what)

    return check
