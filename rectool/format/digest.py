"""Whole-file digests: the manifest's checksums of each shard's files, pack's resume and verify.

A version-2 manifest gives each file's xxh3-128 (the `xxhash` package: 23 GB/s on one core
here, SHA-256 1.4 GB/s, tests/benchmarks/bench_digests.py on 2 shared cores, load average
about 4), and its SHA-256 as well when a pack is made
with `--sha256` (a content address for people who publish a dataset). A version-1 manifest
gives the SHA-256 alone. `Digests` feeds one buffer to every digest asked for, so a file is
read (or its bytes written) once whatever the digests.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol, TypeVar

import xxhash

from ..doors.inputs import open_checked

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, StrPath


class Hasher(Protocol):
    """What `_fed` feeds: a `hashlib` or `xxhash` object, or `Digests`."""

    def update(self, data: ReadableBuffer, /) -> None: ...


class HexHasher(Hasher, Protocol):
    """One digest being computed (`hashlib.sha256()`, `xxhash.xxh3_128()`)."""

    def hexdigest(self) -> str: ...


_H = TypeVar("_H", bound=Hasher)

_CHUNK = 4 << 20

XXH3_128, SHA256 = "xxh3-128", "sha256"
# Each digest's constructor, and the suffix of its manifest field (`rec_xxh3_128`, ...).
_NEW: dict[str, Callable[[], HexHasher]] = {XXH3_128: xxhash.xxh3_128, SHA256: hashlib.sha256}
FIELD = {XXH3_128: "xxh3_128", SHA256: "sha256"}
# How messages name each digest: of whole files, and of records (see checksums.py).
DIGEST_NAMES = {XXH3_128: "xxh3-128", SHA256: "SHA-256", "crc32": "CRC-32", "xxh3-64": "xxh3-64"}


def field_name(file: str, algorithm: str) -> str:
    """Return the manifest field of `file` ("rec", "idx", "crc")'s `algorithm` digest."""
    return f"{file}_{FIELD[algorithm]}"


class Digests:
    """Several digests of the same bytes, fed together: `update` them, read `hexdigests`."""

    def __init__(self, algorithms: Iterable[str]) -> None:
        self.algorithms = tuple(algorithms)
        self._hashers = [_NEW[name]() for name in self.algorithms]

    def update(self, data: ReadableBuffer) -> None:
        for h in self._hashers:
            h.update(data)

    def hexdigests(self) -> dict[str, str]:
        """Return {algorithm: hex digest}."""
        return {name: h.hexdigest() for name, h in zip(self.algorithms, self._hashers)}


def digests_of(data: ReadableBuffer, algorithms: Iterable[str]) -> dict[str, str]:
    """Return {algorithm: hex digest} of the bytes `data`."""
    d = Digests(algorithms)
    d.update(data)
    return d.hexdigests()


def _fed(hasher: _H, path: StrPath, size: int | None) -> _H:
    """Feed `hasher` the first `size` bytes of `path` (all when None); return it.

    Reads into one reused buffer (no allocation per block); the caller may keep feeding it.
    Stops early at the end of a file shorter than `size`. Opened by `inputs.open_checked`
    (a FIFO or device is refused, as `RectoolError`).
    """
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    left = size
    with os.fdopen(open_checked(path, "file")[0], "rb", buffering=0) as f:
        while left is None or left > 0:
            n = f.readinto(view if left is None or left >= _CHUNK else view[:left])
            if not n:
                break
            hasher.update(view[:n])
            if left is not None:
                left -= n
    return hasher


def file_digests(path: StrPath, algorithms: Iterable[str], size: int | None = None) -> Digests:
    """Return a `Digests` of `algorithms` fed the first `size` bytes of `path` (all when None),
    read once."""
    return _fed(Digests(algorithms), path, size)


def sha256_hasher(path: StrPath, size: int | None = None) -> HexHasher:
    """Return a `hashlib.sha256` object fed the first `size` bytes of `path` (all when None)."""
    return _fed(hashlib.sha256(), path, size)


def sha256_file(path: StrPath) -> str:
    """Return the hex SHA-256 of a file."""
    return sha256_hasher(path).hexdigest()


def file_hexdigest(path: StrPath, algorithm: str) -> str:
    """Return the hex `algorithm` digest of a file."""
    return file_digests(path, [algorithm]).hexdigests()[algorithm]
