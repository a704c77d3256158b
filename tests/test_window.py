"""A scan that does not hold the pack (issue 37): `RecWindow` hands each window's pages back
before it gives out the next, and `info` and `report` of a pack with a binary index answer
from the index, reading the .rec only for their sample, sizes and thumbnails.

The bound is checked through the injection points, never by measuring memory: a release hook
sees every range handed back, and a window factory counts the bytes given out."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest
from helpers.handmade_datasets import MAGIC, write_pack
from helpers.rec_files import make_pack
from hypothesis import given
from hypothesis import strategies as st

from rectool.dataset.packs import PackDataset
from rectool.format import headers
from rectool.format import records as records_module
from rectool.format.textindex import load_index
from rectool.format.window import FAULT_AROUND, RecWindow, ascending, release_range
from rectool.inspect.info import dataset_info
from rectool.reader import RecordFile
from rectool.report.data import ReportOptions, build_report
from rectool.report.images import ImageTable, scan_images

SPAN = 4096


class Windows:
    """A window factory that keeps every window it opened and every range they released."""

    def __init__(self, span=SPAN):
        self.span, self.opened, self.released = span, [], []

    def __call__(self, path):
        window = RecWindow(path, self.span, lambda mapping, lo, hi: self.released.append((lo, hi)))
        self.opened.append(window)
        return window

    @property
    def bytes_read(self):
        return sum(w.bytes_read for w in self.opened)


@pytest.fixture
def pack(tmp_path):
    """A pack of 12 JPEGs (64x48, about 1 KB each) over several windows of SPAN bytes."""
    pack = make_pack(tmp_path, per_identity=4)
    assert pack.size > 3 * SPAN
    return pack


def test_a_scan_holds_one_window_and_hands_every_page_back(pack):
    windows = Windows()
    with PackDataset(pack.manifest) as ds:
        images = ImageTable.from_index(ds)
        scan_images(images, windows)
        sizes, prints = images.sizes.copy(), images.prints.copy()
    (window,) = windows.opened
    assert window.peak <= SPAN
    # Ranges released in file order, each at most a window, together the whole file.
    assert all(hi - lo <= SPAN for lo, hi in windows.released)
    assert windows.released[0][0] == 0 and windows.released[-1][1] == pack.size
    assert all(b[0] == a[1] for a, b in zip(windows.released, windows.released[1:]))
    assert windows.bytes_read == pack.size  # each byte once
    # The same facts as one window over the whole file.
    with PackDataset(pack.manifest) as ds:
        images = ImageTable.from_index(ds)
        scan_images(images)
    assert images.sizes.tolist() == sizes.tolist() == [n - 24 for n in pack.lengths]
    assert images.prints.tolist() == prints.tolist()


def test_a_record_longer_than_the_window_gets_a_cut_batch_and_reads_whole(pack):
    last = pack.size - 100
    starts = np.array([0, last], np.int64)  # a first "record" far longer than the window
    with RecWindow(pack.rec, SPAN) as window:
        assert list(window.batches(starts)) == [(0, 1, 0, SPAN), (1, 2, last, pack.size)]
        assert window.record(0) == pack.rec.read_bytes()[8 : 8 + pack.lengths[0]]
        assert window.bytes_read == pack.lines[1][1]  # the record, padding included


def test_a_view_over_the_window_is_refused(pack):
    with RecWindow(pack.rec, SPAN) as window:
        with pytest.raises(ValueError, match="over the window"):
            window.view(0, SPAN + 4)
        assert len(window.view(pack.size - 10, pack.size + 100)) == 10  # clipped to the file
        assert len(window.view(pack.size + 8, pack.size + 100)) == 0  # wholly past the end


def test_a_scan_of_an_index_pointing_past_the_end_names_the_records(pack):
    # An offsets.npy that points past the shard (the fuzz test's overwritten index) used to
    # end in a numpy ValueError traceback: each such record is damage named by its offset.
    with PackDataset(pack.manifest) as ds:
        images = ImageTable.from_index(ds)
    images.offsets = images.offsets.copy()
    images.offsets[-2:] = [pack.size + 4, pack.size + 4096]
    facts = scan_images(images, Windows())
    assert images.sizes[-2:].tolist() == [-1, -1]
    assert (images.sizes[:-2] > 0).all()
    assert facts.damaged == 2
    assert [offset for _, _, offset, _ in facts.damage] == [pack.size + 4, pack.size + 4096]


@given(
    gaps=st.lists(st.integers(0, 3000).map(lambda n: n * 4), min_size=0, max_size=60),
    span=st.sampled_from([4096, 8192]),
)
def test_batches_cover_every_record_once_within_the_span(tmp_path_factory, gaps, span):
    starts = np.cumsum(np.array([0, *gaps], np.int64))[: len(gaps)]
    path = tmp_path_factory.mktemp("w") / "x.rec"
    path.write_bytes(b"\0" * (int(starts[-1]) + 64 if len(starts) else 64))
    with RecWindow(path, span) as window:
        batches = list(window.batches(starts))
    rows = [r for i, j, _, _ in batches for r in range(i, j)]
    assert rows == list(range(len(starts)))
    for i, j, lo, hi in batches:
        assert lo == starts[i] and hi - lo <= span
        cut = (starts[i:j] == lo).all() and hi - lo == span  # records at one offset, cut
        assert ((starts[i:j] < hi).all() and hi == (starts[j] if j < len(starts) else hi)) or cut


def test_ascending_says_when_a_sort_is_needed():
    assert ascending(np.array([0, 4, 4, 12])) is None
    assert ascending(np.array([8, 0, 4])).tolist() == [1, 2, 0]


# --- info and report from the binary index --------------------------------------------------


def zeroed(pack):
    """Replace the pack's .rec by as many zero bytes, as if it could not be read."""
    size = pack.rec.stat().st_size
    stat = pack.rec.stat()
    pack.rec.write_bytes(b"\0" * size)
    os.utime(pack.rec, ns=(stat.st_atime_ns, stat.st_mtime_ns))


