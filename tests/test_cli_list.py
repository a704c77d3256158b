"""`rectool list`: options, files written, the summary on stderr, JSON, and exit codes."""

from __future__ import annotations

import json
import os
import re

import pytest
from click.testing import CliRunner
from helpers.image_trees import (
    MIXED_TREE_IDENTITIES,
    MIXED_TREE_IMAGES,
    MIXED_TREE_SKIPPED,
    face_tree,
    make_tree,
)

from rectool.cli import cli
from rectool.packer import listing as listing_module


def run(*args):
    return CliRunner().invoke(cli, ["list", *map(str, args)], catch_exceptions=False)


def seconds_free(text):
    return re.sub(r"read in \d+\.\d\d s", "read in T s", text)


def lines(path):
    return path.read_bytes().decode("utf-8").splitlines()


@pytest.fixture
def faces(tmp_path):
    face_tree(tmp_path / "faces", identities=4, per_identity=5)
    return tmp_path / "faces"


def expected_mixed_list():
    label_of = {name: label for label, name in enumerate(MIXED_TREE_IDENTITIES)}
    return [f"{i}\t{label_of[n]}\t{p}" for i, (n, p) in enumerate(MIXED_TREE_IMAGES)]


def test_list_writes_the_list_the_label_map_and_a_summary_on_stderr(mixed_tree, tmp_path):
    out = tmp_path / "faces.lst"
    result = run(mixed_tree.root, out)
    assert result.exit_code == 0
    assert result.stdout == ""
    assert lines(out) == expected_mixed_list()
    assert lines(tmp_path / "faces.labels.tsv") == [
        "0\tJosé",
        "1\talice",
        "2\tbob",
        "3\tdave",
        "4\t王芳",
    ]
    assert seconds_free(result.stderr) == (
        "Listed 12 images of 5 identities (8 folders read in T s).\n"
        f"Wrote {out}: 12 images.\n"
        f"Wrote the label map {tmp_path / 'faces.labels.tsv'}.\n"
        "Passed over:\n"
        "  files without an image extension: 2 (alice/notes.txt, only_text/a.txt)\n"
        "  hidden files and folders (name starts with '.'): 3 "
        "(.cache, alice/.DS_Store, alice/sub/.hidden.jpg)\n"
        "  entries directly in the root, outside any identity folder: 2 (README.md, loose.jpg)\n"
        "  identity folders without any image: 2 (empty, only_text)\n"
        "  names a .lst line cannot hold (tab, newline, CR, not UTF-8, leading or trailing "
        "whitespace): 6 (alice/ lead.jpg, alice/new\\nline.jpg, alice/tab\\tname.jpg, ...)\n"
        "  broken symbolic links and special files: 2 (alice/broken.jpg, alice/pipe.jpg)\n"
        "  symlinked folders that lead back to their own ancestor: 1 (alice/loop)\n"
    )


def test_json_summary_on_stdout(mixed_tree, tmp_path):
    out = tmp_path / "faces.lst"
    result = run(mixed_tree.root, out, "--json")
    assert result.exit_code == 0
    assert result.stderr == ""
    summary = json.loads(result.stdout)
    assert summary.pop("seconds") >= 0
    assert summary == {
        "root": str(mixed_tree.root),
        "images": 12,
        "identities": 5,
        "folders_scanned": 8,
        "lists": {str(out): {"images": 12, "suffix": ""}},
        "label_map": str(tmp_path / "faces.labels.tsv"),
        "seed": None,
        "skipped": {reason: len(paths) for reason, paths in MIXED_TREE_SKIPPED.items()},
        "skipped_examples": {
            "not_image": ["alice/notes.txt", "only_text/a.txt"],
            "hidden": [".cache", "alice/.DS_Store", "alice/sub/.hidden.jpg"],
            "outside_identity": ["README.md", "loose.jpg"],
            "empty_identity": ["empty", "only_text"],
            "unwritable_name": [
                "alice/ lead.jpg",
                "alice/new\\nline.jpg",
                "alice/tab\\tname.jpg",
                "caf\\xe9",
                "carol\\tx",
            ],
            "not_regular": ["alice/broken.jpg", "alice/pipe.jpg"],
            "symlink_loop": ["alice/loop"],
        },
    }


