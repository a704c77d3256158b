"""`rectool repack`: packs in, a pack out (identities chosen, dedupe, overlap, re-encoding)."""
