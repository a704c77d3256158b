"""Hostile archives as ROOT: unsafe and repeated names, links, devices, zip and gzip bombs,
truncated and damaged archives. Each is refused with a clear error naming the member (or, for a
link or device the list names, a refusal naming it), in bounded memory and time, and nothing is
written outside OUT_PREFIX."""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import tarfile
import zipfile

import pytest
from click.testing import CliRunner
from helpers.image_files import jpeg_bytes, write_list

from rectool.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def tar_bytes(members, fmt=tarfile.GNU_FORMAT):
    """Return a tar holding `members`: (TarInfo fields as a dict, data or None)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for fields, data in members:
            info = tarfile.TarInfo(fields.pop("name"))
            for key, value in fields.items():
                setattr(info, key, value)
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def image(name, seed=1):
    return {"name": name}, jpeg_bytes(seed)


def written(folder):
    """Return every path under folder (relative), to see what a refused run left."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def refused_whole(tmp_path, archive, member):
    """`list` and `pack` of `archive` both exit 2 naming `member`, and write nothing."""
    before = written(tmp_path)
    listed = invoke("list", archive, tmp_path / "x.lst")
    assert listed.exit_code == 2, listed.output
    assert member in listed.stderr and "Traceback" not in listed.output
    lst = write_list(tmp_path / "given.lst", [(0, 0, "alice/a.jpg")])
    packed = invoke("pack", lst, archive, tmp_path / "out" / "p")
    assert packed.exit_code == 2, packed.output
    assert member in packed.stderr
    assert_only_out(tmp_path, before)
    return listed.stderr


def assert_only_out(tmp_path, before):
    """Assert that a run wrote nothing but the list given and OUT_PREFIX's folder and files."""
    new = set(written(tmp_path)) - set(before) - {"given.lst"}
    assert all(path == "out" or path.startswith("out/p.") for path in new), new


@pytest.mark.parametrize(
    "name, why",
    [
        ("../evil.jpg", "'..'"),
        ("alice/../../evil.jpg", "'..'"),
        ("/etc/evil.jpg", "absolute name"),
        ("alice//a.jpg", "empty part"),
    ],
)
def test_an_unsafe_member_name_refuses_the_archive(tmp_path, name, why):
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes([image("alice/a.jpg"), image(name, 2)]))
    assert why in refused_whole(tmp_path, archive, name)


