"""`rectool index TARGET --into FOLDER`: the manifest and binary index of a read-only dataset,
written into another folder with a link there to each of the pack's files; the reader,
`verify`, `info` and `repack` read the pack from FOLDER while MXNet reads the originals, and
nothing is ever written where the dataset is."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import write_insightface, write_pack
from helpers.image_files import jpeg_bytes
from helpers.mxnet_oracle import MX_FACE_DATASET, MX_READ_ALL, run_mxnet

from rectool import reader
from rectool.cli import cli
from rectool.dataset.packs import PackDataset
from rectool.doors import output
from rectool.format.binindex import read_identities


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def folder_state(folder):
    """Everything that says a folder was written: its own mtime and every entry in it, hidden
    ones included (name, kind, inode, mtime, bytes)."""
    entries = {}
    for name in sorted(os.listdir(folder)):
        st = os.lstat(os.path.join(folder, name))
        data = open(os.path.join(folder, name), "rb").read() if stat.S_ISREG(st.st_mode) else None
        entries[name] = (stat.S_IFMT(st.st_mode), st.st_ino, st.st_mtime_ns, data)
    return os.stat(folder).st_mtime_ns, entries


def read_all(ds):
    """Every (image bytes, label) of a dataset, labels as lists or floats."""
    return [(image, np.asarray(label).tolist()) for image, label in map(ds.raw, range(len(ds)))]


@pytest.fixture
def read_only(monkeypatch):
    """Make folders read-only for rectool: mode 0555, and, since the suite may run as root
    (whom modes do not stop), the door out refuses any step under them and `os.access`
    answers as a read-only mount does. Returns `protect(folder)`."""
    protected = []
    real_access = os.access

    def access(path, mode, **kwargs):
        if mode & os.W_OK and os.path.realpath(path) in protected:
            return False
        return real_access(path, mode, **kwargs)

    def refuse(step, path):
        real = os.path.realpath(os.path.dirname(os.fspath(path)))
        if real in protected:
            raise AssertionError(f"{step} {path}: a write into a read-only folder")

    def protect(folder):
        os.chmod(folder, 0o555)
        protected.append(os.path.realpath(folder))
        return folder

    monkeypatch.setattr(os, "access", access)
    output.set_fault_hook(refuse)
    yield protect
    output.set_fault_hook(None)
    for folder in protected:
        os.chmod(folder, 0o755)


@pytest.fixture
def dataset(tmp_path, read_only):
    """A pack made by others (3 numbered shards of JPEGs, no manifest) in a read-only folder;
    returns (its prefix, its samples in reader order)."""
    source = tmp_path / "datasets"
    source.mkdir()
    pictures = [jpeg_bytes(k, 12, 10) for k in range(12)]
    shards = [[(k, pictures[k], float(k % 4)) for k in range(s * 4, s * 4 + 4)] for s in range(3)]
    samples = write_pack(source / "faces", shards, manifest=False)
    read_only(source)
    return source / "faces", samples


# --- a read-only dataset, indexed into a folder ---------------------------------------------


@pytest.mark.oracle
def test_a_read_only_dataset_is_indexed_into_a_folder_and_reads_as_mxnet_reads_it(
    tmp_path, dataset
):
    prefix, samples = dataset
    source, into = prefix.parent, tmp_path / "indexes"
    before = folder_state(source)
    refused = invoke("index", prefix)
    assert refused.exit_code == 1
    assert refused.stderr == (
        f"Error: {source}: read-only; `rectool index` writes the manifest and index beside the "
        "shards (faces.manifest.json, .npy arrays). Write them into a folder you can write "
        "with --into FOLDER: the shards stay where they are, linked from there\n"
    )
    result = invoke("index", prefix, "--into", into)
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"Wrote {into}/faces.manifest.json (no manifest before) and its index: 12 samples in 3 "
        f"shards, layout images; 6 links to the pack's files in {source}.\n"
    )
    assert folder_state(source) == before  # nothing written, renamed or touched there
    names = [f"faces-{n:05d}.{ext}" for n in range(3) for ext in ("rec", "idx")]
    assert sorted(os.listdir(into)) == sorted(
        [*names, "faces.manifest.json", *(f"faces.{a}.npy" for a in ("offsets", "keys", "labels"))]
    )
    for name in names:
        assert os.readlink(into / name) == str(source / name)  # absolute: FOLDER may move
    manifest = json.loads((into / "faces.manifest.json").read_text())
    assert manifest["links"] == {name: str(source / name) for name in names}

    expected = []
    for n in range(3):
        stem = source / f"faces-{n:05d}"
        expected += run_mxnet(MX_READ_ALL, {"rec": f"{stem}.rec", "idx": f"{stem}.idx"})
    ds = reader.open_dataset(into / "faces")
    assert read_all(ds) == [(image, label) for _, image, label, _ in expected]
    assert ds.keys.tolist() == [key for key, _, _, _ in expected] == [s.key for s in samples]
    assert ds.labels.tolist() == [label for _, _, label, _ in expected]
    assert read_all(PackDataset(into / "faces")) == read_all(ds)
    assert folder_state(source) == before


def test_verify_info_and_repack_read_the_pack_from_the_folder(tmp_path, dataset):
    prefix, samples = dataset
    into = tmp_path / "indexes"
    assert invoke("index", prefix, "--into", into).exit_code == 0
    before = folder_state(prefix.parent)
    verified = invoke("verify", into / "faces")
    assert verified.exit_code == 0, verified.output
    assert verified.stdout.endswith("Sound: no problems found.\n")
    info = invoke("info", into / "faces", "--json")
    assert info.exit_code == 0, info.output
    doc = json.loads(info.stdout)
    assert (doc["images"], doc["shards"]) == (12, 3)
    repacked = invoke("repack", into / "faces", tmp_path / "out" / "again")
    assert repacked.exit_code == 0, repacked.output
    again = reader.open_dataset(tmp_path / "out" / "again")
    assert sorted(read_all(again)) == sorted((s.image, s.label) for s in samples)
    assert folder_state(prefix.parent) == before


def test_a_replaced_original_is_refused_by_verify(tmp_path, dataset):
    prefix, _ = dataset
    into = tmp_path / "indexes"
    assert invoke("index", prefix, "--into", into).exit_code == 0
    source = prefix.parent
    os.chmod(source, 0o755)  # someone replaces a shard of the dataset (its .rec and .idx)
    other = tmp_path / "other"
    other.mkdir()
    pictures = [jpeg_bytes(k + 50, 12, 10) for k in range(4)]  # the same keys, other images
    write_pack(other / "x", [[(4 + k, pictures[k], 9.0) for k in range(4)]], manifest=False)
    for ext in ("rec", "idx"):
        os.replace(other / f"x.{ext}", source / f"faces-00001.{ext}")
    verified = invoke("verify", into / "faces")
    assert verified.exit_code == 1
    assert f"size-mismatch: {into}/faces-00001.rec: " in verified.stdout
    assert f"checksum-mismatch: {into}/faces-00001.idx: " in verified.stdout
    assert "Traceback" not in verified.output


# --- what FOLDER may already hold ------------------------------------------------------------


def test_the_same_index_again_is_left_as_it_is_and_force_writes_the_same_bytes(tmp_path, dataset):
    prefix, _ = dataset
    into = tmp_path / "indexes"
    assert invoke("index", prefix, "--into", into).exit_code == 0
    before = folder_state(into)[1]  # (the lock file comes and goes: the folder's mtime moves)
    again = invoke("index", prefix, "--into", into)
    assert again.exit_code == 0
    assert again.stderr == (
        f"{into}/faces.manifest.json: already indexed (manifest format 3); wrote nothing "
        "(--force writes the index again).\n"
    )
    assert folder_state(into)[1] == before
    forced = invoke("index", prefix, "--into", into, "--force", "--json")
    assert forced.exit_code == 0, forced.output
    doc = json.loads(forced.stdout)
    assert doc["already_indexed"] is False and doc["written"][-1] == f"{into}/faces.manifest.json"
    assert doc["written"][:6] == [f"{into}/{name}" for name in doc["links"]]
    after = folder_state(into)[1]
    assert {n: e[3] for n, e in after.items()} == {n: e[3] for n, e in before.items()}
    assert not any(name.startswith(".") for name in after)  # no staging folder left


def test_another_pack_at_the_prefix_is_replaced_only_with_overwrite(tmp_path, dataset):
    prefix, samples = dataset
    into = tmp_path / "indexes"
    into.mkdir()
    mine = write_pack(into / "faces", [[(1, b"a", 0.0)]], manifest=False)  # a pack of its own
    assert invoke("index", into / "faces").exit_code == 0
    before = folder_state(into)[1]
    refused = invoke("index", prefix, "--into", into)
    assert refused.exit_code == 1
    assert refused.stderr == (
        f"Error: {into}/faces: a pack is already there ({into}/faces.manifest.json), not an "
        f"index of {prefix}; use --overwrite to replace it, or index into another folder\n"
    )
    assert folder_state(into)[1] == before
    assert read_all(reader.open_dataset(into / "faces")) == [(s.image, s.label) for s in mine]
    result = invoke("index", prefix, "--into", into, "--overwrite")
    assert result.exit_code == 0, result.output
    assert not os.path.exists(into / "faces.rec")  # the old pack's files are gone, whole
    assert read_all(reader.open_dataset(into / "faces")) == [(s.image, s.label) for s in samples]


def test_overwrite_without_into_is_a_usage_error(tmp_path):
    write_pack(tmp_path / "p", [[(1, b"a", 0.0)]], manifest=False)
    result = invoke("index", tmp_path / "p", "--overwrite")
    assert result.exit_code == 2
    assert result.stderr.endswith(
        "Error: --overwrite goes with --into (beside the shards, use --force)\n"
    )
    assert sorted(os.listdir(tmp_path)) == ["p.idx", "p.rec"]


def test_into_the_packs_own_folder_indexes_beside_it(tmp_path):
    write_pack(tmp_path / "p", [[(1, b"a", 0.0)]], manifest=False)
    result = invoke("index", tmp_path / "p", "--into", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["links"] == {}
    assert not any(os.path.islink(tmp_path / n) for n in os.listdir(tmp_path))
    assert len(reader.open_dataset(tmp_path / "p")) == 1


def test_a_failure_before_the_commit_leaves_folder_without_a_pack(tmp_path, dataset):
    prefix, _ = dataset
    into = tmp_path / "indexes"

    def hook(step, path):
        if step == "rename" and os.fspath(path).endswith(".manifest.json"):
            raise OSError(28, "No space left on device", path)

    output.set_fault_hook(hook)
    result = invoke("index", prefix, "--into", into)
    assert result.exit_code == 1
    assert "No space left on device" in result.stderr
    assert os.listdir(into) == []  # no link, no array, no staging folder


# --- other packs: insightface, an older rectool's --------------------------------------------


@pytest.mark.oracle
def test_an_insightface_folder_reads_from_the_index_folder_as_mxface_dataset_reads_it(
    tmp_path, read_only
):
    folder = tmp_path / "faces_emore"
    folder.mkdir()
    pictures = [jpeg_bytes(k, 12, 10) for k in range(12)]
    write_insightface(
        folder / "train.rec", folder / "train.idx", [3, 5, 4], lambda k: pictures[k - 1]
    )
    read_only(folder)
    into = tmp_path / "idx"
    result = invoke("index", folder, "--into", into)
    assert result.exit_code == 0, result.output
    samples, ranges = run_mxnet(
        MX_FACE_DATASET, {"rec": str(folder / "train.rec"), "idx": str(folder / "train.idx")}
    )
    ds = reader.open_dataset(into / "train")
    assert [(int(k), *ds[n]) for n, k in enumerate(ds.keys)] == samples
    package = PackDataset(into / "train")
    assert package.indexed and package.layout == "insightface"
    assert package.identity_ranges.tolist() == ranges
    assert invoke("verify", into / "train").exit_code == 0


def test_an_older_rectool_pack_links_every_file_its_manifest_names(small_pack, read_only):
    manifest = json.loads(small_pack.manifest.read_text())
    folder = small_pack.manifest.parent
    names = read_identities(str(small_pack.manifest), manifest)
    for entry in [*manifest.pop("index").values(), manifest["identities"]]:
        if isinstance(entry, dict):
            os.unlink(folder / entry["file"])
    manifest.update(format_version=2, identities={str(k): v for k, v in names.items()})
    small_pack.manifest.write_text(json.dumps(manifest))
    read_only(folder)
    before = folder_state(folder)
    into = folder.parent / "indexes"
    doc = json.loads(invoke("index", small_pack.manifest, "--into", into, "--json").stdout)
    assert doc["previous_format_version"] == 2
    linked = ["faces.rec", "faces.idx", "faces.rec.crc", "faces.failures.jsonl"]
    assert doc["links"] == {name: str(folder / name) for name in linked}
    new = json.loads((into / "faces.manifest.json").read_text())
    assert read_identities(str(into / "faces.manifest.json"), new) == names
    assert not os.path.islink(into / "faces.identities.json")  # written, from the manifest
    verified = invoke("verify", into / "faces")
    assert verified.exit_code == 0, verified.output
    assert "checksums compared" in verified.stdout
    assert folder_state(folder) == before


# --- what the manifest's links may be, and URLs ----------------------------------------------


@pytest.mark.parametrize(
    "links", [{"faces-00000.rec": "faces.rec"}, {"../x.rec": "/x.rec"}, ["/x.rec"]]
)
def test_links_that_are_not_names_to_absolute_paths_are_refused(tmp_path, dataset, links):
    prefix, _ = dataset
    into = tmp_path / "indexes"
    assert invoke("index", prefix, "--into", into).exit_code == 0
    path = into / "faces.manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "links": links}))
    result = invoke("verify", path)
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: {path}: manifest field 'links' must be an object {{file name in the "
        "manifest's folder: absolute path}\n"
    )


@pytest.mark.parametrize("command", ["index", "index-cache"])
@pytest.mark.parametrize(
    "url", ["s3://bucket/packs/faces", "https://user:secret@host/faces.manifest.json?sig=XYZ"]
)
def test_a_url_is_refused_saying_what_to_do_instead(tmp_path, monkeypatch, command, url):
    monkeypatch.chdir(tmp_path)
    result = invoke(command, url)
    assert result.exit_code == 2
    shown = url.replace("user:secret@", "").split("?")[0]
    assert result.stderr.splitlines()[-1] == (
        f"Error: {shown}: a URL; `rectool index` reads local shards only (it writes their "
        "manifest and index beside them, or --into a local folder). Download the pack's .rec "
        "and .idx files and index the copy; a pack written by `rectool pack` or `repack` is "
        "indexed already"
    )
    assert "secret" not in result.output and "XYZ" not in result.output
    assert os.listdir(tmp_path) == []
    as_json = invoke(command, url, "--json")
    assert (as_json.exit_code, json.loads(as_json.stdout)["exit"]) == (2, 2)
