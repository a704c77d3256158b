"""`rectool report` and `rectool repack` of a remote pack's URL (s3:// on the S3 server,
http:// on the range server): they read a local copy, as `verify` and `info` do, and give what
they give for the local pack; repack refuses a shard whose bytes are not the manifest's."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from rectool.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_report_of_a_url_shows_what_the_report_of_the_local_pack_shows(
    remote_pack, tmp_path, cache
):
    remote = invoke("report", remote_pack.url, "--sheet", tmp_path / "remote.png", "--json")
    assert remote.exit_code == 0, remote.output
    local = invoke("report", remote_pack.local, "--sheet", tmp_path / "local.png", "--json")
    assert local.exit_code == 0, local.output
    got, want = json.loads(remote.stdout), json.loads(local.stdout)
    for doc in (got, want):
        doc.pop("sheet"), doc.pop("seconds")
    assert got == want and got["images"] == 12
    assert (tmp_path / "remote.png").read_bytes() == (tmp_path / "local.png").read_bytes()
    assert (cache / "mirror").is_dir()


def test_repack_of_a_url_writes_the_pack_repack_of_the_local_pack_writes(
    remote_pack, tmp_path, cache
):
    args = ["--order", "shuffle", "--seed", "3", "--shard-records", "5", "-q"]
    remote = invoke("repack", remote_pack.url, tmp_path / "a" / "out", *args)
    assert remote.exit_code == 0, remote.output
    local = invoke("repack", remote_pack.local, tmp_path / "b" / "out", *args)
    assert local.exit_code == 0, local.output
    written = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert written == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in written:
        if name.endswith((".rec", ".idx")):
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    manifest = json.loads((tmp_path / "a" / "out.manifest.json").read_text())
    assert manifest["sources"] == [remote_pack.url]  # the URL, not the copy's path
    # Read from a copy of its own, not from the shard cache that training shares (where a
    # bounded cache of another process could evict a shard while it is copied).
    assert (cache / "mirror").is_dir() and not (cache / "packs").exists()


def _damage(s3, s3_pack, name):
    data = bytearray((s3_pack.folder / name).read_bytes())
    data[200] ^= 0xFF
    bucket = s3_pack.url.split("/")[2]
    s3.client().put_object(Bucket=bucket, Key=f"packs/{name}", Body=bytes(data))
    return bucket


def test_repack_refuses_a_remote_shard_whose_bytes_differ_from_the_manifest(
    s3, s3_pack, tmp_path, cache
):
    bucket = _damage(s3, s3_pack, "faces-00001.rec")
    result = invoke("repack", s3_pack.url, tmp_path / "repacked" / "r", "-q")
    assert result.exit_code == 1
    assert f"s3://{bucket}/packs/faces-00001.rec: its 3" in result.output
    assert "not used" in result.output
    assert not (tmp_path / "repacked").exists()


def test_repack_fetches_again_a_damaged_copy_that_verify_downloaded(s3, s3_pack, tmp_path, cache):
    bucket = _damage(s3, s3_pack, "faces-00001.rec")
    assert invoke("verify", s3_pack.url, "-q").exit_code == 1  # the damaged copy, kept
    good = (s3_pack.folder / "faces-00001.rec").read_bytes()
    s3.client().put_object(Bucket=bucket, Key="packs/faces-00001.rec", Body=good)
    result = invoke("repack", s3_pack.url, tmp_path / "repacked" / "r", "--order", "source", "-q")
    assert result.exit_code == 0, result.output
    local = invoke("repack", s3_pack.local, tmp_path / "here" / "r", "--order", "source", "-q")
    assert local.exit_code == 0, local.output
    assert (tmp_path / "repacked" / "r.rec").read_bytes() == (
        tmp_path / "here" / "r.rec"
    ).read_bytes()


def test_a_copy_holds_the_binary_index_and_identity_names_and_the_core_opens_it(remote_pack, cache):
    from rectool import reader
    from rectool.remote.mirror import local_copy

    copy = local_copy(remote_pack.url, check=True)
    folder = os.path.dirname(copy)
    for name in ("offsets.npy", "keys.npy", "labels.npy", "identities.json"):
        with open(os.path.join(folder, f"faces.{name}"), "rb") as f:
            assert f.read() == (remote_pack.folder / f"faces.{name}").read_bytes()
    ds, local = reader.open_dataset(copy), reader.open_dataset(remote_pack.local)
    assert [bytes(ds.raw(i)[0]) for i in range(12)] == [bytes(local.raw(i)[0]) for i in range(12)]
    assert ds.labels.tolist() == [0.0] * 4 + [1.0] * 4 + [2.0] * 4


def test_repack_refuses_a_remote_index_array_whose_bytes_differ_from_the_manifest(
    s3, s3_pack, tmp_path, cache
):
    data = bytearray((s3_pack.folder / "faces.labels.npy").read_bytes())
    data[-1] ^= 0x40  # the last label's sign
    bucket = s3_pack.url.split("/")[2]
    s3.client().put_object(Bucket=bucket, Key="packs/faces.labels.npy", Body=bytes(data))
    result = invoke("repack", s3_pack.url, tmp_path / "repacked" / "r", "-q")
    assert result.exit_code == 1
    assert f"s3://{bucket}/packs/faces.labels.npy: its {len(data)} bytes" in result.output
    assert "not used" in result.output
    assert not (tmp_path / "repacked").exists()


def test_the_report_page_of_a_url_names_the_url_not_the_cache_copy(remote_pack, tmp_path, cache):
    result = invoke("report", remote_pack.url, "-o", tmp_path / "page.html", "--verify")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "page.html").read_text()
    folder = remote_pack.url.rsplit("/", 1)[0]
    assert f"<code>{remote_pack.url}</code>" in page  # the target, and its manifest
    assert f"<code>{folder}/faces.failures.jsonl</code>" in page
    assert str(cache) not in page


def test_drop_overlap_takes_the_url_of_a_pack_as_its_local_pack(remote_pack, tmp_path, cache):
    from helpers.rec_files import make_pack

    source = make_pack(tmp_path / "src", shard_records=5).manifest  # the same 12 images
    runs = [
        invoke("repack", source, tmp_path / out / "train", "--drop-overlap", target, "--json")
        for out, target in (("a", remote_pack.url), ("b", remote_pack.local))
    ]
    assert [r.exit_code for r in runs] == [0, 0], runs[0].output
    remote, local = (json.loads(r.stdout) for r in runs)
    assert remote["removed"] == local["removed"] == {"duplicate": 0, "overlap": 12}
    assert remote["steps"][f"overlap:{remote_pack.url}"] == 12  # named by its URL


def test_resume_options_keep_a_drop_overlap_url_as_given(tmp_path, monkeypatch):
    # --resume compares these options; a URL made "absolute" as a path would read
    # "<cwd>/https:/host/..." and change with the folder repack was started from.
    from rectool.repack.options import RepackOptions

    url = "https://127.0.0.1:9/sets/faces.manifest.json"
    monkeypatch.chdir(tmp_path)
    options = RepackOptions(drop_overlap=(url, "s3://bucket/lfw.bin", "lfw.bin"))
    assert options.byte_options()["drop_overlap"] == [
        url,
        "s3://bucket/lfw.bin",
        str(tmp_path / "lfw.bin"),
    ]


def _damage_at_url(remote_pack, request, name):
    """Flip a byte of the object `name` where the pack is served (the bucket, or the HTTP
    server's folder): the object itself damaged, not the cache's copy of it."""
    if remote_pack.url.startswith("s3://"):
        _damage(request.getfixturevalue("s3"), remote_pack, name)
    else:
        path = remote_pack.folder / name
        data = bytearray(path.read_bytes())
        data[200] ^= 0xFF
        path.write_bytes(bytes(data))


def test_verify_of_a_url_names_the_url_not_the_cache_copy(remote_pack, cache, request):
    # The object at the URL damaged (a copy damaged in the cache is fetched again instead:
    # tests/adversarial/test_remote_cache_trust.py).
    _damage_at_url(remote_pack, request, "faces-00001.rec")
    shard = remote_pack.url.rsplit("/", 1)[0] + "/faces-00001.rec"
    text = invoke("verify", remote_pack.url)
    (copy,) = (cache / "mirror").glob("*/faces-00001.rec")

    def cache_paths(text):
        # Only the note that says where the copy was downloaded names the cache folder.
        note = f"{remote_pack.url}: reading a copy downloaded to {copy.parent}\n"
        return str(cache) in text.replace(note, "", 1)

    assert text.exit_code == 1, text.output
    assert f"Verified {remote_pack.url}: " in text.stdout
    assert f"checksum-mismatch: {shard}: " in text.stdout
    assert not cache_paths(text.stdout) and not cache_paths(text.stderr)

    doc = invoke("verify", remote_pack.url, "--json")
    assert doc.exit_code == 1, doc.output
    report = json.loads(doc.stdout)
    assert report["targets"] == [remote_pack.url]
    assert shard in [p["path"] for p in report["problems"]]
    assert shard in [s["rec"] for s in report["shards"]]
    assert not cache_paths(doc.stdout) and not cache_paths(doc.stderr)


def test_the_paths_of_a_copy_are_shown_by_the_url_without_its_credentials():
    from rectool.commands.conventions import named_by_urls
    from rectool.inspect.verify import Problem, VerifyReport

    url = "https://me:secret@host/sets/faces.manifest.json?X-Amz-Signature=abc"
    copy = "/cache/mirror/k/faces.manifest.json"
    shown_as = named_by_urls(["here/a.rec", url], ["here/a.rec", copy])
    rec = "/cache/mirror/k/faces-00000.rec"
    problem = Problem("missing-file", rec[:-4] + ".idx", None, None, f"rebuild it from {rec}")
    report = VerifyReport(["here/a.rec", copy], problems=[problem]).renamed(shown_as)
    assert report.targets == ["here/a.rec", "https://host/sets/faces.manifest.json"]
    assert report.problems == [
        Problem(
            "missing-file",
            "https://host/sets/faces-00000.idx",
            None,
            None,
            "rebuild it from https://host/sets/faces-00000.rec",
        )
    ]
    assert named_by_urls(["here/a.rec"], ["here/a.rec"]) is None


def test_the_report_page_names_the_url_in_the_problems_verify_found(
    remote_pack, tmp_path, cache, request
):
    _damage_at_url(remote_pack, request, "faces-00001.rec")
    result = invoke("report", remote_pack.url, "-o", tmp_path / "page.html", "--verify")
    page = (tmp_path / "page.html").read_text()
    assert 'id="verify-problems"' in page, result.output
    assert remote_pack.url.rsplit("/", 1)[0] + "/faces-00001.rec" in page
    assert str(cache) not in page


def test_info_of_a_url_names_the_url_never_its_cache_copy(remote_pack, cache):
    # Issue 38: `info s3://...` titled its answer with the local copy's path.
    text = invoke("info", remote_pack.url)
    assert text.exit_code == 0, text.output
    (copy,) = (cache / "mirror").glob(f"*/{os.path.basename(remote_pack.url)}")
    note = f"{remote_pack.url}: reading a copy downloaded to {copy.parent}\n"
    assert remote_pack.url in text.stdout
    assert str(cache) not in text.stdout and str(cache) not in text.stderr.replace(note, "", 1)

    doc = invoke("info", remote_pack.url, "--json")
    assert doc.exit_code == 0, doc.output
    assert json.loads(doc.stdout)["target"] == remote_pack.url
    assert str(cache) not in doc.stdout
