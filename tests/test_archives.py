"""An archive as ROOT (`rectool/archives/`): tar, tar.gz, zip and webdataset shards list and pack
as the tree they hold, byte for byte, with every guarantee of a tree."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.image_files import encode, image_array, jpeg_bytes, write_list, write_pack_tree

from rectool.cli import cli

IDENTITIES = ["alice", "bob", "carol"]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def pack_files(prefix):
    """Return the bytes of a pack's shards and binary index, by suffix."""
    folder = prefix.parent
    return {
        p.name[len(prefix.name) :]: p.read_bytes()
        for p in sorted(folder.iterdir())
        if p.name.startswith(prefix.name) and p.suffix in (".rec", ".idx", ".npy")
    }


def tree_files(root):
    """Return (relative path, bytes) of every file under root, in path order."""
    found = []
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = os.path.join(folder, name)
            found.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    return found


def make_tar(path, root, mode="w", fmt=tarfile.GNU_FORMAT, top=None, reverse=False):
    """Write the tree at root as a tar (`mode` "w:gz" for a .tar.gz), inside folder `top`."""
    files = tree_files(root)
    if reverse:
        files.reverse()
    with tarfile.open(path, mode, format=fmt) as tar:
        for rel, full in files:
            tar.add(full, arcname=f"{top}/{rel}" if top else rel)
    return path


def make_zip(path, root, method=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        for rel, full in tree_files(root):
            archive.write(full, rel)
    return path


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, IDENTITIES, 4)
    return root, write_list(tmp_path / "tree.lst", items)


ARCHIVES = {
    "gnu.tar": lambda p, root: make_tar(p, root),
    "pax.tar": lambda p, root: make_tar(p, root, fmt=tarfile.PAX_FORMAT),
    "ustar.tar": lambda p, root: make_tar(p, root, fmt=tarfile.USTAR_FORMAT),
    "top.tar": lambda p, root: make_tar(p, root, top="train"),
    "dot.tar": lambda p, root: make_tar(p, root, top="."),
    "a.tar.gz": lambda p, root: make_tar(p, root, "w:gz"),
    "top.tgz": lambda p, root: make_tar(p, root, "w:gz", top="train"),
    "deflated.zip": lambda p, root: make_zip(p, root),
    "stored.zip": lambda p, root: make_zip(p, root, zipfile.ZIP_STORED),
}


@pytest.mark.parametrize("name", sorted(ARCHIVES))
def test_an_archive_lists_as_the_tree_it_holds(tree, tmp_path, name):
    root, _ = tree
    archive = ARCHIVES[name](tmp_path / name, root)
    assert invoke("list", root, tmp_path / "from-tree.lst").exit_code == 0
    result = invoke("list", archive, tmp_path / "from-archive.lst")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "from-archive.lst").read_bytes() == (tmp_path / "from-tree.lst").read_bytes()
    labels = (tmp_path / "from-archive.labels.tsv").read_bytes()
    assert labels == (tmp_path / "from-tree.labels.tsv").read_bytes()


@pytest.mark.parametrize("name", sorted(ARCHIVES))
def test_a_list_packs_the_tree_and_its_archive_byte_for_byte(tree, tmp_path, name):
    root, lst = tree
    archive = ARCHIVES[name](tmp_path / name, root)
    assert invoke("pack", lst, root, tmp_path / "tree-pack" / "p").exit_code == 0
    result = invoke("pack", lst, archive, tmp_path / "archive-pack" / "p")
    assert result.exit_code == 0, result.output
    expected = pack_files(tmp_path / "tree-pack" / "p")
    assert set(expected) >= {".rec", ".idx", ".offsets.npy", ".keys.npy", ".labels.npy"}
    assert pack_files(tmp_path / "archive-pack" / "p") == expected


@pytest.mark.parametrize("name", ["gnu.tar", "a.tar.gz", "deflated.zip"])
def test_worker_threads_and_re_encoding_read_an_archive_alike(tree, tmp_path, name):
    root, lst = tree
    archive = ARCHIVES[name](tmp_path / name, root)
    options = ["--workers", "3", "--resize", "20", "--quiet"]
    assert invoke("pack", lst, root, tmp_path / "t" / "p", *options).exit_code == 0
    assert invoke("pack", lst, archive, tmp_path / "a" / "p", *options).exit_code == 0
    assert pack_files(tmp_path / "a" / "p") == pack_files(tmp_path / "t" / "p")


