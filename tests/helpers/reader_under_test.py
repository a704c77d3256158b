"""The reader module that the dataset and torch tests exercise.

Normally `rectool.reader`. `rectool reader -o FILE` writes a standalone copy of it; with
RECTOOL_EMITTED_READER=FILE (as tests/test_emit.py sets, in a process where `import rectool`
fails) the same tests run against that file instead.
"""

from __future__ import annotations

import importlib
import os
import sys

EMITTED = os.environ.get("RECTOOL_EMITTED_READER")


def load_module(package_module, emitted):
    """Import and return `package_module` (`rectool.reader`), or the emitted copy of it at the
    path `emitted` when one is given."""
    if not emitted:
        return importlib.import_module(package_module)
    folder, name = os.path.split(os.path.abspath(emitted))
    # Importable by name, so that spawned DataLoader workers (which inherit sys.path) can
    # unpickle its datasets.
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.import_module(os.path.splitext(name)[0])
    if not os.path.samefile(module.__file__, emitted):
        raise ImportError(f"{name} resolves to {module.__file__}, not {emitted}")
    return module


rd = load_module("rectool.reader", EMITTED)
