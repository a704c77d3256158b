"""`rectool info`: counts, images per identity, payload sizes, encodings, dimensions, layout."""

from __future__ import annotations

import json
import statistics

import pytest
from click.testing import CliRunner
from helpers.image_files import encode, image_array, jpeg_bytes, write_list
from helpers.rec_files import image_payload, make_pack, write_records

from rectool.cli import cli
from rectool.errors import RectoolError
from rectool.inspect.info import dataset_info
from rectool.packer.listfile import write_label_map
from rectool.packer.packing import pack_images

COUNTS = {"ann": 2, "ben": 3, "cyd": 7}


def one_size(sampled):
    """The dimensions of `sampled` images of the `uneven` pack, all 40x32x3."""
    return {
        "sampled": sampled,
        "counts": {"40x32x3": sampled},
        "distinct": 1,
        "most_common": [{"size": "40x32x3", "images": sampled}],
        "height": {"min": 40, "median": 40.0, "max": 40},
        "width": {"min": 32, "median": 32.0, "max": 32},
        "undecodable": 0,
        "too_large": 0,
    }


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def uneven(tmp_path):
    """A pack of 2 + 3 + 7 images (one PNG among them); return (prefix, source file sizes)."""
    root, items, index = tmp_path / "tree", [], 0
    for label, (name, count) in enumerate(COUNTS.items()):
        (root / name).mkdir(parents=True)
        for n in range(count):
            if (label, n) == (2, 6):
                rel, data = f"{name}/{n}.png", encode(image_array(index, 40, 32), ".png")
            else:
                rel, data = f"{name}/{n}.jpg", jpeg_bytes(index, 40, 32)
            (root / rel).write_bytes(data)
            items.append((index, label, rel))
            index += 1
    lst = write_list(tmp_path / "u.lst", items)
    write_label_map(tmp_path / "u.labels.tsv", dict(enumerate(COUNTS)))
    pack_images(lst, root, tmp_path / "u")
    return tmp_path / "u", [(root / rel).stat().st_size for _, _, rel in items]


def test_counts_and_identity_statistics(uneven):
    prefix, sizes = uneven
    info = dataset_info(prefix)
    assert (info["layout"], info["label_vectors"]) == ("images", False)
    assert (info["shards"], info["records"], info["images"]) == (1, 12, 12)
    assert (info["identities"], info["classes"], info["named_identities"]) == (3, 3, 3)
    assert info["identities_without_images"] == 0
    assert info["images_per_identity"] == {
        "min": 2,
        "median": 3.0,
        "mean": 4.0,
        "max": 7,
        "total": 12,
        "histogram": [
            {"images": "2", "identities": 1},
            {"images": "3-5", "identities": 1},
            {"images": "6-10", "identities": 1},
        ],
    }
    assert info["image_bytes"] == {
        "min": min(sizes),
        "median": float(statistics.median(sizes)),
        "mean": round(sum(sizes) / len(sizes), 1),
        "max": max(sizes),
        "total": sum(sizes),
    }
    assert info["encodings"] == {"jpeg": 11, "png": 1}
    assert info["dimensions"] == one_size(12)
    assert info["label_flags"] == {"0": 12}


def test_same_figures_without_the_idx_or_manifest(uneven):
    prefix, _ = uneven
    with_index = dataset_info(prefix)
    prefix.with_suffix(".idx").unlink()
    (prefix.parent / "u.manifest.json").unlink()
    info = dataset_info(prefix.with_suffix(".rec"))
    for field in ("records", "images", "identities", "images_per_identity", "image_bytes"):
        assert info[field] == with_index[field], field
    assert info["classes"] is None


def test_sample_size(uneven):
    prefix, _ = uneven
    assert dataset_info(prefix, sample=3)["dimensions"] == one_size(3)
    assert dataset_info(prefix, sample=0)["dimensions"] == {
        "sampled": 0,
        "counts": {},
        "distinct": 0,
        "most_common": [],
        "height": None,
        "width": None,
        "undecodable": 0,
        "too_large": 0,
    }


def test_insightface_layout(tmp_path):
    pack = make_pack(tmp_path, layout="insightface")
    info = dataset_info(pack.manifest)
    assert info["layout"] == "insightface"
    assert (info["records"], info["images"], info["identities"], info["classes"]) == (16, 12, 3, 3)
    assert info["images_per_identity"]["histogram"] == [{"images": "3-5", "identities": 3}]


def test_label_vectors_are_the_images_layout(tmp_path):
    pack = make_pack(tmp_path, pack_label=True)
    info = dataset_info(pack.manifest)
    assert (info["layout"], info["label_vectors"]) == ("images", True)
    assert info["label_flags"] == {"1": 12}
    assert info["identities"] == 3
    first = invoke("info", pack.manifest).stdout.splitlines()[0]
    assert first.startswith(f"{pack.manifest}: layout images, label vectors, 1 shard, 12 records")


