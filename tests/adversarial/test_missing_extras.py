"""A missing extra is one line: every command that takes a URL, run where obstore is not
installed, and `pack --executor dask` where Dask is not, print one `Error:` line naming the
`pip install` that adds it (exit 2, the table's "cannot be used at all"), never a
`ModuleNotFoundError` traceback.

Each runs `rectool` in a process of its own whose import of the module fails, as it does
where the module is not installed (`sys.modules[name] = None`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rectool import extras

RUN_WITHOUT = """\
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # `import name` fails as where it is not installed
sys.argv = ["rectool", *sys.argv[2:]]
from rectool.cli import main
main()
"""

URL = "s3://bucket/packs/faces.manifest.json"
REMOTE_HINT = "pip install 'rectool[remote]'"
CHECKOUT_HINT = "pip install -e '.[remote]'"


def rectool_without(modules, *args, cwd):
    env = {
        **os.environ,
        "RECTOOL_CACHE_DIR": str(cwd / "cache"),
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",  # never asked: the import fails first
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_REGION": "us-east-1",
    }
    return subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT, ",".join(modules), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def one_line(result, hint):
    """Assert `result` failed with exit 2 and one stderr line naming `hint`; return it."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and hint in lines[0], lines
    return lines[0]


NO_OBSTORE = ("obstore",)


def url_commands(tmp_path, local_manifest):
    """Every command that takes a URL, each given one (an s3:// manifest, or OUT_PREFIX)."""
    return {
        "info": ["info", URL],
        "verify": ["verify", URL],
        "report": ["report", URL, "-o", tmp_path / "r.html"],
        "repack": ["repack", URL, tmp_path / "repacked"],
        "repack --drop-overlap": [
            "repack", local_manifest, tmp_path / "dropped", "--drop-overlap", URL,
        ],
        "unpack": ["unpack", URL, tmp_path / "unpacked"],
        "bench": ["bench", URL],
    }  # fmt: skip


@pytest.mark.parametrize(
    "command",
    ["info", "verify", "report", "repack", "repack --drop-overlap", "unpack", "bench"],
)
def test_a_url_without_obstore_is_one_line_naming_the_remote_extra(small_pack, tmp_path, command):
    args = url_commands(tmp_path, small_pack.manifest)[command]
    line = one_line(rectool_without(NO_OBSTORE, *args, cwd=tmp_path), REMOTE_HINT)
    assert CHECKOUT_HINT in line  # these tests run from a checkout: its form is right here


@pytest.mark.parametrize("command", ["info", "verify", "repack"])
def test_a_url_without_obstore_under_json_is_one_document_with_exit_2(
    small_pack, tmp_path, command
):
    args = url_commands(tmp_path, small_pack.manifest)[command]
    result = rectool_without(NO_OBSTORE, *args, "--json", cwd=tmp_path)
    assert "Traceback" not in result.stderr and result.returncode == 2, result.stderr
    document = json.loads(result.stdout)
    assert document["exit"] == 2 and REMOTE_HINT in document["error"]


def test_pack_to_an_s3_prefix_without_obstore_is_one_line(small_tree, tmp_path):
    result = rectool_without(
        NO_OBSTORE, "pack", small_tree.list_path, small_tree.root, "s3://bucket/packs/faces",
        cwd=tmp_path,
    )  # fmt: skip
    one_line(result, REMOTE_HINT)
    assert not list(tmp_path.glob("**/faces*.rec"))  # nothing packed to be thrown away


def test_pack_on_dask_without_dask_is_one_line_naming_the_dask_extra(small_tree, tmp_path):
    result = rectool_without(
        ("dask", "dask.distributed", "distributed"),
        "pack", small_tree.list_path, small_tree.root, tmp_path / "out" / "faces",
        "--shard-records", "4", "--executor", "dask",
        cwd=tmp_path,
    )  # fmt: skip
    line = one_line(result, "pip install 'rectool[dask]'")
    assert "pip install -e '.[dask]'" in line


def test_the_checkout_form_is_named_only_from_a_checkout(monkeypatch):
    assert extras.install_hint("remote").endswith(CHECKOUT_HINT)  # this suite runs from one
    monkeypatch.setattr(extras, "in_checkout", lambda: False)
    assert extras.install_hint("remote") == REMOTE_HINT
    assert "-e" not in str(extras.missing_module("obstore"))
