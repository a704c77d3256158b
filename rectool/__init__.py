"""rectool: pack image trees into MXNet RecordIO shards, verify them, read them without MXNet.

The names below are imported from their modules on first use (PEP 562), so that a command
such as `rectool list` does not load numpy or OpenCV it never needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, typed for a checker (`X as X`: exported)
    from .dataset.packs import PackDataset as PackDataset
    from .dataset.packs import open_dataset as open_dataset
    from .errors import (
        IndexFormatError as IndexFormatError,
    )
    from .errors import (
        RecordFormatError as RecordFormatError,
    )
    from .errors import (
        RecordTooLargeError as RecordTooLargeError,
    )
    from .errors import (
        RectoolError as RectoolError,
    )
    from .errors import (
        UsageError as UsageError,
    )
    from .format.headers import Header as Header
    from .format.headers import unpack_header as unpack_header
    from .format.records import IndexedRecordFile as IndexedRecordFile
    from .format.textindex import load_index as load_index
    from .format.writer import (
        frame_record as frame_record,
    )
    from .format.writer import (
        pack_image_record as pack_image_record,
    )
    from .inspect.dali import write_dali_index as write_dali_index
    from .inspect.verify import verify_dataset as verify_dataset
    from .packer.finalize import finalize_pack as finalize_pack
    from .packer.listing import list_images as list_images
    from .packer.options import PackOptions as PackOptions
    from .packer.packing import pack_images as pack_images
    from .packer.writers import IndexedRecordWriter as IndexedRecordWriter
    from .packer.writers import RecordWriter as RecordWriter
    from .reader import RecordDataset as RecordDataset
    from .reader import RecordFile as RecordFile
    from .reader import decode_image as decode_image
    from .training import RankSampler as RankSampler
    from .training import prefetch as prefetch

__version__ = "0.1.0"

_EXPORTS = {
    # errors
    "RectoolError": "errors",
    "IndexFormatError": "errors",
    "RecordFormatError": "errors",
    "RecordTooLargeError": "errors",
    "UsageError": "errors",
    # reading (the module `rectool reader` emits)
    "Header": "format.headers",
    "IndexedRecordFile": "format.records",
    "RankSampler": "training",
    "PackDataset": "dataset.packs",
    "RecordDataset": "reader",
    "RecordFile": "reader",
    "load_index": "format.textindex",
    "open_dataset": "dataset.packs",
    "prefetch": "training",
    "decode_image": "reader",
    "unpack_header": "format.headers",
    # writing
    "write_dali_index": "inspect.dali",
    "IndexedRecordWriter": "packer.writers",
    "RecordWriter": "packer.writers",
    "frame_record": "format.writer",
    "pack_image_record": "format.writer",
    # pipelines
    "PackOptions": "packer.options",
    "pack_images": "packer.packing",
    "finalize_pack": "packer.finalize",
    "list_images": "packer.listing",
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
