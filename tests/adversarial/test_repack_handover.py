"""Adversarial (issue 36): the binary index `rectool repack` hands over from what its writer
wrote (offsets, keys, labels: `binindex.Written`) is, array for array, the index `rectool
index` builds from the written .rec/.idx files, and `rectool verify` passes, for every option
set: orders, relabelling, filters, label vectors, the insightface layout, removals (duplicates,
overlap with a verification set or a pack), re-encoding, several shards, several sources, a
resumed run (killed between shards, inside a shard, or after its last file) and --overwrite.

The expected index comes from `rectool index --into --force` (a fresh manifest and index
beside links to the written files), never from the arrays under test.
"""

from __future__ import annotations

import json
import os
import pickle

import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import index_arrays, write_insightface, write_pack
from helpers.image_files import jpeg_bytes

from rectool.cli import cli
from rectool.dataset.packs import open_dataset
from rectool.repack.pipeline import RepackOptions, repack

ARRAYS = ("offsets", "keys", "labels", "identity_ranges")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def image(k):
    """A small JPEG, different for every k, of a few sizes."""
    return jpeg_bytes(k, 10 + 2 * (k % 3), 8 + 2 * (k % 2))


def write_sources(root):
    """Write the sources every option set reads (under `root`); return their paths by name.

    src: 5 identities (labels 0-4) of 1-6 images in two shards; key 7 is not an image
    (refused by --check structure), key 12 repeats key 11's image (--dedupe), keys 3 and 15
    are in lfw.bin and in the pack `other` (--drop-overlap).
    vec: the same images with a 2-label vector each (identity, then another number).
    faces: an insightface folder (train.rec/.idx/property) of 3 identities.
    """
    counts = [3, 6, 1, 5, 4]
    items, k = [], 0
    for label, count in enumerate(counts):
        for _ in range(count):
            data = b"not an image" if k == 7 else image(11 if k == 12 else k)
            items.append((k, data, float(label)))
            k += 1
    write_pack(root / "src", [items[:9], items[9:]])
    vectors = [(key, data, [label, 0.5 * key]) for key, data, label in items if key != 7]
    write_pack(root / "vec", [vectors])
    write_pack(root / "other", [[(0, image(15), 0.0), (1, image(100), 1.0)]])
    (root / "lfw.bin").write_bytes(pickle.dumps(([image(3), image(200)], [True]), protocol=4))
    (root / "drop.txt").write_text("1\n3\n")
    faces = root / "faces"
    faces.mkdir()
    write_insightface(faces / "train.rec", faces / "train.idx", [2, 4, 3], lambda n: image(50 + n))
    (faces / "property").write_text("3,12,10\n")
    # lone: identity 1's only image is refused while writing (planned, then empty).
    lone = [(0, image(300), 0.0), (1, image(301), 0.0), (2, b"not an image", 1.0)]
    write_pack(root / "lone", [[*lone, (3, image(303), 2.0), (4, image(304), 2.0)]])
    named = ("src", "vec", "other", "lfw.bin", "drop.txt", "faces", "lone")
    return {name: root / name for name in named}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("sources"))


def written_index(prefix):
    """The arrays the repack wrote (by the manifest's index entry) and the manifest."""
    manifest, arrays = index_arrays(prefix)
    return manifest, {name: array for name, array in arrays.items() if name in ARRAYS}


def assert_index_is_rebuilt_from_the_files(prefix, tmp_path, carried=()):
    """`rectool index --into` over the written files builds the same arrays; verify passes
    (finding only the records `carried` as they are: (kind, key) pairs)."""
    manifest, handed = written_index(prefix)
    into = tmp_path / "rebuilt"
    result = run("index", f"{prefix}.manifest.json", "--into", into, "--force")
    assert result.exit_code == 0, result.output
    rebuilt_manifest, rebuilt = written_index(into / prefix.name)
    assert sorted(handed) == sorted(rebuilt)
    for name in handed:
        assert handed[name].dtype == rebuilt[name].dtype, name
        assert handed[name].shape == rebuilt[name].shape, name
        assert handed[name].tobytes() == rebuilt[name].tobytes(), name
    assert manifest["index"]["samples"] == rebuilt_manifest["index"]["samples"]
    result = run("verify", f"{prefix}.manifest.json", "--json")
    problems = json.loads(result.output)["problems"]
    assert [(p["kind"], p["key"]) for p in problems] == list(carried), result.output
    assert result.exit_code == (1 if carried else 0), result.output
    return manifest, handed