def test_a_tar_gz_list_follows_the_archive_and_packs_the_tree_alike(tree, tmp_path):
    root, _ = tree
    archive = make_tar(tmp_path / "r.tar.gz", root, "w:gz", reverse=True)
    assert invoke("list", root, tmp_path / "tree.lst", "--overwrite").exit_code == 0
    assert invoke("list", archive, tmp_path / "gz.lst").exit_code == 0
    tree_lines = (tmp_path / "tree.lst").read_text().splitlines()
    gz_lines = (tmp_path / "gz.lst").read_text().splitlines()
    # The same lines (indices and labels as the tree's), in the archive's (reversed) order.
    assert gz_lines == tree_lines[::-1]
    for where, out in ((root, "t"), (archive, "a")):
        result = invoke("pack", tmp_path / "gz.lst", where, tmp_path / out / "p")
        assert result.exit_code == 0, result.output
    assert pack_files(tmp_path / "a" / "p") == pack_files(tmp_path / "t" / "p")


def test_a_tree_list_packs_an_unsorted_tar_gz_through_the_reorder_buffer(tree, tmp_path):
    root, lst = tree
    archive = make_tar(tmp_path / "r.tar.gz", root, "w:gz", reverse=True)
    assert invoke("pack", lst, root, tmp_path / "t" / "p").exit_code == 0
    assert invoke("pack", lst, archive, tmp_path / "a" / "p").exit_code == 0
    assert pack_files(tmp_path / "a" / "p") == pack_files(tmp_path / "t" / "p")


def test_a_reorder_buffer_that_would_overflow_stops_saying_what_to_do(tree, tmp_path, monkeypatch):
    from rectool.archives import reading

    root, lst = tree
    archive = make_tar(tmp_path / "r.tar.gz", root, "w:gz", reverse=True)
    monkeypatch.setattr(reading, "REORDER_BYTES", 4000)
    result = invoke("pack", lst, archive, tmp_path / "a" / "p")
    assert result.exit_code == 2
    assert "read ahead of the list's order" in result.stderr
    assert "rectool list" in result.stderr and "decompress it to a .tar" in result.stderr
    assert not (tmp_path / "a" / "p.manifest.json").exists()


def test_a_listed_member_the_archive_lacks_is_refused_naming_it(tree, tmp_path):
    root, _ = tree
    archive = make_tar(tmp_path / "a.tar", root)
    lst = write_list(tmp_path / "x.lst", [(0, 0, "alice/000.jpg"), (1, 0, "alice/nope.jpg")])
    result = invoke("pack", lst, archive, tmp_path / "out" / "p", "--max-failures", "1")
    assert result.exit_code == 0, result.output
    (line,) = (tmp_path / "out" / "p.failures.jsonl").read_text().splitlines()
    refusal = json.loads(line)
    assert refusal["path"] == "alice/nope.jpg"
    assert refusal["reason"].startswith("file not found")


@pytest.fixture
def flawed_tree(tmp_path):
    """alice and bob, and three flawed images: empty, damaged, over 100 pixels."""
    root = tmp_path / "flawed"
    big = encode(image_array(7, 20, 20), ".jpg")
    extra = [
        ("bob/empty.jpg", b"", 1),
        ("bob/cut.jpg", jpeg_bytes(3)[:100], 1),
        ("bob/big.jpg", big, 1),
    ]
    items = write_pack_tree(root, ["alice", "bob"], 2, height=8, width=8, extra=extra)
    return root, write_list(tmp_path / "flawed.lst", items)


@pytest.mark.parametrize("name", ["gnu.tar", "a.tar.gz", "deflated.zip"])
def test_refusals_name_the_member_and_max_failures_and_pixels_hold(flawed_tree, tmp_path, name):
    root, lst = flawed_tree
    archive = ARCHIVES[name](tmp_path / name, root)
    runs = {}
    for where in (root, archive):
        prefix = tmp_path / f"out-{where.name}".replace(".", "-") / "p"
        result = invoke("pack", lst, where, prefix, "--max-pixels", "100")
        runs[where.name] = result.exit_code, (prefix.parent / "p.failures.jsonl").read_text()
        assert result.exit_code == 3, result.output  # 3 refused, --max-failures 0
        assert "bob/empty.jpg: empty file" in result.stderr
    assert runs[archive.name] == runs[root.name]
    paths = [json.loads(line)["path"] for line in runs[root.name][1].splitlines()]
    assert paths == ["bob/empty.jpg", "bob/cut.jpg", "bob/big.jpg"]
    allowed = invoke(
        "pack", lst, archive, tmp_path / "ok" / "p", "--max-pixels", "100", "--max-failures", "3"
    )
    assert allowed.exit_code == 0


