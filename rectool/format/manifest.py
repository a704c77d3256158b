"""The manifest schema: every field rectool's commands read, checked on every read.

`read_manifest` here is the package's one door to a manifest: the reader's own
`reader.read_manifest` checks what reading a pack needs (format, version, each shard's .rec,
the index's counts and files), then `check_command_fields` checks every other field a command
uses (layout, each shard's .idx and counts, ...) before one is used. The emitted reader reads
no other field, so it carries none of this.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..doors.inputs import read_state
from ..reader import (
    DATASET_LAYOUTS,
    InputError,
    is_count,
    plain_name,
)
from ..reader import read_manifest as read_reader_fields
from .paths import PackPaths

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from _typeshed import StrPath

Field = tuple[Callable[[Any], bool], str]
Fields = dict[str, Any]  # name -> a Field, or the Fields of an object

# A field's (test, what it must be); null always means "not recorded".
COUNT_FIELD: Field = (is_count, "a count (an integer >= 0)")
NAME_FIELD: Field = (plain_name, "a plain file name in the manifest's folder")
LAYOUT_FIELD: Field = (lambda v: v in DATASET_LAYOUTS, f"one of {DATASET_LAYOUTS}")


def bad_field(path: str, field: str, want: str) -> InputError:
    """Return the `InputError` of a manifest field that is not what it must be."""
    return InputError(f"{path}: manifest field {field!r} must be {want}")


def check_fields(path: str, obj: dict[str, Any], fields: Fields, where: str = "") -> None:
    """Raise `bad_field` for the first of `fields` ({name: (test, want)}) set in `obj` but wrong."""
    for name, (test, want) in fields.items():
        if obj.get(name) is not None and not test(obj[name]):
            raise bad_field(path, where + name, want)


_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_CLASS_ID = 1 << 24  # float32 labels are exact integers below 2**24 (FLOAT32_EXACT)
_HEX, _DIGITS = frozenset("0123456789abcdef"), frozenset("0123456789")

_KEY: Field = (
    lambda v: type(v) is int and 0 <= v < 1 << 64,
    "a record key (an integer 0 .. 2**64-1)",
)
_TEXT: Field = (lambda v: isinstance(v, str), "a string")
_FLAG: Field = (lambda v: type(v) is bool, "true or false")
_SHA256: Field = (lambda v: isinstance(v, str) and len(v) == 64 and _HEX >= set(v), "64 hex digits")
_XXH128: Field = (lambda v: isinstance(v, str) and len(v) == 32 and _HEX >= set(v), "32 hex digits")
_CLASSES: Field = (
    lambda v: type(v) is int and 0 <= v <= MAX_CLASS_ID,
    f"an integer 0 .. {MAX_CLASS_ID}",
)
MAX_MANIFEST_DEPTH = 16  # rectool writes 3 levels (shards[0], options.transform)
_INT: Field = (lambda v: type(v) is int and -(1 << 31) <= v < 1 << 31, "an integer")
# `rectool index --into`: the links in the manifest's folder to files that stay elsewhere.
_LINKS: Field = (
    lambda v: (
        isinstance(v, dict)
        and all(plain_name(k) and isinstance(t, str) and os.path.isabs(t) for k, t in v.items())
    ),
    "an object {file name in the manifest's folder: absolute path}",
)

# Each object's fields: name -> a field, or the fields of an object. Fields not named here are
# kept as they are (only the nesting depth limits them).
TRANSFORM: Fields = {
    "resize": COUNT_FIELD,
    "center_crop": _FLAG,
    "quality": _INT,
    "encoding": _TEXT,
    "color": _INT,
}
OPTIONS: Fields = {
    "transform": TRANSFORM,
    "check": _TEXT,
    "pack_label": _FLAG,
    "shard_bytes": COUNT_FIELD,
    "shard_records": COUNT_FIELD,
    "layout": LAYOUT_FIELD,
    "allow_outside_root": _FLAG,
    "workers": COUNT_FIELD,
    "max_failures": COUNT_FIELD,
    "sha256": _FLAG,
}
SHARD: Fields = {
    "idx": NAME_FIELD,
    "records": COUNT_FIELD,
    "rec_bytes": COUNT_FIELD,
    "idx_bytes": COUNT_FIELD,
    "rec_sha256": _SHA256,
    "idx_sha256": _SHA256,
    "first_key": _KEY,
    "last_key": _KEY,
    "crc": NAME_FIELD,
    "crc_sha256": _SHA256,
    "rec_xxh3_128": _XXH128,
    "idx_xxh3_128": _XXH128,
    "crc_xxh3_128": _XXH128,
}
FILE: Fields = {"file": NAME_FIELD, "bytes": COUNT_FIELD, "xxh3_128": _XXH128}
INDEX: Fields = {name: FILE for name in ("offsets", "keys", "labels", "identity_ranges")}
MANIFEST: Fields = {
    "rectool_version": _TEXT,
    "created": _TEXT,
    "date": _TEXT,
    "options": OPTIONS,
    "list": _TEXT,
    "source": {"list_sha256": _TEXT, "root": _TEXT},
    "totals": {n: COUNT_FIELD for n in ("shards", "records", "images", "rec_bytes", "failures")},
    "failures_file": NAME_FIELD,
    "accepted": _FLAG,
    "classes": _CLASSES,
    "index": INDEX,
    "layout": LAYOUT_FIELD,
    "links": _LINKS,
}
CLOSED = {"options.transform"}  # objects whose every field is known (--resume compares them)


# The longest folder name Linux and macOS file systems hold, in bytes (NAME_MAX).
MAX_NAME_BYTES = 255


def identity_name_problem(name: str) -> str | None:
    """Return why `name` cannot name an identity (a folder of `unpack`, a line of a label map),
    or None: it must be a non-empty single folder name, not `.` or `..`, without `/` or
    control characters (tab, newline, NUL...), that a file system can hold (encodable, at
    most `MAX_NAME_BYTES`)."""
    if not name:
        return "is empty"
    if name in (".", ".."):
        return f"is {name!r}, not a folder name"
    if "/" in name:
        return "holds '/' (an identity is one folder, not a path)"
    control = next((c for c in name if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if control is not None:
        return f"holds the control character {control!r}"
    try:
        size = len(os.fsencode(name))
    except UnicodeEncodeError:  # a lone surrogate, from a JSON escape
        return "cannot be encoded as a file name"
    if size > MAX_NAME_BYTES:
        return f"is {size:,} bytes, more than a folder name holds ({MAX_NAME_BYTES})"
    return None


def identity_name_problems(names: Mapping[int, str]) -> Iterator[tuple[int, str]]:
    """Yield (label, what is wrong) for each label whose identity name cannot name a folder
    (`identity_name_problem`) or is the name of a lower label: two identities would share a
    folder of `unpack`, a name of `--keep-ids`, a label of `repack --labels-by name`."""
    owner: dict[str, int] = {}
    for label, name in sorted(names.items()):
        why = identity_name_problem(name)
        if why is not None:
            yield label, f"label {label}'s identity name {name!r} {why}"
        elif name in owner:
            yield label, f"labels {owner[name]} and {label} are both named {name!r}"
        else:
            owner[name] = label


def read_manifest(path: StrPath, require: Iterable[str] = ()) -> dict[str, Any]:
    """Read and check a pack manifest; raise `InputError` naming the file and field.

    `require`: dotted names ("totals.images") of fields that must be present and not null.
    """
    path = os.fspath(path)
    doc = read_reader_fields(path)
    check_command_fields(path, doc)
    for field in require:
        value: Any = doc
        for part in field.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            raise InputError(f"{path}: manifest field {field!r} is missing (or null)")
    return doc


def too_deep(path: str) -> InputError:
    """Return the `InputError` of a manifest nested deeper than `MAX_MANIFEST_DEPTH`."""
    return InputError(
        f"{path}: not a rectool manifest (JSON nested more than {MAX_MANIFEST_DEPTH} deep)"
    )


def check_command_fields(path: str, doc: dict[str, Any]) -> None:
    """Check the fields of a manifest that commands read; raise `InputError` naming one.

    `doc` has passed the reader's own checks.
    `identities` given as a list of names becomes {"label": name} (labels 0, 1, ...), the form
    every command reads. No name or string may hold a lone surrogate (see `lone_surrogate`).
    """
    if _deeper_than(doc, MAX_MANIFEST_DEPTH):
        raise too_deep(path)
    where = lone_surrogate(doc)  # json reads one from a \\ud800 escape alone
    if where is not None:
        raise bad_field(path, where, "text (it holds half of a UTF-16 surrogate pair)")
    _check_object(path, doc, MANIFEST, "")
    identities = doc.get("identities")
    if doc.get("index") is not None and doc.get("format_version", 0) < 3:
        raise bad_field(path, "format_version", "3 or more (the manifest has an 'index')")
    if doc.get("format_version", 0) >= 3:  # the names are in their own file
        if identities is not None:
            if not isinstance(identities, dict) or identities.get("file") is None:
                raise bad_field(path, "identities", 'an object {"file", "bytes", ...} or null')
            _check_object(path, {"identities": identities}, {"identities": FILE}, "")
            check_fields(path, identities, {"count": COUNT_FIELD}, "identities.")
        identities = None
    elif isinstance(identities, list):
        identities = doc["identities"] = {str(i): name for i, name in enumerate(identities)}
    if not isinstance(identities, (dict, type(None))):
        raise bad_field(path, "identities", 'an object {"label": "name"}, a list of names or null')
    for label, name in (identities or {}).items():
        canonical = 0 < len(label) <= 8 and _DIGITS >= set(label)
        if not (canonical and (label == "0" or label[0] != "0") and int(label) < MAX_CLASS_ID):
            field, want = (
                f'identities["{label[:40]}"]',
                f"keyed by a label (0 .. {MAX_CLASS_ID - 1})",
            )
            raise bad_field(path, field, want)
        if not isinstance(name, str):
            raise bad_field(path, f'identities["{label}"]', "a name (a string)")
    sources = doc.get("sources")
    if sources is not None and not (
        isinstance(sources, list) and all(isinstance(s, str) for s in sources)
    ):
        raise bad_field(path, "sources", "a list of strings")
    names = [shard.get("rec") for shard in doc["shards"]]
    for i, shard in enumerate(doc["shards"]):
        if not plain_name(shard.get("idx")) or shard["idx"] in names:
            raise bad_field(path, f"shards[{i}].idx", NAME_FIELD[1] + ", listed once")
        names.append(shard["idx"])
        _check_object(path, shard, SHARD, f"shards[{i}].")


def lone_surrogate(doc: object) -> str | None:
    """Return the field of parsed JSON `doc` ("shards[0].rec") whose name or string holds half
    of a UTF-16 surrogate pair (JSON reads one from a \\ud800 escape alone), or None. Such a
    string is no text: it cannot name a file, nor be printed, written to a page or a JSON
    document in UTF-8."""
    todo: list[tuple[str, object]] = [("", doc)]
    while todo:
        where, value = todo.pop()
        if isinstance(value, str) and _SURROGATE.search(value):
            return where
        if isinstance(value, dict):
            for name, item in value.items():
                field = f"{where}.{name}" if where else name
                todo += [(field, name), (field, item)]
        elif isinstance(value, list):
            todo += [(f"{where}[{i}]", item) for i, item in enumerate(value)]
    return None


def _check_object(path: str, obj: dict[str, Any], fields: Fields, where: str) -> None:
    for name, spec in fields.items():
        value, field = obj.get(name), f"{where}{name}"
        if not isinstance(spec, dict):
            check_fields(path, obj, {name: spec}, where)
        elif value is not None:
            if not isinstance(value, dict):
                raise bad_field(path, field, "an object")
            if field in CLOSED and not set(value) <= set(spec):
                raise bad_field(path, field, f"an object of {', '.join(spec)} only")
            _check_object(path, value, spec, field + ".")


def _deeper_than(doc: dict[str, Any], limit: int) -> bool:
    """Return True when `doc` nests lists and objects more than `limit` deep (a layer at a
    time, without recursion)."""
    layer: list[Any] = [doc]
    depth = 1
    while layer:
        if depth > limit:
            return True
        layer = [
            v
            for c in layer
            for v in (c.values() if isinstance(c, dict) else c)
            if isinstance(v, (dict, list))
        ]
        depth += 1
    return False


# A shard packed alone (`pack --only-shard K`) is written with its plan file beside it
# (`PackPaths.shard(k).plan`, `PREFIX-0000K.plan.json`), until `pack --finalize` writes the
# manifest: the plan the shard is one part of. Whoever finds numbered shards without a manifest
# learns from it that they are not a pack yet.
PLAN: Fields = {
    "shards": COUNT_FIELD,
    "shard": COUNT_FIELD,
    "shard_records": COUNT_FIELD,
    "list_items": COUNT_FIELD,
    "list_sha256": _TEXT,
}


def plan_document(
    shards: int, shard: int, shard_records: int, list_items: int, list_sha256: str
) -> dict[str, Any]:
    """Return the plan file of shard `shard` of `shards` (see `PackPaths.plan`)."""
    return {
        "plan": {
            "shards": shards,
            "shard": shard,
            "shard_records": shard_records,
            "list_items": list_items,
            "list_sha256": list_sha256,
        },
        "finish": "rectool pack LIST ROOT PREFIX --shard-records N --finalize",
    }


def read_shard_plan(path: str) -> dict[str, Any]:
    """Read a shard's plan file; return its "plan" object, checked; raise `InputError`."""
    return read_shard_plan_file(path)["plan"]


