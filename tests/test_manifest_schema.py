"""One manifest schema: every field any command reads is checked in `format.manifest.read_manifest`
(the core reader's `read_manifest` checks the fields it reads, first).

A manifest with any field mutated to any JSON type either passes the schema (and then every
command works on it) or is refused with a `RectoolError` naming the field; never a traceback.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import traceback
import tracemalloc

import pytest
from click.testing import CliRunner
from helpers.rec_files import make_pack
from hypothesis import given, settings
from hypothesis import strategies as st

from rectool import reader as core
from rectool.cli import cli
from rectool.format import manifest as rd
from rectool.format.binindex import read_identities

# Every JSON type, and the edge values of each.
VALUES = {
    "null": None,
    "true": True,
    "zero": 0,
    "int": 7,
    "negative": -3,
    "float": 0.5,
    "huge": 10**40,
    "string": "many",
    "path": "../x",
    "empty string": "",
    "list": [1, "a"],
    "empty list": [],
    "dict": {"a": 1},
    "empty dict": {},
    "deep": json.loads("[" * 12 + "]" * 12),
}
TRANSFORM = {"resize": 0, "center_crop": False, "quality": 95, "encoding": ".jpg", "color": 1}
PACK_AS_RECORDED = ["--quality", "95", "--encoding", ".jpg", "--color", "1"]  # TRANSFORM
# The fields of a manifest as `rectool pack` writes it (the `pack` fixture checks that these are
# exactly its fields), with `transform` as a re-encoding pack records it, and `sources` as
# `repack` adds it.
OPTIONS = (
    "check pack_label shard_bytes shard_records layout allow_outside_root workers max_failures "
    "sha256"
).split()
# Packed with --sha256: every digest field a version-2 manifest can hold.
SHARD = (
    "rec idx records rec_bytes idx_bytes rec_xxh3_128 rec_sha256 idx_xxh3_128 idx_sha256 "
    "first_key last_key crc crc_xxh3_128 crc_sha256"
).split()
TOTALS = ["shards", "records", "images", "rec_bytes", "failures"]
TOP = (
    "format_version rectool_version created layout options list source shards totals "
    "failures_file accepted classes identities index"
).split()
FIELDS = (
    [(name,) for name in TOP]
    + [("options", name) for name in [*OPTIONS, "transform"]]
    + [("options", "transform", name) for name in TRANSFORM]
    + [("source", "list_sha256"), ("source", "root"), ("shards", 0)]
    + [("shards", 0, name) for name in SHARD]
    + [("totals", name) for name in TOTALS]
    + [("identities", "1"), ("identities", "7"), ("sources",)]
    + [("index",), ("index", "samples"), ("index", "labels"), ("index", "keys", "file")]
)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """A pack made by rectool (label map, .rec.crc), its manifest given a re-encoding; returns
    the pack's folder and its manifest document."""
    base = tmp_path_factory.mktemp("schema")
    made = make_pack(base, sha256=True)
    document = json.loads(made.manifest.read_text())
    assert sorted(document) == sorted(["format", *TOP])
    assert sorted(document["options"]) == sorted([*OPTIONS, "transform"])
    assert sorted(document["shards"][0]) == sorted(SHARD)
    assert sorted(document["totals"]) == sorted(TOTALS)
    document["options"]["transform"] = dict(TRANSFORM)
    document["sources"] = ["a.manifest.json"]
    made.manifest.write_text(json.dumps(document))
    folder = made.manifest.parent
    again = ["pack", str(base / "faces.lst"), str(base / "tree"), str(folder / "faces")]
    result = CliRunner().invoke(cli, [*again, "--resume", *PACK_AS_RECORDED])
    assert "Nothing to do: the pack was already complete" in result.output, result.output
    return folder, document


def mutated(document, path, value):
    document = copy.deepcopy(document)
    target = document
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = copy.deepcopy(value)
    return document


