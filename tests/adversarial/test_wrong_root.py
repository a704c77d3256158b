"""Issue 36: a pack against the wrong ROOT, and a pack that refused images.

A run whose first 1,000 list items are all refused (more than --max-failures allows) stops
early, says ROOT is probably wrong, exits 1 and leaves nothing behind; a pack that exited 3
records it in its manifest (`accepted: false`) and `verify` says so beside its verdict.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers.image_files import write_list

from rectool.cli import cli
from rectool.errors import WrongRootError
from rectool.inspect.verify import verify_dataset
from rectool.packer.packing import PackOptions, pack_images

EARLY_REFUSALS = 1000  # rectool.packer.packrun's: the first items all refused, the run stops


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def not_images(tmp_path):
    """A list of 1,100 files that exist under ROOT (so the ROOT check passes) but are no
    images: what a ROOT of the wrong tree (thumbnails, another dataset's sidecars) gives."""
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    items = []
    for i in range(EARLY_REFUSALS + 100):
        (root / "a" / f"{i}.jpg").write_bytes(b"not an image")
        items.append((i, 0, f"a/{i}.jpg"))
    return root, write_list(tmp_path / "faces.lst", items)


def test_a_run_that_refuses_its_first_thousand_images_stops_and_leaves_nothing(
    not_images, tmp_path
):
    root, lst = not_images
    result = run("pack", lst, root, tmp_path / "out" / "f")
    assert result.exit_code == 1, result.output
    assert "listed images were all refused" in result.output
    assert "is ROOT right?" in result.output
    assert "a/0.jpg" in result.output  # the first refusal, named
    assert not (tmp_path / "out").exists()  # nothing that looks complete, nor anything else


def test_an_only_shard_task_that_refuses_everything_stops_too(not_images, tmp_path):
    root, lst = not_images
    prefix = tmp_path / "out" / "f"
    (tmp_path / "out").mkdir()
    options = PackOptions(shard_records=EARLY_REFUSALS + 50)
    with pytest.raises(WrongRootError, match="is ROOT right"):
        pack_images(lst, root, prefix, options, only_shard=0)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


def test_max_failures_lets_a_run_refuse_that_many(not_images, tmp_path):
    root, lst = not_images
    result = pack_images(lst, root, tmp_path / "f", PackOptions(max_failures=2000))
    assert (result.images, result.failures) == (0, EARLY_REFUSALS + 100)


@pytest.fixture
def refusing_pack(small_tree, tmp_path):
    """alice, bob, carol x 4 and one listed image that is missing: pack exits 3."""
    items = [*small_tree.items, (99, 0, "alice/missing.jpg")]
    lst = write_list(tmp_path / "refusing.lst", items)
    result = run("pack", lst, small_tree.root, tmp_path / "out" / "f")
    assert result.exit_code == 3, result.output
    return tmp_path / "out" / "f"


def test_a_pack_that_exited_3_says_so_in_its_manifest(refusing_pack):
    manifest = json.loads(refusing_pack.with_name("f.manifest.json").read_text())
    assert manifest["accepted"] is False
    assert manifest["totals"]["failures"] == 1


def test_verify_mentions_the_refusals_of_a_pack_that_exited_3(refusing_pack):
    result = run("verify", refusing_pack)
    assert result.exit_code == 0  # the bytes are sound
    assert "Sound: no problems found." not in result.output
    assert "Sound as bytes" in result.output
    assert "refused 1 image when packed" in result.output
    assert "more than --max-failures 0 allows (the pack exited 3)" in result.output
    assert "f.failures.jsonl lists them" in result.output
    report = verify_dataset(refusing_pack).to_json()
    assert report["refusals"] == [
        {
            "target": str(refusing_pack),
            "made_by": "pack",
            "refused": 1,
            "images": 12,
            "max_failures": 0,
            "accepted": False,
            "failures_file": str(refusing_pack) + ".failures.jsonl",
        }
    ]


def test_verify_notes_refusals_within_the_limit(small_tree, tmp_path):
    items = [*small_tree.items, (99, 0, "alice/missing.jpg")]
    lst = write_list(tmp_path / "refusing.lst", items)
    prefix = tmp_path / "out" / "f"
    assert run("pack", lst, small_tree.root, prefix, "--max-failures", "1").exit_code == 0
    result = run("verify", prefix)
    assert result.exit_code == 0
    assert "Sound: no problems found." in result.output
    assert "refused 1 image when packed (and packed 12 images), within --max-failures 1" in (
        result.output
    )
