"""Record keys: which .idx line a repeated key keeps, and how far float32 holds keys exactly."""

from __future__ import annotations

import numpy as np

# float32 holds every integer up to 2**24 exactly, and no further: insightface labels (record
# 0's key range, each identity's [start, end)) are float32.
FLOAT32_EXACT = 2**24


def last_line_wins(keys, offsets):
    """Keep one .idx entry per key, its last line, as MXNet's reader does; keep file order."""
    _, last = np.unique(keys[::-1], return_index=True)
    keep = np.sort(len(keys) - 1 - last)
    return keys[keep], offsets[keep]
