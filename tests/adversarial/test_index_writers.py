"""Adversarial: format 3's index writers and `rectool index` on foreign packs with odd but legal
data, hostile packs, packs changed after they were indexed, and runs interrupted at each step.

Each pack is written by hand (`helpers.handmade_datasets`); what the reader returns is compared
with what the records hold, and where MXNet is the judge, with MXNet 1.9.1 itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import image_record, write_insightface, write_shard
from helpers.image_files import jpeg_bytes
from helpers.mxnet_oracle import MX_READ_ALL, run_mxnet

from rectool import reader
from rectool.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def records(keys, size=8):
    """(key, image record) pairs: a distinct JPEG each, its key as label and header id."""
    return [(k, image_record(jpeg_bytes(k, size, size), float(k), k)) for k in keys]


def read_back(prefix):
    """Every (key, image bytes, label) the reader returns for the pack at `prefix`."""
    ds = reader.open_dataset(prefix)
    return [(int(ds.keys[i]), *ds.raw(i)) for i in range(len(ds))]


def expected(pairs):
    """What the reader must return for `records(...)`: (key, JPEG, label) in file order."""
    return [(k, record[24:], float(k)) for k, record in pairs]


# --- a pack changed after `rectool index` described it ---------------------------------------


@pytest.mark.parametrize("change", ["grown", "same size"])
def test_force_describes_a_changed_foreign_pack_again(tmp_path, change):
    """A manifest `rectool index` described for an im2rec pack only records what the shards
    were: after the pack is made again, `--force` describes it again from the shards (as
    `--into` does), instead of refusing a grown shard as stale or keeping the old sizes and
    digests beside the new index, which `verify` then refuses."""
    rec, idx = tmp_path / "r.rec", tmp_path / "r.idx"
    write_shard(rec, idx, records(range(4)))
    assert invoke("index", rec).exit_code == 0
    now = records(range(6)) if change == "grown" else records([3, 2, 1, 0])
    write_shard(rec, idx, now)
    result = invoke("index", rec, "--force")
    assert result.exit_code == 0, result.output
    assert read_back(tmp_path / "r") == expected(now)
    verified = invoke("verify", tmp_path / "r")
    assert verified.exit_code == 0, verified.output
    manifest = json.loads((tmp_path / "r.manifest.json").read_text())
    assert (manifest["shards"][0]["records"], manifest["shards"][0]["rec_bytes"]) == (
        len(now), os.path.getsize(rec),
    )  # fmt: skip


@pytest.mark.parametrize("damage", ["cut", "grown"])
def test_an_index_array_cut_or_grown_is_written_again(tmp_path, damage):
    """The reader refuses an index array of another size than its header says and tells the
    user to rebuild it with `rectool index`: that command must then write it, not answer
    "already indexed; wrote nothing"."""
    rec, idx = tmp_path / "r.rec", tmp_path / "r.idx"
    pairs = records(range(4))
    write_shard(rec, idx, pairs)
    assert invoke("index", rec).exit_code == 0
    offsets = tmp_path / "r.offsets.npy"
    data = offsets.read_bytes()
    offsets.write_bytes(data[:-8] if damage == "cut" else data + bytes(8))
    with pytest.raises(reader.InputError, match="r.offsets.npy"):
        reader.open_dataset(tmp_path / "r")
    result = invoke("index", rec, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["already_indexed"] is False
    assert offsets.read_bytes() == data
    assert read_back(tmp_path / "r") == expected(pairs)


# --- interrupted: the old index or the new one, whole ----------------------------------------


def index_killed(target, fault, *more):
    """Run `rectool index TARGET` in a process of its own, killed at `fault` (STEP:N)."""
    env = {**os.environ, "RECTOOL_OUTPUT_FAULT": f"{fault}:kill"}
    return subprocess.run(
        [sys.executable, "-m", "rectool", "index", str(target), *more],
        env=env, capture_output=True, check=False,
    )  # fmt: skip


def arrays_of(prefix):
    """(keys, offsets, labels) the reader maps for the pack at `prefix` (RectoolError: refused)."""
    try:
        ds = reader.open_dataset(prefix)
    except reader.RectoolError:
        return reader.RectoolError
    return ds.keys.tolist(), ds.offsets.tolist(), ds.labels.tolist()


FAULTS = [f"{step}:{n}" for step in ("rename", "swap") for n in (1, 2, 3, 4)]
FAULTS += ["journal:1", "manifest:1"]


@pytest.mark.parametrize("into", [False, True], ids=["beside", "into"])
@pytest.mark.parametrize("fault", FAULTS)
def test_index_force_killed_at_any_step_leaves_one_whole_index(tmp_path, fault, into):
    """`rectool index --force` (beside the shards, or --into a folder) over a pack indexed
    before, whose shard was made again with the same records in another order, killed at any
    step of its output: the reader maps the old index whole or the new one whole, never the
    new keys beside the old labels; or it refuses the pack until a run of `rectool index`
    finishes it. The next run leaves the new index."""
    rec, idx = tmp_path / "r.rec", tmp_path / "r.idx"
    more = ["--into", tmp_path / "out"] if into else []
    prefix = tmp_path / "out" / "r" if into else tmp_path / "r"
    write_shard(rec, idx, records(range(4)))
    assert invoke("index", rec, *more).exit_code == 0
    old = arrays_of(prefix)
    now = records([3, 1, 0, 2])
    write_shard(rec, idx, now)
    assert invoke("index", rec, "--force", *more).exit_code == 0
    new = arrays_of(prefix)
    assert new != old
    write_shard(rec, idx, records(range(4)))
    assert invoke("index", rec, "--force", *more).exit_code == 0
    write_shard(rec, idx, now)
    index_killed(rec, fault, "--force", *map(str, more))
    assert arrays_of(prefix) in (old, new, reader.RectoolError)
    result = invoke("index", rec, *more)
    assert result.exit_code == 0, result.output
    if arrays_of(prefix) == old:  # the run was killed before its commit: the old index
        assert invoke("index", rec, "--force", *more).exit_code == 0
    assert arrays_of(prefix) == new
    assert read_back(prefix) == expected(now)


# --- odd but legal foreign packs: the reader, the emitted reader, verify and MXNet agree ------

MAGIC = struct.pack("<I", 0xCED7230A)


def emitted_reader(tmp_path):
    """`rectool reader -o` written out and imported as a module of its own."""
    path = tmp_path / "emitted_reader.py"
    assert invoke("reader", "-o", path).exit_code == 0
    spec = importlib.util.spec_from_file_location("emitted_reader", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.oracle
def test_odd_foreign_records_read_as_mxnet_reads_them(tmp_path):
    """Keys out of file order and past 2**53, records that MXNet splits at the magic (a label
    whose bits are the magic, two magics in a row, the magic as the last aligned word), and
    label vectors: after `rectool index`, the reader, the emitted reader and MXNet return the same
    bytes and labels for every key, and `verify` finds the pack sound."""
    jpeg = jpeg_bytes(1, 8, 8)
    pad = jpeg + bytes(-len(jpeg) % 4)
    images = [jpeg, pad + MAGIC + MAGIC + b"tail", pad + MAGIC, jpeg, pad + MAGIC * 3]
    keys = [7, 2**53 + 1, 3, 2**60, 1]
    labels = [[float(n), k / 2.0] for n, k in enumerate(keys)]
    labels[0][0] = labels[3][1] = np.frombuffer(MAGIC, "<f4")[0].item()  # a label of its bits
    pairs = [(k, image_record(image, label, k)) for k, image, label in zip(keys, images, labels)]
    rec, idx = tmp_path / "odd.rec", tmp_path / "odd.idx"
    write_shard(rec, idx, pairs)
    assert rec.read_bytes().count(MAGIC) > len(pairs)  # split records among them
    result = invoke("index", rec)
    assert result.exit_code == 0, result.output
    mx = run_mxnet(MX_READ_ALL, {"rec": str(rec), "idx": str(idx)})
    want = [(key, image, label) for key, image, label, _ in mx]
    assert [k for k, _, _ in want] == keys
    assert [image for _, image, _ in want] == images
    for module in (reader, emitted_reader(tmp_path)):
        ds = module.open_dataset(tmp_path / "odd")
        got = [(int(ds.keys[i]), *ds.raw(i)) for i in range(len(ds))]
        assert [(k, image, np.asarray(label).tolist()) for k, image, label in got] == want
    verified = invoke("verify", tmp_path / "odd")
    assert verified.exit_code == 0, verified.output


# --- insightface packs whose .idx or records lie -------------------------------------------


def test_an_insightface_idx_naming_an_image_key_twice_is_refused(tmp_path):
    """A repeated key is refused in the images layout (MXNet reads its last line, DALI every
    line); an insightface .idx that repeats an image key was indexed all the same, into a
    manifest that `verify` then refuses (duplicate-key, and more .idx lines than records)."""
    folder = tmp_path / "faces"
    folder.mkdir()
    write_insightface(
        folder / "train.rec", folder / "train.idx", [2, 2], lambda k: jpeg_bytes(k, 8, 8)
    )
    lines = (folder / "train.idx").read_text().splitlines()
    three = next(line for line in lines if line.startswith("3\t"))
    (folder / "train.idx").write_text("\n".join(["2\t" + three.split("\t")[1], *lines]) + "\n")
    result = invoke("index", folder)
    assert result.exit_code == 1, result.output
    assert "key 2 is on more than one line of the .idx files" in result.stderr
    assert f"{folder / 'train.idx'} line 1" in result.stderr
    assert sorted(os.listdir(folder)) == ["train.idx", "train.rec"]  # nothing written


# --- small and hostile foreign packs ---------------------------------------------------------


def test_an_empty_pack_and_a_pack_of_one_record_index_and_verify(tmp_path):
    """The smallest packs im2rec can leave: no record at all, and one record."""
    (tmp_path / "empty.rec").write_bytes(b"")
    (tmp_path / "empty.idx").write_bytes(b"")
    one = records([9])
    write_shard(tmp_path / "one.rec", tmp_path / "one.idx", one)
    for name, want in (("empty", []), ("one", expected(one))):
        result = invoke("index", tmp_path / f"{name}.rec")
        assert result.exit_code == 0, result.output
        assert read_back(tmp_path / name) == want
        verified = invoke("verify", tmp_path / name)
        assert verified.exit_code == 0, verified.output


def _continuation(tmp_path):
    """A pack whose record of key 1 is split at a magic: the offset of its second part."""
    image = jpeg_bytes(1, 8, 8)
    pairs = [records([0])[0], (1, image_record(image + bytes(-len(image) % 4) + MAGIC, 1.0, 1))]
    offsets = write_shard(tmp_path / "h.rec", tmp_path / "h.idx", pairs)
    data = (tmp_path / "h.rec").read_bytes()
    return data.index(MAGIC, offsets[1] + 4)


@pytest.mark.parametrize(
    "where", ["inside a record", "a continuation part", "not aligned", "negative", "past the end"]
)
def test_an_idx_line_pointing_at_no_record_start_is_refused_by_name(tmp_path, where):
    """An .idx line whose offset is not where a record starts: refused naming the .rec, the key
    and the offset (exit 1), and nothing written beside the shards."""
    offset = {
        "inside a record": lambda: 40,
        "a continuation part": lambda: _continuation(tmp_path),
        "not aligned": lambda: 2,
        "negative": lambda: -8,
        "past the end": lambda: 1 << 40,
    }[where]()
    if not (tmp_path / "h.rec").exists():
        write_shard(tmp_path / "h.rec", tmp_path / "h.idx", records([0, 1]))
    lines = (tmp_path / "h.idx").read_text().splitlines()
    (tmp_path / "h.idx").write_text(f"{lines[0]}\n1\t{offset}\n")
    result = invoke("index", tmp_path / "h.rec")
    assert result.exit_code in (1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert str(tmp_path / "h.") in result.stderr
    if where != "negative":  # (a negative offset is no .idx number: named by its line)
        assert f"key 1, byte offset {offset}" in result.stderr
    else:
        assert "line 2" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["h.idx", "h.rec"]


def test_an_idx_line_longer_than_a_block_is_refused_without_reading_it_whole(tmp_path):
    """No .idx line is longer than about 40 bytes (`key TAB offset`). A file of one endless
    line (a .rec given as the .idx, say, or a hostile file) was gathered whole in memory, then
    copied twice more while parsed: three times the file's size. It is refused at its first
    block, naming the file and line, in memory that does not grow with the file."""
    write_shard(tmp_path / "h.rec", tmp_path / "h.idx", records([0]))
    with open(tmp_path / "h.idx", "wb") as f:
        for _ in range(32):
            f.write(b"z" * (1 << 20))
    tracemalloc.start()
    try:
        result = invoke("index", tmp_path / "h.rec")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'h.idx'}: line 1: " in result.stderr
    assert peak < 16 << 20
    assert sorted(os.listdir(tmp_path)) == ["h.idx", "h.rec"]


@pytest.mark.parametrize("lost", ["the last lines", "a middle line", "the first line"])
def test_an_idx_that_leaves_records_out_is_refused_naming_the_first(tmp_path, lost):
    """An .idx that lost lines (cut short, or a line deleted) names fewer records than the
    .rec holds: MXNet reads only those, and `rectool index` indexed them, exit 0, dropping the
    others silently, into a pack that `verify` then refused (unindexed-record). It is refused,
    naming the .rec and the byte offset of the first record no line names."""
    pairs = records(range(5))
    offsets = write_shard(tmp_path / "r.rec", tmp_path / "r.idx", pairs)
    lines = (tmp_path / "r.idx").read_text().splitlines()
    gone = {"the last lines": [3, 4], "a middle line": [2], "the first line": [0]}[lost]
    kept = [line for n, line in enumerate(lines) if n not in gone]
    (tmp_path / "r.idx").write_text("\n".join(kept) + "\n")
    result = invoke("index", tmp_path / "r.rec")
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'r.rec'}, byte offset {offsets[gone[0]]}: " in result.stderr
    assert "rectool reindex" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["r.idx", "r.rec"]


def test_an_idx_naming_every_record_in_any_order_covers_its_rec(tmp_path):
    """Every record named, in another order than the file's, one of them split at a magic:
    the .idx covers the .rec, and the pack is indexed."""
    image = jpeg_bytes(7, 8, 8)
    split = (7, image_record(image + bytes(-len(image) % 4) + MAGIC + b"tail", 7.0, 7))
    pairs = [*records([0, 1]), split, *records([3])]
    offsets = write_shard(tmp_path / "r.rec", tmp_path / "r.idx", pairs)
    order = [3, 2, 0, 1]
    lines = [f"{pairs[n][0]}\t{offsets[n]}\n" for n in order]
    (tmp_path / "r.idx").write_text("".join(lines))
    result = invoke("index", tmp_path / "r.rec")
    assert result.exit_code == 0, result.output
    assert reader.open_dataset(tmp_path / "r").keys.tolist() == [3, 7, 0, 1]
    assert invoke("verify", tmp_path / "r").exit_code == 0


def test_damage_that_reindex_skips_is_no_record_left_out(tmp_path):
    """A .rec damaged in the middle (a record's magic overwritten): `rectool reindex` writes
    an .idx of the records around the damage, and `rectool index` then indexes them; the
    damaged bytes hold no record start, so no record is left out."""
    pairs = records(range(5))
    offsets = write_shard(tmp_path / "r.rec", tmp_path / "r.idx", pairs)
    with open(tmp_path / "r.rec", "r+b") as f:
        f.seek(offsets[2])
        f.write(b"\xde\xad\xbe\xef")
    result = invoke("reindex", tmp_path / "r.rec", "--overwrite")
    assert "Skipped 1 damaged byte range" in result.output  # (exit 1: it found damage)
    result = invoke("index", tmp_path / "r.rec")
    assert result.exit_code == 0, result.output
    assert read_back(tmp_path / "r") == expected(pairs[:2] + pairs[3:])


def test_an_insightface_folder_index_killed_in_its_commit_is_finished_by_the_next_run(tmp_path):
    """Killed inside its commit (the old manifest gone, the journal there), `rectool index
    --force FOLDER` of an insightface folder is finished by the next `rectool index FOLDER`,
    as one of a prefix is: the folder names the pack `FOLDER/train`."""
    folder = tmp_path / "faces"
    folder.mkdir()
    rec, idx = folder / "train.rec", folder / "train.idx"
    write_insightface(rec, idx, [2, 3], lambda k: jpeg_bytes(k, 8, 8))
    assert invoke("index", folder).exit_code == 0
    write_insightface(rec, idx, [3, 2], lambda k: jpeg_bytes(k, 8, 8))
    index_killed(folder, "swap:1", "--force")
    assert (folder / "train.commit-journal.json").exists()
    result = invoke("index", folder)
    assert result.exit_code == 0, result.output
    assert not (folder / "train.commit-journal.json").exists()
    assert invoke("verify", folder / "train").exit_code == 0


def test_force_finds_a_shard_added_to_a_foreign_numbered_pack(tmp_path):
    """A numbered set of shards made by others, indexed, then made again with one more shard:
    `--force` describes the shards there are now, as `--into` does, instead of those the old
    manifest listed (the new shard's samples silently left out)."""
    prefix = tmp_path / "p"
    shards = [records(range(3)), records(range(3, 5)), records(range(5, 9))]
    for n, pairs in enumerate(shards[:2]):
        write_shard(f"{prefix}-{n:05d}.rec", f"{prefix}-{n:05d}.idx", pairs)
    assert invoke("index", prefix).exit_code == 0
    write_shard(f"{prefix}-00002.rec", f"{prefix}-00002.idx", shards[2])
    result = invoke("index", prefix, "--force")
    assert result.exit_code == 0, result.output
    assert read_back(prefix) == expected([p for pairs in shards for p in pairs])
    assert invoke("verify", prefix).exit_code == 0


@pytest.mark.parametrize("pair", [[1.0, 9.0], [3.0, 2.0], [0.0, 2.0], 3.0])
def test_an_identity_record_that_lies_is_named_by_key_and_offset(tmp_path, pair):
    """An insightface identity record whose range runs past the images, ends before it
    starts, starts at key 0 (the header), or holds no pair: refused naming the .rec, the
    identity record's key and its byte offset, not its position among the identities."""
    folder = tmp_path / "faces"
    folder.mkdir()
    pairs = [(k, image_record(jpeg_bytes(k, 8, 8), 0.0, k)) for k in range(1, 5)]
    pairs += [(5, image_record(b"", [1.0, 3.0], 5)), (6, image_record(b"", pair, 6))]
    pairs += [(0, image_record(b"", [5.0, 7.0], 0, 1))]
    offsets = write_shard(folder / "train.rec", folder / "train.idx", pairs)
    result = invoke("index", folder)
    assert result.exit_code == 1, result.output
    assert f"{folder / 'train.rec'}, key 6, byte offset {offsets[5]}: " in result.stderr
    assert sorted(os.listdir(folder)) == ["train.idx", "train.rec"]


def test_a_full_disk_at_any_step_of_index_force_leaves_the_old_index_or_the_new(tmp_path):
    """`rectool index --force` over a pack indexed before, its shard made again, with the disk
    full at the Nth step of its output, for every N: it exits 1 naming the cause, and the
    reader maps the old index whole (nothing staged left behind) or the new one; or, failed
    inside its commit, it is finished by the next run."""
    from rectool.doors import output

    rec, idx, prefix = tmp_path / "r.rec", tmp_path / "r.idx", tmp_path / "r"
    write_shard(rec, idx, records(range(4)))
    assert invoke("index", rec).exit_code == 0
    old = arrays_of(prefix)
    now = records([3, 1, 0, 2])
    write_shard(rec, idx, now)
    assert invoke("index", rec, "--force").exit_code == 0
    new = arrays_of(prefix)
    for n in range(1, 100):
        write_shard(rec, idx, records(range(4)))
        assert invoke("index", rec, "--force").exit_code == 0
        write_shard(rec, idx, now)
        steps = []

        def full(step, path, n=n, steps=steps):
            steps.append(step)
            if len(steps) == n:
                raise OSError(28, "No space left on device", path)

        output.set_fault_hook(full)
        try:
            result = invoke("index", rec, "--force")
        finally:
            output.set_fault_hook(None)
        if len(steps) < n:  # every step passed: the new index
            assert result.exit_code == 0, result.output
            break
        assert result.exit_code == 1, (n, steps, result.output)
        assert "No space left on device" in result.stderr
        committed = (tmp_path / "r.commit-journal.json").exists()
        if not committed:
            assert arrays_of(prefix) == old, (n, steps)
            assert not (tmp_path / ".r.overwrite").exists(), (n, steps)
        assert invoke("index", rec).exit_code == 0
        assert arrays_of(prefix) == (new if committed else old), (n, steps)
    assert read_back(prefix) == expected(now)
    assert n > 10  # (every step of the output was reached once)
