"""The training module that tests/test_training.py exercises.

Normally `rectool.training`; with RECTOOL_EMITTED_TRAINING=FILE (as tests/test_emit.py sets, in
a process where `import rectool` fails) the same tests run against that emitted copy instead.
"""

from __future__ import annotations

import importlib
import os
import sys

EMITTED = os.environ.get("RECTOOL_EMITTED_TRAINING")


def load_training():
    """Import and return the training module under test."""
    if not EMITTED:
        from rectool import training

        return training
    folder, name = os.path.split(os.path.abspath(EMITTED))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.import_module(os.path.splitext(name)[0])
    if not os.path.samefile(module.__file__, EMITTED):
        raise ImportError(f"{name} resolves to {module.__file__}, not {EMITTED}")
    return module


tr = load_training()
