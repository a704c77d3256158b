"""Find byte-identical images stored under more than one identity."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .thumbs import Thumb, ThumbOf, identity_caption

if TYPE_CHECKING:
    from .images import ImageTable, Payloads

DUPLICATES_SHOWN = 20
MEMBERS_SHOWN = 6  # copies listed per duplicate group
PROGRESS_EVERY = 4096  # candidates hashed between two progress calls


@dataclass
class Duplicates:
    """Byte-identical images: groups spanning identities (the first kept) and counts."""

    # (digest, copies, [(label, where)], thumb of the first)
    groups: list[tuple[str, int, list[tuple[int | float, str]], Thumb]] = field(
        default_factory=list
    )
    across: int = 0  # groups whose copies carry more than one label
    across_images: int = 0
    within: int = 0  # groups inside one identity
    hashed: int = 0  # images hashed in full (fingerprint collisions)


def find_duplicates(
    images: ImageTable,
    payloads: Payloads,
    names: Mapping[str, str],
    thumb_of: ThumbOf,
    progress: Callable[[int, int], object] | None = None,
) -> Duplicates:
    """Find byte-identical images: equal fingerprints (`ImageTable.prints`, which fold in the
    size) first, then a full blake2b of each candidate. `progress(hashed, candidates)`, when
    given, is called as candidates are hashed."""
    result = Duplicates()
    n = len(images)
    if n < 2:
        return result
    # Equal fingerprints (size folded in) are candidates, hashed in full one run at a time:
    # a sort of one uint64 column, no pair of columns per image.
    order = np.argsort(images.prints, kind="stable")
    ranked = images.prints[order]
    same = ranked[1:] == ranked[:-1]
    del ranked
    same &= images.sizes[order[1:]] > 0
    edges = np.flatnonzero(np.diff(np.concatenate([[False], same, [False]]).astype(np.int8)))
    del same
    candidates = int((edges[1::2] + 1 - edges[::2]).sum())
    for start, stop in zip(edges[::2].tolist(), (edges[1::2] + 1).tolist()):
        run = order[start:stop]
        run = run[images.sizes[run] > 0]  # (an unreadable image has no fingerprint)
        digests: dict[str, list[int]] = {}
        for i in run.tolist():
            digest = hashlib.blake2b(payloads.image(i), digest_size=16).hexdigest()
            digests.setdefault(digest, []).append(i)
            result.hashed += 1
            if progress is not None and not result.hashed % PROGRESS_EVERY:
                progress(result.hashed, candidates)
        for digest, members in sorted(digests.items(), key=lambda item: min(item[1])):
            if len(members) < 2:
                continue
            members.sort()
            labels = {images.label(i) for i in members}
            if len(labels) < 2:
                result.within += 1
                continue
            result.across += 1
            result.across_images += len(members)
            if len(result.groups) < DUPLICATES_SHOWN:
                copies = [(images.label(i), images.where(i)) for i in members[:MEMBERS_SHOWN]]
                idents = ", ".join(
                    identity_caption(label, names.get(str(label))) for label in sorted(labels)[:8]
                )
                first = members[0]
                thumb = thumb_of(
                    first,
                    f"image stored {len(members)} times, under identities {idents}",
                    f"{len(members)} copies",
                )
                result.groups.append((digest, len(members), copies, thumb))
    return result
