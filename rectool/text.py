"""Words for counts in what rectool says: `counted(1, "image")` is "1 image", never "1 images".

Every human summary builds its counts here, so that plurals and thousands separators are the
same in every command and on the report page.
"""

from __future__ import annotations


def plural(noun: str) -> str:
    """Return the plural of the nouns rectool counts (the last word of `noun` takes it):
    image -> images, identity -> identities, class -> classes, damaged byte range -> ranges."""
    if noun.endswith("y") and noun[-2:-1] not in ("a", "e", "o", "u"):
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def counted(n: int, noun: str, many: str | None = None) -> str:
    """Return `n` with thousands separators and `noun` in the number it agrees with."""
    word = noun if n == 1 else (many or plural(noun))
    return f"{n:,} {word}"
