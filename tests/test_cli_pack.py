"""`rectool pack` at the command line: options, exit codes, summaries."""

from __future__ import annotations

import errno
import json

import pytest
from click.testing import CliRunner
from helpers.faults import fail_writes
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli
from rectool.format.headers import unpack_header
from rectool.format.records import IndexedRecordFile


@pytest.fixture
def tree_with_empty_image(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["alice", "bob"], 3, extra=[("bob/empty.jpg", b"", 1)])
    return root, write_list(tmp_path / "faces.lst", items), items


def invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def test_exit_3_when_refusals_exceed_max_failures(tree_with_empty_image, tmp_path):
    root, lst, _ = tree_with_empty_image
    result = invoke("pack", lst, root, tmp_path / "out" / "f")
    assert result.exit_code == 3
    assert result.stderr.splitlines() == [
        "Packed 6 images into 1 shard (0.0 MB); manifest "
        + str(tmp_path / "out" / "f.manifest.json"),
        "Refused 1 image (all listed in " + str(tmp_path / "out" / "f.failures.jsonl") + "):",
        "  line 7: bob/empty.jpg: empty file",
        "More than --max-failures 0 refused: exit status 3.",
    ]


def test_exit_0_within_max_failures_and_json_summary(tree_with_empty_image, tmp_path):
    root, lst, _ = tree_with_empty_image
    result = invoke("pack", lst, root, tmp_path / "f", "--max-failures", "1", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["images"] == 6
    assert summary["failures"] == 1
    assert summary["accepted"] is True
    assert summary["refused"] == [
        {"line": 7, "index": 6, "path": "bob/empty.jpg", "reason": "empty file"}
    ]
    assert summary["shards"] == [str(tmp_path / "f.rec")]
    assert summary["outcome"] == "packed"
    assert summary["seconds"] >= 0


def test_list_from_stdin(tree_with_empty_image, tmp_path):
    root, lst, items = tree_with_empty_image
    flags = "-q --max-failures 1".split()
    result = invoke(
        "pack", "-", root, tmp_path / "s", *flags, input=lst.read_text(encoding="utf-8")
    )
    assert result.exit_code == 0, result.output
    assert result.output == ""
    with IndexedRecordFile(tmp_path / "s.rec") as f:
        assert f.keys.tolist() == [i for i, _, _ in items[:-1]]
    assert not (tmp_path / "s.stdin.lst").exists()


def test_shard_size_accepts_units(tree_with_empty_image, tmp_path):
    root, lst, _ = tree_with_empty_image
    result = invoke(
        "pack", lst, root, tmp_path / "u", "--shard-size", "3KB", "-q", "--max-failures", "1"
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.glob("u-*.rec"))[0] == "u-00000.rec"
    assert len(list(tmp_path.glob("u-*.rec"))) >= 2


def test_pack_label_and_resize_options(tree_with_empty_image, tmp_path):
    root, lst, _ = tree_with_empty_image
    flags = "--resize 16 --pack-label -q --max-failures 1".split()
    result = invoke("pack", lst, root, tmp_path / "r", *flags)
    assert result.exit_code == 0, result.output
    with IndexedRecordFile(tmp_path / "r.rec") as f:
        header, _ = unpack_header(f.read(3))
    assert (header.flag, header.label.tolist()) == (1, [1.0])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shard-size", "lots"], "'lots' is not a size"),
        (["--quality", "50", "--encoding", ".png"], "PNG compression must be 0-9"),
        (["--quality", "0"], "JPEG quality must be 1-100"),
        (["--workers", "0"], "0 is not in the range x>=1"),
        (["--color", "2"], "'2' is not one of '-1', '0', '1'"),
        (
            ["--layout", "insightface", "--shard-records", "2"],
            "--layout insightface writes one .rec",
        ),
        (["--no-check", "--check", "decode"], "--no-check contradicts --check decode"),
    ],
)
def test_usage_errors_exit_2(tree_with_empty_image, tmp_path, args, message):
    root, lst, _ = tree_with_empty_image
    result = invoke("pack", lst, root, tmp_path / "x", *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_missing_root_and_list(tree_with_empty_image, tmp_path):
    root, lst, _ = tree_with_empty_image
    result = invoke("pack", lst, tmp_path / "nope", tmp_path / "x")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        f"Error: Invalid value for 'ROOT': Directory '{tmp_path / 'nope'}' does not exist."
    )
    result = invoke("pack", tmp_path / "none.lst", root, tmp_path / "x")
    assert result.exit_code == 2  # an unusable input
    assert result.stderr == f"Error: {tmp_path / 'none.lst'}: list file not found\n"


def test_bad_list_line_names_file_and_line(tree_with_empty_image, tmp_path):
    root, _, _ = tree_with_empty_image
    bad = tmp_path / "bad.lst"
    bad.write_text("0\t0\talice/000.jpg\nthis line is wrong\n", encoding="utf-8")
    result = invoke("pack", bad, root, tmp_path / "x")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {bad}: line 2: expected 'index<TAB>label<TAB>path', got 'this line is wrong'\n"
    )


