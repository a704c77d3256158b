"""Issue 36: an eval `.bin` is bounded where it enters (`repack/evalsets.py`).

A pickle stores an object once and refers to it again by a memo reference: a 4 MB file can name
one 4 MB image 8,000 times (31 GB to hash, image by image). Each object the file stores is
hashed once; a set whose images add up to more than `MAX_IMAGE_BYTES` at every reference is
refused, and an unusable `.bin` exits 2, as the exit-code table says for unusable inputs.
"""

from __future__ import annotations

import json
import pickle

from click.testing import CliRunner
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes

from rectool.cli import cli
from rectool.errors import InputError
from rectool.repack import evalsets
from rectool.repack.evalsets import read_eval_set

TRAIN = [jpeg_bytes(100 + k, 12, 10) for k in range(4)]


def training_pack(tmp_path):
    prefix = tmp_path / "train"
    write_pack(prefix, [[(k, image, float(k % 2)) for k, image in enumerate(TRAIN)]])
    return prefix


def repeated_bin(path, image, times):
    """Write a .bin whose `times` images are one object: the pickler stores it once."""
    images = [image] * times
    path.write_bytes(pickle.dumps((images, [True] * (times // 2)), protocol=4))
    return path


def test_one_image_referenced_8000_times_is_refused_over_the_budget(tmp_path):
    image = b"\xff\xd8\xff\xe0" + bytes(4 << 20)
    path = repeated_bin(tmp_path / "lfw.bin", image, 8000)
    assert path.stat().st_size < 5 << 20  # stored once: a 4 MB file
    result = CliRunner().invoke(
        cli,
        [
            "repack",
            str(training_pack(tmp_path)),
            str(tmp_path / "out"),
            "--drop-overlap",
            str(path),
            "--json",
        ],
    )
    assert result.exit_code == 2, result.output
    error = json.loads(result.output)["error"]
    assert error.startswith(f"{path}: not an insightface verification set: its 8,000 images ")
    assert f"over the {evalsets.MAX_IMAGE_BYTES:,} a set may have" in error
    assert f"the file stores {len(image):,} bytes of images" in error
    assert not (tmp_path / "out.rec").exists()


def test_each_object_the_file_stores_is_used_once(tmp_path):
    a, b = TRAIN[0], TRAIN[1]
    images = [a, b] + [a] * 500 + [b, b]  # two objects, 504 references
    path = tmp_path / "agedb_30.bin"
    path.write_bytes(pickle.dumps((images, [False] * 252), protocol=4))
    objects, which = read_eval_set(path).distinct()
    assert objects == [a, b]
    assert which.tolist() == [0, 1] + [0] * 500 + [1, 1]


def test_a_repeated_image_still_overlaps_at_every_reference(tmp_path):
    path = repeated_bin(tmp_path / "lfw.bin", TRAIN[2], 1000)
    result = CliRunner().invoke(
        cli,
        [
            "repack",
            str(training_pack(tmp_path)),
            str(tmp_path / "out"),
            "--drop-overlap",
            str(path),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["removed"] == {"duplicate": 0, "overlap": 1}


def test_an_unusable_bin_is_an_input_error_exit_2(tmp_path):
    bad = tmp_path / "cfp_fp.bin"
    bad.write_bytes(pickle.dumps({"bins": []}, protocol=4))
    try:
        read_eval_set(bad)
    except InputError as exc:
        assert str(exc).startswith(f"{bad}: not an insightface verification set: ")
    else:
        raise AssertionError("read")
    result = CliRunner().invoke(
        cli,
        ["repack", str(training_pack(tmp_path)), str(tmp_path / "out"), "--drop-overlap", str(bad)],
    )
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: {bad}: not an insightface verification set: ")
