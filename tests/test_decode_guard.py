"""One decode guard for every command: an image's size is read from its header and refused
over --max-pixels before any decoder allocates, with a named error, never `cv2.error`.

The crafted images (helpers/oversized_images.py) are a few hundred bytes that declare up to
65000x65000 pixels. Every command that decodes meets them: pack (--check structure and decode,
--resize), repack --resize, verify --decode, info, report. The reader and the loaders are
tested in test_decode_guard_reader.py (which also runs against the emitted copies).
"""

from __future__ import annotations

import ast
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
import simplejpeg
from click.testing import CliRunner
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes, write_list
from helpers.oversized_images import OVERSIZED, cut_jpeg, oversized_jpeg, oversized_png

from rectool.cli import cli
from rectool.inspect.info import dataset_info
from rectool.packer.images import (
    ImageRefused,
    ImageTooLarge,
    Transform,
    check_image,
    decode_for_transform,
    inspect_image,
    reencode_image,
)
from rectool.reader import open_dataset
from rectool.report.data import ReportOptions, build_report

PACKAGE = Path(__file__).resolve().parents[1] / "rectool"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def no_decoders(monkeypatch):
    """Make OpenCV's and simplejpeg's decoders fail the test if anything calls them."""

    def called(*args, **kwargs):
        raise AssertionError("a decoder was called")

    monkeypatch.setattr(cv2, "imdecode", called)
    monkeypatch.setattr(simplejpeg, "decode_jpeg", called)


# --- the one door: no decoder is called outside the guard ------------------------------------

# The functions allowed to call a decoder, each after the guard (`admit_image` or `admit`).
# recordio.py decodes as MXNet does (a cut image too), so it has its own door, after the same
# guard (`admit_image(..., whole=False)`).
DOORS = {
    ("reader.py", "decode_image"),
    ("packer/images.py", "_simplejpeg_decode"),
    ("recordio.py", "_decode"),
}
DECODERS = {"imdecode", "imread", "imreadmulti", "imreadanimation", "decode_jpeg", "imcount"}
GUARDS = {"admit_image", "admit"}


def is_decoder(call):
    """Whether `call` calls a decoder itself: `cv2.imdecode(...)`, `simplejpeg.decode_jpeg(...)`,
    not the reader's guarded `imdecode` (called by name, or as `reader.imdecode`)."""
    func = call.func
    if isinstance(func, ast.Attribute):
        by_reader = isinstance(func.value, ast.Name) and func.value.id == "reader"
        return func.attr in DECODERS and not (func.attr == "imdecode" and by_reader)
    return isinstance(func, ast.Name) and func.id in DECODERS - {"imdecode"}


