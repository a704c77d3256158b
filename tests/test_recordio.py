"""rectool.recordio where it differs from MXNet on purpose, and its image helpers.

Each difference listed in docs/migration.md has a test here that shows MXNet's behaviour (run
in the oracle) next to ours. The image helpers are compared with MXNet's on the same bytes.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from helpers.mxnet_oracle import run_mxnet

from rectool import recordio

pytestmark = pytest.mark.oracle

# Every scenario in one oracle process: MXNet writes the files, the test damages them, MXNet
# reads them; rectool then reads the same (damaged) files.
MX_SCENARIOS = """
import os
from mxnet import recordio
def attempt(f):
    try:
        return ('ok', f())
    except Exception as exc:
        return ('error', type(exc).__name__)
results = {}
for name, sc in DATA.items():
    os.makedirs(sc['folder'])
    idx, rec = sc['folder'] + '/a.idx', sc['folder'] + '/a.rec'
    w = recordio.MXIndexedRecordIO(idx, rec, 'w')
    for key, payload in sc['records']:
        w.write_idx(key, payload)
    w.close()
    kind, *args = sc['damage']
    if kind == 'patch':
        data = bytearray(open(rec, 'rb').read())
        data[args[0] : args[0] + len(args[1])] = args[1]
        open(rec, 'wb').write(bytes(data))
    elif kind == 'truncate':
        os.truncate(rec, os.path.getsize(rec) - args[0])
    elif kind == 'idx':
        open(idx, 'w').write(args[0])
    elif kind == 'remove':
        os.remove(idx)
    r = attempt(lambda: recordio.MXIndexedRecordIO(idx, rec, 'r'))
    out = [r if r[0] == 'error' else 'opened']
    if r[0] == 'ok':
        r = r[1]
        for op, key in sc['ops']:
            out.append(attempt(lambda: r.read() if op == 'read' else r.read_idx(key)))
    results[name] = out
