"""The layouts a pack is written in: which key each image gets, and what follows the images.

- `images` (the default): one record per image, keyed by its list index (a repack: its plan
  position), nothing else; it may be cut into shards.
- `insightface`, what insightface's and arcface's `MXFaceDataset` read: one `.rec`; images keyed
  1..N in the order written, each identity's images together; then one record per identity
  (key N+1+label, labels [start, end) of its image keys) and record 0, the header (labels
  [N+1, N+1+classes)); and a `property` file `classes,height,width` beside the `.rec`. Those
  labels are float32, so every key must stay below `keys.FLOAT32_EXACT`. An image's label is
  its identity (a scalar, as faces_emore and ms1m hold it) or, with `--pack-label`, the list's
  label vector, identity first (as Glint360K and WebFace42M hold it: insightface's tools read
  `label[0]`); the identity records and record 0 are the same for both.

This module is the writing side of the rule; `format.headers.insightface_header` is the
reading side. `pack` and `repack` ask a `Layout` rather than comparing layout names;
`image_label` gives an image's label in either shape.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from .. import choices
from ..doors.output import write_atomic
from ..errors import RectoolError, UsageError
from ..format.headers import unpack_header
from ..format.keys import FLOAT32_EXACT
from ..format.writer import frame_record, pack_image_record
from ..reader import (
    RecordFormatError,
    admit_image,
)
from .listfile import ListFormatError

if TYPE_CHECKING:
    from _typeshed import StrPath

    from .listfile import ListItem


class ShardLimits(Protocol):
    """What `Layout.check_options` reads of pack's and repack's options."""

    @property
    def shard_bytes(self) -> int | None: ...

    @property
    def shard_records(self) -> int | None: ...


# The flag of identity and header records: their two float32 labels.
IDENTITY_FLAG = 2
# `property`'s height and width when no image was written to read them from.
DEFAULT_SIZE = (112, 112)


class Layout:
    """One layout's writing rules; `IMAGES` and `INSIGHTFACE` are the two."""

    def __init__(self, name: str, numbered: bool) -> None:
        self.name = name
        # Images are keyed 1..N as written (else by list index) and followed by identity
        # records, a header and a `property` file.
        self.numbered = numbered
        # What `ShardWriter.resume` cuts from a partial file's end: the records that follow
        # the images, written again after the images that remain (None: nothing).
        self.written_after_images: Callable[[bytes], bool] | None = (
            _is_identity_record if numbered else None
        )

    def __repr__(self) -> str:
        return f"<layout {self.name}>"

    def first_key(self, images_written: int) -> int | None:
        """Return the key of the next image written, or None when keys are list indices."""
        return images_written + 1 if self.numbered else None

    def check_options(self, options: ShardLimits) -> None:
        """Refuse shard limits in a layout that cannot hold them (insightface: one file)."""
        if not self.numbered:
            return
        if options.shard_bytes or options.shard_records:
            raise UsageError(
                "--layout insightface writes one .rec (its readers expect one file); "
                "drop --shard-size/--shard-records"
            )

    def check_item(self, item: ListItem, path: StrPath) -> None:
        """Raise `ListFormatError` for a list item this layout cannot key (insightface: its
        first label, the identity, a non-negative integer; the others are written only with
        --pack-label, as in the images layout)."""
        label = item.labels[0]
        if self.numbered and (not label.is_integer() or label < 0):
            raise ListFormatError(
                f"--layout insightface needs one non-negative integer label, the identity, "
                f"as the first label, got {list(item.labels)}",
                path,
                item.line,
            )

    def order(self, items: Iterable[ListItem]) -> Iterable[ListItem]:
        """Return list items in the order they are written: each identity's together (a
        stable sort by label) when images are numbered."""
        return sorted(items, key=lambda item: item.labels[0]) if self.numbered else items

    def check_keys(self, images: int, classes: int, remedy: str = "Use --layout images") -> None:
        """Raise when `images` images and `classes` identities need keys float32 cannot hold."""
        if not self.numbered:
            return
        last_key = images + classes + 1
        if last_key >= FLOAT32_EXACT:
            raise RectoolError(
                f"--layout insightface stores record keys as float32 labels, exact only up to "
                f"{FLOAT32_EXACT}; {images} images + {classes} identities need {last_key}. "
                f"{remedy}, which has no such limit"
            )

    def records_after(
        self, images: int, counts: list[int] | Mapping[int, int]
    ) -> Iterator[tuple[int, bytes]]:
        """Yield the (key, framed record) pairs that follow `images` images, whose identity
        `label` has `counts[label]` of them (a list, or a mapping that may lack a label).

        One at a time: a list labelled up to 10**7 needs as many identity records, and a list
        of them held 2 GB (`tests/adversarial/test_identities.py`). The key check runs before
        the first is yielded, so a refused layout writes none."""
        if not self.numbered:
            return
        classes = len(counts) if isinstance(counts, list) else max(counts, default=-1) + 1
        self.check_keys(images, classes, "Use the default layout (images only)")
        start = 1
        for label in range(classes):
            end = start + int(counts[label] if isinstance(counts, list) else counts.get(label, 0))
            key = images + 1 + label
            yield key, _labels_record([start, end], key, 0)
            start = end
        yield 0, _labels_record([images + 1, images + 1 + classes], 0, 1)

    def write_property(
        self, folder: StrPath | None, classes: int, size: tuple[int, int] | None
    ) -> None:
        """Write `property` (`classes,height,width`) into `folder`; `size` (height, width) or
        None for DEFAULT_SIZE."""
        if not self.numbered:
            return
        height, width = size or DEFAULT_SIZE
        write_atomic(os.path.join(folder or ".", "property"), f"{classes},{height},{width}\n")


def image_label(
    identity: float, vector: Sequence[float] | None, pack_label: bool
) -> float | list[float]:
    """Return the label an image record holds: its `identity` alone, or with `pack_label` a
    label vector: `vector` (a source's labels) with `identity` first, `[identity]` when None.

    What converts between the label shapes: a scalar record's label becomes `[identity]`, a
    vector's keeps its other labels (`pack_label=False` drops them).
    """
    if not pack_label:
        return float(identity)
    rest = [] if vector is None else [float(x) for x in vector[1:]]
    return [float(identity), *rest]


def _is_identity_record(record: bytes) -> bool:
    """Return True for an identity or header record (written by `records_after`): flag 2 and
    no image bytes (an image with a label vector of two has flag 2 too)."""
    head, body = unpack_header(record)
    return head.flag == IDENTITY_FLAG and not body


def _labels_record(labels: Sequence[float], key: int, id2: int) -> bytes:
    return frame_record(pack_image_record(b"", [float(label) for label in labels], key, id2))


IMAGES = Layout("images", numbered=False)
INSIGHTFACE = Layout("insightface", numbered=True)
LAYOUTS = choices.LAYOUTS
assert LAYOUTS == (IMAGES.name, INSIGHTFACE.name)  # the layouts below are the choices
_BY_NAME = {layout.name: layout for layout in (IMAGES, INSIGHTFACE)}


def layout_named(name: str) -> Layout:
    """Return the `Layout` called `name`; raise `UsageError` naming the choices."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UsageError(f"unknown layout {name!r}; choose from {', '.join(LAYOUTS)}") from None


def image_size(data: bytes) -> tuple[int, int] | None:
    """Return the (height, width) of an encoded image from its header (as decoded unchanged,
    EXIF orientation ignored), or None when the decode guard refuses it."""
    try:
        _, height, width = admit_image(data, float("inf"))
    except RecordFormatError:
        return None
    return height, width
