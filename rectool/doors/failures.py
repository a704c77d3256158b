"""One door for the failures file (`PREFIX.failures.jsonl`): its schema, its lines written
(`failure_line`) and read (`open_failures`) in one place.

A failures file holds one JSON object a line, each ending with a newline. `pack` writes a
`PACK` line for each image it refuses (`packer.results.Refusal`); `repack` writes a `REPACK`
line for each record its plan removes (`"stage": "plan"`, with a `detail`) or its writing
refuses (`"stage": "write"`, with the plan `position`). Every field is checked here, as the
manifest's are in `format.manifest.read_manifest`: a line that is not UTF-8 JSON, not an
object, has a field missing, extra or of the wrong type, a string that is no text (a lone
`\\ud800`), or is longer than `MAX_LINE_BYTES` is an `InputError` naming the file and line number
(`bad_lines=True` yields it instead, for the report). A line is read at most `MAX_LINE_BYTES`
at a time, a longer one read past, never held whole. The file is opened by the door in
(`doors.inputs.open_input`).

A torn last line: the writers append a line, newline included, only after every record before
it reached its file (`ShardWriter.write_after`), in one `os.write` (a line is at most
`MAX_LINE_BYTES`, the writer's write size), so `kill -9` in practice leaves whole lines; a
partial write (a full disk, a crash of the machine) can still leave a last line without its
newline. `torn_tail=True` (`--resume` of pack and repack) reads such a line as never written:
it is not yielded, the lines before it end at `FailureLine.end`, and the caller truncates the
file there (pack) or copies the lines before it (repack). The image or record it was about is
then not counted as done, so the resumed run meets it again and writes its line again. A bad
line before the last one, or a bad last line that has its newline, is an error as anywhere
else. Without `torn_tail`, a last line without a newline is read like any other (a finished
file always ends with one; a file edited by hand may not).
`tests/test_architecture.py` fails when a module outside this one parses or formats a line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, TypedDict, final

from ..errors import InputError
from .inputs import open_input

if TYPE_CHECKING:
    from _typeshed import StrPath

# A refusal's line is a few hundred bytes (a path, a reason); a longer one is not a refusal.
MAX_LINE_BYTES = 1 << 20
# A string longer than this is cut in a line that would be longer than MAX_LINE_BYTES: a line
# holds at most 8 strings, each at most 6 bytes a character (JSON's \uXXXX), all under it.
SHORTENED_CHARS = 1 << 14
_SURROGATE = re.compile("[\ud800-\udfff]")


@final  # no other keys: `"line" in entry` tells a pack line from a repack line
class PackLine(TypedDict):
    """An image `pack` refused: its list line, the list's index, its path and why."""

    line: int
    index: int
    path: str
    reason: str


class _RepackFields(TypedDict):
    source: str
    key: int
    label: int
    identity: str | None
    stage: Literal["plan", "write"]
    reason: str


@final
class RepackLine(_RepackFields, total=False):
    """A record `repack` did not write: removed by its plan (`detail` says why) or refused
    while writing (`position` in the plan)."""

    detail: str
    position: int


FailureEntry = PackLine | RepackLine
Kind = Literal["pack", "repack"]
PACK: Kind = "pack"
REPACK: Kind = "repack"
KINDS: tuple[Kind, ...] = (PACK, REPACK)


def _is_int(value: object) -> bool:
    return type(value) is int


def _is_text(value: object) -> bool:
    return type(value) is str


# Each kind's fields: name -> (check, what it must be). A line holds exactly these.
_Check = Callable[[object], bool]
_Field = tuple[_Check, str]
_TEXT: _Field = (_is_text, "a string")
_INT: _Field = (_is_int, "an integer")
_SCHEMA: dict[Kind, dict[str, _Field]] = {
    PACK: {"line": _INT, "index": _INT, "path": _TEXT, "reason": _TEXT},
    REPACK: {
        "source": _TEXT,
        "key": _INT,
        "label": _INT,
        "identity": (lambda v: v is None or type(v) is str, "a string or null"),
        "stage": (lambda v: v in ("plan", "write"), '"plan" or "write"'),
        "reason": _TEXT,
    },
}
# A repack line's stage adds one field.
_STAGE_FIELD: dict[object, tuple[str, _Field]] = {
    "plan": ("detail", _TEXT),
    "write": ("position", (lambda v: type(v) is int and v >= 0, "an integer >= 0")),
}


def failure_line(entry: Mapping[str, object]) -> bytes:
    """Return the line of the failures file that holds `entry` (UTF-8, newline included).

    A line is at most `MAX_LINE_BYTES`, so that every line written can be read back: a string
    over `SHORTENED_CHARS` characters (no real path is: a list line can hold any text, a file
    system's path at most 4,096 bytes) is then cut there, saying how long it was."""
    line = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
    if len(line) <= MAX_LINE_BYTES:
        return line
    shortened = {
        name: f"{value[:SHORTENED_CHARS]}... ({len(value):,} characters in all)"
        if isinstance(value, str) and len(value) > SHORTENED_CHARS
        else value
        for name, value in entry.items()
    }
    return (json.dumps(shortened, ensure_ascii=False) + "\n").encode("utf-8")


