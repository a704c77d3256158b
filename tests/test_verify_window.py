"""verify reads a .rec through a bounded window (issue 37): every pass over the records (the
framing, the headers, the image signatures and structure, the record checksums, the labels
of the binary index) holds one window's batch of records at a time and hands its pages back
before taking the next, finds what a whole-file read finds, and reports progress inside a
shard, a batch at a time.

The bound is checked through the injection points, never by measuring memory: a window
factory sees every range handed back (as in tests/test_window.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.rec_files import make_pack, xor_byte

from rectool.format.window import RecWindow
from rectool.inspect.verify import DecodeOptions, verify_dataset

SPAN = 4096


class Windows:
    """A window factory that keeps every window it opened and every range they released."""

    def __init__(self, span=SPAN):
        self.span, self.opened, self.released = span, [], []

    def __call__(self, path):
        window = RecWindow(path, self.span, lambda mapping, lo, hi: self.released.append((lo, hi)))
        self.opened.append(window)
        return window


def comparable(report):
    found = report.to_json()
    found.pop("seconds")
    return found


def covered(released, size):
    seen = np.zeros(size, bool)
    for lo, hi in released:
        seen[lo:hi] = True
    return bool(seen.all())


@pytest.mark.parametrize(
    "layout, decode, manifest",
    [
        ("images", None, True),
        ("insightface", None, True),
        ("images", DecodeOptions(), True),
        ("images", None, False),  # no manifest: every record's checksum is compared
    ],
    ids=["images", "insightface", "decode", "no-manifest"],
)
def test_verify_holds_one_window_and_hands_every_page_back(tmp_path, layout, decode, manifest):
    pack = make_pack(tmp_path, layout=layout)
    assert pack.size > 3 * SPAN
    if not manifest:
        pack.manifest.unlink()
    target = str(pack.manifest if manifest else pack.rec)
    whole = verify_dataset(target, decode=decode, workers=2)
    windows = Windows()
    report = verify_dataset(target, decode=decode, workers=2, open_rec=windows)
    assert report.sound and comparable(report) == comparable(whole)
    assert report.record_checksums == (0 if manifest else len(pack.lines))
    (window,) = windows.opened
    # A window, and at most the rest of the record that straddled the one before.
    most = SPAN + max(pack.lengths) + 8
    assert 0 < window.peak <= most
    assert all(hi - lo <= most for lo, hi in windows.released)
    assert covered(windows.released, pack.size)  # every page read was handed back


def test_damage_is_found_the_same_through_a_small_window(tmp_path):
    pack = make_pack(tmp_path)
    key, offset = pack.lines[5]
    xor_byte(pack.rec, offset + 8 + 2, 0x01)  # flag 65536: labels past the record's end
    last_key, last = pack.lines[-1]
    xor_byte(pack.rec, last + 8 + 24 + 40, 0xFF)  # an image's bytes: its checksum differs
    pack.manifest.unlink()  # the record checksums are compared one by one
    whole = verify_dataset(str(pack.rec))
    report = verify_dataset(str(pack.rec), open_rec=Windows())
    assert comparable(report) == comparable(whole)
    assert {(p.kind, p.key, p.offset) for p in report.problems} >= {
        ("bad-header", key, offset),
        ("record-checksum-mismatch", last_key, last),
    }


def test_verify_reports_progress_inside_a_shard_a_batch_at_a_time(tmp_path):
    pack = make_pack(tmp_path)
    calls = []
    report = verify_dataset(
        str(pack.manifest), progress=lambda *call: calls.append(call), open_rec=Windows()
    )
    assert report.sound
    walked = [done for phase, done, total in calls if phase == "bytes"]
    assert all(total == pack.size for phase, _, total in calls if phase == "bytes")
    # Several lines within the one shard, each further on, the last at its end.
    assert len(walked) >= pack.size // SPAN and walked == sorted(walked)
    assert walked[-1] == pack.size
    checked = [(done, total) for phase, done, total in calls if phase == "images"]
    assert len(checked) > 1 and checked[-1] == (len(pack.lines), len(pack.lines))
