"""Manifest and checksum file version 2 (xxh3-128 per file, xxh3-64 per record, SHA-256 with
--sha256), and version 1 (SHA-256 per file, zlib CRC-32 per record) as older packs have it.

The version-1 pack is tests/fixtures/v1pack, written by rectool before version 2 (see its
README): verify must read it as it always did. Expected digests are computed here with
xxhash, hashlib and zlib from the files' bytes, never through rectool's helpers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import xxhash
from click.testing import CliRunner
from helpers.image_files import write_list, write_pack_tree
from helpers.rec_files import idx_lines, make_pack, xor_byte

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.format.checksums import ChecksumFileError, decode_checksums
from rectool.format.manifest import read_manifest
from rectool.inspect.reindex import reindex
from rectool.inspect.unpack import unpack_dataset
from rectool.inspect.verify import verify_dataset
from rectool.packer.packing import PackOptions, pack_images
from rectool.repack.pipeline import RepackOptions, repack

V1_PACK = Path(__file__).parent / "fixtures" / "v1pack"


def found(report):
    return [(p.kind, p.path, p.key, p.offset) for p in report.problems]


def shard_entry(manifest):
    return json.loads(Path(manifest).read_text())["shards"][0]


@pytest.fixture
def v1_pack(tmp_path):
    """A copy of the version-1 fixture pack (to damage), described by hand."""
    out = tmp_path / "v1"
    shutil.copytree(V1_PACK, out)
    rec = out / "faces.rec"
    return rec, out / "faces.idx", out / "faces.manifest.json", idx_lines(out / "faces.idx")


def test_the_v1_fixture_is_what_version_1_wrote():
    """Guards the fixture itself: SHA-256 per file, zlib CRC-32 per record, no xxh3."""
    manifest = json.loads((V1_PACK / "faces.manifest.json").read_text())
    assert manifest["format_version"] == 1
    entry = manifest["shards"][0]
    for file, name in (("rec", "faces.rec"), ("idx", "faces.idx"), ("crc", "faces.rec.crc")):
        data = (V1_PACK / name).read_bytes()
        assert entry[f"{file}_sha256"] == hashlib.sha256(data).hexdigest()
        assert f"{file}_xxh3_128" not in entry
    crc = (V1_PACK / "faces.rec.crc").read_bytes()
    assert struct.unpack_from("<8sIIQ", crc) == (b"RTCRC32\n", 1, 0, 6)
    rec = (V1_PACK / "faces.rec").read_bytes()
    offsets = [o for _, o in idx_lines(V1_PACK / "faces.idx")]
    for i, (start, end) in enumerate(zip(offsets, [*offsets[1:], len(rec)])):
        assert struct.unpack_from("<QII", crc, 24 + 16 * i) == (
            start,
            end - start,
            zlib.crc32(rec[start:end]),
        )


def test_a_version_1_pack_verifies_with_sha256_and_crc32(v1_pack):
    rec, _, manifest, lines = v1_pack
    report = verify_dataset(manifest)
    assert report.sound, report.problems
    assert (report.checksums, report.record_checksums) == (3, 0)
    assert report.file_digests == ["sha256"] and report.record_digests == []
    assert report.to_json()["digests"] == {"files": ["sha256"], "records": []}
    (Path(manifest)).unlink()  # nothing vouches for the bytes: every record is compared
    report = verify_dataset(rec)
    assert report.sound and report.record_checksums == 6
    assert report.record_digests == ["crc32"]


def test_a_flipped_byte_in_a_version_1_pack_is_named_by_key_and_offset(v1_pack):
    rec, _, manifest, lines = v1_pack
    key, offset = lines[4]
    xor_byte(rec, offset + 8 + 24 + 100, 0x10)
    report = verify_dataset(manifest)
    assert found(report) == [
        ("record-checksum-mismatch", str(rec), key, offset),
        ("checksum-mismatch", str(rec), None, None),
    ]
    record, whole = report.problems
    assert "differ from their CRC-32 (" in record.message
    assert len(record.message.split("(")[1].split(" ")[0]) == 8  # a CRC-32: 8 hex digits
    assert whole.message.startswith("SHA-256 ")
    assert (report.file_digests, report.record_digests) == (["sha256"], ["crc32"])
    result = CliRunner().invoke(cli, ["verify", str(manifest)])
    assert result.exit_code == 1
    assert "; 3 checksums compared (sha256); 6 records compared with their CRC-32 (" in (
        result.stdout
    )
    assert [(o, k) for o, k, _ in reindex(rec, overwrite=True).damaged] == [(offset, key)]


def test_a_version_1_checksum_file_that_was_altered_is_not_trusted(v1_pack):
    rec, _, manifest, _ = v1_pack
    crc = rec.with_name("faces.rec.crc")
    xor_byte(crc, 24 + 16 * 2 + 12, 0xFF)
    report = verify_dataset(manifest)
    assert found(report) == [("checksum-file", str(crc), None, None)]
    assert report.problems[0].message.startswith("SHA-256 ")


def test_a_version_1_pack_unpacks_and_refuses_a_damaged_record(v1_pack, tmp_path):
    rec, _, manifest, lines = v1_pack
    assert unpack_dataset(manifest, tmp_path / "sound").images == 6
    key, offset = lines[1]
    xor_byte(rec, offset + 8 + 24 + 100, 0x10)
    with pytest.raises(RectoolError, match=f"{rec} key {key} at byte offset {offset}"):
        unpack_dataset(manifest, tmp_path / "damaged")


def test_a_version_3_manifest_gives_xxh3_128_of_every_file(small_pack):
    doc = json.loads(small_pack.manifest.read_text())
    assert doc["format_version"] == 3 and doc["options"]["sha256"] is False
    entry = doc["shards"][0]
    assert (
        list(entry)
        == (
            "rec idx records rec_bytes idx_bytes rec_xxh3_128 idx_xxh3_128 first_key last_key crc "
            "crc_xxh3_128"
        ).split()
    )
    for file, path in (("rec", small_pack.rec), ("idx", small_pack.idx)):
        assert entry[f"{file}_xxh3_128"] == xxhash.xxh3_128_hexdigest(path.read_bytes())
    crc = small_pack.rec.with_name("faces.rec.crc").read_bytes()
    assert entry["crc_xxh3_128"] == xxhash.xxh3_128_hexdigest(crc)
    assert read_manifest(small_pack.manifest)["shards"][0] == entry
    folder = small_pack.manifest.parent
    for named in (*(doc["index"][a] for a in ("offsets", "keys", "labels")), doc["identities"]):
        data = (folder / named["file"]).read_bytes()
        assert (named["bytes"], named["xxh3_128"]) == (len(data), xxhash.xxh3_128_hexdigest(data))
    report = verify_dataset(small_pack.manifest)
    assert report.sound and (report.file_digests, report.record_digests) == (["xxh3-128"], [])


def test_sha256_adds_a_sha256_of_every_file_and_verify_checks_both(tmp_path):
    pack = make_pack(tmp_path, sha256=True)
    entry = shard_entry(pack.manifest)
    crc = pack.rec.with_name("faces.rec.crc")
    for file, path in (("rec", pack.rec), ("idx", pack.idx), ("crc", crc)):
        data = path.read_bytes()
        assert entry[f"{file}_xxh3_128"] == xxhash.xxh3_128_hexdigest(data)
        assert entry[f"{file}_sha256"] == hashlib.sha256(data).hexdigest()
    report = verify_dataset(pack.manifest)
    assert report.sound and report.file_digests == ["xxh3-128", "sha256"]
    key, offset = pack.lines[3]
    xor_byte(pack.rec, offset + 8 + 24 + 100, 0x10)
    report = verify_dataset(pack.manifest)
    assert found(report) == [
        ("record-checksum-mismatch", str(pack.rec), key, offset),
        ("checksum-mismatch", str(pack.rec), None, None),
    ]
    message = report.problems[1].message
    assert message.startswith("xxh3-128 ") and "; SHA-256 " in message
    assert report.record_digests == ["xxh3-64"]


def test_the_rec_and_idx_bytes_do_not_depend_on_sha256(tmp_path):
    plain = make_pack(tmp_path / "a")
    both = make_pack(tmp_path / "b", sha256=True)
    for name in ("faces.rec", "faces.idx", "faces.rec.crc"):
        assert (plain.rec.parent / name).read_bytes() == (both.rec.parent / name).read_bytes()


def test_a_flipped_byte_in_a_version_2_pack_is_named_by_key_and_offset(small_pack):
    key, offset = small_pack.lines[9]
    xor_byte(small_pack.rec, offset + 8 + 24 + 100, 0x10)
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [
        ("record-checksum-mismatch", str(small_pack.rec), key, offset),
        ("checksum-mismatch", str(small_pack.rec), None, None),
    ]
    record, whole = report.problems
    data = small_pack.rec.read_bytes()
    # The message gives the xxh3-64 taken when packed: that of the record before the flip.
    xor_byte(small_pack.rec, offset + 8 + 24 + 100, 0x10)
    end = ([o for _, o in small_pack.lines if o > offset] or [len(data)])[0]
    packed = xxhash.xxh3_64_intdigest(small_pack.rec.read_bytes()[offset:end])
    assert f"differ from their xxh3-64 ({packed:016x} when packed)" in record.message
    assert whole.message.startswith("xxh3-128 ")
    assert (report.file_digests, report.record_digests) == (["xxh3-128"], ["xxh3-64"])
    assert report.to_json()["digests"] == {"files": ["xxh3-128"], "records": ["xxh3-64"]}


def test_a_wrong_xxh3_128_in_the_manifest_is_a_checksum_mismatch(small_pack):
    doc = json.loads(small_pack.manifest.read_text())
    doc["shards"][0]["idx_xxh3_128"] = "0" * 32
    small_pack.manifest.write_text(json.dumps(doc))
    report = verify_dataset(small_pack.manifest)
    assert found(report) == [("checksum-mismatch", str(small_pack.idx), None, None)]
    actual = xxhash.xxh3_128_hexdigest(small_pack.idx.read_bytes())
    assert report.problems[0].message == (
        f"xxh3-128 {actual} differs from the manifest's {'0' * 32}"
    )


def test_read_manifest_checks_the_xxh3_128_fields(small_pack):
    doc = json.loads(small_pack.manifest.read_text())
    doc["shards"][0]["rec_xxh3_128"] = "ab" * 15  # 30 hex digits
    small_pack.manifest.write_text(json.dumps(doc))
    with pytest.raises(RectoolError, match="'shards\\[0\\].rec_xxh3_128' must be 32 hex digits"):
        read_manifest(small_pack.manifest)
    doc["shards"][0]["rec_xxh3_128"] = "ab" * 16
    doc["format_version"] = 4
    small_pack.manifest.write_text(json.dumps(doc))
    with pytest.raises(RectoolError, match="version 4 is newer than this reader understands"):
        read_manifest(small_pack.manifest)


def test_a_checksum_file_whose_magic_and_version_disagree_is_refused():
    body = struct.pack("<8sIIQ", b"RTCRC32\n", 2, 0, 0)
    with pytest.raises(ChecksumFileError, match="version 2 \\(magic b'RTCRC32\\\\n'\\)"):
        decode_checksums(body, "x.rec.crc")
    body = struct.pack("<8sIIQ", b"RTXXH64\n", 3, 0, 0)
    with pytest.raises(ChecksumFileError, match="this rectool reads versions 1, 2"):
        decode_checksums(body, "x.rec.crc")


def test_cli_pack_and_repack_take_sha256(tmp_path):
    root = tmp_path / "tree"
    lst = write_list(tmp_path / "x.lst", write_pack_tree(root, ["a", "b"], 3))
    runner = CliRunner()
    result = runner.invoke(
        cli, ["pack", str(lst), str(root), str(tmp_path / "p" / "x"), "--sha256", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    rec = (tmp_path / "p" / "x.rec").read_bytes()
    assert shard_entry(tmp_path / "p" / "x.manifest.json")["rec_sha256"] == (
        hashlib.sha256(rec).hexdigest()
    )
    for extra, has_sha256 in (([], False), (["--sha256"], True)):
        out = tmp_path / f"r{len(extra)}" / "x"
        result = runner.invoke(
            cli, ["repack", str(tmp_path / "p" / "x"), str(out), "--quiet", *extra]
        )
        assert result.exit_code == 0, result.output
        entry = shard_entry(str(out) + ".manifest.json")
        data = Path(str(out) + ".rec").read_bytes()
        assert entry["rec_xxh3_128"] == xxhash.xxh3_128_hexdigest(data)
        assert ("rec_sha256" in entry) is has_sha256
        if has_sha256:
            assert entry["rec_sha256"] == hashlib.sha256(data).hexdigest()


def test_repack_of_a_version_1_pack_writes_version_3(v1_pack, tmp_path):
    _, _, manifest, _ = v1_pack
    out = tmp_path / "re" / "faces"
    repack([str(manifest)], out, RepackOptions(sha256=True, order="source"))
    doc = json.loads(Path(str(out) + ".manifest.json").read_text())
    assert doc["format_version"] == 3 and doc["index"]["samples"] == [6]
    crc = Path(str(out) + ".rec.crc").read_bytes()
    assert crc[:12] == b"RTXXH64\n" + struct.pack("<I", 2)
    report = verify_dataset(str(out) + ".manifest.json")
    assert report.sound and report.file_digests == ["xxh3-128", "sha256"]


def _reads_of_shards(events):
    """The .rec/.idx files (final or .partial) that were opened for reading."""
    return sorted(
        path
        for path, flags in events
        if path.endswith((".rec", ".idx", ".rec.partial", ".idx.partial", ".rec.crc"))
        and flags & (os.O_WRONLY | os.O_RDWR) == 0
    )


def test_pack_hashes_beside_the_write_without_reading_a_shard_back(tmp_path):
    """Every digest and record checksum is taken from the bytes as they are written: no shard
    file is read back for them during a pack (with --sha256, and shards rolling over). The one
    read of each finished shard is its binary index's (format 3: the .idx and the record
    headers, read once when the manifest is written); no .partial nor .rec.crc is read."""
    root = tmp_path / "tree"
    lst = write_list(tmp_path / "x.lst", write_pack_tree(root, ["a", "b", "c"], 4))
    out = tmp_path / "out"
    script = f"""
