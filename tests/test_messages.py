"""What rectool says to a person: counts in words, interruptions that say how to go on, a
list on stdin without a label map, leftovers of a killed --overwrite, contact-sheet captions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree

from rectool.report.data import ReportOptions, SheetRow, build_report
from rectool.report.page import sheet_caption
from rectool.text import counted


def rectool(*args, env=None, input=None):
    return subprocess.run(
        [sys.executable, "-m", "rectool", *map(str, args)],
        capture_output=True,
        text=True,
        input=input,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def lopsided(tmp_path):
    """alice with 3 images, bob with 1, packed (label map beside the list)."""
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["alice"], 3)
    (root / "bob").mkdir()
    (root / "bob" / "000.jpg").write_bytes(jpeg_bytes(99, 40, 32))
    items.append((3, 1, "bob/000.jpg"))
    lst = write_list(tmp_path / "faces.lst", items)
    (tmp_path / "faces.labels.tsv").write_text("0\talice\n1\tbob\n")
    packed = rectool("pack", lst, root, tmp_path / "out" / "faces")
    assert packed.returncode == 0, packed.stderr
    return root, lst, tmp_path / "out" / "faces"


@pytest.mark.parametrize(
    "n, noun, words",
    [
        (0, "image", "0 images"),
        (1, "image", "1 image"),
        (2, "identity", "2 identities"),
        (1, "class", "1 class"),
        (20183, "class", "20,183 classes"),
        (3, "process", "3 processes"),
    ],
)
def test_counted_agrees_in_number_and_separates_thousands(n, noun, words):
    assert counted(n, noun) == words


def test_info_says_1_image_and_separates_classes(lopsided):
    _, _, prefix = lopsided
    out = rectool("info", prefix).stdout.splitlines()
    assert out[0] == f"{prefix}: layout images, 1 shard, 4 records, 4 images, 0.0 MB"
    assert out[2] == "Identities: 2 (of 2 classes)"
    histogram = [line.split(":")[0].strip() for line in out if line.startswith("    ")]
    assert "1 image" in histogram and "1 images" not in histogram


def test_pack_of_one_image_says_1_image(tmp_path):
    root = tmp_path / "tree"
    lst = write_list(tmp_path / "one.lst", write_pack_tree(root, ["alice"], 1))
    done = rectool("pack", lst, root, tmp_path / "out" / "one")
    assert done.stderr.startswith("Packed 1 image into 1 shard (0.0 MB); manifest ")


def test_verify_of_five_shards_names_their_layout_once(tmp_path):
    root = tmp_path / "tree"
    lst = write_list(tmp_path / "f.lst", write_pack_tree(root, ["a", "b", "c", "d", "e"], 2))
    prefix = tmp_path / "out" / "f"
    assert rectool("pack", lst, root, prefix, "--shard-records", "2").returncode == 0
    shards = sorted(str(p) for p in prefix.parent.glob("f-*.rec"))
    assert len(shards) == 5
    line = rectool("verify", *shards).stdout.splitlines()[0]
    assert "10 records (10 images) in 5 shards, 0.0 MB, layout images;" in line
    assert "images, images" not in line


def test_list_to_stdout_says_so(lopsided):
    root, _, _ = lopsided
    listed = rectool("list", root, "-")
    assert "Wrote 4 images to stdout." in listed.stderr.splitlines()


def test_a_list_on_stdin_without_labels_says_the_manifest_names_no_identities(lopsided, tmp_path):
    root, _, _ = lopsided
    listing = rectool("list", root, "-").stdout
    packed = rectool("pack", "-", root, tmp_path / "p" / "x", input=listing)
    assert packed.returncode == 0
    assert "No label map: the manifest names no identities" in packed.stderr
    assert json.loads((tmp_path / "p" / "x.manifest.json").read_text())["identities"] is None
    named = rectool("list", root, "-", "--labels", tmp_path / "m.tsv").stdout
    packed = rectool(
        "pack", "-", root, tmp_path / "q" / "x", "--labels", tmp_path / "m.tsv", input=named
    )
    assert "No label map" not in packed.stderr
    entry = json.loads((tmp_path / "q" / "x.manifest.json").read_text())["identities"]
    assert (entry["file"], entry["count"]) == ("x.identities.json", 2)  # format 3: a file
    names = json.loads((tmp_path / "q" / "x.identities.json").read_text(encoding="utf-8"))
    assert names == {"0": "alice", "1": "bob"}


@pytest.mark.parametrize("signal, status, word", [("term", 143, "Terminated (SIGTERM)")])
def test_an_interrupted_repack_says_how_to_resume_and_resume_finishes(
    lopsided, tmp_path, signal, status, word
):
    _, _, source = lopsided
    out = tmp_path / "r" / "faces"
    stopped = rectool("repack", source, out, env={"RECTOOL_OUTPUT_FAULT": f"shard:1:{signal}"})
    assert stopped.returncode == status
    assert stopped.stderr == (
        f"{word} after 4 of 4 records: what was packed is kept ({out}: finished shards and "
        ".partial files).\nRun the same command with --resume to continue it.\n"
    )
    resumed = rectool("repack", source, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert rectool("verify", out).returncode == 0


def test_verify_names_the_staging_folder_a_killed_overwrite_left(lopsided):
    root, lst, prefix = lopsided
    killed = rectool(
        "pack", lst, root, prefix, "--overwrite", env={"RECTOOL_OUTPUT_FAULT": "shard:1:kill"}
    )
    assert killed.returncode == -9
    staging = prefix.parent / ".faces.overwrite"
    assert staging.is_dir()
    checked = rectool("verify", prefix)
    assert checked.returncode == 0
    assert checked.stdout.splitlines()[1] == (
        f"Note: {staging} is the staging folder of an --overwrite that was killed; the pack "
        "verified is the one it did not replace. Delete the folder, or run that command again."
    )
    document = json.loads(rectool("verify", "--json", prefix).stdout)
    assert document["leftover_staging"] == [str(staging)]
    assert rectool("pack", lst, root, prefix, "--overwrite").returncode == 0
    assert not staging.exists()
    assert "Note:" not in rectool("verify", prefix).stdout


def test_contact_sheet_captions_say_who_and_how_many():
    assert sheet_caption(SheetRow("sample", 0, "alice", 1, [])) == [
        "identity 0",
        "alice",
        "1 image (sampled)",
    ]
    assert sheet_caption(SheetRow("largest", 7, None, 1200, []))[::2] == [
        "identity 7",
        "1,200 images (most)",
    ]
    assert sheet_caption(SheetRow("sample", None, None, 50, []))[::2] == [
        "images sampled",
        "50 images in the dataset",
    ]


def test_small_images_in_a_pack_of_large_ones_get_full_size_thumbnails(tmp_path):
    """The decoder's reduction is chosen for the most common size (here 1/4 for 400 px images
    and 96 px thumbnails); a 100 px image reduced so would be drawn at 25 px."""
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["big"], 6, height=400, width=400)
    (root / "small").mkdir()
    for n in range(2):
        (root / "small" / f"{n}.jpg").write_bytes(jpeg_bytes(50 + n, 100, 100))
        items.append((6 + n, 1, f"small/{n}.jpg"))
    lst = write_list(tmp_path / "m.lst", items)
    assert rectool("pack", lst, root, tmp_path / "out" / "m").returncode == 0
    report = build_report(tmp_path / "out" / "m", ReportOptions(thumb=96, identities=2))
    sizes = {
        row.label: {max(t.pixels.shape[:2]) for t in row.thumbs if t.pixels is not None}
        for row in report.rows
    }
    assert sizes[0] == {96} and sizes[1] == {96}
