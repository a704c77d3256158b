"""kill -9 at random points, then `rectool pack --resume`: identical to an uninterrupted run.

The points are drawn from seeds and reached through the RECTOOL_TEST_FAULT hook (the run kills
itself once N list items are done), so no outcome depends on timing or on the machine's load.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest
from helpers.image_files import encode, image_array, write_list

from rectool.packer.packing import PackOptions, pack_images
from rectool.packer.shards import ShardWriter

ARGS = ["--resize", "24", "--shard-records", "97", "--workers", "2", "--quiet"]


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory):
    base = tmp_path_factory.mktemp("resume")
    root = base / "tree"
    items = []
    for index in range(3000):
        rel = f"id{index // 30:03d}/{index:05d}.jpg"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        # Every 37th file is empty: refusals interleave with records.
        data = b"" if index % 37 == 5 else encode(image_array(index, 64, 56), ".jpg")
        (root / rel).write_bytes(data)
        items.append((index, index // 30, rel))
    lst = write_list(base / "big.lst", items)
    reference = base / "reference" / "big"
    proc = start_pack(lst, root, reference)
    proc.wait()
    return root, lst, reference


def output_bytes(prefix):
    folder = prefix.parent
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def start_pack(lst, root, prefix, *extra, args=ARGS, kill_after=None):
    """Start a pack; with `kill_after=N` it kills itself (-9) once N list items are done."""
    env = dict(os.environ)
    if kill_after is not None:
        env["RECTOOL_TEST_FAULT"] = f"SIGKILL:{kill_after}"
    return subprocess.Popen(
        [sys.executable, "-m", "rectool", "pack", str(lst), str(root), str(prefix), *args, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )


def assert_killed(proc, prefix):
    """Wait for a pack started with `kill_after`; check that it died mid-run."""
    proc.wait(timeout=300)
    # The kill must land mid-run, or the test proves nothing.
    assert proc.returncode == -signal.SIGKILL
    assert any(prefix.parent.glob("*.partial"))
    assert not (prefix.parent / (prefix.name + ".manifest.json")).exists()


@pytest.mark.parametrize("seed", range(5))
def test_kill_then_resume_gives_identical_bytes(big_tree, tmp_path, seed):
    root, lst, reference = big_tree
    rng = random.Random(seed)
    prefix = tmp_path / "out" / "big"
    first = rng.randrange(1, 2000)
    assert_killed(start_pack(lst, root, prefix, kill_after=first), prefix)
    if seed == 4:
        # Kill the resumed run too, then resume again.
        proc = start_pack(lst, root, prefix, "--resume", kill_after=rng.randrange(first, 3000))
        assert_killed(proc, prefix)
    done = start_pack(lst, root, prefix, "--resume")
    _, err = done.communicate(timeout=300)
    assert done.returncode == 3, err.decode()  # the empty files are refused: exit 3
    assert output_bytes(prefix) == output_bytes(reference)


def test_resume_cuts_a_torn_tail(tmp_path):
    prefix = tmp_path / "torn" / "big"
    prefix.parent.mkdir()
    # Simulate a kill in the middle of a write: half a record and half an .idx line.
    writer = ShardWriter(prefix, shard_records=97)
    writer.add(0, b"\x0a\x23\xd7\xce" + b"\x10\x00\x00\x00" + b"x" * 16)
    writer.abort()
    with open(str(prefix) + "-00000.rec.partial", "ab") as f:
        f.write(b"\x0a\x23\xd7\xce\x40\x00")
    with open(str(prefix) + "-00000.idx.partial", "ab") as f:
        f.write(b"1\t2")
    writer = ShardWriter(prefix, shard_records=97)
    assert writer.resume() == 1
    writer.abort()
    assert os.path.getsize(str(prefix) + "-00000.rec.partial") == 24
    assert open(str(prefix) + "-00000.idx.partial", "rb").read() == b"0\t0\n"


def test_resume_refuses_a_different_list_or_options(big_tree, tmp_path):
    root, lst, _ = big_tree
    prefix = tmp_path / "o" / "big"
    assert_killed(start_pack(lst, root, prefix, kill_after=500), prefix)
    other = tmp_path / "other.lst"
    other.write_bytes(lst.read_bytes()[:-200])
    changed = subprocess.run(
        [
            sys.executable,
            "-m",
            "rectool",
            "pack",
            str(other),
            str(root),
            str(prefix),
            *ARGS,
            "--resume",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert changed.returncode == 1
    assert f"Error: {prefix}.pack-state.json: cannot resume: the list differs (sha256 " in (
        changed.stderr
    )
    assert "in the interrupted pack)" in changed.stderr
    with pytest.raises(
        Exception,
        match=r"re-encoding differs \(pass-through now, --resize 24 .* in the interrupted "
        r"pack\); --shard-records differs \(50 now, 97 in the interrupted pack\)\. ",
    ):
        pack_images(lst, root, prefix, PackOptions(shard_records=50), resume=True)


def test_insightface_resume_rewrites_identity_records_cut_by_a_kill(tmp_path):
    import json

    from helpers.image_files import write_pack_tree

    from rectool.packer.manifest import STATE_SUFFIX
    from rectool.packer.packing import validate_list

    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a", "b", "c"], 4)
    lst = write_list(tmp_path / "i.lst", items)
    options = PackOptions(layout="insightface")
    pack_images(lst, root, tmp_path / "ref" / "train", options)
    reference = {p.name: p.read_bytes() for p in (tmp_path / "ref").iterdir()}

    # As if killed after the 12 images and 2 of the 3 identity records were written.
    out = tmp_path / "out"
    out.mkdir()
    idx_lines = reference["train.idx"].splitlines(keepends=True)[:14]
    cut = int(reference["train.idx"].splitlines()[14].split(b"\t")[1])
    (out / "train.idx.partial").write_bytes(b"".join(idx_lines))
    (out / "train.rec.partial").write_bytes(reference["train.rec"][:cut])
    (out / "train.failures.jsonl.partial").write_bytes(b"")
    digest, _ = validate_list(str(lst), "insightface")
    state = {
        "list_sha256": digest,
        "root": os.path.abspath(root),
        "options": options.byte_options(),
    }
    (out / ("train" + STATE_SUFFIX)).write_text(json.dumps(state))

    result = pack_images(lst, root, out / "train", options, resume=True)
    assert result.resumed_from == 12
    got = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(got) == sorted(reference)
    assert [name for name in reference if got[name] != reference[name]] == []


# Pass-through bytes (checked by decoding: worker threads) in shards cut by bytes, not by a plan.
BYTES_ARGS = ["--shard-size", "300KB", "--check", "decode", "--workers", "2", "--quiet"]


@pytest.mark.parametrize("seed", range(3))
def test_kill_then_resume_with_byte_sized_shards(big_tree, tmp_path, seed):
    root, lst, _ = big_tree
    reference = tmp_path / "ref" / "big"
    start_pack(lst, root, reference, args=BYTES_ARGS).wait()
    prefix = tmp_path / "out" / "big"
    kill_after = random.Random(seed).randrange(1, 2500)
    assert_killed(start_pack(lst, root, prefix, args=BYTES_ARGS, kill_after=kill_after), prefix)
    resumed = start_pack(lst, root, prefix, "--resume", args=BYTES_ARGS)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 3, err.decode()
    assert len(list(prefix.parent.glob("big-*.rec"))) > 3
    assert output_bytes(prefix) == output_bytes(reference)


def test_resume_adopts_a_finished_unnumbered_shard(tmp_path):
    # A kill between the shard's rename and the manifest leaves one finished, unnumbered
    # shard: resuming takes it as it is (this looped forever: every number named that shard).
    prefix = tmp_path / "one" / "faces"
    prefix.parent.mkdir()
    writer = ShardWriter(prefix)
    writer.add(0, b"\x0a\x23\xd7\xce" + b"\x10\x00\x00\x00" + b"x" * 16)
    writer.close()
    assert sorted(p.name for p in prefix.parent.iterdir() if not p.name.endswith(".crc")) == [
        "faces.idx",
        "faces.rec",
    ]
    resumed = ShardWriter(prefix)
    assert resumed.resume() == 1
    assert [os.path.basename(s.rec) for s in resumed.finished] == ["faces.rec"]


def test_a_pack_killed_at_any_rename_is_never_read_and_resume_finishes_it(tmp_path, monkeypatch):
    """Killed at each rename of a run (the state file, checksum files, failures file, then
    the binary index, the identities file and the manifest, last): no reader takes the pack
    for whole, and --resume makes the files an uninterrupted run makes, .npy index included."""
    from helpers.image_files import write_pack_tree

    from rectool.doors import output
    from rectool.errors import RectoolError
    from rectool.packer.listfile import write_label_map
    from rectool.reader import open_dataset

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # the same manifest each run
    root = tmp_path / "tree"
    lst = write_list(tmp_path / "f.lst", write_pack_tree(root, ["a", "b", "c"], 3))
    names = tmp_path / "names.tsv"
    write_label_map(names, {0: "a", 1: "b", 2: "c"})
    options = PackOptions(shard_records=4, workers=1)
    renames = []
    output.set_fault_hook(lambda step, path: renames.append(path) if step == "rename" else None)
    try:
        pack_images(lst, root, tmp_path / "reference" / "f", options, label_map=names)
    finally:
        output.set_fault_hook(None)
    reference = output_bytes(tmp_path / "reference" / "f")
    assert {"f.offsets.npy", "f.keys.npy", "f.labels.npy", "f.identities.json"} <= set(reference)
    assert renames[0].endswith("f.pack-state.json") and renames[-1].endswith("f.manifest.json")
    args = ["--shard-records", "4", "--workers", "1", "--labels", str(names), "-q"]
    for nth in range(1, len(renames) + 1):
        prefix = tmp_path / f"killed{nth}" / "f"
        env = {**os.environ, output.FAULT_ENV: f"rename:{nth}:kill"}
        killed = subprocess.run(
            [sys.executable, "-m", "rectool", "pack", str(lst), str(root), str(prefix), *args],
            env=env,
            capture_output=True,
            check=False,
        )
        assert killed.returncode == -signal.SIGKILL, (nth, killed.stderr)
        with pytest.raises(RectoolError):
            open_dataset(prefix)
        # Killed at the first, the state file's, only a temporary is there: nothing to resume.
        again = {"overwrite": True} if nth == 1 else {"resume": True}
        pack_images(lst, root, prefix, options, label_map=names, **again)
        assert output_bytes(prefix) == reference, nth
