"""Issue 36: identities are part of the data.

`repack` of sources whose identity names clash keeps them apart (`K-NAME`, docs/repack.md),
never pours two people into one name; `verify` flags repeated or malformed identity names;
`unpack` never writes two labels into one folder, nor silently fewer images than the index
lists.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree

from rectool.cli import cli
from rectool.inspect.verify import verify_dataset
from rectool.packer.listfile import write_label_map
from rectool.packer.packing import pack_images


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def pack_of(tmp_path, name, identities, per_identity=2):
    """Pack `identities` (folder names) x `per_identity` JPEGs, with their label map."""
    root = tmp_path / f"{name}-tree"
    items = write_pack_tree(root, identities, per_identity)
    lst = write_list(tmp_path / f"{name}.lst", items)
    labels = tmp_path / f"{name}.labels.tsv"
    write_label_map(labels, dict(enumerate(identities)))
    prefix = tmp_path / name / "faces"
    pack_images(lst, root, prefix, label_map=labels)
    return prefix


@pytest.fixture
def clashing_sources(tmp_path):
    """Two packs whose folders share the names id000000..id000002 (different people), and
    one name of their own each."""
    a = pack_of(tmp_path, "a", ["id000000", "id000001", "id000002", "only-a"])
    b = pack_of(tmp_path, "b", ["id000000", "id000001", "id000002", "only-b"])
    return a, b


def test_repack_keeps_identities_with_clashing_names_apart(clashing_sources, tmp_path):
    a, b = clashing_sources
    out = tmp_path / "merged" / "m"
    result = run("repack", a, b, out)
    assert result.exit_code == 0, result.output
    assert "3 identity names (id000000, id000001, id000002) are used by several sources" in (
        result.output
    )
    assert "--labels-by name merges them instead" in result.output
    names = json.loads((tmp_path / "merged" / "m.identities.json").read_text())
    assert list(names.values()) == [
        "1-id000000",
        "1-id000001",
        "1-id000002",
        "only-a",
        "2-id000000",
        "2-id000001",
        "2-id000002",
        "only-b",
    ]
    assert run("verify", out).exit_code == 0
    unpacked = run("unpack", out, tmp_path / "back")
    assert unpacked.exit_code == 0, unpacked.output
    folders = sorted(p.name for p in (tmp_path / "back").iterdir())
    assert len(folders) == 8  # one folder a person: nobody merged
    assert all(len(list((tmp_path / "back" / f).iterdir())) == 2 for f in folders)


def test_repack_by_name_merges_clashing_names_when_asked(clashing_sources, tmp_path):
    a, b = clashing_sources
    result = run("repack", a, b, tmp_path / "merged" / "m", "--labels-by", "name")
    assert result.exit_code == 0, result.output
    names = json.loads((tmp_path / "merged" / "m.identities.json").read_text())
    assert sorted(names.values()) == ["id000000", "id000001", "id000002", "only-a", "only-b"]


def test_repack_refuses_a_source_whose_label_map_names_two_labels_alike(tmp_path):
    prefix = pack_of(tmp_path, "a", ["x", "y"])
    write_label_map(prefix.with_name("faces.labels.tsv"), {0: "same", 1: "same"})
    prefix.with_name("faces.identities.json").unlink()  # names read from the label map
    manifest = prefix.with_name("faces.manifest.json")
    doc = json.loads(manifest.read_text())
    doc["identities"] = None
    manifest.write_text(json.dumps(doc))
    other = pack_of(tmp_path, "b", ["z"])
    result = run("repack", prefix, other, tmp_path / "merged" / "m")
    assert result.exit_code == 1, result.output
    assert "labels 0 and 1 of the merged sources" in result.output
    assert "'same'" in result.output
    assert not (tmp_path / "merged" / "m.manifest.json").exists()


@pytest.fixture
def version1_pack(tmp_path):
    """A hand-written pack (manifest version 1: the names in the manifest), labels 0, 1, 2."""
    items = [(n, jpeg_bytes(n), float(n % 3)) for n in range(6)]
    prefix = tmp_path / "hand"
    write_pack(prefix, [items])
    return prefix


def name_identities(prefix, identities):
    manifest = prefix.with_name(prefix.name + ".manifest.json")
    doc = json.loads(manifest.read_text())
    doc["identities"] = identities
    manifest.write_text(json.dumps(doc))


def test_verify_flags_two_labels_with_one_name(version1_pack):
    name_identities(version1_pack, {"0": "alice", "1": "alice", "2": "bob"})
    report = verify_dataset(version1_pack)
    assert not report.sound
    assert report.counts["identity-name"] == 1
    assert "labels 0 and 1 are both named 'alice'" in report.problems[0].message


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "is empty"),
        ("..", "is '..', not a folder name"),
        ("a/b", "holds '/'"),
        ("tab\there", "holds the control character '\\t'"),
    ],
)
def test_verify_flags_a_name_that_cannot_name_a_folder(version1_pack, name, why):
    name_identities(version1_pack, {"0": "alice", "1": name, "2": "bob"})
    result = run("verify", version1_pack)
    assert result.exit_code == 1
    assert "identity-name" in result.output
    assert why in result.output


def test_unpack_refuses_two_labels_named_alike_and_writes_nothing(version1_pack, tmp_path):
    name_identities(version1_pack, {"0": "alice", "1": "alice", "2": "bob"})
    result = run("unpack", version1_pack, tmp_path / "back")
    assert result.exit_code == 1, result.output
    assert "labels 0 and 1" in result.output and "'alice'" in result.output
    assert not (tmp_path / "back").exists() or not any((tmp_path / "back").iterdir())


def test_unpack_refuses_a_name_that_is_another_labels_number(version1_pack, tmp_path):
    # Label 1 has no name: its folder is "1", the name label 2 is given.
    name_identities(version1_pack, {"0": "alice", "2": "1"})
    result = run("unpack", version1_pack, tmp_path / "back")
    assert result.exit_code == 1, result.output
    assert "folder '1'" in result.output


def test_unpack_of_an_index_repeating_a_key_refuses_rather_than_write_fewer(tmp_path):
    items = [(0, jpeg_bytes(n), 0.0) for n in range(503)]  # every line says key 0
    prefix = tmp_path / "same-key"
    write_pack(prefix, [items], manifest=False)
    result = run("unpack", str(prefix) + ".rec", tmp_path / "back")
    assert result.exit_code == 1, result.output
    assert "key 0 is on 503 lines" in result.output
    assert "would write 1 of the 503 records" in result.output
    assert not (tmp_path / "back").exists() or not any((tmp_path / "back").iterdir())


@pytest.mark.parametrize(
    ("names", "said"),
    [
        ({0: "same", 1: "same", 2: "carol"}, "labels 0 and 1 are both named 'same'"),
        ({0: "alice", 1: "a/b", 2: "carol"}, "label 1's identity name 'a/b' holds '/'"),
    ],
)
def test_pack_refuses_a_label_map_whose_names_are_not_one_per_identity(
    small_tree, tmp_path, names, said
):
    labels = tmp_path / "bad.labels.tsv"
    write_label_map(labels, names)
    out = tmp_path / "out"
    result = run("pack", small_tree.list_path, small_tree.root, out / "f", "--labels", labels)
    assert result.exit_code == 2, result.output
    assert said in result.output and str(labels) in result.output
    assert not out.exists() or not any(out.iterdir())  # nothing written


def test_identity_records_of_a_sparse_label_space_are_made_one_at_a_time():
    # A list whose labels reach 10**7 needs as many identity records after its images; held as
    # one list they took 2 GB (a pack of one image so labelled). Consumed one by one, what is
    # allocated stays that of a few records: 100,000 here, ~190 bytes each when listed.
    import tracemalloc

    from rectool.packer.layout import INSIGHTFACE

    counts = {99_999: 1}  # one image, with the last label
    tracemalloc.start()
    try:
        made = 0
        for _key, _framed in INSIGHTFACE.records_after(1, counts):
            made += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert made == 100_000 + 1  # an identity record a label, then record 0
    assert peak < 2_000_000, f"{peak:,} bytes allocated at once"


def test_a_label_space_too_large_for_float32_keys_is_refused_before_any_record():
    from rectool.errors import RectoolError
    from rectool.packer.layout import INSIGHTFACE

    with pytest.raises(RectoolError, match="float32"):  # made lazily: still before the first
        next(iter(INSIGHTFACE.records_after(10, {2**24: 1})))
