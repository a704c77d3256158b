"""verify's checks are functions of a shard's facts: each runs alone, in any order, as often.

Expected keys and offsets come from the .idx text and the raw bytes (tests/helpers/rec_files.py).
"""

from __future__ import annotations

import pytest
import xxhash
from helpers.rec_files import make_pack, xor_byte

from rectool.dataset.sources import resolve_source
from rectool.format.window import RecWindow
from rectool.inspect.verify import (
    DatasetFacts,
    Found,
    check_framing,
    check_headers,
    check_index,
    check_index_file,
    check_layout,
    check_manifest_entry,
    check_record_checksums,
    read_shard,
)


def never_vouched(path):
    return False


CHECKS = {
    "index file": check_index_file,
    "framing": check_framing,
    "index": check_index,
    "layout": check_layout,
    "headers": check_headers,
    "manifest entry": check_manifest_entry,
    "record checksums": lambda facts: check_record_checksums(facts, never_vouched),
}


def problems(check, facts):
    """Return the (kind, key, offset, message) a check yields, its totals checked against them."""
    out = []
    for found in check(facts):
        if isinstance(found, Found):
            listed = [
                (found.kind, key, offset, message) for _, key, offset, message in found.problems
            ]
            assert len(listed) == found.total
            out += listed
    return out


@pytest.mark.parametrize("order", [list(CHECKS), list(CHECKS)[::-1]], ids=["listed", "reversed"])
def test_each_check_finds_the_same_whatever_ran_before(tmp_path, order):
    pack = make_pack(tmp_path)
    key, offset = pack.lines[5]
    end = pack.lines[6][1]
    packed = xxhash.xxh3_64_intdigest(pack.rec.read_bytes()[offset:end])
    xor_byte(pack.rec, offset + 8 + 4 + 3, 0x7F)  # label 1.0 (3f 80 00 00) -> 4.0 (40 80 00 00)
    manifest, manifest_path, shards = resolve_source(str(pack.manifest))
    dataset = DatasetFacts.of(manifest, manifest_path, shards)
    with RecWindow(pack.rec) as window:
        facts = read_shard(dataset, 0, window)
        found = {name: problems(CHECKS[name], facts) for name in order}
        again = {name: problems(CHECKS[name], facts) for name in order}
    assert found == again
    assert {name: kinds for name, kinds in found.items() if kinds} == {
        "headers": [("bad-label", key, offset, "label 4.0 is outside the 3 classes 0..2")],
        "record checksums": [
            (
                "record-checksum-mismatch",
                key,
                offset,
                f"record 5 of {pack.rec.name}.crc: bytes {offset}..{end} differ from their "
                f"xxh3-64 ({packed:016x} when packed); the record is damaged",
            )
        ],
    }
