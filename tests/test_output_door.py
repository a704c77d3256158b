"""The one door out (rectool/doors/output.py): every command writes through it, and what it
promises holds at every step: an existing file is never replaced without --overwrite (a pack's
never), one lock a prefix, and after a kill or a failure at any step the old output or the new
one is whole. Faults are injected through the public hook (`output.set_fault_hook`, or
`RECTOOL_OUTPUT_FAULT` in a process of its own)."""

from __future__ import annotations

import ast
import errno
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli
from rectool.doors import output

REPO = Path(__file__).resolve().parent.parent


def invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def rectool(*args, env=None, timeout=120):
    """Run `rectool` in a process of its own (the timeout only guards against a hang)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rectool", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["alice", "bob"], 3)
    return root, write_list(tmp_path / "faces.lst", items)


@pytest.fixture
def fault():
    """Set a fault hook for one test: `fault(step, nth, error)` raises `error` there."""
    counts = Counter()

    def arm(step, nth, error):
        def hook(at, path):
            if at == step:
                counts[step] += 1
                if counts[step] == nth:
                    raise error(path)

        output.set_fault_hook(hook)
        return counts

    yield arm
    output.set_fault_hook(None)


def full_disk(path):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def files_of(folder):
    """Return {name: bytes} of the regular files in `folder`, hidden ones included."""
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def steps_counted(args):
    """Return how often a run of `rectool ARGS` reaches each fault step (in this process)."""
    counts = Counter()
    output.set_fault_hook(lambda step, path: counts.update([step]))
    try:
        result = invoke(*args)
    finally:
        output.set_fault_hook(None)
    assert result.exit_code == 0, result.output
    return counts


# -- going around the door ---------------------------------------------------------------------

# Calls that write, replace or remove files. Only the door out makes them (output.py and the
# modules it is built of); each exception is named with its reason.
WRITING = re.compile(
    r"os\.(replace|rename|link|symlink|unlink|remove|rmdir|truncate|ftruncate|mkdir|makedirs)\("
    r"|shutil\.(rmtree|move|copy\w*)\(|tempfile\.|\.write_(text|bytes)\("
    r"|(?<![\w.])open\([^,()]+,\s*[\"'][rbt]*[wax+][rwxab+t]*[\"']|mode=[\"'][rbt]*[wax+]"
    r"|O_CREAT|O_WRONLY|O_RDWR|\.tofile\("
)
ALLOWED = {
    # `python -m rectool.demo` builds a demo tree of its own in a folder it names.
    "demo.py": "the demo's own tree",
    "doors/output.py": "the door itself",
    "doors/files.py": "the door: single files and descriptors",
    "doors/lock.py": "the door: the lock file of a prefix",
    "doors/commit.py": "the door: a commit's staging folders",
    "doors/folder.py": "the door: OutputFolder's tree",
    # The emitted recordio module is mxnet.recordio's API (standalone): its 'w' mode writes
    # the user's files as MXNet does; no rectool command uses it.
    "recordio.py": "MXRecordIO 'w', as MXNet",
    # A memfd is memory, not a file: BatchBuffers sizes the ones a repack's batches are
    # gathered in (`os.ftruncate(memfd, ...)`); it names no path and leaves nothing behind.
    "repack/batches.py": "memfds sized, no file",
}


def test_no_module_but_output_writes_replaces_or_removes_files():
    offenders = []
    for path in sorted((REPO / "rectool").glob("**/*.py")):
        if path.relative_to(REPO / "rectool").as_posix() in ALLOWED:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if WRITING.search(code):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_door_check_finds_a_write_that_goes_around_it():
    assert WRITING.search('with open(path, "wb") as f:')
    assert WRITING.search("os.replace(tmp, final)")
    assert WRITING.search("fd = os.open(path, os.O_WRONLY | os.O_CREAT)")
    assert not WRITING.search('with open(path, "rb") as f:')
    assert not WRITING.search('os.fdopen(create_new(path), "wb")')  # a descriptor from the door


def writing_modules():
    """Return the modules of rectool (paths below rectool/) with a call that `WRITING` finds."""
    found = set()
    for path in (REPO / "rectool").glob("**/*.py"):
        lines = path.read_text(encoding="utf-8").splitlines()
        if any(WRITING.search(line.split("#", 1)[0]) for line in lines):
            found.add(path.relative_to(REPO / "rectool").as_posix())
    return found


def test_every_allowed_module_still_writes():
    assert sorted(set(ALLOWED) - writing_modules()) == []


# The modules the door out is built of. Every module outside doors/ imports what they give
# through output.py, so that the one door stays one import.
DOOR_PARTS = {"commit", "faults", "files", "folder", "lock", "targets"}


def door_part_imports(source):
    """Return `line: module` for each import in `source` of a part of the door but output.py."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = (node.module or "").removeprefix("rectool.")
            parts = {module.split(".", 1)[1]} if module.startswith("doors.") else set()
            if module == "doors":
                parts = {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
            parts = {name[2] for name in names if name[:2] == ["rectool", "doors"] and name[2:]}
        else:
            continue
        found += [f"{node.lineno}: doors.{part}" for part in sorted(parts & DOOR_PARTS)]
    return found


def test_every_module_outside_the_door_imports_it_through_output():
    offenders = []
    for path in sorted((REPO / "rectool").glob("**/*.py")):
        if path.parent.name != "doors":
            source = path.read_text(encoding="utf-8")
            offenders += [f"{path.relative_to(REPO)}:{hit}" for hit in door_part_imports(source)]
    assert offenders == []


def test_the_door_import_check_finds_one():
    assert door_part_imports("from ..doors.files import write_atomic\n") == ["1: doors.files"]
    assert door_part_imports("from ..doors import lock\n") == ["1: doors.lock"]
    assert door_part_imports("import rectool.doors.commit\n") == ["1: doors.commit"]
    assert door_part_imports("from rectool.doors.folder import OutputFolder\n") == [
        "1: doors.folder"
    ]
    assert door_part_imports("from ..doors.output import write_atomic\n") == []
    assert door_part_imports("from ..doors import output, inputs\n") == []


# -- one output file: never replaced by accident ------------------------------------------------


@pytest.fixture
def pack(tree, tmp_path):
    root, lst = tree
    prefix = tmp_path / "out" / "faces"
    assert invoke("pack", lst, root, prefix, "-q", "--shard-records", "4").exit_code == 0
    return prefix


@pytest.mark.parametrize(
    "command",
    [
        ["dali-index", "{pack}", "{pack}-00000.idx"],
        ["report", "{pack}", "-o", "{pack}-00000.rec"],
        ["reader", "-o", "{pack}-00000.rec"],
        ["list", "{root}", "{pack}-00001.rec"],
        ["list", "{root}", "{tmp}/new.lst", "--labels", "{pack}.manifest.json"],
        ["reindex", "{pack}-00000.rec", "-o", "{pack}-00001.idx"],
    ],
    ids=["dali-index", "report", "reader", "list", "labels", "reindex"],
)
@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_a_file_of_a_pack_is_never_replaced_by_another_command(
    tree, tmp_path, pack, command, overwrite
):
    root, _ = tree
    before = files_of(pack.parent)
    args = [a.format(pack=pack, root=root, tmp=tmp_path) for a in command] + (
        ["--overwrite"] if overwrite else []
    )
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert "refusing to replace it" in result.stderr or (
        not overwrite and "exists; use --overwrite" in result.stderr
    )
    assert files_of(pack.parent) == before
    assert not (tmp_path / "new.lst").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["dali-index", "{pack}", "{out}"],
        ["report", "{pack}", "-o", "{out}"],
        ["reader", "-o", "{out}"],
        ["list", "{root}", "{out}"],
    ],
    ids=["dali-index", "report", "reader", "list"],
)
def test_an_existing_output_is_replaced_only_with_overwrite(tree, tmp_path, pack, command):
    root, _ = tree
    out = tmp_path / "elsewhere" / "x.out"
    out.parent.mkdir()
    out.write_bytes(b"precious")
    args = [a.format(pack=pack, root=root, out=out) for a in command]
    result = invoke(*args)
    assert result.exit_code == 1
    assert f"Error: {out}: exists; use --overwrite to replace it\n" in result.stderr
    assert out.read_bytes() == b"precious"
    result = invoke(*args, "--overwrite", "-q" if command[0] == "list" else "--json")
    assert result.exit_code == 0, result.output
    assert out.read_bytes() != b"precious"