emit(results)
"""

RECORDS = [(0, b"zero"), (1, b"one-record"), (2, b"two")]
SCENARIOS = {
    "eof": (RECORDS, ("none",), [("read", None)] * 4 + [("read_idx", 1)]),
    "damaged": (RECORDS, ("patch", 12, b"XXXX"), [("read_idx", 1)]),  # key 1's magic
    "cut": ([(0, b"zero"), (7, b"x" * 100)], ("truncate", 10), [("read_idx", 7)]),
    "past_end": (RECORDS, ("idx", "0\t0\n9\t4096\n"), [("read_idx", 9)]),
    "negative": (RECORDS, ("idx", "0\t0\n9\t-16\n"), [("read_idx", 9)]),
    "missing": (RECORDS, ("none",), [("read_idx", 5)]),
    "no_tab": (RECORDS, ("idx", "0\t0\n1\n"), []),
    "blank_line": (RECORDS, ("idx", "0\t0\n\n1\t12\n"), []),
    "bad_key": (RECORDS, ("idx", "x\t0\n"), []),
    "no_idx": (RECORDS, ("remove",), []),
}


@pytest.fixture(scope="module")
def mx(tmp_path_factory):
    base = tmp_path_factory.mktemp("recordio-differences")
    data = {
        name: {"folder": str(base / name), "records": r, "damage": d, "ops": ops}
        for name, (r, d, ops) in SCENARIOS.items()
    }
    return {name: (out, base / name) for name, out in run_mxnet(MX_SCENARIOS, data=data).items()}


def opened(folder):
    return recordio.MXIndexedRecordIO(str(folder / "a.idx"), str(folder / "a.rec"), "r")


def test_read_idx_after_the_end_reads_the_record_where_mxnet_returns_none(mx):
    out, folder = mx["eof"]
    records = [("ok", b"zero"), ("ok", b"one-record"), ("ok", b"two"), ("ok", None)]
    assert out == ["opened", *records, ("ok", None)]  # MXNet: stuck at the end until reset()
    r = opened(folder)
    assert [r.read() for _ in range(4)] == [b"zero", b"one-record", b"two", None]
    assert r.read_idx(1) == b"one-record"


def test_a_damaged_record_raises_a_named_error_where_mxnet_aborts(mx):
    out, folder = mx["damaged"]
    assert out == ["opened", ("error", "MXNetError")]
    r = opened(folder)
    with pytest.raises(recordio.RecordFormatError) as exc:
        r.read_idx(1)
    rec = str(folder / "a.rec")
    assert (exc.value.path, exc.value.key, exc.value.offset) == (rec, 1, 12)
    assert f"{rec}, key 1, byte offset 12: bad magic 0x58585858" in str(exc.value)
    assert r.read_idx(2) == b"two"  # the others still read


def test_a_record_cut_short_raises_a_named_error_where_mxnet_aborts(mx):
    out, folder = mx["cut"]
    assert out == ["opened", ("error", "MXNetError")]
    r = opened(folder)
    with pytest.raises(recordio.RecordFormatError, match="record cut short") as exc:
        r.read_idx(7)
    assert (exc.value.key, exc.value.offset) == (7, 12)
    r.reset()
    assert r.read() == b"zero"
    with pytest.raises(recordio.RecordFormatError, match="byte offset 12: record cut short"):
        r.read()  # sequentially: no key, the offset


def test_an_idx_offset_past_the_end_raises_where_mxnet_returns_none(mx):
    out, folder = mx["past_end"]
    assert out == ["opened", ("ok", None)]
    with pytest.raises(
        recordio.RecordFormatError,
        match="key 9, byte offset 4096: record cut short: expected a part header, found the end",
    ):
        opened(folder).read_idx(9)


def test_a_negative_idx_offset_raises_where_mxnet_aborts(mx):
    out, folder = mx["negative"]
    assert out == ["opened", ("error", "MXNetError")]  # its fseek fails
    with pytest.raises(
        recordio.RecordFormatError, match="key 9, byte offset -16: not a record start .a negative"
    ):
        opened(folder).read_idx(9)


def test_a_missing_key_is_a_named_key_error_as_mxnets_key_error(mx):
    out, folder = mx["missing"]
    assert out == ["opened", ("error", "KeyError")]
    with pytest.raises(KeyError) as exc:
        opened(folder).read_idx(5)
    assert isinstance(exc.value, recordio.MissingKeyError)
    assert str(exc.value) == f"{folder / 'a.idx'}: key 5 is not in the index (3 keys)"


@pytest.mark.parametrize(
    ("name", "mxnet_error", "line"),
    [("no_tab", IndexError, 2), ("blank_line", ValueError, 2), ("bad_key", ValueError, 1)],
)
def test_a_bad_idx_line_is_a_named_error_of_mxnets_class(mx, name, mxnet_error, line):
    out, folder = mx[name]
    assert out == [("error", mxnet_error.__name__)]
    with pytest.raises(recordio.IndexFormatError, match=f"a.idx: line {line}: ") as exc:
        opened(folder)
    assert isinstance(exc.value, mxnet_error)


def test_a_missing_idx_is_mxnets_file_not_found_error(mx):
    out, folder = mx["no_idx"]
    assert out == [("error", "FileNotFoundError")]  # its open() of the .idx
    idx = folder / "a.idx"
    with pytest.raises(FileNotFoundError, match=f"No such file or directory: '{idx}'") as exc:
        opened(folder)
    assert exc.value.filename == str(idx)


MX_IMAGES = """
import numpy as np, mxnet as mx
from mxnet import recordio
img = np.frombuffer(DATA['pixels'], np.uint8).reshape(DATA['shape'])
out = {}
for fmt, q in (('.png', 3), ('.PNG', 9), ('.jpg', 90)):
    s = recordio.pack_img(recordio.IRHeader(0, 5, 7, 0), img, quality=q, img_fmt=fmt)
    out[fmt] = s
for key, s in DATA['ours'].items():
    for iscolor in (-1, 0, 1):
        h, im = recordio.unpack_img(s, iscolor)
        head = tuple(h[:1]) + (float(h.label),) + tuple(h[2:])
        out[(key, iscolor)] = (head, im.shape, im.dtype.str, im.tobytes())
    body = recordio.unpack(s)[1]
    for flag, rgb in ((1, True), (1, False), (0, True)):
        a = mx.image.imdecode(body, flag=flag, to_rgb=rgb).asnumpy()
        out[(key, 'imdecode', flag, rgb)] = (a.shape, a.dtype.str, a.tobytes())