def test_an_unsafe_name_in_a_zip_or_a_pax_header_refuses_the_archive(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("alice/a.jpg", jpeg_bytes(1))
        z.writestr("../evil.jpg", jpeg_bytes(2))
    refused_whole(tmp_path, archive, "../evil.jpg")
    pax = tmp_path / "pax.tar"
    long = "alice/" + "x" * 120 + "/../../../evil.jpg"  # long: in a pax header, not the block
    pax.write_bytes(tar_bytes([image("alice/a.jpg"), image(long)], tarfile.PAX_FORMAT))
    refused_whole(tmp_path, pax, long)


def test_a_member_named_twice_refuses_the_archive(tmp_path):
    archive = tmp_path / "a.tar"
    archive.write_bytes(
        tar_bytes([image("alice/a.jpg"), image("alice/b.jpg"), image("./alice/b.jpg", 3)])
    )
    assert "appears twice" in refused_whole(tmp_path, archive, "alice/b.jpg")


def test_links_and_devices_are_passed_over_by_list_and_refused_by_pack(tmp_path):
    archive = tmp_path / "a.tar"
    archive.write_bytes(
        tar_bytes(
            [
                image("alice/a.jpg"),
                (
                    {"name": "alice/link.jpg", "type": tarfile.SYMTYPE, "linkname": "/etc/passwd"},
                    None,
                ),
                (
                    {"name": "alice/hard.jpg", "type": tarfile.LNKTYPE, "linkname": "alice/a.jpg"},
                    None,
                ),
                (
                    {
                        "name": "alice/dev.jpg",
                        "type": tarfile.CHRTYPE,
                        "devmajor": 1,
                        "devminor": 3,
                    },
                    None,
                ),
                ({"name": "alice/fifo.jpg", "type": tarfile.FIFOTYPE}, None),
            ]
        )
    )
    listed = invoke("list", archive, tmp_path / "a.lst", "--json")
    assert listed.exit_code == 0, listed.output
    summary = json.loads(listed.stdout)
    assert summary["skipped"]["not_regular"] == 4
    assert (tmp_path / "a.lst").read_text() == "0\t0\talice/a.jpg\n"
    names = ["alice/a.jpg", "alice/link.jpg", "alice/hard.jpg", "alice/dev.jpg", "alice/fifo.jpg"]
    lst = write_list(tmp_path / "all.lst", [(i, 0, n) for i, n in enumerate(names)])
    packed = invoke("pack", lst, archive, tmp_path / "out" / "p", "--max-failures", "4")
    assert packed.exit_code == 0, packed.output
    refusals = [
        json.loads(x) for x in (tmp_path / "out" / "p.failures.jsonl").read_text().splitlines()
    ]
    assert [(r["path"], r["reason"].split(" member")[0]) for r in refusals] == [
        ("alice/link.jpg", "not a regular file (a symbolic link"),
        ("alice/hard.jpg", "not a regular file (a hard link"),
        ("alice/dev.jpg", "not a regular file (a device"),
        ("alice/fifo.jpg", "not a regular file (a FIFO"),
    ]
    assert not (tmp_path / "etc").exists()


def test_a_zip_symlink_member_is_not_followed(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("alice/a.jpg", jpeg_bytes(1))
        link = zipfile.ZipInfo("alice/link.jpg")
        link.create_system = 3
        link.external_attr = 0o120777 << 16
        z.writestr(link, "/etc/passwd")
    lst = write_list(tmp_path / "x.lst", [(0, 0, "alice/a.jpg"), (1, 0, "alice/link.jpg")])
    packed = invoke("pack", lst, archive, tmp_path / "out" / "p", "--max-failures", "1")
    assert packed.exit_code == 0, packed.output
    assert "a symbolic link member" in (tmp_path / "out" / "p.failures.jsonl").read_text()


def test_a_zip_bomb_by_its_declared_ratio_refuses_the_archive(tmp_path):
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("alice/a.jpg", jpeg_bytes(1))
        z.writestr("alice/zeros.jpg", bytes(8 << 20))  # 8 MiB in about 8 KB
    assert "zip bomb" in refused_whole(tmp_path, archive, "alice/zeros.jpg")


def test_zip_members_sharing_their_data_refuse_the_archive(tmp_path):
    archive = tmp_path / "overlap.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        z.writestr("alice/a.jpg", jpeg_bytes(1))
        z.writestr("alice/b.jpg", jpeg_bytes(2))
    data = bytearray(archive.read_bytes())
    # Point the second central directory entry at the first member's local header.
    second = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, second + 42, 0)
    archive.write_bytes(bytes(data))
    assert "overlaps" in refused_whole(tmp_path, archive, "alice/b.jpg")


def test_a_zip_member_inflating_past_its_declared_size_is_refused(tmp_path):
    archive = tmp_path / "liar.zip"
    real = jpeg_bytes(1) + bytes(4000)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("alice/a.jpg", jpeg_bytes(2))
        z.writestr("alice/b.jpg", real)
    data = bytearray(archive.read_bytes())
    # Declare 100 bytes in the central directory (offset 24: uncompressed size).
    second = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, second + 24, 100)
    archive.write_bytes(bytes(data))
    lst = write_list(tmp_path / "x.lst", [(0, 0, "alice/a.jpg"), (1, 0, "alice/b.jpg")])
    packed = invoke("pack", lst, archive, tmp_path / "out" / "p", "--max-failures", "1")
    assert packed.exit_code == 0, packed.output
    (line,) = (tmp_path / "out" / "p.failures.jsonl").read_text().splitlines()
    assert json.loads(line)["path"] == "alice/b.jpg"
    assert "decompresses past the size the archive declares" in json.loads(line)["reason"]


def test_a_gzip_bomb_is_refused_as_it_shows(tmp_path, monkeypatch):
    from rectool.archives import compressed

    # The bound scaled down: 1 MiB out, then at most 100 times what was read.
    monkeypatch.setattr(compressed, "BOMB_FLOOR", 1 << 20)
    archive = tmp_path / "bomb.tar.gz"
    inner = tar_bytes([image("alice/a.jpg"), ({"name": "alice/zeros.bin"}, bytes(32 << 20))])
    archive.write_bytes(gzip.compress(inner, 9))
    assert archive.stat().st_size < 100_000
    before = written(tmp_path)
    listed = invoke("list", archive, tmp_path / "x.lst")
    assert listed.exit_code == 2
    assert "gzip bomb" in listed.stderr and "alice/zeros.bin" in listed.stderr
    lst = write_list(tmp_path / "given.lst", [(0, 0, "alice/a.jpg"), (1, 0, "alice/b.jpg")])
    packed = invoke("pack", lst, archive, tmp_path / "out" / "p", "--max-failures", "1")
    assert packed.exit_code == 2 and "gzip bomb" in packed.stderr
    assert not (tmp_path / "out" / "p.manifest.json").exists()
    assert_only_out(tmp_path, before)


def _two_images_tar():
    return tar_bytes([image("alice/a.jpg"), image("alice/b.jpg", 2)])


def test_a_truncated_tar_is_refused_naming_the_member(tmp_path):
    data = _two_images_tar()
    archive = tmp_path / "cut.tar"
    header = data.find(b"alice/b.jpg")
    archive.write_bytes(data[: header + 512 + 100])  # inside alice/b.jpg's data
    message = refused_whole(tmp_path, archive, "alice/b.jpg")
    assert "truncated" in message