def test_labels_that_are_not_class_ids(tmp_path):
    rec = tmp_path / "r.rec"
    write_records(
        rec,
        tmp_path / "r.idx",
        [(k, image_payload(jpeg_bytes(k), 0.25 * k, k)) for k in range(3)],
    )
    info = dataset_info(rec)
    assert info["labels_integral"] is False
    assert info["identities"] is None
    assert info["images_per_identity"] is None


def test_damage_is_described_and_points_to_verify(tmp_path):
    pack = make_pack(tmp_path)
    data = bytearray(pack.rec.read_bytes())
    data[pack.lines[3][1]] ^= 1
    pack.rec.write_bytes(bytes(data))
    info = dataset_info(pack.manifest)  # the binary index lists 12; one cannot be read
    assert (info["records"], info["images"]) == (12, 12)
    first = info["damage"]["first"][0]
    assert (first["key"], first["offset"]) == (pack.lines[3][0], pack.lines[3][1])
    assert "rectool verify" in info["damage"]["advice"]
    pack.manifest.unlink()  # from the headers: the damaged record is left out
    info = dataset_info(pack.rec)
    assert (info["records"], info["images"]) == (12, 11)
    first = info["damage"]["first"][0]
    assert (first["key"], first["offset"]) == (pack.lines[3][0], pack.lines[3][1])


def test_cli_human_output(uneven):
    prefix, sizes = uneven
    result = invoke("info", prefix)
    assert result.exit_code == 0, result.output
    bar = "#" * 40
    median = statistics.median(sizes)
    assert result.stderr == ""
    assert result.stdout.splitlines() == [
        f"{prefix}: layout images, 1 shard, 12 records, 12 images, "
        f"{prefix.with_suffix('.rec').stat().st_size / 1e6:,.1f} MB",
        "Index: binary (format 3)",
        "Identities: 3 (of 3 classes)",
        "Images per identity: min 2, median 3, max 7",
        f"          2 images:         1 {bar}",
        f"        3-5 images:         1 {bar}",
        f"       6-10 images:         1 {bar}",
        f"Image bytes: min {min(sizes):,}, median {median:,.0f}, "
        f"mean {sum(sizes) / len(sizes):,.1f}, max {max(sizes):,}",
        "Encodings: jpeg 11, png 1",
        "Dimensions (HxWxC, sample of 12): 40x32x3 12",
    ]


def test_cli_json_and_errors(uneven, tmp_path):
    prefix, _ = uneven
    result = invoke("info", prefix, "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["images"] == 12
    result = invoke("info", tmp_path / "nothing")
    assert result.exit_code == 2  # an unusable input
    assert result.stderr.startswith(f"Error: {tmp_path / 'nothing'}: no dataset here")


def test_sharded_pack_is_one_dataset(tmp_path):
    pack = make_pack(tmp_path, shard_records=5, name="s")
    info = dataset_info(pack.manifest)
    assert (info["shards"], info["records"], info["identities"]) == (3, 12, 3)


def test_an_empty_idx_beside_records_is_an_error_not_zero_records(tmp_path):
    pack = make_pack(tmp_path)
    pack.manifest.unlink()  # a foreign pack: its .idx is all there is to go by
    pack.idx.write_bytes(b"")
    with pytest.raises(RectoolError, match="empty, but .* holds 12 records"):
        dataset_info(pack.rec)
    result = invoke("info", pack.rec)
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {pack.idx}: empty, but faces.rec holds 12 records")


@pytest.fixture
def mixed_sizes(tmp_path):
    """A pack of 9 images: 4 of 40x32, 2 of 20x30, one each of 10x12, 50x60, 64x64."""
    sizes = [(40, 32)] * 4 + [(20, 30)] * 2 + [(10, 12), (50, 60), (64, 64)]
    root, items = tmp_path / "tree", []
    (root / "a").mkdir(parents=True)
    for index, (height, width) in enumerate(sizes):
        rel = f"a/{index}.jpg"
        (root / rel).write_bytes(jpeg_bytes(index, height, width))
        items.append((index, 0, rel))
    pack_images(write_list(tmp_path / "m.lst", items), root, tmp_path / "m")
    return tmp_path / "m"


def test_mixed_sizes_are_described_as_a_distribution(mixed_sizes, monkeypatch):
    import rectool.inspect.info

    monkeypatch.setattr(rectool.inspect.info, "COMMON_SIZES", 3)
    dims = dataset_info(mixed_sizes)["dimensions"]
    assert dims["distinct"] == 5
    assert dims["most_common"] == [
        {"size": "40x32x3", "images": 4},
        {"size": "20x30x3", "images": 2},
        {"size": "10x12x3", "images": 1},
    ]
    assert dims["height"] == {"min": 10, "median": 40.0, "max": 64}
    assert dims["width"] == {"min": 12, "median": 32.0, "max": 64}
    result = invoke("info", mixed_sizes)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-4:] == [
        "Dimensions (sample of 9): 5 different sizes",
        "  height: min 10, median 40, max 64",
        "  width: min 12, median 32, max 64",
        "  most common (HxWxC): 40x32x3 4, 20x30x3 2, 10x12x3 1",
    ]
    document = json.loads(invoke("info", mixed_sizes, "--json").stdout)
    assert document["dimensions"]["height"] == {"min": 10, "median": 40.0, "max": 64}
    assert len(document["dimensions"]["most_common"]) == 3


