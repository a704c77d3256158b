"""Packing that never loses or breaks a pack: one run a prefix, --overwrite that keeps the old
pack until the new one is whole, refusals of what is not a regular image file inside ROOT, safe
temporary files, and interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner
from imagefiles import write_list, write_pack_tree

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.packing import PackOptions, finalize_pack, pack_images

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["alice", "bob"], 3)
    return root, write_list(tmp_path / "faces.lst", items), items


def invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def python(*args, **kwargs):
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.Popen([sys.executable, *args], env=env, **kwargs)


def rectool(*args, env=None, **kwargs):
    """Run `rectool` in a process of its own; return the finished CompletedProcess."""
    env = {**os.environ, "PYTHONPATH": REPO, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rectool", *map(str, args)],
        env=env, capture_output=True, text=True, timeout=120, **kwargs,
    )  # fmt: skip


class LockHolder:
    """Another process that holds the output lock of `prefix` until it is told to stop."""

    def __init__(self, prefix):
        code = (
            "import sys; from rectool.atomic import OutputLock\n"
            f"with OutputLock({str(prefix)!r}):\n"
            "    print('locked', flush=True); sys.stdin.read()\n"
        )
        self.proc = python("-c", code, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "locked\n"

    def stop(self, kill=False):
        if kill:
            self.proc.kill()
        else:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


# -- one run a prefix --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [[], ["--resume"], ["--overwrite"], ["--shard-records", "2", "--finalize"]],
    ids=["pack", "resume", "overwrite", "finalize"],
)
def test_a_second_run_on_a_locked_prefix_is_refused_naming_it_and_the_pid(tree, tmp_path, args):
    root, lst, _ = tree
    prefix = tmp_path / "out" / "faces"
    prefix.parent.mkdir()
    holder = LockHolder(prefix)
    try:
        result = invoke("pack", lst, root, prefix, "-q", *args)
    finally:
        holder.stop()
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {prefix}: another rectool run (pid {holder.proc.pid}) is writing this output "
        f"(lock {prefix}.lock); wait for it to finish or stop it\n"
    )
    assert sorted(os.listdir(prefix.parent)) == []  # nothing written, the lock file removed


def test_only_shard_locks_its_shard_not_the_others(tree, tmp_path):
    root, lst, _ = tree
    prefix = tmp_path / "out" / "faces"
    prefix.parent.mkdir()
    holder = LockHolder(f"{prefix}-00001")
    try:
        busy = invoke("pack", lst, root, prefix, "-q", "--shard-records", "3", "--only-shard", "1")
        free = invoke("pack", lst, root, prefix, "-q", "--shard-records", "3", "--only-shard", "0")
    finally:
        holder.stop()
    assert busy.exit_code == 1
    assert f"Error: {prefix}-00001: another rectool run (pid {holder.proc.pid})" in busy.stderr
    assert free.exit_code == 0, free.output


def test_a_lock_left_by_a_killed_process_does_not_block_the_next_run(tree, tmp_path):
    root, lst, _ = tree
    prefix = tmp_path / "out" / "faces"
    prefix.parent.mkdir()
    holder = LockHolder(prefix)
    holder.stop(kill=True)
    assert (tmp_path / "out" / "faces.lock").exists()  # left behind by kill -9
    result = invoke("pack", lst, root, prefix, "-q")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out" / "faces.lock").exists()
    assert (tmp_path / "out" / "faces.manifest.json").exists()


def test_finalize_is_locked_in_the_library_too(tree, tmp_path):
    root, lst, _ = tree
    prefix = tmp_path / "faces"
    options = PackOptions(shard_records=3)
    for k in range(2):
        pack_images(lst, root, prefix, options, only_shard=k)
    holder = LockHolder(prefix)
    try:
        with pytest.raises(RectoolError, match="another rectool run"):
            finalize_pack(lst, root, prefix, options)
    finally:
        holder.stop()
    assert finalize_pack(lst, root, prefix, options).images == 6


# -- --overwrite keeps the old pack until the new one is complete ------------------------------


def old_pack(tree, tmp_path):
    """Pack the tree; return (prefix, {name: bytes} of the output folder)."""
    root, lst, _ = tree
    prefix = tmp_path / "out" / "faces"
    assert invoke("pack", lst, root, prefix, "-q", "--shard-records", "2").exit_code == 0
    return prefix, folder_bytes(prefix.parent)


def folder_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_overwrite_with_a_list_failing_on_its_last_line_keeps_the_old_pack(tree, tmp_path):
    root, lst, _ = tree
    prefix, before = old_pack(tree, tmp_path)
    bad = tmp_path / "bad.lst"
    bad.write_text(lst.read_text() + "99\tnot-a-label\tx.jpg\n")
    result = invoke("pack", bad, root, prefix, "-q", "--overwrite")
    assert result.exit_code == 1
    assert "line 7" in result.stderr
    assert folder_bytes(prefix.parent) == before
    assert invoke("verify", f"{prefix}.manifest.json", "-q").exit_code == 0


def test_overwrite_killed_mid_run_keeps_the_old_pack_verifiable(tree, tmp_path):
    root, lst, _ = tree
    prefix, before = old_pack(tree, tmp_path)
    killed = rectool("pack", lst, root, prefix, "-q", "--overwrite", "--resize", "20",
                     "--shard-records", "1", "--workers", "1",
                     env={"RECTOOL_TEST_FAULT": "SIGKILL:3"})  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    staged = tmp_path / "out" / ".faces.overwrite"
    assert any(name.startswith("faces-00000.") for name in os.listdir(staged))  # mid-run
    left = folder_bytes(prefix.parent)
    assert left.pop("faces.lock").strip().isdigit()  # the killed run's pid, harmless
    assert left == before
    assert rectool("verify", f"{prefix}.manifest.json", "-q").returncode == 0
    # The next --overwrite starts the new pack again and replaces the old one.
    again = invoke("pack", lst, root, prefix, "-q", "--overwrite", "--shard-records", "4")
    assert again.exit_code == 0, again.output
    assert sorted(folder_bytes(prefix.parent)) == [
        "faces-00000.idx", "faces-00000.rec", "faces-00001.idx", "faces-00001.rec",
        "faces.failures.jsonl", "faces.manifest.json",
    ]  # fmt: skip
    assert not staged.exists()
    assert invoke("verify", f"{prefix}.manifest.json", "-q").exit_code == 0


def test_overwrite_reports_the_final_paths(tree, tmp_path):
    root, lst, _ = tree
    prefix, _ = old_pack(tree, tmp_path)
    result = invoke("pack", lst, root, prefix, "--overwrite", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["manifest"] == f"{prefix}.manifest.json"
    assert summary["failures_file"] == f"{prefix}.failures.jsonl"
    assert summary["shards"] == ["faces.rec"]
    assert sorted(os.listdir(prefix.parent)) == [
        "faces.failures.jsonl", "faces.idx", "faces.manifest.json", "faces.rec",
    ]  # fmt: skip
