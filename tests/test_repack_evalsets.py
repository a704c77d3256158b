"""`repack --drop-overlap lfw.bin`: an insightface verification set as the overlap target.

The training packs are written by hand (helpers/handmade_datasets.py) and the .bin files by the
standard pickler or opcode by opcode; every expected image, key and count is the test's own.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import struct
from contextlib import closing

import cv2
from click.testing import CliRunner
from helpers.handmade_datasets import write_pack
from helpers.image_files import encode, image_array, jpeg_bytes

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.packer.listfile import write_label_map
from rectool.reader import open_dataset
from rectool.repack.pipeline import RepackOptions, repack

# Eight distinct training images; identities ann (label 0), bob (1), cid (2).
TRAIN = [jpeg_bytes(100 + k, 12, 10) for k in range(8)]
LABELS = [0, 0, 0, 1, 1, 2, 2, 2]
NAMES = {0: "ann", 1: "bob", 2: "cid"}


def training_pack(tmp_path):
    prefix = tmp_path / "train"
    write_pack(
        prefix, [[(k, image, float(label)) for k, (image, label) in enumerate(zip(TRAIN, LABELS))]]
    )
    write_label_map(tmp_path / "train.labels.tsv", NAMES)
    return prefix


def eval_bin(path, images, protocol=4):
    flags = [k % 2 == 0 for k in range(len(images) // 2)]
    path.write_bytes(pickle.dumps((images, flags), protocol=protocol))
    return path


def python2_bin(path, images):
    """Write (images, flags) as Python 2's pickler does at protocol 2, opcode by opcode: each
    str image a SHORT_BINSTRING (under 256 bytes) or BINSTRING, memoized with BINPUT."""
    out = [b"\x80\x02]q\x00("]
    for n, image in enumerate(images, start=1):
        if len(image) < 256:
            out.append(b"U" + bytes([len(image)]) + image)
        else:
            out.append(b"T" + struct.pack("<i", len(image)) + image)
        out.append(b"q" + bytes([n]))
    out.append(b"e]q" + bytes([len(images) + 1]) + b"(")
    out.append(b"\x88" * (len(images) // 2))
    out.append(b"e\x86q" + bytes([len(images) + 2]) + b".")
    path.write_bytes(b"".join(out))
    return path


def kept_images(prefix):
    with closing(open_dataset(prefix)) as ds:
        return [bytes(image) for image, _ in ds]


def failures(prefix):
    with open(f"{prefix}.failures.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_images_of_a_verification_set_are_removed_and_reported_per_identity(tmp_path):
    src = training_pack(tmp_path)
    other = jpeg_bytes(999, 12, 10)
    # lfw.bin image 1 is training key 4 (bob), image 2 key 1 (ann), image 3 key 7 (cid).
    lfw = eval_bin(tmp_path / "lfw.bin", [other, TRAIN[4], TRAIN[1], TRAIN[7]])
    result = repack([src], tmp_path / "out", RepackOptions(drop_overlap=(str(lfw),)))
    assert kept_images(tmp_path / "out") == [TRAIN[k] for k in (0, 2, 3, 5, 6)]
    assert [
        (e["key"], e["identity"], e["reason"], e["detail"]) for e in failures(tmp_path / "out")
    ] == [
        (1, "ann", "overlap", f"byte-identical to image 2 (pair 1) of {lfw}"),
        (4, "bob", "overlap", f"byte-identical to image 1 (pair 0) of {lfw}"),
        (7, "cid", "overlap", f"byte-identical to image 3 (pair 1) of {lfw}"),
    ]
    report = json.loads((tmp_path / "out.report.json").read_text())
    assert report == result.report
    assert report["overlap_targets"] == [str(lfw)]
    assert report["steps"][f"overlap:{lfw}"] == 3
    assert report["removed"] == {"duplicate": 0, "overlap": 3}
    assert report["removed_per_identity"] == {
        "ann": {"duplicate": 0, "overlap": 1},
        "bob": {"duplicate": 0, "overlap": 1},
        "cid": {"duplicate": 0, "overlap": 1},
    }
    assert result.images == 5 and result.classes == 3


def test_several_verification_sets_and_a_pack_target_are_counted_each(tmp_path):
    src = training_pack(tmp_path)
    lfw = eval_bin(tmp_path / "lfw.bin", [TRAIN[0], TRAIN[5]], protocol=5)
    cfp = python2_bin(tmp_path / "cfp_fp.bin", [TRAIN[6], TRAIN[0]])  # TRAIN[0] in both
    write_pack(tmp_path / "agedb", [[(30, TRAIN[3], 0.0)]])
    targets = (str(lfw), str(cfp), str(tmp_path / "agedb"))
    result = repack([src], tmp_path / "out", RepackOptions(drop_overlap=targets))
    assert kept_images(tmp_path / "out") == [TRAIN[k] for k in (1, 2, 4, 7)]
    # Each image is removed by the first target holding it.
    assert result.report["steps"] == {
        "source_images": 8,
        f"overlap:{lfw}": 2,
        f"overlap:{cfp}": 1,
        f"overlap:{tmp_path / 'agedb'}": 1,
        "images": 4,
        "identities": 3,
    }
    assert [e["detail"] for e in failures(tmp_path / "out")] == [
        f"byte-identical to image 0 (pair 0) of {lfw}",
        f"byte-identical to key 30 of {tmp_path / 'agedb'}",
        f"byte-identical to image 1 (pair 0) of {lfw}",
        f"byte-identical to image 0 (pair 0) of {cfp}",
    ]
    assert result.report["removed_per_identity"] == {
        "ann": {"duplicate": 0, "overlap": 1},
        "bob": {"duplicate": 0, "overlap": 1},
        "cid": {"duplicate": 0, "overlap": 2},
    }


def test_python2_pickle_of_long_images_matches_by_bytes(tmp_path):
    big = [jpeg_bytes(7, 40, 32), jpeg_bytes(8, 40, 32)]
    assert min(len(image) for image in big) >= 256  # BINSTRING, not SHORT_BINSTRING
    write_pack(tmp_path / "train", [[(0, big[0], 0.0), (1, big[1], 1.0), (2, TRAIN[0], 1.0)]])
    lfw = python2_bin(tmp_path / "lfw.bin", [big[1], jpeg_bytes(9, 40, 32)])
    assert pickle.loads(lfw.read_bytes(), encoding="bytes")[0][0] == big[1]  # a valid pickle
    repack([tmp_path / "train"], tmp_path / "out", RepackOptions(drop_overlap=(str(lfw),)))
    assert kept_images(tmp_path / "out") == [big[0], TRAIN[0]]


def test_a_reencoded_copy_is_not_overlap(tmp_path):
    # Exact bytes only: the same picture at another JPEG quality is kept (no perceptual match).
    picture = image_array(5, 12, 10)
    ours = encode(picture, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 90])
    theirs = encode(picture, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 75])
    assert ours != theirs
    write_pack(tmp_path / "train", [[(0, ours, 0.0)]])
    lfw = eval_bin(tmp_path / "lfw.bin", [theirs, ours + b"\0"])  # a trailing byte differs too
    result = repack([tmp_path / "train"], tmp_path / "out", RepackOptions(drop_overlap=(str(lfw),)))
    assert kept_images(tmp_path / "out") == [ours]
    assert result.report["removed"]["overlap"] == 0


class _System:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_malicious_bin_is_refused_before_anything_is_written(tmp_path):
    src = training_pack(tmp_path)
    marker = tmp_path / "ran"
    evil = tmp_path / "lfw.bin"
    evil.write_bytes(pickle.dumps(([_System(f"touch {shlex.quote(str(marker))}")], []), 2))
    try:
        repack([src], tmp_path / "out" / "train", RepackOptions(drop_overlap=(str(evil),)))
    except RectoolError as exc:
        assert str(exc).startswith(f"{evil}: not an insightface verification set: ")
        assert "refused global posix.system" in str(exc)
    else:
        raise AssertionError("the malicious .bin was read")
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_cli_drop_overlap_with_a_bin_names_it_in_the_summary(tmp_path):
    src = training_pack(tmp_path)
    lfw = eval_bin(tmp_path / "lfw.bin", [TRAIN[2], TRAIN[3]])
    result = run("repack", src, tmp_path / "out", "--drop-overlap", lfw, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["steps"][f"overlap:{lfw}"] == 2
    assert summary["removed"] == {"duplicate": 0, "overlap": 2}
    result = run("repack", src, tmp_path / "out2", "--drop-overlap", lfw)
    assert result.exit_code == 0, result.output
    assert f"removed: overlap:{lfw} 2." in result.output
    assert "overlap removed 2 " in result.output


def test_cli_refuses_a_bin_that_is_not_a_verification_set(tmp_path):
    src = training_pack(tmp_path)
    bad = tmp_path / "cfp_fp.bin"
    bad.write_bytes(pickle.dumps({"bins": []}, protocol=4))
    result = run("repack", src, tmp_path / "out", "--drop-overlap", bad)
    assert result.exit_code == 2  # an unusable input, as a missing one
    assert result.output.startswith(f"Error: {bad}: not an insightface verification set: ")
    result = run("repack", src, tmp_path / "out", "--drop-overlap", tmp_path / "agedb_30.bin")
    assert result.exit_code == 2  # an unusable input
    assert result.output == f"Error: {tmp_path / 'agedb_30.bin'}: verification set not found\n"
    assert not (tmp_path / "out.rec").exists()


def test_a_missing_pack_target_is_named_as_a_target(tmp_path):
    src = training_pack(tmp_path)
    result = run("repack", src, tmp_path / "out", "--drop-overlap", tmp_path / "lfw")
    assert result.exit_code == 2  # an unusable input
    assert result.output.startswith(f"Error: --drop-overlap {tmp_path / 'lfw'}: ")