def test_an_empty_image_is_damage_not_a_decoder_crash(tmp_path):
    from helpers.handmade_datasets import image_record, write_shard

    records = [(0, image_record(jpeg_bytes(0, 8, 8), 0.0)), (1, image_record(b"", 1.0))]
    offsets = write_shard(tmp_path / "e.rec", tmp_path / "e.idx", records)
    result = invoke("info", tmp_path / "e.rec")
    assert result.exit_code == 1, result.output
    assert f"e.rec, key 1, byte offset {offsets[1]}: empty image" in result.stdout
    assert result.stderr.startswith("Error: 1 damaged record left out; run `rectool verify")


def test_info_says_whether_the_pack_has_a_binary_index(tmp_path):
    from helpers.handmade_datasets import write_pack

    prefix = tmp_path / "many"
    items = [[(k, jpeg_bytes(k), float(k % 3)) for k in range(s * 4, s * 4 + 4)] for s in range(3)]
    write_pack(prefix, items)  # a format-1 manifest: the .idx text only
    manifest = f"{prefix}.manifest.json"
    assert dataset_info(manifest)["index"] == "text"
    assert invoke("info", manifest).stdout.splitlines()[1] == (
        f"Index: text .idx only; `rectool index {manifest}` writes a binary one"
    )
    pack = make_pack(tmp_path / "three")
    assert dataset_info(pack.manifest)["index"] == "binary"
    assert invoke("info", pack.manifest).stdout.splitlines()[1] == "Index: binary (format 3)"


def zero_rec(pack):
    """Overwrite every byte of the pack's .rec with zeros (its size kept): no record is left to
    read, so figures still right come from the binary index."""
    pack.rec.write_bytes(bytes(pack.size))


def test_info_of_an_indexed_pack_does_not_read_the_rec(tmp_path, monkeypatch):
    from rectool.reader import RecordFile

    pack = make_pack(tmp_path, layout="insightface")
    opened = []
    real_open = RecordFile.open

    def spy(self):
        opened.append(self.path)
        return real_open(self)

    monkeypatch.setattr(RecordFile, "open", spy)
    zero_rec(pack)
    info = dataset_info(pack.manifest, sample=0)
    assert opened == []
    assert (info["layout"], info["records"], info["images"], info["rec_bytes"]) == (
        "insightface",
        16,  # record 0, 12 images, 3 identity records
        12,
        pack.size,
    )
    assert (info["identities"], info["classes"], info["named_identities"]) == (3, 3, 3)
    assert info["images_per_identity"]["histogram"] == [{"images": "3-5", "identities": 3}]
    assert (info["label_flags"], info["damage"], info["index"]) == ({"0": 12}, None, "binary")
    assert (info["image_bytes"], info["encodings"]) == (None, {})


def test_info_of_an_indexed_pack_reads_only_its_sample(tmp_path, monkeypatch):
    from rectool.reader import RecordFile

    pack = make_pack(tmp_path)
    read = []
    real_read_parts = RecordFile.read_parts

    def spy(self, offset, key=None):
        read.append(offset)
        return real_read_parts(self, offset, key)

    monkeypatch.setattr(RecordFile, "read_parts", spy)
    info = dataset_info(pack.manifest, sample=3)
    # Samples 0, 5 and 11, spread evenly: np.linspace(0, 11, 3) is 0, 5.5, 11.
    wanted = [pack.lines[i][1] for i in (0, 5, 11)]
    assert set(read) <= set(wanted)
    assert (info["images"], info["payload_sample"], info["dimensions"]["sampled"]) == (12, 3, 3)
    sizes = [pack.lengths[i] - 24 for i in (0, 5, 11)]  # payload less the image header
    assert info["image_bytes"]["total"] == sum(sizes)
    result = invoke("info", pack.manifest, "--sample", 3)
    assert f"Image bytes (sample of 3): min {min(sizes):,}," in result.stdout
    assert "Encodings (sample of 3): jpeg 3" in result.stdout


def test_info_reads_label_vectors_from_the_binary_index(tmp_path):
    pack = make_pack(tmp_path, pack_label=True)
    zero_rec(pack)
    info = dataset_info(pack.manifest, sample=0)
    assert (info["label_vectors"], info["label_flags"], info["identities"]) == (
        True,
        {"1": 12},
        3,
    )


def test_info_of_a_version_2_pack_reads_its_headers_and_names(small_pack):
    doc = json.loads(small_pack.manifest.read_text())
    names = json.loads((small_pack.manifest.parent / doc["identities"]["file"]).read_text())
    doc["format_version"], doc["identities"] = 2, names  # as version 2 wrote it: no index
    del doc["index"]
    small_pack.manifest.write_text(json.dumps(doc))
    info = dataset_info(small_pack.manifest)
    assert (info["index"], info["images"]) == ("text", 12)
    assert (info["identities"], info["named_identities"]) == (3, len(names))
    assert len(names) == 3
