"""`unpack` never holds the pack (issue 37): the checksum pass reads each shard through a
bounded window, handing its pages back, and the images are read through mappings let go every
`RELEASE_BYTES`; the tree written is the same."""

from __future__ import annotations

import pytest
from helpers.rec_files import make_pack, xor_byte

from rectool.dataset.packs import PackDataset
from rectool.errors import RectoolError
from rectool.format.window import RecWindow
from rectool.inspect import unpack as unpack_module
from rectool.inspect.unpack import unpack_dataset

SPAN = 4096


def tree_files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def windows(monkeypatch):
    """Every window unpack opens, of SPAN bytes, with the ranges it released."""
    opened, released = [], []

    def window(path):
        w = RecWindow(path, SPAN, lambda mapping, lo, hi: released.append((lo, hi)))
        opened.append(w)
        return w

    monkeypatch.setattr(unpack_module, "RecWindow", window)
    return opened, released


def test_the_checksum_pass_reads_a_window_at_a_time_and_hands_it_back(tmp_path, windows):
    pack = make_pack(tmp_path, per_identity=4)
    assert pack.size > 3 * SPAN
    unpack_dataset(pack.manifest, tmp_path / "back")
    opened, released = windows
    (window,) = opened
    assert window.peak <= SPAN and window.bytes_read >= pack.size
    assert released[0][0] == 0 and released[-1][1] == pack.size


def test_a_damaged_record_is_found_through_a_small_window(tmp_path, windows):
    pack = make_pack(tmp_path, per_identity=4)
    key, offset = pack.lines[7]
    xor_byte(pack.rec, offset + 8 + 24 + 50, 0x10)
    with pytest.raises(RectoolError, match=f"key {key} at byte offset {offset}; nothing"):
        unpack_dataset(pack.manifest, tmp_path / "back")
    assert not (tmp_path / "back").exists()


def test_the_mappings_are_let_go_as_images_are_read_and_the_tree_is_the_same(tmp_path, monkeypatch):
    pack = make_pack(tmp_path, per_identity=4)
    unpack_dataset(pack.manifest, tmp_path / "whole")
    closes = []
    real_close = PackDataset.close
    monkeypatch.setattr(PackDataset, "close", lambda ds: closes.append(1) or real_close(ds))
    monkeypatch.setattr(unpack_module, "RELEASE_BYTES", 1)  # after every image
    result = unpack_dataset(pack.manifest, tmp_path / "released")
    assert len(closes) >= result.images == 12
    assert tree_files(tmp_path / "released") == tree_files(tmp_path / "whole")
