"""The exceptions rectool raises: one base class, `RectoolError`.

The base and the format errors are defined in `rectool.reader` (which must stand alone when
emitted) and re-exported here with the rest, so callers import every error from one place.
"""

from __future__ import annotations

from .reader import IndexFormatError, InputError, RecordFormatError, RectoolError

__all__ = [
    "IndexFormatError",
    "InputError",
    "ListingError",
    "RecordFormatError",
    "RecordTooLargeError",
    "RectoolError",
    "UsageError",
]


class ListingError(RectoolError):
    """A tree cannot be listed: its root cannot be read, nothing in it is an image, or a list
    file cannot be written."""


class RecordTooLargeError(RectoolError):
    """A record is too large for RecordIO's 29-bit length field."""


class UsageError(RectoolError):
    """Options or inputs that cannot work together; the CLI reports these as usage errors."""
