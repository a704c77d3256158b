"""Inspecting a pack: walking a .rec's framing, verify, reindex, info, unpack, DALI's index and
the read benchmark."""