@pytest.mark.parametrize("command", ["dali-index", "report", "reader", "reindex"])
def test_a_missing_output_folder_is_created(tree, tmp_path, pack, command):
    out = tmp_path / "new" / "folder" / "x.out"
    args = {
        "dali-index": ["dali-index", pack, out],
        "report": ["report", pack, "-o", out],
        "reader": ["reader", "-o", out],
        "reindex": ["reindex", f"{pack}-00000.rec", "-o", out],
    }[command]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert out.is_file()


# -- a list: all its files, or none -------------------------------------------------------------


@pytest.mark.parametrize("nth", [1, 2, 3, 4])
@pytest.mark.parametrize("step", ["create", "write", "fsync", "journal"])
def test_a_list_that_fails_half_way_leaves_the_old_files_together(tree, tmp_path, fault, step, nth):
    root, _ = tree
    out = tmp_path / "lists" / "faces.lst"
    assert invoke("list", root, out, "-q", "--val-ratio", "0.5").exit_code == 0
    before = files_of(out.parent)
    counts = fault(step, nth, full_disk)
    result = invoke(
        "list", root, out, "-q", "--val-ratio", "0.5", "--shuffle", "--seed", "3", "--overwrite"
    )
    if counts[step] < nth:
        pytest.skip(f"the list run reaches {step} only {counts[step]} times")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and "No space left on device" in result.stderr
    assert files_of(out.parent) == before  # the old files, and no temporary left


