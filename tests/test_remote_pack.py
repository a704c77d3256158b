"""`rectool pack` to an s3:// OUT_PREFIX: staged locally, uploaded shards first and manifest
last; what lands in the bucket is the local pack, byte for byte, and reads back the same."""

from __future__ import annotations

import json

from click.testing import CliRunner
from helpers.servers import no_wait

from rectool import open_dataset
from rectool.cli import cli
from rectool.remote import Retry


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_pack_to_s3_uploads_the_local_pack_byte_for_byte_manifest_last(
    s3, small_tree, tmp_path, monkeypatch
):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    s3.client().create_bucket(Bucket="packed")
    local = tmp_path / "local" / "faces"
    args = [small_tree.list_path, small_tree.root]
    assert invoke("pack", *args, local, "--shard-records", "5", "-q").exit_code == 0
    result = invoke("pack", *args, "s3://packed/out/faces", "--shard-records", "5", "-q")
    assert result.exit_code == 0, result.output
    objects = s3.objects("packed", "out/")
    files = {p.name: p.read_bytes() for p in local.parent.iterdir()}
    assert sorted(objects) == sorted(f"out/{name}" for name in files)
    for name, data in files.items():
        if not name.endswith(".manifest.json"):
            assert objects[f"out/{name}"] == data, name
    remote, here = (
        json.loads(d) for d in (objects["out/faces.manifest.json"], files["faces.manifest.json"])
    )
    assert remote["shards"] == here["shards"] and remote["totals"] == here["totals"]
    # Uploaded in order: the manifest after every other file.
    assert list(s3.faults.puts)[-1] == "faces.manifest.json"
    assert not (tmp_path / "cache" / "staging").exists() or not any(
        (tmp_path / "cache" / "staging").iterdir()
    )
    ds = open_dataset(
        "s3://packed/out/faces.manifest.json",
        cache_dir=str(tmp_path / "read"),
        retry=Retry(sleep=no_wait),
    )
    mine = open_dataset(str(local))
    assert [bytes(ds.raw(i)[0]) for i in range(len(ds))] == [
        bytes(mine.raw(i)[0]) for i in range(len(mine))
    ]


def test_pack_to_s3_refuses_resume_and_shard_tasks(s3, small_tree):
    result = invoke("pack", small_tree.list_path, small_tree.root, "s3://b/x", "--resume")
    assert result.exit_code == 2 and "packed in one run" in result.output


def test_verify_and_info_take_the_url_of_a_remote_pack(s3, s3_pack, tmp_path, monkeypatch):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    result = invoke("verify", s3_pack.url, "-q")
    assert result.exit_code == 0, result.output
    info = invoke("info", s3_pack.url, "--json")
    assert info.exit_code == 0, info.output
    assert json.loads(info.stdout)["records"] == 12


def test_verify_of_a_url_reports_a_damaged_shard_by_name(s3, s3_pack, tmp_path, monkeypatch):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    damaged = bytearray((s3_pack.folder / "faces-00001.rec").read_bytes())
    damaged[200] ^= 0xFF
    bucket = s3_pack.url.split("/")[2]
    s3.client().put_object(Bucket=bucket, Key="packs/faces-00001.rec", Body=bytes(damaged))
    result = invoke("verify", s3_pack.url)
    assert result.exit_code == 1
    assert "faces-00001.rec" in result.output


def staging_left(cache):
    staging = cache / "staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def test_pack_to_s3_names_the_uploaded_pack_in_its_summary(s3, small_tree, tmp_path, monkeypatch):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    s3.client().create_bucket(Bucket="named")
    args = [small_tree.list_path, small_tree.root, "s3://named/out/faces", "--shard-records", "5"]
    result = invoke("pack", *args, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["manifest"] == "s3://named/out/faces.manifest.json"
    assert doc["failures_file"] == "s3://named/out/faces.failures.jsonl"
    assert doc["shards"][0] == "s3://named/out/faces-00000.rec"


def test_repack_to_s3_uploads_the_local_repack_byte_for_byte_manifest_last(
    s3, s3_pack, tmp_path, monkeypatch
):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    s3.client().create_bucket(Bucket="repacked")
    args = ["--order", "shuffle", "--seed", "2", "--shard-records", "5"]
    local = tmp_path / "here" / "train"
    assert invoke("repack", s3_pack.local, local, *args, "-q").exit_code == 0
    s3.faults.reset()
    result = invoke("repack", s3_pack.url, "s3://repacked/out/train", *args, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["manifest"] == "s3://repacked/out/train.manifest.json"
    assert doc["report"] == "s3://repacked/out/train.report.json"
    objects = s3.objects("repacked", "out/")
    files = {p.name: p.read_bytes() for p in local.parent.iterdir()}
    assert sorted(objects) == sorted(f"out/{name}" for name in files)
    for name, data in files.items():
        if name.endswith((".rec", ".idx", ".crc", ".labels.tsv")):  # (others name the source)
            assert objects[f"out/{name}"] == data, name
    remote = json.loads(objects["out/train.manifest.json"])
    here = json.loads(files["train.manifest.json"])
    assert remote["shards"] == here["shards"] and remote["totals"] == here["totals"]
    assert list(s3.faults.puts)[-1] == "train.manifest.json"
    assert staging_left(tmp_path / "cache") == []


def test_repack_to_s3_refuses_resume(s3, s3_pack):
    result = invoke("repack", s3_pack.local, "s3://b/x", "--resume")
    assert result.exit_code == 2 and "repacked in one run" in result.output


def test_an_interrupted_repack_to_s3_uploads_nothing_and_says_so(
    s3, s3_pack, tmp_path, monkeypatch
):
    from rectool.doors import output

    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    s3.client().create_bucket(Bucket="stopped")

    def interrupt(step, path):
        if step == "create" and path.endswith("train-00001.rec.partial"):
            raise KeyboardInterrupt

    output.set_fault_hook(interrupt)
    try:
        result = invoke("repack", s3_pack.local, "s3://stopped/t/train", "--shard-records", "5")
    finally:
        output.set_fault_hook(None)
    assert result.exit_code == 130
    assert "no pack was written to s3://stopped/t/train" in result.output
    assert "--resume" not in result.output
    assert "t/train.manifest.json" not in s3.objects("stopped")
    assert staging_left(tmp_path / "cache") == []
