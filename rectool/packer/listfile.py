"""The .lst file im2rec reads and writes, and the label map rectool keeps beside it.

A list line is `index \\t label [\\t label ...] \\t relative/path \\n`, UTF-8, paths with `/`.
The label map is `PREFIX.labels.tsv` beside `PREFIX.lst`: one `label \\t identity \\n` line per
identity, in label order.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, NamedTuple, TextIO

from ..doors.inputs import open_input
from ..errors import RectoolError
from ..format.paths import LABEL_MAP_SUFFIX, PackPaths

if TYPE_CHECKING:
    from _typeshed import StrPath

LIST_SUFFIX = ".lst"
# Records store labels as float32 (MXNet's IRHeader); a larger label cannot be written.
FLOAT32_MAX = 3.4028234663852886e38
# Record keys are signed 64-bit in every index rectool writes and reads (numpy int64).
MAX_INDEX = 2**63 - 1
# Characters that would break a tab-separated line.
UNWRITABLE_CHARACTERS = ("\t", "\n", "\r")
_SPLIT_SUFFIX = re.compile(r"(?:_\d+)?(?:_(?:train|val|test))?$")
# A path field must survive a line split on tabs and newlines, UTF-8 encoding (no lone
# surrogates, which is how os.fsdecode keeps undecodable bytes) and im2rec's strip().
_UNWRITABLE = re.compile("[" + re.escape("".join(UNWRITABLE_CHARACTERS)) + "\ud800-\udfff]")


class ListFormatError(RectoolError):
    """A .lst or label map line cannot be parsed: names the file and line."""

    def __init__(self, message: str, path: StrPath, line: int) -> None:
        self.path, self.line = os.fspath(path), line
        super().__init__(f"{self.path}: line {line}: {message}")


class ListItem(NamedTuple):
    """One line of a .lst: the record index, its labels and the image path relative to the root."""

    index: int  # type: ignore[assignment]  # the .lst field's name, over tuple.index
    labels: tuple[float, ...]
    path: str
    line: int = 0

    @property
    def label(self) -> float | tuple[float, ...]:
        """Return the single label, or the tuple when there are several."""
        return self.labels[0] if len(self.labels) == 1 else self.labels


def format_label(value: float) -> str:
    """Return a label as text: integral values without a fraction, others as `repr`."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def format_list_line(index: int, labels: float | Iterable[float], path: str) -> str:
    """Return one .lst line; `labels` is a number or a sequence of numbers."""
    if isinstance(labels, (int, float)):
        labels = (labels,)
    return "\t".join([str(index), *map(format_label, labels), path]) + "\n"


def format_list_lines(rows: Iterable[tuple[int, int, str]]) -> str:
    """Return the .lst text of `(index, label, path)` rows, each with one integer label.

    The same text as `format_list_line` per row for `int` indices and labels (the caller's
    duty: they are not checked), built several times faster for whole lists.
    """
    return "".join([f"{index}\t{label}\t{path}\n" for index, label, path in rows])


def is_writable_path(path: str) -> bool:
    """Return whether `path` can be a .lst path field that every reader gets back unchanged.

    It must encode as UTF-8, hold no tab, newline or CR, and neither start nor end with
    whitespace (im2rec strips every field).
    """
    return _UNWRITABLE.search(path) is None and path == path.strip()


def unwritable_paths(paths: Sequence[str]) -> list[str]:
    """Return those of `paths` that `is_writable_path` rejects, in order.

    Fast for a whole folder's names in the usual case: text that is printable (no control,
    separator or surrogate character) and holds no space has no whitespace at all.
    """
    joined = "".join(paths)
    if joined.isprintable() and " " not in joined:
        return []
    return [path for path in paths if not is_writable_path(path)]


def parse_list_line(text: str, path: str = "<list>", line: int = 0) -> ListItem:
    """Parse one .lst line (without its newline) into a `ListItem`."""
    return _plain_item(text, line) or _parse_any_line(text, path, line)


def _plain_item(text: str, line: int) -> ListItem | None:
    """Return the `ListItem` of a common line, `index<TAB>label<TAB>path`, or None.

    What the general parser would return, without its checks: packing reads millions of these.
    """
    fields = text.split("\t")
    if len(fields) != 3:
        return None
    index, label, name = fields
    if name.endswith("\r"):
        name = name.rstrip("\r")
    if not (index.isascii() and index.isdigit() and name) or "\0" in name or len(index) > 18:
        return None  # (18 digits always fit an int64; longer ones are checked below)
    try:
        value = float(label)
    except ValueError:
        return None
    if not -FLOAT32_MAX <= value <= FLOAT32_MAX:  # NaN, infinite or too large: say which
        return None
    # ListItem(...) without the keyword handling of its __new__.
    return tuple.__new__(ListItem, (int(index), (value,), name, line))


