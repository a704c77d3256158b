"""The image checks: each image's structure as `pack` checks it, or (`--decode`) its decoding,
size and channels."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import numpy as np

from ...format.headers import unpack_header
from ...packer.images import (
    DEFAULT_MAX_PIXELS,
    ImageRefused,
    ImageTooLarge,
    check_container,
    inspect_image,
)
from ...packer.passthrough import refused_images
from ...reader import IMAGE_HEADER_SIZE
from ..scan import ReadRecord
from .columns import chunks
from .facts import Progress, ShardFacts, held_rows
from .report import CheckResult, Found, Tally, one_problem


@dataclass
class DecodeOptions:
    """What `--decode` checks: every image decodes; optionally its (height, width) and channels.

    An image whose header declares more than `max_pixels` pixels is not decoded: it is an
    `image-too-large` problem.
    """

    size: tuple[int, int] | None = None
    channels: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS


_DECODE_BATCH = 256
_DECODE_AHEAD = 64  # batches submitted and not yet reported: a bound, whatever the pack


def decodable_rows(facts: ShardFacts, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Return the rows `check_decoding` decodes (ascending, int64): image records with image
    bytes of a known signature (the others are reported by `check_headers`); of the rows
    lo..hi (all by default: a caller over every record takes them a chunk at a time)."""
    return _decodable(facts, lo, len(facts.framing.starts) if hi is None else hi)


def _decodable(facts: ShardFacts, lo: int, hi: int) -> np.ndarray:
    h = facts.headers
    mask = facts.layout.images[lo:hi] & h.complete[lo:hi]
    mask &= h.image_of(slice(lo, hi)) > 0
    unknown = facts.unknown_signature
    mask[unknown[(unknown >= lo) & (unknown < hi)] - lo] = False
    return lo + np.flatnonzero(mask)


def check_image_structure(facts: ShardFacts, progress: Progress | None = None) -> Iterator[Found]:
    """Every image passes the structural check `pack` runs on what it packs (`--check
    structure`): JPEG markers up to the scan and an end-of-image marker after it, every PNG
    chunk and its CRC, every header's dimensions (`images.check_container`; no decoding, and
    no pixel budget: that is `--decode --max-pixels`'s).

    The images are those `check_decoding` would decode whose header is sound (empty records,
    unknown signatures and bad headers are `check_headers`' problems); insightface's record 0
    and identity records are none.
    Whole records are checked in the mapped file a window's batch at a time (`held_rows`),
    the JPEG walk over each batch at once; `progress(phase, done, total)` hears of the
    "images" checked.
    """
    h, starts, split = facts.headers, facts.framing.starts, facts.framing.split

    def checked_rows(lo: int, hi: int) -> np.ndarray:
        rows = _decodable(facts, lo, hi)
        return rows[facts.sound[rows]]  # where a bad header puts the image is unknown

    # A chunk of records at a time: their rows are a chunk's temporaries, never the pack's.
    total = sum(len(checked_rows(lo, hi)) for lo, hi in chunks(len(starts)))
    if not total:
        return
    reasons: dict[int, str] = {}  # row -> reason
    split_rows: list[np.ndarray] = []
    u8 = np.frombuffer(facts.buf, np.uint8, facts.size)
    checked = 0
    try:
        for lo, hi in chunks(len(starts)):
            rows = checked_rows(lo, hi)
            split_rows.append(rows[split[rows]])
            for batch in held_rows(facts.window, facts.framing, rows[~split[rows]]):
                flags = h.flag[batch].astype(np.int64)
                heads = starts[batch] + 8 + IMAGE_HEADER_SIZE + 4 * flags
                ends = heads + h.image_of(batch).astype(np.int64)
                refused = refused_images(u8, heads, ends, _check_structure, _NO_PIXEL_LIMIT)
                for k, refusal in refused.items():
                    reasons[int(batch[k])] = refusal.reason
                checked += len(batch)
                if progress is not None:
                    progress("images", checked, total)
    finally:
        del u8  # a view of the mapping: it could not be closed
    for j in np.concatenate(split_rows).tolist():
        _, image = unpack_header(facts.read_record(int(starts[j])))
        try:
            _check_structure(bytes(image), "structure", _NO_PIXEL_LIMIT)
        except ImageRefused as refusal:
            reasons[j] = refusal.reason
    bad = sorted(reasons)
    yield Found(
        "image-damaged",
        len(bad),
        ((facts.rec, facts.keys[j], starts[j], reasons[j]) for j in bad),
    )


_NO_PIXEL_LIMIT = 1 << 62


def _check_structure(data: bytes, mode: str, max_pixels: float) -> None:
    check_container(data, max_pixels)


def check_decoding(
    facts: ShardFacts, rows: np.ndarray, options: DecodeOptions, decoder: Executor
) -> Iterator[CheckResult]:
    """Every image at `rows` decodes (to the size and channels `options` ask for).

    Batches decode on the `decoder` pool, a bounded number ahead (records are read one by
    one, by pread: nothing of the pack stays mapped); a `Tally` of "decoded" follows each
    batch's findings.
    """
    starts = facts.framing.starts
    pending: deque[tuple[np.ndarray, Future[list[tuple[int, str, str]]]]] = deque()

    def found(
        batch: np.ndarray, future: Future[list[tuple[int, str, str]]]
    ) -> Iterator[CheckResult]:
        for i, kind, message in future.result():
            j = batch[i]
            yield one_problem(kind, facts.rec, facts.keys[j], starts[j], message)
        yield Tally("decoded", len(batch))

    for first in range(0, len(rows), _DECODE_BATCH):
        batch = rows[first : first + _DECODE_BATCH]
        offsets = starts[batch].tolist()
        pending.append((batch, decoder.submit(_decode_batch, facts.read_record, offsets, options)))
        if len(pending) >= _DECODE_AHEAD:
            yield from found(*pending.popleft())
    while pending:
        yield from found(*pending.popleft())


def _decode_batch(
    read_record: ReadRecord, offsets: list[int], options: DecodeOptions
) -> list[tuple[int, str, str]]:
    """Decode the images at `offsets`; return [(position in batch, kind, message)]."""
    out: list[tuple[int, str, str]] = []
    for i, offset in enumerate(offsets):
        _, image = unpack_header(read_record(offset))
        problem = check_decoded(image, options)
        if problem is not None:
            out.append((i, *problem))
    return out


def check_decoded(image: bytes, options: DecodeOptions) -> tuple[str, str] | None:
    """Decode one image as `pack --check decode` does; return None, or (kind, message)."""
    try:
        height, width, channels = inspect_image(image, options.max_pixels)
    except ImageTooLarge as refusal:
        return "image-too-large", refusal.reason
    except ImageRefused as refusal:
        return "decode-failed", refusal.reason
    if options.size is not None and (height, width) != tuple(options.size):
        want = f"{options.size[0]}x{options.size[1]}"
        return "image-size", f"{height}x{width} (height x width), expected {want}"
    if options.channels is not None and channels != options.channels:
        return "image-channels", f"{channels} channels, expected {options.channels}"
    return None