emit(out)
"""


def test_image_helpers_match_mxnets_on_the_same_bytes():
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (30, 22, 3), dtype=np.uint8)
    ours = {
        fmt: recordio.pack_img(recordio.IRHeader(0, 5, 7, 0), img, quality=q, img_fmt=fmt)
        for fmt, q in ((".png", 3), (".PNG", 9), (".jpg", 90))
    }
    mx = run_mxnet(MX_IMAGES, data={"pixels": img.tobytes(), "shape": img.shape, "ours": ours})
    for fmt in (".png", ".PNG"):  # lossless: the same pixels whatever the OpenCV versions
        assert recordio.unpack(ours[fmt])[0] == recordio.unpack(mx[fmt])[0]
        assert np.array_equal(recordio.unpack_img(mx[fmt])[1], img)

    # JPEG quality reaches the encoder as MXNet passes it: the same quantisation tables (DQT).
    def dqt(s):
        body = recordio.unpack(s)[1]
        return body[body.index(b"\xff\xdb") : body.index(b"\xff\xc0")]

    assert dqt(ours[".jpg"]) == dqt(mx[".jpg"])
    for key, s in ours.items():
        for iscolor in (-1, 0, 1):
            h, im = recordio.unpack_img(s, iscolor)
            got = (tuple(h[:1]) + (h.label,) + tuple(h[2:]), im.shape, im.dtype.str, im.tobytes())
            assert got == mx[(key, iscolor)]
            assert type(h.label) is float
        body = recordio.unpack(s)[1]
        for flag, rgb in ((1, True), (1, False), (0, True)):
            a = recordio.imdecode(body, flag=flag, to_rgb=rgb)
            assert (a.shape, a.dtype.str, a.tobytes()) == mx[(key, "imdecode", flag, rgb)]


def test_imdecode_of_garbage_raises_a_named_error():
    with pytest.raises(recordio.RectoolError, match="cannot decode 7 bytes"):
        recordio.imdecode(b"garbage")


def test_pickling_closes_the_original_and_reopens_the_copy_as_mxnet(mx):
    r = opened(mx["eof"][1])
    copy = pickle.loads(pickle.dumps(r))
    assert (r.is_open, copy.is_open) == (False, True)
    assert copy.read_idx(2) == b"two" and copy.keys == [0, 1, 2]
    with pytest.raises(RuntimeError, match="Forbidden operation in multiple processes"):
        r.read()  # closed: MXNet's pid check refuses it (the differential test compares)


# The image rows of the table: MXNet's helpers on crafted, foreign-format and empty payloads.
# The oversized image runs last, under an address-space limit of what the process already maps
# plus 1 GiB: less than the 2.7 GB a 30000x30000 header asks OpenCV for.
MX_IMAGE_DIFFERENCES = """
import resource
import mxnet as mx
from mxnet import recordio
def attempt(f):
    try:
        out = f()
        return ('ok', None if out is None else tuple(out.shape))
    except Exception as exc:
        return ('error', type(exc).__name__)
out = {}
for name, data in DATA['payloads'].items():
    s = recordio.pack(recordio.IRHeader(0, 1.0, 2, 0), data)
    out[name] = (attempt(lambda: recordio.unpack_img(s)[1]),
                 attempt(lambda: mx.image.imdecode(data).asnumpy()))
mapped = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), resource.RLIM_INFINITY))
s = recordio.pack(recordio.IRHeader(0, 1.0, 2, 0), DATA['oversized'])
try:
    out['oversized'] = ('ok', recordio.unpack_img(s)[1].shape)
except Exception as exc:
    out['oversized'] = ('error', type(exc).__name__, str(exc).strip()[-120:])
emit(out)
"""


def test_image_helpers_budget_and_foreign_formats_next_to_mxnets():
    import cv2
    from helpers.oversized_images import encoded, oversized_jpeg, small_image

    payloads = {
        "ppm": bytes(encoded(".ppm", small_image(10, 12))),
        "empty": b"",
        "webp": bytes(encoded(".webp", small_image(10, 12), (cv2.IMWRITE_WEBP_QUALITY, 90))),
    }
    oversized = oversized_jpeg(30000, 30000)
    mx = run_mxnet(MX_IMAGE_DIFFERENCES, data={"payloads": payloads, "oversized": oversized})
    assert mx["ppm"] == (("ok", (10, 12, 3)), ("error", "MXNetError"))
    assert mx["empty"] == (("error", "error"), ("error", "MXNetError"))  # cv2.error
    assert mx["webp"] == (("ok", (10, 12, 3)), ("error", "MXNetError"))
    assert mx["oversized"][:2] == ("error", "error")  # cv2.error, allocating what was declared
    assert "Failed to allocate 2700000000 bytes" in mx["oversized"][2]

    def packed(data):
        return recordio.pack(recordio.IRHeader(0, 1.0, 2, 0), data)

    for name in ("ppm", "empty"):
        assert recordio.unpack_img(packed(payloads[name]))[1] is None
        with pytest.raises(recordio.RectoolError, match="no size in its header"):
            recordio.imdecode(payloads[name])
    assert recordio.unpack_img(packed(payloads["webp"]))[1].shape == (10, 12, 3)
    assert recordio.imdecode(payloads["webp"]).shape == (10, 12, 3)
    with pytest.raises(recordio.ImageTooLargeError, match="declares 30000x30000 pixels"):
        recordio.unpack_img(packed(oversized))
