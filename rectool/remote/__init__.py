"""Packs in object storage (s3://, gs://, az://) or on a web server (https://), read through a
local shard cache; packs written to object storage. docs/remote.md says how."""

from __future__ import annotations

import importlib
from typing import Any

# Name -> the module of this folder that defines it, imported on first use (PEP 562): a
# command that only asks `is_url` of a local path imports none of the download machinery.
_EXPORTS = {
    "DigestMismatchError": "cache",
    "ShardCache": "cache",
    "RemoteDataset": "dataset",
    "default_cache_dir": "dataset",
    "open_remote": "dataset",
    "StreamingSampler": "order",
    "block_order": "order",
    "NotFoundError": "store",
    "RemoteError": "store",
    "Retry": "store",
    "is_url": "store",
    "open_store": "store",
    "safe_url": "store",
}

__all__ = [
    "DigestMismatchError",
    "NotFoundError",
    "RemoteDataset",
    "RemoteError",
    "Retry",
    "ShardCache",
    "StreamingSampler",
    "block_order",
    "default_cache_dir",
    "is_url",
    "open_remote",
    "open_store",
    "safe_url",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
