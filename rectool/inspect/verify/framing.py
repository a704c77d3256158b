"""The framing check: every byte of a .rec is a record."""

from __future__ import annotations

from collections.abc import Iterator

from ...reader import MAGIC_BYTES
from .facts import ShardFacts
from .report import Found, one_problem


def check_framing(facts: ShardFacts) -> Iterator[Found]:
    """Every byte of the .rec is a record: magic, lengths, continuation flags, zero padding."""
    rec, size, framing = facts.rec, facts.size, facts.framing
    damage = framing.damage
    for d in damage:
        key = facts.key_at(d.start)
        last = d is damage[-1] and d.end == size
        indexed_after = (
            facts.index is not None and bool((facts.index.offsets >= d.start).any()) and key is None
        )
        short_tail = d.part + 8 > size and d.part == d.start
        tail = bytes(facts.buf[d.start : min(size, d.start + 4)])
        looks_like_start = short_tail and MAGIC_BYTES.startswith(tail)
        if (
            last
            and key is None
            and not indexed_after
            and (d.kind in ("bad-magic", "bad-cflag") or (short_tail and not looks_like_start))
        ):
            yield one_problem(
                "trailing-garbage",
                rec,
                None,
                d.start,
                f"{size - d.start} bytes after the last record are not a record",
            )
            continue
        skipped = f"bytes {d.start}..{d.end} ({d.end - d.start} bytes) are unreadable"
        where = f" (part at byte {d.part})" if d.part != d.start else ""
        yield one_problem(d.kind, rec, key, d.start, f"{d.reason}{where}; {skipped}")
    for start, part in framing.bad_padding:
        where = "" if part == start else f" of the part at byte {part}"
        yield one_problem(
            "bad-padding", rec, facts.key_at(start), start, f"the padding{where} is not zero bytes"
        )
