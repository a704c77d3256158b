"""Shard plans: `--only-shard` in separate processes, `--finalize`, and Dask clusters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli
from rectool.errors import RectoolError, UsageError
from rectool.packer.packing import PackOptions, finalize_pack, pack_images, validate_list
from rectool.packer.shards import plan_shards


def test_plan_is_a_pure_function_of_length_and_count():
    assert plan_shards(10, None, 4) == [range(0, 4), range(4, 8), range(8, 10)]
    assert plan_shards(8, None, 4) == [range(0, 4), range(4, 8)]
    assert plan_shards(0, None, 4) == [range(0, 0)]
    assert plan_shards(5) == [range(0, 5)]
    with pytest.raises(UsageError, match="cannot be planned; use --shard-records"):
        plan_shards(5, 1000, None)


@pytest.fixture
def tree_with_refusals(tmp_path):
    root = tmp_path / "tree"
    extra = [("b/empty.jpg", b"", 1), ("c/missing.jpg", None, 2)]
    items = write_pack_tree(root, ["a", "b", "c", "d"], 5, extra=extra)
    # The refusals land in shards 3 and 4 (7 lines a shard), one shard is left with 1 line.
    return root, write_list(tmp_path / "faces.lst", items)


def folder_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_shards_packed_in_separate_processes_equal_one_run(tree_with_refusals, tmp_path):
    root, lst = tree_with_refusals
    options = PackOptions(shard_records=7, max_failures=5)
    pack_images(lst, root, tmp_path / "one" / "f", options)
    prefix = tmp_path / "many" / "f"
    for number in (3, 1, 0, 2):  # any order, one process each, as job-array tasks run
        flags = f"--shard-records 7 --only-shard {number} --max-failures 5 -q".split()
        done = subprocess.run(
            [sys.executable, "-m", "rectool", "pack", str(lst), str(root), str(prefix), *flags],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    assert not (tmp_path / "many" / "f.manifest.json").exists()
    result = finalize_pack(lst, root, prefix, options)
    assert (result.images, result.failures) == (20, 2)
    assert folder_bytes(tmp_path / "many") == folder_bytes(tmp_path / "one")


def test_finalize_names_the_missing_shard(tree_with_refusals, tmp_path):
    root, lst = tree_with_refusals
    options = PackOptions(shard_records=7)
    for number in (0, 1, 3):
        pack_images(lst, root, tmp_path / "f", options, only_shard=number)
    with pytest.raises(RectoolError, match=r"f-00002.rec: shard 2 of 4 is missing or unfinished"):
        finalize_pack(lst, root, tmp_path / "f", options)


def test_only_shard_is_idempotent_with_resume(tree_with_refusals, tmp_path):
    root, lst = tree_with_refusals
    options = PackOptions(shard_records=7)
    first = pack_images(lst, root, tmp_path / "out" / "f", options, only_shard=1)
    before = folder_bytes(tmp_path / "out")
    again = pack_images(lst, root, tmp_path / "out" / "f", options, only_shard=1, resume=True)
    assert (again.info.records, again.failures) == (first.info.records, first.failures)
    assert folder_bytes(tmp_path / "out") == before
    with pytest.raises(RectoolError, match="shard output exists; use --resume or --overwrite"):
        pack_images(lst, root, tmp_path / "out" / "f", options, only_shard=1)


def test_cli_plan_and_usage_errors(tree_with_refusals, tmp_path):
    root, lst = tree_with_refusals
    runner = CliRunner()
    plan = runner.invoke(
        cli, ["pack", str(lst), str(root), str(tmp_path / "f"), "--shard-records", "7", "--plan"]
    )
    assert plan.exit_code == 0
    assert plan.stdout.splitlines() == [
        "4 shards of 22 list lines:",
        "  shard 0: lines 1-7",
        "  shard 1: lines 8-14",
        "  shard 2: lines 15-21",
        "  shard 3: lines 22-22",
    ]
    bad = runner.invoke(
        cli, ["pack", str(lst), str(root), str(tmp_path / "f"), "--only-shard", "0"]
    )
    assert bad.exit_code == 2
    assert "needs a plan: give --shard-records N" in bad.stderr
    flags = "--shard-records 7 --only-shard 4".split()
    out_of_plan = runner.invoke(cli, ["pack", str(lst), str(root), str(tmp_path / "f"), *flags])
    assert out_of_plan.exit_code == 2
    assert "--only-shard 4: the plan has shards 0..3" in out_of_plan.stderr


def test_an_only_shard_task_tells_its_own_truth_and_finalize_says_what_it_did(
    tree_with_refusals, tmp_path
):
    root, lst = tree_with_refusals
    runner = CliRunner()
    base = ["pack", str(lst), str(root), str(tmp_path / "f"), "--shard-records", "7"]
    clean = runner.invoke(cli, [*base, "--only-shard", "0"])
    assert clean.exit_code == 0, clean.output
    assert clean.stderr == (
        f"Packed shard 0 of 4: 7 images in {tmp_path / 'f-00000.rec'}, 0 refused "
        f"({tmp_path / 'f-00000.failures.jsonl'}). Run --finalize once every shard is packed.\n"
    )
    refusing = runner.invoke(cli, [*base, "--only-shard", "2"])  # b/empty.jpg is line 21
    assert refusing.exit_code == 3, refusing.output
    assert refusing.stderr.splitlines()[1] == (
        "More than --max-failures 0 refused in this shard: exit status 3."
    )
    as_json = runner.invoke(cli, [*base, "--only-shard", "3", "--json"])  # c/missing.jpg
    assert as_json.exit_code == 3
    document = json.loads(as_json.stdout)
    assert (document["exit"], document["failures"], document["accepted"]) == (3, 1, False)
    assert document["error"] == "more than --max-failures 0 refused (1)"
    within = runner.invoke(cli, [*base, "--only-shard", "1", "--max-failures", "1"])
    assert within.exit_code == 0, within.output
    final = runner.invoke(cli, [*base, "--finalize", "--max-failures", "2"])
    assert final.exit_code == 0, final.output
    lines = final.stderr.splitlines()
    assert lines[0].startswith("Finalized 20 images into 4 shards")
    assert lines[1] == "Checked 4 shards packed one by one and wrote the manifest."
    assert not any("Resumed" in line for line in lines)
    again = runner.invoke(cli, [*base, "--finalize", "--max-failures", "2"])
    assert again.exit_code == 0, again.output
    assert again.stderr.splitlines()[1] == (
        "Nothing to do: the pack was already complete, made the same way."
    )


distributed = pytest.importorskip("dask.distributed")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as local:
        yield local


def test_dask_cluster_gives_the_same_bytes_as_a_local_pack(tree_with_refusals, tmp_path, cluster):
    from rectool.packer.distributed import pack_on_dask

    root, lst = tree_with_refusals
    options = PackOptions(shard_records=7, max_failures=5, workers=1)
    pack_images(lst, root, tmp_path / "local" / "f", options)
    result = pack_on_dask(
        lst, root, tmp_path / "dask" / "f", options, scheduler=cluster.scheduler_address
    )
    assert (result.images, result.failures) == (20, 2)
    assert (result.outcome, result.resumed_from) == ("packed", 0)  # not "finalized" or resumed
    assert result.manifest_path == str(tmp_path / "dask" / "f.manifest.json")
    assert folder_bytes(tmp_path / "dask") == folder_bytes(tmp_path / "local")


def test_dask_overwrite_replaces_the_old_pack_only_once_the_new_one_is_complete(
    tree_with_refusals, tmp_path, cluster
):
    from rectool.packer.distributed import pack_on_dask

    root, lst = tree_with_refusals
    options = PackOptions(shard_records=7, max_failures=5, workers=1)
    pack_images(lst, root, tmp_path / "local" / "f", options)
    pack_images(lst, root, tmp_path / "dask" / "f", PackOptions(max_failures=5))
    result = pack_on_dask(
        lst,
        root,
        tmp_path / "dask" / "f",
        options,
        overwrite=True,
        scheduler=cluster.scheduler_address,
    )
    assert result.manifest_path == str(tmp_path / "dask" / "f.manifest.json")
    assert folder_bytes(tmp_path / "dask") == folder_bytes(tmp_path / "local")


def test_dask_worker_killed_mid_run_still_gives_a_correct_pack(tmp_path, cluster):
    from rectool.packer.distributed import pack_on_dask

    root = tmp_path / "tree"
    items = write_pack_tree(root, [f"id{i}" for i in range(12)], 40, height=96, width=80)
    lst = write_list(tmp_path / "big.lst", items)
    options = PackOptions(shard_records=60, workers=1, transform=None, check="decode")
    pack_images(lst, root, tmp_path / "local" / "f", options)

    outcome = {}

    def run():
        try:
            outcome["result"] = pack_on_dask(
                lst, root, tmp_path / "dask" / "f", options, scheduler=cluster.scheduler_address
            )
        except BaseException as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while not list((tmp_path / "dask").glob("*.partial")) and thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    with distributed.Client(cluster.scheduler_address) as client:
        pids = client.run(os.getpid)
    victim = sorted(pids.values())[0]
    os.kill(victim, signal.SIGKILL)
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].images == 480
    got, expected = folder_bytes(tmp_path / "dask"), folder_bytes(tmp_path / "local")
    assert sorted(got) == sorted(expected)
    assert [name for name in expected if got[name] != expected[name]] == []


def test_resuming_a_shard_killed_after_its_rename_leaves_the_next_shard_alone(
    tree_with_refusals, tmp_path
):
    root, lst = tree_with_refusals
    options = PackOptions(shard_records=7)
    prefix = tmp_path / "out" / "f"
    pack_images(lst, root, prefix, options, only_shard=1)
    expected = (tmp_path / "out" / "f-00001.rec").read_bytes()
    pack_images(lst, root, prefix, options, only_shard=2)
    shard2 = (tmp_path / "out" / "f-00002.rec").read_bytes()
    # As if shard 1's task died after renaming its .rec/.idx, before its last two steps: the
    # failures file still .partial and the state file still there.
    failures = tmp_path / "out" / "f-00001.failures.jsonl"
    failures.rename(str(failures) + ".partial")
    digest, _ = validate_list(str(lst), "images")
    state = {
        "list_sha256": digest,
        "root": os.path.abspath(root),
        "options": options.byte_options(),
    }
    (tmp_path / "out" / "f-00001.pack-state.json").write_text(json.dumps(state))
    result = pack_images(lst, root, prefix, options, only_shard=1, resume=True)
    assert result.info.records == 7
    assert (tmp_path / "out" / "f-00001.rec").read_bytes() == expected
    assert (tmp_path / "out" / "f-00002.rec").read_bytes() == shard2
    assert failures.exists() and not (tmp_path / "out" / "f-00001.pack-state.json").exists()


def test_dask_wrong_root_stops_before_the_cluster_or_any_file(tree_with_refusals, tmp_path):
    from rectool.packer.distributed import pack_on_dask
    from rectool.packer.packing import WrongRootError

    _, lst = tree_with_refusals
    wrong = tmp_path / "elsewhere"
    wrong.mkdir()
    with pytest.raises(WrongRootError, match="is ROOT right"):
        pack_on_dask(lst, wrong, tmp_path / "out" / "f", PackOptions(shard_records=7))
    assert os.listdir(tmp_path / "out") == []
