from __future__ import annotations

import sys
from pathlib import Path

# Test helpers (oracle.py, trees.py) are imported as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))
