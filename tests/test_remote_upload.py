"""`pack` and `repack` to s3:// upload each shard as soon as it is finished, while the next ones
are written, and the manifest last: on the S3 server, which logs each object as it is stored
(helpers/servers.py), the manifest is never there before every shard, and a run that fails
after shard 1 leaves no manifest there. Faults are injected through the output door's hook."""

from __future__ import annotations

import _thread
import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner
from helpers.threads import blocked_in

from rectool.cli import cli
from rectool.doors import output
from rectool.remote.store import RemoteError
from rectool.remote.upload import ShardUploader

SHARD_FILES = [f"faces-0000{i}.{kind}" for i in range(4) for kind in ("rec", "idx", "rec.crc")]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def bucket(s3, tmp_path, monkeypatch, request):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    name = "up-" + format(abs(hash(request.node.nodeid)), "x")[:12]
    s3.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def at_shard_2():
    """`arm(action)`: run `action()` when shard 2's first file is created (shards 0 and 1 are
    finished then, 2 and 3 not yet written); return what it returned, in a list."""
    seen = []

    def arm(action):
        def hook(step, path):
            if step == "create" and path.endswith("-00002.rec.partial"):
                seen.append(action())

        output.set_fault_hook(hook)
        return seen

    yield arm
    output.set_fault_hook(None)


def pack(small_tree, url, *more):
    return invoke("pack", small_tree.list_path, small_tree.root, url, "--shard-records", "3", *more)


def staging_left(tmp_path):
    staging = tmp_path / "cache" / "staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def test_each_shard_is_uploaded_while_the_next_are_written_and_the_manifest_last(
    s3, bucket, small_tree, at_shard_2
):
    def uploaded_so_far():
        first = [s3.faults.wait_stored(n) for n in ("faces-00000.rec", "faces-00001.rec")]
        return first, list(s3.faults.uploaded)

    seen = at_shard_2(uploaded_so_far)
    result = pack(small_tree, f"s3://{bucket}/p/faces", "-q")
    assert result.exit_code == 0, result.output
    [(first, then)] = seen
    assert first == [True, True]  # on the server before shard 2 was begun
    assert not [n for n in then if n.startswith(("faces-00002", "faces-00003"))]
    assert "faces.manifest.json" not in then
    log = s3.faults.uploaded
    assert log[-1] == "faces.manifest.json" and log.count("faces.manifest.json") == 1
    assert set(SHARD_FILES) <= set(log[:-1])  # every shard's files stored before the manifest


def test_the_binary_index_and_identity_names_are_uploaded_before_the_manifest(
    s3, bucket, small_tree, tmp_path
):
    from rectool import open_dataset

    url = f"s3://{bucket}/p/faces"
    label_map = tmp_path / "names.tsv"
    label_map.write_text("0\talice\n1\tbob\n2\tcarol\n")
    result = pack(small_tree, url, "-q", "--labels", label_map)
    assert result.exit_code == 0, result.output
    log = s3.faults.uploaded
    index = ["faces.offsets.npy", "faces.keys.npy", "faces.labels.npy", "faces.identities.json"]
    assert set(index) <= set(log[:-1]) and log[-1] == "faces.manifest.json"
    local = invoke("pack", small_tree.list_path, small_tree.root, tmp_path / "here" / "faces",
                   "--shard-records", "3", "-q", "--labels", label_map)  # fmt: skip
    assert local.exit_code == 0, local.output
    stored = s3.objects(bucket, "p/")
    for name in index:
        assert stored[f"p/{name}"] == (tmp_path / "here" / name).read_bytes()
    ds = open_dataset(url + ".manifest.json", cache_dir=str(tmp_path / "read"))
    mine = open_dataset(str(tmp_path / "here" / "faces"))
    assert ds.indexed and ds.labels.tolist() == mine.labels.tolist()
    assert ds.identities == mine.identities == {0: "alice", 1: "bob", 2: "carol"}


def test_upload_pack_takes_the_packs_own_files_not_a_neighbours(s3, bucket, small_tree, tmp_path):
    from rectool.remote.upload import upload_pack

    here = tmp_path / "here"
    local = invoke("pack", small_tree.list_path, small_tree.root, here / "faces",
                   "--shard-records", "3", "-q")  # fmt: skip
    assert local.exit_code == 0, local.output
    for name in ("faces2.manifest.json", "faces2-00000.rec", "faces_old.rec", "facesX.txt"):
        (here / name).write_bytes(b"another pack's")
    upload_pack(here / "faces.manifest.json", f"s3://{bucket}/p/faces")
    log = s3.faults.uploaded
    assert set(SHARD_FILES) <= set(log) and log[-1] == "faces.manifest.json"
    assert [n for n in log if not n.startswith(("faces.", "faces-"))] == []


