"""repack checks the records it copies as pack checks images (issue 21): an im2rec-style pack
with a truncated JPEG and an empty record is repacked without them, each refused with pack's
reason in the failures file, counted, and exit 3 unless --max-failures allows them."""

from __future__ import annotations

import json
from contextlib import closing

from click.testing import CliRunner
from helpers.handmade_datasets import write_insightface
from helpers.image_files import jpeg_bytes
from helpers.rec_files import image_payload, write_records

from rectool.cli import cli
from rectool.dataset.packs import open_dataset
from rectool.inspect.verify import verify_dataset
from rectool.repack.pipeline import RepackOptions, repack

CUT_REASON = "truncated JPEG (no end-of-image marker)"


def im2rec_pack(tmp_path):
    """Six records as im2rec writes them (no manifest): two identities, a cut JPEG (key 1)
    and an empty record (key 3). Returns (rec, the good images with their labels)."""
    images = [jpeg_bytes(n, 32, 32) for n in range(6)]
    images[1] = images[1][: len(images[1]) * 2 // 3]
    images[3] = b""
    labels = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    rec, idx = tmp_path / "im2rec.rec", tmp_path / "im2rec.idx"
    write_records(rec, idx, [(k, image_payload(images[k], labels[k], k)) for k in range(6)])
    good = [(images[k], labels[k]) for k in (0, 2, 4, 5)]
    return rec, good


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def failures(prefix):
    with open(f"{prefix}.failures.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_repack_refuses_the_truncated_and_the_empty_image_exit_3(tmp_path):
    rec, good = im2rec_pack(tmp_path)
    out = tmp_path / "out" / "faces"
    result = run("repack", rec, out)
    assert result.exit_code == 3, result.output
    assert result.output.startswith("Repacked 4 images of 2 identities")
    assert f"2 images refused: damaged, or failed to re-encode ({out}.failures.jsonl)." in (
        result.output
    )
    assert "More than --max-failures 0 refused: exit status 3." in result.output
    lines = failures(out)
    assert [(e["key"], e["stage"], e["position"], e["reason"]) for e in lines] == [
        (1, "write", 1, CUT_REASON),
        (3, "write", 3, "empty file"),
    ]
    assert all(e["source"] == str(rec) for e in lines)
    report = verify_dataset(str(out))
    assert report.sound, [str(p) for p in report.problems]
    with closing(open_dataset(out)) as ds:
        assert [(bytes(image), float(label)) for image, label in ds] == good


def test_max_failures_allows_the_refusals(tmp_path):
    rec, good = im2rec_pack(tmp_path)
    out = tmp_path / "ok"
    result = run("repack", rec, out, "--max-failures", "2", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["images"] == 4 and summary["refused"] == 2 and summary["accepted"]
    assert [e["reason"] for e in failures(out)] == [CUT_REASON, "empty file"]
    assert verify_dataset(str(out)).sound
    with closing(open_dataset(out)) as ds:
        assert len(ds) == 4


def test_api_counts_refusals_against_max_failures(tmp_path):
    rec, _ = im2rec_pack(tmp_path)
    result = repack([str(rec)], str(tmp_path / "api"), RepackOptions(max_failures=1))
    assert result.report["refused"] == 2 and result.images == 4
    assert not result.accepted


def test_progress_counts_the_refusals_as_they_come(tmp_path, monkeypatch):
    """progress(done, total, refused) is told the refusals so far: counted as they come (a
    sum over every position for each report made a 10M-record repack quadratic)."""
    from rectool.repack import run

    monkeypatch.setattr(run, "BATCH_RECORDS", 2)  # a report every two records
    rec, _ = im2rec_pack(tmp_path)
    calls = []
    repack(
        [str(rec)],
        str(tmp_path / "p"),
        RepackOptions(max_failures=5),
        progress=lambda done, total, refused: calls.append((done, total, refused)),
    )
    assert calls[0] == (0, 6, 0) and calls[-1][1:] == (6, 2)
    assert [r for _, _, r in calls] == sorted(r for _, _, r in calls)  # never counted back
    assert len({r for _, _, r in calls}) > 1  # reported while the refusals came in


def test_insightface_source_refuses_the_cut_image_and_stays_a_sound_layout(tmp_path):
    def images(n):
        data = jpeg_bytes(n, 24, 24)
        return data[: len(data) // 2 + 40] if n == 2 else data

    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    write_insightface(rec, idx, [2, 3], images)
    out = tmp_path / "o" / "train"
    result = run("repack", rec, out, "--layout", "insightface", "--max-failures", "1")
    assert result.exit_code == 0, result.output
    (line,) = failures(out)
    assert (line["key"], line["stage"], line["position"]) == (2, "write", 1)
    assert line["reason"].startswith("truncated JPEG")
    report = verify_dataset(str(out))
    assert report.sound and report.layouts == ["insightface"], [str(p) for p in report.problems]
    with closing(open_dataset(out)) as ds:
        assert len(ds) == 4
        assert ds.identity_ranges.tolist() == [[0, 1], [1, 4]]


def test_repack_refuses_a_payload_that_is_no_image_as_pack_does(tmp_path):
    """im2rec --pass-through packs any file; `pack` refuses one with no image signature, and so
    does repack (it copied it, and `verify` then called the repack's record "not-an-image")."""
    images = [jpeg_bytes(n, 32, 32) for n in range(3)]
    images[1] = b"hello, not an image"
    rec, idx = tmp_path / "im2rec.rec", tmp_path / "im2rec.idx"
    write_records(rec, idx, [(k, image_payload(images[k], 0.0, k)) for k in range(3)])
    out = tmp_path / "out" / "faces"
    result = run("repack", rec, out, "--max-failures", "1")
    assert result.exit_code == 0, result.output
    assert [(e["key"], e["reason"]) for e in failures(out)] == [
        (1, "not an image (unknown file signature)")
    ]
    assert verify_dataset(str(out)).sound
    with closing(open_dataset(out)) as ds:
        assert [bytes(image) for image, _ in ds] == [images[0], images[2]]


def test_check_none_carries_every_record(tmp_path):
    images = [jpeg_bytes(0, 32, 32), b"hello, not an image", b""]
    rec, idx = tmp_path / "im2rec.rec", tmp_path / "im2rec.idx"
    write_records(rec, idx, [(k, image_payload(images[k], 0.0, k)) for k in range(3)])
    out = tmp_path / "out" / "faces"
    result = run("repack", rec, out, "--check", "none")
    assert result.exit_code == 0, result.output
    with closing(open_dataset(out)) as ds:
        assert [bytes(image) for image, _ in ds] == images
