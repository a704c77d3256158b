"""rectool.recordio against MXNet 1.9.1's mxnet.recordio: the same results and the same files.

Seeded random operation scripts (tests/helpers/recordio_ops.py) run through both modules: writes
of random payloads with scalar and vector labels (magic words at aligned offsets force split
records), reads, read_idx in random order, seek, reset, close and reopen, pickling in process
and into a forked worker, a fork without pickling. One oracle process runs every script.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import recordio_ops
from helpers.mxnet_oracle import run_mxnet

from rectool import recordio

pytestmark = pytest.mark.oracle

SEEDS = range(20)
OPS_SOURCE = (
    Path(recordio_ops.__file__)
    .read_text(encoding="utf-8")
    .replace("from __future__ import annotations\n", "")
)
ORACLE = (
    OPS_SOURCE
    + """
import os
from mxnet import recordio as _mx
_results = []
for _folder, _script in DATA:
    _results.append(run_script(_mx, _folder, _script))
emit(_results)
"""
)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    base = tmp_path_factory.mktemp("recordio-ops")
    cases = []
    for seed in SEEDS:
        for side in ("mxnet", "rectool"):
            os.makedirs(base / side / str(seed))
        cases.append((seed, recordio_ops.generate(seed), base))
    mxnet = run_mxnet(ORACLE, data=[(str(b / "mxnet" / str(s)), sc) for s, sc, b in cases])
    return [(seed, script, base, mx) for (seed, script, base), mx in zip(cases, mxnet)]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_operations_give_mxnets_results_and_files(scripts, seed):
    _, script, base, (mx_out, mx_files) = scripts[seed]
    out, files = recordio_ops.run_script(recordio, str(base / "rectool" / str(seed)), script)
    assert len(out) == len(mx_out)
    for i, (ours, theirs) in enumerate(zip(out, mx_out)):
        assert ours == theirs, f"seed {seed}: result {i} differs"
    assert files == mx_files  # .idx, .rec, the plain .rec: byte for byte


def test_the_scripts_exercise_split_records_pickling_and_errors(scripts):
    # The generator must keep producing what the differential test claims to cover.
    split = pickled = missing = vectors = 0
    for _, script, _, (mx_out, mx_files) in scripts:
        split += mx_files[1].count(recordio_ops.MAGIC_BYTES) > script["records"]
        pickled += any(op[0] == "worker" for op in script["read"])
        missing += ("error", "KeyError") in mx_out
        vectors += any(
            isinstance(o, tuple)
            and o[0] == "ok"
            and isinstance(o[1], dict)
            and o[1].get("header", ("",) * 5)[4] == "ndarray"
            for o in mx_out
        )
    assert split >= 16 and pickled >= 6 and missing >= 6 and vectors >= 6