def test_stdout_list_with_json_on_stderr_and_no_label_map(mixed_tree, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(mixed_tree.root, "-", "--json")
    assert result.exit_code == 0
    assert result.stdout_bytes.decode("utf-8").splitlines() == expected_mixed_list()
    summary = json.loads(result.stderr)
    assert summary["lists"] == {"-": {"images": 12, "suffix": ""}}
    assert summary["label_map"] is None
    assert sorted(os.listdir(tmp_path)) == ["faces"]


def test_stdout_list_with_labels_option(faces, tmp_path):
    result = run(faces, "-", "--labels", tmp_path / "map.tsv", "-q")
    assert result.exit_code == 0
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == 20
    assert lines(tmp_path / "map.tsv") == ["0\tid0", "1\tid1", "2\tid2", "3\tid3"]


def test_labels_option_moves_the_label_map(faces, tmp_path):
    result = run(faces, tmp_path / "x.lst", "--labels", tmp_path / "elsewhere.tsv", "-q")
    assert result.exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "elsewhere.tsv",
        "x.lst",
    ]


def test_quiet_prints_nothing(faces, tmp_path):
    result = run(faces, tmp_path / "x.lst", "--quiet")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.parametrize("extra", [[], ["--shuffle", "--seed", "5", "--train-ratio", "0.7"]])
def test_one_and_eight_threads_give_byte_identical_lists(tmp_path, extra):
    spec = {
        f"p{i:02d}": {
            **{f"{n}.jpg": None for n in range(i % 4 + 1)},
            "deeper": {f"d{n}.png": None for n in range(i % 3)},
        }
        for i in range(40)
    }
    make_tree(tmp_path / "faces", spec)
    outputs = []
    for threads in ("1", "8"):
        out = tmp_path / threads / "faces.lst"
        out.parent.mkdir()
        result = run(tmp_path / "faces", out, "--workers", threads, "-q", *extra)
        assert result.exit_code == 0
        outputs.append({p.name: p.read_bytes() for p in sorted(out.parent.iterdir())})
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) == (3 if extra else 2)
    assert sum(len(data.splitlines()) for name, data in outputs[0].items() if "lst" in name) == (
        sum(i % 4 + 1 + i % 3 for i in range(40))
    )


def test_upper_case_extensions_and_the_exts_option(tmp_path):
    make_tree(tmp_path / "faces", {"a": {"1.JPG": None, "2.PNG": None, "3.bmp": None}})
    out = tmp_path / "x.lst"
    assert run(tmp_path / "faces", out, "-q").exit_code == 0
    assert lines(out) == ["0\t0\ta/1.JPG", "1\t0\ta/2.PNG", "2\t0\ta/3.bmp"]
    result = run(
        tmp_path / "faces", out, "--exts", "jpg", "--exts", "BMP,.tiff", "--json", "--overwrite"
    )
    assert result.exit_code == 0
    assert lines(out) == ["0\t0\ta/1.JPG", "1\t0\ta/3.bmp"]
    assert json.loads(result.stdout)["skipped_examples"]["not_image"] == ["a/2.PNG"]


def test_no_recursive_skips_and_counts_subfolders(tmp_path):
    make_tree(tmp_path / "faces", {"a": {"1.jpg": None, "s": {"2.jpg": None}}})
    out = tmp_path / "x.lst"
    result = run(tmp_path / "faces", out)
    assert lines(out) == ["0\t0\ta/1.jpg", "1\t0\ta/s/2.jpg"]
    result = run(tmp_path / "faces", out, "--no-recursive", "--overwrite")
    assert result.exit_code == 0
    assert lines(out) == ["0\t0\ta/1.jpg"]
    assert "  subfolders of identities, not scanned without recursion: 1 (a/s)\n" in (result.stderr)


def test_shuffle_with_seed_repeats_and_without_reports_its_seed(faces, tmp_path):
    a, b = tmp_path / "a.lst", tmp_path / "b.lst"
    assert run(faces, a, "--shuffle", "--seed", "11", "-q").exit_code == 0
    assert run(faces, b, "--shuffle", "--seed", "11", "-q").exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    shuffled = lines(a)
    assert [line.split("\t")[0] for line in shuffled] == [str(i) for i in range(20)]
    in_order = [f"{5 * i + n}\t{i}\tid{i}/{n:02d}.jpg" for i in range(4) for n in range(5)]
    assert shuffled != in_order
    assert sorted(line.split("\t", 1)[1] for line in shuffled) == sorted(
        line.split("\t", 1)[1] for line in in_order
    )
    result = run(faces, b, "--shuffle", "--overwrite")
    seed = int(re.search(r"Shuffled with --seed (\d+)\.", result.stderr).group(1))
    assert run(faces, a, "--shuffle", "--seed", seed, "-q", "--overwrite").exit_code == 0
    assert a.read_bytes() == b.read_bytes()


def test_in_order_by_default(faces, tmp_path):
    out = tmp_path / "x.lst"
    assert run(faces, out).exit_code == 0
    assert lines(out) == [
        f"{5 * i + n}\t{i}\tid{i}/{n:02d}.jpg" for i in range(4) for n in range(5)
    ]