def decoder_calls():
    """Yield (file, function, line, guarded) for every call of a decoder in rectool/."""
    for path in sorted(PACKAGE.glob("**/*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
            guards = [c.lineno for c in calls if getattr(c.func, "id", None) in GUARDS]
            for call in filter(is_decoder, calls):
                guarded = any(line < call.lineno for line in guards)
                yield path.relative_to(PACKAGE).as_posix(), function.name, call.lineno, guarded


def test_only_the_guard_calls_a_decoder():
    calls = list(decoder_calls())
    outside = [c for c in calls if c[:2] not in DOORS]
    assert outside == [], f"a decoder called outside the guard: {outside}"
    assert {c[:2] for c in calls} == DOORS
    unguarded = [c for c in calls if not c[3]]
    assert unguarded == [], f"a decoder called before the guard: {unguarded}"


def test_the_door_test_sees_a_decoder_outside_the_guard():
    for source in (
        "def f(x):\n    return cv2.imdecode(x, 1)\n",
        "def f(x):\n    return simplejpeg.decode_jpeg(x)\n",
    ):
        calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
        assert [is_decoder(c) for c in calls] == [True]
    calls = [n for n in ast.walk(ast.parse("reader.imdecode(x, 1)")) if isinstance(n, ast.Call)]
    assert not is_decoder(calls[0])


# --- the package's decoders: pack's checks, re-encoding, verify's inspection ------------------


@pytest.mark.parametrize("name", sorted(OVERSIZED))
def test_packs_checks_refuse_before_decoding(name, no_decoders):
    data = OVERSIZED[name]()
    for call in (
        lambda: check_image(data, "structure"),
        lambda: check_image(data, "decode"),
        lambda: inspect_image(data),
        lambda: decode_for_transform(data, Transform(resize=16)),
        lambda: reencode_image(data, Transform(resize=16, color=0)),
        lambda: reencode_image(data, Transform(color=-1, encoding=".png", quality=3)),
    ):
        with pytest.raises(ImageTooLarge, match=r"declares \d+x\d+ pixels") as caught:
            call()
        assert isinstance(caught.value, ImageRefused)


def test_packs_budget_is_an_argument():
    data = jpeg_bytes(1, 40, 32)
    with pytest.raises(ImageTooLarge):
        check_image(data, "decode", max_pixels=1279)
    assert check_image(data, "decode", max_pixels=1280) == "jpeg"
    assert inspect_image(data, max_pixels=1280) == (40, 32, 3)


# --- every command -------------------------------------------------------------------------


@pytest.fixture
def crafted_tree(tmp_path):
    """A tree of 4 good JPEGs and 3 crafted ones (65000^2 JPEG, 30000^2 PNG, 12000^2 JPEG),
    listed in faces.lst."""
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    files = {f"a/{n}.jpg": jpeg_bytes(n, 40, 32) for n in range(4)}
    files.update(
        {
            "a/huge.jpg": oversized_jpeg(),
            "a/huge.png": oversized_png(),
            "a/big.jpg": oversized_jpeg(12000, 12000),
        }
    )
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    items = [(i, 0, rel) for i, rel in enumerate(files)]
    return root, write_list(tmp_path / "faces.lst", items)


CRAFTED = {"a/huge.jpg": "65000x65000", "a/huge.png": "30000x30000", "a/big.jpg": "12000x12000"}


def failures(prefix):
    lines = Path(f"{prefix}.failures.jsonl").read_text(encoding="utf-8").splitlines()
    return {entry["path"]: entry["reason"] for entry in map(json.loads, lines)}


@pytest.mark.parametrize(
    "options",
    [[], ["--check", "decode"], ["--resize", "16"], ["--color", "0", "--encoding", ".png"]],
    ids=["structure", "decode", "resize", "png"],
)
def test_pack_refuses_the_crafted_images_naming_them(crafted_tree, tmp_path, options):
    root, lst = crafted_tree
    result = invoke("pack", lst, root, tmp_path / "out" / "p", "-q", *options)
    assert result.exit_code == 3, result.output
    refused = failures(tmp_path / "out" / "p")
    assert sorted(refused) == sorted(CRAFTED)
    for path, size in CRAFTED.items():
        assert f"declares {size} pixels" in refused[path]
        assert "--max-pixels" in refused[path]
    assert len(open_dataset(tmp_path / "out" / "p")) == 4


def test_pack_max_pixels_moves_the_limit(tmp_path, small_tree):
    out = tmp_path / "out"
    result = invoke(
        "pack", small_tree.list_path, small_tree.root, out / "a", "--max-pixels", "1279"
    )
    assert result.exit_code == 3  # every 40x32 image is over 1,279 pixels
    assert len(failures(out / "a")) == len(small_tree.items)
    result = invoke(
        "pack", small_tree.list_path, small_tree.root, out / "b", "--max-pixels", "1.28k"
    )
    assert result.exit_code == 0, result.output
    assert "max_pixels" not in json.loads(Path(f"{out / 'b'}.manifest.json").read_text())["options"]


@pytest.mark.parametrize("value", ["0", "-5", "abc", "inf", "1e400", "5T"])
def test_max_pixels_must_be_a_pixel_count(tmp_path, small_tree, value):
    result = invoke(
        "pack", small_tree.list_path, small_tree.root, tmp_path / "p", "--max-pixels", value
    )
    assert result.exit_code == 2
    assert "--max-pixels" in result.output


@pytest.fixture
def crafted_pack(tmp_path):
    """A pack written by hand: JPEGs of 40x32 at keys 0, 1, 4; crafted images at 2, 3, 5."""
    items = [(k, jpeg_bytes(k, 40, 32), float(k)) for k in range(6)]
    items[2] = (2, oversized_jpeg(), 2.0)
    items[3] = (3, oversized_png(), 3.0)
    items[5] = (5, oversized_jpeg(12000, 12000), 5.0)
    samples = write_pack(tmp_path / "crafted", [items], index=True)
    return tmp_path / "crafted", samples


def test_verify_decode_names_each_oversized_image(crafted_pack):
    prefix, samples = crafted_pack
    result = invoke("verify", prefix, "--decode", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["counts"] == {"image-too-large": 3}
    found = sorted((p["key"], p["offset"]) for p in report["problems"])
    assert found == [(k, samples[k].offset) for k in (2, 3, 5)]
    assert all("declares" in p["message"] for p in report["problems"])
    result = invoke("verify", prefix, "--decode", "--json", "--max-pixels", "1279")
    assert json.loads(result.stdout)["counts"] == {"image-too-large": 6}


def test_info_counts_oversized_images_without_decoding_them(crafted_pack, no_decoders):
    info = dataset_info(crafted_pack[0], max_pixels=1279)
    assert info["dimensions"]["too_large"] == 6
    assert info["dimensions"]["counts"] == {"too large": 6}


def test_info_decodes_the_rest(crafted_pack):
    dims = dataset_info(crafted_pack[0])["dimensions"]
    assert dims["counts"] == {"40x32x3": 3, "too large": 3}
    result = invoke("info", crafted_pack[0])
    assert result.exit_code == 0, result.output
    assert "too large 3" in result.output
    assert "Traceback" not in result.output and "cv2.error" not in result.output


def test_report_shows_no_thumbnail_of_an_oversized_image(crafted_pack, tmp_path):
    report = build_report(crafted_pack[0], ReportOptions(seed=0, verify=True, decode=True))
    assert report.info["dimensions"]["too_large"] == 3
    assert report.verify.counts == {"image-too-large": 3}
    thumbs = [t for row in report.rows for t in row.thumbs]
    problems = {t.problem for t in thumbs if t.jpeg is None}
    assert problems == {"not decoded: more pixels than --max-pixels"}
    assert sum(t.jpeg is not None for t in thumbs) >= 1
    result = invoke("report", crafted_pack[0], "-o", tmp_path / "r.html", "--max-pixels", "1G")
    assert result.exit_code == 0, result.output  # 65000^2 is over OpenCV's own limit: named too


def test_repack_resize_refuses_oversized_images(crafted_pack, tmp_path):
    result = invoke("repack", crafted_pack[0], tmp_path / "re", "--resize", "16", "-q")
    assert result.exit_code == 3, result.output
    reasons = [json.loads(line)["reason"] for line in open(f"{tmp_path / 're'}.failures.jsonl")]
    assert len(reasons) == 3 and all("declares" in r for r in reasons)


def test_a_cut_jpeg_is_refused_by_every_check(tmp_path):
    cut = cut_jpeg(jpeg_bytes(1, 112, 112))
    for mode in ("structure", "decode"):
        with pytest.raises(ImageRefused, match="truncated JPEG"):
            check_image(cut, mode)


# --- memory: under an address-space limit smaller than one crafted image ----------------------

# A child process limited to 1.5 GB of address space (what a 30000x30000 RGB image alone
# would need twice over). Without the guard OpenCV allocates the declared size: it fails
# (cv2.error, MemoryError) or dies. Every command must finish, naming the images.
LIMIT = 1536 << 20


def limited(*args, env=None):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    environment["MALLOC_ARENA_MAX"] = "2"  # glibc reserves 64 MB of address space per arena
    return subprocess.run(
        [sys.executable, *args],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=300,
        env={**environment, **(env or {})},
        cwd=Path(__file__).resolve().parents[1],
    )


@pytest.fixture
def hungry_pack(tmp_path):
    """Keys 0, 1: JPEGs of 40x32; 2: a JPEG and 3: a PNG declaring 30000x30000 (900 Mpx,
    under OpenCV's own limit of 2**30 pixels)."""
    items = [(k, jpeg_bytes(k, 40, 32), float(k)) for k in range(4)]
    items[2] = (2, oversized_jpeg(30000, 30000), 2.0)
    items[3] = (3, oversized_png(30000, 30000), 3.0)
    write_pack(tmp_path / "hungry", [items], index=True)
    return tmp_path / "hungry"


LIBRARY_UNDER_LIMIT = """
import sys
from rectool.reader import ImageTooLargeError, open_dataset
from rectool.training import BatchDecoder, Loader

prefix = sys.argv[1]
ds = open_dataset(prefix, decode="rgb")
for i in (2, 3):
    try:
        ds[i]
    except ImageTooLargeError as exc:
        print("refused", exc.key)
for size in (None, (16, 16)):
    with Loader(open_dataset(prefix), 2, workers=2, shuffle=False, on_error="skip", size=size,
                start_method="fork") as loader:
        print("loader", [label for _, batch in loader for label in batch.tolist()])
images, labels = BatchDecoder(open_dataset(prefix), size=(16, 16), on_error="skip")[[0, 1, 2, 3]]
print("batch", labels.tolist())
"""


def test_the_reader_and_loaders_stay_under_the_limit(hungry_pack):
    run = limited("-c", LIBRARY_UNDER_LIMIT, str(hungry_pack))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == [
        "refused 2",
        "refused 3",
        "loader [0, 1]",
        "loader [0, 1]",
        "batch [0, 1]",
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["verify", "{pack}", "--decode", "-j", "2", "--json"],
        ["info", "{pack}", "--json"],
        ["report", "{pack}", "-o", "{tmp}/r.html", "--verify", "--decode", "--json"],
        ["pack", "{lst}", "{root}", "{tmp}/p1", "--check", "decode", "-j", "2", "--json"],
        ["pack", "{lst}", "{root}", "{tmp}/p2", "--resize", "16", "-j", "2", "--json"],
        ["repack", "{pack}", "{tmp}/p3", "--resize", "16", "-j", "2", "--json"],
    ],
    ids=lambda c: " ".join(c[:1] + c[2:][-3:-1]),
)
def test_every_command_stays_under_the_limit(hungry_pack, tmp_path, command):
    root = tmp_path / "tree"
    root.mkdir()
    for name, data in [
        ("0.jpg", jpeg_bytes(0, 40, 32)),
        ("j.jpg", oversized_jpeg(30000, 30000)),
        ("p.png", oversized_png(30000, 30000)),
    ]:
        (root / name).write_bytes(data)
    lst = write_list(tmp_path / "t.lst", [(0, 0, "0.jpg"), (1, 0, "j.jpg"), (2, 0, "p.png")])
    fields = {"pack": hungry_pack, "tmp": tmp_path, "lst": lst, "root": root}
    run = limited("-m", "rectool", *[part.format(**fields) for part in command])
    assert run.returncode in (0, 1, 3), run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "MemoryError" not in run.stderr
    document = json.loads(run.stdout)
    text = json.dumps(document)
    assert "error" not in document or "refused" in document["error"], document
    if command[0] in ("verify", "report"):
        assert "cannot be decoded" not in text
    if command[0] == "verify":
        assert document["counts"] == {"image-too-large": 2}
    if command[0] in ("pack", "repack"):
        assert document["exit"] == 3
        failed = Path(document["failures_file"]).read_text(encoding="utf-8").splitlines()
        reasons = [json.loads(line)["reason"] for line in failed]
        assert len(reasons) == 2 and all("declares 30000x30000" in r for r in reasons)