def test_a_list_interrupted_after_its_commit_point_is_finished_by_the_next_run(
    tree, tmp_path, fault
):
    root, _ = tree
    out = tmp_path / "lists" / "faces.lst"
    assert invoke("list", root, out, "-q", "--val-ratio", "0.5").exit_code == 0
    fault("swap", 2, lambda path: KeyboardInterrupt())  # stopped half-way through the moves
    args = ["list", root, out, "-q", "--val-ratio", "0.5", "--shuffle", "--seed", "3"]
    assert invoke(*args, "--overwrite").exit_code == 130
    output.set_fault_hook(None)
    assert (out.parent / ".faces.lst.commit-journal.json").exists()
    new = tmp_path / "again" / "faces.lst"
    assert (
        invoke("list", root, new, "-q", "--val-ratio", "0.5", "--shuffle", "--seed", "3").exit_code
        == 0
    )
    # The next run of the same output rolls the journal forward first, then refuses (no
    # --overwrite): what is on disk is the committed, new listing, whole.
    result = invoke(*args)
    assert result.exit_code == 1
    assert files_of(out.parent) == files_of(new.parent)


# -- pack and repack --overwrite: killed at every step ---------------------------------------


def _shard_names(prefix):
    manifest = json.loads(Path(f"{prefix}.manifest.json").read_text())
    return sorted(n for s in manifest["shards"] for n in (s["rec"], s["idx"]))


def _pack_files(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith((".rec", ".idx")))


def _pack_state(folder):
    """Return {name: bytes} of every file of the pack in `folder`: shards, index arrays,
    manifest and sidecars (not the lock a killed run leaves, nor hidden staging)."""
    names = (n for n in sorted(os.listdir(folder)) if n[0] != "." and not n.endswith(".lock"))
    return {n: (Path(folder) / n).read_bytes() for n in names if (Path(folder) / n).is_file()}


OVERWRITES = {
    # Old: one shard; new: three, so a half swap would mix names (faces.rec beside -0000K).
    "pack": (
        ["pack", "{lst}", "{root}", "{prefix}", "-q"],
        ["pack", "{lst}", "{root}", "{prefix}", "-q", "--overwrite", "--shard-records", "2"],
    ),
    "repack": (
        ["repack", "{source}", "{prefix}", "-q"],
        ["repack", "{source}", "{prefix}", "-q", "--overwrite", "--shard-records", "2"],
    ),
}


