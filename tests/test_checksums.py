"""Per-record checksum files (.rec.crc): written by pack, used by verify, reindex and unpack.

Packs are written with version 2 (xxh3-64 per record); version 1 (zlib CRC-32) is tested on
a pack of the old rectool in test_checksums_v2.py. Expected values are computed here from the
files' bytes with xxhash, zlib and struct, never by rectool.format.checksums.
"""

from __future__ import annotations

import json
import os
import struct
import zlib

import pytest
import xxhash
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree
from helpers.rec_files import idx_lines, image_payload, make_pack, write_records, xor_byte

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.inspect.reindex import reindex
from rectool.inspect.unpack import unpack_dataset
from rectool.inspect.verify import verify_dataset
from rectool.packer.packing import PackOptions, pack_images
from rectool.packer.shards import ShardWriter


def found(report):
    return [(p.kind, p.path, p.key, p.offset) for p in report.problems]


# Per version: an entry's layout (offset, length, checksum; packed) and the checksum.
ENTRY = {1: "<QII", 2: "<QIQ"}
CHECKSUM = {1: zlib.crc32, 2: xxhash.xxh3_64_intdigest}


def crc_table(path):
    """Parse a .rec.crc by hand: ((magic, version, reserved, count), [(offset, length, sum)])."""
    data = path.read_bytes()
    header = struct.unpack_from("<8sIIQ", data)
    entry = ENTRY[header[1]]
    size = struct.calcsize(entry)
    entries = [struct.unpack_from(entry, data, 24 + size * i) for i in range(header[3])]
    assert len(data) == 24 + size * header[3]
    return header, entries


def expected_table(rec, idx, version=2):
    """Each record's (offset, framed length, checksum), from the .rec bytes and the .idx."""
    data = rec.read_bytes()
    offsets = sorted(o for _, o in idx_lines(idx))
    ends = [*offsets[1:], len(data)]
    return [(o, e - o, CHECKSUM[version](data[o:e])) for o, e in zip(offsets, ends)]


def test_pack_writes_a_checksum_per_record_and_names_the_file(small_pack):
    crc = small_pack.rec.with_name("faces.rec.crc")
    header, entries = crc_table(crc)
    assert header == (b"RTXXH64\n", 2, 0, 12)
    assert entries == expected_table(small_pack.rec, small_pack.idx)
    entry = json.loads(small_pack.manifest.read_text())["shards"][0]
    assert entry["crc"] == "faces.rec.crc"
    assert entry["crc_xxh3_128"] == xxhash.xxh3_128_hexdigest(crc.read_bytes())
    assert "crc_sha256" not in entry  # only with --sha256


def test_sharded_pass_through_pack_has_one_file_per_shard(tmp_path):
    pack = make_pack(tmp_path, shard_records=5)
    out = pack.manifest.parent
    for n in range(3):
        rec, idx = out / f"faces-{n:05d}.rec", out / f"faces-{n:05d}.idx"
        assert crc_table(out / f"faces-{n:05d}.rec.crc")[1] == expected_table(rec, idx)


def test_a_flipped_byte_in_one_image_names_its_key_and_offset(small_pack):
    key, offset = small_pack.lines[5]
    xor_byte(small_pack.rec, offset + 8 + 24 + 100, 0x10)
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [
        ("record-checksum-mismatch", str(small_pack.rec), key, offset),
        ("checksum-mismatch", str(small_pack.rec), None, None),
    ]
    result = CliRunner().invoke(cli, ["verify", str(small_pack.manifest)])
    assert result.exit_code == 1
    # .rec, .idx, .rec.crc, the three .npy arrays of the binary index, the identities file
    assert "; 7 checksums compared (xxh3-128); 12 records compared with their xxh3-64 (" in (
        result.stdout
    )
    assert f"record-checksum-mismatch: {small_pack.rec}, key {key}, byte offset {offset}: " in (
        result.stdout
    )


def test_a_tampered_checksum_file_is_reported_and_not_trusted(small_pack):
    crc = small_pack.rec.with_name("faces.rec.crc")
    xor_byte(crc, 24 + 20 * 3 + 12, 0xFF)  # record 3's checksum: the table now lies about it
    report = verify_dataset(small_pack.manifest)
    assert [(p.kind, p.path) for p in report.problems] == [("checksum-file", str(crc))]
    assert "differs from the manifest's" in report.problems[0].message
    assert report.record_checksums == 0


