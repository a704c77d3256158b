"""`info` and `report` on a dataset with a damaged record: everything else is described, the
damage is named (file, key, byte offset) with "run `rectool verify`", and the exit is 1."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import image_record, write_shard
from helpers.image_files import jpeg_bytes
from helpers.rec_files import make_pack
from test_report import parse

from rectool.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


# Each case: (target, key, offset, reason, records, images `report` counts, images `info`
# counts). A pack with a binary index lists every sample there: `info` and `report` count them
# all (issue 37: both answer from the index); from the headers, a record that cannot be read
# is left out.


def empty_image(tmp_path):
    """An im2rec-style pass-through shard of 6 images, the fourth a zero-byte image."""
    records = [
        (k, image_record(b"" if k == 3 else jpeg_bytes(k, 16, 12), float(k % 2))) for k in range(6)
    ]
    offsets = write_shard(tmp_path / "e.rec", tmp_path / "e.idx", records)
    return tmp_path / "e.rec", 3, offsets[3], "empty image", 6, 6, 6  # still an image


def bad_magic(tmp_path, keep_index=True):
    """A 12-image pack whose fourth record (in the middle) has a bad magic."""
    pack = make_pack(tmp_path)
    key, offset = pack.lines[3]
    data = bytearray(pack.rec.read_bytes())
    data[offset] ^= 1
    pack.rec.write_bytes(bytes(data))
    if not keep_index:  # the .rec alone: no .idx, no manifest, no binary index
        pack.idx.unlink()
        pack.manifest.unlink()
        return pack.rec, None, offset, "bad magic", 12, 11, 11
    return pack.manifest, key, offset, "bad magic", 12, 12, 12


CASES = {
    "empty-image": empty_image,
    "bad-magic": bad_magic,
    "bad-magic-no-idx": lambda p: bad_magic(p, keep_index=False),
}


@pytest.fixture(params=list(CASES))
def damaged(request, tmp_path):
    return CASES[request.param](tmp_path)


def test_info_describes_the_rest_and_names_the_damage(damaged):
    target, key, offset, reason, records, _, images = damaged
    result = invoke("info", target)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert f"{records:,} records, {images:,} images" in result.stdout.splitlines()[0]
    where = ("" if key is None else f"key {key}, ") + f"byte offset {offset}: {reason}"
    assert where in result.stdout
    assert "Damage: 1 record cannot be read" in result.stdout
    assert "run `rectool verify" in result.stdout
    assert result.stderr.startswith("Error: 1 damaged record left out; run `rectool verify")


def test_info_json_has_a_damage_field(damaged):
    target, key, offset, reason, records, _, images = damaged
    result = invoke("info", target, "--json")
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert (document["records"], document["images"]) == (records, images)
    damage = document["damage"]
    assert damage["records"] == 1
    assert (damage["first"][0]["key"], damage["first"][0]["offset"]) == (key, offset)
    assert reason in damage["first"][0]["reason"]
    assert "rectool verify" in damage["advice"]


def test_a_sound_dataset_has_no_damage(tmp_path):
    pack = make_pack(tmp_path)
    result = invoke("info", pack.manifest, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["damage"] is None


def test_report_writes_the_page_and_names_the_damage(damaged, tmp_path):
    target, key, offset, reason, records, images, _ = damaged
    out = tmp_path / "r.html"
    result = invoke("report", target, "-o", out)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "run `rectool verify" in result.stderr
    html = parse(out.read_text(encoding="utf-8"))
    summary = html.summary()
    assert (summary["Records"], summary["Images"], summary["Damaged records"]) == (
        records,
        images,
        1,
    )
    rows = html.rows("damage-list")
    assert rows[1][1:3] == ["" if key is None else str(key), f"{offset:,}"]
    assert reason in rows[1][3]
    assert "run `rectool verify" in "".join(html.text)
    sheet = [a for s, a in html.images if s == "contact-sheet"]
    assert sheet  # the readable images are still shown


def test_report_json_has_a_damage_field(damaged, tmp_path):
    target, key, offset, *_ = damaged
    result = invoke("report", target, "-o", tmp_path / "r.html", "--json")
    assert result.exit_code == 1, result.output
    damage = json.loads(result.stdout)["damage"]
    assert (damage["records"], damage["first"][0]["offset"]) == (1, offset)


def test_nothing_readable_is_still_an_error(tmp_path):
    (tmp_path / "x.rec").write_bytes(b"\x01" * 64)
    result = invoke("info", tmp_path / "x.rec")
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {tmp_path / 'x.rec'}, byte offset 0: ")
    assert "rectool verify" in result.output
