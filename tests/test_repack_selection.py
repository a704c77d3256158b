"""`rectool.repack.selection`: the pure functions that choose, relabel and order records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rectool.errors import RectoolError
from rectool.repack import selection

labels_strategy = st.lists(st.integers(0, 6), min_size=0, max_size=40).map(
    lambda xs: np.array(xs, np.int64)
)


def test_max_per_identity_keeps_the_first_in_record_order():
    labels = np.array([2, 0, 2, 2, 0, 1, 2])
    kept = selection.max_per_identity(labels, np.ones(7, bool), 2)
    assert np.flatnonzero(kept).tolist() == [0, 1, 2, 4, 5]


def test_min_per_identity_counts_only_records_still_kept():
    labels = np.array([0, 0, 1, 1, 1])
    mask = np.array([True, False, True, True, True])
    assert selection.min_per_identity(labels, mask, 2).tolist() == [False] * 2 + [True] * 3


def relabel(labels, mask):
    """(new label per record, -1 where not kept; old labels in new-label order), as a repack's
    plan reads them from `relabel_table` (`Plan.new_labels`)."""
    table, old = selection.relabel_table(labels, mask)
    new = np.full(len(labels), -1, np.int64)
    new[mask] = table[labels[mask]]
    return new, old


def test_relabel_closes_gaps_in_label_order():
    labels = np.array([9, 4, 9, 7])
    mask = np.array([True, True, True, False])
    new, old = relabel(labels, mask)
    assert old.tolist() == [4, 9]
    assert new[mask].tolist() == [1, 0, 1]


def test_identity_order_is_stable_within_an_identity():
    labels = np.array([1, 0, 1, 0])
    rows = selection.output_order(labels, np.ones(4, bool), "identity")
    assert rows.tolist() == [1, 3, 0, 2]


def test_duplicate_groups_within_and_across_identities():
    digests = np.array([[1, 1], [2, 2], [1, 1], [2, 2], [3, 3]], np.uint64)
    labels = np.array([0, 0, 0, 1, 1])
    first, shared = selection.duplicate_groups(digests, labels, np.ones(5, bool))
    assert first.tolist() == [0, 1, 0, 3, 4]
    assert shared.tolist() == [False, True, False, True, False]


def test_read_id_list_prefers_names_then_labels(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("007\n2\n# note\n\n")
    names = {0: "ann", 1: "007", 2: "cyd"}
    assert selection.read_id_list(path, names).tolist() == [1, 2]


def test_read_id_list_names_unknown_lines(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("ann\nzed\n5\n")
    with pytest.raises(RectoolError, match=r"2 unknown identities: line 2: 'zed', line 3: '5'"):
        selection.read_id_list(path, {0: "ann", 1: "bob"})


@given(labels_strategy, st.integers(1, 4), st.integers(0, 3))
def test_max_per_identity_bounds_every_identity(labels, maximum, seed):
    for pick in ("first", "random"):
        kept = selection.max_per_identity(labels, np.ones(len(labels), bool), maximum, pick, seed)
        counts = np.bincount(labels[kept], minlength=7)
        assert (counts == np.minimum(np.bincount(labels, minlength=7), maximum)).all()


@given(labels_strategy, st.integers(0, 3))
def test_shuffle_is_a_permutation_and_seeded(labels, seed):
    mask = np.ones(len(labels), bool)
    rows = selection.output_order(labels, mask, "shuffle", seed)
    assert sorted(rows.tolist()) == list(range(len(labels)))
    assert (selection.output_order(labels, mask, "shuffle", seed) == rows).all()


@given(labels_strategy)
def test_relabel_is_contiguous_and_order_preserving(labels):
    mask = np.ones(len(labels), bool)
    new, old = relabel(labels, mask)
    assert sorted(set(new.tolist())) == list(range(len(old)))
    assert (old[new] == labels).all()


@given(st.lists(st.integers(-(2**62), 2**62), max_size=60))
def test_distinct_is_numpys_unique(values):
    array = np.array(values, np.int64)
    assert np.array_equal(selection.distinct(array), np.unique(array))
    assert selection.distinct(array).dtype == np.int64
