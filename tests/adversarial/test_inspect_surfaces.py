"""Adversarial cases for the inspecting commands: unpack, reindex, verify and info.

Packs a user did not make and may not trust: hostile labels and identity names, damaged or
lying files. Each case is built by hand (`helpers.rec_files`), never through the code under test.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import xxhash
from click.testing import CliRunner
from helpers.handmade_datasets import image_record, images, write_shard
from helpers.mxnet_oracle import run_mxnet
from helpers.rec_files import MAGIC, image_payload, make_pack, write_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rectool.cli import cli
from rectool.doors.output import OutputFolder
from rectool.errors import RectoolError
from rectool.inspect.reindex import reindex

JPEG = b"\xff\xd8\xff\xe0" + b"x" * 20


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def tree(root):
    """Return {folder: sorted file names} under `root`, as bytes names (any encoding)."""
    out = {}
    for name in sorted(os.listdir(os.fsencode(root))):
        out[name] = sorted(os.listdir(os.path.join(os.fsencode(root), name)))
    return out


def bare_pack(tmp_path, labels, name="bare"):
    """Write a .rec/.idx of one JPEG per label, key i for the i-th."""
    rec, idx = tmp_path / f"{name}.rec", tmp_path / f"{name}.idx"
    write_records(rec, idx, [(i, image_payload(JPEG, lab, i)) for i, lab in enumerate(labels)])
    return rec


# --- unpack: labels and identity names ---------------------------------------------------


def test_unpack_writes_nan_labels_to_one_folder_named_nan(tmp_path):
    # A NaN label is not equal to itself: looked up as a float, its folder was never found.
    rec = bare_pack(tmp_path, [math.nan, math.nan, 1.0])
    result = run("unpack", rec, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert tree(tmp_path / "out") == {b"1": [b"2.jpg"], b"nan": [b"0.jpg", b"1.jpg"]}


def test_unpack_writes_infinite_and_signed_zero_labels_apart(tmp_path):
    rec = bare_pack(tmp_path, [math.inf, -math.inf, -0.0, 0.0, 1.5])
    result = run("unpack", rec, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert tree(tmp_path / "out") == {
        b"-inf": [b"1.jpg"],
        b"0": [b"2.jpg", b"3.jpg"],
        b"1.5": [b"4.jpg"],
        b"inf": [b"0.jpg"],
    }


def _rename_identities(p, names, manifest_too=True):
    """Give the pack's identities `names`; with `manifest_too`, as if packed with them."""
    manifest = json.loads(p.manifest.read_text())
    path = p.manifest.parent / manifest["identities"]["file"]
    data = json.dumps({str(k): v for k, v in enumerate(names)}).encode()
    path.write_bytes(data)
    if manifest_too:
        entry = manifest["identities"]
        entry["bytes"], entry["xxh3_128"] = len(data), xxhash.xxh3_128_hexdigest(data)
        p.manifest.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "hostile",
    ["\ud800x", "a" * 256, "é" * 128],
    ids=["lone-surrogate", "256-bytes", "256-utf8-bytes"],
)
def test_unpack_writes_an_identity_name_no_file_system_holds_as_its_label(tmp_path, hostile):
    # A name that cannot be encoded (a lone surrogate from a JSON escape) was a traceback; one
    # longer than NAME_MAX failed half-way, after other identities were written.
    p = make_pack(tmp_path)
    _rename_identities(p, [hostile, "bob", "carol"])
    result = run("unpack", p.manifest, tmp_path / "again")
    assert result.exit_code == 0, result.output
    assert sorted(tree(tmp_path / "again")) == [b"0", b"bob", b"carol"]


def test_unpack_keeps_an_identity_name_of_exactly_name_max_bytes(tmp_path):
    p = make_pack(tmp_path)
    _rename_identities(p, ["a" * 255, "bob", "carol"])
    result = run("unpack", p.manifest, tmp_path / "again")
    assert result.exit_code == 0, result.output
    assert sorted(tree(tmp_path / "again")) == [b"a" * 255, b"bob", b"carol"]


@pytest.mark.parametrize(
    "hostile",
    ["\x1b[2Jevil", "bob\rX", "tab\there"],
    ids=["escape", "carriage-return", "tab"],
)
def test_unpack_writes_a_name_verify_flags_as_its_label_not_as_a_folder(tmp_path, hostile):
    # verify said "unpack writes a folder per name" of a name with a control character, and
    # unpack wrote it: one rule (the manifest schema's) now decides for both.
    p = make_pack(tmp_path)
    _rename_identities(p, ["alice", hostile, "carol"])
    flagged = run("verify", "--json", p.manifest)
    assert flagged.exit_code == 1
    problems = json.loads(flagged.stdout)["problems"]
    assert [q["kind"] for q in problems] == ["identity-name"]
    result = run("unpack", p.manifest, tmp_path / "again")
    assert result.exit_code == 0, result.output
    assert sorted(tree(tmp_path / "again")) == [b"1", b"alice", b"carol"]


