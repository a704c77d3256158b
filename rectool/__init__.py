"""rectool: pack image trees into MXNet RecordIO shards, verify them, read them without MXNet.

The names below are imported from their modules on first use (PEP 562), so that a command
such as `rectool list` does not load numpy or OpenCV it never needs.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # errors
    "RectoolError": "errors",
    "IndexFormatError": "errors",
    "RecordFormatError": "errors",
    "RecordTooLargeError": "errors",
    "UsageError": "errors",
    # reading (the module `rectool reader` emits)
    "Header": "reader",
    "IndexedRecordFile": "format.records",
    "RankSampler": "training",
    "RecordDataset": "reader",
    "RecordFile": "reader",
    "load_index": "reader",
    "open_dataset": "reader",
    "prefetch": "training",
    "decode_image": "reader",
    "unpack_header": "reader",
    # writing
    "write_index_cache": "format.indexcache",
    "write_dali_index": "inspect.dali",
    "IndexedRecordWriter": "format.writer",
    "RecordWriter": "format.writer",
    "frame_record": "format.writer",
    "pack_image_record": "format.writer",
    # pipelines
    "PackOptions": "build.options",
    "pack_images": "build.packing",
    "finalize_pack": "build.finalize",
    "list_images": "build.listing",
    "verify_dataset": "inspect.verify",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rectool' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