def field_name(path):
    """The name read_manifest gives a field: `shards[0].rec`, `identities["1"]`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif path[0] == "identities" and part != "identities":
            text += f'["{part}"]'
        else:
            text += f".{part}" if text else part
    return text


def commands(folder, base):
    m, out = str(folder / "faces.manifest.json"), folder / "outputs"
    return [
        ["verify", m, "-q"],
        ["info", m, "--json"],
        ["report", m, "-o", str(out / "r.html"), "--sample", "2"],
        ["unpack", m, str(out / "unpacked")],
        ["repack", m, str(out / "re")],
        ["dali-index", m, str(out / "d.idx")],
        ["index", m],
        [
            "pack",
            str(base / "faces.lst"),
            str(base / "tree"),
            str(folder / "faces"),
            "--resume",
            *PACK_AS_RECORDED,
        ],
    ]


def run_commands(folder, base):
    """Run each command; return (args, exit code, output) of each that ended badly."""
    bad = []
    for args in commands(folder, base):
        (folder / "outputs").mkdir(exist_ok=True)
        result = CliRunner().invoke(cli, args)
        escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
        # 2: an unusable input (the exit-code table); pack: 3 is "more than --max-failures refused"
        allowed = {"pack": (0, 1, 2, 3)}.get(args[0], (0, 1, 2))
        if escaped or result.exit_code not in allowed or "Traceback" in result.output:
            text = "".join(traceback.format_exception(result.exception)) if escaped else ""
            bad.append((args[0], result.exit_code, result.output[-300:] + text[-1500:]))
        shutil.rmtree(folder / "outputs")
    return bad


@pytest.mark.parametrize("path", FIELDS, ids=field_name)
def test_every_field_mutated_to_every_json_type(pack, tmp_path, path, alarm):
    folder, document = pack
    work = tmp_path / "pack"
    shutil.copytree(folder, work, symlinks=True)
    manifest = work / "faces.manifest.json"
    alarm(120)
    failures = []
    for kind, value in VALUES.items():
        manifest.write_text(json.dumps(mutated(document, path, value)))
        try:
            rd.read_manifest(manifest)
        except core.RectoolError as exc:
            named = f"manifest field {field_name(path)!r}"[:-1]  # it or a field inside it
            if named not in str(exc) and not (
                path == ("format_version",) and "manifest format version" in str(exc)
            ):
                failures.append((kind, "read_manifest", str(exc)))
        try:  # the emitted reader: a manifest that passes may still not fit the files
            ds = core.open_dataset(manifest)
            ds[0], ds.labels  # noqa: B018
        except core.RectoolError:
            pass
        except Exception:  # noqa: BLE001
            failures.append((kind, "open_dataset", traceback.format_exc()[-1500:]))
        failures += [(kind, *b) for b in run_commands(work, folder.parent)]
    assert not failures, "\n".join(map(str, failures))


def test_a_manifest_nested_200000_deep_is_refused_by_every_command(pack, tmp_path):
    folder, document = pack
    work = tmp_path / "pack"
    shutil.copytree(folder, work, symlinks=True)
    manifest = work / "faces.manifest.json"
    text = json.dumps({**document, "extra": 0})
    manifest.write_text(text.replace("0}", "[" * 200_000 + "]" * 200_000 + "}"))
    with pytest.raises(core.RectoolError) as caught:
        core.open_dataset(manifest)
    assert str(caught.value) == f"{manifest}: not a rectool manifest (JSON nested too deep)"
    assert run_commands(work, folder.parent) == []
    for args in commands(work, folder.parent):
        result = CliRunner().invoke(cli, args)
        assert f"{manifest}: not a rectool manifest (JSON nested" in result.output, args
        assert result.exit_code == 2, args  # an unusable input, whatever the command


def test_nesting_below_json_own_limit_is_refused_too(pack, tmp_path):
    """17 levels parse, but a manifest never nests so deep: refused before any field is used."""
    folder, document = pack
    manifest = tmp_path / "x.manifest.json"
    manifest.write_text(
        json.dumps({**document, "options": {**document["options"], "x": VALUES["deep"]}})
    )
    rd.read_manifest(manifest)  # 14 levels: kept as an unknown option
    deeper = json.loads("[" * 15 + "]" * 15)
    manifest.write_text(json.dumps({**document, "options": {**document["options"], "x": deeper}}))
    with pytest.raises(core.RectoolError, match="JSON nested more than 16 deep"):
        rd.read_manifest(manifest)


def test_a_manifest_larger_than_the_limit_is_refused_unread(tmp_path):
    manifest = tmp_path / "x.manifest.json"
    with open(manifest, "wb") as f:
        f.truncate(core.MAX_MANIFEST_BYTES + 1)  # sparse: nothing is written or read
    for read in (core.read_manifest, rd.read_manifest):
        with pytest.raises(core.InputError) as caught:
            read(manifest)
        assert str(caught.value) == (
            f"{manifest}: the manifest is 268,435,457 bytes, over 268,435,456"
        )


LONE_SURROGATES = {  # where, what, the field named
    "identity name": (("identities", "1"), "\udc80bob", "identities.1"),
    "failures file": (("failures_file",), "\ud800.jsonl", "failures_file"),
    "list": (("list",), "faces\udfff.lst", "list"),
    "unknown field": (("note",), ["text", {"a": "\ud800"}], "note[1].a"),
    "a field's name": (("options", "\udc80"), 1, "options.\udc80"),
    "surrogate bytes": (None, None, "note"),  # ED A0 80 in the file: json reads them too
    "utf-16": (None, None, "note"),  # json reads UTF-16 too, its lone surrogates as well
}


@pytest.mark.parametrize("case", LONE_SURROGATES)
def test_a_lone_surrogate_is_refused_by_every_command(pack, tmp_path, case):
    """Half a UTF-16 pair (a \\ud800 escape, or its bytes, which json reads too) is no text:
    refused at the door naming the file and the field, never a UnicodeEncodeError later (the
    report writing a page, unpack naming a folder)."""
    folder, document = pack
    work = tmp_path / "pack"
    shutil.copytree(folder, work, symlinks=True)
    manifest = work / "faces.manifest.json"
    if case == "surrogate bytes":
        text = json.dumps({**document, "note": "SURROGATE"}, ensure_ascii=False).encode()
        manifest.write_bytes(text.replace(b"SURROGATE", b"a\xed\xa0\x80b"))
    elif case == "utf-16":
        text = json.dumps({**document, "note": "a\ud800b"}, ensure_ascii=False)
        manifest.write_bytes(text.encode("utf-16-le", "surrogatepass"))
    else:
        path, value, _ = LONE_SURROGATES[case]
        manifest.write_text(json.dumps(mutated(document, path, value)))
    with pytest.raises(core.InputError) as caught:
        rd.read_manifest(manifest)
    field = LONE_SURROGATES[case][2]
    assert str(caught.value) == (
        f"{manifest}: manifest field {field!r} must be text (it holds half of a UTF-16 "
        "surrogate pair)"
    )
    assert run_commands(work, folder.parent) == []
    for args in commands(work, folder.parent):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert f"{manifest}: " in result.output, args


def test_a_surrogate_pair_is_text(pack, tmp_path):
    _, document = pack
    manifest = tmp_path / "x.manifest.json"
    older = {k: v for k, v in document.items() if k != "index"}  # names in the manifest: v2
    named = {**older, "format_version": 2, "identities": {"0": "\U0001f600"}}
    manifest.write_text(json.dumps(named))
    assert b"\\ud83d\\ude00" in manifest.read_bytes()  # json.dumps writes the pair escaped
    assert rd.read_manifest(manifest)["identities"] == {"0": "\U0001f600"}


def test_identities_as_a_list_are_read_as_labels_before_format_3(pack, tmp_path):
    _, document = pack
    older = {k: v for k, v in document.items() if k != "index"}
    manifest = tmp_path / "x.manifest.json"
    manifest.write_text(json.dumps({**older, "format_version": 2, "identities": ["ann", "bob"]}))
    assert rd.read_manifest(manifest)["identities"] == {"0": "ann", "1": "bob"}


@pytest.mark.parametrize("identities", [["ann", "bob"], {"0": "ann"}, {"count": 2}, {"file": None}])
def test_format_3_identities_name_their_file(pack, tmp_path, identities):
    """Format 3 keeps the names in PREFIX.identities.json: the manifest's entry names it."""
    _, document = pack
    manifest = tmp_path / "x.manifest.json"
    manifest.write_text(json.dumps({**document, "identities": identities}))
    with pytest.raises(core.InputError) as caught:
        rd.read_manifest(manifest)
    assert str(caught.value).startswith(f"{manifest}: manifest field 'identities")