# name: (source names, repack options)
OPTION_SETS = {
    "identity": (["src"], []),
    "source order": (["src"], ["--order", "source"]),
    "shuffle": (["src"], ["--order", "shuffle", "--seed", "7"]),
    "relabel by min-per-id": (["src"], ["--min-per-id", "3", "--order", "shuffle", "--seed", "2"]),
    "keep labels, drop ids": (["src"], ["--keep-labels", "--drop-ids", "drop.txt"]),
    "keep ids": (["src"], ["--keep-ids", "drop.txt"]),
    "max per id, random": (["src"], ["--max-per-id", "2", "--pick", "random", "--seed", "3"]),
    "fraction of images": (["src"], ["--keep-fraction", "0.5", "--fraction-of", "images"]),
    "dedupe": (["src"], ["--dedupe", "--order", "shuffle", "--seed", "1"]),
    "drop overlap, .bin": (["src"], ["--drop-overlap", "lfw.bin"]),
    "drop overlap, .bin and pack": (
        ["src"],
        ["--drop-overlap", "lfw.bin", "--drop-overlap", "other", "--order", "shuffle"],
    ),
    "shards by records": (["src"], ["--shard-records", "3", "--order", "shuffle", "--seed", "4"]),
    "shards by size": (["src"], ["--shard-size", "700"]),
    "one record a shard": (["src"], ["--shard-records", "1"]),
    "check none": (["src"], ["--check", "none", "--order", "shuffle"]),
    "label vectors kept": (["vec"], ["--order", "shuffle", "--seed", "5"]),
    "label vectors, shards": (["vec"], ["--shard-records", "4"]),
    "label vectors to insightface": (["vec"], ["--layout", "insightface"]),
    "label vectors to insightface, pack-label": (
        ["vec"],
        ["--layout", "insightface", "--pack-label"],
    ),
    "insightface": (["src"], ["--layout", "insightface", "--min-per-id", "2"]),
    "insightface, pack-label": (["src"], ["--layout", "insightface", "--pack-label"]),
    "insightface, overlap removed": (
        ["src"],
        ["--layout", "insightface", "--drop-overlap", "lfw.bin"],
    ),
    "insightface source": (["faces"], ["--order", "shuffle", "--seed", "9"]),
    "insightface to insightface": (["faces"], ["--layout", "insightface", "--max-per-id", "3"]),
    "re-encode": (["src"], ["--resize", "8", "-j", "1", "--order", "shuffle"]),
    "re-encode, shards": (["src"], ["--resize", "8", "-j", "1", "--shard-records", "4"]),
    "re-encode label vectors": (["vec"], ["--quality", "70", "-j", "1"]),
    "re-encode to insightface": (["src"], ["--layout", "insightface", "--center-crop", "-j", "1"]),
    "two sources, offset": (["src", "faces"], ["--order", "shuffle", "--seed", "2"]),
    "two sources, to insightface": (["faces", "src"], ["--layout", "insightface"]),
    "sha256": (["src"], ["--sha256", "--shard-records", "5"]),
    "an identity all refused": (["lone"], ["--order", "shuffle", "--seed", "1"]),
    "an identity all refused, insightface": (["lone"], ["--layout", "insightface"]),
    "an identity all refused, insightface, pack-label": (
        ["lone"],
        ["--layout", "insightface", "--pack-label"],
    ),
}


@pytest.mark.parametrize("name", OPTION_SETS)
def test_the_handed_over_index_is_the_one_index_builds(tmp_path, sources, name):
    names, options = OPTION_SETS[name]
    folder = sources["src"].parent
    args = [folder / n for n in names]
    options = [str(folder / o) if o in ("drop.txt", "lfw.bin", "other") else o for o in options]
    out = tmp_path / "out" / "r"
    result = run("repack", *args, out, "--max-failures", "5", "--quiet", *options)
    assert result.exit_code == 0, result.output
    # --check none carries the record that is not an image: verify finds it, nothing else.
    carried = []
    if "none" in options:
        with open_dataset(out) as ds:
            found = [i for i in range(len(ds)) if bytes(ds.raw(i)[0]) == b"not an image"]
            carried = [("not-an-image", int(ds.keys[i])) for i in found]
        assert len(carried) == 1
    manifest, handed = assert_index_is_rebuilt_from_the_files(out, tmp_path, carried)
    assert len(handed["offsets"]) == manifest["totals"]["images"] > 0


def killed(after):
    """A progress callback that interrupts the run once `after` records are done."""

    def progress(done, total, refused):
        if done >= after:
            raise KeyboardInterrupt

    return progress


def shard_killer(number):
    def on_shard_finished(info, paths):
        if info.rec.endswith(f"-{number:05d}.rec") or (number == 0 and info.rec.endswith("r.rec")):
            raise KeyboardInterrupt

    return on_shard_finished


RESUMES = {
    # name: (options, repack keyword arguments that interrupt the first run)
    "between shards": (
        ["--shard-records", "3", "--order", "shuffle", "--seed", "6"],
        {"on_shard_finished": shard_killer(1)},
    ),
    "after the first shard": (["--shard-records", "4"], {"on_shard_finished": shard_killer(0)}),
    "inside a shard": (["--shard-records", "4", "--order", "shuffle"], {"progress": killed(6)}),
    "inside the only shard": (["--order", "shuffle", "--seed", "3"], {"progress": killed(5)}),
    "before any record": (["--shard-records", "4"], {"progress": killed(0)}),
    "at the first record": (["--shard-records", "4"], {"progress": killed(1)}),
    "after the refused record": (["--order", "source"], {"progress": killed(8)}),
    "insightface, after its file": (
        ["--layout", "insightface"],
        {"on_shard_finished": shard_killer(0)},
    ),
    "insightface, inside": (["--layout", "insightface"], {"progress": killed(7)}),
    "insightface, before any record": (["--layout", "insightface"], {"progress": killed(0)}),
    "re-encode, inside a shard": (
        ["--resize", "8", "-j", "1", "--shard-records", "5"],
        {"progress": killed(9)},
    ),
    "label vectors, between shards": (
        ["--shard-records", "4"],
        {"on_shard_finished": shard_killer(1)},
    ),
}


