"""The default verify runs pack's structural image check (issue 21): an im2rec-style pack with
a truncated JPEG and an empty record names both, each with its kind, key, byte offset and
pack's reason. Offsets come from the hand-written .rec (helpers/rec_files.py)."""

from __future__ import annotations

import json

from click.testing import CliRunner
from helpers.handmade_datasets import write_insightface
from helpers.image_files import encode, image_array, jpeg_bytes
from helpers.rec_files import image_payload, write_records

from rectool.cli import cli
from rectool.inspect.verify import verify_dataset
from rectool.packer.images import ImageRefused, check_image


def damaged_pack(tmp_path):
    """An im2rec-style .rec/.idx (no manifest): good JPEGs, a cut one, an empty record, a
    PNG and a PNG with a damaged CRC. Returns (rec, offsets, cut, broken png)."""
    good = jpeg_bytes(1, 32, 32)
    cut = good[: len(good) * 2 // 3]  # inside the scan: the end-of-image marker is gone
    png = encode(image_array(2, 16, 16), ".png")
    bad_png = bytearray(png)
    bad_png[40] ^= 0xFF  # inside a chunk: its CRC no longer matches
    rec, idx = tmp_path / "faces.rec", tmp_path / "faces.idx"
    offsets = write_records(
        rec,
        idx,
        [
            (0, image_payload(good, 0.0, 0)),
            (1, image_payload(cut, 0.0, 1)),
            (2, image_payload(b"", 1.0, 2)),
            (3, image_payload(png, 1.0, 3)),
            (4, image_payload(bytes(bad_png), 1.0, 4)),
            (5, image_payload(jpeg_bytes(5, 32, 32), 2.0, 5)),
        ],
    )
    return rec, offsets, cut, bytes(bad_png)


def reason(data):
    try:
        check_image(data, "structure")
    except ImageRefused as refusal:
        return refusal.reason
    raise AssertionError("pack's check passes it")


def test_default_verify_names_the_truncated_jpeg_and_the_empty_record(tmp_path):
    rec, offsets, cut, bad_png = damaged_pack(tmp_path)
    report = verify_dataset(rec)
    assert [(p.kind, p.path, p.key, p.offset) for p in report.problems] == [
        ("empty-image", str(rec), 2, offsets[2]),
        ("image-damaged", str(rec), 1, offsets[1]),
        ("image-damaged", str(rec), 4, offsets[4]),
    ]
    damaged = [p for p in report.problems if p.kind == "image-damaged"]
    assert damaged[0].message == reason(cut) == "truncated JPEG (no end-of-image marker)"
    assert damaged[1].message == reason(bad_png)
    assert damaged[1].message.startswith("corrupt PNG (CRC mismatch")
    assert report.counts["image-damaged"] == 2 and not report.sound


def test_cli_verify_exits_1_and_names_kind_key_offset_reason(tmp_path):
    rec, offsets, _, _ = damaged_pack(tmp_path)
    result = CliRunner().invoke(cli, ["verify", str(rec), "--json"])
    assert result.exit_code == 1, result.output
    problems = json.loads(result.output)["problems"]
    assert {
        "kind": "image-damaged",
        "path": str(rec),
        "key": 1,
        "offset": offsets[1],
        "message": "truncated JPEG (no end-of-image marker)",
    } in problems
    assert any(p["kind"] == "empty-image" and p["key"] == 2 for p in problems)
    human = CliRunner().invoke(cli, ["verify", str(rec)])
    assert human.exit_code == 1
    assert (
        f"image-damaged: {rec}, key 1, byte offset {offsets[1]}: "
        "truncated JPEG (no end-of-image marker)" in human.output
    )


def test_no_image_check_skips_it(tmp_path):
    rec, offsets, _, _ = damaged_pack(tmp_path)
    result = CliRunner().invoke(cli, ["verify", str(rec), "--no-image-check", "--json"])
    assert result.exit_code == 1
    kinds = [p["kind"] for p in json.loads(result.output)["problems"]]
    assert kinds == ["empty-image"]
    report = verify_dataset(rec, image_check=False)
    assert report.counts == {"empty-image": 1}
    assert verify_dataset(rec).counts["image-damaged"] == 2


def test_insightface_header_and_identities_are_not_checked_as_images(tmp_path):
    good = jpeg_bytes(7, 24, 24)
    cut = good[: len(good) // 2 + 40]

    def images(n):
        return cut if n == 3 else jpeg_bytes(n, 24, 24)

    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    samples, _ = write_insightface(rec, idx, [2, 3], images)
    report = verify_dataset(rec)
    assert report.layouts == ["insightface"]
    damaged = [s for s in samples if s.key == 3][0]
    assert [(p.kind, p.key, p.offset, p.message) for p in report.problems] == [
        ("image-damaged", 3, damaged.offset, reason(cut)),
    ]