def test_one_run_at_a_time_writes_a_prefix_packed_from_an_archive(tree, tmp_path):
    from rectool.doors.lock import OutputLock

    root, lst = tree
    archive = make_tar(tmp_path / "a.tar", root)
    prefix = tmp_path / "out" / "p"
    prefix.parent.mkdir()
    with OutputLock(str(prefix)):
        result = invoke("pack", lst, archive, prefix)
    assert result.exit_code != 0
    assert str(os.getpid()) in result.stderr
    assert not (tmp_path / "out" / "p.manifest.json").exists()


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """600 images in 20 identities (every 37th empty), their tar and tar.gz, and the list."""
    base = tmp_path_factory.mktemp("archive-resume")
    root = base / "tree"
    items = []
    for index in range(600):
        rel = f"id{index // 30:03d}/{index:05d}.jpg"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        data = b"" if index % 37 == 5 else encode(image_array(index, 24, 20), ".jpg")
        (root / rel).write_bytes(data)
        items.append((index, index // 30, rel))
    lst = write_list(base / "many.lst", items)
    return root, lst, make_tar(base / "many.tar", root), make_tar(base / "many.tgz", root, "w:gz")


def _pack(lst, root, prefix, *extra, kill_after=None):
    env = dict(os.environ)
    if kill_after is not None:
        env["RECTOOL_TEST_FAULT"] = f"SIGKILL:{kill_after}"
    args = ["--shard-records", "97", "--max-failures", "50", "--quiet"]
    command = [sys.executable, "-m", "rectool", "pack", str(lst), str(root), str(prefix)]
    return subprocess.run(command + args + list(extra), env=env, capture_output=True, timeout=300)


@pytest.mark.parametrize("which", [2, 3])
@pytest.mark.parametrize("kill_after", [150, 420])
def test_a_pack_from_an_archive_killed_resumes_to_the_same_bytes(many, tmp_path, which, kill_after):
    root, lst, *archives = many
    archive = archives[which - 2]
    killed = _pack(lst, archive, tmp_path / "a" / "p", "--workers", "1", kill_after=kill_after)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (tmp_path / "a" / "p.manifest.json").exists()
    resumed = _pack(lst, archive, tmp_path / "a" / "p", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert _pack(lst, root, tmp_path / "t" / "p").returncode == 0
    assert pack_files(tmp_path / "a" / "p") == pack_files(tmp_path / "t" / "p")
    failures = (tmp_path / "a" / "p.failures.jsonl").read_bytes()
    assert failures == (tmp_path / "t" / "p.failures.jsonl").read_bytes()


def test_one_shard_of_a_plan_packs_from_a_tar(many, tmp_path):
    root, lst, tar, _ = many
    for where in (root, tar):
        prefix = tmp_path / where.name.replace(".", "-") / "p"
        for shard in range(2):
            result = invoke(
                "pack",
                lst,
                where,
                prefix,
                "--shard-records",
                "300",
                "--only-shard",
                shard,
                "--max-failures",
                "50",
                "--quiet",
            )
            assert result.exit_code == 0, result.output
    assert pack_files(tmp_path / "many-tar" / "p") == pack_files(tmp_path / "tree" / "p")


# -- webdataset shards ------------------------------------------------------------------------


def write_shard(path, members):
    """Write a webdataset shard: members as (name, bytes)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def shards(tmp_path):
    """Two shards of samples `KEY.jpg` + `KEY.cls` (classes "n1", "n2"), and a third whose keys
    hold their identity folder (`n3/KEY.jpg`)."""
    folder = tmp_path / "shards"
    folder.mkdir()
    images = {}
    for shard in range(2):
        members = []
        for i in range(4):
            key = f"{shard:02d}{i:04d}"
            images[key] = jpeg_bytes(10 * shard + i)
            members += [(f"{key}.jpg", images[key]), (f"{key}.cls", f"n{1 + i % 2}\n".encode())]
        write_shard(folder / f"train-{shard:06d}.tar", members)
    members = [(f"n3/{i:04d}.jpg", jpeg_bytes(50 + i)) for i in range(3)]
    write_shard(folder / "train-000002.tar", members + [("n3/0000.json", b"{}")])
    return folder


@pytest.mark.parametrize(
    "pattern", ["", "train-*.tar", "train-{000000..000002}.tar", "train-00000{0,1,2}.tar"]
)
def test_webdataset_shards_list_by_key_folder_or_cls(shards, tmp_path, pattern):
    root = shards / pattern if pattern else shards
    result = invoke("list", root, tmp_path / "wds.lst")
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in (tmp_path / "wds.lst").read_text().splitlines()]
    assert [(label, path) for _, label, path in lines] == [
        ("0", "train-000000.tar/000000.jpg"),
        ("0", "train-000000.tar/000002.jpg"),
        ("0", "train-000001.tar/010000.jpg"),
        ("0", "train-000001.tar/010002.jpg"),
        ("1", "train-000000.tar/000001.jpg"),
        ("1", "train-000000.tar/000003.jpg"),
        ("1", "train-000001.tar/010001.jpg"),
        ("1", "train-000001.tar/010003.jpg"),
        ("2", "train-000002.tar/n3/0000.jpg"),
        ("2", "train-000002.tar/n3/0001.jpg"),
        ("2", "train-000002.tar/n3/0002.jpg"),
    ]
    assert (tmp_path / "wds.labels.tsv").read_text() == "0\tn1\n1\tn2\n2\tn3\n"


def test_webdataset_shards_pack_as_their_extracted_folders(shards, tmp_path):
    assert invoke("list", shards, tmp_path / "wds.lst").exit_code == 0
    extracted = tmp_path / "extracted"
    for shard in sorted(shards.iterdir()):
        with tarfile.open(shard) as tar:
            tar.extractall(extracted / shard.name, filter="data")
    for where, out in ((shards, "a"), (extracted, "t")):
        result = invoke("pack", tmp_path / "wds.lst", where, tmp_path / out / "p")
        assert result.exit_code == 0, result.output
    assert pack_files(tmp_path / "a" / "p") == pack_files(tmp_path / "t" / "p")


def test_a_root_that_is_no_archive_is_a_usage_error(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "a.tar.zst").write_bytes(b"x")
    for root, message in [
        (tmp_path / "notes.txt", "is a file, neither a folder nor an archive"),
        (tmp_path / "a.tar.zst", "cannot read; unpack it to a .tar"),
        (tmp_path / "none-*.tar", "no webdataset shards (.tar files) match"),
        (tmp_path / "missing.tar", "does not exist"),
    ]:
        result = invoke("list", root, tmp_path / "x.lst")
        assert result.exit_code == 2, (root, result.output)
        assert message in result.stderr, (root, result.stderr)


def test_an_archive_replaced_under_the_same_name_is_read_again(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    write_pack_tree(first, ["alice"], 2)
    write_pack_tree(second, ["bob", "carol"], 1)
    archive = make_tar(tmp_path / "a.tar", first)
    assert invoke("list", archive, tmp_path / "one.lst").exit_code == 0
    os.replace(make_tar(tmp_path / "b.tar", second), archive)
    assert invoke("list", archive, tmp_path / "two.lst").exit_code == 0
    assert (tmp_path / "two.lst").read_text() == "0\t0\tbob/000.jpg\n1\t1\tcarol/000.jpg\n"


@pytest.mark.parametrize("order", ["archive", "reversed", "shuffled"])
def test_members_read_into_place_are_whole_in_any_order_and_any_room(tree, tmp_path, order):
    import random

    from rectool.archives import open_archive

    root, _ = tree
    files = {rel: Path(full).read_bytes() for rel, full in tree_files(root)}
    names = sorted(files)
    if order == "reversed":
        names.reverse()
    elif order == "shuffled":
        random.Random(5).shuffle(names)
    with open_archive(make_tar(tmp_path / "a.tar", root)) as archive:
        for k, name in enumerate(names):
            member = archive.index.find(name)
            room = [len(files[name]) + 9, len(files[name]), 100][k % 3]
            buffer = bytearray(room)
            n, rest = archive.read_into(member, memoryview(buffer))
            data = bytes(buffer[:n]) + (rest or b"")
            assert data == files[name], name
            assert (rest is None) == (n < room)


def test_a_shard_added_to_a_folder_is_read_by_the_next_run(shards, tmp_path):
    assert invoke("list", shards, tmp_path / "one.lst").exit_code == 0
    write_shard(shards / "train-000003.tar", [("n4/0000.jpg", jpeg_bytes(99))])
    assert invoke("list", shards, tmp_path / "two.lst").exit_code == 0
    last = (tmp_path / "two.lst").read_text().splitlines()[-1]
    assert last == "11\t3\ttrain-000003.tar/n4/0000.jpg"
