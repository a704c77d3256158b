"""The framing walk: resynchronisation, and the numpy fast path that must agree with the walk."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.rec_files import MAGIC, image_payload, raw_record
from hypothesis import given, settings
from hypothesis import strategies as st

from rectool.errors import RecordFormatError
from rectool.format.writer import frame_record
from rectool.inspect.scan import find_record_start, locate_records, scan_framing


def framed_file(payloads):
    """Return (bytes, offsets) of `payloads` framed by rectool's writer, back to back."""
    data, offsets = b"", []
    for payload in payloads:
        offsets.append(len(data))
        data += frame_record(payload)
    return data, offsets


def as_tuple(framing):
    return (
        framing.size,
        framing.starts.tolist(),
        framing.ends.tolist(),
        framing.lengths.tolist(),
        framing.split.tolist(),
        framing.damage,
        framing.bad_padding,
    )


pieces = st.lists(st.sampled_from([MAGIC, b"ab", b"\xff\xd8\xff", b"\0\0\0\0", b"z"]), max_size=9)
damage = st.one_of(
    st.none(),
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=12)),
)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(pieces, max_size=6), harm=damage)
def test_property_fast_path_agrees_with_the_walk(records, harm):
    data, offsets = framed_file([b"".join(p) for p in records])
    if harm and data:
        if harm[0] == "flip":
            at = harm[1] % len(data)
            data = data[:at] + bytes([data[at] ^ harm[2]]) + data[at + 1 :]
        elif harm[0] == "cut":
            data = data[: harm[1] % len(data)]
        else:
            data += harm[1]
    walked = scan_framing(data, len(data))
    hinted = scan_framing(data, len(data), np.array(offsets, np.int64))
    assert as_tuple(hinted) == as_tuple(walked)
    if harm is None:
        assert walked.starts.tolist() == offsets
        assert walked.damage == []


def test_split_records_rejoin_lengths():
    payload = b"abcd" + MAGIC + b"efgh" + MAGIC + b"xy"
    data, offsets = framed_file([payload, b"plain"])
    framing = scan_framing(data, len(data))
    assert framing.starts.tolist() == offsets
    assert framing.lengths.tolist() == [len(payload), 5]
    assert framing.split.tolist() == [True, False]


def test_resync_needs_alignment_and_a_starting_flag():
    whole = raw_record(b"0123")
    middle = MAGIC + (2 << 29).to_bytes(4, "little") + b"abcd"  # a middle part: no start
    data = b"xx" + MAGIC + b"zz" + middle + whole  # an unaligned magic at byte 2
    assert find_record_start(data, 0, len(data)) == 2 + 4 + 2 + len(middle)
    assert find_record_start(data[:-1], 13, len(data) - 1) == len(data) - len(whole)
    assert find_record_start(b"nothing here", 0, 12) == 12


def test_walk_reports_each_damaged_range():
    records = [raw_record(image_payload(b"\xff\xd8\xff" + bytes([k]), 0.0, k)) for k in range(3)]
    data = records[0] + b"JUNKJUNK" + records[1] + records[2][:10]
    framing = scan_framing(data, len(data))
    first = len(records[0])
    second = first + 8 + len(records[1])
    assert framing.starts.tolist() == [0, first + 8]
    assert [(d.start, d.end, d.kind) for d in framing.damage] == [
        (first, first + 8, "bad-magic"),
        (second, len(data), "truncated"),
    ]


def test_locate_records_rejects_a_mid_record_offset():
    data, offsets = framed_file([b"x" * 40, b"y" * 8])
    lengths, split = locate_records(data, len(data), offsets)
    assert lengths.tolist() == [40, 8]
    with pytest.raises(RecordFormatError, match="key 7, byte offset 12: bad magic"):
        locate_records(data, len(data), [0, 12], keys=[1, 7])