def test_repack_to_s3_uploads_each_shard_before_the_next_is_written(
    s3, bucket, small_pack, tmp_path, at_shard_2
):
    seen = at_shard_2(lambda: s3.faults.wait_stored("train-00001.idx"))
    url = f"s3://{bucket}/r/train"
    result = invoke("repack", small_pack.manifest, url, "--shard-records", "3", "-q")
    assert result.exit_code == 0, result.output
    assert seen == [True]
    assert s3.faults.uploaded[-1] == "train.manifest.json"


def test_an_upload_refused_after_shard_1_fails_the_pack_and_uploads_no_manifest(
    s3, bucket, small_tree, tmp_path
):
    s3.faults.refused_puts.add("faces-00002.rec")
    result = pack(small_tree, f"s3://{bucket}/p/faces")
    assert result.exit_code == 1
    assert f"s3://{bucket}/p/faces-00002.rec: access refused" in result.output
    stored = s3.objects(bucket)
    assert "p/faces.manifest.json" not in stored and "p/faces-00002.rec" not in stored
    assert staging_left(tmp_path) == []


def test_a_pack_that_fails_after_shard_1_uploads_no_manifest(
    s3, bucket, small_tree, tmp_path, at_shard_2
):
    def full_disk():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "faces-00002.rec.partial")

    at_shard_2(full_disk)
    result = pack(small_tree, f"s3://{bucket}/p/faces")
    assert result.exit_code == 1 and "No space left on device" in result.output
    stored = s3.objects(bucket)
    assert "p/faces.manifest.json" not in stored
    assert not [k for k in stored if k.startswith(("p/faces-00002", "p/faces-00003"))]
    assert staging_left(tmp_path) == []


@pytest.mark.parametrize("url", ["https://host/packs/faces", "http://host/f", "ftp://host/f"])
def test_an_out_prefix_rectool_cannot_write_is_refused_before_anything_is_packed(
    small_tree, tmp_path, monkeypatch, url
):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    seen = []
    output.set_fault_hook(lambda step, path: seen.append(path))
    try:
        result = invoke("pack", small_tree.list_path, small_tree.root, url, "--json")
    finally:
        output.set_fault_hook(None)
    scheme = url.split(":")[0]
    assert result.exit_code == 2
    assert f"OUT_PREFIX {url}: {scheme}:// is " in result.stdout
    assert "write packs to a local folder or to object storage (s3://" in result.stdout
    assert seen == []  # nothing written: no staging folder, no local folder named `ftp:`
    assert not (tmp_path / "cache").exists() and not (tmp_path / f"{scheme}:").exists()


def test_repack_to_https_is_refused_before_its_sources_are_read(tmp_path):
    result = invoke("repack", tmp_path / "missing", "https://host/packs/train")
    assert result.exit_code == 2
    assert "OUT_PREFIX https://host/packs/train: https:// is read-only" in result.output
    assert "missing" not in result.output


def test_a_pack_already_at_the_url_is_refused_without_overwrite_before_anything_is_packed(
    s3, bucket, small_tree, tmp_path
):
    url = f"s3://{bucket}/p/faces"
    assert pack(small_tree, url, "-q").exit_code == 0
    before = s3.objects(bucket)
    s3.faults.reset()
    seen = []
    output.set_fault_hook(lambda step, path: seen.append(path))
    try:
        result = pack(small_tree, url)
    finally:
        output.set_fault_hook(None)
    assert result.exit_code == 1
    assert (
        f"Error: {url}: a complete pack is already here ({url}.manifest.json); use --overwrite "
        "to replace it" in result.output
    )
    assert seen == [] and s3.faults.uploaded == [] and staging_left(tmp_path) == []
    assert s3.objects(bucket) == before
    assert pack(small_tree, url, "-q", "--overwrite").exit_code == 0
    assert s3.faults.uploaded[-1] == "faces.manifest.json"


def test_repack_to_a_url_that_holds_a_pack_needs_overwrite(s3, bucket, small_pack, tmp_path):
    url = f"s3://{bucket}/r/train"
    args = ["repack", small_pack.manifest, url, "--shard-records", "3", "-q"]
    assert invoke(*args).exit_code == 0
    s3.faults.reset()
    result = invoke(*args)
    assert result.exit_code == 1
    assert f"{url}: a complete pack is already here ({url}.manifest.json)" in result.output
    assert s3.faults.uploaded == []
    assert invoke(*args, "--overwrite").exit_code == 0
    assert s3.faults.uploaded[-1] == "train.manifest.json"


