"""Issue 36: an unfinished job array never looks whole.

Shards packed by `pack --only-shard K` carry their plan (`PREFIX-0000K.plan.json`) until
`pack --finalize` writes the manifest; `verify`, `open_dataset` and `repack` refuse numbered
shards without a manifest that a plan (or a gap in their numbers) says are not all there,
naming the missing shards and `--finalize`.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree

from rectool import open_dataset
from rectool.cli import cli
from rectool.errors import InputError
from rectool.packer.packing import PackOptions, finalize_pack, pack_images

OPTIONS = PackOptions(shard_records=4)


@pytest.fixture
def job_array(tmp_path):
    """A list of 20 images planned as 5 shards of 4; shards 0 and 2 packed, no --finalize."""
    root = tmp_path / "tree"
    lst = write_list(tmp_path / "faces.lst", write_pack_tree(root, ["a", "b", "c", "d"], 5))
    prefix = tmp_path / "out" / "f"
    for number in (0, 2):
        pack_images(lst, root, prefix, OPTIONS, only_shard=number)
    return lst, root, prefix


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_verify_refuses_shards_of_an_unfinished_plan_naming_the_missing_ones(job_array):
    _, _, prefix = job_array
    result = run("verify", prefix)
    assert result.exit_code == 2, result.output
    assert "Sound" not in result.output
    assert "of the 5-shard plan, shards 1, 3, 4 missing" in result.output
    assert "--only-shard K" in result.output and "--finalize" in result.output


def test_open_dataset_refuses_an_unfinished_plan(job_array):
    _, _, prefix = job_array
    with pytest.raises(InputError, match="shards 1, 3, 4 missing.*--finalize"):
        open_dataset(prefix)


def test_repack_refuses_an_unfinished_plan_and_writes_nothing(job_array, tmp_path):
    _, _, prefix = job_array
    result = run("repack", prefix, tmp_path / "merged" / "m")
    assert result.exit_code == 2, result.output
    assert "shards 1, 3, 4 missing" in result.output
    assert not (tmp_path / "merged").exists() or not any((tmp_path / "merged").iterdir())


def test_every_shard_packed_but_not_finalized_is_refused_too(job_array):
    lst, root, prefix = job_array
    for number in (1, 3, 4):
        pack_images(lst, root, prefix, OPTIONS, only_shard=number)
    result = run("verify", prefix)
    assert result.exit_code == 2
    assert "5 shards packed one by one and never finalized" in result.output
    assert "--finalize" in result.output
    finalize_pack(lst, root, prefix, OPTIONS)
    assert not list(prefix.parent.glob("*.plan.json"))  # the manifest says it now
    assert run("verify", prefix).exit_code == 0
    assert len(open_dataset(prefix)) == 20


def test_a_copy_that_lost_shards_and_has_no_manifest_is_refused(job_array, tmp_path):
    lst, root, prefix = job_array
    for number in (1, 3, 4):
        pack_images(lst, root, prefix, OPTIONS, only_shard=number)
    copy = tmp_path / "copy"
    copy.mkdir()
    for number in (0, 2, 4):  # the copy lost shards 1 and 3 (and never had a manifest)
        for path in prefix.parent.glob(f"f-{number:05d}.*"):
            shutil.copy(path, copy / path.name)
    result = run("verify", copy / "f")
    assert result.exit_code == 2
    assert "shards 1, 3 missing" in result.output


def test_a_finalized_pack_that_lost_its_manifest_and_shards_names_the_gaps(job_array, tmp_path):
    lst, root, prefix = job_array
    for number in (1, 3, 4):
        pack_images(lst, root, prefix, OPTIONS, only_shard=number)
    finalize_pack(lst, root, prefix, OPTIONS)
    copy = tmp_path / "copy"
    copy.mkdir()
    for number in (0, 2, 4):
        for path in prefix.parent.glob(f"f-{number:05d}.*"):
            shutil.copy(path, copy / path.name)
    with pytest.raises(InputError, match=r"shards 1, 3 of the numbered shards 0\.\.4 are missing"):
        open_dataset(copy / "f")
    # Named one by one, the shards are what the caller chose to read.
    assert len(open_dataset([str(copy / f"f-{n:05d}.rec") for n in (0, 2, 4)])) == 12


def test_a_plan_file_claiming_a_billion_shards_is_answered_at_once(job_array, alarm):
    _, _, prefix = job_array
    plan_file = prefix.with_name("f-00000.plan.json")
    doc = json.loads(plan_file.read_text())
    doc["plan"]["shards"] = 10**15
    plan_file.write_text(json.dumps(doc))
    prefix.with_name("f-00002.plan.json").write_text(json.dumps(doc))
    alarm(60)  # the missing shards are counted, never listed one by one
    with pytest.raises(InputError, match=r"shards 1, 3, 4, .*\(999,999,999,999,998 in all\)"):
        open_dataset(prefix)


@pytest.mark.parametrize("text", ["not json", "[]", '{"plan": {"shards": 5}}'])
def test_a_plan_file_that_is_not_one_is_named(job_array, text):
    _, _, prefix = job_array
    prefix.with_name("f-00002.plan.json").write_text(text)
    result = run("verify", prefix)
    assert result.exit_code == 2
    assert "f-00002.plan.json" in result.output
    assert "Traceback" not in result.output
