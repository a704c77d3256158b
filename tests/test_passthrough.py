"""Pass-through blocks: the same records and refusals as framing and checking image by image.

Expected bytes come from `helpers/handmade_datasets.py` (dmlc framing written from FORMAT-NOTES,
not from rectool), and expected refusals from `check_image` run on each file alone: the block
code must agree with both, whatever the block boundaries.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from helpers.faults import slow_writes
from helpers.handmade_datasets import frame, image_record
from helpers.image_files import encode, image_array, jpeg_bytes, write_list
from hypothesis import given, settings
from hypothesis import strategies as st

import rectool.packer.passthrough
import rectool.packer.shards
from rectool.packer.images import ImageRefused, check_image
from rectool.packer.listfile import ListItem
from rectool.packer.packing import PackOptions, pack_images
from rectool.packer.passthrough import PassThroughPacker, _walk_jpegs

MAGIC = struct.pack("<I", 0xCED7230A)


def jpeg_with_magic_words(seed):
    """Return a JPEG with the magic word at 4-byte-aligned offsets of the record payload."""
    data = jpeg_bytes(seed)
    # A COM segment right after SOI: its body lands at image offset 6 (+ 24 header bytes).
    body = b"xx" + MAGIC + MAGIC + b"yy" + MAGIC
    return data[:2] + b"\xff\xfe" + struct.pack(">H", len(body) + 2) + body + data[2:]


def odd_files(big):
    """Return (name, bytes or None) of every kind of file pass-through must handle."""
    good = jpeg_bytes(7)
    sos = good.index(b"\xff\xda")
    png = encode(image_array(3), ".png")
    return [
        ("plain.jpg", good),
        ("empty.jpg", b""),
        ("truncated.jpg", good[: len(good) // 2]),
        ("no-eoi.jpg", good[:-2]),
        ("no-eoi-zeros.jpg", good[:-2] + b"\0" * 70),
        ("trailing-zeros.jpg", good + b"\0" * 10),
        ("bad-marker.jpg", good[:2] + b"\x00" + good[3:]),
        ("zero-length.jpg", good[:4] + b"\x00\x00" + good[6:]),
        ("fill-bytes.jpg", good[:2] + b"\xff\xff" + good[2:]),
        ("scan-first.jpg", good[:2] + good[sos:]),
        ("magic.jpg", jpeg_with_magic_words(5)),
        ("odd-size.jpg", good + b"\0"),
        ("image.png", png),
        ("broken.png", png[:-20]),
        ("text.jpg", b"hello, not an image\n"),
        ("big.jpg", big),
        ("folder", None),
        ("missing.jpg", "missing"),
    ]


def trailers(good):
    """Return (name, bytes) of valid JPEGs with bytes after their end marker, as cameras and
    editors write them: random bytes, and bytes holding FF D8 / FF D9 marker pairs."""
    rng = np.random.default_rng(12)
    markers = b"\xff\xd9\0\xff\xd8\xff\xe0" * 200
    out = []
    for n in (1, 2, 62, 63, 64, 65, 1000):
        out.append((f"trailer-{n}-random.jpg", good + rng.bytes(n)))
        out.append((f"trailer-{n}-markers.jpg", good + markers[:n]))
    return out


def expected_outcome(path, item):
    """Return ('record', framed bytes) or ('refused', reason), image by image."""
    if not path.exists():
        return "refused", "file not found"
    if path.is_dir():
        return "refused", "is a directory, not an image file"
    data = path.read_bytes()
    if not data:
        return "refused", "empty file"
    try:
        check_image(data, "structure")
    except ImageRefused as refusal:
        return "refused", refusal.reason
    return "record", frame(image_record(data, item.labels[0], item.index))


def block_outcomes(packer, items):
    """Return ('record', bytes) / ('refused', reason) per item, from blocks."""
    outcomes, source = [], iter(items)
    while (block := packer.fill(source, 1000)) is not None:
        for run in block.runs():
            if len(run) == 2:
                outcomes.append(("refused", run[1]))
                continue
            run_items, data, starts, _ = run
            ends = [*starts[1:], len(data)]
            outcomes += [("record", bytes(data[s:e])) for s, e in zip(starts, ends)]
    return outcomes


@pytest.mark.parametrize("block_bytes", [8 << 20, 64 << 10, 20 << 10])
def test_blocks_agree_with_framing_image_by_image(tmp_path, block_bytes):
    root = tmp_path / "tree"
    root.mkdir()
    big = jpeg_bytes(11, 300, 280)  # longer than a 20 KiB block: read and framed alone
    assert len(big) > 20 << 10
    items = []
    for n in range(3):
        for name, data in [*odd_files(big), *trailers(jpeg_bytes(7 + n))]:
            rel = f"{n}-{name}"
            if data is None:
                (root / rel).mkdir()
            elif data != "missing":
                (root / rel).write_bytes(data)
            items.append(ListItem(len(items) * 3 + 1, (float(n) + 0.5,), rel, len(items) + 1))
    expected = [expected_outcome(root / item.path, item) for item in items]
    assert sum(kind == "refused" for kind, _ in expected) == 3 * 11  # the odd ones, each time
    assert all(
        kind == "record" for item, (kind, _) in zip(items, expected) if "trailer" in item.path
    )
    packer = PassThroughPacker(root, "structure", block_bytes=block_bytes)
    assert block_outcomes(packer, items) == expected


def test_magic_words_split_records_exactly_as_dmlc_does(tmp_path):
    (tmp_path / "m.jpg").write_bytes(jpeg_with_magic_words(1))
    item = ListItem(4, (2.0,), "m.jpg", 1)
    [(kind, framed)] = block_outcomes(PassThroughPacker(tmp_path), [item])
    assert framed == frame(image_record((tmp_path / "m.jpg").read_bytes(), 2.0, 4))
    assert framed.count(MAGIC) == 4  # three words dropped, four parts


def test_packed_labels_go_before_the_image(tmp_path):
    for n in range(5):
        (tmp_path / f"{n}.jpg").write_bytes(jpeg_bytes(n))
    items = [ListItem(n, (float(n), 1.5, -2.0)[: n % 3 + 1], f"{n}.jpg", n + 1) for n in range(5)]
    outcomes = block_outcomes(PassThroughPacker(tmp_path, pack_label=True), items)
    assert outcomes == [
        ("record", frame(image_record((tmp_path / i.path).read_bytes(), list(i.labels), i.index)))
        for i in items
    ]


def test_check_none_still_refuses_empty_and_missing_files(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"not checked")
    (tmp_path / "b.jpg").write_bytes(b"")
    items = [
        ListItem(0, (0.0,), "a.jpg", 1),
        ListItem(1, (0.0,), "b.jpg", 2),
        ListItem(2, (0.0,), "c.jpg", 3),
    ]
    outcomes = block_outcomes(PassThroughPacker(tmp_path, "none"), items)
    assert outcomes == [
        ("record", frame(image_record(b"not checked", 0.0, 0))),
        ("refused", "empty file"),
        ("refused", "file not found"),
    ]


def test_fill_takes_no_item_it_does_not_place(tmp_path):
    for n in range(10):
        (tmp_path / f"{n}.jpg").write_bytes(jpeg_bytes(n))
    source = iter([ListItem(n, (0.0,), f"{n}.jpg", n + 1) for n in range(10)])
    packer = PassThroughPacker(tmp_path)
    assert len(packer.fill(source, 4).items) == 4
    assert len(packer.fill(source, 4).items) == 4
    assert [item.index for item in packer.fill(source, 4).items] == [8, 9]
    assert packer.fill(source, 4) is None


def walk(images):
    """Run the block walk over images laid out one after another; return its verdicts."""
    buffer = bytearray()
    heads, ends = [], []
    for data in images:
        heads.append(len(buffer))
        buffer += data
        ends.append(len(buffer))
        buffer += b"\0" * (-len(buffer) % 4 + 16)
    buffer += b"\0" * 64
    u8 = np.frombuffer(bytes(buffer), np.uint8)
    return _walk_jpegs(u8, np.array(heads, np.int64), np.array(ends, np.int64)).tolist()


def test_the_walk_passes_ordinary_jpegs():
    # Otherwise every image would take the slow path and the blocks would only be slower.
    images = [jpeg_bytes(n, 20 + n, 30 + 2 * n) for n in range(20)]
    images.append(encode(image_array(1, channels=1), ".jpg"))
    assert walk(images) == [True] * len(images)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 50),
    edits=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 800),
)
def test_the_walk_never_passes_what_check_image_refuses(seed, edits, cut):
    data = bytearray(jpeg_bytes(seed))
    for pos, value in edits:
        if pos < len(data):
            data[pos] = value  # mostly in the headers, where the walk looks
    data = bytes(data[: len(data) - cut] if cut < 400 else data)
    others = [jpeg_bytes(100), bytes(data), jpeg_bytes(101)]
    verdicts = walk(others)
    assert verdicts[0] and verdicts[2]
    if verdicts[1]:
        check_image(data, "structure")  # must not raise


def test_a_pack_of_many_blocks_through_a_slow_writer(tmp_path, monkeypatch):
    # Tiny blocks in one buffer, reused at once, while the writer thread, slowed down, still
    # holds the previous block. Every byte must still be the expected one.
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    items, expected = [], []
    for n in range(240):
        rel = f"a/{n:03d}.jpg"
        data = jpeg_bytes(n, 20 + n % 17, 24) if n % 37 else b"broken"
        (root / rel).write_bytes(data)
        items.append((n * 2, n % 5, rel))
        if n % 37:
            expected.append(frame(image_record(data, float(n % 5), n * 2)))
    lst = write_list(tmp_path / "many.lst", items)
    monkeypatch.setattr(rectool.packer.passthrough, "BLOCK_BYTES", 16 << 10)
    monkeypatch.setattr(rectool.packer.passthrough, "BUFFERS", 1)
    slow_writes(monkeypatch, ".rec.partial", 0.002)
    result = pack_images(lst, root, tmp_path / "many", PackOptions(max_failures=10))
    assert result.failures == 7
    assert (tmp_path / "many.rec").read_bytes() == b"".join(expected)


@pytest.mark.parametrize("block_bytes", [8 << 20, 64 << 10, 20 << 10])
def test_numbered_records_skip_the_refused(tmp_path, block_bytes):
    # The insightface layout: keys 1..N in order, whatever was refused in between, and
    # whether a refusal is found while reading (missing, empty) or in the block's check.
    big = jpeg_bytes(11, 300, 280)
    items, images = [], []
    for n, (name, data) in enumerate(odd_files(big) * 2):
        rel = f"{n}-{name}"
        if data is None:
            (tmp_path / rel).mkdir()
        elif data != "missing":
            (tmp_path / rel).write_bytes(data)
        items.append(ListItem(1000 + n, (float(n % 3),), rel, n + 1))
        outcome = expected_outcome(tmp_path / rel, items[-1])
        images.append(None if outcome[0] == "refused" else (tmp_path / rel).read_bytes())
    expected, key = [], 1
    for item, image in zip(items, images):
        if image is None:
            expected.append("refused")
        else:
            expected.append(frame(image_record(image, item.labels[0], key)))
            key += 1
    packer = PassThroughPacker(tmp_path, block_bytes=block_bytes)
    outcomes, source, first_key = [], iter(items), 1
    while (block := packer.fill(source, 1000, first_key=first_key)) is not None:
        for run in block.runs():
            if len(run) == 2:
                outcomes.append("refused")
                continue
            _, data, starts, first = run
            ends = [*starts[1:], len(data)]
            outcomes += [bytes(data[s:e]) for s, e in zip(starts, ends)]
            for j in range(first, first + len(starts)):
                assert block.image(j) == images[j + len(outcomes) - len(starts) - first]
            first_key += len(starts)
    assert outcomes == expected


@pytest.mark.parametrize("layout", ["images", "insightface"])
def test_blocks_and_worker_threads_pack_the_same_bytes(tmp_path, monkeypatch, layout):
    # Two implementations of pass-through: blocks on the calling thread (fast disks) and
    # image by image in worker threads (slow ones). Their files must be the same.
    import rectool.packer.packrun

    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    items = []
    odd = odd_files(jpeg_bytes(11, 300, 280))
    for n in range(1300):
        if n % 40 == 7:
            name, data = odd[(n // 40) % len(odd)]
            rel = f"a/{n}-{name}"
            if data is None:
                (root / rel).mkdir()
            elif data != "missing":
                (root / rel).write_bytes(data)
        else:
            rel = f"a/{n}.jpg"
            (root / rel).write_bytes(jpeg_bytes(n % 50, 16 + n % 9, 20))
        items.append((n, n % 7, rel))
    lst = write_list(tmp_path / "mixed.lst", items)
    options = PackOptions(layout=layout, max_failures=100, workers=2)
    pack_images(lst, root, tmp_path / "blocks" / "p", options)
    monkeypatch.setattr(rectool.packer.packrun, "_io_bound", lambda options: False)
    pack_images(lst, root, tmp_path / "threads" / "p", options)
    for suffix in (".rec", ".idx", ".failures.jsonl"):
        blocks = (tmp_path / "blocks" / f"p{suffix}").read_bytes()
        assert blocks == (tmp_path / "threads" / f"p{suffix}").read_bytes(), suffix
    assert (tmp_path / "blocks" / "p.failures.jsonl").read_text().count("\n") >= 15


def test_a_scan_header_longer_than_the_file_is_refused_by_both_checks():
    # Found by the property above: a start-of-scan length running past the file's end, in a
    # file that still ends with FF D9. The walk passed it; check_image refused it.
    data = bytearray(jpeg_bytes(0))
    sos = data.index(b"\xff\xda")
    data[sos + 2] = 2  # the length's high byte: the scan header now runs past the end
    assert walk([jpeg_bytes(100), bytes(data)]) == [True, False]
    with pytest.raises(ImageRefused, match="ends inside its scan header"):
        check_image(bytes(data), "structure")