def api_options(args):
    """The RepackOptions the command line makes of `args` (the few used here)."""
    values: dict = {"max_failures": 5, "workers": 1}
    it = iter(args)
    for arg in it:
        if arg == "--shard-records":
            values["shard_records"] = int(next(it))
        elif arg in ("--order", "--layout"):
            values[arg[2:]] = next(it)
        elif arg == "--seed":
            values["seed"] = int(next(it))
        elif arg == "--resize":
            from rectool.packer.images import Transform

            values["transform"] = Transform(resize=int(next(it)))
        elif arg == "-j":
            next(it)
    return RepackOptions(**values)


@pytest.mark.parametrize("name", RESUMES)
def test_a_resumed_repack_indexes_every_record_of_both_runs(tmp_path, sources, name):
    args, interrupt = RESUMES[name]
    source = sources["vec" if name.startswith("label vectors") else "src"]
    reference = tmp_path / "ref" / "r"
    result = run("repack", source, reference, "--max-failures", "5", "--quiet", *args)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out" / "r"
    with pytest.raises(KeyboardInterrupt):
        repack([source], out, api_options(args), **interrupt)
    result = run("repack", source, out, "--max-failures", "5", "--quiet", "--resume", *args)
    assert result.exit_code == 0, result.output
    manifest, handed = assert_index_is_rebuilt_from_the_files(out, tmp_path)
    _, expected = written_index(reference)
    for name_ in expected:  # what an uninterrupted run writes, the first part's records too
        assert handed[name_].tobytes() == expected[name_].tobytes(), name_


@pytest.mark.parametrize(
    "first, second",
    [
        (["--shard-records", "2"], ["--order", "shuffle"]),  # fewer shards the second time
        (["--order", "shuffle"], ["--shard-records", "2"]),
        (["--layout", "insightface"], ["--shard-records", "3", "--min-per-id", "4"]),
        (["--shard-records", "3"], ["--layout", "insightface", "--pack-label"]),
    ],
    ids=["to one shard", "to several", "insightface to images", "images to insightface"],
)
def test_an_overwritten_pack_indexes_only_the_new_records(tmp_path, sources, first, second):
    out = tmp_path / "out" / "r"
    common = ["--max-failures", "5", "--quiet"]
    assert run("repack", sources["src"], out, *common, *first).exit_code == 0
    refused = run("repack", sources["vec"], out, *common, *second)
    assert refused.exit_code != 0  # an existing pack is not replaced without --overwrite
    result = run("repack", sources["vec"], out, *common, "--overwrite", *second)
    assert result.exit_code == 0, result.output
    manifest, handed = assert_index_is_rebuilt_from_the_files(out, tmp_path)
    assert len(handed["offsets"]) == manifest["totals"]["images"]
    reference = tmp_path / "ref" / "r"
    assert run("repack", sources["vec"], reference, *common, *second).exit_code == 0
    _, expected = written_index(reference)
    for name in expected:
        assert handed[name].tobytes() == expected[name].tobytes(), name


def test_an_interrupted_repack_started_again_with_overwrite_indexes_its_own_records(
    tmp_path, sources
):
    args = ["--shard-records", "4", "--order", "shuffle", "--seed", "8"]
    out = tmp_path / "out" / "r"
    with pytest.raises(KeyboardInterrupt):
        repack([sources["src"]], out, api_options(args), on_shard_finished=shard_killer(1))
    result = run("repack", sources["vec"], out, "--quiet", "--overwrite", *args)
    assert result.exit_code == 0, result.output
    manifest, handed = assert_index_is_rebuilt_from_the_files(out, tmp_path)
    assert handed["labels"].shape == (manifest["totals"]["images"], 2)  # vec's, not src's


@pytest.mark.parametrize("layout", ["images", "insightface"])
def test_a_repack_that_keeps_no_identity_writes_a_sound_empty_pack(sources, tmp_path, layout):
    # insightface exited 1 ("identity records must each hold a label pair") and left an
    # unfinished pack behind; then a (0, 2) identity-range array could not be written.
    out = tmp_path / "out" / "none"
    result = run("repack", sources["src"], out, "--layout", layout, "--min-per-id", 100)
    assert result.exit_code == 0, result.output
    assert not os.path.exists(f"{out}.pack-state.json")
    manifest, handed = assert_index_is_rebuilt_from_the_files(out, tmp_path)
    assert manifest["layout"] == layout and len(handed["offsets"]) == 0
    assert len(open_dataset(out)) == 0
