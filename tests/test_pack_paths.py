"""A pack's file names: derived from its prefix in one place (`format/paths.PackPaths`), the
names on disk as they always were, and no other module spelling one (issue 35)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from rectool.format import paths as paths_module
from rectool.format.paths import PackPaths
from rectool.packer.options import PackOptions
from rectool.packer.packing import finalize_pack, pack_images

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "rectool"


def test_the_names_of_a_pack_of_one_shard():
    paths = PackPaths.of("out/faces")
    assert PackPaths.of(paths) is paths
    assert (paths.prefix, paths.folder, paths.stem) == ("out/faces", "out", "faces")
    assert (paths.rec, paths.idx) == ("out/faces.rec", "out/faces.idx")
    assert paths.shard_names(0, numbered=False) == ("out/faces.rec", "out/faces.idx")
    assert paths.checksums == "out/faces.rec.crc"
    assert paths.manifest == "out/faces.manifest.json"
    assert paths.arrays == {
        "offsets": "out/faces.offsets.npy",
        "keys": "out/faces.keys.npy",
        "labels": "out/faces.labels.npy",
        "identity_ranges": "out/faces.identity_ranges.npy",
    }
    assert paths.identities == "out/faces.identities.json"
    assert paths.failures == "out/faces.failures.jsonl"
    assert paths.state == "out/faces.pack-state.json"
    assert paths.journal == "out/faces.commit-journal.json"
    assert paths.lock == "out/faces.lock"
    assert paths.stdin_copy == "out/faces.stdin.lst"
    assert paths.label_map == "out/faces.labels.tsv"
    assert paths.relabel == "out/faces.relabel.tsv"
    assert paths.report == "out/faces.report.json"
    assert PackPaths.partial(paths.rec) == "out/faces.rec.partial"
    assert paths.staging == "out/.faces.overwrite"
    assert paths.staged.prefix == "out/.faces.overwrite/faces"
    assert paths.staged.manifest == "out/.faces.overwrite/faces.manifest.json"
    assert os.fspath(paths) == str(paths) == "out/faces"


def test_the_names_of_numbered_shards():
    paths = PackPaths("out/faces")
    assert paths.shard_names(0, numbered=True) == ("out/faces-00000.rec", "out/faces-00000.idx")
    assert paths.shard_names(12, numbered=True) == ("out/faces-00012.rec", "out/faces-00012.idx")
    shard = paths.shard(3)
    assert shard.prefix == "out/faces-00003"
    assert shard.checksums == "out/faces-00003.rec.crc"
    assert shard.failures == "out/faces-00003.failures.jsonl"
    assert shard.state == "out/faces-00003.pack-state.json"
    assert shard.plan == "out/faces-00003.plan.json"
    assert shard.numbered_pack() == paths
    assert PackPaths("out/faces").numbered_pack() is None
    assert PackPaths("out/a-1").numbered_pack() is None
    assert PackPaths.shard_number("out/faces-00042.rec") == 42
    assert PackPaths.shard_number("out/faces.rec") is None


def test_a_pack_is_found_from_its_manifest_or_a_shard():
    assert PackPaths.of_manifest("out/faces.manifest.json") == PackPaths("out/faces")
    assert PackPaths.is_manifest("faces.manifest.json")
    assert not PackPaths.is_manifest("faces.json")
    with pytest.raises(ValueError):
        PackPaths.of_manifest("out/faces.json")
    assert PackPaths.of_rec("out/faces-00001.rec") == PackPaths("out/faces-00001")
    assert PackPaths.idx_beside("out/train.rec") == "out/train.idx"
    assert [PackPaths.is_shard_tail(t) for t in (".rec", "-00003.idx", ".rec.crc", "2.rec")] == [
        True,
        True,
        False,
        False,
    ]
    faces = PackPaths("out/faces")
    assert [faces.owns(n) for n in ("faces.rec", "faces-3.idx", "faces2.rec", "faces")] == [
        True,
        True,
        False,
        False,
    ]


def files_of(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.fixture
def named_tree(small_tree):
    """small_tree with its label map beside the list (faces.labels.tsv): a pack of it has an
    identities file."""
    names = "".join(f"{k}\t{name}\n" for k, name in enumerate(["alice", "bob", "carol"]))
    (small_tree.list_path.parent / "faces.labels.tsv").write_text(names, encoding="utf-8")
    return small_tree


def test_a_pack_of_two_shards_has_exactly_these_files(named_tree, tmp_path):
    out = tmp_path / "out"
    pack_images(named_tree.list_path, named_tree.root, out / "faces", PackOptions(shard_records=7))
    assert files_of(out) == [
        "faces-00000.idx",
        "faces-00000.rec",
        "faces-00000.rec.crc",
        "faces-00001.idx",
        "faces-00001.rec",
        "faces-00001.rec.crc",
        "faces.failures.jsonl",
        "faces.identities.json",
        "faces.keys.npy",
        "faces.labels.npy",
        "faces.manifest.json",
        "faces.offsets.npy",
    ]


def test_shards_packed_one_by_one_have_their_own_files_until_finalized(named_tree, tmp_path):
    out, options = tmp_path / "out", PackOptions(shard_records=7)
    for k in (0, 1):
        pack_images(named_tree.list_path, named_tree.root, out / "faces", options, only_shard=k)
    assert files_of(out) == [
        "faces-00000.failures.jsonl",
        "faces-00000.idx",
        "faces-00000.plan.json",
        "faces-00000.rec",
        "faces-00000.rec.crc",
        "faces-00001.failures.jsonl",
        "faces-00001.idx",
        "faces-00001.plan.json",
        "faces-00001.rec",
        "faces-00001.rec.crc",
    ]
    finalize_pack(named_tree.list_path, named_tree.root, out / "faces", options)
    assert files_of(out) == [
        "faces-00000.idx",
        "faces-00000.rec",
        "faces-00000.rec.crc",
        "faces-00001.idx",
        "faces-00001.rec",
        "faces-00001.rec.crc",
        "faces.failures.jsonl",
        "faces.identities.json",
        "faces.keys.npy",
        "faces.labels.npy",
        "faces.manifest.json",
        "faces.offsets.npy",
    ]


# --- no module but the naming module spells a pack's file name --------------------------------

# The modules allowed to: the naming module, and the emitted reader (it must stand alone; the
# naming module imports its constants).
NAMING_MODULES = {"format/paths.py", "reader.py"}
# How a pack's files' names end, after the prefix.
PACK_SUFFIXES = (
    ".manifest.json",
    ".failures.jsonl",
    ".pack-state.json",
    ".commit-journal.json",
    ".plan.json",
    ".identities.json",
    ".offsets.npy",
    ".keys.npy",
    ".labels.npy",
    ".identity_ranges.npy",
    ".rec.crc",
    ".stdin.lst",
    ".relabel.tsv",
    ".report.json",
    ".labels.tsv",
)


def _docstrings(tree):
    """Return the ids of the docstring nodes of a module and its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled_names(source, where):
    """Return `where:line: text` for each place in `source` that spells a pack file's name: a
    string that begins or ends with one of `PACK_SUFFIXES` (prose that names one in passing,
    a docstring or a help text, is not a name), or a shard number formatted to five digits
    (`f"{prefix}-{k:05d}"`, `"%05d"`, `"{:05d}"`, a glob of five `[0-9]`)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        # (A format spec, `{k:05d}`, is a string constant "05d" of its own.)
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        text = node.value
        if id(node) in docstrings:
            continue
        if (
            text.startswith(PACK_SUFFIXES)  # prefix + ".manifest.json", f"{prefix}.lock ..."
            or text.endswith(PACK_SUFFIXES)  # "faces.manifest.json"
            or text == "05d"
            or "%05d" in text
            or ":05d}" in text
            or "[0-9]" * 5 in text
        ):
            found.append(f"{where}:{node.lineno}: {text!r}")
    return sorted(found)


# The naming module's suffix constants (`STATE_SUFFIX`, ...): read them, never append one.
SUFFIX_NAMES = {name for name in paths_module.__all__ if name.endswith("_SUFFIX")}


# Constants of the same names that are not the naming module's: the shard cache's own locks
# on its copies (remote/cache.LOCK_SUFFIX), not a pack's lock.
OWN_CONSTANTS = {"remote/cache.py": {"LOCK_SUFFIX"}, "remote/mirror.py": {"LOCK_SUFFIX"}}
# A ratchet (remove an entry when it is fixed): the report's output journal, to be named by
# `PackPaths.journal_beside` as the list's is.
NOT_YET = {"report/data.py"}


def appended_suffixes(source, where):
    """Return `where:line: code` for each name built in `source` by appending one of the
    naming module's suffix constants (`prefix + STATE_SUFFIX`, `f"{prefix}{MANIFEST_SUFFIX}"`);
    testing a name with one (`name.endswith(LOCK_SUFFIX)`) is reading it, not building one."""
    found = []

    def is_suffix(node):
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        return name in SUFFIX_NAMES - OWN_CONSTANTS.get(where, set())

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            built = is_suffix(node.right)
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            # A suffix right after another value: `f"{prefix}{STATE_SUFFIX}"`.
            built = any(
                isinstance(b, ast.FormattedValue) and is_suffix(b.value)
                and isinstance(a, ast.FormattedValue)
                for a, b in zip(parts, parts[1:])
            )  # fmt: skip
        else:
            continue
        if built:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def package_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name not in NAMING_MODULES:
            yield name, path.read_text(encoding="utf-8")


def test_no_module_but_the_naming_module_spells_a_pack_file_name():
    offenders = []
    for name, source in package_modules():
        offenders += spelled_names(source, name)
    assert offenders == []


def test_no_module_but_the_naming_module_appends_a_suffix():
    offenders = []
    for name, source in package_modules():
        if name not in NOT_YET:
            offenders += appended_suffixes(source, name)
    assert offenders == []


def test_the_suffix_check_finds_each_old_derivation():
    # What packing.py, finalize.py and dataset/sources.py held before PackPaths.
    source = (
        "def f(prefix, stem, source, name):\n"
        "    a = prefix + STATE_SUFFIX\n"
        "    b = stem + FAILURES_SUFFIX + PARTIAL_SUFFIX\n"
        '    c = f"no {source}{MANIFEST_SUFFIX} here"\n'
        "    d = name.endswith(LOCK_SUFFIX) or name[: -len(MANIFEST_SUFFIX)]\n"
        "    e = prefix + paths.STATE_SUFFIX\n"
    )
    found = appended_suffixes(source, "m.py")
    assert sorted({int(line.split(":")[1]) for line in found}) == [2, 3, 4, 6]


def test_the_spelling_check_finds_each_old_derivation():
    # What packer/manifest.py, format/manifest.py and doors/targets.py held before PackPaths.
    source = (
        '"""A module naming PREFIX.manifest.json in its docstring: allowed."""\n'
        "def f(prefix, k, number):\n"
        '    a = prefix + ".manifest.json"\n'
        '    b = f"{prefix}-{k:05d}.pack-state.json"\n'
        '    d = glob.glob(escaped + "-[0-9][0-9][0-9][0-9][0-9].rec")\n'
        '    e = "%s-%05d.rec" % (prefix, k)\n'
        '    g = os.path.join(folder, name + ".rec")  # a .rec named by its caller\n'
        '    help = "Write the label map here. Default: PREFIX.labels.tsv beside OUT"\n'
        '    h = "{}-{:05d}".format(prefix, k)\n'
    )
    found = spelled_names(source, "m.py")
    assert sorted({int(line.split(":")[1]) for line in found}) == [3, 4, 5, 6, 9]