def check_entry(doc: object, kind: Kind) -> str | None:
    """Return why the parsed line `doc` is not a failures line of `kind`, or None if it is."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    fields = dict(_SCHEMA[kind])
    if kind == REPACK and doc.get("stage") in _STAGE_FIELD:
        name, spec = _STAGE_FIELD[doc["stage"]]
        fields[name] = spec
    missing = [name for name in fields if name not in doc]
    if missing:
        return f"no field {missing[0]!r}"
    for name, (check, want) in fields.items():
        if not check(doc[name]):
            return f"field {name!r} must be {want}"
    extra = sorted(str(name) for name in doc if name not in fields)
    if extra:
        return f"a field {extra[0]!r} a {kind} failures line does not have"
    for name, value in doc.items():  # JSON reads a \\ud800 escape alone: no path, no reason
        if isinstance(value, str) and _SURROGATE.search(value):
            return f"field {name!r} is not text (it holds half of a UTF-16 surrogate pair)"
    return None


@dataclass(frozen=True)
class FailureLine:
    """One line of a failures file: its number (from 1), the byte offset just past it, the
    line as written (empty for one too long to hold), and its entry (None, with `problem`,
    for a bad line under `bad_lines`)."""

    number: int
    end: int
    text: bytes
    entry: FailureEntry | None
    problem: str | None = None


def parse_line(text: bytes, kinds: tuple[Kind, ...]) -> tuple[FailureEntry | None, str | None]:
    """Return (entry, None) for a line that is a failures line of one of `kinds`, else
    (None, why not)."""
    try:
        doc: Any = json.loads(text.decode("utf-8"))  # JSON: any type, checked below
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except RecursionError:
        return None, "not JSON (nested too deep)"
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    problems = []
    for kind in kinds:
        problem = check_entry(doc, kind)
        if problem is None:
            entry: FailureEntry = doc
            return entry, None
        problems.append(problem)
    return None, problems[0] if len(set(problems)) == 1 else "; ".join(
        f"as a {kind} line: {problem}" for kind, problem in zip(kinds, problems)
    )


class FailuresFile:
    """A failures file open for reading (`open_failures`); iterate over it once for its lines,
    each a `FailureLine`. A context manager: leaving it closes the file."""

    def __init__(
        self, path: StrPath, kinds: tuple[Kind, ...], torn_tail: bool, bad_lines: bool, f: BinaryIO
    ) -> None:
        self.path = os.fspath(path)
        self.kinds, self.torn_tail, self.bad_lines = kinds, torn_tail, bad_lines
        self._file = f

    def __enter__(self) -> FailuresFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def __iter__(self) -> Iterator[FailureLine]:
        end = 0
        for number, (text, length, whole) in enumerate(_bounded_lines(self._file), 1):
            if self.torn_tail and not whole:
                return  # never written whole: see the module's docstring
            end += length
            entry, problem = (
                parse_line(text, self.kinds)
                if text is not None
                else (None, f"longer than {MAX_LINE_BYTES:,} bytes")
            )
            if entry is None and not self.bad_lines:
                raise InputError(f"{self.path}: line {number}: {problem}")
            yield FailureLine(number, end, text or b"", entry, problem)


def open_failures(
    path: StrPath,
    kinds: tuple[Kind, ...] = (PACK,),
    *,
    torn_tail: bool = False,
    bad_lines: bool = False,
    **checks: Any,
) -> FailuresFile:
    """Open the failures file at `path`, whose lines are lines of one of `kinds`.

    Opened by `open_input` (`checks`: its `follow`, `within`), so a file that cannot be opened
    raises here. Reading a bad line raises `InputError` naming the file and line number, or
    with `bad_lines` yields it with `entry` None and its `problem`. `torn_tail`: see the
    module's docstring.
    """
    f = open_input(path, "failures file", **checks)
    return FailuresFile(path, kinds, torn_tail, bad_lines, f)


def _bounded_lines(f: BinaryIO) -> Iterator[tuple[bytes | None, int, bool]]:
    """Yield (line, its length in bytes, whether it ends with a newline) for each line of `f`;
    the line is None when it is longer than `MAX_LINE_BYTES` (read past, never held whole)."""
    while text := f.readline(MAX_LINE_BYTES + 1):
        if len(text) <= MAX_LINE_BYTES:
            yield text, len(text), text.endswith(b"\n")
            continue
        length, last = len(text), text
        while not last.endswith(b"\n") and (last := f.readline(MAX_LINE_BYTES)):
            length += len(last)
        yield None, length, last.endswith(b"\n")
