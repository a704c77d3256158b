"""Random operation scripts over the `mxnet.recordio` API, and one interpreter for them.

`generate(seed)` builds a script of plain values; `run_script(recordio, folder, script)` applies
it to whichever `recordio` module it is given (MXNet's, in the oracle's environment, or
rectool's) and returns every result plus the files produced. The same interpreter source runs
on both sides (the oracle execs this file's text), so any difference is the modules'.

The generator models the reader's position so that no sequential read runs past the end of the
file except once, followed at once by `reset`: after the end, MXNet's `seek`/`read_idx` return
None until a reset (tests/test_recordio.py covers that difference on its own).
"""

from __future__ import annotations

import os
import pickle
import random
import struct

MAGIC_BYTES = struct.pack("<I", 0xCED7230A)


def _body(rng):
    """Random bytes, often with the magic at aligned (and sometimes unaligned) offsets."""
    n = rng.choice([0, 1, 3, 4, 7, 8, 12, 13, 40, 97, 256])
    body = bytearray(rng.randbytes(n))
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        if len(body) >= 4:
            pos = rng.randrange(0, len(body) - 3)
            pos &= ~3 if rng.random() < 0.8 else ~0
            body[pos : pos + 4] = MAGIC_BYTES
    if rng.random() < 0.15:
        body = bytearray(MAGIC_BYTES * rng.randint(1, 3)) + body  # magic at 0, in a row
    if rng.random() < 0.15:
        body = body + bytearray(b"\0" * (-len(body) % 4)) + MAGIC_BYTES  # magic as last word
    return bytes(body)


def _label(rng):
    kind = rng.random()
    if kind < 0.4:
        return float(rng.randint(0, 100_000))
    if kind < 0.6:
        return rng.uniform(-1e6, 1e6)
    return [rng.uniform(-1e3, 1e3) for _ in range(rng.randint(1, 4))]


def generate(seed, writes=24, reads=60):
    """Return a script: ("w", ops) then ("r", ops) over one indexed file, then a plain file."""
    rng = random.Random(seed)
    write_ops, records, keys = [], [], {}  # records in file order; key -> record number
    for _ in range(writes):
        roll = rng.random()
        if roll < 0.04 and records:
            write_ops.append(("reset",))  # truncates both files, as MXNet does
            records, keys = [], {}
            continue
        if roll < 0.1:
            write_ops.append(("tell",))
            continue
        key = rng.randrange(0, 40) if rng.random() < 0.9 else rng.randrange(0, 2**40)
        if rng.random() < 0.2:
            payload = ("raw", _body(rng))
        else:
            header = (rng.randint(0, 5), _label(rng), rng.randrange(2**64), rng.randrange(2**64))
            payload = ("pack", header, _body(rng))
        write_ops.append(("write_idx", key, payload))
        keys[key] = len(records)
        records.append(key)
    read_ops, n, state = [], len(records), {"open": True, "pos": 0}
    present = sorted(keys)

    def positioned(key):
        state["open"], state["pos"] = True, keys[key] if key in keys else state["pos"]

    while len(read_ops) < reads:
        roll = rng.random()
        if roll < 0.3:
            read_ops.append(("read",))
            if state["open"]:
                if state["pos"] == n:
                    read_ops.append(("reset",))
                    state["pos"] = 0
                else:
                    state["pos"] += 1
        elif roll < 0.55:
            key = rng.choice(present) if present and rng.random() < 0.9 else 10**6 + seed
            op = "read_idx" if rng.random() < 0.7 else "seek"
            read_ops.append((op, key))
            if not state["open"]:
                state["open"], state["pos"] = True, 0
            if key in keys:
                state["pos"] = keys[key] + (op == "read_idx")
        elif roll < 0.62:
            read_ops.append(("reset",))
            state["open"], state["pos"] = True, 0
        elif roll < 0.68:
            read_ops.append(("close",))
            state["open"] = False
        elif roll < 0.72 and not state["open"]:
            read_ops.append(("open",))
            state["open"], state["pos"] = True, 0
        elif roll < 0.78:
            read_ops.append(("pickle",))
            state["pos"] = 0
        elif roll < 0.84 and present:
            read_ops.append(("worker", rng.sample(present, min(len(present), 5))))
            state["open"] = False  # pickling closes the parent's object
        elif roll < 0.9 and present:
            read_ops.append(("fork", rng.sample(present, min(len(present), 3))))
        elif roll < 0.95:
            read_ops.append(("keys",))
        else:
            read_ops.append(("tell",))
    plain = [_body(rng) for _ in range(rng.randint(0, 8))]
    return {"write": write_ops, "read": read_ops, "plain": plain, "records": n}


