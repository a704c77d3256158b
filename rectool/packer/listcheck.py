"""The checks of a .lst before anything is written: `validate_list` and `check_root`.

Every line is parsed once, a block at a time at C speed for ordinary lines, line by line (naming
the first bad one) for the rest: a bad line, a repeated index, a label the layout cannot key, a
label not in the label map or one float32 would change stops the run. A label float32 would
change is an integer it does not hold (16777217) or a value it cannot keep even to its
precision (1e-50, which it stores as 0: below `FLOAT32_TINY` only values it holds exactly
pass); other values are real values, rounded to float32 as records store them. `check_root` tells a
wrong ROOT from a few missing files.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..doors.inputs import open_input
from ..errors import RectoolError, UsageError
from ..format.keys import FLOAT32_EXACT
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
    from _typeshed import StrPath

    from .layout import Layout
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
    for item in items:
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


def validate_list(
    path: str,
    layout: str,
    identities: Mapping[int, str] | None = None,
    pack_label: bool = False,
) -> tuple[str, int]:
    """Parse every line once before packing; return (sha256 of the file, number of items).

    A bad line, a repeated index, a label the layout (a name) cannot key or, given the label
    map `identities` (label -> name), a label not in it stops the run here, before anything
    is written; so does, with `pack_label` (every label written), a line with another number
    of labels than the first (a pack's binary index holds one label width). The file is read
    a block at a time, so memory does not grow with the list (but for 8 bytes an index when
    the indices are not in increasing order).
    """
    rules = layout_named(layout)
    digest = hashlib.sha256()
    count, last = 0, -1
    tabs = -1  # with pack_label: the tabs of every line (labels + 1), once the first is read
    unordered: list[np.ndarray] = []
    try:
        with open_input(path, "list file") as f:
            rest = b""
            while True:
                block = f.read(_LIST_BLOCK)
                digest.update(block)
                data = rest + block
                if not block:
                    if data and not data.endswith(b"\n"):
                        data += b"\n"
                    rest = b""
                else:
                    cut = data.rfind(b"\n") + 1
                    data, rest = data[:cut], data[cut:]
                # A numbered layout checks each item's label: line by line.
                lines = _MAPPED_LINES if identities is not None else _PLAIN_LINES
                if rules.numbered or not lines.fullmatch(data):
                    return _validate_list_slowly(path, rules, identities, pack_label)
                if pack_label and data:
                    tabs = _same_tabs(data, tabs)
                    if tabs < 0:  # lines with other label counts: see which
                        return _validate_list_slowly(path, rules, identities, pack_label)
                if data:
                    data.decode("utf-8")  # raises for invalid UTF-8, reported slowly below
                    if identities is None:
                        found = line_indices(data)
                        if found is None:  # an index of more than 18 digits: see which
                            return _validate_list_slowly(path, rules, identities, pack_label)
                    else:
                        pairs = np.array(_LINE_INDEX_LABEL.findall(data)).astype(np.int64)
                        found = pairs[:, 0]
                        if not _all_mapped(pairs[:, 1], identities):
                            return _validate_list_slowly(path, rules, identities, pack_label)
                    count += len(found)
                    if unordered or found[0] <= last or (found[1:] <= found[:-1]).any():
                        unordered.append(found)
                    last = int(found[-1])
                if not block:
                    break
    except FileNotFoundError:
        raise RectoolError(f"{path}: list file not found") from None
    except (UnicodeDecodeError, OverflowError, ValueError):
        return _validate_list_slowly(path, rules, identities, pack_label)
    if unordered:
        everything = np.concatenate(unordered)
        if len(np.unique(everything)) != len(everything):
            # names the repeated index
            return _validate_list_slowly(path, rules, identities, pack_label)
    return digest.hexdigest(), count


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


def _validate_list_slowly(
    path: str,
    layout: Layout,
    identities: Mapping[int, str] | None = None,
    pack_label: bool = False,
) -> tuple[str, int]:
    """Parse line by line, naming the first bad line or repeated index."""
    digest = hashlib.sha256()
    keys = _KeyRegistry()
    count = 0
    first: ListItem | None = None  # with pack_label: the line whose label count all must have
    with open_input(path, "list file") as f:
        for number, raw in enumerate(f, start=1):
            digest.update(raw)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RectoolError(
                    f"{path}: line {number}: not valid UTF-8 ({exc.reason})"
                ) from None
            item = parse_list_line(text.rstrip("\n").rstrip("\r"), path, number)
            if not keys.add(item.index):
                raise ListFormatError(f"index {item.index} appears twice", path, item.line)
            layout.check_item(item, path)
            _check_float32(text, item, path)
            if identities is not None:
                _check_mapped(item, identities, path)
            if pack_label:
                first = first or item
                if len(item.labels) != len(first.labels):
                    raise ListFormatError(
                        f"{counted(len(item.labels), 'label')}, but line {first.line} has "
                        f"{len(first.labels)}: --pack-label writes every label, and a pack's "
                        "index holds one label width (give every line as many labels)",
                        path,
                        item.line,
                    )
            count += 1
    return digest.hexdigest(), count


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
        return read_label_map(path)
    except FileNotFoundError:
        raise RectoolError(f"{path}: label map not found") from None


class _KeyRegistry:
    """Detect a repeated list index with a bitmap: memory grows with the largest index, not N."""

    def __init__(self) -> None:
        self._bits = bytearray()
        self._large: set[int] = set()

    def add(self, key: int) -> bool:
        if key >= 1 << 33:
            if key in self._large:
                return False
            self._large.add(key)
            return True
        byte, bit = key >> 3, 1 << (key & 7)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        if self._bits[byte] & bit:
            return False
        self._bits[byte] |= bit
        return True