def _parse_any_line(text: str, path: str, line: int) -> ListItem:
    fields = text.split("\t")
    if len(fields) < 3:
        raise ListFormatError(
            f"expected 'index<TAB>label<TAB>path', got {text[:120]!r}", path, line
        )
    try:
        index = int(fields[0])
    except ValueError:
        try:
            as_float = float(fields[0])
        except ValueError:
            as_float = math.nan
        if not as_float.is_integer():
            raise ListFormatError(f"index {fields[0]!r} is not an integer", path, line) from None
        index = int(as_float)
    if index < 0:
        raise ListFormatError(f"index {index} is negative", path, line)
    if index > MAX_INDEX:
        raise ListFormatError(
            f"index {index} is too large: record keys are 64-bit signed, at most {MAX_INDEX}",
            path,
            line,
        )
    try:
        labels = tuple(float(x) for x in fields[1:-1])
    except ValueError:
        raise ListFormatError(f"labels {fields[1:-1]!r} are not numbers", path, line) from None
    if not all(math.isfinite(x) for x in labels):
        raise ListFormatError(f"labels {fields[1:-1]!r} are not finite", path, line)
    if not all(-FLOAT32_MAX <= x <= FLOAT32_MAX for x in labels):
        raise ListFormatError(
            f"labels {fields[1:-1]!r} do not fit a float32, the type records store labels in",
            path,
            line,
        )
    if not fields[-1]:
        raise ListFormatError("the image path is empty", path, line)
    if "\0" in fields[-1]:
        raise ListFormatError("the image path holds a NUL character", path, line)
    return ListItem(index, labels, fields[-1], line)


def iter_list(stream: TextIO, path: str = "<list>") -> Iterator[ListItem]:
    """Yield `ListItem`s from a text stream of .lst lines; blank lines are errors."""
    number = 0
    rest = ""
    while True:
        # A block at a time, split at C speed: packing reads millions of lines.
        block = stream.read(_READ_CHARS)
        if not block:
            if rest:
                yield parse_list_line(rest.rstrip("\r"), path, number + 1)
            return
        text = rest + block
        cut = text.rfind("\n") + 1
        rest = text[cut:]  # the start of a line that the next block ends
        if not cut:
            continue
        lines = text[: cut - 1].split("\n")
        # Lazily, a chunk at a time: a caller may want a few items only.
        for first in range(0, len(lines), _PLAIN_CHUNK):
            chunk = lines[first : first + _PLAIN_CHUNK]
            if _PLAIN_BLOCK.fullmatch("\n".join(chunk) + "\n"):
                yield from _plain_lines(chunk, number + first)
            else:
                yield from _parse_lines(chunk, path, number + first)
        number += len(lines)


# Lines that `_plain_item` takes as they are: `index<TAB>label<TAB>path`, an index of at most 18
# digits, a label without exponent whose integer part float32 holds, a path without tab, CR or
# NUL. A block of them is parsed without its checks (`_plain_lines`), to the same items.
_PLAIN_CHUNK = 1024
_PLAIN_BLOCK = re.compile(
    r"(?:[0-9]{1,18}\t[-+]?(?:[0-9]{1,7}(?:\.[0-9]*)?|\.[0-9]+)\t[^\t\n\r\0]+\n)*"
)


def _plain_lines(lines: list[str], number: int) -> list[ListItem]:
    """Return the `ListItem`s of lines that `_PLAIN_BLOCK` matched, numbered from `number`+1."""
    new = tuple.__new__
    return [
        new(ListItem, (int(index), (float(label),), name, line))
        for line, (index, label, name) in enumerate(map(str.split, lines, repeat("\t")), number + 1)
    ]


def _parse_lines(lines: Iterable[str], path: str, number: int) -> Iterator[ListItem]:
    for text in lines:
        number += 1
        yield _plain_item(text, number) or _parse_any_line(text.rstrip("\r"), path, number)


_READ_CHARS = 1 << 20


def read_list(path: StrPath) -> list[ListItem]:
    """Read a whole .lst file into a list of `ListItem`s."""
    try:
        with open_input(path, "list file", "utf-8", "\n") as f:
            return list(iter_list(f, os.fspath(path)))
    except UnicodeDecodeError as exc:
        raise RectoolError(
            f"{os.fspath(path)}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def label_map_path(list_path: StrPath) -> str:
    """Return where the label map of a .lst lives: `PREFIX.labels.tsv` for `PREFIX.lst`."""
    list_path = os.fspath(list_path)
    stem = list_path[: -len(LIST_SUFFIX)] if list_path.endswith(LIST_SUFFIX) else list_path
    return PackPaths(stem).label_map


def find_label_map(list_path: StrPath) -> str | None:
    """Return the label map that belongs to a .lst (also for `_train`/`_val`/`_test`/`_N` lists)."""
    candidate = label_map_path(list_path)
    if os.path.exists(candidate):
        return candidate
    stem = candidate[: -len(LABEL_MAP_SUFFIX)]
    shorter = _SPLIT_SUFFIX.sub("", stem)
    if shorter != stem and os.path.exists(PackPaths(shorter).label_map):
        return PackPaths(shorter).label_map
    return None


def label_map_text(identities: Mapping[int, str]) -> str:
    """Return the text of a label map file of `identities` (label -> identity name)."""
    return "".join(f"{label}\t{identities[label]}\n" for label in sorted(identities))


def write_label_map(path: StrPath, identities: Mapping[int, str]) -> None:
    """Write `identities` (label -> identity name) as a label map file, replacing one."""
    from ..doors.output import write_atomic  # (output imports errors, which imports the reader)

    write_atomic(path, label_map_text(identities))


def read_label_map(path: StrPath) -> dict[int, str]:
    """Read a label map file into a dict label (int) -> identity name."""
    identities: dict[int, str] = {}
    with open_input(path, "label map") as f:  # bytes: a bad line is named by its number
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ListFormatError(f"not valid UTF-8 ({exc.reason})", path, number) from None
            label, sep, name = text.rstrip("\n").partition("\t")
            if not sep or not label.isdigit():
                raise ListFormatError(
                    f"expected 'label<TAB>identity', got {text[:120]!r}", path, number
                )
            identities[int(label)] = name
    return identities