# Errors compare by the first of MXNet's classes that matches: rectool's named errors are
# subclasses of what MXNet raises (an `ImageHeaderError` is a `ValueError`), with their own text.
_KINDS = (KeyError, RuntimeError, AssertionError, ValueError, IndexError)


def _kind(exc):
    return next(kind.__name__ for kind in _KINDS if isinstance(exc, kind))


def _outcome(call):
    try:
        return ("ok", _describe(call()))
    except _KINDS as exc:
        return ("error", _kind(exc))


def _describe(value):
    """Plain values for comparison: bytes with their unpacked header, types and dtypes."""
    if isinstance(value, bytes):
        out = {"bytes": value}
        if len(value) >= 24:
            header, rest = _RECORDIO[0].unpack(value)
            label = header.label
            out["header"] = (
                header.flag,
                header.id,
                header.id2,
                type(header).__name__,
                type(label).__name__,
                str(getattr(label, "dtype", "")),
                label.tolist() if hasattr(label, "tolist") else label,
                type(rest).__name__,
                rest,
            )
        return out
    if isinstance(value, list):
        return [(type(v).__name__, v) for v in value]
    return value


_RECORDIO = [None]


def _in_child(work):
    """Run `work()` in a forked child; return its pickled result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            data = pickle.dumps(work())
        except _KINDS as exc:
            data = pickle.dumps(("child failed", _kind(exc)))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            data = pickle.dumps(("child failed", repr(exc)))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def run_script(recordio, folder, script):
    """Apply `script` with `recordio`; return the list of outcomes and the files' bytes."""
    _RECORDIO[0] = recordio
    idx, rec = os.path.join(folder, "a.idx"), os.path.join(folder, "a.rec")
    out = []
    w = recordio.MXIndexedRecordIO(idx, rec, "w")
    for op in script["write"]:
        if op[0] == "reset":
            w.reset()
            out.append("reset")
        elif op[0] == "tell":
            out.append(w.tell())
        else:
            _, key, payload = op
            if payload[0] == "raw":
                data = payload[1]
            else:
                data = recordio.pack(recordio.IRHeader(*payload[1]), payload[2])
            w.write_idx(key, data)
            out.append(("wrote", w.tell()))
    out.append(_outcome(w.read))
    w.close()
    files = [open(p, "rb").read() for p in (idx, rec)]
    r = recordio.MXIndexedRecordIO(idx, rec, "r")
    for op in script["read"]:
        name = op[0]
        if name == "read":
            out.append(_outcome(r.read))
        elif name in ("read_idx", "seek"):
            method = getattr(r, name)
            out.append(_outcome(lambda f=method, key=op[1]: f(key)))
        elif name in ("reset", "close", "open"):
            getattr(r, name)()
            out.append((name, r.is_open))
        elif name == "pickle":
            r = pickle.loads(pickle.dumps(r))
            out.append(("pickle", r.is_open))
        elif name == "worker":
            blob = pickle.dumps(r)
            got = _in_child(
                lambda blob=blob, keys=op[1]: (
                    lambda c: [_describe(c.read_idx(k)) for k in keys] + [_outcome(c.read)]
                )(pickle.loads(blob))
            )
            out.append(("worker", r.is_open, got))
        elif name == "fork":
            got = _in_child(
                lambda r=r, keys=op[1]: (
                    [_outcome(r.read)] + [_describe(r.read_idx(k)) for k in keys] + [r.is_open]
                )
            )
            out.append(("fork", got))
        elif name == "keys":
            out.append(("keys", _describe(list(r.keys)), sorted(r.idx.items())))
        elif name == "tell":
            out.append(_outcome(r.tell))
    r.close()
    plain = os.path.join(folder, "plain.rec")
    p = recordio.MXRecordIO(plain, "w")
    for body in script["plain"]:
        p.write(body)
    p.close()
    p = recordio.MXRecordIO(plain, "r")
    reads = [p.read() for _ in range(len(script["plain"]) + 1)]
    p.reset()
    reads.append(p.read())
    p.close()
    files.append(open(plain, "rb").read())
    out.append(("plain", reads))
    return out, files