def test_chunks_write_numbered_lists(faces, tmp_path):
    result = run(faces, tmp_path / "x.lst", "--chunks", "3")
    assert result.exit_code == 0
    assert [len(lines(tmp_path / f"x_{n}.lst")) for n in range(3)] == [6, 7, 7]
    assert lines(tmp_path / "x_0.lst")[0] == "0\t0\tid0/00.jpg"
    assert lines(tmp_path / "x_2.lst")[-1] == "19\t3\tid3/04.jpg"
    assert not (tmp_path / "x.lst").exists()
    assert (tmp_path / "x.labels.tsv").exists()
    assert f"Wrote {tmp_path / 'x_1.lst'}: 7 images.\n" in result.stderr


def test_ratios_write_train_val_test_lists(faces, tmp_path):
    result = run(
        faces,
        tmp_path / "x.lst",
        "--train-ratio",
        "0.7",
        "--val-ratio",
        "0.1",
        "--test-ratio",
        "0.2",
    )
    assert result.exit_code == 0
    assert [len(lines(tmp_path / f"x_{s}.lst")) for s in ("train", "val", "test")] == [14, 2, 4]
    assert lines(tmp_path / "x_val.lst") == ["14\t2\tid2/04.jpg", "15\t3\tid3/00.jpg"]


def test_val_ratio_alone_gives_train_the_rest(faces, tmp_path):
    assert run(faces, tmp_path / "x.lst", "--val-ratio", "0.25", "-q").exit_code == 0
    assert sorted(p.name for p in tmp_path.glob("x*")) == [
        "x.labels.tsv",
        "x_train.lst",
        "x_val.lst",
    ]
    assert len(lines(tmp_path / "x_val.lst")) == 5


def test_split_by_identity_puts_nobody_in_two_splits(tmp_path):
    face_tree(tmp_path / "faces", identities=10, per_identity=3)
    result = run(
        tmp_path / "faces",
        tmp_path / "x.lst",
        "--split-by",
        "identity",
        "--val-ratio",
        "0.2",
        "--shuffle",
        "--seed",
        "4",
        "-q",
    )
    assert result.exit_code == 0
    train = {line.split("\t")[1] for line in lines(tmp_path / "x_train.lst")}
    val = {line.split("\t")[1] for line in lines(tmp_path / "x_val.lst")}
    assert (len(train), len(val)) == (8, 2)
    assert not train & val
    indices = [
        line.split("\t")[0]
        for name in ("train", "val")
        for line in lines(tmp_path / f"x_{name}.lst")
    ]
    assert sorted(map(int, indices)) == list(range(30))


def test_min_and_max_per_id(tmp_path):
    make_tree(
        tmp_path / "faces",
        {"a": {"1.jpg": None}, "b": {f"{n}.jpg": None for n in range(4)}},
    )
    out = tmp_path / "x.lst"
    result = run(tmp_path / "faces", out, "--min-per-id", "2", "--max-per-id", "3")
    assert result.exit_code == 0
    assert lines(out) == ["0\t0\tb/0.jpg", "1\t0\tb/1.jpg", "2\t0\tb/2.jpg"]
    assert lines(tmp_path / "x.labels.tsv") == ["0\tb"]
    assert (
        "  identities with fewer images than the minimum per identity: 1 (a)\n"
        "  images beyond the maximum per identity: 1 (b/3.jpg)\n"
    ) in result.stderr


def test_unreadable_folder_is_counted(tmp_path, monkeypatch):
    make_tree(tmp_path / "faces", {"a": {"1.jpg": None}, "b": {"2.jpg": None}})
    blocked = str(tmp_path / "faces" / "b")
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == blocked:
            raise PermissionError(13, "Permission denied", blocked)
        return real(path)

    monkeypatch.setattr(listing_module.os, "scandir", scandir)
    result = run(tmp_path / "faces", tmp_path / "x.lst", "--json")
    assert result.exit_code == 0
    summary = json.loads(result.stdout)
    assert summary["skipped"]["unreadable_folder"] == 1
    assert summary["skipped_examples"]["unreadable_folder"] == ["b"]
    assert lines(tmp_path / "x.lst") == ["0\t0\ta/1.jpg"]


def test_no_images_is_an_error_naming_what_was_passed_over(tmp_path):
    make_tree(tmp_path / "faces", {"a": {"x.txt": None}})
    result = run(tmp_path / "faces", tmp_path / "x.lst")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: no images to list under {tmp_path / 'faces'} (passed over: 1 not_image, "
        "1 empty_identity); image extensions: .bmp .jpeg .jpg .png .tif .tiff .webp\n"
    )
    assert not (tmp_path / "x.lst").exists()


