"""The typed API: the modules below are type-checked by mypy (`make lint`, and here), and
every function in them keeps its annotations, so the checked scope cannot silently shrink.

The scope is `[tool.mypy] files` in pyproject.toml; `TYPED` is its floor. A module leaves it
only by editing this test, a module joins it by annotating it and adding it to both.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]

TYPED = {
    "rectool/__init__.py",
    "rectool/__main__.py",
    "rectool/demo.py",
    "rectool/text.py",
    "rectool/format/__init__.py",
    "rectool/choices.py",
    "rectool/emit.py",
    "rectool/errors.py",
    "rectool/reader.py",
    "rectool/recordio.py",
    "rectool/training.py",
    "rectool/doors/__init__.py",
    "rectool/doors/commit.py",
    "rectool/doors/failures.py",
    "rectool/doors/faults.py",
    "rectool/doors/files.py",
    "rectool/doors/folder.py",
    "rectool/doors/inputs.py",
    "rectool/doors/lock.py",
    "rectool/doors/output.py",
    "rectool/doors/targets.py",
    "rectool/format/checksums.py",
    "rectool/format/digest.py",
    "rectool/format/keys.py",
    "rectool/format/manifest.py",
    "rectool/format/records.py",
    "rectool/format/writer.py",
    "rectool/format/binindex.py",
    "rectool/format/textindex.py",
    "rectool/format/headers.py",
    "rectool/dataset/packs.py",
    "rectool/dataset/sources.py",
    "rectool/packer/__init__.py",
    "rectool/packer/distributed.py",
    "rectool/packer/finalize.py",
    "rectool/packer/images.py",
    "rectool/packer/indexing.py",
    "rectool/packer/layout.py",
    "rectool/packer/listcheck.py",
    "rectool/packer/listfile.py",
    "rectool/packer/listing.py",
    "rectool/packer/manifest.py",
    "rectool/packer/options.py",
    "rectool/packer/ordered.py",
    "rectool/packer/packing.py",
    "rectool/packer/packrun.py",
    "rectool/packer/passthrough.py",
    "rectool/packer/results.py",
    "rectool/packer/shardfile.py",
    "rectool/packer/shards.py",
    "rectool/packer/splits.py",
    "rectool/packer/walk.py",
    "rectool/packer/workers.py",
    "rectool/packer/writers.py",
    "rectool/commands/__init__.py",
    "rectool/commands/bench.py",
    "rectool/commands/conventions.py",
    "rectool/commands/dali_index.py",
    "rectool/commands/index.py",
    "rectool/commands/info.py",
    "rectool/commands/list.py",
    "rectool/commands/options.py",
    "rectool/commands/pack.py",
    "rectool/commands/pack_messages.py",
    "rectool/commands/paramtypes.py",
    "rectool/commands/progress.py",
    "rectool/commands/reader.py",
    "rectool/commands/reindex.py",
    "rectool/commands/repack.py",
    "rectool/commands/report.py",
    "rectool/commands/unpack.py",
    "rectool/commands/verify.py",
    "rectool/cli.py",
    "rectool/inspect/__init__.py",
    "rectool/inspect/bench.py",
    "rectool/inspect/dali.py",
    "rectool/inspect/info.py",
    "rectool/inspect/reindex.py",
    "rectool/inspect/scan.py",
    "rectool/inspect/unpack.py",
    "rectool/inspect/verify/__init__.py",
    "rectool/inspect/verify/binary.py",
    "rectool/inspect/verify/digests.py",
    "rectool/inspect/verify/facts.py",
    "rectool/inspect/verify/framing.py",
    "rectool/inspect/verify/headers.py",
    "rectool/inspect/verify/images.py",
    "rectool/inspect/verify/index.py",
    "rectool/inspect/verify/layout.py",
    "rectool/inspect/verify/manifest.py",
    "rectool/inspect/verify/report.py",
    "rectool/inspect/verify/run.py",
    "rectool/remote/__init__.py",
    "rectool/remote/cache.py",
    "rectool/remote/dataset.py",
    "rectool/remote/fetch.py",
    "rectool/remote/mirror.py",
    "rectool/remote/order.py",
    "rectool/remote/store.py",
    "rectool/remote/upload.py",
    "rectool/report/__init__.py",
    "rectool/report/charts.py",
    "rectool/report/data.py",
    "rectool/report/duplicates.py",
    "rectool/report/images.py",
    "rectool/report/page.py",
    "rectool/report/refusals.py",
    "rectool/report/thumbs.py",
    "rectool/repack/__init__.py",
    "rectool/repack/copier.py",
    "rectool/repack/evalsets.py",
    "rectool/repack/options.py",
    "rectool/repack/pipeline.py",
    "rectool/repack/plan.py",
    "rectool/repack/result.py",
    "rectool/repack/run.py",
    "rectool/repack/selection.py",
    "rectool/repack/sources.py",
}


def checked_files():
    """Return the modules `[tool.mypy] files` names (a folder: every module in it)."""
    found = set()
    for entry in CONFIG["files"]:
        path = REPO / entry
        paths = sorted(path.glob("**/*.py")) if path.is_dir() else [path]
        found.update(p.relative_to(REPO).as_posix() for p in paths)
    return found


def unannotated(source, name="<source>"):
    """Return `name:line: function` for each function of `source` missing an annotation: of
    its return, or of a parameter (but a method's `self` or `cls`). A method `__init__` with an
    annotated parameter may leave its return out: PEP 484 makes it `None` (mypy checks it so)."""
    missing = []

    def visit(node, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = child.args
                params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                static = any(
                    isinstance(d, ast.Name) and d.id == "staticmethod" for d in child.decorator_list
                )
                if in_class and not static and params:
                    params = params[1:]  # self, cls
                params += [a for a in (args.vararg, args.kwarg) if a is not None]
                returns = child.returns is not None or (in_class and child.name == "__init__")
                if not (returns and params) and child.returns is None:
                    returns = False  # `__init__(self)` alone: `-> None` says it is typed
                if not returns or any(p.annotation is None for p in params):
                    missing.append(f"{name}:{child.lineno}: {child.name}")
                visit(child, False)
            else:
                visit(child, isinstance(child, ast.ClassDef))

    visit(ast.parse(source), False)
    return missing


def test_the_typed_modules_are_all_checked():
    assert sorted(TYPED - checked_files()) == []


def test_the_checked_settings_stay_strict():
    for setting in ("disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs"):
        assert CONFIG.get(setting) is True, setting


def test_every_function_of_the_typed_modules_is_annotated():
    missing = []
    for name in sorted(checked_files()):
        missing += unannotated((REPO / name).read_text(encoding="utf-8"), name)
    assert missing == []


def test_the_annotation_check_finds_what_is_missing():
    source = (
        "def ok(a: int, *b: int, c: int = 0, **d: int) -> int: ...\n"
        "def no_return(a: int): ...\n"
        "def no_param(a) -> None: ...\n"
        "def no_kwargs(**options) -> None: ...\n"
        "class C:\n"
        "    def __init__(self, a: int): ...\n"
        "    def method(self, a: int) -> None:\n"
        "        def inner(b): ...\n"
        "    @staticmethod\n"
        "    def static(a) -> None: ...\n"
        "class D:\n"
        "    def __init__(self): ...\n"
        "    def __init__(self, a): ...\n"
    )
    assert unannotated(source) == [
        "<source>:2: no_return",
        "<source>:3: no_param",
        "<source>:4: no_kwargs",
        "<source>:8: inner",
        "<source>:10: static",
        "<source>:12: __init__",
        "<source>:13: __init__",
    ]


def test_mypy_passes_on_the_typed_modules():
    # mypy's own settings and scope from pyproject.toml; no cache written (about 6 s of CPU).
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", "/dev/null"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_package_exports_are_typed_for_a_checker():
    # rectool/__init__.py imports its exports on first use (`__getattr__`, typed Any): a checker
    # sees their own types only through the `if TYPE_CHECKING:` imports, as `X as X` (exported).
    source = (REPO / "rectool/__init__.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    exports = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXPORTS"
    )
    guarded = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
    )
    typed = {
        alias.name: node.module or ""
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname == alias.name
    }
    assert typed == exports
