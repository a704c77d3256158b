"""rectool: pack image trees into MXNet RecordIO shards, verify them, read them without MXNet."""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (
    IndexFormatError,
    RecordFormatError,
    RecordTooLargeError,
    RectoolError,
    UsageError,
)
from .reader import Header, IndexedRecordFile, RecordFile, load_index, unpack_header
from .writer import IndexedRecordWriter, RecordWriter, frame_record, pack_image_record

__all__ = [
    "Header",
    "IndexFormatError",
    "IndexedRecordFile",
    "IndexedRecordWriter",
    "RecordFile",
    "RecordFormatError",
    "RecordTooLargeError",
    "RecordWriter",
    "RectoolError",
    "UsageError",
    "__version__",
    "frame_record",
    "load_index",
    "pack_image_record",
    "unpack_header",
]
