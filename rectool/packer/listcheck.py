"""The checks of a .lst before anything is written: `validate_list`, `stage_list` (a list on
standard input, checked as it streams) and `check_root`.

Every line is parsed once by a `ListCheck`, a block at a time at C speed for ordinary lines,
line by line (naming the first bad one) for the rest: a bad line, a repeated index, a label the
layout cannot key, a label not in the label map or one float32 would change stops the run. A
label float32 would change is an integer it does not hold (16777217) or a value it cannot keep
even to its precision (1e-50, which it stores as 0: below `FLOAT32_TINY` only values it holds
exactly pass); other values are real values, rounded to float32 as records store them.
`check_root` tells a wrong ROOT from a few missing files.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..doors.inputs import open_input
from ..doors.output import rename, stage_file
from ..errors import InputError, RectoolError, UsageError
from ..format.keys import FLOAT32_EXACT
from ..format.manifest import identity_name_problems
from ..text import counted
from .layout import layout_named
from .listfile import (
    ListFormatError,
    find_label_map,
    format_label,
    iter_list,
    parse_list_line,
    read_label_map,
)
from .passthrough import resolve_path

if TYPE_CHECKING:
    from _typeshed import StrPath, SupportsRead

    from .listfile import ListItem

# A wrong ROOT is told from a few missing files by this many list items, all missing.
ROOT_CHECK_ITEMS = 100


class EmptyListError(UsageError):
    """The list holds no images and an empty pack was not asked for."""


class WrongRootError(RectoolError):
    """None of the first images of the list exist under ROOT."""


def check_root(list_path: StrPath, root: StrPath, allow_outside_root: bool = False) -> None:
    """Raise `WrongRootError` when none of the first `ROOT_CHECK_ITEMS` list items exist under
    `root`: ROOT is wrong, and packing would only refuse every image."""
    prefix = os.path.join(os.fspath(root), "")
    try:
        with open_input(list_path, "list file", "utf-8", "\n") as f:
            items = list(itertools.islice(iter_list(f, os.fspath(list_path)), ROOT_CHECK_ITEMS))
    except (OSError, UnicodeDecodeError, RectoolError):
        return  # reported, naming the line, where the list is validated
    from ..archives.source import archive_kind, open_archive

    kind = archive_kind(root)
    if kind == "tar.gz":
        return  # a stream is read once, by pack: its first refusals say so
    if kind is not None:
        with open_archive(root, kind) as archive:
            if any(archive.index.find(item.path) is not None for item in items):
                return
    for item in items if kind is None else ():
        path = resolve_path(prefix, item.path, allow_outside_root)
        if path is not None and os.path.lexists(path):
            return
    if items:
        raise WrongRootError(
            f"{os.fspath(root)}: none of the first {len(items)} listed images exist under ROOT "
            f"(the first: {items[0].path}); is ROOT right? Nothing was written"
        )


# Ordinary lines (`index<TAB>number...<TAB>path`), matched a block at a time at C speed. Their
# numbers have no exponent, at most 7 integer digits and 30 fraction digits, so a float32 holds
# every integral one exactly (below 2**24) and keeps every other to its precision (none is a
# nonzero below 1e-30, far above `FLOAT32_TINY`), and paths hold no NUL; other lines (rare)
# are checked one by one, which names a bad one.
_NUMBER = rb"[-+]?(?:[0-9]{1,7}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})"
# Possessive (`++`, `*+`): no backtracking, several times faster. A label must be followed by a
# tab, so the path (followed by the newline) is never taken for one.
try:
    _PLAIN_LINES = re.compile(rb"(?:[0-9]++(?:\t" + _NUMBER + rb"(?=\t))++\t[^\t\n\0]++\n)*+")
except re.error:  # Python 3.10: the same lines, with backtracking
    _PLAIN_LINES = re.compile(rb"(?:[0-9]+(?:\t" + _NUMBER + rb")+\t[^\t\n\0]+\n)*")
# With a label map: ordinary lines whose one label is an integer (`3`, or im2rec's `3.000000`);
# their index and label, taken a block at a time.
_MAPPED_LINES = re.compile(rb"(?:[0-9]+\t[0-9]{1,7}(?:\.0*)?\t[^\t\n\0]+\n)*")
_LINE_INDEX_LABEL = re.compile(rb"^([0-9]+)\t([0-9]+)(?:\.0*)?\t", re.M)
_LIST_BLOCK = 1 << 20
# A list line holds an index, labels and a path (PATH_MAX is 4096 bytes); a "line" longer than
# this is no list line, and is refused rather than kept in memory while its end is awaited.
MAX_LINE_BYTES = 1 << 20


def validate_list(
    path: str,
    layout: str,
    identities: Mapping[int, str] | None = None,
    pack_label: bool = False,
    progress: Callable[[int, int], object] | None = None,
) -> tuple[str, int]:
    """Parse every line once before packing; return (sha256 of the file, number of items).

    A bad line, a repeated index, a label the layout (a name) cannot key or, given the label
    map `identities` (label -> name), a label not in it stops the run here, before anything
    is written; so does, with `pack_label` (every label written), a line with another number
    of labels than the first (a pack's binary index holds one label width). The file is read
    a block at a time by a `ListCheck`, the same checks as a list read from standard input
    (`stage_list`), so memory does not grow with the list (but for a bit per index).
    `progress(bytes_read, bytes)`, if given, is called before the first block and after each.
    """
    check = ListCheck(path, layout, identities, pack_label)
    try:
        with open_input(path, "list file") as f:
            size, done = os.fstat(f.fileno()).st_size, 0
            if progress is not None:
                progress(0, size)
            while block := f.read(_LIST_BLOCK):
                check.feed(block)
                done += len(block)
                if progress is not None:
                    progress(done, size)
    except FileNotFoundError:
        raise RectoolError(f"{path}: list file not found") from None
    return check.end()


class ListCheck:
    """The checks of a list, fed its bytes a block at a time as they arrive: a file's, or
    standard input's as it streams, so that the first bad line stops either as soon as it is
    read. `feed(block)` raises at the first bad line (naming `shown`, the list, and the line);
    `end()` checks what is left and returns (sha256 of the bytes, number of items).

    Complete lines are checked a block at a time at C speed when they are ordinary, line by
    line otherwise (`validate_list` says what is refused). A line is at most
    `MAX_LINE_BYTES` long: a stream without newlines (/dev/zero) is refused, not kept.
    """

    def __init__(
        self,
        shown: str,
        layout: str,
        identities: Mapping[int, str] | None = None,
        pack_label: bool = False,
    ) -> None:
        self.shown = shown
        self.rules = layout_named(layout)
        self.identities = identities
        self.pack_label = pack_label
        self.digest = hashlib.sha256()
        self.count = 0  # items, which is lines checked
        self.tabs = -1  # with pack_label: the tabs of every line (labels + 1), once known
        self.first: ListItem | None = None  # with pack_label: the first line's item
        self.seen = _SeenIndices()
        self._rest = b""  # the start of a line that a later block ends

    def feed(self, block: bytes) -> None:
        """Check the lines `block` completes; raise `ListFormatError` (or `RectoolError`) at
        the first bad one."""
        self.digest.update(block)
        data = self._rest + block
        cut = data.rfind(b"\n") + 1
        data, self._rest = data[:cut], data[cut:]
        if data:
            self._check(data)
        if len(self._rest) > MAX_LINE_BYTES:
            raise ListFormatError(
                f"over {MAX_LINE_BYTES:,} bytes without a newline: not a list line",
                self.shown,
                self.count + 1,
            )

    def end(self) -> tuple[str, int]:
        """Check the last line (which may lack its newline); return (sha256, items)."""
        if self._rest:
            data, self._rest = self._rest + b"\n", b""
            self._check(data)
        return self.digest.hexdigest(), self.count

    def _check(self, data: bytes) -> None:
        """Check `data`, complete lines: a block at a time when they are ordinary."""
        try:
            found = self._ordinary_indices(data)
        except (UnicodeDecodeError, OverflowError, ValueError):
            found = None
        if found is None:
            self._check_lines(data)
            return
        repeated = self.seen.add_all(found)
        if repeated >= 0:
            raise ListFormatError(
                f"index {int(found[repeated])} appears twice",
                self.shown,
                self.count + 1 + repeated,
            )
        if self.pack_label and self.first is None:
            line = data[: data.index(b"\n")].decode("utf-8")
            self.first = parse_list_line(line, self.shown, self.count + 1)
        self.count += len(found)

    def _ordinary_indices(self, data: bytes) -> np.ndarray | None:
        """Return the indices of the lines of `data` when every line is ordinary and passes
        (but for a repeated index), else None: they are checked line by line."""
        # A numbered layout checks each item's label: line by line.
        lines = _MAPPED_LINES if self.identities is not None else _PLAIN_LINES
        if self.rules.numbered or not lines.fullmatch(data):
            return None
        tabs = self.tabs
        if self.pack_label:
            tabs = _same_tabs(data, self.tabs)
            if tabs < 0:  # lines with other label counts: see which
                return None
        data.decode("utf-8")  # raises for invalid UTF-8, reported line by line
        if self.identities is None:
            found = line_indices(data)  # None: an index of more than 18 digits
        else:
            pairs = np.array(_LINE_INDEX_LABEL.findall(data)).astype(np.int64)
            found = pairs[:, 0]
            if not _all_mapped(pairs[:, 1], self.identities):
                return None
        if found is not None and self.pack_label:
            self.tabs = tabs
        return found

    def _check_lines(self, data: bytes) -> None:
        """Parse `data`, complete lines, line by line, naming the first bad line."""
        shown, identities = self.shown, self.identities
        for raw in data[:-1].split(b"\n"):
            number = self.count + 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RectoolError(
                    f"{shown}: line {number}: not valid UTF-8 ({exc.reason})"
                ) from None
            item = parse_list_line(text.rstrip("\r"), shown, number)
            if not self.seen.add(item.index):
                raise ListFormatError(f"index {item.index} appears twice", shown, number)
            self.rules.check_item(item, shown)
            _check_float32(text, item, shown)
            if identities is not None:
                _check_mapped(item, identities, shown)
            if self.pack_label:
                first = self.first = self.first or item
                if len(item.labels) != len(first.labels):
                    raise ListFormatError(
                        f"{counted(len(item.labels), 'label')}, but line {first.line} has "
                        f"{len(first.labels)}: --pack-label writes every label, and a pack's "
                        "index holds one label width (give every line as many labels)",
                        shown,
                        number,
                    )
                self.tabs = len(first.labels) + 1
            self.count = number


def _same_tabs(data: bytes, tabs: int) -> int:
    """Return the number of tabs every line of `data` (complete lines) holds, if each holds
    as many as the others and as `tabs` (-1: not known yet); else -1."""
    u8 = np.frombuffer(data, np.uint8)
    counts = np.diff(np.cumsum(u8 == 9)[u8 == 10], prepend=0)
    first = int(counts[0]) if tabs < 0 else tabs
    return first if (counts == first).all() else -1


def line_indices(data: bytes) -> np.ndarray | None:
    """Return the leading digits of each line of `data` (complete lines, each digits then a
    tab, as `_PLAIN_LINES` matches them) as int64 numbers, all lines at once; None when one
    has more than 18 digits (which an int64 may not hold)."""
    u8 = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(u8 == 10)
    starts = np.concatenate(([0], ends[:-1] + 1))
    tabs = np.flatnonzero(u8 == 9)
    widths = tabs[np.searchsorted(tabs, starts)] - starts
    if widths.max() > 18:
        return None
    values = np.zeros(len(starts), np.int64)
    for k in range(int(widths.max())):
        digits = u8[starts + np.minimum(k, widths - 1)].astype(np.int64) - 48
        values = np.where(widths > k, values * 10 + digits, values)
    return values


def _all_mapped(labels: np.ndarray, identities: Mapping[int, str]) -> bool:
    """Return whether every label (int64, none negative) is a label of the map."""
    if not len(labels):
        return True
    if len(identities) and max(identities) == len(identities) - 1:  # 0..N-1, the usual map
        return int(labels.max()) < len(identities)
    return bool(np.isin(labels, np.fromiter(identities, np.int64, len(identities))).all())


# A label spelled as an integer (`16777217`, im2rec's `16777217.000000`): a class id, which
# must reach the record as written. (Other spellings are real values, rounded as floats are.)
_INTEGER_LABEL = re.compile(r"[-+]?[0-9]+(?:\.0*)?")
# The smallest normal float32: below it float32 keeps fewer digits, down to none (1e-50 is 0).
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def _check_float32(text: str, item: ListItem, path: StrPath) -> None:
    """Raise `ListFormatError` for a label that float32, the records' label type, would store
    as another value than the line says: an integer it does not hold (16777217 as 16777216),
    or a value below `FLOAT32_TINY` it does not hold exactly (1e-50 as 0)."""
    for spelled, label in zip(text.split("\t")[1:-1], item.labels):
        integer = abs(label) > FLOAT32_EXACT and _INTEGER_LABEL.fullmatch(spelled.strip())
        if integer or 0 < abs(label) < FLOAT32_TINY:
            stored = float(np.float32(label))
            if stored != label:
                raise ListFormatError(
                    f"label {format_label(label)} is not a float32, the type records store "
                    f"labels in: it would be stored as {format_label(stored)}",
                    path,
                    item.line,
                )


def _check_mapped(item: ListItem, identities: Mapping[int, str], path: StrPath) -> None:
    """Raise `ListFormatError` for a label of `item` that the label map does not hold."""
    for label in item.labels:
        if not (label.is_integer() and int(label) in identities):
            known = f"{len(identities)} identities, labels {min(identities, default=0)}.."
            known += f"{max(identities, default=-1)}"
            raise ListFormatError(
                f"label {format_label(label)} is not in the label map ({known}): a label "
                "must be the integer of one of its identities",
                path,
                item.line,
            )


# A list given on standard input is staged beside the pack (so that the run can be resumed) as
# it is checked, at most this many bytes: about 100 million ordinary lines, twice WebFace42M's
# list. A longer list is given as a file, which is read where it is and never copied.
MAX_STDIN_LIST_BYTES = 4 << 30
# How a list read from standard input is named in messages.
STDIN_NAME = "standard input"


class StagedList(NamedTuple):
    """A list read from a stream by `stage_list`: its copy, label map, sha256 and items."""

    path: str
    identities: dict[int, str] | None
    sha256: str
    items: int


def stage_list(
    stream: SupportsRead[str] | SupportsRead[bytes] | None,
    target: str,
    layout: str,
    label_map: StrPath | None = None,
    pack_label: bool = False,
    max_bytes: int = MAX_STDIN_LIST_BYTES,
) -> StagedList:
    """Copy a list read from `stream` (standard input) to `target`, checking it as it streams:
    the checks of `validate_list`, by the same `ListCheck`, so the first bad line stops the
    copy as soon as it arrives, as it would in a file, named as line N of standard input.

    The stream is read as bytes (a text stream is encoded back to UTF-8, surrogates kept
    so that they are refused as invalid UTF-8, as a file's bytes are); None (a closed
    stdin) or a read error is an `InputError`. More than
    `max_bytes` (`MAX_STDIN_LIST_BYTES`) is refused with `InputError`: an endless stream
    must not fill the disk. The label map (`label_map`) is read once the first bytes have
    arrived: `rectool list ROOT - --labels F` writes F before its first line. Nothing is
    left at `target` unless the whole list passed.
    """
    read = _block_reader(stream)
    block = read()
    identities = load_identities(None, label_map)
    check = ListCheck(STDIN_NAME, layout, identities, pack_label)
    ended: list[tuple[str, int]] = []

    def checked() -> Iterator[bytes]:
        nonlocal block
        staged = 0
        while block:
            staged += len(block)
            if staged > max_bytes:
                raise InputError(
                    f"{STDIN_NAME}: the list is over {max_bytes:,} bytes, the most rectool "
                    "copies of a list read from standard input; give a longer list as a file"
                )
            check.feed(block)
            yield block
            block = read()
        ended.append(check.end())

    rename(stage_file(target, checked()), target)
    return StagedList(target, identities, *ended[0])


def _block_reader(
    stream: SupportsRead[str] | SupportsRead[bytes] | None,
) -> Callable[[], bytes]:
    """Return a function that reads the next block of `stream`'s bytes (b"" at its end): what
    has arrived, without waiting for a whole block, where the stream can say (`read1`)."""
    if stream is None:  # sys.stdin of a process started with its stdin closed
        raise InputError(f"{STDIN_NAME} is closed: pipe the list in, or give it as a file")
    source: Any = getattr(stream, "buffer", stream)  # sys.stdin: its bytes
    read = getattr(source, "read1", None) or source.read

    def next_block() -> bytes:
        try:
            block = read(_LIST_BLOCK)
        except OSError as exc:
            raise InputError(f"{STDIN_NAME}: cannot read the list: {exc}") from None
        return block.encode("utf-8", "surrogatepass") if isinstance(block, str) else block

    return next_block


def load_identities(list_path: StrPath | None, label_map: StrPath | None) -> dict[int, str] | None:
    """Return the label map given, else the one beside `list_path` (None: look nowhere)."""
    path: str | None
    if label_map:
        path = os.fspath(label_map)
    else:
        path = None if list_path is None else find_label_map(list_path)
    if path is None:
        return None
    try:
        names = read_label_map(path)
    except FileNotFoundError:
        raise RectoolError(f"{path}: label map not found") from None
    for _, message in identity_name_problems(names):  # identities are data: one name each
        raise InputError(f"{path}: {message}; each identity needs a name of its own")
    return names


class _SeenIndices:
    """The list indices seen so far, to refuse a repeated one: a bitmap for indices below
    2**33 (memory grows with the largest index, not with the list), a set above."""

    def __init__(self) -> None:
        self._bits = bytearray()
        self._large: set[int] = set()

    def _grow(self, byte: int) -> None:
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))

    def add(self, key: int) -> bool:
        """Add `key`; return False when it was seen before."""
        if key >= _LARGE_INDEX:
            if key in self._large:
                return False
            self._large.add(key)
            return True
        byte, bit = key >> 3, 1 << (key & 7)
        self._grow(byte)
        if self._bits[byte] & bit:
            return False
        self._bits[byte] |= bit
        return True

    def add_all(self, keys: np.ndarray) -> int:
        """Add `keys` (int64, none negative), all at once; return the position of the first
        one seen before (earlier in `keys` or before them), or -1 when none was. After a
        repeat, what was added is undefined: the list is refused."""
        if not len(keys):
            return -1
        if int(keys.max()) >= _LARGE_INDEX:  # rare: one at a time
            for position, key in enumerate(keys.tolist()):
                if not self.add(key):
                    return position
            return -1
        order: np.ndarray | None = None
        ordered = keys
        if not (keys[1:] > keys[:-1]).all():
            order = np.argsort(keys, kind="stable")
            ordered = keys[order]
        self._grow(int(ordered[-1]) >> 3)
        bits = np.frombuffer(self._bits, np.uint8)  # a view: released before the next growth
        byte = ordered >> 3
        bit = np.left_shift(1, ordered & 7).astype(np.uint8)
        again = (bits[byte] & bit) != 0
        if order is not None:  # repeated within `keys`: the later ones, in stable order
            again[1:] |= ordered[1:] == ordered[:-1]
        if again.any():
            return int((np.flatnonzero(again) if order is None else order[again]).min())
        starts = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
        bits[byte[starts]] |= np.bitwise_or.reduceat(bit, starts)
        return -1


# Above it, indices are kept in a set: a bitmap up to it is at most 1 GiB.
_LARGE_INDEX = 1 << 33
