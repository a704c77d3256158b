"""Sample the contact sheet's identities and make their thumbnails within the page's budget."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from ..errors import RecordFormatError
from ..inspect.info import label_counts
from ..reader import (
    ImageTooLargeError,
    decode_image,
)
from .page import LEFT_OUT

if TYPE_CHECKING:
    from .data import ReportOptions
    from .images import ImageTable

EXTREMES = 2  # smallest and largest identities shown beside the sample
# Room kept for the page's text (tables are bounded by the *_SHOWN limits) when thumbnails
# are fitted into --max-bytes.
TEXT_RESERVE = 400_000


@dataclass
class Thumb:
    """One thumbnail: the JPEG (None when the image did not decode) and what it shows."""

    alt: str
    caption: str
    jpeg: bytes | None = None
    pixels: np.ndarray | None = None
    problem: str | None = None


@dataclass
class SheetRow:
    """A row of the contact sheet: one identity and thumbnails of its images."""

    group: str  # "sample", "smallest" or "largest"
    label: int | None  # None: labels are not class ids (one row sampled from every image)
    name: str | None
    count: int
    thumbs: list[Thumb]


# thumb_of(image number, alt text, caption): the image's thumbnail, admitted to the page or not.
ThumbOf = Callable[[int, str, str], Thumb]


class ThumbBudget:
    """Admit thumbnails into the page while their base64 text fits within the page budget."""

    def __init__(self, max_bytes: int) -> None:
        self.room = max(0, max_bytes - TEXT_RESERVE)
        self.left_out = 0

    def admit(self, thumb: Thumb) -> Thumb:
        if thumb.jpeg is None:
            return thumb
        cost = (len(thumb.jpeg) + 2) // 3 * 4 + 200  # base64 plus the <img> tag around it
        if cost <= self.room:
            self.room -= cost
        else:
            thumb.jpeg = None
            thumb.problem = LEFT_OUT
            self.left_out += 1
        return thumb


_REDUCED = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}


def reduction(info: Mapping[str, Any], thumb: int) -> int:
    """Pick the JPEG decoder's scale (1/2/4/8) from the most common sampled size."""
    for key in info["dimensions"]["counts"]:
        try:
            height, width = (int(v) for v in key.split("x")[:2])
        except ValueError:
            continue
        for factor in (8, 4, 2):
            if min(height, width) // factor >= thumb:
                return factor
        return 1
    return 1


def thumbnail(data: bytes, options: ReportOptions, reduce: int, alt: str, caption: str) -> Thumb:
    """Decode `data` at reduced scale (through the decode guard), fit it in a square of
    `options.thumb` pixels, encode it as a small JPEG."""
    size = options.thumb
    try:
        array: np.ndarray = decode_image(data, _REDUCED[reduce], options.max_pixels)
    except ImageTooLargeError:
        return Thumb(alt, caption, problem="not decoded: more pixels than --max-pixels")
    except RecordFormatError:
        return Thumb(alt, caption, problem="does not decode")
    height, width = array.shape[:2]
    if reduce > 1 and max(height, width) < size:
        # The scale was chosen for the most common size; this image is smaller than that, and
        # reduced it would be drawn below the thumbnail size: decode it whole instead.
        return thumbnail(data, options, 1, alt, caption)
    scale = size / max(height, width)
    if scale < 1:
        shape = (max(1, round(width * scale)), max(1, round(height * scale)))
        array = cv2.resize(array, shape, interpolation=cv2.INTER_AREA)
    ok, encoded = cv2.imencode(".jpg", array, [cv2.IMWRITE_JPEG_QUALITY, 80])
    if not ok:
        return Thumb(alt, caption, problem="cannot encode a thumbnail")
    return Thumb(alt, caption, encoded.tobytes(), array)


def sheet_rows(
    images: ImageTable,
    names: Mapping[str, str],
    options: ReportOptions,
    thumb_of: ThumbOf,
    progress: Callable[[int, int], object] | None = None,
) -> list[SheetRow]:
    """Choose the sampled identities (seeded) and the smallest and largest; decode their thumbs."""
    if not len(images):
        return []
    rng = np.random.default_rng(options.seed)
    if not images.integral:
        # Labels are not class ids: one row of images sampled from the whole dataset.
        count = min(options.per_identity * max(1, options.identities), len(images))
        picks = np.sort(rng.choice(len(images), count, replace=False))
        thumbs = []
        for done, i in enumerate(picks.tolist(), 1):
            thumbs.append(thumb_of(int(i), f"image at {images.where(i)}", images.where(i)))
            if progress is not None:
                progress(done, len(picks))
        return [SheetRow("sample", None, None, len(images), thumbs)]
    values, counts = label_counts(images.labels)
    chosen = np.sort(rng.choice(len(values), min(options.identities, len(values)), replace=False))
    by_size = np.lexsort((values, counts))  # fewest images first, ties by label
    groups = [("sample", chosen.tolist())]
    extremes = min(EXTREMES, len(values))
    groups.append(("smallest", by_size[:extremes].tolist()))
    groups.append(("largest", np.lexsort((values, -counts))[:extremes].tolist()))
    plan = []
    for group, picked in groups:
        for k in picked:
            # One pass over the labels per identity shown (a few dozen): no sort of them all.
            members = np.flatnonzero(images.labels == values[k])
            if len(members) > options.per_identity:
                members = np.sort(rng.choice(members, options.per_identity, replace=False))
            plan.append((group, k, members))
    total, done, rows = sum(len(m) for *_, m in plan), 0, []
    for group, k, members in plan:
        label = int(values[k])
        name = names.get(str(label))
        who = f"identity {label}" + (f" ({name})" if name else "")
        thumbs = []
        for i in members.tolist():
            thumbs.append(
                thumb_of(i, f"{who}, image at {images.where(i)}", identity_caption(label, name))
            )
            done += 1
            if progress is not None:
                progress(done, total)
        rows.append(SheetRow(group, label, name, int(counts[k]), thumbs))
    return rows


def identity_caption(label: int | float, name: str | None) -> str:
    return f"{label} {name}" if name else f"{label}"
