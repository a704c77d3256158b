"""Hostile and odd archives, stdin lists and job arrays (helper Z2's pass over issue 36).

Each test is a finding: an archive member that was read as something it is not, or a surface
checked to hold. Archives are built in memory, byte by byte where `tarfile`/`zipfile` cannot
write the hostile form.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zipfile

import pytest
from click.testing import CliRunner
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree

from rectool.cli import cli
from rectool.doors.faults import set_fault_hook
from rectool.doors.output import OutputLock
from rectool.format.paths import PackPaths

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


# -- an encrypted zip member ------------------------------------------------------------


def test_an_encrypted_zip_member_is_refused_as_encrypted(tmp_path):
    data = zip_bytes([("alice/a.jpg", jpeg_bytes(1)), ("bob/b.jpg", jpeg_bytes(2))])
    local = data.index(b"PK\x03\x04", 4)
    central = data.index(b"PK\x01\x02", data.index(b"PK\x01\x02") + 4)
    data[local + 6] |= 1  # general purpose flag: encrypted
    data[central + 8] |= 1
    archive = tmp_path / "a.zip"
    archive.write_bytes(bytes(data))
    result, paths = listed(tmp_path, archive)
    assert result.exit_code == 0 and paths == ["alice/a.jpg"], result.output
    assert "bob/b.jpg" in result.stderr  # passed over by name
    status, refused = pack_refusals(tmp_path, archive, ["alice/a.jpg", "bob/b.jpg"])
    assert status == 0 and list(refused) == ["bob/b.jpg"]
    assert "encrypted" in refused["bob/b.jpg"]


# -- tar: GNU sparse members ------------------------------------------------------------


def pax_sparse_tar():
    """A tar as `tar --sparse --format=pax` writes it (GNU sparse 1.0): the header's path is a
    placeholder, the real name in GNU.sparse.name, and the data starts with the hole map."""
    image = jpeg_bytes(2)
    stored = b"1\n0\n%d\n" % len(image)
    stored = stored.ljust(BLOCK, b"\0") + image
    sparse = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": "bob/b.jpg",
        "GNU.sparse.realsize": str(len(image)),
    }
    return tar_bytes(
        [
            ("alice/a.jpg", jpeg_bytes(1), {}),
            ("bob/GNUSparseFile.0/b.jpg", stored, {"pax_headers": sparse}),
        ]
    )


def test_a_pax_sparse_member_is_passed_over_by_its_real_name(tmp_path):
    # It was listed as bob/GNUSparseFile.0/b.jpg (a name no extracted tree has), and packing
    # it read the hole map as the image's first bytes.
    archive = tmp_path / "a.tar"
    archive.write_bytes(pax_sparse_tar())
    result, paths = listed(tmp_path, archive)
    assert result.exit_code == 0 and paths == ["alice/a.jpg"], result.output
    assert "bob/b.jpg" in result.stderr and "GNUSparseFile" not in result.output
    status, refused = pack_refusals(tmp_path, archive, ["alice/a.jpg", "bob/b.jpg"])
    assert status == 0 and list(refused) == ["bob/b.jpg"]
    assert "sparse" in refused["bob/b.jpg"]


def test_an_old_pax_sparse_member_is_not_read_without_its_holes(tmp_path):
    # GNU sparse 0.1 keeps the real name in `path`: the stored bytes (holes dropped) were
    # packed as the image.
    image = jpeg_bytes(2)
    sparse = {"GNU.sparse.size": str(len(image) + 4096), "GNU.sparse.map": f"0,{len(image)}"}
    archive = tmp_path / "a.tar"
    archive.write_bytes(
        tar_bytes(
            [("alice/a.jpg", jpeg_bytes(1), {}), ("bob/b.jpg", image, {"pax_headers": sparse})]
        )
    )
    status, refused = pack_refusals(tmp_path, archive, ["alice/a.jpg", "bob/b.jpg"])
    assert status == 0 and list(refused) == ["bob/b.jpg"]
    assert "sparse" in refused["bob/b.jpg"]


def padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _header(info: tarfile.TarInfo, extended: bool) -> bytes:
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    block[482] = 1 if extended else 0  # isextended: the map goes on in the next block
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def test_an_old_gnu_sparse_member_with_a_long_map_does_not_break_the_walk(tmp_path):
    # `tar --sparse --format=gnu` of a file with more than four holes writes the map on in
    # extension blocks after the header; the walk took them for data and met the next
    # header one block early: the whole archive was refused as damaged.
    image = jpeg_bytes(2)
    info = tarfile.TarInfo("bob/b.jpg")
    info.type = tarfile.GNUTYPE_SPARSE
    info.size = len(image)
    extension = bytes(BLOCK)  # an empty map entry, byte 504 = 0: the last extension block
    sparse = _header(info, True) + extension + image.ljust(padded(len(image)), b"\0")
    alice = jpeg_bytes(1)
    head = tar_bytes([("alice/a.jpg", alice, {})], fmt=tarfile.GNU_FORMAT)
    first = head[: BLOCK + padded(len(alice))]  # without its end blocks
    tail = tar_bytes([("carol/c.jpg", jpeg_bytes(3), {})], fmt=tarfile.GNU_FORMAT)
    archive = tmp_path / "a.tar"
    archive.write_bytes(first + sparse + tail)
    result, paths = listed(tmp_path, archive)
    assert result.exit_code == 0, result.output
    assert paths == ["alice/a.jpg", "carol/c.jpg"]
    assert "bob/b.jpg" in result.stderr
    status, refused = pack_refusals(tmp_path, archive, ["alice/a.jpg", "bob/b.jpg", "carol/c.jpg"])
    assert status == 0 and list(refused) == ["bob/b.jpg"]
    assert "sparse" in refused["bob/b.jpg"]


def test_a_pax_sparse_member_in_a_tar_gz_is_refused_as_it_streams(tmp_path):
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(gzip.compress(pax_sparse_tar()))
    status, refused = pack_refusals(tmp_path, archive, ["alice/a.jpg", "bob/b.jpg"])
    assert status == 0 and list(refused) == ["bob/b.jpg"]
    assert "sparse" in refused["bob/b.jpg"]


# -- tar: sizes that are no sizes ---------------------------------------------------------


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
@pytest.mark.parametrize("size", ["-1536", "+10", "1_0"])
def test_a_pax_size_that_is_not_decimal_digits_refuses_the_archive(tmp_path, suffix, size):
    # int() read them all: in a .tar.gz, "-1536" read the stream backwards and packed the
    # image with a kilobyte of what followed it, exit 0; in a .tar, "appears twice".
    data = tar_bytes(
        [
            ("alice/a.jpg", jpeg_bytes(1), {}),
            ("bob/b.jpg", jpeg_bytes(2), {"pax_headers": {"size": size}}),
        ]
    )
    archive = tmp_path / f"a{suffix}"
    archive.write_bytes(gzip.compress(data) if suffix == ".tar.gz" else data)
    lst = write_list(tmp_path / "given.lst", [(0, 0, "alice/a.jpg"), (1, 1, "bob/b.jpg")])
    for result in (
        invoke("list", archive, tmp_path / "x.lst"),
        invoke("pack", lst, archive, tmp_path / "out" / "p"),
    ):
        assert result.exit_code == 2, result.output
        assert f"member 'bob/b.jpg': a damaged pax size ({size!r})" in result.stderr


def test_a_huge_size_in_a_tar_gz_is_refused_not_a_traceback(tmp_path):
    # A base-256 size past 2**63 overflowed the index's offsets while listing a stream (no
    # file size bounds it there): an OverflowError traceback.
    info = tarfile.TarInfo("bob/b.jpg")
    block = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    block[124:136] = b"\x80" + (1 << 70).to_bytes(11, "big")
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(gzip.compress(bytes(block) + bytes(4 * BLOCK)))
    result = invoke("list", archive, tmp_path / "x.lst")
    assert result.exit_code == 2, result.output
    assert "member 'bob/b.jpg' declares 1,180,591,620,717,411,303,424 bytes" in result.stderr


# -- webdataset: a shard pattern is bounded as a whole ------------------------------------


@pytest.mark.parametrize(
    "pattern",
    ["x-{0..999999}{0..999999}.tar", "x-" + "{a,b}" * 30 + ".tar", "{0..99}{0..99}{0..99}{0..99}"],
)
def test_a_shard_pattern_expanding_past_a_million_names_is_refused_at_once(
    tmp_path, alarm, pattern
):
    # Each brace was bounded, not their product: 10**12 names (2**30, 10**8) were expanded in
    # memory, and `list` never came back.
    alarm(60)  # a guard against the hang, not a timing
    result = invoke("list", f"{tmp_path}/{pattern}", tmp_path / "x.lst")
    assert result.exit_code == 2, result.output
    assert "expands to over 1,000,000 shard names" in result.stderr


# -- job arrays: --finalize takes only shards of the plan it finalizes -----------------------


def job_tree(tmp_path):
    """A tree of 6 images and two lists of it: faces.lst (5 lines) and other.lst (5 others)."""
    root = tmp_path / "faces"
    items = write_pack_tree(root, ["a", "b", "c"], 2)
    lst = write_list(tmp_path / "faces.lst", items[:5])
    other = write_list(
        tmp_path / "other.lst", [(i, label, p) for i, (_, label, p) in enumerate(items[1:])]
    )
    return root, lst, other


def shard_task(lst, root, prefix, number, *flags, records=3):
    result = invoke(
        "pack", lst, root, prefix, "--shard-records", records, "--only-shard", number, "-q", *flags
    )
    assert result.exit_code == 0, result.output
    return result


def finalize(lst, root, prefix):
    return invoke("pack", lst, root, prefix, "--shard-records", 3, "--finalize", "--json")


def refused_finalize(lst, root, prefix, *words):
    """`--finalize` exits 1 naming each of `words`, as one JSON document, and writes no manifest."""
    result = finalize(lst, root, prefix)
    assert result.exit_code == 1, result.output
    error = json.loads(result.stdout)["error"]
    assert all(word in error for word in words), error
    assert not prefix.with_name("f.manifest.json").exists()
    return error


def test_finalize_refuses_a_shard_packed_from_another_list(tmp_path):
    # Shard 1 packed from other.lst: finalize took its images as faces.lst's, wrote a manifest
    # naming faces.lst's digest, and verify called the pack sound.
    root, lst, other = job_tree(tmp_path)
    prefix = tmp_path / "out" / "f"
    shard_task(lst, root, prefix, 0)
    shard_task(other, root, prefix, 1)
    refused_finalize(
        lst, root, prefix, "f-00001.plan.json", "shard 1", "list_sha256", "--overwrite"
    )


def test_finalize_refuses_a_shard_packed_with_other_shard_records(tmp_path):
    # Shard 1 planned with --shard-records 4 holds line 5 only: line 4 was in no shard, and
    # the finalized pack dropped it without a refusal.
    root, lst, _ = job_tree(tmp_path)
    prefix = tmp_path / "out" / "f"
    shard_task(lst, root, prefix, 0)
    shard_task(lst, root, prefix, 1, records=4)
    refused_finalize(lst, root, prefix, "shard 1", "shard_records 4, not 3")


def replace_shard(prefix, source, target):
    for suffix in (".rec", ".idx", ".rec.crc"):
        data = prefix.with_name(f"f-0000{source}{suffix}").read_bytes()
        prefix.with_name(f"f-0000{target}{suffix}").write_bytes(data)


def test_finalize_refuses_a_shard_replaced_after_its_task_ended(tmp_path):
    # 7 images, 3 a shard: shards 0 and 1 hold 3 records each, shard 2 one. Shard 0's files
    # copied over shard 1's (as many records) made a manifest verify then called broken
    # (every key twice); over shard 2's, one with more records than lines planned.
    root = tmp_path / "faces"
    lst = write_list(tmp_path / "faces.lst", write_pack_tree(root, ["a", "b", "c", "d"], 2)[:7])
    for target in (1, 2):
        prefix = tmp_path / f"out{target}" / "f"
        for number in (0, 1, 2):
            shard_task(lst, root, prefix, number)
        replace_shard(prefix, 0, target)
        refused_finalize(
            lst, root, prefix, f"f-0000{target}.plan.json", f"shard {target}'s .rec", "replaced"
        )


def test_finalize_counts_the_records_of_a_shard_its_task_did_not_describe(tmp_path):
    # A plan file that does not record the files its task wrote (an older rectool's): the
    # records and refusals must still be the lines planned.
    root, lst, _ = job_tree(tmp_path)
    prefix = tmp_path / "out" / "f"
    shard_task(lst, root, prefix, 0)
    shard_task(lst, root, prefix, 1)
    replace_shard(prefix, 0, 1)  # shard 0's 3 records where shard 1's 2 were
    plan = prefix.with_name("f-00001.plan.json")
    document = json.loads(plan.read_text())
    del document["packed"]
    plan.write_text(json.dumps(document))
    refused_finalize(lst, root, prefix, "f-00001.rec", "3 records", "2 list lines")


def test_finalize_refuses_a_shard_without_its_plan_file(tmp_path):
    root, lst, _ = job_tree(tmp_path)
    prefix = tmp_path / "out" / "f"
    shard_task(lst, root, prefix, 0)
    shard_task(lst, root, prefix, 1)
    prefix.with_name("f-00001.plan.json").unlink()
    refused_finalize(lst, root, prefix, "f-00001.plan.json", "no plan file")


def test_shard_tasks_run_twice_out_of_order_and_killed_give_the_one_run_pack(tmp_path):
    root, lst, _ = job_tree(tmp_path)
    whole = tmp_path / "whole" / "f"
    assert invoke("pack", lst, root, whole, "--shard-records", 3, "-q").exit_code == 0
    prefix = tmp_path / "out" / "f"

    def die(step, path):
        if step == "rename" and "f-00000" in path:
            raise OSError(28, "No space left on device", path)

    set_fault_hook(die)
    try:
        killed = invoke("pack", lst, root, prefix, "--shard-records", 3, "--only-shard", 0)
    finally:
        set_fault_hook(None)
    assert killed.exit_code != 0 and not prefix.with_name("f-00000.rec").exists()
    shard_task(lst, root, prefix, 1)
    shard_task(lst, root, prefix, 1, "--resume")  # run twice: changes nothing
    shard_task(lst, root, prefix, 0, "--resume")  # the killed task again
    assert finalize(lst, root, prefix).exit_code == 0
    for name in ("f-00000.rec", "f-00000.idx", "f-00001.rec", "f-00001.idx", "f.failures.jsonl"):
        assert prefix.with_name(name).read_bytes() == whole.with_name(name).read_bytes(), name
    assert not list(prefix.parent.glob("*.plan.json"))


def test_a_resumed_task_refuses_a_complete_shard_of_another_plan(tmp_path):
    # `--resume` of a complete shard described it and exited 0 ("Packed shard 1 of 3") even
    # when another list or --shard-records had packed it; a whole pack refuses the same.
    root, lst, other = job_tree(tmp_path)
    prefix = tmp_path / "out" / "f"
    shard_task(lst, root, prefix, 1)
    for given, records, word in ((other, 3, "list_sha256"), (lst, 2, "shard_records 3, not 2")):
        result = invoke(
            "pack", given, root, prefix, "--shard-records", records, "--only-shard", 1,
            "--resume", "--json",
        )  # fmt: skip
        assert result.exit_code == 1, result.output
        error = json.loads(result.stdout)["error"]
        assert "f-00001.plan.json" in error and word in error, error
    shard_task(lst, root, prefix, 1, "--resume")  # its own plan: still nothing to do


def test_an_array_resubmitted_after_finalize_changes_nothing(tmp_path):
    # The docs call re-submitting the whole array safe; after --finalize a task with
    # --resume packed its shard again, said "Run --finalize once every shard is packed" and
    # left its plan and failures files in the finished pack.
    root, lst, other = job_tree(tmp_path)
    prefix = tmp_path / "out" / "f"
    for number in (0, 1):
        shard_task(lst, root, prefix, number)
    assert finalize(lst, root, prefix).exit_code == 0
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in prefix.parent.iterdir()}
    again = shard_task(lst, root, prefix, 1, "--resume", "--json")
    assert json.loads(again.stdout)["outcome"] == "complete"
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in prefix.parent.iterdir()}
    assert after == before
    result = invoke(
        "pack", other, root, prefix, "--shard-records", 3, "--only-shard", 1, "--resume",
    )  # fmt: skip
    assert result.exit_code == 1 and "the list differs" in result.stderr, result.output
    assert {p.name for p in prefix.parent.iterdir()} == set(before)


# -- stdin: a list on standard input is the same list as in a file ---------------------------

GOOD = b"0\t0\ta/000.jpg\n1\t0\ta/001.jpg\n2\t1\tb/000.jpg\n3\t1\tb/001.jpg\n"


@pytest.mark.parametrize(
    "data",
    [
        GOOD.replace(b"\n", b"\r\n"),  # CRLF
        GOOD[:-1],  # no newline at the end
        GOOD[:-5],  # cut mid-line (a producer killed): its path names no image
        b"\xef\xbb\xbf" + GOOD,  # a BOM
        GOOD[:20] + b"\0" + GOOD[20:],  # a NUL
        GOOD + b"4\t1\tb/" + b"x" * 70_000 + b".jpg\n",  # a line over 64 KiB
        GOOD + b"\xff\n",  # not UTF-8
    ],
    ids=["crlf", "no-final-newline", "cut", "bom", "nul", "long-line", "not-utf8"],
)
def test_a_list_on_stdin_packs_as_the_same_list_in_a_file(tmp_path, data):
    root = tmp_path / "faces"
    write_pack_tree(root, ["a", "b"], 2)
    lst = tmp_path / "faces.lst"
    lst.write_bytes(data)
    outcomes = []
    for given, stdin in ((lst, None), ("-", data)):
        prefix = tmp_path / f"out-{'file' if stdin is None else 'stdin'}" / "f"
        result = CliRunner().invoke(
            cli, ["pack", str(given), str(root), str(prefix), "--json"], input=stdin
        )
        document = json.loads(result.stdout)
        error = document.get("error", "").replace(str(lst), "LIST")
        error = error.replace("standard input", "LIST")
        rec = prefix.with_name("f.rec")
        outcomes.append(
            (result.exit_code, error, document.get("failures"), rec.exists() and rec.read_bytes())
        )
    assert outcomes[0] == outcomes[1]


def test_a_pack_from_stdin_stopped_resumes_from_stdin_to_the_same_bytes(tmp_path):
    root = tmp_path / "faces"
    data = "".join(
        f"{i}\t{label}\t{path}\n" for i, label, path in write_pack_tree(root, ["a", "b", "c"], 3)
    )
    whole = tmp_path / "whole" / "f"
    prefix = tmp_path / "out" / "f"
    flags = ["--shard-records", "3", "--json"]

    def pack(out, text, *more):
        args = ["pack", "-", str(root), str(out), *flags, *more]
        return CliRunner().invoke(cli, args, input=text.encode())

    assert pack(whole, data).exit_code == 0
    shards = 0

    def full_disk(step, path):
        nonlocal shards
        shards += step == "shard"
        if shards == 2:
            raise OSError(28, "No space left on device", path)

    set_fault_hook(full_disk)
    try:
        stopped = pack(prefix, data)
    finally:
        set_fault_hook(None)
    assert stopped.exit_code == 1 and not prefix.with_name("f.manifest.json").exists()
    other = pack(prefix, data.replace("a/000.jpg", "a/001.jpg", 1), "--resume")
    assert other.exit_code == 1 and "the list differs" in json.loads(other.stdout)["error"]
    resumed = pack(prefix, data, "--resume")
    assert resumed.exit_code == 0 and json.loads(resumed.stdout)["resumed_from"] >= 3
    for suffix in ("-00000.rec", "-00001.rec", "-00002.rec", "-00002.idx", ".failures.jsonl"):
        assert (
            prefix.with_name("f" + suffix).read_bytes()
            == whole.with_name("f" + suffix).read_bytes()
        )


def test_finalize_refuses_a_shard_packed_with_other_byte_options(tmp_path):
    # Shard 0 re-encoded with --resize 16, shard 1 passed through: finalized under a manifest
    # saying no transform, and verify --decode called the pack sound.
    root, lst, _ = job_tree(tmp_path)
    prefix = tmp_path / "out" / "f"
    shard_task(lst, root, prefix, 0, "--resize", "16")
    shard_task(lst, root, prefix, 1)
    refused_finalize(lst, root, prefix, "f-00000.plan.json", "shard 0", "other options", "resize")
    again = invoke(
        "pack", lst, root, prefix, "--shard-records", 3, "--only-shard", 0, "--resume",
    )  # fmt: skip
    assert again.exit_code == 1 and "other options" in again.stderr, again.output


def test_two_tasks_on_one_shard_and_finalize_beside_a_task_are_refused_by_name(tmp_path):
    root, lst, _ = job_tree(tmp_path)
    prefix = tmp_path / "out" / "f"
    shard_task(lst, root, prefix, 0)
    paths = PackPaths.of(str(prefix))
    with OutputLock(paths, shared=True), OutputLock(paths.shard(1)):  # a task on shard 1
        twin = invoke(
            "pack", lst, root, prefix, "--shard-records", 3, "--only-shard", 1, "--json",
        )  # fmt: skip
        assert twin.exit_code == 1 and "f-00001.lock" in json.loads(twin.stdout)["error"]
        early = finalize(lst, root, prefix)
        assert early.exit_code == 1 and "f.lock" in json.loads(early.stdout)["error"]
    assert not list(prefix.parent.glob("f-00001*"))
    shard_task(lst, root, prefix, 1)
    assert finalize(lst, root, prefix).exit_code == 0
