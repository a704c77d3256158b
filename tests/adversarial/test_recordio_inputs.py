"""The recordio drop-in behind rectool's input door, as imported and as emitted (issue 36).

Every attack in tests/helpers/recordio_inputs.py runs in a subprocess, bounded (an alarm, an
address-space limit), once with `rectool.recordio` and once with the module `rectool reader
--recordio` writes, run where neither rectool nor MXNet can be imported: both must give the
same outcome, and that outcome is the one asserted here. Regular files only (a FIFO blocked,
/dev/zero grew without end), .idx lines bounded and read up to the size the file had when
opened, a record at or past the end raises, malformed headers and .idx bytes raise the named
errors, which are also the classes MXNet 1.9.1 raises (checked against it in the oracle).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
from click.testing import CliRunner
from helpers import recordio_inputs
from helpers.mxnet_oracle import run_mxnet

from rectool.cli import cli


def _run(mode, where, folder):
    folder.mkdir()
    out = folder / "out.pickle"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, recordio_inputs.__file__, mode, str(where), str(folder), str(out)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pickle.loads(out.read_bytes())


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{attack: outcome}, the same for rectool.recordio and for the emitted module."""
    base = tmp_path_factory.mktemp("recordio-inputs")
    emitted = base / "emitted"
    emitted.mkdir()
    result = CliRunner().invoke(cli, ["reader", "--recordio", "-o", str(emitted / "recordio.py")])
    assert result.exit_code == 0, result.output
    package_file, package = _run("package", "", base / "package")
    emitted_file, alone = _run("emitted", emitted, base / "alone")
    assert package_file.endswith(os.path.join("rectool", "recordio.py"))
    assert emitted_file == str(emitted / "recordio.py")
    for name in recordio_inputs.ATTACKS:  # the emitted module's classes: its own, same names
        assert package[name] == alone[name], f"{name}: the emitted module differs"
    return package


def refused(outcome, cls, message):
    """Assert `outcome` is an error of class `cls` (a name) whose message contains `message`."""
    assert outcome[0] == "error", outcome
    assert cls in outcome[1], outcome
    assert "Blocked" not in outcome[1] and "MemoryError" not in outcome[1], outcome
    assert message in outcome[2], outcome


def test_a_fifo_read_as_rec_or_idx_is_refused_at_once(outcomes):
    why = "not a regular file (the {} must be one)"
    refused(outcomes["fifo_idx_read"], "InputError", "<dir>/a.idx: " + why.format("index file"))
    refused(outcomes["fifo_rec_read"], "InputError", "<dir>/a.rec: " + why.format("record file"))


@pytest.mark.parametrize(
    "attack", ["fifo_rec_write", "fifo_idx_write", "fifo_rec_write_read_elsewhere"]
)
def test_a_fifo_written_as_rec_or_idx_is_refused_at_once(outcomes, attack):
    refused(outcomes[attack], "InputError", "not a regular file (the ")


def test_dev_zero_as_idx_is_refused_not_read_forever(outcomes):
    refused(outcomes["dev_zero_idx"], "InputError", "/dev/zero: not a regular file (the index")


def test_an_idx_line_without_end_is_refused_at_its_bound_in_a_short_message(outcomes):
    outcome = outcomes["long_line_idx"]
    refused(outcome, "IndexFormatError", "a.idx: line 3: longer than 65,536 characters")
    assert len(outcome[2]) < 200  # not the 4 MiB line echoed back
    assert "ValueError" in outcome[1]  # where MXNet's int() raises one


def test_an_idx_is_read_to_the_size_it_had_when_opened(outcomes):
    assert outcomes["growing_idx"] == ("ok", [0, 1])


def test_a_non_utf8_idx_is_a_named_error_naming_its_line(outcomes):
    outcome = outcomes["non_utf8_idx"]
    refused(outcome, "IndexFormatError", "a.idx: line 2: not UTF-8 text (byte 0xff at column 1)")
    assert "ValueError" in outcome[1]  # MXNet's UnicodeDecodeError is one