import sys
events = []
def hook(event, args):
    if event == "open" and str(args[0]).startswith({str(out)!r}):
        events.append((str(args[0]), args[2]))  # (path, os.open flags)
sys.addaudithook(hook)
from rectool.packer.packing import PackOptions, pack_images
pack_images({str(lst)!r}, {str(root)!r}, {str(out / "x")!r},
            PackOptions(shard_records=5, sha256=True, workers=1))
print(repr(events))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    events = eval(done.stdout.strip().splitlines()[-1])
    assert any(path.endswith(".rec.partial") for path, _ in events)  # the hook saw the writes
    finished = [str(out / f"x-{n:05d}{suffix}") for n in range(3) for suffix in (".idx", ".rec")]
    assert _reads_of_shards(events) == sorted(finished)
    for n in range(3):
        entry = json.loads((out / "x.manifest.json").read_text())["shards"][n]
        data = (out / f"x-{n:05d}.rec").read_bytes()
        assert entry["rec_xxh3_128"] == xxhash.xxh3_128_hexdigest(data)
        assert entry["rec_sha256"] == hashlib.sha256(data).hexdigest()


def test_kill_then_resume_rebuilds_version_3_digests_and_checksums(tmp_path):
    root = tmp_path / "tree"
    lst = write_list(tmp_path / "x.lst", write_pack_tree(root, [f"id{i}" for i in range(6)], 10))
    prefix = tmp_path / "out" / "x"
    flags = "--shard-records 17 --sha256 --workers 1 --quiet".split()
    args = [sys.executable, "-m", "rectool", "pack", str(lst), str(root), str(prefix), *flags]
    env = {**os.environ, "RECTOOL_TEST_FAULT": "SIGKILL:40"}
    killed = subprocess.run(args, env=env, capture_output=True)
    assert killed.returncode == -9
    assert any(prefix.parent.glob("*.partial"))
    done = subprocess.run([*args, "--resume"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads((prefix.parent / "x.manifest.json").read_text())
    assert doc["format_version"] == 3 and len(doc["shards"]) == 4
    for n, entry in enumerate(doc["shards"]):
        stem = prefix.parent / f"x-{n:05d}"
        rec = Path(f"{stem}.rec").read_bytes()
        for file, path in (
            ("rec", f"{stem}.rec"),
            ("idx", f"{stem}.idx"),
            ("crc", f"{stem}.rec.crc"),
        ):
            data = Path(path).read_bytes()
            assert entry[f"{file}_xxh3_128"] == xxhash.xxh3_128_hexdigest(data), (n, file)
            assert entry[f"{file}_sha256"] == hashlib.sha256(data).hexdigest(), (n, file)
        crc = Path(f"{stem}.rec.crc").read_bytes()
        offsets = [o for _, o in idx_lines(Path(f"{stem}.idx"))]
        assert struct.unpack_from("<8sIIQ", crc) == (b"RTXXH64\n", 2, 0, len(offsets))
        for i, (start, end) in enumerate(zip(offsets, [*offsets[1:], len(rec)])):
            expected = (start, end - start, xxhash.xxh3_64_intdigest(rec[start:end]))
            assert struct.unpack_from("<QIQ", crc, 24 + 20 * i) == expected, (n, i)
    assert verify_dataset(prefix.parent / "x.manifest.json").sound
    # The same manifest as an uninterrupted pack (its options and digests alike).
    again = PackOptions(shard_records=17, sha256=True, workers=1)
    pack_images(lst, root, tmp_path / "ref" / "x", again)
    reference = json.loads((tmp_path / "ref" / "x.manifest.json").read_text())
    assert doc["shards"] == reference["shards"]
    assert doc["index"] == reference["index"]  # the same binary index, byte for byte


def test_the_emitted_reader_opens_a_version_3_pack_without_xxhash(small_pack, tmp_path):
    """The emitted reader reads format 3 and refuses an older pack, naming `rectool index`; it
    verifies nothing, so it needs neither xxhash nor rectool."""
    from rectool import emit

    module = tmp_path / "standalone_reader.py"
    emit.emit_reader(module)
    script = f"""
import sys
sys.modules["rectool"] = None
sys.modules["xxhash"] = None  # `import xxhash` now raises ImportError
sys.path.insert(0, {str(tmp_path)!r})
import standalone_reader as r
print(r.read_manifest({str(small_pack.manifest)!r})["format_version"])
print(len(r.open_dataset({str(small_pack.manifest)!r})))
try:
    r.open_dataset({str(V1_PACK / "faces.manifest.json")!r})
except r.NotIndexedError as exc:
    print("refused", "rectool index" in str(exc))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "12", "refused", "True"]