def test_a_tar_without_its_end_block_is_truncated(tmp_path):
    data = _two_images_tar()
    # Cut where the end-of-archive blocks start: every member whole, the end missing.
    end = data.rfind(jpeg_bytes(2)) + len(jpeg_bytes(2))
    archive = tmp_path / "cut.tar"
    archive.write_bytes(data[: (end + 511) // 512 * 512])
    assert "end-of-archive" in refused_whole(tmp_path, archive, "alice/b.jpg")


def test_a_truncated_tar_gz_stops_the_pack_naming_where(tmp_path):
    archive = tmp_path / "cut.tar.gz"
    archive.write_bytes(gzip.compress(_two_images_tar())[:-200])
    listed = invoke("list", archive, tmp_path / "x.lst")
    assert listed.exit_code == 2 and "truncated" in listed.stderr
    lst = write_list(tmp_path / "x2.lst", [(0, 0, "alice/a.jpg"), (1, 0, "alice/b.jpg")])
    packed = invoke("pack", lst, archive, tmp_path / "out" / "p")
    assert packed.exit_code == 2 and "truncated" in packed.stderr
    assert not (tmp_path / "out" / "p.manifest.json").exists()


def test_a_damaged_header_is_refused_by_its_checksum(tmp_path):
    data = bytearray(_two_images_tar())
    second = data.find(b"alice/b.jpg")
    data[second + 100] ^= 0xFF  # inside the header, not the name
    archive = tmp_path / "bad.tar"
    archive.write_bytes(bytes(data))
    assert "checksum" in refused_whole(tmp_path, archive, "alice/a.jpg")


def test_a_huge_declared_size_is_refused_at_once(tmp_path):
    data = bytearray(_two_images_tar())
    header = data.find(b"alice/b.jpg")
    # 8 GiB, base-256 (GNU), checksum recomputed: a header that is sound but lies.
    data[header + 124 : header + 136] = b"\x80" + (8 << 30).to_bytes(11, "big")
    data[header + 148 : header + 156] = b" " * 8
    data[header + 148 : header + 156] = b"%06o\0 " % sum(data[header : header + 512])
    archive = tmp_path / "liar.tar"
    archive.write_bytes(bytes(data))
    assert "run past the end" in refused_whole(tmp_path, archive, "alice/b.jpg")


def test_an_oversized_pax_header_is_refused(tmp_path):
    data = tar_bytes([image("alice/a.jpg")], tarfile.PAX_FORMAT)
    pax = tarfile.TarInfo("alice/b.jpg")
    pax.pax_headers = {"comment": "x" * (2 << 20)}
    body = jpeg_bytes(2)
    pax.size = len(body)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(pax, io.BytesIO(body))
    archive = tmp_path / "pax.tar"
    archive.write_bytes(out.getvalue())
    del data
    listed = invoke("list", archive, tmp_path / "x.lst")
    assert listed.exit_code == 2 and "extended header" in listed.stderr


def test_a_file_that_is_no_archive_under_an_archive_name_is_refused(tmp_path):
    for name, message in [
        ("a.tar", "damaged, or no tar"),
        ("a.zip", "not a readable zip"),
        ("a.tar.gz", "not a gzip file"),
    ]:
        (tmp_path / name).write_bytes(b"\x89PNG" + os.urandom(2000))
        listed = invoke("list", tmp_path / name, tmp_path / "x.lst")
        assert listed.exit_code == 2, (name, listed.output)
        assert message in listed.stderr, (name, listed.stderr)


def test_a_damaged_zip_member_is_refused_by_its_crc(tmp_path):
    archive = tmp_path / "crc.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        z.writestr("alice/a.jpg", jpeg_bytes(1))
        z.writestr("alice/b.jpg", jpeg_bytes(2))
    data = bytearray(archive.read_bytes())
    at = data.find(jpeg_bytes(2)) + 50
    data[at] ^= 0xFF
    archive.write_bytes(bytes(data))
    lst = write_list(tmp_path / "x.lst", [(0, 0, "alice/a.jpg"), (1, 0, "alice/b.jpg")])
    packed = invoke("pack", lst, archive, tmp_path / "out" / "p", "--max-failures", "1")
    assert packed.exit_code == 0, packed.output
    (line,) = (tmp_path / "out" / "p.failures.jsonl").read_text().splitlines()
    assert json.loads(line)["path"] == "alice/b.jpg"
    assert "CRC-32" in json.loads(line)["reason"]


def test_a_stored_zip_member_whose_sizes_differ_is_refused(tmp_path):
    archive = tmp_path / "sizes.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        z.writestr("alice/a.jpg", jpeg_bytes(1))
        z.writestr("alice/b.jpg", jpeg_bytes(2))
    data = bytearray(archive.read_bytes())
    second = data.rfind(b"PK\x01\x02")
    size = struct.unpack_from("<I", data, second + 24)[0]
    struct.pack_into("<I", data, second + 24, size - 10)  # declared: 10 bytes fewer than stored
    archive.write_bytes(bytes(data))
    lst = write_list(tmp_path / "x.lst", [(0, 0, "alice/a.jpg"), (1, 0, "alice/b.jpg")])
    packed = invoke("pack", lst, archive, tmp_path / "out" / "p", "--max-failures", "1")
    assert packed.exit_code == 0, packed.output
    (line,) = (tmp_path / "out" / "p.failures.jsonl").read_text().splitlines()
    assert json.loads(line)["path"] == "alice/b.jpg"
    assert "two sizes differ" in json.loads(line)["reason"]
