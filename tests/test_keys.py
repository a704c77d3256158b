"""rectool.format.keys: a repeated .idx key keeps its last line; the float32 limit on keys."""

from __future__ import annotations

import numpy as np

from rectool.format.keys import FLOAT32_EXACT, last_line_wins


def test_a_repeated_key_keeps_its_last_line_in_file_order():
    keys = np.array([5, 3, 5, 7, 3, 9], np.int64)
    offsets = np.array([0, 10, 20, 30, 40, 50], np.int64)
    kept_keys, kept_offsets = last_line_wins(keys, offsets)
    assert kept_keys.tolist() == [5, 7, 3, 9]
    assert kept_offsets.tolist() == [20, 30, 40, 50]


def test_no_repeats_keep_everything():
    keys = np.array([2, 1, 0], np.int64)
    offsets = np.array([0, 8, 16], np.int64)
    kept_keys, kept_offsets = last_line_wins(keys, offsets)
    assert kept_keys.tolist() == [2, 1, 0]
    assert kept_offsets.tolist() == [0, 8, 16]


def test_float32_is_exact_up_to_the_limit_and_not_past_it():
    assert int(np.float32(FLOAT32_EXACT)) == FLOAT32_EXACT
    assert int(np.float32(FLOAT32_EXACT + 1)) != FLOAT32_EXACT + 1
    assert FLOAT32_EXACT == 16_777_216
