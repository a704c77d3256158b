"""Words for counts in what rectool says: `counted(1, "image")` is "1 image", never "1 images".

Every human summary builds its counts here, so that plurals and thousands separators are the
same in every command and on the report page.
"""

from __future__ import annotations

_IRREGULAR = {"identity": "identities", "class": "classes", "process": "processes"}


def plural(noun: str) -> str:
    """Return the plural of one of the nouns rectool counts."""
    return _IRREGULAR.get(noun, noun + "s")


def counted(n: int, noun: str, many: str | None = None) -> str:
    """Return `n` with thousands separators and `noun` in the number it agrees with."""
    word = noun if n == 1 else (many or plural(noun))
    return f"{n:,} {word}"
