"""One door in: no module of rectool opens a file for reading but through `open_regular`.

`reader.open_regular` (and `read_regular`/`open_input` on top of it) refuses FIFOs, devices and
folders, bounds sizes, refuses links where none is expected and keeps paths inside a folder.
This test reads rectool's source and fails when a read bypasses it: builtin `open` for
reading, `os.open` without a write flag, `np.fromfile`, `mmap.mmap` of a file not opened by
it, `Path.read_bytes`/`read_text`. What must stay is listed below, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rectool"

# (module, function) -> why that read may bypass the opener.
ALLOWED = {
    ("reader.py", "open_regular"): "the opener itself",
    ("files.py", "current_umask"): "/proc/self/status of this process, not user input",
    ("files.py", "fsync_folder"): "a folder opened to fsync it after a rename",
    ("lock.py", "_join"): "the output lock file, read for its holder's token",
    ("commit.py", "read_journal"): "the commit journal: O_NOFOLLOW, regular, bounded",
    ("folder.py", "__init__"): "OutputFolder's root folder descriptor (O_DIRECTORY)",
    ("folder.py", "_folder"): "OutputFolder's folders, opened O_NOFOLLOW | O_DIRECTORY",
    ("folder.py", "_same_file"): "unpack --resume compares a file it would write (O_NOFOLLOW)",
    ("reader.py", "open"): "RecordFile maps the regular file `open_regular` opened",
    ("reader.py", "load_array"): "an index .npy mapped from the descriptor `open_regular` "
    "opened, after its header was parsed and its size checked",
    ("passthrough.py", "open"): "RootGuard.open, pack's image opener (one call per image, "
    "read with readv into the block): O_NOFOLLOW and the real path inside ROOT, checked by "
    "the caller with fstat for a regular file and the record size limit",
    ("emit.py", "reader_source"): "rectool's own module source, shipped with the package",
    ("emit.py", "_parse"): "rectool's own module sources, whose definitions the emitted "
    "recordio module is assembled from",
    ("demo.py", "make_tree"): "a file the demo itself just wrote",
    ("packrun.py", "_in_python"): "/proc/thread-self/schedstat of this thread, not user input",
    ("batches.py", "_memory"): "a memfd (memory, not a file) mapped as a repack's batch buffer",
}

_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC", "O_EXCL"}


def _mode(call):
    if len(call.args) > 1:
        return call.args[1]
    return next((kw.value for kw in call.keywords if kw.arg == "mode"), None)


def _reads(call):
    """Return a description when `call` opens a file for reading outside the opener."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "open":
        mode = _mode(call)
        if mode is None:
            return "open() for reading"
        modes = [mode.body, mode.orelse] if isinstance(mode, ast.IfExp) else [mode]
        if not all(isinstance(m, ast.Constant) and isinstance(m.value, str) for m in modes):
            return "open() with a computed mode"
        reading = [m.value for m in modes if not set(m.value) & set("wax+")]
        return f"open(mode={reading[0]!r})" if reading else None
    if not isinstance(func, ast.Attribute):
        return None
    owner = func.value.id if isinstance(func.value, ast.Name) else None
    if func.attr == "open" and owner == "os":
        names = {n.attr for n in ast.walk(call) if isinstance(n, ast.Attribute)}
        names |= {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}
        return None if names & _WRITE_FLAGS else "os.open() for reading"
    if func.attr == "fromfile" and owner in ("np", "numpy"):
        return "np.fromfile()"
    if func.attr == "mmap" and owner == "mmap":
        return "mmap.mmap()"
    if func.attr in ("read_bytes", "read_text"):
        return f".{func.attr}()"
    return None


def direct_reads(source, module):
    """Yield (function, line, what) for every read in `source` that bypasses the opener."""
    tree = ast.parse(source)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    for node in sorted(calls, key=lambda call: (call.lineno, call.col_offset)):
        if what := _reads(node):
            yield _function_of(tree, node), node.lineno, what


def _function_of(tree, target):
    """Return the name of the innermost function holding `target` ('' at module level)."""
    best = ""

    def visit(node, name):
        nonlocal best
        if node is target:
            best = name
            return True
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            )
            if visit(child, inner):
                return True
        return False

    visit(tree, "")
    return best


def mmap_of_opener(source, lineno):
    """Return whether the mmap at `lineno` maps an fd from the opener (open_regular or
    open_input on one of the few lines before it)."""
    lines = source.splitlines()[max(0, lineno - 8) : lineno]
    return any("open_regular(" in line or "open_input(" in line for line in lines)


def test_no_module_reads_a_file_but_through_the_opener():
    bypasses = []
    for path in sorted(PACKAGE.glob("**/*.py")):
        source = path.read_text(encoding="utf-8")
        for function, line, what in direct_reads(source, path.name):
            if (path.name, function) in ALLOWED or (path.name, "*") in ALLOWED:
                continue
            if what == "mmap.mmap()" and mmap_of_opener(source, line):
                continue
            bypasses.append(f"rectool/{path.name}:{line} in {function or '<module>'}: {what}")
    assert bypasses == [], "read these through reader.open_regular / open_input:\n" + "\n".join(
        bypasses
    )


def test_the_check_finds_each_kind_of_direct_read():
    source = (
        "import os, mmap\nimport numpy as np\n"
        "def a(p):\n    return open(p).read()\n"
        "def b(p):\n    return open(p, 'rb')\n"
        "def c(p):\n    return os.open(p, os.O_RDONLY)\n"
        "def d(p):\n    return np.fromfile(p)\n"
        "def e(p):\n    return p.read_text()\n"
        "def f(p):\n    return open(p, 'w'), os.open(p, os.O_WRONLY | os.O_CREAT)\n"
    )
    found = [(function, what) for function, _, what in direct_reads(source, "x.py")]
    assert found == [
        ("a", "open() for reading"),
        ("b", "open(mode='rb')"),
        ("c", "os.open() for reading"),
        ("d", "np.fromfile()"),
        ("e", ".read_text()"),
    ]


def test_every_allowed_entry_is_still_needed():
    needed = set()
    for path in sorted(PACKAGE.glob("**/*.py")):
        for function, _, _ in direct_reads(path.read_text(encoding="utf-8"), path.name):
            needed.add((path.name, function))
            needed.add((path.name, "*"))
    assert set(ALLOWED) - needed == set()
