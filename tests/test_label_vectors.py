"""Label vectors of very different widths: `labels` costs memory for the labels the headers
hold, never records x widest vector (one record of 50,000 labels among 200,000 records once
made `labels` and `repack` ask for 37 GiB)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers.handmade_datasets import write_pack

from rectool.dataset.packs import open_dataset

RECORDS, WIDE = 20_000, 50_000  # dense: 20,000 x 50,000 float32 = 4 GB


@pytest.fixture(scope="module")
def one_wide_vector(tmp_path_factory):
    """RECORDS records with scalar labels 0..; record 7 carries WIDE labels, 3 a pair."""
    folder = tmp_path_factory.mktemp("wide")
    wide = (np.arange(WIDE, dtype=np.float32) * 0.5).tolist()
    items = [(n, b"", float(n)) for n in range(RECORDS)]
    items[7] = (7, b"", wide)
    items[3] = (3, b"", [1.5, -2.0])
    write_pack(folder / "wide", [items[: RECORDS // 2], items[RECORDS // 2 :]])
    return folder / "wide", wide


def test_labels_of_mixed_widths_are_one_object_per_record(one_wide_vector):
    prefix, wide = one_wide_vector
    labels = open_dataset(str(prefix)).labels
    assert labels.dtype == object and labels.shape == (RECORDS,)
    assert labels[7].dtype == np.float32 and labels[7].tolist() == wide
    assert labels[3].tolist() == [1.5, -2.0]
    assert [labels[n] for n in (0, 1, 2, 4, RECORDS - 1)] == [0.0, 1.0, 2.0, 4.0, RECORDS - 1]


LIMITED = textwrap.dedent(
    """
    import resource, sys
    from rectool.errors import RectoolError
    from rectool.dataset.packs import open_dataset
    import rectool.repack.pipeline

    def mapped_bytes():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))

    ds = open_dataset(sys.argv[1])
    limit = mapped_bytes() + 1024 * 2**20  # 1 GiB more: a quarter of the dense matrix
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print(len(ds.labels), len(ds.labels[7]))
    try:
        rectool.repack.pipeline.repack([sys.argv[1]], sys.argv[2])
    except RectoolError as exc:
        print("refused:", exc)
    """
)


def test_labels_and_repack_fit_in_memory_with_one_wide_vector(one_wide_vector, tmp_path):
    prefix, _ = one_wide_vector
    result = subprocess.run(
        [sys.executable, "-c", LIMITED, str(prefix), str(tmp_path / "out" / "r")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{RECORDS} {WIDE}"
    assert lines[1].startswith("refused: source ") and "different widths" in lines[1]