@pytest.mark.parametrize(
    "hostile, why",
    [("\ud800x", "cannot be encoded as a file name"), ("é" * 128, "is 256 bytes")],
    ids=["lone-surrogate", "256-utf8-bytes"],
)
def test_verify_names_an_identity_name_no_folder_can_hold(tmp_path, hostile, why):
    p = make_pack(tmp_path)
    _rename_identities(p, [hostile, "bob", "carol"])
    result = run("verify", "--json", p.manifest)
    assert result.exit_code == 1, result.output
    (problem,) = json.loads(result.stdout)["problems"]
    assert problem["kind"] == "identity-name"
    assert problem["path"].endswith("faces.identities.json")
    assert why in problem["message"]


@pytest.mark.parametrize("name", ["\ud800", "a/b", "..", "", "a\0b"])
def test_the_output_folder_door_refuses_a_name_it_cannot_create_by_name(tmp_path, name):
    with OutputFolder(tmp_path / "out") as out:
        with pytest.raises(RectoolError, match="not a plain folder name"):
            out.write_new(name, "1.jpg", b"x")
        with pytest.raises(RectoolError, match="not a plain file name"):
            out.write_new("ok", name, b"x")
    assert os.listdir(tmp_path / "out") == []


# --- unpack: a binary index changed after packing ----------------------------------------


def _alter_npy(p, name, change):
    path = p.manifest.parent / f"faces.{name}.npy"
    np.save(path, change(np.load(path)))


def test_unpack_refuses_offsets_swapped_in_the_binary_index(tmp_path):
    # Two offsets swapped: each image was written under the other record's key, exit 0.
    p = make_pack(tmp_path)
    _alter_npy(p, "offsets", lambda a: a[[4, *range(1, 4), 0, *range(5, len(a))]])
    result = run("unpack", p.manifest, tmp_path / "again")
    assert result.exit_code == 1, result.output
    assert "faces.offsets.npy: xxh3-128" in result.output
    assert "nothing was written" in result.output
    assert not (tmp_path / "again").exists() or os.listdir(tmp_path / "again") == []


def test_unpack_refuses_labels_changed_in_the_binary_index(tmp_path):
    # A label changed: the image was written into another identity's folder, exit 0.
    p = make_pack(tmp_path)
    _alter_npy(p, "labels", lambda a: np.where(np.arange(len(a)) == 0, 2, a).astype(a.dtype))
    result = run("unpack", "--json", p.manifest, tmp_path / "again")
    assert result.exit_code == 1, result.output
    assert "faces.labels.npy: xxh3-128" in json.loads(result.stdout)["error"]


def test_unpack_refuses_identity_names_changed_after_packing(tmp_path):
    p = make_pack(tmp_path)
    _rename_identities(p, ["bob", "alice", "carol"], manifest_too=False)
    result = run("unpack", p.manifest, tmp_path / "again")
    assert result.exit_code == 1, result.output
    assert "faces.identities.json: " in result.output


# --- unpack: a target folder with things planted in it ----------------------------------


@pytest.mark.parametrize("resume", [[], ["--resume"]], ids=["fresh", "resume"])
def test_unpack_refuses_a_fifo_planted_at_an_images_name_without_blocking(tmp_path, resume):
    rec = bare_pack(tmp_path, [0.0, 1.0])
    (tmp_path / "out" / "1").mkdir(parents=True)
    os.mkfifo(tmp_path / "out" / "1" / "1.jpg")  # opened for reading, it would block
    result = run("unpack", rec, tmp_path / "out", *resume)
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'out' / '1' / '1.jpg'}: exists" in result.output


def test_unpack_removes_a_symlink_planted_at_a_partial_name_not_its_target(tmp_path):
    rec = bare_pack(tmp_path, [0.0])
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "out" / "0").mkdir(parents=True)
    (tmp_path / "out" / "0" / ".0.jpg.partial").symlink_to(victim)
    result = run("unpack", rec, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert victim.read_bytes() == b"precious"
    assert tree(tmp_path / "out") == {b"0": [b"0.jpg"]}


def test_unpack_resume_never_writes_through_a_hard_link_with_other_bytes(tmp_path):
    rec = bare_pack(tmp_path, [0.0])
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "out" / "0").mkdir(parents=True)
    os.link(victim, tmp_path / "out" / "0" / "0.jpg")
    result = run("unpack", rec, tmp_path / "out", "--resume")
    assert result.exit_code == 1, result.output
    assert "exists with other bytes" in result.output
    assert victim.read_bytes() == b"precious"


