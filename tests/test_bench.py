"""`rectool bench`: what it measures and how it reports it."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool.cli import cli
from rectool.inspect.bench import bench_dataset
from rectool.packer.packing import pack_images


@pytest.fixture
def packed(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a", "b", "c"], 4, height=24, width=20)
    pack_images(write_list(tmp_path / "f.lst", items), root, tmp_path / "f")
    return tmp_path / "f.manifest.json", root, items


def test_phases_count_every_sample_and_byte(packed):
    manifest, root, items = packed
    report = bench_dataset(manifest, samples=100, seconds=30, workers=2)
    assert report.samples == 12 and report.layout == "images"
    names = [p.name for p in report.phases]
    assert names == [
        "raw, file order",
        "raw, random order",
        "decoded rgb, 1 process",
        "decoded rgb, 2 processes",
    ]
    source_bytes = sum((root / rel).stat().st_size for _, _, rel in items)
    assert [p.bytes for p in report.phases[:2]] == [source_bytes, source_bytes]
    assert all(p.samples == 12 for p in report.phases)
    decoded = sum(cv2.imread(str(root / rel)).nbytes for _, _, rel in items)
    assert [p.bytes for p in report.phases[2:]] == [decoded, decoded]
    assert report.phases[-1].workers == 2


def test_samples_limit_each_phase(packed):
    manifest, _, _ = packed
    report = bench_dataset(manifest, samples=5, seconds=30, workers=1, decode="gray")
    assert [p.samples for p in report.phases] == [5, 5, 5]
    assert report.phases[-1].name == "decoded gray, 1 process"


def test_cli_table_and_json(packed):
    manifest, _, _ = packed
    runner = CliRunner()
    text = runner.invoke(cli, ["bench", str(manifest), "--samples", "6", "-j", "2"])
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()  # the answer: stdout
    assert lines[0].startswith(f"{manifest}: 12 samples (images layout), opened in ")
    assert lines[1].split() == ["phase", "samples", "samples/s", "MB/s"]
    assert [line.split()[0:3] for line in lines[2:6]] == [
        ["raw,", "file", "order"],
        ["raw,", "random", "order"],
        ["decoded", "rgb,", "1"],
        ["decoded", "rgb,", "2"],
    ]
    as_json = runner.invoke(cli, ["bench", str(manifest), "--samples", "3", "-j", "1", "--json"])
    report = json.loads(as_json.stdout)
    assert [p["samples"] for p in report["phases"]] == [3, 3, 3]
    assert np.isfinite(report["phases"][0]["samples_per_second"])


def test_missing_dataset_is_an_error(tmp_path):
    result = CliRunner().invoke(cli, ["bench", str(tmp_path / "nothing")])
    assert result.exit_code == 2  # an unusable input
    assert result.stderr.startswith(f"Error: {tmp_path / 'nothing'}: no dataset here")
