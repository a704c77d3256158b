"""Build, read and damage .rec/.idx files by hand, for the verify, reindex, info and unpack tests.

Expected values are read from the raw bytes and the .idx text, never through rectool's reader,
so that keys and offsets are computed independently of the code under test.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

from helpers.image_files import write_list, write_pack_tree
from rectool.packer.listfile import write_label_map
from rectool.packer.packing import PackOptions, pack_images

MAGIC = b"\x0a\x23\xd7\xce"
NAMES = ["alice", "bob", "carol"]


def idx_lines(path):
    """Return the .idx as a list of (key, offset) ints, parsed from the text by hand."""
    out = []
    for line in path.read_text(encoding="ascii").splitlines():
        key, offset = line.split("\t")
        out.append((int(key), int(offset)))
    return out


def write_idx_lines(path, lines):
    """Write (key, offset) pairs as .idx text."""
    path.write_text("".join(f"{k}\t{o}\n" for k, o in lines), encoding="ascii")


def part_length(rec, offset):
    """Return (cflag, length) of the part header at `offset`."""
    data = rec.read_bytes()
    assert data[offset : offset + 4] == MAGIC, "not a part header"
    (lrec,) = struct.unpack_from("<I", data, offset + 4)
    return lrec >> 29, lrec & ((1 << 29) - 1)


def xor_byte(path, offset, mask=0x01):
    """Flip bits of the byte at `offset` in place."""
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def set_bytes(path, offset, value):
    """Overwrite bytes at `offset` in place."""
    data = bytearray(path.read_bytes())
    data[offset : offset + len(value)] = value
    path.write_bytes(bytes(data))


def raw_record(payload):
    """Frame one record that needs no split (no aligned magic in `payload`), by hand."""
    assert all(payload[i : i + 4] != MAGIC for i in range(0, len(payload) - 3, 4))
    pad = -len(payload) % 4
    return MAGIC + struct.pack("<I", len(payload)) + payload + b"\0" * pad


def image_payload(image, label, key, id2=0, flag=0):
    """Return an MXNet image record payload: IRHeader(flag, label, key, id2) + image."""
    return struct.pack("<IfQQ", flag, label, key, id2) + image


def label_vector_payload(labels, key, image=b"", id2=0):
    """Return a payload with flag = len(labels) float32 labels after the header."""
    head = struct.pack("<IfQQ", len(labels), 0.0, key, id2)
    return head + struct.pack(f"<{len(labels)}f", *labels) + image


def write_records(rec, idx, records):
    """Write (key, payload) pairs as a .rec and .idx by hand; return their offsets."""
    offsets, data = [], b""
    for _, payload in records:
        offsets.append(len(data))
        data += raw_record(payload)
    rec.write_bytes(data)
    write_idx_lines(idx, [(k, o) for (k, _), o in zip(records, offsets)])
    return offsets


def make_pack(tmp_path, layout="images", per_identity=4, name="faces", **options):
    """Pack NAMES x `per_identity` JPEGs with a label map; describe the result by hand."""
    root = tmp_path / "tree"
    items = write_pack_tree(root, NAMES, per_identity)
    lst = write_list(tmp_path / f"{name}.lst", items)
    labels = tmp_path / f"{name}.labels.tsv"
    write_label_map(labels, dict(enumerate(NAMES)))
    out = tmp_path / "out"
    pack_images(lst, root, out / name, PackOptions(layout=layout, **options), label_map=labels)
    rec, idx = out / f"{name}.rec", out / f"{name}.idx"
    if not rec.exists():  # sharded: describe the first shard
        rec, idx = out / f"{name}-00000.rec", out / f"{name}-00000.idx"
    return SimpleNamespace(
        root=root,
        items=items,
        rec=rec,
        idx=idx,
        manifest=out / f"{name}.manifest.json",
        lines=idx_lines(idx),
        size=rec.stat().st_size,
        lengths=[part_length(rec, o)[1] for _, o in idx_lines(idx)],
        r=str(rec),
        i=str(idx),
    )
