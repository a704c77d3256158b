"""Issue 38's surfaces, attacked: `list`'s outputs, the report's outputs, the insightface label
shapes (`--pack-label`, `repack` between them), the exit table for every command and the
images-per-identity chart.

Each test names what a user or an attacker tried and what must hold.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import image_record, images, write_shard
from helpers.image_files import write_list, write_pack_tree
from helpers.mxnet_oracle import MX_FACE_DATASET, UNPACK_GLINT360K, run_mxnet

from rectool import open_dataset
from rectool import reader as core
from rectool.cli import cli
from rectool.report.charts import log_bins


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    write_pack_tree(root, ["ann", "bob"], 2)
    return root


# --- One output, two files at one name --------------------------------------------------------
# A label map named like one of the lists it comes with would replace that list (the commit
# moves both into place, the later over the earlier) while the summary says both were written.


@pytest.mark.parametrize(
    "extra, clash",
    [
        ([], "faces.lst"),
        (["--val-ratio", "0.5"], "faces_val.lst"),
        (["--chunks", "2"], "faces_1.lst"),
        (["--chunks", "2", "--test-ratio", "0.5"], "faces_0_train.lst"),
    ],
    ids=["single", "split", "chunk", "chunk-split"],
)
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_label_map_named_like_a_list_is_refused_before_the_walk(
    tmp_path, tree, extra, clash, as_json
):
    out = tmp_path / "o"
    labels = f"{out}/./{clash}"  # another spelling of the same place
    args = ["list", tree, out / "faces.lst", "--labels", labels, *extra]
    result = run(*args, *(["--json"] if as_json else []))
    assert result.exit_code == 2, result.output
    message = json.loads(result.stdout)["error"] if as_json else result.stderr
    assert f"{clash}: is also the list ({out / clash}); " in message, message
    assert "give each file its own name" in message
    assert not out.exists()  # nothing written, not even the folder


@pytest.mark.parametrize(
    "ratios",
    [
        ["--val-ratio", "nan"],
        ["--val-ratio", "inf"],
        ["--val-ratio", "-0.1"],
        ["--train-ratio", "1.5"],
        ["--val-ratio", "0.6", "--train-ratio", "0.6"],
        ["--val-ratio", "0", "--train-ratio", "0", "--test-ratio", "0"],
        ["--test-ratio", "0x1p-1"],
    ],
    ids=["nan", "inf", "negative", "above-1", "sum-above-1", "sum-0", "hex"],
)
def test_a_ratio_that_cannot_cut_is_exit_2_with_one_json_document(tmp_path, tree, ratios):
    result = run("list", tree, tmp_path / "faces.lst", *ratios, "--json")
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout)["exit"] == 2 and result.stderr == ""
    assert list(tmp_path.iterdir()) == [tree]


@pytest.mark.parametrize(
    "ratios, written",
    [
        (["--val-ratio", "0.5e0"], ["faces_train.lst", "faces_val.lst"]),
        (["--val-ratio", "1"], ["faces_val.lst"]),
        (["--val-ratio", "0"], ["faces.lst"]),  # train 1: no split
        (["--train-ratio", "0.25", "--test-ratio", "0.75"], ["faces_test.lst", "faces_train.lst"]),
    ],
    ids=["exponent", "all-val", "val-0", "train-test"],
)
def test_odd_ratios_write_only_the_lists_they_name(tmp_path, tree, ratios, written):
    (tmp_path / "faces.lst").write_text("an older list, none of this run's outputs\n")
    (tmp_path / "faces_val.lst").write_text("older\n")
    result = run("list", tree, tmp_path / "faces.lst", *ratios, "--overwrite")
    assert result.exit_code == 0, result.output
    listed = [(tmp_path / name).read_text().splitlines() for name in written]
    assert sum(map(len, listed)) == 4  # every image in one of the lists named
    for name in {"faces.lst", "faces_val.lst"} - set(written):  # the rest untouched
        assert (tmp_path / name).read_text().startswith(("an older", "older")), name


def test_a_label_map_reaching_a_list_through_a_linked_folder_is_refused(tmp_path, tree):
    (tmp_path / "o").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "o")
    args = ["list", tree, tmp_path / "o" / "faces.lst", "--labels", tmp_path / "alias/faces.lst"]
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert list((tmp_path / "o").iterdir()) == []


def test_a_label_map_beside_its_lists_is_still_written(tmp_path, tree):
    # The refusal is about one place, not one folder or one stem.
    out = tmp_path / "o"
    args = [
        "list",
        tree,
        out / "faces.lst",
        "--labels",
        out / "faces_val.tsv",
        "--val-ratio",
        "0.5",
    ]
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "faces_train.lst",
        "faces_val.lst",
        "faces_val.tsv",
    ]
    assert (out / "faces_val.tsv").read_text() == "0\tann\n1\tbob\n"


def test_a_report_page_and_its_sheet_at_one_name_are_refused(tmp_path, tree):
    lst = tmp_path / "faces.lst"
    assert run("list", tree, lst).exit_code == 0
    assert run("pack", lst, tree, tmp_path / "p" / "faces", "--quiet").exit_code == 0
    page = tmp_path / "r.png"
    result = run("report", tmp_path / "p" / "faces", "-o", page, "--sheet", page)
    assert result.exit_code == 2, result.output
    assert f"{page}: is also the report's other file (" in result.output
    assert not page.exists()


# --- A kill before anything was recorded ------------------------------------------------------
# A run killed while it writes its state file (the first thing it writes) leaves only that
# file's hidden temporary (`.p.pack-state.json.XXXX.tmp`): nothing was packed. `--resume` and
# a plain run again both start the pack; neither may need --overwrite.


def rectool(*args, env=None):
    command = [sys.executable, "-m", "rectool", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env})


def vector_pack_args(tmp_path, tree):
    items = write_pack_tree(tree, ["ann", "bob"], 2)
    lst = write_list(tmp_path / "v.lst", [(i, [c, 0.5 * i], rel) for i, c, rel in items])
    return [lst, tree, "--layout", "insightface", "--pack-label", "--quiet"]


def pack_files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("again", [["--resume"], []], ids=["resume", "plain"])
@pytest.mark.parametrize("command", ["pack", "repack"])
def test_a_kill_at_the_first_write_leaves_a_run_that_starts_again(tmp_path, again, command):
    lst, root, *options = vector_pack_args(tmp_path, tmp_path / "tree")
    assert run("pack", lst, root, tmp_path / "src" / "p", *options).exit_code == 0
    if command == "pack":
        inputs = [lst, root]
    else:
        inputs, options = [tmp_path / "src" / "p"], ["--layout", "insightface", "--quiet"]
    assert run(command, *inputs, tmp_path / "ref" / "p", *options).exit_code == 0
    out = tmp_path / "out" / "p"
    killed = rectool(command, *inputs, out, *options, env={"RECTOOL_OUTPUT_FAULT": "write:1:kill"})
    assert killed.returncode == -9, killed.stderr
    left = sorted(p.name for p in out.parent.iterdir() if not p.name.endswith(".lock"))
    assert len(left) == 1 and left[0].startswith(".p.pack-state.json."), left  # unrenamed
    result = run(command, *inputs, out, *options, *again)
    assert result.exit_code == 0, result.output
    assert pack_files(out.parent) == pack_files(tmp_path / "ref")


@pytest.mark.parametrize(
    "fault", ["write:3", "shard:1", "write:9"], ids=["among-records", "shard-done", "finishing"]
)
@pytest.mark.parametrize("conversion", ["vector-to-scalar", "scalar-to-vector"])
def test_a_repack_between_the_shapes_killed_midway_resumes_to_the_same_bytes(
    tmp_path, fault, conversion
):
    # Killed among its records, a repack converting the label shape resumes (`--resume`) to
    # the bytes an uninterrupted one writes: every reader then reads the same labels.
    lst, root, *options = vector_pack_args(tmp_path, tmp_path / "tree")
    to_vector = conversion == "scalar-to-vector"
    if to_vector:
        options.remove("--pack-label")
    source = tmp_path / "src" / "p"
    assert run("pack", lst, root, source, *options).exit_code == 0
    flags = ["--layout", "insightface", "--quiet", *(["--pack-label"] if to_vector else [])]
    assert run("repack", source, tmp_path / "ref" / "p", *flags).exit_code == 0
    out = tmp_path / "out" / "p"
    killed = rectool("repack", source, out, *flags, env={"RECTOOL_OUTPUT_FAULT": f"{fault}:kill"})
    assert killed.returncode == -9, killed.stderr
    assert (out.parent / "p.pack-state.json").exists()  # killed before its end
    result = run("repack", source, out, *flags, "--resume")
    assert result.exit_code == 0, result.output
    assert pack_files(out.parent) == pack_files(tmp_path / "ref")


@pytest.mark.parametrize("theirs", ["pq", "p.v2", "p-small", "p-2024"])
def test_another_packs_temporary_beside_is_neither_refused_nor_removed(tmp_path, theirs):
    # `.pq.manifest.json.XXXX.tmp` is pack pq's, maybe being written now: not pack p's.
    lst, root, *options = vector_pack_args(tmp_path, tmp_path / "tree")
    out = tmp_path / "out"
    temporary = out / f".{theirs}.manifest.json.abcd1234.tmp"
    out.mkdir()
    temporary.write_bytes(b"{")
    assert run("pack", lst, root, out / "p", *options).exit_code == 0
    assert run("repack", out / "p", out / "p2", "--layout", "insightface").exit_code == 0
    assert temporary.read_bytes() == b"{"


# --- Three readers, one label a record --------------------------------------------------------
# rectool's reader (the package and the core), arcface_torch's MXFaceDataset and insightface's
# unpack_glint360k.py read every image's identity the same after each way a user makes an
# insightface pack: packed in either shape, repacked into the other, with identities dropped
# (--min-per-id, --keep-fraction, an eval set's images removed), merged from a sharded source
# whose identities straddle shard edges, and resumed after a kill.

# Each script of the helpers run on each pack in one MXNet process; a script that fails gives
# its error's text (unpack_glint360k cannot read the scalar shape, as in insightface).
EACH_PACK = """
results = []
for data in DATA["packs"]:
    out = {}
    for name, code in DATA["scripts"].items():
        got = []
        try:
            exec(code, {"DATA": data, "emit": got.append})
            out[name] = got[0]
        except Exception as exc:
            out[name] = type(exc).__name__ + ": " + str(exc)
    results.append(out)
