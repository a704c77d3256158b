"""A command that needs a pack's files on this machine says so of a URL: `dali-index` (DALI
reads the .rec paths it prints) refuses s3:// and http:// targets with "URLs are not supported
by this command" and what to do instead, exit 2, instead of "manifest not found"; `unpack`
reads a URL as every reading command does (through the dataset's shard cache), to the same
files as the local pack's."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rectool.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RECTOOL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("as_json", [False, True])
def test_dali_index_of_a_url_says_urls_are_not_supported_and_what_to_do(
    remote_pack, tmp_path, as_json
):
    out = tmp_path / "faces.dali.idx"
    result = invoke("dali-index", remote_pack.url, out, *(["--json"] if as_json else []))
    assert result.exit_code == 2
    message = json.loads(result.stdout)["error"] if as_json else result.stderr
    assert "URLs are not supported by `rectool dali-index`" in message
    assert "copy the pack's folder here" in message and remote_pack.url in message
    assert "not found" not in message and not out.exists()


def test_dali_index_of_the_local_copy_of_the_pack_still_works(http_pack, tmp_path):
    result = invoke("dali-index", http_pack.local, tmp_path / "faces.dali.idx")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 4  # its four .rec paths


def test_unpack_of_a_url_writes_the_files_the_local_pack_unpacks_to(remote_pack, tmp_path):
    remote = invoke("unpack", remote_pack.url, tmp_path / "remote")
    assert remote.exit_code == 0, remote.output
    assert invoke("unpack", remote_pack.local, tmp_path / "local").exit_code == 0

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    assert files(tmp_path / "remote") == files(tmp_path / "local") != {}
