"""The exceptions rectool raises: one base class, `RectoolError`, and every error by name.

The base and the format errors are defined in `rectool.reader` (which must stand alone when
emitted) and re-exported here. The errors of a concept that only its folder raises (a remote
store's, a list file's, a pack's, recordio's) are defined beside the code that raises them
and reached here by name, imported on first use (so importing this module stays cheap and
cycle-free): callers import every error from this one place. `tests/test_errors.py` fails
when an error class is defined anywhere in the package without being reachable here.
"""

from __future__ import annotations

import importlib
from typing import Any

from .reader import (
    ImageTooLargeError,
    InputError,
    NotIndexedError,
    RecordFormatError,
    RectoolError,
    SampleIndexError,
)

# Error name -> the module (under rectool) that defines it.
_ELSEWHERE = {
    "ArchiveError": "archives.members",
    "CacheFullError": "remote.cache",
    "ChecksumFileError": "format.checksums",
    "DamagedRecordsError": "inspect.unpack",
    "DigestMismatchError": "remote.cache",
    "EmptyListError": "packer.listcheck",
    "ImageRefused": "packer.images",
    "ImageTooLarge": "packer.images",
    "IndexFormatError": "format.textindex",
    "ListFormatError": "packer.listfile",
    "MissingExtraError": "extras",
    "MissingKeyError": "recordio",
    "NotFoundError": "remote.store",
    "RemoteConfigError": "remote.store",
    "RemoteError": "remote.store",
    "TransientError": "remote.store",
    "WrongRootError": "packer.listcheck",
}

__all__ = [
    "ImageTooLargeError",
    "InputError",
    "ListingError",
    "NotIndexedError",
    "RecordFormatError",
    "RecordTooLargeError",
    "RectoolError",
    "SampleIndexError",
    "UsageError",
    *sorted(_ELSEWHERE),
]


class ListingError(RectoolError):
    """A tree cannot be listed: its root cannot be read, nothing in it is an image, or a list
    file cannot be written."""


class RecordTooLargeError(RectoolError):
    """A record is too large for RecordIO's 29-bit length field."""


class UsageError(RectoolError):
    """Options or inputs that cannot work together; the CLI reports these as usage errors."""


def __getattr__(name: str) -> Any:
    """Import an error defined elsewhere in the package on first use (PEP 562)."""
    if name not in _ELSEWHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__package__}.{_ELSEWHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ELSEWHERE})
