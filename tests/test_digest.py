"""rectool.format.digest: the one SHA-256 file helper (manifest checksums, pack resume, verify)."""

from __future__ import annotations

import hashlib

from rectool.format.digest import sha256_file, sha256_hasher


def test_sha256_file_is_the_sha256_of_the_bytes(tmp_path):
    data = bytes(range(256)) * 40_000  # over two of the helper's 4 MiB reads
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert sha256_file(empty) == hashlib.sha256(b"").hexdigest()


def test_sha256_hasher_reads_a_prefix_and_can_be_fed_on(tmp_path):
    data = b"0123456789" * 1_000_000
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    h = sha256_hasher(path, 4_200_000)
    assert h.hexdigest() == hashlib.sha256(data[:4_200_000]).hexdigest()
    h.update(b"more")
    assert h.hexdigest() == hashlib.sha256(data[:4_200_000] + b"more").hexdigest()


def test_sha256_hasher_stops_at_the_end_of_a_shorter_file(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"abc")
    assert sha256_hasher(path, 10).hexdigest() == hashlib.sha256(b"abc").hexdigest()
