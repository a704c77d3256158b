"""The training module that tests/test_training.py exercises.

Normally `rectool.training`; with RECTOOL_EMITTED_TRAINING=FILE (as tests/test_emit.py sets, in
a process where `import rectool` fails) the same tests run against that emitted copy instead.
"""

from __future__ import annotations

import os

from helpers.reader_under_test import load_module

EMITTED = os.environ.get("RECTOOL_EMITTED_TRAINING")
tr = load_module("rectool.training", EMITTED)