def test_unpack_killed_between_write_and_link_resumes_to_the_same_tree(tmp_path):
    # What a killed run leaves: a whole file, and a hidden partial of the next one.
    rec = bare_pack(tmp_path, [0.0, 0.0, 1.0])
    run("unpack", rec, tmp_path / "whole")
    (tmp_path / "out" / "0").mkdir(parents=True)
    (tmp_path / "out" / "0" / "0.jpg").write_bytes((tmp_path / "whole/0/0.jpg").read_bytes())
    (tmp_path / "out" / "0" / ".1.jpg.partial").write_bytes(JPEG[:5])
    again = run("unpack", rec, tmp_path / "out")
    assert again.exit_code == 1 and "add --resume" in again.output
    result = run("unpack", "--json", rec, tmp_path / "out", "--resume")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kept"] == 1
    assert tree(tmp_path / "out") == tree(tmp_path / "whole")


# --- reindex: what MXNet 1.9.1 writes ------------------------------------------------------

# Payloads the writer must split or pad: empty, the magic alone or repeated, the magic at an
# aligned or unaligned place, first or last, and short records with no image header.
SPLIT_PAYLOADS = [
    b"",
    MAGIC,
    MAGIC * 3,
    b"ab" + MAGIC + b"cd",
    b"abcd" + MAGIC,
    MAGIC + b"x",
    b"x",
    b"\0" * 7,
    MAGIC + MAGIC[:3],
    b"abcdefgh" + MAGIC + MAGIC,
]

MX_WRITE_RAW = """
from mxnet import recordio
w = recordio.MXIndexedRecordIO(DATA['idx'], DATA['rec'], 'w')
for key, payload in DATA['records']:
    w.write_idx(key, payload)
w.close()
emit(None)
"""

MX_WRITE_IMAGES = """
from mxnet import recordio
w = recordio.MXIndexedRecordIO(DATA['idx'], DATA['rec'], 'w')
for key, image in DATA['records']:
    w.write_idx(key, recordio.pack(recordio.IRHeader(0, 1.0, key, 0), image))
w.close()
emit(None)
"""


@pytest.mark.oracle
def test_reindex_by_position_reproduces_mxnets_idx_of_hostile_payloads(tmp_path):
    rec, idx = tmp_path / "m.rec", tmp_path / "m.idx"
    records = list(enumerate(SPLIT_PAYLOADS))
    run_mxnet(MX_WRITE_RAW, {"rec": str(rec), "idx": str(idx), "records": records})
    result = reindex(rec, tmp_path / "again.idx", keys="position")
    assert result.sound, result.to_json()
    assert (tmp_path / "again.idx").read_bytes() == idx.read_bytes()


@pytest.mark.oracle
def test_reindex_by_header_reproduces_mxnets_idx_of_extreme_keys(tmp_path):
    rec, idx = tmp_path / "h.rec", tmp_path / "h.idx"
    keys = [7, 2**40, 0, 3, 2**63 - 1, 5, 6, 11, 12, 13]
    records = list(zip(keys, SPLIT_PAYLOADS))
    run_mxnet(MX_WRITE_IMAGES, {"rec": str(rec), "idx": str(idx), "records": records})
    result = reindex(rec, tmp_path / "again.idx")
    assert result.sound, result.to_json()
    assert (tmp_path / "again.idx").read_bytes() == idx.read_bytes()


def test_reindex_of_an_empty_rec_writes_an_empty_idx_and_is_sound(tmp_path):
    rec = tmp_path / "empty.rec"
    rec.write_bytes(b"")
    result = run("reindex", "--json", rec)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records"] == 0
    assert (tmp_path / "empty.idx").read_bytes() == b""


# --- unpack: keys are per shard in MXNet, one namespace in the tree -----------------------