def test_a_missing_or_malformed_checksum_file_is_its_own_finding(small_pack):
    crc = small_pack.rec.with_name("faces.rec.crc")
    crc.write_bytes(b"RTXXH64\n" + bytes(4))
    report = verify_dataset(small_pack.manifest)
    assert [(p.kind, p.path) for p in report.problems] == [("checksum-file", str(crc))]
    assert report.problems[0].message == "12 bytes, too short for a checksum file"
    crc.unlink()
    report = verify_dataset(small_pack.manifest)
    assert [(p.kind, p.path) for p in report.problems] == [("checksum-file", str(crc))]
    assert report.problems[0].message.startswith("listed in the manifest, missing")


def test_a_pack_without_checksum_files_verifies_as_before(small_pack):
    """As MXNet, im2rec or an older rectool write it: no .rec.crc, no crc in the manifest."""
    small_pack.rec.with_name("faces.rec.crc").unlink()
    manifest = json.loads(small_pack.manifest.read_text())
    for entry in manifest["shards"]:
        del entry["crc"], entry["crc_xxh3_128"]
    small_pack.manifest.write_text(json.dumps(manifest))
    report = verify_dataset(small_pack.manifest)
    assert report.sound, report.problems
    assert (report.checksums, report.record_checksums) == (6, 0)  # no .rec.crc of 7
    key, offset = small_pack.lines[5]
    xor_byte(small_pack.rec, offset + 8 + 24 + 100, 0x10)
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [("checksum-mismatch", str(small_pack.rec), None, None)]