@pytest.mark.parametrize("command", sorted(OVERWRITES))
def test_overwrite_killed_at_every_step_leaves_the_old_or_the_new_pack_whole(
    tree, tmp_path, command, monkeypatch
):
    """Every file of the pack (its binary index too) is the old one's or, all of them, the
    new one's: a half swap would pair old .npy arrays with new shards."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # the same manifest each run
    root, lst = tree
    source = tmp_path / "source" / "faces"
    assert invoke("pack", lst, root, source, "-q").exit_code == 0
    first, second = OVERWRITES[command]
    prefix = tmp_path / "out" / "faces"
    names = {"lst": lst, "root": root, "prefix": prefix, "source": source}
    first, second = ([a.format(**names) for a in args] for args in (first, second))
    assert invoke(*first).exit_code == 0
    old = _pack_state(prefix.parent)
    assert invoke(*second).exit_code == 0
    new = _pack_state(prefix.parent)
    assert _pack_files(prefix.parent) == _shard_names(prefix) and len(_shard_names(prefix)) == 6
    index = {"faces.offsets.npy", "faces.keys.npy", "faces.labels.npy", "faces.manifest.json"}
    assert index <= set(old) & set(new) and {"faces.idx", "faces.rec"} <= set(old)
    # (The same samples in 3 shards, not 1: the offsets differ, keys and labels do not.)
    assert all(old[n] != new[n] for n in ("faces.offsets.npy", "faces.manifest.json"))
    counts = steps_counted(second)
    assert set(counts) >= {"create", "write", "fsync", "rename", "journal", "swap", "manifest"}
    outcomes = Counter()
    for step, total in sorted(counts.items()):
        for nth in range(1, total + 1):
            assert invoke(*first, "--overwrite").exit_code == 0
            killed = rectool(*second, env={output.FAULT_ENV: f"{step}:{nth}:kill"})
            assert killed.returncode == -signal.SIGKILL, (step, nth, killed.stderr)
            verdict = invoke("verify", prefix, "--json")
            assert verdict.exit_code == 0, (step, nth, verdict.output)
            assert json.loads(verdict.stdout)["sound"]
            on_disk = _pack_state(prefix.parent)
            assert on_disk in (old, new), (step, nth, sorted(on_disk))
            assert _shard_names(prefix) == _pack_files(prefix.parent)
            outcomes["old" if on_disk == old else "new"] += 1
    assert outcomes["old"] and outcomes["new"]  # both sides of the commit point were hit


@pytest.mark.parametrize("command", sorted(OVERWRITES))
@pytest.mark.parametrize("step", ["create", "write", "fsync", "rename", "shard"])
def test_a_full_disk_during_overwrite_keeps_the_old_pack_and_removes_what_was_staged(
    tree, tmp_path, fault, command, step
):
    root, lst = tree
    source = tmp_path / "source" / "faces"
    assert invoke("pack", lst, root, source, "-q").exit_code == 0
    first, second = OVERWRITES[command]
    prefix = tmp_path / "out" / "faces"
    names = {"lst": lst, "root": root, "prefix": prefix, "source": source}
    first, second = ([a.format(**names) for a in args] for args in (first, second))
    assert invoke(*first).exit_code == 0
    before = files_of(prefix.parent)
    fault(step, 2, full_disk)
    result = invoke(*second)
    assert result.exit_code == 1, result.output
    assert re.fullmatch(r"Error: \S+: cannot write \(No space left on device\)\n", result.stderr)
    assert files_of(prefix.parent) == before
    assert sorted(os.listdir(prefix.parent)) == sorted(before)  # no staging folder left


def test_a_full_disk_at_the_checksum_file_names_it(tree, tmp_path, fault):
    root, lst = tree
    prefix = tmp_path / "out" / "faces"

    def hook(step, path):
        if step == "create" and path.endswith(".rec.crc"):
            raise full_disk(path)

    output.set_fault_hook(hook)
    result = invoke("pack", lst, root, prefix, "-q")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {prefix}.rec.crc: cannot write (No space left on device)\n"


# -- one lock a prefix ---------------------------------------------------------------------------


class LockHolder:
    """Another process holding the lock of `prefix` (shared: as an --only-shard task does)."""

    def __init__(self, prefix, shared=False):
        code = (
            "import sys; from rectool.doors.output import OutputLock\n"
            f"with OutputLock({str(prefix)!r}, shared={shared}):\n"
            "    print('locked', flush=True); sys.stdin.read()\n"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline() == "locked\n"

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _refused(result, prefix, holder):
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"Error: {prefix}: another rectool run (pid {holder.proc.pid}) is writing this output "
        f"(lock {prefix}.lock); wait for it to finish or stop it\n"
    )
    assert "--resume" not in result.stderr and "--overwrite" not in result.stderr


@pytest.mark.parametrize("args", [[], ["--resume"], ["--overwrite"]])
def test_repack_beside_a_running_repack_is_refused(tree, tmp_path, pack, args):
    prefix = tmp_path / "re" / "faces"
    prefix.parent.mkdir()
    holder = LockHolder(prefix)
    try:
        result = invoke("repack", pack, prefix, "-q", *args)
    finally:
        holder.stop()
    _refused(result, prefix, holder)
    assert os.listdir(prefix.parent) == []


def test_a_shard_task_beside_a_whole_pack_of_the_prefix_is_refused(tree, tmp_path):
    root, lst = tree
    prefix = tmp_path / "out" / "faces"
    prefix.parent.mkdir()
    holder = LockHolder(prefix)
    try:
        result = invoke(
            "pack", lst, root, prefix, "-q", "--shard-records", "2", "--only-shard", "0"
        )
    finally:
        holder.stop()
    _refused(result, prefix, holder)


def test_a_whole_pack_beside_a_shard_task_is_refused_and_shard_tasks_run_together(tree, tmp_path):
    root, lst = tree
    prefix = tmp_path / "out" / "faces"
    prefix.parent.mkdir()
    holder = LockHolder(prefix, shared=True)  # a running --only-shard task
    try:
        whole = invoke("pack", lst, root, prefix, "-q", "--shard-records", "2")
        shard = invoke("pack", lst, root, prefix, "-q", "--shard-records", "2", "--only-shard", "1")
    finally:
        holder.stop()
    assert whole.exit_code == 1
    assert "another rectool run" in whole.stderr and "--resume" not in whole.stderr
    assert shard.exit_code == 0, shard.output
    assert (tmp_path / "out" / "faces-00001.rec").exists()


# -- what verify and the readers make of an unfinished prefix ----------------------------------


def test_verify_never_calls_an_unfinished_pack_sound(tree, tmp_path):
    root, lst = tree
    prefix = tmp_path / "out" / "faces"
    flags = "-q --shard-records 2".split()
    killed = rectool("pack", lst, root, prefix, *flags, env={output.FAULT_ENV: "shard:3:kill"})
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "out" / "faces-00000.rec").exists()  # a finished shard beside .partials
    for target in (prefix, f"{prefix}-00000.rec"):
        result = invoke("verify", target)
        assert result.exit_code == 2
        assert result.stderr == (
            f"Error: {prefix}: an unfinished pack ({prefix}.pack-state.json is there); continue "
            "it: run the command that wrote it again with --resume\n"
        )


def test_a_replacement_killed_after_its_commit_point_is_refused_by_readers_and_verify_finishes_it(
    tree, tmp_path
):
    root, lst = tree
    prefix = tmp_path / "out" / "faces"
    assert invoke("pack", lst, root, prefix, "-q").exit_code == 0
    flags = "-q --overwrite --shard-records 2".split()
    killed = rectool("pack", lst, root, prefix, *flags, env={output.FAULT_ENV: "swap:3:kill"})
    assert killed.returncode == -signal.SIGKILL
    assert Path(f"{prefix}.commit-journal.json").exists()
    assert not Path(f"{prefix}.manifest.json").exists()  # the old one went first
    for command in (["info", prefix], ["unpack", prefix, tmp_path / "u"]):
        result = invoke(*command)
        assert result.exit_code == 1
        assert "was interrupted after the new pack was complete" in result.stderr
        assert f"`rectool verify {prefix}` finishes it" in result.stderr
    result = invoke("verify", prefix)
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"Finished replacing {prefix}: ")
    assert _pack_files(prefix.parent) == _shard_names(prefix)
    assert len(_shard_names(prefix)) == 6
    assert not any(n.startswith(".") for n in os.listdir(prefix.parent))


# -- unpack: never outside OUT_DIR ---------------------------------------------------------------


def test_unpack_never_writes_through_a_link_planted_in_out_dir(tree, tmp_path, pack):
    out, outside = tmp_path / "unpacked", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (out / "0").symlink_to(outside)  # where label 0's images would go
    result = invoke("unpack", pack, out)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {out / '0'}: is a symlink or not a folder; refusing to write through it\n"
    )
    assert os.listdir(outside) == []


def test_unpack_never_writes_through_a_link_at_a_file_name(tree, tmp_path, pack):
    out, victim = tmp_path / "unpacked", tmp_path / "victim"
    victim.write_bytes(b"keep")
    (out / "0").mkdir(parents=True)
    (out / "0" / "0.jpg").symlink_to(victim)
    result = invoke("unpack", pack, out)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {out / '0' / '0.jpg'}: exists; unpack into an empty folder (or add --resume)\n"
    )
    assert victim.read_bytes() == b"keep"


# -- SIGTERM ----------------------------------------------------------------------------------


def test_sigterm_is_handled_as_ctrl_c_with_a_message_and_exit_143(tree, tmp_path):
    root, lst = tree
    prefix = tmp_path / "out" / "faces"
    stopped = rectool("pack", lst, root, prefix, env={"RECTOOL_TEST_FAULT": "SIGTERM:3"})
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.splitlines()[-2].startswith("Terminated (SIGTERM) after ")
    assert stopped.stderr.endswith("Run the same command with --resume to continue it.\n")
    resumed = invoke("pack", lst, root, prefix, "-q", "--resume")
    assert resumed.exit_code == 0
    assert invoke("verify", prefix).exit_code == 0


def test_sigterm_during_overwrite_removes_the_staging_folder(tree, tmp_path):
    root, lst = tree
    prefix = tmp_path / "out" / "faces"
    assert invoke("pack", lst, root, prefix, "-q").exit_code == 0
    before = files_of(prefix.parent)
    flags = "--overwrite --shard-records 2".split()
    stopped = rectool("pack", lst, root, prefix, *flags, env={output.FAULT_ENV: "shard:2:term"})
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.endswith(
        f"Terminated (SIGTERM): the pack at {prefix} is unchanged; the new one was not finished "
        "and its staging folder was removed (run the command again to start it over).\n"
    )
    assert files_of(prefix.parent) == before
    assert sorted(os.listdir(prefix.parent)) == sorted(before)


# -- unpack --resume --------------------------------------------------------------------------


def _tree_bytes(folder):
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(Path(folder).rglob("*"))
        if p.is_file()
    }


def test_an_unpack_killed_half_way_leaves_whole_files_and_resume_finishes_it(tmp_path, pack):
    whole = tmp_path / "whole"
    assert invoke("unpack", pack, whole, "-q").exit_code == 0
    out = tmp_path / "unpacked"
    killed = rectool("unpack", pack, out, env={output.FAULT_ENV: "rename:4:kill"})
    assert killed.returncode == -signal.SIGKILL
    left = _tree_bytes(out)
    finished = {n: b for n, b in left.items() if not Path(n).name.startswith(".")}
    assert len(finished) == 3  # three linked into place, the fourth cut off before its name
    assert all(whole_bytes == _tree_bytes(whole)[n] for n, whole_bytes in finished.items())
    again = invoke("unpack", pack, out)
    assert again.exit_code == 1
    assert "exists; unpack into an empty folder (or add --resume)" in again.stderr
    resumed = invoke("unpack", pack, out, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "6 images, 3 of them already there" in resumed.stderr
    assert _tree_bytes(out) == _tree_bytes(whole)  # the hidden partial file is gone too


def test_unpack_resume_never_replaces_a_file_with_other_bytes(tmp_path, pack):
    out = tmp_path / "unpacked"
    assert invoke("unpack", pack, out, "-q").exit_code == 0
    victim = sorted(out.rglob("*.jpg"))[2]
    victim.write_bytes(b"someone else's")
    result = invoke("unpack", pack, out, "--resume")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {victim}: exists with other bytes than this record; it is never replaced "
        "(unpack into an empty folder)\n"
    )
    assert victim.read_bytes() == b"someone else's"


def test_an_interrupted_unpack_says_how_to_continue(tmp_path, pack):
    out = tmp_path / "unpacked"
    stopped = rectool("unpack", pack, out, env={output.FAULT_ENV: "create:3:term"})
    assert stopped.returncode == 143
    assert stopped.stderr.endswith(
        f"the files written under {out} are whole.\n"
        "Run the same command with --resume to continue it.\n"
    )
    assert stopped.stderr.startswith("Terminated (SIGTERM) after about ")
