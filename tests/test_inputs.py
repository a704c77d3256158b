"""One door in: every file rectool reads stays where the user pointed it (issue 19).

Links inside ROOT that lead out of it are not followed without `--allow-outside-root`, paths
named inside a dataset stay inside its folder, and work per record is bounded by the records
that exist.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree

from rectool.cli import cli
from rectool.format.records import IndexedRecordFile

LINK_OUT = "outside-root: a symbolic link leads out of ROOT (--allow-outside-root packs it)"
PACK_MODES = {
    "pass-through": ["--check", "none"],
    "pass-through on threads": ["--check", "none", "--workers", "2"],
    "decode check": ["--check", "decode", "--workers", "2"],
    "re-encode": ["--resize", "20", "--workers", "1"],
}


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def pack_refusals(tmp_path, root, paths, args):
    """Pack alice/000.jpg and `paths`; return ({path: reason} refused, {path: image bytes})."""
    items = [(0, 0, "alice/000.jpg")] + [(i + 1, 0, p) for i, p in enumerate(paths)]
    lst = write_list(tmp_path / "odd.lst", items)
    prefix = tmp_path / "odd" / "out"
    result = invoke("pack", lst, root, prefix, "-q", "--max-failures", "100", "--overwrite", *args)
    assert result.exit_code == 0, result.output
    with open(f"{prefix}.failures.jsonl", encoding="utf-8") as f:
        refused = {entry["path"]: entry["reason"] for entry in map(json.loads, f)}
    return refused


@pytest.fixture
def linked_tree(tmp_path):
    """A tree whose links lead out of it (a file, a folder) and one that stays inside."""
    outside = tmp_path / "outside"
    (outside / "carol").mkdir(parents=True)
    (outside / "secret.jpg").write_bytes(jpeg_bytes(7))
    (outside / "carol" / "1.jpg").write_bytes(jpeg_bytes(8))
    root = tmp_path / "tree"
    write_pack_tree(root, ["alice", "bob"], 2)
    os.symlink(outside / "secret.jpg", root / "alice" / "x.jpg")
    os.symlink("../../outside/secret.jpg", root / "alice" / "rel.jpg")
    os.symlink(outside / "carol", root / "carol")
    os.symlink("../bob/000.jpg", root / "alice" / "inside.jpg")  # stays in ROOT: packed
    return root


@pytest.mark.parametrize("mode", PACK_MODES)
def test_pack_refuses_links_that_lead_out_of_root(linked_tree, tmp_path, mode):
    paths = ["alice/x.jpg", "alice/rel.jpg", "carol/1.jpg", "alice/inside.jpg"]
    refused = pack_refusals(tmp_path, linked_tree, paths, PACK_MODES[mode])
    assert refused == {"alice/x.jpg": LINK_OUT, "alice/rel.jpg": LINK_OUT, "carol/1.jpg": LINK_OUT}
    refused = pack_refusals(
        tmp_path, linked_tree, paths, [*PACK_MODES[mode], "--allow-outside-root"]
    )
    assert refused == {}
    with IndexedRecordFile(tmp_path / "odd" / "out.rec") as records:
        assert records.keys.tolist() == [0, 1, 2, 3, 4]


def test_pack_does_not_pack_proc_or_etc_through_a_link(tmp_path):
    root = tmp_path / "tree"
    write_pack_tree(root, ["alice"], 1)
    os.symlink("/etc/passwd", root / "alice" / "passwd.jpg")
    os.symlink("/proc/self/environ", root / "alice" / "environ.jpg")
    refused = pack_refusals(
        tmp_path, root, ["alice/passwd.jpg", "alice/environ.jpg"], ["--check", "none"]
    )
    assert refused == {"alice/passwd.jpg": LINK_OUT, "alice/environ.jpg": LINK_OUT}


# -- report: paths named inside a dataset stay inside its folder -------------------------------


def read_refusals(folder, failures_file, images_root=None):
    from rectool.report.data import ReportOptions
    from rectool.report.refusals import read_refusals
    from rectool.report.thumbs import ThumbBudget

    manifest = {"failures_file": failures_file, "totals": {"failures": 1}}
    options = ReportOptions(images_root=None if images_root is None else str(images_root))
    return read_refusals(
        manifest, str(folder / "faces.manifest.json"), options, ThumbBudget(1 << 24), 1
    )


@pytest.mark.parametrize("name", ["../../../etc/passwd", "/etc/passwd", "sub/../../x.jsonl"])
def test_report_reads_no_failures_file_outside_the_dataset(tmp_path, name):
    pack = tmp_path / "a" / "b" / "c" / "pack"
    pack.mkdir(parents=True)
    leaked = {"line": 1, "index": 0, "path": "secret.jpg", "reason": "leaked"}
    (tmp_path / "x.jsonl").write_text(json.dumps(leaked) + "\n")
    out = read_refusals(pack, name)
    assert out.total == 0 and not out.reasons
    assert "is not a path inside the dataset's folder" in out.note
    assert repr(name) in out.note


def test_report_does_not_follow_a_failures_link_out_or_read_a_fifo_or_device(tmp_path, alarm):
    alarm(60)  # a guard only: without the fix the FIFO blocks for ever, /dev/zero never ends
    os.symlink("/etc/passwd", tmp_path / "link.jsonl")
    os.symlink("/dev/zero", tmp_path / "zero.jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")  # opening it would wait for a writer forever
    out = read_refusals(tmp_path, "link.jsonl")
    assert out.total == 0 and "leads outside" in out.note, out.note
    for name in ("zero.jsonl", "fifo.jsonl"):
        out = read_refusals(tmp_path, name)
        assert out.total == 0 and "not a regular file" in out.note, out.note


def test_report_holds_at_most_one_bounded_line_of_a_failures_file(tmp_path, monkeypatch):
    from rectool.doors import failures

    monkeypatch.setattr(failures, "MAX_LINE_BYTES", 100)
    good = b'{"line": 1, "index": 0, "path": "a/1.jpg", "reason": "empty file"}\n'
    (tmp_path / "f.jsonl").write_bytes(good + b"x" * 1000 + b"\n" + good)
    out = read_refusals(tmp_path, "f.jsonl")
    assert out.total == 2 and out.bad_lines == [2]


def test_report_shows_no_thumbnail_of_an_image_outside_images_root(tmp_path):
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(jpeg_bytes(3))
    root = tmp_path / "tree"
    (root / "alice").mkdir(parents=True)
    (root / "alice" / "1.jpg").write_bytes(jpeg_bytes(4))
    os.symlink(secret, root / "alice" / "link.jpg")
    pack = tmp_path / "pack"
    pack.mkdir()
    lines = [
        {"line": 1, "index": 0, "path": str(secret), "reason": "r"},
        {"line": 2, "index": 1, "path": "../secret.jpg", "reason": "r"},
        {"line": 3, "index": 2, "path": "alice/link.jpg", "reason": "r"},
        {"line": 4, "index": 3, "path": "alice/1.jpg", "reason": "r"},  # inside: shown
    ]
    (pack / "f.jsonl").write_text("".join(json.dumps(entry) + "\n" for entry in lines))
    out = read_refusals(pack, "f.jsonl", images_root=root)
    thumbs = {path: thumb for _, path, _, thumb, _ in out.rows}
    assert thumbs["alice/1.jpg"] is not None
    assert [thumbs[entry["path"]] for entry in lines[:3]] == [None, None, None]
    notes = {path: note for _, path, _, _, note in out.rows}
    assert notes[str(secret)] == "source outside --images-root or not a regular file"


# -- many keys naming one record ---------------------------------------------------------------


def test_shared_offsets_counts_offsets_named_by_several_keys():
    import numpy as np

    from rectool.format.keys import shared_offsets

    keys = np.array([0, 1, 2, 3, 4, 4])
    offsets = np.array([0, 40, 40, 40, 80, 80])  # 40: keys 1-3; 80: key 4 twice (one key)
    assert shared_offsets(keys, offsets) == (1, 0, 40)
    assert shared_offsets(keys, np.array([0, 40, 80, 120, 160, 200])) == (0, None, None)
    # within a shard only: the same offset in two shards is two records
    assert shared_offsets(np.array([0, 1]), np.array([8, 8]), np.array([0, 1])) == (0, None, None)
    keys, offsets, shards = np.array([5, 1, 2, 3]), np.array([8, 0, 8, 0]), np.array([1, 0, 1, 0])
    assert shared_offsets(keys, offsets, shards) == (2, 0, 0)  # shard 0 offset 0, shard 1 8


@pytest.fixture
def one_record_many_keys(tmp_path):
    """A pack of 3 images, no manifest, whose .idx names the record at offset 0 under 1,000
    more keys."""
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["alice"], 3)
    lst = write_list(tmp_path / "faces.lst", items)
    prefix = tmp_path / "out" / "faces"
    assert invoke("pack", lst, root, prefix, "-q").exit_code == 0
    idx = tmp_path / "out" / "faces.idx"
    os.remove(f"{prefix}.manifest.json")  # as another tool writes it: the .idx alone says
    with open(idx, "a", encoding="ascii") as f:
        f.writelines(f"{key}\t0\n" for key in range(100, 1100))
    return prefix, idx


def test_unpack_refuses_an_index_naming_one_record_under_many_keys(one_record_many_keys, tmp_path):
    prefix, idx = one_record_many_keys
    out = tmp_path / "images"
    result = invoke("unpack", f"{prefix}.rec", out, "-q")
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {idx}: byte offset 0 is named by 1,001 keys ")
    assert "(0, 100, 101, 102, 103 and 996 more)" in result.output
    assert "unpack refuses" in result.output
    assert not out.exists() or not any(out.rglob("*.jpg"))  # nothing written


def test_repack_refuses_an_index_naming_one_record_under_many_keys(one_record_many_keys, tmp_path):
    prefix, idx = one_record_many_keys
    result = invoke("repack", f"{prefix}.rec", tmp_path / "again", "-q")
    assert result.exit_code == 1, result.output
    assert f"{idx}: byte offset 0 is named by 1,001 keys" in result.output
    assert "repack refuses" in result.output
    assert not list(tmp_path.glob("again*"))


def test_verify_reports_the_shared_offset(one_record_many_keys):
    prefix, _ = one_record_many_keys
    result = invoke("verify", f"{prefix}.rec", "--json")
    found = json.loads(result.output)
    assert result.exit_code != 0
    text = json.dumps(found)
    assert "duplicate-offset" in text


# -- the opener ----------------------------------------------------------------------------------


def test_the_opener_bounds_size_refuses_links_and_keeps_files_in_a_folder(tmp_path, alarm):
    from rectool.doors.inputs import dataset_path, open_input, read_regular
    from rectool.errors import RectoolError

    alarm(60)  # a guard only: a FIFO opened for reading would block
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.txt").write_bytes(b"0123456789")
    (tmp_path / "secret").write_bytes(b"s")
    os.symlink(tmp_path / "secret", tmp_path / "data" / "out")
    os.symlink("f.txt", tmp_path / "data" / "in")
    os.mkfifo(tmp_path / "data" / "fifo")
    folder = tmp_path / "data"
    assert read_regular(folder / "f.txt", "x", max_bytes=10)[0] == b"0123456789"
    assert read_regular(folder / "in", "x", within=folder)[0] == b"0123456789"
    with pytest.raises(RectoolError, match=r"f\.txt: the x is 10 bytes, over 9"):
        read_regular(folder / "f.txt", "x", max_bytes=9)
    with pytest.raises(RectoolError, match=r"in: cannot open the x \(is a symbolic link\)"):
        open_input(folder / "in", "x", follow=False)
    with pytest.raises(RectoolError, match=r"out: the x leads outside .*data \(to .*secret\)"):
        open_input(folder / "out", "x", within=folder)
    with pytest.raises(RectoolError, match=r"fifo: not a regular file \(the x must be one\)"):
        open_input(folder / "fifo", "x")
    with pytest.raises(RectoolError, match="is not a path inside the dataset's folder"):
        dataset_path(folder, "../secret", "failures file")
    assert dataset_path(folder, "a/b.jsonl", "failures file") == str(folder / "a/b.jsonl")


def test_report_refuses_an_index_naming_one_record_under_many_keys(one_record_many_keys, tmp_path):
    prefix, _ = one_record_many_keys
    result = invoke("report", f"{prefix}.rec", "-o", tmp_path / "r.html")
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {prefix}.rec: byte offset 0 is named by 1,001 keys")
    assert not (tmp_path / "r.html").exists()


def test_sha256_of_a_fifo_is_refused_not_waited_on(tmp_path, alarm):
    from rectool.errors import RectoolError
    from rectool.format.digest import sha256_file

    alarm(60)  # a guard only: without the opener, open() of a FIFO waits for a writer
    os.mkfifo(tmp_path / "x.rec")
    with pytest.raises(RectoolError, match=r"x\.rec: not a regular file"):
        sha256_file(tmp_path / "x.rec")


def test_pack_refuses_a_fifo_as_its_list_instead_of_waiting(tmp_path, alarm):
    alarm(60)  # a guard only: without the opener, pack waits for a writer for ever
    root = tmp_path / "tree"
    write_pack_tree(root, ["alice"], 1)
    os.mkfifo(tmp_path / "faces.lst")
    result = invoke("pack", tmp_path / "faces.lst", root, tmp_path / "out" / "faces", "-q")
    assert result.exit_code == 2, result.output  # an unusable input
    assert "faces.lst: not a regular file (the list file must be one)" in result.output


def test_a_root_given_through_a_link_is_packed_and_listed_whole(tmp_path):
    real = tmp_path / "disk" / "faces"
    items = write_pack_tree(real, ["alice", "bob"], 2)
    os.symlink(real, tmp_path / "faces")  # ROOT itself is a link: its inside is inside
    refused = pack_refusals(tmp_path, tmp_path / "faces", [p for _, _, p in items], [])
    assert refused == {}
    lst = tmp_path / "t.lst"
    assert invoke("list", tmp_path / "faces", lst, "-q").exit_code == 0
    assert len(lst.read_text().splitlines()) == 4


# The files of a format-3 pack that its manifest names: `index.NAME.file`, `identities.file`.
INDEX_FIELDS = ["index.offsets", "index.keys", "index.labels", "identities"]


@pytest.mark.parametrize("where", ["../outside", "/abs"])
@pytest.mark.parametrize("field", INDEX_FIELDS)
def test_an_index_file_named_outside_the_pack_is_refused(small_pack, tmp_path, field, where):
    from rectool.reader import InputError, open_dataset

    doc = json.loads(small_pack.manifest.read_text())
    entry = doc
    for part in field.split("."):
        entry = entry[part]
    # A valid copy of the file, outside the pack's folder: only its name can refuse it.
    outside = tmp_path / "elsewhere" / entry["file"]
    outside.parent.mkdir()
    outside.write_bytes((small_pack.manifest.parent / entry["file"]).read_bytes())
    entry["file"] = f"../elsewhere/{outside.name}" if where == "../outside" else str(outside)
    small_pack.manifest.write_text(json.dumps(doc))
    # The core reader and the full schema word the rest ("in its folder", "in the manifest's").
    message = (
        f"Error: {small_pack.manifest}: manifest field '{field}.file' must be a plain file name"
    )
    for args in (
        ["verify"],
        ["info"],
        ["unpack", tmp_path / "images"],
        ["report", "-o", tmp_path / "r.html"],
        ["index", "--force"],
    ):
        result = invoke(args[0], small_pack.manifest, *args[1:])
        assert result.exit_code == 2, (args, result.output)  # an unusable input
        assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, args
    assert not (tmp_path / "images").exists() and not (tmp_path / "r.html").exists()
    if field.startswith("index."):  # the reader maps the index; it never reads the names
        with pytest.raises(InputError, match=f"manifest field '{field}.file' must be a plain"):
            open_dataset(small_pack.manifest)
