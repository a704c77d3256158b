"""Run code under the real MXNet 1.9.1 in its own virtual environment, through a subprocess.

MXNet needs numpy<1.24 and so cannot share the test environment; `make test` builds
`.venv-oracle` and points RECTOOL_ORACLE_PYTHON at it. Data crosses the boundary as pickles
of plain Python values (bytes, ints, floats, lists).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def oracle_python():
    """Return the oracle interpreter's path, or None when it has not been built."""
    configured = os.environ.get("RECTOOL_ORACLE_PYTHON")
    path = Path(configured) if configured else REPO / ".venv-oracle" / "bin" / "python"
    return path if path.exists() else None


def run_mxnet(code, data=None, timeout=600, cwd=None):
    """Run `code` with MXNet importable; pass `data` as `DATA`, return what it gives to `emit()`.

    The code sees `DATA` (the unpickled argument) and calls `emit(value)` once with a
    picklable result. A failing script raises AssertionError carrying its stderr.
    """
    python = oracle_python()
    if python is None:
        raise AssertionError(
            "the MXNet oracle environment is missing: run `make oracle` (or `make test`)"
        )
    prelude = textwrap.dedent(
        """
        import pickle, sys
        DATA = pickle.loads(sys.stdin.buffer.read())
        def emit(value):
            sys.stdout.buffer.write(pickle.dumps(value, protocol=4))
        """
    )
    proc = subprocess.run(
        [str(python), "-c", prelude + textwrap.dedent(code)],
        input=pickle.dumps(data, protocol=4),
        capture_output=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "MXNET_SUBGRAPH_VERBOSE": "0"},
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"MXNet oracle script failed (exit {proc.returncode}):\n"
            f"{proc.stderr.decode(errors='replace')[-4000:]}"
        )
    return pickle.loads(proc.stdout) if proc.stdout else None


def im2rec_path():
    """Return the path of `im2rec.py` inside the oracle's MXNet wheel."""
    return run_mxnet(
        "import os, mxnet\n"
        "emit(os.path.join(os.path.dirname(mxnet.__file__), 'tools', 'im2rec.py'))"
    )


__all__ = ["im2rec_path", "oracle_python", "run_mxnet"]


# arcface_torch's MXFaceDataset, as it reads an insightface pack: record 0's label gives the
# image keys 1..N and the identity records' key range; emits (samples, ranges) where each
# sample is (key, image bytes, label) and each range is [start, end) of samples.
MX_FACE_DATASET = """
import numbers
import numpy as np
import mxnet as mx
rec = mx.recordio.MXIndexedRecordIO(DATA["idx"], DATA["rec"], "r")
header, _ = mx.recordio.unpack(rec.read_idx(0))
samples = []
for idx in np.array(range(1, int(header.label[0]))):
    h, image = mx.recordio.unpack(rec.read_idx(int(idx)))
    label = h.label if isinstance(h.label, numbers.Number) else h.label[0]
    samples.append((int(idx), image, float(label)))
ranges = []
for key in range(int(header.label[0]), int(header.label[1])):
    h, _ = mx.recordio.unpack(rec.read_idx(key))
    ranges.append([int(h.label[0]) - 1, int(h.label[1]) - 1])
emit((samples, ranges))
"""


# Every record in .idx order, as MXNet's own reader returns it: (key, image bytes, label,
# the image decoded by mx.image.imdecode when DATA["decode"], else None).
MX_READ_ALL = """
import numbers
import mxnet as mx
rec = mx.recordio.MXIndexedRecordIO(DATA["idx"], DATA["rec"], "r")
out = []
for key in rec.keys:
    header, image = mx.recordio.unpack(rec.read_idx(key))
    label = header.label
    label = float(label) if isinstance(label, numbers.Number) else [float(x) for x in label]
    rgb = mx.image.imdecode(image).asnumpy() if DATA.get("decode") else None
    out.append((key, image, label, rgb))
emit(out)
"""


# insightface's recognition/partial_fc/unpack_glint360k.py, as it walks a pack: record 0 gives
# the identity records' keys, each identity record its images' keys, and each image's label is
# `int(header.label[0])` (a label vector's first; a scalar label fails there, as in
# insightface). Emits [(key, label, image bytes)] in that order.
UNPACK_GLINT360K = """
import mxnet as mx
rec = mx.recordio.MXIndexedRecordIO(DATA["idx"], DATA["rec"], "r")
header, _ = mx.recordio.unpack(rec.read_idx(0))
assert header.flag > 0
out = []
for identity in range(int(header.label[0]), int(header.label[1])):
    header, _ = mx.recordio.unpack(rec.read_idx(identity))
    for idx in range(int(header.label[0]), int(header.label[1])):
        _header, _img = mx.recordio.unpack(rec.read_idx(idx))
        out.append((idx, int(_header.label[0]), _img))
emit(out)
"""