emit(results)
"""
SIZES = [1, 2, 3, 5]  # images of each identity: a long tail in little


@pytest.fixture
def label_world(tmp_path):
    """A tree of identities of SIZES images, its vector list ([identity, 0.5 * index]),
    packed three ways: insightface vector, insightface scalar, images sharded by 3 records
    (identities straddle the shard edges); and a pack of two of its images, an eval set."""
    names = [f"id{k}" for k in range(len(SIZES))]
    root = tmp_path / "tree"
    everything = write_pack_tree(root, names, max(SIZES))
    items = [(i, c, rel) for i, c, rel in everything if int(rel[-7:-4]) < SIZES[c]]
    items = [(n, c, rel) for n, (_, c, rel) in enumerate(items)]
    vectors = write_list(tmp_path / "v.lst", [(i, [c, 0.5 * i], rel) for i, c, rel in items])
    scalars = write_list(tmp_path / "s.lst", items)
    evalset = write_list(tmp_path / "e.lst", [items[1], items[6]])  # of id1 and id3
    packs = {
        "vector": (vectors, "--layout", "insightface", "--pack-label"),
        "scalar": (scalars, "--layout", "insightface"),
        "sharded": (vectors, "--pack-label", "--shard-records", "3"),
        "eval": (evalset,),
    }
    for name, (lst, *options) in packs.items():
        result = run("pack", lst, root, tmp_path / name / "p", "--quiet", *options)
        assert result.exit_code == 0, result.output
    return tmp_path


def identities_read(prefixes):
    """Return, for each pack, what each reader reads: {reader: [(key, identity)]}."""
    ours = []
    for prefix in prefixes:
        ds, core_ds = open_dataset(prefix), core.open_dataset(f"{prefix}.manifest.json")
        labels = ds.labels if ds.labels.ndim == 1 else ds.labels[:, 0]
        assert np.array_equal(core_ds.labels, ds.labels)
        ours.append([(int(k), float(c)) for k, c in zip(ds.keys, labels)])
    packs = [{"rec": f"{p}.rec", "idx": f"{p}.idx"} for p in prefixes]
    scripts = {"mxface": MX_FACE_DATASET, "glint": UNPACK_GLINT360K}
    theirs = run_mxnet(EACH_PACK, {"packs": packs, "scripts": scripts})
    out = []
    for mine, their in zip(ours, theirs):
        samples, _ = their["mxface"]
        glint = their["glint"]
        read = {"rectool": mine, "mxface": [(k, c) for k, _, c in samples]}
        read["glint"] = glint if isinstance(glint, str) else [(k, float(c)) for k, c, _ in glint]
        out.append(read)
    return out


# (source, repack options, the identities kept, in order, by their source label)
REPACKS = {
    "vector-to-scalar": ("vector", [], [0, 1, 2, 3]),
    "scalar-to-vector": ("scalar", ["--pack-label"], [0, 1, 2, 3]),
    "min-per-id": ("vector", ["--pack-label", "--min-per-id", "2"], [1, 2, 3]),
    "min-per-id-scalar": ("scalar", ["--min-per-id", "3"], [2, 3]),
    "keep-labels": ("vector", ["--pack-label", "--min-per-id", "2", "--keep-labels"], [1, 2, 3]),
    "keep-fraction": ("scalar", ["--pack-label", "--keep-fraction", "0.5"], None),
    "eval-removed": (
        "vector",
        ["--pack-label", "--drop-overlap", "{eval}", "--min-per-id", "2"],
        [2, 3],
    ),
    "sharded-source": ("sharded", ["--pack-label"], [0, 1, 2, 3]),
    "merged": ("sharded", ["{vector}", "--pack-label"], [0, 1, 2, 3] * 2),
}


@pytest.mark.oracle
def test_three_readers_read_every_identity_alike_after_each_repack(label_world):
    w = label_world
    prefixes, expected = [], []
    for name, (source, options, kept) in REPACKS.items():
        options = [o.format(eval=w / "eval" / "p", vector=w / "vector" / "p") for o in options]
        prefix = w / "out" / name / "p"
        args = ["repack", w / source / "p", *options, prefix, "--layout", "insightface"]
        result = run(*args, "--quiet")
        assert result.exit_code == 0, (name, result.output)
        prefixes.append(prefix)
        expected.append(kept)
    for name, read, kept in zip(REPACKS, identities_read(prefixes), expected):
        vector = "--pack-label" in REPACKS[name][1]
        assert read["mxface"] == read["rectool"], name
        if vector:
            assert read["glint"] == read["rectool"], name
        else:
            assert "TypeError: 'float' object is not subscriptable" in read["glint"], name
        keys, identities = zip(*read["rectool"])
        assert list(keys) == list(range(1, len(keys) + 1)), name
        if "--keep-labels" not in REPACKS[name][1]:  # identities renumbered 0..K-1
            assert sorted(set(identities)) == list(range(len(set(identities)))), name
        if kept is not None:
            sizes = [SIZES[k] for k in kept]
            if "--drop-overlap" in REPACKS[name][1]:
                sizes = [SIZES[k] - (k in (1, 3)) for k in kept]
            runs = [len(list(group)) for _, group in itertools.groupby(identities)]
            assert runs == sizes, name


# --- One exit table, one JSON document --------------------------------------------------------
# Each command that reads a dataset or a file, given what is no dataset: a folder with nothing
# in it, a FIFO (which must not block), an empty file, a manifest of a format version this
# rectool does not read. Exit 2 (an input that cannot be used at all), and with --json one
# JSON document on stdout, naming the error, and nothing else.

READERS = {
    "bench": ["bench", "{x}", "--samples", "1", "--seconds", "0.1"],
    "dali-index": ["dali-index", "{x}", "{tmp}/d.idx"],
    "index": ["index", "{x}"],
    "info": ["info", "{x}"],
    "verify": ["verify", "{x}"],
    "unpack": ["unpack", "{x}", "{tmp}/u"],
    "repack": ["repack", "{x}", "{tmp}/r/p"],
    "report": ["report", "{x}", "-o", "{tmp}/r.html"],
    "pack": ["pack", "{x}", "{tmp}", "{tmp}/p/p"],
    "reindex": ["reindex", "{x}", "-o", "{tmp}/x.idx"],
}
VERSIONS = [99, 2, "3", 3.5, True, None, -1]


def unusable(tmp_path, kind, manifest):
    """Make an input of `kind` under tmp_path; return its path."""
    if kind == "folder":
        (tmp_path / "empty").mkdir()
        return tmp_path / "empty"
    if kind == "fifo":
        os.mkfifo(tmp_path / "p.manifest.json")
        return tmp_path / "p.manifest.json"
    if kind == "empty":
        (tmp_path / "p.manifest.json").write_bytes(b"")
        return tmp_path / "p.manifest.json"
    version = VERSIONS[int(kind[len("version") :])]
    doc = {**json.loads(manifest.read_text()), "format_version": version}
    target = manifest.parent / "q.manifest.json"
    target.write_text(json.dumps(doc))
    return target


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packed")
    root = tmp / "tree"
    items = write_pack_tree(root, ["ann", "bob"], 2)
    lst = write_list(tmp / "f.lst", items)
    assert run("pack", lst, root, tmp / "pack" / "p", "--quiet").exit_code == 0
    return tmp / "pack" / "p.manifest.json"


KINDS = ["folder", "fifo", "empty", *(f"version{i}" for i in range(len(VERSIONS)))]
# reindex walks any regular file's bytes for records (an empty one is a .rec of none); a
# manifest given to pack is a list of one bad line (exit 1): neither is unusable input.
CASES = [
    (command, kind)
    for command in sorted(READERS)
    for kind in KINDS
    if not (command == "reindex" and kind not in ("folder", "fifo"))
    and not (command == "pack" and kind.startswith("version"))
]


@pytest.mark.parametrize("command, kind", CASES)
def test_an_unusable_input_is_exit_2_and_one_json_document(tmp_path, packed, alarm, command, kind):
    x = unusable(tmp_path, kind, packed)
    args = [a.format(x=x, tmp=tmp_path) for a in READERS[command]]
    alarm(60)  # a FIFO opened for reading blocks: a failure, not an answer
    text = run(*args)
    result = run(*args, "--json")
    alarm(0)
    assert text.exit_code == 2, text.output
    assert "Traceback" not in text.output and text.stderr.count("Error: ") == 1, text.stderr
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)  # one document, nothing else
    assert (doc["exit"], result.stderr) == (2, ""), result.stderr
    assert str(x) in doc["error"] or command == "reindex", doc["error"]


# --- A header that announces more labels than its record holds --------------------------------
# A source's record whose flag says 1000 float32 labels where 100 bytes follow (or too short
# for even the 24-byte header) is damage: `info` and `report` name it as verify does, never
# leave it out of the figures without a word.


@pytest.mark.parametrize("command", ["info", "report"])
def test_a_record_too_short_for_its_labels_is_named_as_damage(tmp_path, command):
    data = images(3)
    cut = struct.pack("<IfQQ", 1000, 0.0, 2, 0) + data[1][:100]  # 1000 labels announced
    stub = b"\x01" * 10  # not even an image header
    records = [(1, image_record(data[0], [0.0, 1.0], 1)), (2, cut), (3, stub)]
    records.append((4, image_record(data[2], [1.0, 1.0], 4)))
    write_shard(tmp_path / "f.rec", tmp_path / "f.idx", records)
    extra = ["-o", tmp_path / "r.html"] if command == "report" else []
    result = run(command, tmp_path / "f.rec", *extra, "--json")
    assert result.exit_code == 1, result.output  # damage found: exit 1, as for other damage
    document = json.loads(result.stdout)
    assert document["images"] == 2
    damage = document["damage"]
    assert damage is not None and damage["records"] == 2, result.stdout
    assert [(d["key"], d["reason"]) for d in damage["first"]] == [
        (2, f"{SHORT} and the 1000 float32 labels it announces"),
        (3, SHORT),
    ]
    assert result.stderr.startswith("Error: 2 damaged records left out; run `rectool verify")


SHORT = "record too short for its 24-byte image header"


# --- An input at an output's name -------------------------------------------------------------
# `pack o/p.idx ROOT o/p --overwrite`: the list is at the name of the pack's .idx. The run
# read it, then replaced it with the pack's index: the user's list gone. Any file the pack
# writes (a shard of a numbered pack, a .partial, the manifest) is refused as its list or its
# label map, with or without --overwrite, before anything is written.


@pytest.mark.parametrize(
    "name, extra",
    [
        ("p.idx", []),
        ("p.manifest.json", []),
        ("p.rec.partial", []),
        ("p-00001.idx", ["--shard-records", "2"]),
        ("p.failures.jsonl", []),
    ],
)
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["", "overwrite"])
def test_a_list_at_a_name_the_pack_writes_is_refused(tmp_path, tree, name, extra, overwrite):
    out = tmp_path / "o"
    assert run("list", tree, out / name).exit_code == 0
    listed = (out / name).read_bytes()
    result = run("pack", out / name, tree, out / "p", *extra, *overwrite)
    assert result.exit_code == 2, result.output
    assert f"{out / name}: the list is also a file of the pack {out / 'p'}; " in result.output
    assert (out / name).read_bytes() == listed
    assert sorted(p.name for p in out.iterdir()) == sorted([name, f"{name}.labels.tsv"])


def test_a_label_map_at_a_name_the_pack_writes_is_refused(tmp_path, tree):
    out = tmp_path / "o"
    assert (
        run("list", tree, tmp_path / "f.lst", "--labels", out / "p.identities.json").exit_code == 0
    )
    args = ["pack", tmp_path / "f.lst", tree, out / "p", "--labels", out / "p.identities.json"]
    result = run(*args, "--overwrite")
    assert result.exit_code == 2, result.output
    assert "the label map is also a file of the pack" in result.output
    assert (out / "p.identities.json").read_text() == "0\tann\n1\tbob\n"


def test_a_list_beside_the_pack_under_its_own_name_is_packed(tmp_path, tree):
    # faces.lst and faces.labels.tsv beside out/faces: pack's inputs, never its outputs.
    assert run("list", tree, tmp_path / "faces.lst").exit_code == 0
    result = run("pack", tmp_path / "faces.lst", tree, tmp_path / "faces", "--quiet")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", ["p.relabel.tsv", "p.report.json", "p.labels.tsv"])
@pytest.mark.parametrize("option", ["--keep-ids", "--drop-ids"])
def test_a_repack_ids_file_at_a_name_the_repack_writes_is_refused(tmp_path, tree, name, option):
    lst = tmp_path / "f.lst"
    assert run("list", tree, lst).exit_code == 0
    assert run("pack", lst, tree, tmp_path / "src" / "p", "--quiet").exit_code == 0
    ids = tmp_path / "out" / name
    ids.parent.mkdir()
    ids.write_text("ann\n")
    result = run(
        "repack", tmp_path / "src" / "p", tmp_path / "out" / "p", option, ids, "--overwrite"
    )
    assert result.exit_code == 2, result.output
    assert f"{ids}: the {option} file is also a file of the pack " in result.output
    assert ids.read_text() == "ann\n"


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_fifo_as_list_root_is_exit_2_like_a_plain_file(tmp_path, alarm, as_json):
    # A plain file as ROOT is a usage error (2); a FIFO was walked as a folder and failed (1).
    os.mkfifo(tmp_path / "faces")
    alarm(60)
    result = run("list", tmp_path / "faces", tmp_path / "f.lst", *(["--json"] if as_json else []))
    alarm(0)
    assert result.exit_code == 2, result.output
    message = json.loads(result.stdout)["error"] if as_json else result.stderr
    assert f"'{tmp_path / 'faces'}' is a special file (FIFO, socket, device), neither a " in message


# --- A --keep-ids file that names nobody -------------------------------------------------------
# pack refuses an empty list (a step that failed upstream must not become a sound empty
# pack). repack's --keep-ids is its list of identities: an empty file (or one of blank and #
# lines) kept nobody and wrote an empty pack, exit 0.


@pytest.mark.parametrize("text", [b"", b"\n# none yet\n\n"], ids=["empty", "comments"])
def test_a_keep_ids_file_that_names_nobody_is_refused(tmp_path, tree, text):
    lst = tmp_path / "f.lst"
    assert run("list", tree, lst).exit_code == 0
    src = tmp_path / "src" / "p"
    assert run("pack", lst, tree, src, "--quiet").exit_code == 0
    (tmp_path / "ids").write_bytes(text)
    out = tmp_path / "out" / "p"
    result = run("repack", src, out, "--layout", "insightface", "--keep-ids", tmp_path / "ids")
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'ids'}: names no identity to keep (empty, or only blank and # " in (
        result.output
    )
    assert not out.parent.exists() or not any(out.parent.iterdir())
    (tmp_path / "ids").write_bytes(text)  # as --drop-ids: nobody dropped, every image kept
    result = run("repack", src, out, "--drop-ids", tmp_path / "ids")
    assert result.exit_code == 0, result.output
    assert len(open_dataset(out)) == 4


@pytest.mark.parametrize(
    "layout", [[], ["--layout", "insightface"], ["--layout", "insightface", "--pack-label"]]
)
def test_an_empty_source_still_repacks_to_an_empty_pack(tmp_path, layout):
    # Nothing was removed: an empty pack in, an empty pack out (it ended in an IndexError
    # traceback while the sources' labels were merged).
    (tmp_path / "e.lst").write_bytes(b"")
    (tmp_path / "tree").mkdir()
    for name in ("a", "b"):
        prefix = tmp_path / name / "p"
        args = ["pack", tmp_path / "e.lst", tmp_path / "tree", prefix, "--allow-empty", *layout]
        assert run(*args).exit_code == 0
    for sources in ([tmp_path / "a" / "p"], [tmp_path / "a" / "p", tmp_path / "b" / "p"]):
        out = tmp_path / f"out{len(sources)}" / "p"
        result = run("repack", *sources, out, *layout)
        assert result.exit_code == 0, result.output
        assert len(open_dataset(out)) == 0


# --- The images-per-identity chart ------------------------------------------------------------


def chart_text(page):
    """Return the text of the page's images-per-identity block, tags removed."""
    block = page[page.index('<h3 id="per-identity-h"') : page.index('<h3 id="dimensions-h"')]
    return " ".join(re.sub(r"<[^>]+>", " ", block).split())


