"""Hostile and odd archives, stdin lists and job arrays (helper Z2's pass over issue 36).

Each test is a finding: an archive member that was read as something it is not, or a surface
checked to hold. Archives are built in memory, byte by byte where `tarfile`/`zipfile` cannot
write the hostile form.
"""

from __future__ import annotations

import io
import json
import tarfile
import zipfile

from click.testing import CliRunner
from helpers.image_files import jpeg_bytes, write_list

from rectool.cli import cli

BLOCK = 512


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def tar_bytes(members, fmt=tarfile.PAX_FORMAT):
    """Return a tar of `members`: (name, data, TarInfo fields to set)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data, fields in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for key, value in fields.items():
                setattr(info, key, value)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def zip_bytes(members):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in members:
            archive.writestr(name, data)
    return bytearray(out.getvalue())


def listed(tmp_path, archive):
    """Run `list ARCHIVE`; return (the result, the list's paths)."""
    lst = tmp_path / "listed.lst"
    result = invoke("list", archive, lst)
    paths = [line.split("\t")[-1] for line in lst.read_text().splitlines()] if lst.exists() else []
    return result, paths


def pack_refusals(tmp_path, archive, paths):
    """Pack a list naming `paths` from `archive` with --json; return (exit, {path: reason})."""
    lst = write_list(tmp_path / "given.lst", [(i, i, p) for i, p in enumerate(paths)])
    out = tmp_path / "out" / "p"
    result = invoke("pack", lst, archive, out, "--json", "--max-failures", "100%")
    json.loads(result.stdout)  # one JSON document on stdout
    failures = out.with_name("p.failures.jsonl")
    lines = failures.read_text().splitlines() if failures.exists() else []
    return result.exit_code, {
        json.loads(line)["path"]: json.loads(line)["reason"] for line in lines
    }


# -- zip: the central directory and the local headers disagree --------------------------


def test_a_zip_whose_local_header_names_another_file_is_refused(tmp_path):
    # A streaming extractor (reading local headers) would write bob/x.jpg, the directory says
    # bob/b.jpg: which bytes a list's path stands for depends on the tool. `zipfile` refuses
    # such a member; rectool indexed it silently by the directory's name.
    data = zip_bytes([("alice/a.jpg", jpeg_bytes(1)), ("bob/b.jpg", jpeg_bytes(2))])
    at = data.index(b"bob/b.jpg")  # the first is the local header's
    data[at : at + 9] = b"bob/x.jpg"
    archive = tmp_path / "a.zip"
    archive.write_bytes(bytes(data))
    result, _ = listed(tmp_path, archive)
    assert result.exit_code == 2, result.output
    assert "'bob/b.jpg'" in result.stderr and "'bob/x.jpg'" in result.stderr
    assert "local header" in result.stderr and "Traceback" not in result.output


def test_a_zip_whose_headers_agree_is_still_read(tmp_path):
    data = zip_bytes([("alice/é.jpg", jpeg_bytes(1)), ("bob/" + "b" * 300 + ".jpg", jpeg_bytes(2))])
    archive = tmp_path / "a.zip"
    archive.write_bytes(bytes(data))
    result, paths = listed(tmp_path, archive)
    assert result.exit_code == 0, result.output
    assert sorted(paths) == ["alice/é.jpg", "bob/" + "b" * 300 + ".jpg"]
