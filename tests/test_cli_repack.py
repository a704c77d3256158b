"""`rectool repack` on the command line: arguments, exit codes, summaries."""

from __future__ import annotations

import json
from contextlib import closing

from click.testing import CliRunner
from helpers.handmade_datasets import write_insightface, write_pack
from helpers.image_files import jpeg_bytes

from rectool.cli import cli
from rectool.dataset.packs import open_dataset


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def source(tmp_path, counts=(2, 3, 1)):
    items = []
    for label, count in enumerate(counts):
        for n in range(count):
            items.append((len(items), jpeg_bytes(10 * label + n, 8, 8), float(label)))
    write_pack(tmp_path / "src", [items])
    return tmp_path / "src"


def test_json_summary_and_exit_0(tmp_path):
    src = source(tmp_path)
    result = run("repack", src, tmp_path / "out", "--min-per-id", "2", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["images"] == 5 and summary["classes"] == 2
    assert summary["steps"] == {
        "source_images": 6,
        "min_per_id": 1,
        "images": 5,
        "identities": 2,
    }
    assert summary["manifest"] == f"{tmp_path / 'out'}.manifest.json"
    assert summary["accepted"] is True


def test_human_summary_on_stderr(tmp_path):
    result = CliRunner().invoke(cli, ["repack", str(source(tmp_path)), str(tmp_path / "o")])
    assert result.exit_code == 0
    assert result.output.startswith("Repacked 6 images of 3 identities into 1 shard (")


def test_several_sources_merge(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = source(tmp_path / "a")
    b = source(tmp_path / "b", counts=(1,))
    result = run("repack", a, b, tmp_path / "ab", "--order", "source", "--quiet")
    assert result.exit_code == 0, result.output
    assert result.output == ""
    with closing(open_dataset(tmp_path / "ab")) as ds:
        assert ds.labels.tolist() == [0, 0, 1, 1, 1, 2, 3]


def test_one_path_is_a_usage_error(tmp_path):
    result = run("repack", tmp_path / "out")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == "Error: give at least one SOURCE and the OUT_PREFIX"


def test_insightface_layout_with_shuffle_is_a_usage_error(tmp_path):
    result = run(
        "repack", source(tmp_path), tmp_path / "o", "--layout", "insightface", "--order", "shuffle"
    )
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: --layout insightface stores each identity's images as one key range: "
        "it needs --order identity"
    )


def test_unknown_identity_is_an_error_and_nothing_is_written(tmp_path):
    (tmp_path / "keep.txt").write_text("0\n12\n")
    result = run(
        "repack", source(tmp_path), tmp_path / "out" / "x", "--keep-ids", tmp_path / "keep.txt"
    )
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {tmp_path / 'keep.txt'}: 1 label(s) have no images in the sources: 12\n"
    )
    assert not (tmp_path / "out").exists()


def test_missing_source_is_an_error(tmp_path):
    result = run("repack", tmp_path / "nothing", tmp_path / "out")
    assert result.exit_code == 2  # an unusable input
    assert result.output.startswith(f"Error: source {tmp_path / 'nothing'}: ")


def test_reencode_failures_exit_3(tmp_path):
    write_pack(tmp_path / "src", [[(0, jpeg_bytes(1, 8, 8), 0.0), (1, b"broken", 0.0)]])
    result = run("repack", tmp_path / "src", tmp_path / "o", "--quality", "80", "--json")
    assert result.exit_code == 3
    assert json.loads(result.output)["refused"] == 1
    flags = "--quality 80 --max-failures 1 --quiet".split()
    result = run("repack", tmp_path / "src", tmp_path / "o2", *flags)
    assert result.exit_code == 0


def test_png_quality_range_is_checked(tmp_path):
    result = run(
        "repack", source(tmp_path), tmp_path / "o", "--encoding", ".png", "--quality", "50"
    )
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: --quality 50: PNG compression must be 0-9 (--encoding .png)"
    )


def test_insightface_folder_to_dali_ready_shuffle(tmp_path):
    folder = tmp_path / "faces_emore"
    folder.mkdir()
    images = {k: jpeg_bytes(k, 8, 8) for k in range(1, 6)}
    write_insightface(folder / "train.rec", folder / "train.idx", [2, 3], images.get)
    flags = "--order shuffle --seed 1 --shard-records 2 --quiet".split()
    result = run("repack", folder, tmp_path / "dali" / "train", *flags)
    assert result.exit_code == 0, result.output
    with closing(open_dataset(tmp_path / "dali" / "train")) as ds:
        assert ds.layout == "images" and len(ds) == 5 and len(ds.shards) == 3
        assert sorted(bytes(image) for image, _ in ds) == sorted(images.values())
    assert run("verify", tmp_path / "dali" / "train", "--quiet").exit_code == 0