def test_unwritable_output_is_an_error(faces, tmp_path):
    (tmp_path / "blocked").write_text("a file where the output folder should be")
    result = run(faces, tmp_path / "blocked" / "x.lst")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {tmp_path / 'blocked'}: exists and is not a folder\n"


def test_a_missing_output_folder_is_created(faces, tmp_path):
    result = run(faces, tmp_path / "new" / "deeper" / "x.lst", "-q")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path / "new" / "deeper")) == ["x.labels.tsv", "x.lst"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "3"], "Error: --seed needs --shuffle\n"),
        (
            ["--min-per-id", "3", "--max-per-id", "2"],
            "Error: --max-per-id 2 is below --min-per-id 3\n",
        ),
        (
            ["--split-by", "identity"],
            "Error: --split-by identity needs --train-ratio, --val-ratio or --test-ratio "
            "(below 1)\n",
        ),
        (
            ["--train-ratio", "0.8", "--val-ratio", "0.3"],
            "Error: the train, val and test ratios must add up to 1: "
            "--train-ratio 0.8 + --val-ratio 0.3 = 1.1 > 1\n",
        ),
        (
            ["--val-ratio", "0.5", "--test-ratio", "0.6"],
            "Error: the train, val and test ratios must add up to 1: "
            "--val-ratio 0.5 + --test-ratio 0.6 = 1.1 > 1\n",
        ),
        (["--train-ratio", "1.5"], "'--train-ratio': 1.5 is not in the range 0<=x<=1."),
        (["--workers", "0"], "'--workers' / '-j': 0 is not in the range 1<=x<=256."),
        (["--chunks", "0"], "'--chunks': 0 is not in the range x>=1."),
        (["--split-by", "person"], "'--split-by': 'person' is not one of 'image', 'identity'."),
        (["--exts", "jpg,,png"], "'--exts': empty extension in 'jpg,,png'"),
    ],
)
def test_usage_errors_exit_2(faces, tmp_path, args, message):
    result = run(faces, tmp_path / "x.lst", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (tmp_path / "x.lst").exists()


@pytest.mark.parametrize("args", [["--chunks", "2"], ["--test-ratio", "0.1"]])
def test_stdout_takes_a_single_list(faces, args):
    result = run(faces, "-", *args)
    assert result.exit_code == 2
    assert result.stderr.endswith(
        "Error: OUT - (standard output) takes a single list: no --chunks or ratios\n"
    )
    assert result.stdout == ""


def test_root_must_be_an_existing_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    missing = run(tmp_path / "nope", tmp_path / "x.lst")
    assert missing.exit_code == 2
    assert "does not exist" in missing.stderr
    not_dir = run(tmp_path / "file", tmp_path / "x.lst")
    assert not_dir.exit_code == 2
    assert "is a file" in not_dir.stderr


def test_help_documents_the_defaults_and_the_policies():
    result = CliRunner().invoke(cli, ["list", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "--recursive / --no-recursive" in text
    assert "[default: recursive]" in text
    assert "[default: jpg,jpeg,png,bmp,webp,tif,tiff]" in text
    assert "Symbolic links are followed" in text
    assert "PREFIX.labels.tsv" in text
    assert "on stderr when OUT is -" in text
    assert "rectool list faces/ faces.lst" in text


def test_a_split_checks_only_the_files_it_writes(faces, tmp_path):
    # Issue 38: with --val-ratio, faces.lst is none of the outputs; an old one stays.
    (tmp_path / "faces.lst").write_text("an older single list\n")
    result = run(faces, tmp_path / "faces.lst", "--val-ratio", "0.1", "-q")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "faces.lst").read_text() == "an older single list\n"
    assert len(lines(tmp_path / "faces_train.lst")) + len(lines(tmp_path / "faces_val.lst")) == 20


def test_a_split_refuses_an_existing_split_list_before_walking(faces, tmp_path, monkeypatch):
    (tmp_path / "x_1.lst").write_text("old\n")
    walked = []
    real = os.scandir
    monkeypatch.setattr(listing_module.os, "scandir", lambda p=".": walked.append(p) or real(p))
    result = run(faces, tmp_path / "x.lst", "--chunks", "2")
    assert result.exit_code == 1
    refusal = f"Error: {tmp_path / 'x_1.lst'}: exists; use --overwrite to replace it\n"
    assert result.stderr == refusal
    assert [p for p in walked if os.fspath(p) != os.fspath(faces)] == []  # no identity read
    assert (tmp_path / "x_1.lst").read_text() == "old\n"