@pytest.mark.parametrize("layout", [[], ["--layout", "insightface", "--pack-label"]])
def test_the_chart_of_a_pack_of_no_image_says_so(tmp_path, layout):
    # It said "Not shown: the labels are not integral class ids": there are no labels.
    (tmp_path / "e.lst").write_bytes(b"")
    (tmp_path / "tree").mkdir()
    args = ["pack", tmp_path / "e.lst", tmp_path / "tree", tmp_path / "p" / "p", "--allow-empty"]
    assert run(*args, *layout).exit_code == 0
    result = run("report", tmp_path / "p" / "p", "-o", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    text = chart_text((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert text == "Images per identity No images.", text
    assert "not integral" not in text


@pytest.mark.parametrize(
    "labels, bars",
    [
        ([0.0], [("1", 1)]),  # one identity, one image
        ([0.0, 7.0, 1000.0] * 3, [("3", 3)]),  # labels far apart, each of one size
        ([2.0] * 5 + [9.0], [("1", 1), ("2", 0), ("3", 0), ("4\u20135", 1)]),  # not from 0
    ],
    ids=["one-image", "sparse-same-size", "not-from-0"],
)
def test_the_chart_counts_each_identity_that_has_images(tmp_path, labels, bars):
    records = [(k, image_record(images(1)[0], label, k)) for k, label in enumerate(labels)]
    write_shard(tmp_path / "f.rec", tmp_path / "f.idx", records)
    result = run("report", tmp_path / "f.rec", "-o", tmp_path / "r.html", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["identities"] == len(set(labels))
    assert log_bins([labels.count(x) for x in sorted(set(labels))]) == bars
    text = chart_text((tmp_path / "r.html").read_text(encoding="utf-8"))
    table = text[text.index("Images per identity Identities") :]
    assert table.split()[4:] == [word for bar in bars for word in bar_words(bar)], table


def bar_words(bar):
    label, count = bar
    return [label, str(count)]


def test_a_million_image_identity_is_one_bar_among_the_long_tail():
    counts = [10**6, 1, 1, 2, 3, 40]
    bars = log_bins(counts)
    assert sum(n for _, n in bars) == len(counts)
    assert bars[0] == ("1", 2) and bars[-1][1] == 1
    assert bars[-1][0].endswith("1,000,000")


@pytest.mark.parametrize("out", ["-", "faces.lst"])
def test_a_label_map_given_as_dash_is_refused_not_written_to_a_file_named_dash(
    tree, tmp_path, monkeypatch, out
):
    # `-` names stdout where rectool takes it (OUT); `--labels -` wrote a file called "-".
    monkeypatch.chdir(tmp_path)
    result = run("list", tree, out, "--labels", "-", "--json")
    assert result.exit_code == 2, result.output
    assert "name one (not -)" in json.loads(result.output)["error"]
    assert not (tmp_path / "-").exists() and not (tmp_path / "faces.lst").exists()
