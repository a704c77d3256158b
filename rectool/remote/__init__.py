"""Packs in object storage (s3://, gs://, az://) or on a web server (https://), read through a
local shard cache; packs written to object storage. docs/remote.md says how."""

from __future__ import annotations

from .cache import DigestMismatchError, ShardCache
from .dataset import RemoteDataset, default_cache_dir, open_remote
from .order import StreamingSampler, block_order
from .store import NotFoundError, RemoteError, Retry, is_url, open_store, safe_url

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