def test_a_pack_refused_after_shard_1_deletes_every_object_it_had_uploaded(
    s3, bucket, small_tree, tmp_path
):
    s3.faults.refused_puts.add("faces-00002.rec")
    result = pack(small_tree, f"s3://{bucket}/p/faces")
    assert result.exit_code == 1
    assert {"faces-00000.rec", "faces-00001.rec"} <= set(s3.faults.uploaded)  # were there
    assert s3.objects(bucket, "p/") == {}
    assert staging_left(tmp_path) == []


def test_a_failed_overwrite_deletes_only_what_the_old_pack_did_not_hold(
    s3, bucket, small_tree, tmp_path
):
    url = f"s3://{bucket}/p/faces"
    assert pack(small_tree, url, "-q", "--shard-records", "6").exit_code == 0  # 2 shards
    old = s3.objects(bucket, "p/")
    s3.faults.reset()
    s3.faults.refused_puts.add("faces-00003.rec")  # the 4th of 4 shards of 3
    result = pack(small_tree, url, "--overwrite")
    assert result.exit_code == 1
    assert "faces-00002.rec" in s3.faults.uploaded  # a name the old pack did not have
    left = s3.objects(bucket, "p/")
    assert sorted(left) == sorted(old)  # every object the old manifest names is still there
    assert left["p/faces.manifest.json"] == old["p/faces.manifest.json"]


def test_a_ctrl_c_that_misses_the_wait_for_uploads_still_ends_it_while_one_stalls():
    """As `transfer.run_all`'s wait (tests/adversarial/test_remote_bounds.py): a signal whose
    handler ran elsewhere, or just before the wait began, sets CPython's flag and wakes no
    wait; `_thread.interrupt_main` does exactly that. The wait for an upload stalled in a
    library call must still raise it, not once the upload ends."""
    release, ended, waited = threading.Event(), [], []

    def stalled_upload():
        waited.append(blocked_in(threading.main_thread(), ShardUploader.wait.__code__))
        _thread.interrupt_main()  # the flag a signal handled elsewhere sets
        release.wait(60)  # the stall: a bound; only the signal should end the wait
        ended.append(True)

    uploader = ShardUploader.__new__(ShardUploader)  # its store is not what is tested
    pool = ThreadPoolExecutor(1)
    uploader._uploads = [pool.submit(stalled_upload)]
    try:
        with pytest.raises(KeyboardInterrupt):
            uploader.wait()
        assert waited == [True] and not ended  # raised while the upload stalled
    finally:
        release.set()
        pool.shutdown()


def test_a_failed_upload_is_raised_at_once_though_one_started_before_it_stalls():
    """The pack ends on the first failure, not once every upload started before it ends: an
    upload stalled (or just slow, a large shard) before a refused one held the error back."""
    release, ended = threading.Event(), []

    def stalled_upload():
        release.wait(60)  # the stall: a bound; the failure must be raised before it ends
        ended.append(True)

    def refused_upload():
        raise RemoteError("s3://bucket/faces-00001.rec: refused (403 Forbidden)")

    uploader = ShardUploader.__new__(ShardUploader)  # its store is not what is tested
    pool = ThreadPoolExecutor(2)
    uploader._uploads = [pool.submit(stalled_upload), pool.submit(refused_upload)]
    try:
        with pytest.raises(RemoteError, match="faces-00001.rec: refused"):
            uploader.wait()
        assert not ended  # raised while the first upload still stalled
    finally:
        release.set()
        pool.shutdown()


def test_the_wait_ends_when_close_has_cancelled_the_uploads_not_started():
    """A future that `close` cancelled (`cancel_futures`) is never done to
    `concurrent.futures.wait`: waiting for it woke every WAKE_S for ever."""
    release = threading.Event()
    uploader = ShardUploader.__new__(ShardUploader)  # its store is not what is tested
    pool = ThreadPoolExecutor(1)
    uploader._uploads = [pool.submit(release.wait, 60), pool.submit(lambda: None)]
    pool.shutdown(wait=False, cancel_futures=True)  # as close() does: the second is cancelled
    release.set()
    waiter = threading.Thread(target=uploader.wait, daemon=True)
    waiter.start()
    waiter.join(60)  # a bound against the hang, not a clock
    assert not waiter.is_alive() and uploader._uploads[1].cancelled()
