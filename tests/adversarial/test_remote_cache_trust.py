"""Cached bytes are checked, not trusted forever (issue 36): a shard damaged in the shard cache
(`cache_dir`) or in the CLI's copy (`CACHE/mirror/`) is downloaded again, a warning naming the
cache file, never read and never blamed on the intact object at the URL; and a clean run leaves
no empty lock files behind (issue 38)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from click.testing import CliRunner
from helpers.servers import no_wait

from rectool import open_dataset
from rectool.cli import cli
from rectool.remote import Retry

SHARD = "faces-00001.rec"  # records 3, 4 and 5


def opened(pack, cache):
    return open_dataset(pack.url, cache_dir=str(cache), retry=Retry(sleep=no_wait))


def flip_byte(path, at=200):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def records(ds, numbers=(3, 4, 5)):
    return [bytes(ds.raw(i)[0]) for i in numbers]


def test_a_shard_damaged_in_the_cache_is_downloaded_again_never_read(remote_pack, tmp_path, caplog):
    local = open_dataset(str(remote_pack.local))
    ds = opened(remote_pack, tmp_path / "cache")
    assert records(ds) == records(local)
    ds.close()
    (cached,) = (tmp_path / "cache" / "packs").glob(f"*/{SHARD}")
    flip_byte(cached)
    again = opened(remote_pack, tmp_path / "cache")
    with caplog.at_level(logging.WARNING, logger="rectool.remote"):
        assert records(again) == records(local)
    again.close()
    assert remote_pack.faults.gets[SHARD] == 2
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "rectool.remote"]
    assert warning.startswith(f"{cached}: the cached copy of ")
    assert "downloading it again" in warning


def test_a_shard_cut_short_in_the_cache_is_downloaded_again(remote_pack, tmp_path):
    local = open_dataset(str(remote_pack.local))
    ds = opened(remote_pack, tmp_path / "cache")
    records(ds)
    ds.close()
    (cached,) = (tmp_path / "cache" / "packs").glob(f"*/{SHARD}")
    with open(cached, "r+b") as f:
        f.truncate(cached.stat().st_size - 10)
    assert records(opened(remote_pack, tmp_path / "cache")) == records(local)
    assert remote_pack.faults.gets[SHARD] == 2


def test_a_shard_damaged_in_the_cache_by_another_process_is_checked_again(remote_pack, tmp_path):
    """The check of this process is remembered only while the file is unchanged: another
    process's write (here, one that keeps the size) is seen."""
    ds = opened(remote_pack, tmp_path / "cache")
    want = records(ds)
    ds.close()
    (cached,) = (tmp_path / "cache" / "packs").glob(f"*/{SHARD}")
    code = f"p = {str(cached)!r}; d = bytearray(open(p, 'rb').read()); d[200] ^= 0xFF; " + (
        "open(p, 'r+b').write(d)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert records(opened(remote_pack, tmp_path / "cache")) == want


def test_a_manifest_damaged_in_the_cache_is_written_again_from_the_url(remote_pack, tmp_path):
    opened(remote_pack, tmp_path / "cache").close()
    (cached,) = (tmp_path / "cache" / "packs").glob("*/faces.manifest.json")
    cached.write_bytes(cached.read_bytes()[:-40])  # cut: no longer JSON
    again = opened(remote_pack, tmp_path / "cache")
    assert len(again) == 12
    assert cached.read_bytes() == remote_pack.local.read_bytes()


def test_verify_of_a_url_fetches_a_damaged_copy_again_and_blames_no_bucket_object(
    remote_pack, tmp_path, monkeypatch
):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))
    first = CliRunner().invoke(cli, ["verify", remote_pack.url, "-q"])
    assert first.exit_code == 0, first.output
    (copy,) = (tmp_path / "cache" / "mirror").glob(f"*/{SHARD}")
    flip_byte(copy)
    result = subprocess.run(
        [sys.executable, "-m", "rectool", "verify", remote_pack.url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr  # the object is intact
    assert "checksum-mismatch" not in result.stdout + result.stderr
    url = remote_pack.url.rsplit("/", 1)[0] + "/" + SHARD
    assert (
        f"{copy}: the cached copy of {url} differs from the manifest; downloading it again\n"
    ) in result.stderr
    assert remote_pack.faults.gets[SHARD] == 2


def leftovers(folder):
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and path.suffix in (".lock", ".download")
    )


def test_a_clean_read_leaves_no_lock_or_download_files_in_the_cache(remote_pack, tmp_path):
    cache = tmp_path / "cache"
    ds = open_dataset(
        remote_pack.url, cache_dir=str(cache), cache_limit=1 << 30, retry=Retry(sleep=no_wait)
    )
    assert len(records(ds, range(12))) == 12 and len(ds.labels) == 12
    ds.close()
    assert leftovers(cache) == []
    assert len(list(cache.rglob("*.rec"))) == 4


def test_a_clean_verify_of_a_url_leaves_no_lock_files_in_the_cache(remote_pack, tmp_path):
    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-m", "rectool", "verify", remote_pack.url, "-q"],
        capture_output=True,
        text=True,
        env={**os.environ, "RECTOOL_CACHE_DIR": str(cache)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert leftovers(cache) == []
    assert len(list((cache / "mirror").glob("*/*.rec"))) == 4


def test_another_processs_use_of_a_checked_shard_does_not_make_this_one_read_it_again(
    remote_pack, tmp_path, monkeypatch
):
    # A use is dated in the shard's access time, which leaves the stamp this process checked
    # alone: before, every use by a Loader worker set the mtime, and every other process read
    # each shard whole again at its next use (a first epoch from S3 at 0.6 of local speed).
    from rectool.remote import cache as cache_module

    ds = opened(remote_pack, tmp_path / "cache")
    want = records(ds)
    ds.close()
    (cached,) = (tmp_path / "cache" / "packs").glob(f"*/{SHARD}")
    mtime = cached.stat().st_mtime_ns
    code = (
        "from rectool import open_dataset; from rectool.remote import Retry\n"
        f"ds = open_dataset({remote_pack.url!r}, cache_dir={str(tmp_path / 'cache')!r}, "
        "retry=Retry(sleep=lambda s: None))\n"
        "[ds.raw(i) for i in (3, 4, 5)]; ds.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)  # another process
    assert cached.stat().st_mtime_ns == mtime  # its use left the mtime alone
    hashed = []
    real = cache_module.file_hexdigest
    monkeypatch.setattr(cache_module, "file_hexdigest", lambda *a: hashed.append(a[0]) or real(*a))
    assert records(opened(remote_pack, tmp_path / "cache")) == want
    assert hashed == []  # checked once by this process, unchanged since: not read again