@pytest.mark.parametrize("version", [0, 1, 2])
def test_a_binary_index_needs_format_3(pack, tmp_path, version):
    _, document = pack
    manifest = tmp_path / "x.manifest.json"
    manifest.write_text(json.dumps({**document, "format_version": version}))
    with pytest.raises(core.InputError) as caught:
        rd.read_manifest(manifest)
    assert str(caught.value) == (
        f"{manifest}: manifest field 'format_version' must be 3 or more (the manifest has an "
        "'index')"
    )


def test_no_module_but_the_reader_parses_a_manifest():
    """Every json.load(s) outside reader.py reads something else (a state file, a report)."""
    import ast
    from pathlib import Path

    import rectool

    found = []
    for module in Path(rectool.__file__).parent.glob("**/*.py"):
        if module.name == "reader.py":
            continue
        lines = module.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("json.load", "json.loads"):
                # the call, and the line before it (where its file is opened)
                text = "\n".join(lines[node.lineno - 2 : node.end_lineno])
                if "manifest" in text.lower():
                    found.append((module.name, node.lineno, text))
    assert found == []


# -- files that would parse to gigabytes: refused from a count of their bytes, unparsed --------

# A list of empty objects: 3 bytes a value, ~36 bytes once parsed, over the limit of values.
BOMB = "[" + "{}," * (core.MAX_JSON_VALUES // 2) + "{}]"


def test_a_manifest_that_would_parse_to_gigabytes_is_refused_unparsed_by_every_command(
    pack, tmp_path
):
    """A 25 MB manifest of `{}` parsed to 0.6 GB (measured: 90 MB of them took 2.3 GB, and the
    1 GiB a manifest could be, ~27 GB): refused before `json.loads` by every command and the
    reader, holding little more than its bytes."""
    folder, document = pack
    work = tmp_path / "pack"
    shutil.copytree(folder, work, symlinks=True)
    manifest = work / "faces.manifest.json"
    text = json.dumps({**document, "extra": 0}).replace('"extra": 0', f'"extra": {BOMB}')
    manifest.write_text(text)
    why = f"{manifest}: not a rectool manifest: its {len(text):,} bytes may hold "
    tracemalloc.start()
    try:
        with pytest.raises(core.InputError) as caught:
            core.open_dataset(manifest)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value).startswith(why)
    assert str(caught.value).endswith(f"over the {core.MAX_JSON_VALUES:,} one may hold")
    assert peak < 2 * len(text)  # its bytes, not the objects they would make
    for args in commands(work, folder.parent):
        result = CliRunner().invoke(cli, args)
        assert why in result.output, (args, result.output[-500:])
        assert result.exit_code == 2, args  # an unusable input, whatever the command


