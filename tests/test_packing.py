"""The packing library: pass-through bytes, transforms, refusals, shards, manifest, layouts."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import xxhash
from helpers.image_files import encode, image_array, jpeg_bytes, write_list, write_pack_tree

from rectool.errors import RectoolError, UsageError
from rectool.format.headers import unpack_header
from rectool.format.records import IndexedRecordFile, iter_records
from rectool.packer.images import Transform
from rectool.packer.packing import PackOptions, pack_images
from rectool.reader import RecordFile


def read_pack(rec, idx=None):
    """Return {key: (header, image bytes)} of a .rec/.idx pair, read in index order."""
    out = {}
    with IndexedRecordFile(rec, idx) as f:
        for key in f.keys.tolist():
            out[key] = unpack_header(f.read(key))
    return out


def test_pass_through_bytes_equal_source_files(small_tree, tmp_path):
    root, lst, items = small_tree
    result = pack_images(lst, root, tmp_path / "out" / "faces")
    assert result.failures == 0
    records = read_pack(tmp_path / "out" / "faces.rec")
    assert sorted(records) == [i for i, _, _ in items]
    for index, label, rel in items:
        header, image = records[index]
        assert image == (root / rel).read_bytes()
        assert (header.flag, header.label, header.id, header.id2) == (0, label, index, 0)


def test_keys_follow_list_indices_in_list_order(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a", "b"], 3)
    shuffled = [(i * 7 + 100, label, rel) for i, label, rel in reversed(items)]
    lst = write_list(tmp_path / "x.lst", shuffled)
    pack_images(lst, root, tmp_path / "x")
    with IndexedRecordFile(tmp_path / "x.rec") as f:
        assert f.keys.tolist() == [i for i, _, _ in shuffled]
        assert f.offsets.tolist() == sorted(f.offsets.tolist())


def test_pack_label_stores_label_vector(tmp_path):
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["a"], 2)
    multi = [(i, [label, 2.5, -1.0], rel) for i, label, rel in items]
    lst = write_list(tmp_path / "m.lst", multi)
    pack_images(lst, root, tmp_path / "m", PackOptions(pack_label=True))
    for index, labels, _ in multi:
        header, _ = read_pack(tmp_path / "m.rec")[index]
        assert header.flag == 3
        assert header.label.tolist() == [float(x) for x in labels]
    # Without --pack-label the header keeps the first label only, as im2rec does.
    pack_images(lst, root, tmp_path / "s")
    header, _ = read_pack(tmp_path / "s.rec")[multi[1][0]]
    assert (header.flag, header.label) == (0, 0.0)


def im2rec_resize(image, size):
    h, w = image.shape[:2]
    dsize = (size, h * size // w) if h > w else (w * size // h, size)
    return cv2.resize(image, dsize)


@pytest.mark.parametrize(
    ("transform", "expected"),
    [
        (
            Transform(resize=20),
            lambda src: encode(
                im2rec_resize(cv2.imdecode(src, cv2.IMREAD_COLOR), 20),
                ".jpg",
                [cv2.IMWRITE_JPEG_QUALITY, 95],
            ),
        ),
        (
            Transform(center_crop=True, quality=70),
            lambda src: encode(
                cv2.imdecode(src, cv2.IMREAD_COLOR)[4:36, :], ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 70]
            ),
        ),
        (
            Transform(encoding=".png", quality=9),
            lambda src: encode(
                cv2.imdecode(src, cv2.IMREAD_COLOR), ".png", [cv2.IMWRITE_PNG_COMPRESSION, 9]
            ),
        ),
        (
            Transform(color=0, quality=90),
            lambda src: encode(
                cv2.imdecode(src, cv2.IMREAD_GRAYSCALE), ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 90]
            ),
        ),
        (
            Transform(color=-1, center_crop=True, resize=16, encoding=".png", quality=3),
            lambda src: encode(
                im2rec_resize(cv2.imdecode(src, cv2.IMREAD_UNCHANGED)[4:36, :], 16),
                ".png",
                [cv2.IMWRITE_PNG_COMPRESSION, 3],
            ),
        ),
    ],
    ids=["resize", "center-crop+quality", "png", "gray", "unchanged+crop+resize+png"],
)
def test_transforms_match_opencv_by_hand(small_tree, tmp_path, transform, expected):
    root, lst, items = small_tree
    pack_images(lst, root, tmp_path / "t", PackOptions(transform=transform))
    records = read_pack(tmp_path / "t.rec")
    for index, _, rel in items:
        source = np.frombuffer((root / rel).read_bytes(), np.uint8)
        assert records[index][1] == expected(source), rel


def test_resize_wide_image_keeps_aspect_like_im2rec(tmp_path):
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    (root / "a" / "wide.png").write_bytes(encode(image_array(3, 30, 70), ".png"))
    lst = write_list(tmp_path / "w.lst", [(0, 0, "a/wide.png")])
    pack_images(lst, root, tmp_path / "w", PackOptions(transform=Transform(resize=12)))
    _, image = read_pack(tmp_path / "w.rec")[0]
    decoded = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == (12, 70 * 12 // 30, 3)


def test_large_jpeg_is_decoded_at_reduced_scale(tmp_path):
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    smooth = cv2.resize(image_array(5, 50, 42), (336, 400), interpolation=cv2.INTER_CUBIC)
    big = encode(smooth, ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 95])
    (root / "a" / "big.jpg").write_bytes(big)
    lst = write_list(tmp_path / "b.lst", [(0, 0, "a/big.jpg")])
    pack_images(lst, root, tmp_path / "b", PackOptions(transform=Transform(resize=80)))
    _, image = read_pack(tmp_path / "b.rec")[0]
    # 336 // 4 = 84 >= 80: libjpeg decodes at 1/4 scale, then the usual resize to 80.
    reduced = cv2.imdecode(np.frombuffer(big, np.uint8), cv2.IMREAD_REDUCED_COLOR_4)
    expected = encode(im2rec_resize(reduced, 80), ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert image == expected
    full = cv2.imdecode(np.frombuffer(big, np.uint8), cv2.IMREAD_COLOR)
    decoded = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == im2rec_resize(full, 80).shape
    # The same picture: close to an area-averaged downscale of the full-size decode.
    area = cv2.resize(full, decoded.shape[1::-1], interpolation=cv2.INTER_AREA)
    assert np.abs(decoded.astype(int) - area.astype(int)).mean() < 4


PNG_END = b"IEND\xaeB`\x82"


@pytest.fixture
def bad_tree(tmp_path):
    root = tmp_path / "tree"
    good = jpeg_bytes(77)
    extra = [
        ("bob/zero.jpg", b"", 1),
        ("bob/truncated.jpg", good[: len(good) // 2], 1),
        ("bob/notes.jpg", b"this is a text file, not an image\n", 1),
        ("bob/missing.jpg", None, 1),
        ("bob/corrupt.png", encode(image_array(8), ".png")[:60] + bytes(200) + PNG_END, 1),
        ("bob/ünïcødé 名前.jpg", good, 1),
    ]
    items = write_pack_tree(root, ["alice", "bob"], 2, extra=extra)
    return root, write_list(tmp_path / "bad.lst", items), items


def test_refusals_are_recorded_and_never_written(bad_tree, tmp_path):
    root, lst, items = bad_tree
    result = pack_images(lst, root, tmp_path / "p")
    reasons = {r.path: r.reason for r in result.refused}
    assert reasons == {
        "bob/zero.jpg": "empty file",
        "bob/truncated.jpg": "truncated JPEG (ends inside its headers)",
        "bob/notes.jpg": "not an image (unknown file signature)",
        "bob/missing.jpg": "file not found",
        "bob/corrupt.png": "truncated PNG (chunk 'IDAT' runs past the end)",
    }
    assert result.failures == 5 and not result.accepted
    lines = (tmp_path / "p.failures.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == [
        {"line": i + 1, "index": i, "path": rel, "reason": reasons[rel]}
        for i, _, rel in items
        if rel in reasons
    ]
    records = read_pack(tmp_path / "p.rec")
    packed = {i for i, _, rel in items if rel not in reasons}
    assert set(records) == packed
    unicode_index = next(i for i, _, rel in items if rel.startswith("bob/ü"))
    assert records[unicode_index][1] == jpeg_bytes(77)
    assert result.manifest["totals"]["failures"] == 5


def test_no_check_passes_undecodable_bytes_but_never_empty_files(bad_tree, tmp_path):
    root, lst, _ = bad_tree
    result = pack_images(lst, root, tmp_path / "n", PackOptions(check="none"))
    assert {r.path: r.reason for r in result.refused} == {
        "bob/zero.jpg": "empty file",
        "bob/missing.jpg": "file not found",
    }


def test_max_failures_accepts_up_to_n(bad_tree, tmp_path):
    root, lst, _ = bad_tree
    assert pack_images(lst, root, tmp_path / "a", PackOptions(max_failures=5)).accepted
    assert not pack_images(lst, root, tmp_path / "b", PackOptions(max_failures=4)).accepted


def test_manifest_describes_the_shards(small_tree, tmp_path):
    root, lst, items = small_tree
    (tmp_path / "faces.labels.tsv").write_text("0\talice\n1\tbob\n2\tcarol\n", encoding="utf-8")
    pack_images(lst, root, tmp_path / "m", PackOptions(shard_records=5))
    manifest = json.loads((tmp_path / "m.manifest.json").read_text(encoding="utf-8"))
    assert manifest["format"] == "rectool-manifest"
    assert manifest["format_version"] == 3
    names = (tmp_path / "m.identities.json").read_bytes()
    assert json.loads(names) == {"0": "alice", "1": "bob", "2": "carol"}
    assert manifest["identities"] == {
        "file": "m.identities.json",
        "bytes": len(names),
        "xxh3_128": xxhash.xxh3_128_hexdigest(names),
        "count": 3,
    }
    assert [s["rec"] for s in manifest["shards"]] == ["m-00000.rec", "m-00001.rec", "m-00002.rec"]
    assert [s["records"] for s in manifest["shards"]] == [5, 5, 2]
    for shard in manifest["shards"]:
        data = (tmp_path / shard["rec"]).read_bytes()
        assert shard["rec_bytes"] == len(data)
        assert shard["rec_xxh3_128"] == xxhash.xxh3_128_hexdigest(data)
        idx = (tmp_path / shard["idx"]).read_bytes()
        assert shard["idx_xxh3_128"] == xxhash.xxh3_128_hexdigest(idx)
    assert manifest["totals"] == {
        "shards": 3,
        "records": 12,
        "images": 12,
        "rec_bytes": sum(s["rec_bytes"] for s in manifest["shards"]),
        "failures": 0,
    }
    assert not list(tmp_path.glob("*.partial"))


def test_shard_rollover_by_bytes(small_tree, tmp_path):
    root, lst, items = small_tree
    limit = 3000
    pack_images(lst, root, tmp_path / "s", PackOptions(shard_bytes=limit))
    shards = sorted(tmp_path.glob("s-*.rec"))
    assert len(shards) > 2
    seen = []
    for rec in shards:
        size = rec.stat().st_size
        f = RecordFile(rec)
        count = sum(1 for _ in iter_records(f))
        f.close()
        assert size <= limit or count == 1
        seen += list(read_pack(rec))
    assert seen == [i for i, _, _ in items]


def test_same_bytes_with_one_or_many_workers(bad_tree, tmp_path):
    root, lst, _ = bad_tree
    for workers in (1, 3, 8):
        pack_images(
            lst, root, tmp_path / f"w{workers}", PackOptions(workers=workers, shard_records=3)
        )
    for name in ("-00000.rec", "-00001.rec", "-00001.idx", ".failures.jsonl"):
        one = (tmp_path / f"w1{name}").read_bytes()
        assert (tmp_path / f"w3{name}").read_bytes() == one
        assert (tmp_path / f"w8{name}").read_bytes() == one


def test_existing_output_needs_overwrite(small_tree, tmp_path):
    root, lst, _ = small_tree
    pack_images(lst, root, tmp_path / "o")
    with pytest.raises(
        RectoolError,
        match=r"o: a complete pack is already here \(.*o\.manifest\.json\); use --overwrite",
    ):
        pack_images(lst, root, tmp_path / "o")
    before = {p.name: p.read_bytes() for p in tmp_path.glob("o.*")}
    again = pack_images(lst, root, tmp_path / "o", resume=True)  # complete: nothing to do
    assert (again.images, again.failures, again.resumed_from) == (12, 0, 12)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("o.*")} == before
    pack_images(lst, root, tmp_path / "o", overwrite=True)


def test_bad_list_is_refused_before_anything_is_written(small_tree, tmp_path):
    root, _, items = small_tree
    lst = write_list(tmp_path / "dup.lst", items + [(3, 0, "alice/000.jpg")])
    with pytest.raises(RectoolError, match=r"dup.lst: line 13: index 3 appears twice"):
        pack_images(lst, root, tmp_path / "d")
    assert not list(tmp_path.glob("d.*"))


def test_insightface_layout(small_tree, tmp_path):
    root, _, items = small_tree
    shuffled = items[::-1]  # the layout groups identities itself
    lst = write_list(tmp_path / "i.lst", shuffled)
    result = pack_images(lst, root, tmp_path / "ins" / "train", PackOptions(layout="insightface"))
    records = read_pack(tmp_path / "ins" / "train.rec")
    n, k = 12, 3
    assert sorted(records) == list(range(n + k + 1))
    header0, body0 = records[0]
    assert (header0.flag, header0.label.tolist(), header0.id, header0.id2) == (
        2,
        [13.0, 16.0],
        0,
        1,
    )
    assert body0 == b""
    by_label = {0: [], 1: [], 2: []}
    for key in range(1, n + 1):
        header, image = records[key]
        assert (header.flag, header.id) == (0, key)
        by_label[int(header.label)].append(key)
    for label in range(k):
        header, body = records[n + 1 + label]
        assert header.flag == 2 and body == b""
        start, end = header.label.tolist()
        assert list(range(int(start), int(end))) == by_label[label]
    assert (tmp_path / "ins" / "property").read_text() == "3,40,32\n"
    assert result.manifest["classes"] == 3
    # Record 0 is written last, physically at the end of the file.
    with IndexedRecordFile(tmp_path / "ins" / "train.rec") as f:
        assert f.keys.tolist()[-1] == 0


def test_insightface_layout_refuses_shards_and_bad_labels(small_tree, tmp_path):
    root, lst, items = small_tree
    with pytest.raises(UsageError, match="writes one .rec"):
        pack_images(lst, root, tmp_path / "x", PackOptions(layout="insightface", shard_records=2))
    frac = write_list(tmp_path / "f.lst", [(0, 1.5, items[0][2])])
    with pytest.raises(RectoolError, match="f.lst: line 1: --layout insightface needs one"):
        pack_images(frac, root, tmp_path / "y", PackOptions(layout="insightface"))


def test_insightface_layout_refuses_numbers_float32_cannot_hold(small_tree, tmp_path, monkeypatch):
    import rectool.packer.layout

    root, lst, _ = small_tree
    monkeypatch.setattr(rectool.packer.layout, "FLOAT32_EXACT", 16)
    with pytest.raises(RectoolError, match="exact only up to 16; 12 images \\+ 3 identities"):
        pack_images(lst, root, tmp_path / "z", PackOptions(layout="insightface"))


def test_labels_as_large_as_float32_allows_are_packed(small_tree, tmp_path):
    root, _, items = small_tree
    lst = tmp_path / "big-labels.lst"
    rel = items[0][2]
    # 1.2e-38: about the smallest normal float32 (a subnormal such as 1e-40 loses digits, and
    # is refused: tests/adversarial/test_labels.py).
    lst.write_text(f"0\t3.4e38\t{rel}\n1\t-1e3\t{rel}\n2\t1.2e-38\t{rel}\n", encoding="utf-8")
    pack_images(lst, root, tmp_path / "big")
    labels = [header.label for header, _ in read_pack(tmp_path / "big.rec").values()]
    assert labels == [np.float32(3.4e38), -1000.0, np.float32(1.2e-38)]


def test_list_that_is_not_utf8_names_the_line(small_tree, tmp_path):
    root, _, _ = small_tree
    bad = tmp_path / "latin1.lst"
    bad.write_bytes(b"0\t0\talice/000.jpg\n1\t0\talice/caf\xe9.jpg\n")
    with pytest.raises(RectoolError, match=r"latin1.lst: line 2: not valid UTF-8"):
        pack_images(bad, root, tmp_path / "u")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0\t0\ta.jpg\n1\tnan\tb.jpg\n", r"line 2: labels \['nan'\] are not finite"),
        ("0\t0\ta.jpg\n\n", "line 2: expected 'index<TAB>label<TAB>path', got ''"),
        ("5\t0\ta.jpg\n2\t1\tb.jpg\n5\t1\tc.jpg\n", "line 3: index 5 appears twice"),
        ("0\t0\ta.jpg\n-1\t0\tb.jpg\n", "line 2: index -1 is negative"),
        ("0\t0\ta.jpg\n1\t1e39\tb.jpg\n", r"line 2: labels \['1e39'\] do not fit a float32"),
        ("0\t0\ta.jpg\n1\t-4" + "0" * 38 + "\tb.jpg\n", "line 2: labels .* do not fit a float32"),
        ("0\t1\t2\t3e40\ta.jpg\n", "line 1: labels .* do not fit a float32"),
        ("0\t0\ta.jpg\n1\t0\tb\0.jpg\n", "line 2: the image path holds a NUL character"),
    ],
)
def test_unusual_lists_are_checked_line_by_line(small_tree, tmp_path, text, message):
    root, _, _ = small_tree
    lst = tmp_path / "odd.lst"
    lst.write_text(text, encoding="utf-8")
    with pytest.raises(RectoolError, match=message):
        pack_images(lst, root, tmp_path / "o")


def test_worker_threads_take_over_when_reads_are_slow(tmp_path, monkeypatch):
    import os
    import time

    import rectool.packer.packrun as packrun
    import rectool.packer.workers as workers

    root = tmp_path / "tree"
    # Two timing windows in a row must be slow (one could be a stall of the machine).
    items = write_pack_tree(root, [f"id{i}" for i in range(25)], 100)
    assert len(items) > 2 * packrun.SWITCH_WINDOW
    lst = write_list(tmp_path / "slow.lst", items)
    pools = []
    real_pool, real_read = packrun.ThreadPoolExecutor, workers._read_file

    def counting_pool(*args, **kwargs):
        pools.append(args)
        return real_pool(*args, **kwargs)

    monkeypatch.setattr(packrun, "ThreadPoolExecutor", counting_pool)
    pack_images(lst, root, tmp_path / "fast", PackOptions(workers=2))
    assert pools == []  # fast local reads: all on the calling thread

    def slow_read(*args):
        time.sleep(0.0005)  # as on a network file system
        return real_read(*args)

    def slow_readv(fd, buffers):
        time.sleep(0.0005)
        return real_readv(fd, buffers)

    real_readv = os.readv
    monkeypatch.setattr(workers, "_read_file", slow_read)
    monkeypatch.setattr(os, "readv", slow_readv)  # pass-through blocks read with readv
    pack_images(lst, root, tmp_path / "slow", PackOptions(workers=2))
    assert pools == [(2,)]
    assert (tmp_path / "slow.rec").read_bytes() == (tmp_path / "fast.rec").read_bytes()
    assert (tmp_path / "slow.idx").read_bytes() == (tmp_path / "fast.idx").read_bytes()


def test_a_record_over_the_recordio_limit_is_refused(small_tree, tmp_path, monkeypatch):
    import rectool.format.writer
    import rectool.packer.passthrough

    root, lst, items = small_tree
    largest = max((root / rel).stat().st_size for _, _, rel in items)
    # Pretend the 2**29 - 1 limit is one byte short of the largest record (header + image).
    monkeypatch.setattr(rectool.format.writer, "MAX_RECORD_BYTES", 24 + largest - 1)
    monkeypatch.setattr(rectool.packer.passthrough, "MAX_RECORD_BYTES", 24 + largest - 1)
    result = pack_images(lst, root, tmp_path / "big")
    too_big = [(i, rel) for i, _, rel in items if (root / rel).stat().st_size == largest]
    assert [(r.path, r.reason) for r in result.refused] == [
        (rel, "record exceeds the RecordIO limit of 536870911 bytes") for _, rel in too_big
    ]
    assert not {i for i, _ in too_big} & set(read_pack(tmp_path / "big.rec"))
    assert len(read_pack(tmp_path / "big.rec")) == len(items) - len(too_big)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512MB", 512_000_000),
        ("2GiB", 2 * 1024**3),
        ("1.5G", 1_500_000_000),
        ("1000", 1000),
        ("64kib", 65536),
        ("3_000", 3000),
    ],
)
def test_parse_size_units(text, size):
    from rectool.packer.shards import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MB", "-5MB", "2XB", "lots", "0"])
def test_parse_size_rejects(text):
    from rectool.packer.shards import parse_size

    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)