def test_unpack_refuses_a_key_held_by_two_shards_before_writing(tmp_path):
    # Two shards written by im2rec from two lists both start at key 0: unpack wrote shard 0,
    # then stopped half-way ("exists; ... add --resume"), and --resume could not go on.
    for shard in range(2):
        image = JPEG[:4] + bytes([shard]) * 20
        write_records(
            tmp_path / f"p-0000{shard}.rec",
            tmp_path / f"p-0000{shard}.idx",
            [(k, image_payload(image, 0.0, k)) for k in range(2)],
        )
    result = run("unpack", tmp_path / "p", tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert (
        f"{tmp_path / 'p-00000.idx'} and {tmp_path / 'p-00001.idx'} both hold key 0 "
        "(2 keys are in more than one shard)"
    ) in result.output
    assert "nothing was written" in result.output
    assert not (tmp_path / "out").exists()
    alone = run("unpack", tmp_path / "p-00001.rec", tmp_path / "one")
    assert alone.exit_code == 0, alone.output


# --- verify: memory in the records, never in a count a header claims ----------------------

# A process that may map at most this much address space: far less than the 8 GB an array of
# every announced key would take, enough for Python, numpy and rectool.
ADDRESS_SPACE = 1 << 30

VERIFY_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from rectool.cli import cli
cli(sys.argv[1:])
"""


def _insightface_announcing(tmp_path, header):
    """An insightface shard of 3 images in 2 identities whose record 0 says `header`."""
    jpegs = images(3)
    rec = tmp_path / "train.rec"
    write_shard(
        rec,
        tmp_path / "train.idx",
        [
            (0, image_record(b"", list(header), 0, 1)),
            (1, image_record(jpegs[0], 0.0, 1)),
            (2, image_record(jpegs[1], 0.0, 2)),
            (3, image_record(jpegs[2], 1.0, 3)),
            (4, image_record(b"", [1.0, 3.0], 4)),
            (5, image_record(b"", [3.0, 4.0], 5)),
        ],
    )
    return rec


@pytest.mark.parametrize(
    "header, first",
    [((4.0, 4.0 + 2e9), "identity key 6 (of 4..1999999999)"), ((4e9, 4e9 + 2), "image key 6")],
    ids=["identities", "images"],
)
def test_verify_of_an_insightface_header_announcing_2e9_keys_stays_small(tmp_path, header, first):
    # An array of every announced key was made: 8 GB for 6 records, killed by the kernel.
    rec = _insightface_announcing(tmp_path, header)
    code = VERIFY_LIMITED.format(limit=ADDRESS_SPACE)
    done = subprocess.run(
        [sys.executable, "-c", code, "verify", "--json", str(rec)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    missing = [p for p in report["problems"] if p["kind"] == "insightface-range"]
    assert missing[0]["message"].startswith(first)
    assert missing[0]["path"] == str(rec)
    assert report["counts"]["insightface-range"] >= 1_999_999_990


def test_verify_names_each_missing_key_when_record_0_announces_a_few_more(tmp_path):
    rec = _insightface_announcing(tmp_path, (4.0, 8.0))  # identities 6 and 7 are missing
    result = run("verify", "--json", rec)
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    assert [(p["kind"], p["key"]) for p in problems if p["kind"] == "insightface-range"] == [
        ("insightface-range", 6),
        ("insightface-range", 7),
    ]


# --- unpack: a property over odd labels ---------------------------------------------------

ODD_LABELS = [0.0, -0.0, 1.0, 2.0, 1.5, math.nan, math.inf, -math.inf, 1e30, 16777217.0]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(labels=st.lists(st.sampled_from(ODD_LABELS), min_size=1, max_size=8))
def test_property_unpack_puts_each_label_in_one_folder_of_its_own(tmp_path_factory, labels):
    # Equal labels (NaN with NaN, -0.0 with 0.0) share a folder; different labels never do;
    # every record is written once, byte for byte.
    where = tmp_path_factory.mktemp("odd")
    rec = bare_pack(where, labels)
    result = run("unpack", rec, where / "out")
    assert result.exit_code == 0, result.output
    folder_of = {}
    for folder, files in tree(where / "out").items():
        for name in files:
            key = int(name.split(b".")[0])
            assert key not in folder_of
            folder_of[key] = folder
            assert (where / "out" / os.fsdecode(folder) / os.fsdecode(name)).read_bytes() == JPEG
    assert sorted(folder_of) == list(range(len(labels)))

    def same(x, y):
        return (math.isnan(x) and math.isnan(y)) or x == y

    for i, x in enumerate(labels):
        for j, y in enumerate(labels):
            assert (folder_of[i] == folder_of[j]) == same(x, y), (x, y)


def test_unpack_of_a_pack_missing_its_identities_file_is_unusable_input(tmp_path):
    p = make_pack(tmp_path)
    (p.manifest.parent / "faces.identities.json").unlink()
    result = run("unpack", p.manifest, tmp_path / "again")
    assert result.exit_code == 2, result.output
    assert f"{p.manifest.parent / 'faces.identities.json'}: identities file not found" in (
        result.output
    )
    assert not (tmp_path / "again").exists()
