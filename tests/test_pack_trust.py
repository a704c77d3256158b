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
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.format.headers import unpack_header
from rectool.format.records import IndexedRecordFile
from rectool.packer.packing import PackOptions, finalize_pack, pack_images

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def two_identity_tree(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["alice", "bob"], 3)
    return root, write_list(tmp_path / "faces.lst", items), items


def invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def python(*args, **kwargs):
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.Popen([sys.executable, *args], env=env, **kwargs)


def rectool(*args, env=None, timeout=120, **kwargs):
    """Run `rectool` in a process of its own; return the finished CompletedProcess.

    The timeout only guards against a hang; no test depends on how long a run takes.
    """
    env = {**os.environ, "PYTHONPATH": REPO, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rectool", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_default_sigint,
        **kwargs,
    )


def _default_sigint():
    # A SIGINT that something in this test process ignores would be ignored by the child too
    # (an ignored signal stays ignored across exec): the Ctrl-C tests need Python's handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class LockHolder:
    """Another process that holds the output lock of `prefix` until it is told to stop."""

    def __init__(self, prefix):
        code = (
            "import sys; from rectool.doors.output import OutputLock\n"
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
def test_a_second_run_on_a_locked_prefix_is_refused_naming_it_and_the_pid(
    two_identity_tree, tmp_path, args
):
    root, lst, _ = two_identity_tree
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


def test_only_shard_locks_its_shard_not_the_others(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
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


def test_a_lock_left_by_a_killed_process_does_not_block_the_next_run(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
    prefix = tmp_path / "out" / "faces"
    prefix.parent.mkdir()
    holder = LockHolder(prefix)
    holder.stop(kill=True)
    assert (tmp_path / "out" / "faces.lock").exists()  # left behind by kill -9
    result = invoke("pack", lst, root, prefix, "-q")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out" / "faces.lock").exists()
    assert (tmp_path / "out" / "faces.manifest.json").exists()


def test_finalize_is_locked_in_the_library_too(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
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


def test_overwrite_with_a_list_failing_on_its_last_line_keeps_the_old_pack(
    two_identity_tree, tmp_path
):
    root, lst, _ = two_identity_tree
    prefix, before = old_pack(two_identity_tree, tmp_path)
    bad = tmp_path / "bad.lst"
    bad.write_text(lst.read_text() + "99\tnot-a-label\tx.jpg\n")
    result = invoke("pack", bad, root, prefix, "-q", "--overwrite")
    assert result.exit_code == 1
    assert "line 7" in result.stderr
    assert folder_bytes(prefix.parent) == before
    assert invoke("verify", f"{prefix}.manifest.json", "-q").exit_code == 0


def test_overwrite_killed_mid_run_keeps_the_old_pack_verifiable(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
    prefix, before = old_pack(two_identity_tree, tmp_path)
    flags = "-q --overwrite --resize 20 --shard-records 1 --workers 1".split()
    killed = rectool("pack", lst, root, prefix, *flags, env={"RECTOOL_TEST_FAULT": "SIGKILL:3"})
    assert killed.returncode == -signal.SIGKILL
    staged = tmp_path / "out" / ".faces.overwrite"
    assert any(name.startswith("faces-00000.") for name in os.listdir(staged))  # mid-run
    left = folder_bytes(prefix.parent)
    assert left.pop("faces.lock").split()[0].isdigit()  # the killed run's pid, harmless
    assert left == before
    assert rectool("verify", f"{prefix}.manifest.json", "-q").returncode == 0
    # The next --overwrite starts the new pack again and replaces the old one.
    again = invoke("pack", lst, root, prefix, "-q", "--overwrite", "--shard-records", "4")
    assert again.exit_code == 0, again.output
    assert sorted(folder_bytes(prefix.parent)) == [
        *("faces-00000.idx", "faces-00000.rec", "faces-00000.rec.crc"),
        *("faces-00001.idx", "faces-00001.rec", "faces-00001.rec.crc"),
        *("faces.failures.jsonl", "faces.keys.npy", "faces.labels.npy"),
        *("faces.manifest.json", "faces.offsets.npy"),
    ]
    assert not staged.exists()
    assert invoke("verify", f"{prefix}.manifest.json", "-q").exit_code == 0


def test_overwrite_reports_the_final_paths(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
    prefix, _ = old_pack(two_identity_tree, tmp_path)
    result = invoke("pack", lst, root, prefix, "--overwrite", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["manifest"] == f"{prefix}.manifest.json"
    assert summary["failures_file"] == f"{prefix}.failures.jsonl"
    assert summary["shards"] == [f"{prefix}.rec"]
    assert sorted(os.listdir(prefix.parent)) == (
        "faces.failures.jsonl faces.idx faces.keys.npy faces.labels.npy faces.manifest.json "
        "faces.offsets.npy faces.rec faces.rec.crc".split()
    )


# -- what is not a regular image file inside ROOT is refused -----------------------------------

REFUSE_ARGS = {
    "pass-through": [],
    "pass-through on threads": ["--workers", "2"],  # the block path, then threads if slow
    "decode check": ["--check", "decode", "--workers", "2"],
    "re-encode": ["--resize", "20", "--workers", "1"],
}


def pack_with(tmp_path, root, entries, args, timeout=120):
    """Pack `entries` (path, label) listed after a real image, in a process of its own; return
    ({path: reason} refused, CompletedProcess)."""
    items = [(0, 0, "alice/000.jpg")] + [(i + 1, 0, p) for i, p in enumerate(entries)]
    lst = write_list(tmp_path / "odd.lst", items)
    prefix = tmp_path / "odd" / "out"
    flags = "-q --max-failures 100 --overwrite".split()
    done = rectool("pack", lst, root, prefix, *flags, *args, timeout=timeout)
    assert done.returncode == 0, done.stderr
    with open(f"{prefix}.failures.jsonl", encoding="utf-8") as f:
        refused = {entry["path"]: entry["reason"] for entry in map(json.loads, f)}
    return refused, done


@pytest.mark.parametrize("mode", REFUSE_ARGS)
def test_fifo_dev_zero_directory_and_socket_are_refused_not_read(two_identity_tree, tmp_path, mode):
    import socket

    root, _, _ = two_identity_tree
    os.mkfifo(root / "fifo.jpg")
    os.symlink("/dev/zero", root / "zero.jpg")
    (root / "folder.jpg").mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "socket.jpg"))
    try:
        refused, _ = pack_with(
            tmp_path,
            root,
            ["fifo.jpg", "zero.jpg", "folder.jpg", "socket.jpg"],
            # /dev/zero is outside ROOT: allowed here, so that the device itself is refused
            [*REFUSE_ARGS[mode], "--allow-outside-root"],
        )
    finally:
        server.close()
    assert refused == {
        "fifo.jpg": "not a regular file (a FIFO)",
        "zero.jpg": "not a regular file (a character device)",
        "folder.jpg": "is a directory, not an image file",
        "socket.jpg": "cannot read (No such device or address)",
    }


@pytest.mark.parametrize("mode", ["pass-through", "re-encode"])
def test_a_file_over_the_record_limit_is_refused_without_reading_it(
    two_identity_tree, tmp_path, mode
):
    from rectool.reader import MAX_RECORD_BYTES

    root, _, _ = two_identity_tree
    with open(root / "huge.jpg", "wb") as f:
        f.truncate(MAX_RECORD_BYTES + 1)  # sparse: no disk used
    refused, _ = pack_with(tmp_path, root, ["huge.jpg"], REFUSE_ARGS[mode])
    assert refused == {"huge.jpg": f"record exceeds the RecordIO limit of {MAX_RECORD_BYTES} bytes"}


# -- paths that leave ROOT ---------------------------------------------------------------------

OUTSIDE = "outside-root: the path leaves ROOT (--allow-outside-root packs it)"


@pytest.mark.parametrize("mode", REFUSE_ARGS)
def test_paths_leaving_root_are_refused_unless_allowed(two_identity_tree, tmp_path, mode):
    from helpers.image_files import jpeg_bytes

    root, _, _ = two_identity_tree
    secret = tmp_path / "outside" / "secret.jpg"
    secret.parent.mkdir()
    secret.write_bytes(jpeg_bytes(99))
    paths = ["../outside/secret.jpg", str(secret), "alice/../bob/000.jpg", "./alice/001.jpg"]
    refused, _ = pack_with(tmp_path, root, paths, REFUSE_ARGS[mode])
    assert refused == {"../outside/secret.jpg": OUTSIDE, str(secret): OUTSIDE}
    refused, _ = pack_with(tmp_path, root, paths, [*REFUSE_ARGS[mode], "--allow-outside-root"])
    assert refused == {}
    with IndexedRecordFile(tmp_path / "odd" / "out.rec") as records:
        assert records.keys.tolist() == [0, 1, 2, 3, 4]
        if mode.startswith("pass"):
            image = unpack_header(records.read(1))[1]
            assert image == unpack_header(records.read(2))[1] == secret.read_bytes()


def test_rectool_list_never_writes_a_path_that_leaves_root(tmp_path):
    from helpers.image_files import jpeg_bytes

    outside = tmp_path / "outside"
    (outside / "carol").mkdir(parents=True)
    (outside / "carol" / "1.jpg").write_bytes(jpeg_bytes(1))
    root = tmp_path / "tree"
    write_pack_tree(root, ["alice"], 2)
    os.symlink(outside / "carol", root / "carol")  # a folder linked from elsewhere
    result = invoke("list", root, tmp_path / "t.lst", "-q")
    assert result.exit_code == 0, result.output
    from rectool.packer.passthrough import leaves_root

    paths = [line.split("\t")[-1] for line in (tmp_path / "t.lst").read_text().splitlines()]
    assert paths and not any(leaves_root(p) for p in paths)


# -- --resume of a complete pack compares what made it -----------------------------------------


def test_resume_of_a_complete_pack_refuses_another_list_root_or_option(two_identity_tree, tmp_path):
    root, lst, items = two_identity_tree
    prefix = tmp_path / "out" / "faces"
    assert invoke("pack", lst, root, prefix, "-q", "--resize", "24").exit_code == 0
    manifest = f"{prefix}.manifest.json"
    before = folder_bytes(prefix.parent)

    same = invoke("pack", lst, root, prefix, "-q", "--resize", "24", "--resume")
    assert same.exit_code == 0, same.output

    shorter = tmp_path / "short.lst"
    write_list(shorter, items[:-1])
    other_root = tmp_path / "other"
    other_root.mkdir()
    refusals = {
        "shorter list": ([shorter, root, prefix, "--resize", "24"], []),
        "ROOT": ([lst, other_root, prefix, "--resize", "24"], []),
        "--resize": ([lst, root, prefix, "--resize", "32"], []),
        "pass-through": ([lst, root, prefix, "--check", "decode"], []),
        "stdin": (["-", root, prefix, "--resize", "24"], [shorter.read_text()]),
    }
    messages = {}
    for name, (args, stdin) in refusals.items():
        result = invoke("pack", *args, "-q", "--resume", input=stdin[0] if stdin else None)
        assert result.exit_code == 1, name
        messages[name] = result.stderr
    tail = ". Resume with the same list, ROOT and options, or start again with --overwrite\n"
    assert messages["shorter list"].startswith(
        f"Error: {manifest}: cannot resume: the list differs (sha256 "
    )
    assert messages["shorter list"].endswith(" in the pack)" + tail)
    assert messages["stdin"].startswith(f"Error: {manifest}: cannot resume: the list differs")
    assert messages["ROOT"] == (
        f"Error: {manifest}: cannot resume: ROOT differs ({other_root} now, {root} in the pack)"
        + tail
    )
    assert messages["--resize"] == (
        f"Error: {manifest}: cannot resume: --resize differs (32 now, 24 in the pack)" + tail
    )
    assert messages["pass-through"] == (
        f"Error: {manifest}: cannot resume: re-encoding differs (pass-through now, --resize 24 "
        '--center-crop false --quality 95 --encoding ".jpg" --color 1 in the pack); --check '
        'differs ("decode" now, "structure" in the pack)' + tail
    )
    assert folder_bytes(prefix.parent) == before  # the stdin copy too is gone


# -- temporary and partial files ---------------------------------------------------------------


def test_planted_symlinks_at_temporary_names_are_not_followed(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in ("faces.manifest.json", "faces.pack-state.json", "faces.lst"):
        os.symlink(victim, out / f"{name}.tmp{os.getpid()}")  # the old predictable names
    result = invoke("pack", lst, root, out / "faces", "-q")
    assert result.exit_code == 0, result.output
    assert invoke("list", root, out / "faces.lst", "-q").exit_code == 0
    assert victim.read_text() == "precious\n"
    assert invoke("verify", out / "faces.manifest.json", "-q").exit_code == 0


def test_planted_symlinks_at_partial_names_are_replaced_not_followed(tmp_path):
    from rectool.format.writer import frame_record
    from rectool.packer.shards import ShardWriter

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in ("s.rec.partial", "s.idx.partial"):
        os.symlink(victim, tmp_path / name)
    writer = ShardWriter(tmp_path / "s")
    writer.add(7, frame_record(b"record"))
    writer.close()
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "s.rec").is_symlink()
    with IndexedRecordFile(tmp_path / "s.rec") as records:
        assert records.read(7) == b"record"


def test_resume_refuses_a_symlink_planted_at_a_partial_name(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
    prefix = tmp_path / "out" / "faces"
    flags = "-q --workers 1 --resize 20".split()
    killed = rectool("pack", lst, root, prefix, *flags, env={"RECTOOL_TEST_FAULT": "SIGKILL:1"})
    assert killed.returncode == -signal.SIGKILL
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    partial = tmp_path / "out" / "faces.failures.jsonl.partial"
    partial.unlink()
    os.symlink(victim, partial)
    result = invoke("pack", lst, root, prefix, "-q", "--resize", "20", "--resume")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {partial}: is a symlink, not a file this pack wrote; remove it\n"
    )
    assert victim.read_text() == "precious\n"


def test_outputs_get_the_mode_of_a_normally_created_file(two_identity_tree, tmp_path):
    root, _, _ = two_identity_tree
    (tmp_path / "l").mkdir()
    (tmp_path / "m").mkdir()
    old = os.umask(0o022)
    try:
        assert invoke("list", root, tmp_path / "l" / "faces.lst", "-q").exit_code == 0
        packed = invoke("pack", tmp_path / "l" / "faces.lst", root, tmp_path / "p" / "faces", "-q")
        assert packed.exit_code == 0, packed.output
        os.umask(0o027)
        assert invoke("list", root, tmp_path / "m" / "faces.lst", "-q").exit_code == 0
    finally:
        os.umask(old)
    modes = {
        p.relative_to(tmp_path).as_posix(): oct(p.stat().st_mode & 0o777)
        for p in sorted(tmp_path.glob("[lpm]/*"))
    }
    assert modes == {
        "l/faces.labels.tsv": "0o644",
        "l/faces.lst": "0o644",
        "m/faces.labels.tsv": "0o640",
        "m/faces.lst": "0o640",
        "p/faces.failures.jsonl": "0o644",
        "p/faces.identities.json": "0o644",
        "p/faces.idx": "0o644",
        "p/faces.keys.npy": "0o644",
        "p/faces.labels.npy": "0o644",
        "p/faces.manifest.json": "0o644",
        "p/faces.offsets.npy": "0o644",
        "p/faces.rec": "0o644",
        "p/faces.rec.crc": "0o644",
    }


# -- list errors before anything is written ----------------------------------------------------


@pytest.mark.parametrize(
    "index, message",
    [
        (2**64, f"index {2**64} is too large: record keys are 64-bit signed, at most {2**63 - 1}"),
        (2**63, f"index {2**63} is too large: record keys are 64-bit signed, at most {2**63 - 1}"),
        (-1, "index -1 is negative"),
    ],
)
@pytest.mark.parametrize("args", [[], ["--resize", "20"], ["--shard-records", "2"]])
def test_an_index_out_of_range_is_a_list_error_before_anything_is_written(
    two_identity_tree, tmp_path, index, message, args
):
    root, _, items = two_identity_tree
    lst = write_list(tmp_path / "bad.lst", [*items, (index, 0, "alice/000.jpg")])
    result = invoke("pack", lst, root, tmp_path / "out" / "faces", "-q", *args)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {lst}: line 7: {message}\n"
    assert os.listdir(tmp_path / "out") == []


def test_the_largest_index_packs(two_identity_tree, tmp_path):
    root, _, items = two_identity_tree
    lst = write_list(tmp_path / "big.lst", [*items[:1], (2**63 - 1, 0, "alice/001.jpg")])
    assert invoke("pack", lst, root, tmp_path / "out" / "faces", "-q").exit_code == 0
    with IndexedRecordFile(tmp_path / "out" / "faces.rec") as records:
        assert records.keys.tolist() == [0, 2**63 - 1]


@pytest.mark.parametrize("prefix", ["", ".", "..", "out/", "out/.", "out/.."])
@pytest.mark.parametrize(
    "args",
    [[], ["--shard-records", "2", "--only-shard", "0"], ["--shard-records", "2", "--finalize"]],
)
def test_a_folder_like_out_prefix_is_a_usage_error(
    two_identity_tree, tmp_path, monkeypatch, prefix, args
):
    root, lst, _ = two_identity_tree
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    result = invoke("pack", lst, root, prefix, "-q", *args)
    assert result.exit_code == 2
    assert result.stderr.endswith(
        f"Error: OUT_PREFIX {prefix!r} names a folder, not the start of file names; "
        "give one such as out/faces (for out/faces.rec, out/faces.idx)\n"
    )
    assert sorted(os.listdir(tmp_path)) == before


# -- Ctrl-C ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["--resize", "20", "--workers", "1"], ["--workers", "1"]])
def test_ctrl_c_exits_130_saying_what_was_kept_and_resume_continues(
    two_identity_tree, tmp_path, args
):
    root, lst, _ = two_identity_tree
    prefix = tmp_path / "out" / "faces"
    stopped = rectool(
        "pack", lst, root, prefix, "-q", *args, env={"RECTOOL_TEST_FAULT": "SIGINT:1"}
    )
    assert stopped.returncode == 130
    assert stopped.stderr == (
        f"Interrupted after 6 of 6 list items: what was packed is kept ({prefix}: finished "
        "shards and .partial files).\nRun the same command with --resume to continue it.\n"
    )
    assert not (tmp_path / "out" / "faces.manifest.json").exists()
    assert (tmp_path / "out" / "faces.pack-state.json").exists()
    resumed = invoke("pack", lst, root, prefix, *args, "--resume", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["images"] == 6
    assert invoke("verify", f"{prefix}.manifest.json", "-q").exit_code == 0


def test_ctrl_c_during_overwrite_says_the_old_pack_is_unchanged(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
    prefix, before = old_pack(two_identity_tree, tmp_path)
    flags = "-q --overwrite --workers 1".split()
    stopped = rectool("pack", lst, root, prefix, *flags, env={"RECTOOL_TEST_FAULT": "SIGINT:1"})
    assert stopped.returncode == 130
    assert stopped.stderr == (
        f"Interrupted: the pack at {prefix} is unchanged; the new one was not finished "
        "and its staging folder was removed (run the command again to start it over).\n"
    )
    assert folder_bytes(prefix.parent) == before


# -- a wrong ROOT ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [[], ["--overwrite"], ["--shard-records", "2", "--only-shard", "1"]]
)
@pytest.mark.parametrize("stdin", [False, True], ids=["file", "stdin"])
def test_a_wrong_root_stops_before_writing_anything(two_identity_tree, tmp_path, args, stdin):
    root, lst, _ = two_identity_tree
    if stdin and "--only-shard" in args:
        pytest.skip("--only-shard needs a list file")
    wrong = tmp_path / "elsewhere"
    wrong.mkdir()
    prefix = tmp_path / "out" / "faces"
    list_arg, text = ("-", lst.read_text()) if stdin else (lst, None)
    result = invoke("pack", list_arg, wrong, prefix, "-q", *args, input=text)
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {wrong}: none of the first 6 listed images exist under ROOT (the first: "
        "alice/000.jpg); is ROOT right? Nothing was written\n"
    )
    assert not prefix.parent.exists()


def test_a_root_where_some_images_exist_packs_and_refuses_the_missing(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
    for name in ("000", "001", "002"):
        (root / "alice" / f"{name}.jpg").unlink()
    result = invoke("pack", lst, root, tmp_path / "out" / "faces", "--json", "--max-failures", "3")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["failures"] == 3


def test_only_shard_overwrite_refuses_to_break_a_complete_pack(two_identity_tree, tmp_path):
    root, lst, _ = two_identity_tree
    prefix, before = old_pack(two_identity_tree, tmp_path)
    result = invoke(
        "pack", lst, root, prefix, "-q", "--shard-records", "2", "--only-shard", "1", "--overwrite"
    )
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {prefix}.manifest.json: the pack is complete; packing shard 1 again with "
        "--overwrite would break it (pack the whole list with --overwrite, or shards to another "
        "OUT_PREFIX)\n"
    )
    assert folder_bytes(prefix.parent) == before


def test_a_pack_stopped_mid_run_holds_the_lock_and_resume_works_once_it_is_killed(
    two_identity_tree, tmp_path
):
    root, lst, _ = two_identity_tree
    prefix = tmp_path / "out" / "faces"
    env = {**os.environ, "PYTHONPATH": REPO, "RECTOOL_TEST_FAULT": "SIGSTOP:1"}
    flags = "-q --workers 1 --resize 20".split()
    first = subprocess.Popen(
        [sys.executable, "-m", "rectool", "pack", str(lst), str(root), str(prefix), *flags],
        env=env,
    )
    try:
        os.waitpid(first.pid, os.WUNTRACED)  # returns once it has stopped itself, mid-run
        for args in ([], ["--resume"], ["--overwrite"]):
            second = invoke("pack", lst, root, prefix, *flags, *args)
            assert second.exit_code == 1
            assert f"another rectool run (pid {first.pid}) is writing this output" in (
                second.stderr
            )
    finally:
        first.kill()
        first.wait()
    resumed = invoke("pack", lst, root, prefix, *flags, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert invoke("verify", f"{prefix}.manifest.json", "-q").exit_code == 0