def test_an_identities_file_that_would_parse_to_gigabytes_is_refused_unparsed(pack, tmp_path):
    folder, document = pack
    work = tmp_path / "pack"
    shutil.copytree(folder, work, symlinks=True)
    names = work / document["identities"]["file"]
    names.write_text(BOMB)
    why = f"{names}: not a rectool identities file: its {names.stat().st_size:,} bytes may hold"
    with pytest.raises(core.InputError, match=re.escape(why)):
        read_identities(str(work / "faces.manifest.json"), document)
    result = CliRunner().invoke(cli, ["unpack", str(work / "faces"), str(tmp_path / "out")])
    assert why in result.output and result.exit_code == 2, result.output


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=40,
)


def values_and_keys(doc):
    """Count what parsing `doc`'s text makes: each value, and each key of an object."""
    if isinstance(doc, list):
        return 1 + sum(values_and_keys(v) for v in doc)
    if isinstance(doc, dict):
        return 1 + sum(1 + values_and_keys(v) for v in doc.values())
    return 1


@settings(max_examples=300, deadline=None)
@given(JSON, st.sampled_from([{}, {"indent": 1}, {"separators": (",", ":")}]), st.booleans())
def test_the_count_of_json_values_is_never_below_what_parsing_makes(doc, layout, ascii_only):
    """The refusal above is sound: a file is never parsed into more values than counted."""
    data = json.dumps(doc, ensure_ascii=ascii_only, **layout).encode()
    made = values_and_keys(json.loads(data))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(core, "MAX_JSON_VALUES", made - 1)
        with pytest.raises(core.InputError):
            core.json_values(data, "x.json", "file")
        patch.setattr(core, "MAX_JSON_VALUES", made + 4 * len(data))  # a bound it never passes
        assert core.json_values(data, "x.json", "file") == data