def read_shard_plan_file(path: str) -> dict[str, Any]:
    """Read a shard's plan file whole: its "plan" object checked, and the task's byte
    "options" and the digests of the files it "packed" (objects, or absent: a plan file of
    an older rectool, or of a task not finished); raise `InputError`."""
    doc = read_state(path, "shard plan file")
    plan = doc.get("plan")
    if not isinstance(plan, dict) or any(plan.get(name) is None for name in PLAN):
        raise InputError(f"{path}: not a shard plan file (no plan with {', '.join(PLAN)})")
    check_fields(path, plan, PLAN, "plan.")
    if not plan["shard"] < plan["shards"]:
        raise bad_field(path, "plan.shard", f"below plan.shards ({plan['shards']})")
    for name in ("options", "packed"):
        if not isinstance(doc.get(name, {}), dict):
            raise bad_field(path, name, "an object")
    return doc


def refuse_unfinished_plan(prefix: str | PackPaths, recs: Iterable[str]) -> None:
    """Raise `InputError` when the numbered shards of `prefix` (`recs`, found without a
    manifest) are not a whole pack: shards of a plan packed shard by shard and not finalized,
    or numbers with gaps; the message names the missing shards.

    Every shard packed with `--only-shard` carries its plan (`PackPaths.plan`), so shards of a
    job array that lost some (or never packed them) are never read as a whole pack.
    """
    paths = PackPaths.of(prefix)
    numbered = ((PackPaths.shard_number(rec), rec) for rec in recs)
    present = {number: rec for number, rec in numbered if number is not None}
    plans = {}
    for number in present:
        path = paths.shard(number).plan
        if os.path.lexists(path):
            plans[number] = (path, read_shard_plan(path))
    if not plans:
        gaps = sorted(set(range(max(present, default=-1) + 1)) - set(present))
        if gaps:
            shown = ", ".join(map(str, gaps[:10])) + (", ..." if len(gaps) > 10 else "")
            raise InputError(
                f"{prefix}: shard{'s' if len(gaps) > 1 else ''} {shown} of the numbered shards "
                f"0..{max(present)} {'are' if len(gaps) > 1 else 'is'} missing, and no manifest "
                f"says how many there are (no {paths.manifest}); restore the pack, or "
                "name the .rec files to read"
            )
        return
    (first_path, plan), *others = plans.values()
    for path, other in others:
        if (other["shards"], other["list_sha256"]) != (plan["shards"], plan["list_sha256"]):
            raise InputError(
                f"{prefix}: shards of two plans are mixed ({first_path}: {plan['shards']} "
                f"shards of list {plan['list_sha256'][:12]}; {path}: {other['shards']} of "
                f"{other['list_sha256'][:12]}); pack them to separate prefixes"
            )
    total = plan["shards"]
    # The plan file says how many: count the missing ones, list the first (never all of a
    # plan file's claim of a billion shards).
    count = total - sum(1 for k in present if k < total)
    missing = list(itertools.islice((k for k in range(total) if k not in present), 10))
    unfinished = [k for k in present if os.path.lexists(paths.shard(k).state)]
    if missing or unfinished:
        numbers, count = (missing, count) if missing else (unfinished, len(unfinished))
        shown = ", ".join(map(str, numbers[:10])) + (
            f", ... ({count:,} in all)" if count > 10 else ""
        )
        raise InputError(
            f"{prefix}: an unfinished job array ({first_path} says so): of the {total}-shard "
            f"plan, shard{'s' if count > 1 else ''} {shown} "
            f"{'missing' if missing else 'still being packed'}; pack each with "
            "--only-shard K, then write the manifest with --finalize"
        )
    raise InputError(
        f"{prefix}: {total} shards packed one by one and never finalized (no "
        f"{paths.manifest}; {first_path} says so); write the manifest with "
        "`rectool pack LIST ROOT PREFIX --shard-records N --finalize`"
    )