def test_resume_after_a_cut_back_shard_gives_the_same_checksum_file(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a", "b", "c"], 5)
    lst = write_list(tmp_path / "x.lst", items)
    options = PackOptions(shard_records=6)
    pack_images(lst, root, tmp_path / "ref" / "x", options)
    reference = {p.name: p.read_bytes() for p in (tmp_path / "ref").iterdir()}

    # Shard 1 interrupted after 4 records and a torn 5th: resume must cut it back to 4.
    out = tmp_path / "out"
    pack_images(lst, root, out / "x", options)
    for name in ("x-00001.rec", "x-00001.idx"):
        (out / name).rename(out / (name + ".partial"))
    for name in ("x-00001.rec.crc", "x-00002.rec", "x-00002.idx", "x-00002.rec.crc"):
        (out / name).unlink()
    lines = (out / "x-00001.idx.partial").read_bytes().splitlines(keepends=True)
    cut = int(lines[4].split(b"\t")[1])
    (out / "x-00001.idx.partial").write_bytes(b"".join(lines[:4]) + lines[4][:3])
    rec = (out / "x-00001.rec.partial").read_bytes()
    (out / "x-00001.rec.partial").write_bytes(rec[: cut + 40])
    writer = ShardWriter(out / "x", shard_records=6)
    assert writer.resume() == 10
    for key in range(10, 15):
        record = reference["x-00001.rec"] if key < 12 else reference["x-00002.rec"]
        shard_lines = idx_lines(tmp_path / "ref" / ("x-00001.idx" if key < 12 else "x-00002.idx"))
        offsets = [o for _, o in shard_lines] + [len(record)]
        i = [k for k, _ in shard_lines].index(key)
        writer.add(key, record[offsets[i] : offsets[i + 1]], key)
    writer.close(last_shard=2)
    for name in ("x-00001.rec.crc", "x-00002.rec.crc", "x-00001.rec", "x-00002.rec"):
        assert (out / name).read_bytes() == reference[name], name


def test_reindex_names_damaged_records_and_keeps_them_indexed(small_pack):
    key, offset = small_pack.lines[7]
    xor_byte(small_pack.rec, offset + 8 + 24 + 100, 0x10)
    result = reindex(small_pack.rec, overwrite=True)
    assert not result.sound
    assert [(o, k) for o, k, _ in result.damaged] == [(offset, key)]
    assert idx_lines(small_pack.idx) == small_pack.lines
    assert result.to_json()["damaged"][0]["key"] == key


def test_reindex_of_a_sound_pack_keeps_the_manifest_checksums(small_pack):
    before = small_pack.idx.read_bytes()
    result = reindex(small_pack.rec, overwrite=True)
    assert result.sound and result.checksums == str(small_pack.rec) + ".crc"
    assert small_pack.idx.read_bytes() == before
    assert verify_dataset(small_pack.manifest).sound


def test_unpack_refuses_a_damaged_record_and_writes_nothing(small_pack, tmp_path):
    key, offset = small_pack.lines[2]
    xor_byte(small_pack.rec, offset + 8 + 24 + 100, 0x10)
    out = tmp_path / "unpacked"
    with pytest.raises(RectoolError) as caught:
        unpack_dataset(small_pack.manifest, out)
    assert str(caught.value) == (
        "1 damaged record (bytes differ from the checksum taken when packed): "
        f"{small_pack.rec} key {key} at byte offset {offset}; nothing was written. "
        "`rectool verify` lists them all"
    )
    assert not out.exists()
    result = CliRunner().invoke(cli, ["unpack", str(small_pack.manifest), str(out)])
    assert result.exit_code == 1
    assert "Traceback" not in result.output


def test_unpack_of_a_sound_pack_still_works(small_pack, tmp_path):
    result = unpack_dataset(small_pack.manifest, tmp_path / "unpacked")
    assert result.images == 12


def test_empty_index_beside_records_is_a_problem(small_pack):
    small_pack.idx.write_bytes(b"")
    report = verify_dataset(small_pack.rec)
    assert ("empty-index", str(small_pack.idx), None, None) in found(report)
    assert report.counts.get("unindexed-record", 0) == 0
    result = CliRunner().invoke(cli, ["verify", str(small_pack.rec)])
    assert result.exit_code == 1
    assert (
        f"empty-index: {small_pack.idx}: no lines, but faces.rec holds 12 records" in result.stdout
    )


def test_a_manifest_listing_one_shard_twice_is_a_problem(tmp_path):
    pack = make_pack(tmp_path, shard_records=5)
    manifest = json.loads(pack.manifest.read_text())
    manifest["shards"].append(dict(manifest["shards"][0]))
    pack.manifest.write_text(json.dumps(manifest))
    try:
        report = verify_dataset(pack.manifest)
    except RectoolError as exc:  # refused when the manifest is read: as good
        # named by its file, or by the manifest field that lists it again
        assert "faces-00000.rec" in str(exc) or "'shards[3].rec'" in str(exc), str(exc)
        assert os.path.exists(pack.rec)
        return
    assert not report.sound
    problems = [p for p in report.problems if p.kind == "manifest" and "twice" in p.message]
    assert len(problems) == 1
    assert "faces-00000.rec twice (shards 0 and 3)" in problems[0].message
    assert report.counts.get("duplicate-key", 0) == 0
    assert os.path.exists(pack.rec)


def test_records_are_compared_one_by_one_only_where_the_digest_does_not_vouch(small_pack):
    assert verify_dataset(small_pack.manifest).record_checksums == 0  # the shard's xxh3 matches
    small_pack.manifest.unlink()
    report = verify_dataset(small_pack.rec)  # no manifest: nothing else vouches for the bytes
    assert report.sound and report.record_checksums == 12


def test_a_truncated_shard_names_the_records_it_lost(small_pack):
    key, offset = small_pack.lines[-1]
    with open(small_pack.rec, "r+b") as f:
        f.truncate(offset + 40)  # no digest is computed for a file of another size
    report = verify_dataset(small_pack.manifest)
    assert ("record-checksum-mismatch", str(small_pack.rec), key, offset) in found(report)
    assert report.record_checksums == 12


def test_a_checksum_file_of_another_rec_is_one_finding_not_a_flood(small_pack, tmp_path):
    """A .rec written again by another tool beside a rectool .rec.crc, with no manifest."""
    small_pack.manifest.unlink()
    records = [(k, image_payload(b"\xff\xd8\xff" + bytes([k]) * 50, 0.0, k)) for k in range(3)]
    write_records(small_pack.rec, small_pack.idx, records)
    crc = small_pack.rec.with_name("faces.rec.crc")
    # (the payloads are JPEG signatures only: the image check would name each of them)
    report = verify_dataset(small_pack.rec, image_check=False)
    assert found(report) == [("checksum-file", str(crc), None, None)]
    assert report.problems[0].message.startswith("describes 12 records ending at byte ")
    result = reindex(small_pack.rec, overwrite=True)
    assert result.damaged == [] and "describes 12 records" in result.checksum_problem
    with pytest.raises(RectoolError, match="describes 12 records"):
        unpack_dataset(small_pack.rec, tmp_path / "unpacked")


def test_a_fifo_in_place_of_the_checksum_file_is_refused_without_hanging(small_pack, tmp_path):
    crc = small_pack.rec.with_name("faces.rec.crc")
    crc.unlink()
    os.mkfifo(crc)
    report = verify_dataset(small_pack.manifest)
    assert [(p.kind, p.path, p.message) for p in report.problems] == [
        ("checksum-file", str(crc), "not a regular file")
    ]
    with pytest.raises(RectoolError, match="not a regular file"):
        unpack_dataset(small_pack.manifest, tmp_path / "unpacked")