def test_a_record_cut_at_the_end_of_the_file_raises_read_in_order_it_is_the_end(outcomes):
    for attack in ("cut_at_end_read_idx", "cut_at_end_seek_read"):
        refused(
            outcomes[attack],
            "RecordFormatError",
            "<dir>/a.rec, key 1, byte offset 20: record cut short: expected a part header, "
            "found the end of the file",
        )
    assert outcomes["cut_at_end_sequential"] == ("ok", [b"zero" * 3, None])  # as MXNet


@pytest.mark.parametrize("attack", ["unpack_3_bytes", "unpack_img_3_bytes"])
def test_a_record_shorter_than_its_header_is_a_named_struct_error(outcomes, attack):
    outcome = outcomes[attack]
    refused(outcome, "ImageHeaderError", "record of 3 bytes, too short for its 24-byte image")
    assert {"RecordFormatError", "RectoolError", "error", "ValueError"} <= set(outcome[1])


def test_a_flag_asking_for_more_labels_than_the_payload_is_a_named_value_error(outcomes):
    outcome = outcomes["unpack_flag_over_payload"]
    refused(outcome, "ImageHeaderError", "record of 26 bytes, too short for its 24-byte image")
    assert "and 5 float32 labels" in outcome[2]
    assert {"RecordFormatError", "ValueError", "error"} <= set(outcome[1])


# MXNet 1.9.1 on the same bytes: the classes the named errors must also be.
MX_CLASSES = """
import os, struct
from mxnet import recordio
def attempt(f):
    try:
        return ('ok', f())
    except Exception as exc:
        return ('error', [k.__name__ for k in type(exc).__mro__])
out = {}
out['unpack_3_bytes'] = attempt(lambda: recordio.unpack(b'abc'))
out['unpack_img_3_bytes'] = attempt(lambda: recordio.unpack_img(b'abc'))
out['unpack_flag_over_payload'] = attempt(
    lambda: recordio.unpack(struct.pack('<IfQQ', 5, 0.0, 7, 0) + b'ab'))
folder = DATA
idx, rec = folder + '/a.idx', folder + '/a.rec'
w = recordio.MXIndexedRecordIO(idx, rec, 'w')
for key, body in enumerate([b'zero' * 3, b'one-record']):
    w.write_idx(key, body)
w.close()
os.truncate(rec, 20)  # where record 1 starts
r = recordio.MXIndexedRecordIO(idx, rec, 'r')
out['cut_at_end_read_idx'] = attempt(lambda: r.read_idx(1))
r = recordio.MXIndexedRecordIO(idx, rec, 'r')
out['cut_at_end_sequential'] = attempt(lambda: [r.read(), r.read()])
open(idx, 'wb').write(b'0\\t0\\n\\xff\\t16\\n')
out['non_utf8_idx'] = attempt(lambda: recordio.MXIndexedRecordIO(idx, rec, 'r'))
emit(out)
"""


@pytest.mark.oracle
def test_the_named_errors_are_mxnets_classes_where_mxnet_raises(outcomes, tmp_path):
    mx = run_mxnet(MX_CLASSES, data=str(tmp_path))
    for name in ("unpack_3_bytes", "unpack_img_3_bytes"):
        assert mx[name] == ("error", ["error", "Exception", "BaseException", "object"])
        assert {"ImageHeaderError", "error"} <= set(outcomes[name][1])  # struct.error
    assert mx["unpack_flag_over_payload"][1][0] == "ValueError"
    assert {"ImageHeaderError", "ValueError"} <= set(outcomes["unpack_flag_over_payload"][1])
    assert mx["non_utf8_idx"][1][:3] == ["UnicodeDecodeError", "UnicodeError", "ValueError"]
    # Not a UnicodeDecodeError (docs/migration.md), but a ValueError as that is.
    assert {"IndexFormatError", "ValueError"} <= set(outcomes["non_utf8_idx"][1])
    # Where MXNet returns None for a record cut at the end, rectool raises (migration.md);
    # read in order, the end is None in both.
    assert mx["cut_at_end_read_idx"] == ("ok", None)
    assert "RecordFormatError" in outcomes["cut_at_end_read_idx"][1]
    assert mx["cut_at_end_sequential"] == outcomes["cut_at_end_sequential"]