IDENTITY_FIELDS = ("images", "records", "identities", "classes", "images_per_identity", "layout")


def test_info_answers_from_the_index_reading_only_its_sample(pack):
    before = dataset_info(pack.manifest, sample=2)
    windows = Windows()
    info = dataset_info(pack.manifest, sample=2, open_rec=windows)
    assert info["index"] == "binary"
    assert windows.bytes_read <= 2 * max(pack.lengths) + 16  # the two sampled records
    zeroed(pack)
    windows = Windows()
    after = dataset_info(pack.manifest, sample=2, open_rec=windows)
    assert {k: after[k] for k in IDENTITY_FIELDS} == {k: before[k] for k in IDENTITY_FIELDS}
    assert after["damage"]["records"] == 2  # the sampled records, named
    assert windows.bytes_read == 2 * 8  # a part header each, refused


def test_report_label_statistics_answer_when_the_rec_cannot_be_read(pack):
    options = ReportOptions(identities=2, per_identity=2, sample=2)
    before = build_report(pack.manifest, options)
    zeroed(pack)
    windows = Windows()
    after = build_report(pack.manifest, options, open_rec=windows)
    assert {k: after.info[k] for k in IDENTITY_FIELDS} == {
        k: before.info[k] for k in IDENTITY_FIELDS
    }
    assert after.info["damage"]["records"] == after.info["images"] == 12
    # The scan reads the file once; then a part header per thumbnail and sampled record.
    assert windows.bytes_read <= pack.size + 8 * 64
    assert all(w.peak <= SPAN for w in windows.opened)


