"""One layout rule: the reader, `info`, `verify`, `unpack` and `report` agree on every .rec.

Each file is written by hand (tests/helpers/rec_files.py); the expected layout and image count come
from FORMAT-NOTES §5 and docs/format.md §6, not from the code under test.
"""

from __future__ import annotations

from contextlib import closing

import pytest
from helpers.image_files import jpeg_bytes
from helpers.rec_files import image_payload, label_vector_payload, write_records

from rectool.dataset.packs import open_dataset
from rectool.inspect.info import dataset_info
from rectool.inspect.unpack import unpack_dataset
from rectool.inspect.verify import verify_dataset
from rectool.reader import RecordFormatError
from rectool.report.data import ReportOptions, build_report


def header_flag_3(tmp_path):
    """Record 0 has flag 3 and no image (issue 13): an ordinary sample, not a header."""
    return [
        (1, image_payload(jpeg_bytes(1), 0.0, 1)),
        (2, label_vector_payload([1.0, 2.0], 2)),
        (0, label_vector_payload([2.0, 3.0, 0.0], 0, id2=1)),
    ]


def header_with_image(tmp_path):
    """Record 0 has the header's flag and labels but carries image bytes: a sample."""
    return [
        (1, image_payload(jpeg_bytes(1), 0.0, 1)),
        (2, label_vector_payload([1.0, 2.0], 2)),
        (0, label_vector_payload([2.0, 3.0], 0, image=jpeg_bytes(0), id2=1)),
    ]


def header_before_label_vectors(tmp_path):
    """Record 0 looks like a header, but key 1 has a label vector (im2rec --pack-label)."""
    return [
        (0, label_vector_payload([2.0, 3.0], 0)),
        (1, label_vector_payload([0.0, 1.0], 1, image=jpeg_bytes(1))),
        (2, label_vector_payload([1.0, 0.0], 2, image=jpeg_bytes(2))),
    ]


def insightface(tmp_path):
    """A true insightface header: flag 2, no image, labels [2, 3]; one image, one identity."""
    return [
        (1, image_payload(jpeg_bytes(1), 0.0, 1)),
        (2, label_vector_payload([1.0, 2.0], 2)),
        (0, label_vector_payload([2.0, 3.0], 0, id2=1)),
    ]


# (records, the layout every reader must see, the images in it)
CASES = {
    "record 0 with flag 3": (header_flag_3, "images", 3),
    "record 0 with image bytes": (header_with_image, "images", 3),
    "key 1 with a label vector": (header_before_label_vectors, "images", 3),
    "insightface header": (insightface, "insightface", 1),
}


def via_open_dataset(rec, tmp_path):
    with closing(open_dataset(rec)) as ds:
        return ds.layout, len(ds)


def via_info(rec, tmp_path):
    info = dataset_info(rec, sample=0)  # an empty record is no image to measure
    return info["layout"], info["images"]


def via_verify(rec, tmp_path):
    report = verify_dataset(rec)
    assert len(report.layouts) == 1
    return report.layouts[0], report.images


def via_unpack(rec, tmp_path):
    result = unpack_dataset(rec, tmp_path / "unpacked")
    return result.layout, result.images


def via_report(rec, tmp_path):
    info = build_report(rec, ReportOptions(sample=0, identities=1, per_identity=1)).info
    return info["layout"], info["images"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "ask",
    [via_open_dataset, via_info, via_verify, via_unpack, via_report],
    ids=lambda f: f.__name__,
)
def test_every_reader_sees_the_same_layout(tmp_path, case, ask):
    records, layout, images = CASES[case]
    rec, idx = tmp_path / "train.rec", tmp_path / "train.idx"
    write_records(rec, idx, records(tmp_path))
    assert ask(rec, tmp_path) == (layout, images)


def test_a_manifest_that_says_images_over_an_insightface_header_is_refused(tmp_path):
    # The reader applies the rule even when the manifest claims a layout: record 0 here is a
    # header (it would otherwise be read as a sample with an empty image), so the claim is
    # wrong. An explicit layout="images" still reads every record as it is.
    from helpers.handmade_datasets import write_insightface, write_manifest

    write_insightface(tmp_path / "f.rec", tmp_path / "f.idx", [2, 1], jpeg_bytes)
    entry = {"rec": "f.rec", "idx": "f.idx", "records": 6}
    write_manifest(tmp_path / "f", [entry], "images")
    with pytest.raises(RecordFormatError, match="manifest says layout images, but record 0"):
        open_dataset(tmp_path / "f.manifest.json")
    assert len(open_dataset(tmp_path / "f.manifest.json", layout="images")) == 6
    (tmp_path / "f.manifest.json").unlink()
    assert len(open_dataset(tmp_path / "f.rec")) == 3  # the rule alone: insightface
