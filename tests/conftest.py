from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import settings

# Test helpers are imported as the package `helpers` (tests/helpers/).
sys.path.insert(0, str(Path(__file__).parent))

# Property tests draw the same examples on every run, so a CI run never fails on an example
# no earlier run drew; explore new ones by hand with HYPOTHESIS_PROFILE=explore. No deadline:
# a loaded machine must not fail a test.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