def test_existing_output_and_overwrite(tree_with_empty_image, tmp_path):
    root, lst, _ = tree_with_empty_image
    assert invoke("pack", lst, root, tmp_path / "o", "-q").exit_code == 3
    again = invoke("pack", lst, root, tmp_path / "o", "-q")
    assert again.exit_code == 1
    manifest = tmp_path / "o.manifest.json"
    advice = "use --overwrite to replace it, or --resume to keep it when it was made from the "
    advice += "same list and options"
    assert (
        again.stderr
        == f"Error: {tmp_path / 'o'}: a complete pack is already here ({manifest}); {advice}\n"
    )
    assert invoke("pack", lst, root, tmp_path / "o", "-q", "--overwrite").exit_code == 3


def test_a_full_disk_is_an_error_naming_the_file_and_the_pack_resumes(
    tree_with_empty_image, tmp_path, monkeypatch
):
    root, lst, _ = tree_with_empty_image
    fail_writes(monkeypatch, ".rec.partial", errno.ENOSPC)
    result = invoke("pack", lst, root, tmp_path / "d", "-q", "--max-failures", "1")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {tmp_path / 'd.rec.partial'}: cannot write (No space left on device)\n"
    )
    monkeypatch.undo()  # space again
    again = invoke("pack", lst, root, tmp_path / "d", "-q", "--max-failures", "1", "--resume")
    assert again.exit_code == 0, again.output
    # The resumed pack is the pack a run with room to spare writes, byte for byte.
    clean = invoke("pack", lst, root, tmp_path / "clean" / "d", "-q", "--max-failures", "1")
    assert clean.exit_code == 0, clean.output
    for suffix in (".rec", ".idx", ".rec.crc", ".failures.jsonl"):
        resumed = (tmp_path / f"d{suffix}").read_bytes()
        assert resumed == (tmp_path / "clean" / f"d{suffix}").read_bytes(), suffix
    assert not list(tmp_path.glob("d*.partial"))
    manifest = json.loads((tmp_path / "d.manifest.json").read_text())
    assert (
        manifest["shards"]
        == json.loads((tmp_path / "clean" / "d.manifest.json").read_text())["shards"]
    )


def test_an_unwritable_output_folder_is_an_error_not_a_traceback(tree_with_empty_image, tmp_path):
    root, lst, _ = tree_with_empty_image
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = invoke("pack", lst, root, blocker / "out" / "d")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {blocker / 'out'}: Not a directory\n"
    assert not list(tmp_path.glob("d*"))


def run_pipe(script, tmp_path):
    """Run `script` with bash (pipefail), `rectool` being this checkout's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]),
    }
    rectool = f"{sys.executable} -m rectool"
    return subprocess.run(
        ["bash", "-c", "set -o pipefail; " + script.format(rectool=rectool)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_list_piped_into_pack_keeps_the_label_map(tmp_path):
    root = tmp_path / "tree"
    write_pack_tree(root, ["alice", "bob"], 3)
    done = run_pipe(
        "{rectool} list tree - --labels map.tsv -q | "
        "{rectool} pack - tree out/faces --labels map.tsv -q",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "out" / "faces.manifest.json").read_text())
    assert manifest["list"] == "-"
    assert manifest["classes"] == 2
    assert manifest["identities"]["file"] == "faces.identities.json"
    names = json.loads((tmp_path / "out" / "faces.identities.json").read_text())
    assert names == {"0": "alice", "1": "bob"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == (
        "faces.failures.jsonl faces.identities.json faces.idx faces.keys.npy faces.labels.npy "
        "faces.manifest.json faces.offsets.npy faces.rec faces.rec.crc".split()
    )


def test_a_piped_list_without_a_label_map_says_so(tmp_path):
    root = tmp_path / "tree"
    write_pack_tree(root, ["alice", "bob"], 3)
    done = run_pipe("{rectool} list tree - -q | {rectool} pack - tree out/faces -q", tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "out" / "faces.manifest.json").read_text())
    assert (manifest["list"], manifest["classes"], manifest["identities"]) == ("-", None, None)
    missing = run_pipe(
        "{rectool} list tree - -q | {rectool} pack - tree out/other --labels nowhere.tsv", tmp_path
    )
    assert missing.returncode == 2  # an unusable input
    assert missing.stderr == "Error: nowhere.tsv: label map not found\n"


def test_resume_on_a_complete_pack_says_there_was_nothing_to_do(tree_with_empty_image, tmp_path):
    root, lst, _ = tree_with_empty_image
    args = ["pack", lst, root, tmp_path / "c", "--max-failures", "1"]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "Resumed" not in first.stderr
    again = invoke(*args, "--resume")
    assert again.exit_code == 0, again.output
    assert again.stderr.splitlines()[:2] == [
        f"Already packed 6 images into 1 shard (0.0 MB); manifest {tmp_path / 'c.manifest.json'}",
        "Nothing to do: the pack was already complete, made the same way.",
    ]
    assert json.loads(invoke(*args, "--resume", "--json").stdout)["outcome"] == "complete"


def test_without_dask_the_error_says_how_to_install_it_from_a_checkout(
    tree_with_empty_image, tmp_path, monkeypatch
):
    import sys

    root, lst, _ = tree_with_empty_image
    monkeypatch.setitem(sys.modules, "dask", None)
    monkeypatch.setitem(sys.modules, "dask.distributed", None)
    result = invoke(
        "pack", lst, root, tmp_path / "d", "--shard-records", "3", "--executor", "dask", "--json"
    )
    assert result.exit_code == 2
    assert (
        "from a checkout of rectool: pip install -e '.[dask]'" in json.loads(result.stdout)["error"]
    )
