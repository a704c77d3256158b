"""Read insightface's verification sets (`lfw.bin`, `cfp_fp.bin`, `agedb_30.bin`) without
running them.

Such a file is `pickle.dump((bins, issame_list))`: `bins` a list of encoded images (JPEG bytes;
`str` when Python 2 wrote it, read back as bytes), `issame_list` one bool per pair of images
(`bins[2i]`, `bins[2i + 1]`). insightface reads it with `pickle.load`, which runs whatever a
pickle asks for; this module never does. The file is read whole (at most `MAX_FILE_BYTES`) and
every opcode is checked by `pickletools.genops`, which decodes without executing, before a
restricted unpickler builds anything: only the opcodes that build bytes, bools, two lists and
the tuple holding them are admitted, at most `MAX_OBJECTS` stack items, no list inside a list.
`find_class` admits no class or function but `_codecs.encode`, the one call a protocol-2
pickle written by Python 3 uses for each bytes object, and it gets a stand-in that only turns
a str into latin-1 bytes. Anything else is an `InputError` naming the file (exit 2).

A pickle stores an object once and refers to it again with a memo reference: a 4 MB file can
name one 4 MB image 8,000 times. The images are kept as the objects the file stores
(`EvalSet.distinct`: each once, by identity, for hashing), and a set whose images add up to
more than `MAX_IMAGE_BYTES`, counted at every reference, is refused.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, NoReturn

import numpy as np

from ..doors.inputs import read_regular
from ..errors import InputError

if TYPE_CHECKING:
    from _typeshed import StrPath

# lfw.bin is about 60 MB; these leave room for larger sets and refuse a file that would take
# the machine's memory.
MAX_FILE_BYTES = 1 << 30
# Stack items pushed while unpickling (lfw.bin: about 18,000; 60,000 as written by Python 3
# with protocol 2).
MAX_OBJECTS = 1_000_000
# The images of a set added up at every reference (lfw.bin: about 60 MB, each image stored
# once); a set over it repeats objects far beyond what a verification set does.
MAX_IMAGE_BYTES = 4 << 30
SUFFIX = ".bin"

_BYTES = frozenset(
    ("SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "SHORT_BINSTRING", "BINSTRING")
)  # the last two: a Python 2 str, read as bytes
_TEXT = frozenset(("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"))
_PUT = frozenset(("BINPUT", "LONG_BINPUT", "MEMOIZE"))
_GET = frozenset(("BINGET", "LONG_BINGET"))
_LATIN1 = "latin1"  # what Python 3's pickler passes to _codecs.encode for bytes


@dataclass(frozen=True)
class EvalSet:
    """A verification set: its images in file order and one flag per pair of them."""

    path: str
    images: list[bytes]  # two per pair
    issame: list[bool]  # one per pair

    def __len__(self) -> int:
        return len(self.images)

    def distinct(self) -> tuple[list[bytes], np.ndarray]:
        """Return (each image object of the set once, in first-use order; for each image,
        the position of its object there): work per image, such as hashing, is done once per
        object the file stores, however often it is referenced."""
        first: dict[int, int] = {}
        objects: list[bytes] = []
        which = np.empty(len(self.images), np.int64)
        for i, image in enumerate(self.images):
            at = first.setdefault(id(image), len(objects))
            if at == len(objects):
                objects.append(image)
            which[i] = at
        return objects, which


def is_eval_set(spec: StrPath) -> bool:
    """Return True when `spec` names a verification set (`*.bin`, not a folder)."""
    name = os.fspath(spec)
    return name.lower().endswith(SUFFIX) and not os.path.isdir(name)


def read_eval_set(path: StrPath) -> EvalSet:
    """Read an insightface verification set; return an `EvalSet`.

    Raise `InputError` naming the file when it is missing, larger than `MAX_FILE_BYTES`,
    anything but a pickle of (list of bytes, list of bool) with two images per flag, or when
    its images, counted at every reference, add up to more than `MAX_IMAGE_BYTES`.
    """
    name = os.fspath(path)
    data = _read_bounded(name)
    _check_opcodes(name, data)
    try:
        value = _Unpickler(io.BytesIO(data)).load()
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a damaged pickle raises, say so
        raise _refuse(name, f"cannot unpickle ({type(exc).__name__}: {exc})") from None
    return _check_value(name, value)


def _refuse(path: str, why: str) -> InputError:
    return InputError(f"{path}: not an insightface verification set: {why}")


def _read_bounded(path: str) -> bytes:
    if os.path.isdir(path):
        raise InputError(f"{path}: a folder, not a verification set")
    data, _ = read_regular(path, "verification set", max_bytes=MAX_FILE_BYTES)
    if len(data) > MAX_FILE_BYTES:  # grew while it was read
        raise InputError(f"{path}: over the {MAX_FILE_BYTES:,} bytes a verification set may have")
    return data


class _List:
    """A list the pickle builds (only its identity matters to the check)."""


def _check_opcodes(path: str, data: bytes) -> None:
    """Walk the pickle's opcodes without executing any; refuse everything a verification set
    does not need, before the unpickler sees it.

    The stack is simulated with the kinds of the items the unpickler would build: "bytes",
    "bool", ("str", short value or None), a `_List`, ("tuple", items), "encode", and MARK.
    """
    # The kinds above: what is checked of each is more than a type can say.
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    pushed = 0
    stream = io.BytesIO(data)
    end: int | None = None

    def fail(pos: int | None, why: str) -> NoReturn:
        raise _refuse(path, f"byte {pos}: {why}")

    def pop(pos: int | None, op: str) -> Any:
        if len(stack) <= (marks[-1] if marks else 0):
            fail(pos, f"{op} with nothing to take")
        return stack.pop()

    try:
        ops = pickletools.genops(stream)
        first = True
        arg: Any  # what each opcode's argument is, its opcode says (genops: `Any | None`)
        for opcode, arg, pos in ops:
            name = opcode.name
            if first:
                if name != "PROTO" or not 2 <= arg <= 5:
                    fail(pos, "not a pickle of protocol 2 to 5 (insightface writes 2 or more)")
                first = False
                continue
            if name in _BYTES:
                stack.append("bytes")
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append("bool")
            elif name in _TEXT:
                stack.append(("str", arg if len(arg) <= 16 else None))
            elif name == "EMPTY_LIST":
                stack.append(_List())
            elif name == "MARK":
                if marks:
                    fail(pos, "nested MARK (no such nesting in a verification set)")
                marks.append(len(stack))
                continue
            elif name == "APPEND":
                item = pop(pos, name)
                if item not in ("bytes", "bool"):
                    fail(pos, "a list item that is not bytes or a bool")
                if not stack or not isinstance(stack[-1], _List):
                    fail(pos, "APPEND to something that is not a list")
                continue
            elif name == "APPENDS":
                if not marks:
                    fail(pos, "APPENDS without MARK")
                start = marks.pop()
                items, stack[start:] = stack[start:], []
                if any(item not in ("bytes", "bool") for item in items):
                    fail(pos, "a list item that is not bytes or a bool")
                if not stack or not isinstance(stack[-1], _List):
                    fail(pos, "APPENDS to something that is not a list")
                continue
            elif name == "TUPLE2":
                second, first_item = pop(pos, name), pop(pos, name)
                pair = (first_item, second)
                strings = all(isinstance(x, tuple) and x[0] == "str" for x in pair)
                lists = all(isinstance(x, _List) for x in pair)
                if not (strings or lists):
                    fail(pos, "a tuple that is neither (images, flags) nor encode's arguments")
                stack.append(("tuple", pair))
            elif name == "GLOBAL":
                if arg != "_codecs encode":
                    fail(pos, f"refused global {arg.replace(' ', '.')} (no code is run)")
                stack.append("encode")
            elif name == "REDUCE":
                args, func = pop(pos, name), pop(pos, name)
                latin1 = isinstance(args, tuple) and args[0] == "tuple"
                if func != "encode" or not latin1 or args[1][1] != ("str", _LATIN1):
                    fail(pos, "refused call (only str to latin-1 bytes is admitted)")
                stack.append("bytes")
            elif name in _PUT:
                if not stack or (marks and len(stack) == marks[-1]):
                    fail(pos, f"{name} with nothing to store")
                index = len(memo) if arg is None else arg
                if index >= MAX_OBJECTS:  # the unpickler would size its memo to it
                    fail(pos, f"{name} {index:,}: a memo index over {MAX_OBJECTS:,}")
                memo[index] = stack[-1]
                continue
            elif name in _GET:
                if arg not in memo:
                    fail(pos, f"{name} {arg} of nothing stored")
                stack.append(memo[arg])
            elif name == "FRAME":
                continue
            elif name == "STOP":
                end = stream.tell()
                break
            else:
                fail(pos, f"refused opcode {name} (a verification set holds bytes and bools)")
            pushed += 1
            if pushed > MAX_OBJECTS:
                fail(pos, f"more than {MAX_OBJECTS:,} objects")
    except ValueError as exc:  # genops: truncated data, an unknown opcode, a bad length
        raise _refuse(path, f"damaged pickle ({exc})") from None
    if end != len(data):  # genops raised ValueError if it saw no STOP
        # `end` is set: genops raised ValueError if it saw no STOP.
        raise _refuse(path, f"{len(data) - end:,} bytes after the end of the pickle")  # type: ignore[operator]
    whole = len(stack) == 1 and isinstance(stack[0], tuple) and stack[0][0] == "tuple"
    if marks or not whole or not isinstance(stack[0][1][0], _List):
        raise _refuse(path, "it does not hold one (images, flags) pair of lists")


def _latin1(text: object, encoding: object) -> bytes:
    """The stand-in for `_codecs.encode`: str to latin-1 bytes, nothing else."""
    if type(text) is not str or encoding != _LATIN1:
        raise pickle.UnpicklingError("refused call of _codecs.encode")
    return text.encode("latin-1")


class _Unpickler(pickle.Unpickler):
    """An unpickler that builds no object of any class and calls no function."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__(file, encoding="bytes")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        raise pickle.UnpicklingError(f"refused global {module}.{name}")

    def persistent_load(self, pid: object) -> NoReturn:
        raise pickle.UnpicklingError("refused persistent id")


def _check_value(path: str, value: object) -> EvalSet:
    if type(value) is not tuple or len(value) != 2:
        raise _refuse(path, "not a (images, flags) pair")
    images, issame = value
    if type(images) is not list or type(issame) is not list:
        raise _refuse(path, "images and flags are not lists")
    if any(type(image) is not bytes for image in images):
        raise _refuse(path, "an image that is not bytes")
    if any(type(flag) is not bool for flag in issame):
        raise _refuse(path, "a pair flag that is not a bool")
    if not images:
        raise _refuse(path, "no images")
    if not all(images):
        raise _refuse(path, f"image {images.index(b'')} is empty")
    if len(images) != 2 * len(issame):
        raise _refuse(
            path, f"{len(images):,} images for {len(issame):,} pair flags (two images a pair)"
        )
    total = sum(map(len, images))
    if total > MAX_IMAGE_BYTES:
        stored = sum(map(len, {id(image): image for image in images}.values()))
        raise _refuse(
            path,
            f"its {len(images):,} images add up to {total:,} bytes, over the "
            f"{MAX_IMAGE_BYTES:,} a set may have: the file stores {stored:,} bytes of images "
            "and refers to them again and again",
        )
    return EvalSet(path, images, issame)