def test_labels_read_from_the_headers_hand_each_chunk_back(pack, monkeypatch):
    released = []
    monkeypatch.setattr(headers, "LABEL_CHUNK", 4)
    monkeypatch.setattr(headers, "release_range", lambda m, lo, hi: released.append((lo, hi)))
    keys, offsets = load_index(pack.idx)
    rf = RecordFile(pack.rec)
    try:
        labels = headers.header_labels([rf], headers.shard_numbers([len(keys)]), offsets, keys)
    finally:
        rf.close()
    assert labels.tolist() == [k // 4 for k in range(12)]  # 4 images an identity
    # 12 records, 4 a chunk: each chunk's pages handed back before the next is read.
    assert [lo for lo, _ in released] == offsets[::4].tolist()
    assert all(hi <= start + 64 for (_, hi), start in zip(released, offsets[3::4].tolist()))


@pytest.mark.parametrize("with_idx", [True, False], ids=["idx", "no-idx"])
def test_info_from_every_header_reads_a_window_at_a_time(pack, with_idx):
    pack.manifest.unlink()  # no binary index: every record header is read
    if not with_idx:
        pack.idx.unlink()  # no .idx either: the framing is walked
    whole = dataset_info(pack.rec, sample=0)
    windows = Windows()
    info = dataset_info(pack.rec, sample=0, open_rec=windows)
    assert info == whole and info["index"] == "text" and info["images"] == 12
    (window,) = windows.opened
    # A window, and at most the tail of the record that straddled the one before.
    most = SPAN + max(pack.lengths) + 8
    assert window.peak <= most
    assert all(hi - lo <= most for lo, hi in windows.released)
    covered = np.zeros(pack.size, bool)
    for lo, hi in windows.released:
        covered[lo:hi] = True
    assert covered.all()


def test_released_ranges_take_whole_fault_around_blocks(pack):
    # A read fault maps the cached pages of the block around it too: releasing only a
    # record's own pages would leave its neighbours mapped, record after record.
    calls = []

    class Recorded(mmap.mmap):
        def madvise(self, *args):
            calls.append(args)

    with open(pack.rec, "rb") as f:
        mapping = Recorded(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        release_range(mapping, 5000, 6000)
        release_range(mapping, 3 << 20, (3 << 20) + 1)
    finally:
        mapping.close()
    size = pack.size
    assert FAULT_AROUND == 2 << 20 and size < FAULT_AROUND
    assert calls == [(mmap.MADV_DONTNEED, 0, size)]  # the block, to the end; none past it


def test_iter_records_hands_the_walked_pages_back_behind_it(pack, monkeypatch):
    released = []
    monkeypatch.setattr(records_module, "WINDOW_BYTES", SPAN)
    rf = RecordFile(pack.rec)
    try:
        walked = list(
            records_module.iter_records(rf, release=lambda m, lo, hi: released.append((lo, hi)))
        )
    finally:
        rf.close()
    assert [offset for offset, _ in walked] == [offset for _, offset in pack.lines]
    assert released[0][0] == 0 and released[-1][1] == pack.size
    assert all(b[0] == a[1] for a, b in zip(released, released[1:]))
    assert all(hi - lo < SPAN + max(pack.lengths) + 12 for lo, hi in released)


def test_the_report_owns_twelve_bytes_an_image_beside_the_mapped_index(pack):
    # Issue 37: no per-image objects; what the report keeps of each image is the index's own
    # mapped arrays plus an int32 size and a uint64 fingerprint.
    with PackDataset(pack.manifest) as ds:
        images = ImageTable.from_index(ds)
        scan_images(images)
        owned = {
            name: a
            for name, a in vars(images).items()
            if isinstance(a, np.ndarray) and a.flags.owndata
        }
        assert sorted(owned) == ["prints", "sizes"]
        assert sum(a.nbytes for a in owned.values()) == 12 * len(images)
        assert all(a.dtype != object for a in vars(images).values() if isinstance(a, np.ndarray))


def test_a_single_record_is_read_from_the_file_mapping_nothing(pack, tmp_path):
    windows = Windows()
    key, offset = pack.lines[5]
    end = pack.lines[6][1]
    with windows(pack.rec) as window:
        assert (
            window.record(offset, key)
            == pack.rec.read_bytes()[offset + 8 : offset + 8 + pack.lengths[5]]
        )
        assert window.read(offset, 8) == pack.rec.read_bytes()[offset : offset + 8]
    assert windows.released == []  # nothing was mapped: nothing to hand back
    assert windows.bytes_read == end - offset + 8
    # A split record goes through the reader's walk on the mapping, handed back at once.
    image = b"\xff\xd8\xff\xe0" + MAGIC * 3 + b"tail"  # a magic at an aligned offset: split
    samples = write_pack(tmp_path / "p", [[(0, image, 0.0)]])
    windows = Windows()
    with windows(tmp_path / "p.rec") as window:
        record = window.record(samples[0].offset)
    assert record.endswith(image) and windows.released == [(0, (tmp_path / "p.rec").stat().st_size)]
