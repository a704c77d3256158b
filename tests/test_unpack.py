"""`rectool unpack`: a pass-through pack unpacks to the very bytes that were packed."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner
from helpers.image_files import encode, image_array, jpeg_bytes, write_list, write_pack_tree
from helpers.rec_files import (
    MAGIC,
    NAMES,
    image_payload,
    label_vector_payload,
    make_pack,
    write_records,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.format.writer import pack_image_record
from rectool.inspect.unpack import unpack_dataset
from rectool.packer.packing import pack_images
from rectool.packer.writers import IndexedRecordWriter


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def tree_files(root):
    """Return {relative path: bytes} of every file under `root`."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_pass_through_pack_unpacks_byte_identical(tmp_path):
    pack = make_pack(tmp_path)
    result = unpack_dataset(pack.manifest, tmp_path / "back")
    expected = {
        f"{NAMES[label]}/{index}.jpg": (pack.root / rel).read_bytes()
        for index, label, rel in pack.items
    }
    assert tree_files(tmp_path / "back") == expected
    assert (result.images, result.identities) == (12, 3)
    assert result.bytes == sum(len(b) for b in expected.values())


def test_without_label_map_folders_are_labels_and_png_keeps_its_extension(tmp_path):
    root = tmp_path / "tree"
    png = encode(image_array(5), ".png")
    items = write_pack_tree(root, ["x", "y"], 2, extra=[("y/p.png", png, 1)])
    lst = write_list(tmp_path / "l.lst", items)
    pack_images(lst, root, tmp_path / "p")
    unpack_dataset(tmp_path / "p.rec", tmp_path / "back")
    expected = {f"{label}/{index}.jpg": (root / rel).read_bytes() for index, label, rel in items}
    expected.pop(f"1/{items[-1][0]}.jpg")
    expected[f"1/{items[-1][0]}.png"] = png
    assert tree_files(tmp_path / "back") == expected


def test_insightface_layout_unpacks_only_images(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    result = unpack_dataset(pack.manifest, tmp_path / "back")
    # insightface keys are 1..N in label order; the list here is already in label order.
    expected = {
        f"{NAMES[label]}/{n}.jpg": (pack.root / rel).read_bytes()
        for n, (_, label, rel) in enumerate(pack.items, start=1)
    }
    assert tree_files(tmp_path / "back") == expected
    assert (result.layout, result.images) == ("insightface", 12)


def test_sharded_pack(tmp_path):
    pack = make_pack(tmp_path, shard_records=5)
    unpack_dataset(pack.manifest, tmp_path / "back")
    assert len(tree_files(tmp_path / "back")) == 12


def test_a_format_3_pack_is_unpacked_from_its_binary_index(tmp_path):
    """The .npy index is what unpack reads: .idx text it would choke on changes nothing."""
    pack = make_pack(tmp_path, shard_records=5)
    for idx in (tmp_path / "out").glob("faces-*.idx"):
        idx.write_text("not\tan index\n")
    result = unpack_dataset(pack.manifest, tmp_path / "back")
    expected = {
        f"{NAMES[label]}/{index}.jpg": (pack.root / rel).read_bytes()
        for index, label, rel in pack.items
    }
    assert tree_files(tmp_path / "back") == expected
    assert (result.images, result.identities, result.layout) == (12, 3, "images")


def test_never_overwrites(tmp_path):
    pack = make_pack(tmp_path)
    (tmp_path / "back" / "alice").mkdir(parents=True)
    (tmp_path / "back" / "alice" / "0.jpg").write_bytes(b"mine")
    with pytest.raises(RectoolError, match="0.jpg: exists; unpack into an empty folder"):
        unpack_dataset(pack.manifest, tmp_path / "back")
    assert (tmp_path / "back" / "alice" / "0.jpg").read_bytes() == b"mine"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    images=st.lists(
        st.lists(st.sampled_from([MAGIC, b"\xff\xd8\xff", b"z", b"\0\0\0\0"]), max_size=10),
        max_size=6,
    )
)
def test_property_round_trip_of_any_bytes(tmp_path, images):
    """Whatever the bytes (split records included), unpack writes exactly what was stored."""
    folder = tmp_path / f"h{abs(hash(str(images)))}"
    folder.mkdir()
    data = [b"".join(pieces) for pieces in images]
    with IndexedRecordWriter(folder / "h.rec", folder / "h.idx") as w:
        for key, image in enumerate(data):
            w.write(key, pack_image_record(image, float(key % 2), key))
    unpack_dataset(folder / "h.rec", folder / "out")
    found = tree_files(folder / "out")
    assert sorted(found.values()) == sorted(data)
    for name, content in found.items():
        label, file = name.split("/")
        key = int(file.split(".")[0])
        assert (int(label), content) == (key % 2, data[key])
    shutil.rmtree(folder)


def test_cli(tmp_path):
    pack = make_pack(tmp_path)
    result = invoke("unpack", pack.manifest, tmp_path / "back")
    assert result.exit_code == 0, result.output
    total = sum((pack.root / rel).stat().st_size for _, _, rel in pack.items)
    assert result.stderr == (
        f"Unpacked 12 images of 3 identities ({total / 1e6:,.1f} MB) into {tmp_path / 'back'}.\n"
    )
    result = invoke("unpack", pack.manifest, tmp_path / "again", "--json")
    assert json.loads(result.stdout)["images"] == 12
    result = invoke("unpack", pack.manifest, tmp_path / "back")
    assert result.exit_code == 1
    assert "exists; unpack into an empty folder" in result.stderr


def test_insightface_image_key_missing_from_the_index_is_an_error(tmp_path):
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    write_records(
        rec,
        idx,
        [
            (1, image_payload(jpeg_bytes(1), 0.0, 1)),  # key 2, an image of identity 0, is gone
            (3, label_vector_payload([1.0, 3.0], 3)),
            (0, label_vector_payload([3.0, 4.0], 0, id2=1)),
        ],
    )
    with pytest.raises(RectoolError) as caught:
        unpack_dataset(rec, tmp_path / "back")
    assert str(caught.value) == (
        f"{idx}: key 2 is not in the index, but record 0 says keys up to 2 exist"
    )
    assert not (tmp_path / "back").exists()


def test_a_record_shorter_than_its_header_is_an_error_naming_its_offset(tmp_path):
    rec, idx = tmp_path / "x.rec", tmp_path / "x.idx"
    first = image_payload(jpeg_bytes(1), 0.0, 1)
    write_records(rec, idx, [(1, first), (2, b"0123456789")])
    offset = 8 + len(first) + -len(first) % 4  # the second record's part header
    with pytest.raises(RectoolError) as caught:
        unpack_dataset(rec, tmp_path / "back")
    # (The reader words the reason; what unpack adds is where: file, key and byte offset.)
    message = str(caught.value)
    assert message.startswith(f"{rec}, key 2, byte offset {offset}: record of 10 bytes")
    assert re.search(r"24-byte (image )?header$", message)
