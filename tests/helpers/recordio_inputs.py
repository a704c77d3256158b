"""Hostile inputs for an `mxnet.recordio`-style module, each run alone and bounded.

`python recordio_inputs.py package|emitted WHERE FOLDER OUT` imports rectool's recordio (or the
emitted `WHERE/recordio.py`, with `rectool` and `mxnet` made unimportable), runs every attack in
`ATTACKS` in a folder of its own under FOLDER, and pickles {name: outcome} to OUT. Each attack
runs under an alarm (a FIFO opened and waited on, a loop that never ends: "blocked") and the
process under an address-space limit (an endless read: `MemoryError`), so a module that fails
an attack reports it instead of hanging or swapping the machine. An outcome is ("ok", value) or
("error", the names of the exception's classes, its message with the folder written `<dir>`).
The standard library only: the same file runs beside either module.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import struct
import sys

ALARM_S = 20  # far beyond any attack's milliseconds: only a blocked call reaches it


class Blocked(Exception):
    """An attack still running when the alarm went off."""


def _written(recordio, folder, bodies=(b"zero" * 3, b"one-record")):
    """Write an .idx and .rec of `bodies` (keys 0, 1...); return their paths."""
    idx, rec = os.path.join(folder, "a.idx"), os.path.join(folder, "a.rec")
    w = recordio.MXIndexedRecordIO(idx, rec, "w")
    for key, body in enumerate(bodies):
        w.write_idx(key, body)
    w.close()
    return idx, rec


def fifo_idx_read(recordio, folder):
    idx, rec = _written(recordio, folder)
    os.unlink(idx)
    os.mkfifo(idx)
    return recordio.MXIndexedRecordIO(idx, rec, "r").keys


def fifo_rec_read(recordio, folder):
    os.mkfifo(os.path.join(folder, "a.rec"))
    return recordio.MXRecordIO(os.path.join(folder, "a.rec"), "r").read()


def fifo_rec_write(recordio, folder):
    os.mkfifo(os.path.join(folder, "a.rec"))
    return recordio.MXRecordIO(os.path.join(folder, "a.rec"), "w").is_open


def fifo_idx_write(recordio, folder):
    os.mkfifo(os.path.join(folder, "a.idx"))
    return recordio.MXIndexedRecordIO(
        os.path.join(folder, "a.idx"), os.path.join(folder, "a.rec"), "w"
    ).tell()


def fifo_rec_write_read_elsewhere(recordio, folder):
    """A FIFO that another reader holds open: writing would not block, but it is no file."""
    fifo = os.path.join(folder, "a.rec")
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        w = recordio.MXRecordIO(fifo, "w")
        w.write(b"sent")
        w.close()
        return "written"
    finally:
        os.close(reader)


def dev_zero_idx(recordio, folder):
    _, rec = _written(recordio, folder)
    return recordio.MXIndexedRecordIO("/dev/zero", rec, "r").keys


def long_line_idx(recordio, folder):
    """An .idx whose second line is 4 MiB of digits without a newline."""
    idx, rec = _written(recordio, folder)
    with open(idx, "ab") as f:
        f.write(b"1" * (4 << 20))
    return recordio.MXIndexedRecordIO(idx, rec, "r").keys


def growing_idx(recordio, folder):
    """An .idx appended to while it is read (as a writer still running would): the lines it
    held when it was opened are read, not the lines written since."""
    idx, rec = _written(recordio, folder)
    with open(idx, "a") as f:

        def key_type(text):
            f.write("1\t16\n")
            f.flush()
            return int(text)

        return recordio.MXIndexedRecordIO(idx, rec, "r", key_type=key_type).keys


def non_utf8_idx(recordio, folder):
    idx, rec = _written(recordio, folder)
    with open(idx, "wb") as f:
        f.write(b"0\t0\n\xff\t16\n")
    return recordio.MXIndexedRecordIO(idx, rec, "r").keys


def _cut_at_record_1(recordio, folder):
    idx, rec = _written(recordio, folder)
    r = recordio.MXIndexedRecordIO(idx, rec, "r")
    start = r.idx[1]
    r.close()
    os.truncate(rec, start)  # the .rec ends where record 1 starts
    return recordio.MXIndexedRecordIO(idx, rec, "r")


def cut_at_end_read_idx(recordio, folder):
    return _cut_at_record_1(recordio, folder).read_idx(1)


def cut_at_end_seek_read(recordio, folder):
    r = _cut_at_record_1(recordio, folder)
    r.seek(1)
    return r.read()


def cut_at_end_sequential(recordio, folder):
    """Read in order, the end of the file is the end: None, as MXNet."""
    r = _cut_at_record_1(recordio, folder)
    return [r.read(), r.read()]


def unpack_3_bytes(recordio, folder):
    return recordio.unpack(b"abc")


def unpack_flag_over_payload(recordio, folder):
    return recordio.unpack(struct.pack("<IfQQ", 5, 0.0, 7, 0) + b"ab")


def unpack_img_3_bytes(recordio, folder):
    return recordio.unpack_img(b"abc")


ATTACKS = {
    f.__name__: f
    for f in (
        fifo_idx_read,
        fifo_rec_read,
        fifo_rec_write,
        fifo_idx_write,
        fifo_rec_write_read_elsewhere,
        dev_zero_idx,
        long_line_idx,
        growing_idx,
        non_utf8_idx,
        cut_at_end_read_idx,
        cut_at_end_seek_read,
        cut_at_end_sequential,
        unpack_3_bytes,
        unpack_flag_over_payload,
        unpack_img_3_bytes,
    )
}


def _plain(value):
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value if isinstance(value, (bytes, str, int, float, type(None))) else repr(value)


def run(recordio, folder):
    """Return {attack name: outcome} of every attack on `recordio`, each in its own folder."""

    def blocked(*args):
        raise Blocked(f"blocked for {ALARM_S} s")

    signal.signal(signal.SIGALRM, blocked)
    results = {}
    for name, attack in ATTACKS.items():
        where = os.path.join(folder, name)
        os.makedirs(where)
        signal.alarm(ALARM_S)
        try:
            results[name] = ("ok", _plain(attack(recordio, where)))
        except BaseException as exc:  # noqa: BLE001 - every outcome is reported
            names = [k.__name__ for k in type(exc).__mro__]
            results[name] = ("error", names, str(exc).replace(where, "<dir>"))
        finally:
            signal.alarm(0)
    return results


def main(mode, where, folder, out):
    if mode == "emitted":
        sys.modules["rectool"] = sys.modules["mxnet"] = None  # both unimportable
        sys.path.insert(0, where)
        import recordio
    else:
        from rectool import recordio
    # The limit: what the process maps now and 1 GiB more (an endless read ends in MemoryError).
    mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), resource.RLIM_INFINITY))
    results = run(recordio, folder)
    with open(out, "wb") as f:
        pickle.dump((recordio.__file__, results), f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
