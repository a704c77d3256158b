"""One operation at a time over the `mxnet.recordio` API, for the state-machine differential test.

`Session(recordio, folder)` holds one `MXRecordIO`/`MXIndexedRecordIO` at a time over the
files `a.idx`, `a.rec` (indexed) and `p.rec` (plain) in `folder`, applies operations given as
plain tuples (`apply(op)`) with whichever `recordio` module it is given, and returns plain,
comparable outcomes: bytes with their unpacked header, exception classes, `is_open`, the files.
The oracle execs this file's text and runs `serve` on its stdin/stdout, so MXNet's side and
rectool's run the same code and any difference is the modules'.
"""

from __future__ import annotations

import os
import pickle
import struct

FILES = ("a.idx", "a.rec", "p.rec")
KEY_TYPES = {"int": int, "str": str}
# Compared by the first class that matches, so rectool's named errors compare equal to the
# builtin MXNet raises (`MissingKeyError` is a `KeyError`, `IndexFormatError` a `ValueError`).
ERRORS = (
    KeyError,
    RuntimeError,
    AssertionError,
    ValueError,
    IndexError,
    OverflowError,
    TypeError,
    AttributeError,
    struct.error,
)


class Session:
    """Apply operations to one handle at a time, with `recordio` (MXNet's module or rectool's)."""

    def __init__(self, recordio, folder):
        self.recordio, self.folder, self.handle = recordio, folder, None

    def path(self, name):
        return os.path.join(self.folder, name)

    def outcome(self, call):
        try:
            return ("ok", self.describe(call()))
        except ERRORS as exc:
            return ("error", next(k.__name__ for k in ERRORS if isinstance(exc, k)))
        except Exception as exc:  # noqa: BLE001 - not expected: the comparison shows it
            return ("unexpected", type(exc).__name__, str(exc)[:300])

    def describe(self, value):
        """Plain values: bytes with their unpacked header, types and dtypes."""
        if isinstance(value, bytes) and len(value) >= 24:
            try:
                header, rest = self.recordio.unpack(value)
            except ERRORS as exc:  # a raw payload whose flag word asks for missing labels
                return {
                    "bytes": value,
                    "unpack": next(k.__name__ for k in ERRORS if isinstance(exc, k)),
                }
            label = header.label
            return {
                "bytes": value,
                "header": (
                    type(header).__name__,
                    header.flag,
                    header.id,
                    header.id2,
                    type(label).__name__,
                    str(getattr(label, "dtype", "")),
                    label.tolist() if hasattr(label, "tolist") else label,
                    type(rest).__name__,
                    rest,
                ),
            }
        if isinstance(value, list):
            return [(type(v).__name__, v) for v in value]
        return value

    def apply(self, op):
        name, args = op[0], op[1:]
        return getattr(self, "op_" + name)(*args)

    def _drop(self):
        if self.handle is not None:
            self.handle.close()
        self.handle = None

    def op_open_writer(self, kind, key_type):
        self._drop()
        if kind == "indexed":
            make = lambda: self.recordio.MXIndexedRecordIO(  # noqa: E731
                self.path("a.idx"), self.path("a.rec"), "w", key_type=KEY_TYPES[key_type]
            )
        else:
            make = lambda: self.recordio.MXRecordIO(self.path("p.rec"), "w")  # noqa: E731
        return self._opened(make)

    def op_open_reader(self, kind, rec, key_type):
        self._drop()
        if kind == "indexed":
            make = lambda: self.recordio.MXIndexedRecordIO(  # noqa: E731
                self.path("a.idx"), self.path("a.rec"), "r", key_type=KEY_TYPES[key_type]
            )
        else:
            make = lambda: self.recordio.MXRecordIO(self.path(rec), "r")  # noqa: E731
        return self._opened(make)

    def _opened(self, make):
        def opened():
            self.handle = make()
            return self.handle.is_open

        return self.outcome(opened)

    def _payload(self, payload):
        if payload[0] == "raw":
            return payload[1]
        return self.recordio.pack(self.recordio.IRHeader(*payload[1]), payload[2])

    def op_write_idx(self, key, payload):
        h = self.handle
        return self.outcome(lambda: h.write_idx(key, self._payload(payload))), h.is_open

    def op_write(self, payload):
        h = self.handle
        return self.outcome(lambda: h.write(self._payload(payload))), h.is_open

    def op_read_idx(self, key):
        return self.outcome(lambda: self.handle.read_idx(key)), self.handle.is_open

    def op_seek(self, key):
        return self.outcome(lambda: self.handle.seek(key)), self.handle.is_open

    def op_read(self):
        return self.outcome(self.handle.read), self.handle.is_open

    def op_tell(self):
        return self.outcome(lambda: self.handle.tell())

    def op_reset(self):
        return self.outcome(self.handle.reset), self.handle.is_open

    def op_close(self):
        return self.outcome(self.handle.close), self.handle.is_open

    def op_open(self):
        return self.outcome(self.handle.open), self.handle.is_open

    def op_pickle(self):
        """Pickle in this process: the original closes, the copy reopens if it was open."""
        old = self.handle
        self.handle = pickle.loads(pickle.dumps(old))
        return old.is_open, self.handle.is_open

    def op_keys(self):
        h = self.handle
        return self.outcome(lambda: (list(h.keys), sorted(h.idx.items())))

    def op_worker(self, keys):
        """Pickle into a forked child, as a DataLoader worker gets the dataset."""
        blob = pickle.dumps(self.handle)

        def work():
            copy = pickle.loads(blob)
            reads = [self.outcome(lambda k=k: copy.read_idx(k)) for k in keys]
            return [copy.is_open, *reads, self.outcome(copy.read)]

        return self.handle.is_open, in_child(work)

    def op_fork(self, keys):
        """Fork without pickling: the child inherits the open object."""
        h = self.handle

        def work():
            first = self.outcome(h.read)  # another process: MXNet's pid check refuses
            reads = [self.outcome(lambda k=k: h.read_idx(k)) for k in keys]
            return [first, *reads, h.is_open]

        return in_child(work), h.is_open

    def op_files(self):
        out = {}
        for name in FILES:
            if os.path.exists(self.path(name)):
                with open(self.path(name), "rb") as f:
                    out[name] = f.read()
        return out

    def op_end(self):
        self._drop()
        return self.op_files()


def in_child(work):
    """Run `work()` in a forked child; return its pickled result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            data = pickle.dumps(work())
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


def send(stream, value):
    data = pickle.dumps(value, protocol=4)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the other side closed the pipe")
    return pickle.loads(stream.read(int.from_bytes(head, "little")))


def serve(recordio, requests, replies):
    """Answer ("session", folder) and operations, one reply each, until `requests` ends."""
    session = None
    while True:
        try:
            message = receive(requests)
        except EOFError:
            return
        if message[0] == "session":
            if session is not None:
                session._drop()
            session = Session(recordio, message[1])
            send(replies, None)
        else:
            send(replies, session.apply(message))
