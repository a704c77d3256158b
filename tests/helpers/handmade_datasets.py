"""Datasets written by hand from FORMAT-NOTES §1-§5, for the dataset and torch tests.

Nothing here imports rectool: the same tests run against the emitted reader where rectool is
not importable, and a writer bug must not hide the same bug in the reader.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = struct.pack("<I", 0xCED7230A)


def frame(payload):
    """Frame one record as dmlc does: split at aligned magic words (dropped), pad to 4 bytes."""
    parts, start, pos = [], 0, 0
    limit = len(payload) & ~3
    while pos + 4 <= limit:
        if payload[pos : pos + 4] == MAGIC:
            parts.append(payload[start:pos])
            start = pos + 4
        pos += 4
    parts.append(payload[start:])
    out = []
    for n, data in enumerate(parts):
        if len(parts) == 1:
            cflag = 0
        else:
            cflag = 1 if n == 0 else 3 if n == len(parts) - 1 else 2
        out += [MAGIC, struct.pack("<I", cflag << 29 | len(data)), data, b"\0" * (-len(data) % 4)]
    return b"".join(out)


def image_record(image, label, id1=0, id2=0):
    """Return an MXNet image record: IRHeader, then float32 labels when `label` is a list."""
    if isinstance(label, (list, tuple, np.ndarray)):
        labels = np.asarray(label, "<f4")
        return struct.pack("<IfQQ", labels.size, 0.0, id1, id2) + labels.tobytes() + image
    return struct.pack("<IfQQ", 0, label, id1, id2) + image


def write_shard(rec, idx, records):
    """Write (key, record bytes) pairs as a .rec and its .idx; return the offsets."""
    offsets, blob = [], bytearray()
    for _, record in records:
        offsets.append(len(blob))
        blob += frame(record)
    with open(rec, "wb") as f:
        f.write(blob)
    with open(idx, "w") as f:
        f.writelines(f"{key}\t{offset}\n" for (key, _), offset in zip(records, offsets))
    return offsets


@dataclass
class Sample:
    """What the reader must return for one sample, and where it lives."""

    image: bytes
    label: object  # float, or a list of floats
    key: int
    rec: str
    offset: int


def write_pack(prefix, shards, layout="images", manifest=True, index=False):
    """Write shards of (key, image bytes, label) as PREFIX-0000N.rec/.idx and a manifest.

    With `index`, the manifest is format 3 and the binary index (`write_binary_index`) is
    written beside it. Returns the expected samples in reader order: shard by shard, .idx
    line order.
    """
    prefix = os.fspath(prefix)
    samples, entries = [], []
    for number, items in enumerate(shards):
        stem = f"{prefix}-{number:05d}" if len(shards) > 1 else prefix
        records = [(key, image_record(image, label, key)) for key, image, label in items]
        offsets = write_shard(stem + ".rec", stem + ".idx", records)
        for (key, image, label), offset in zip(items, offsets):
            samples.append(Sample(image, label, key, stem + ".rec", offset))
        entries.append(
            {
                "rec": os.path.basename(stem + ".rec"),
                "idx": os.path.basename(stem + ".idx"),
                "records": len(records),
                "rec_bytes": os.path.getsize(stem + ".rec"),
            }
        )
    if manifest:
        binary = None
        if index:
            assert layout == "images", "write_binary_index writes the images layout only"
            binary = write_binary_index(prefix, samples, [e["records"] for e in entries])
        write_manifest(prefix, entries, layout, binary)
    return samples


def write_binary_index(prefix, samples, counts):
    """Write format 3's index arrays by hand (PREFIX.offsets/keys/labels.npy, one row a sample
    in reader order); return the manifest's `index` entry (no digests: the reader reads none)."""
    arrays = {
        "offsets": np.array([s.offset for s in samples], "<i8"),
        "keys": np.array([s.key for s in samples], "<i8"),
        "labels": np.array([s.label for s in samples], "<f4"),
    }
    entry = {"samples": list(counts)}
    for name, array in arrays.items():
        path = f"{os.fspath(prefix)}.{name}.npy"
        np.save(path, array, allow_pickle=False)
        entry[name] = {"file": os.path.basename(path), "bytes": os.path.getsize(path)}
    return entry


def write_manifest(prefix, entries, layout, index=None):
    document = {
        "format": "rectool-manifest",
        "format_version": 1 if index is None else 3,
        "layout": layout,
        "shards": entries,
        "totals": {"records": sum(e["records"] for e in entries)},
    }
    if index is not None:
        document["index"] = index
    with open(os.fspath(prefix) + ".manifest.json", "w") as f:
        json.dump(document, f)


def write_insightface(rec, idx, identities, images, header_last=True):
    """Write the face-dataset layout (FORMAT-NOTES §5); `identities` gives images per identity.

    `images(n)` returns the bytes of image n. Returns (samples, identity ranges as sample
    index pairs).
    """
    records, samples, ranges = [], [], []
    key = 1
    for label, count in enumerate(identities):
        ranges.append((key - 1, key - 1 + count))
        for _ in range(count):
            records.append((key, image_record(images(key), float(label), key)))
            samples.append((images(key), float(label), key))
            key += 1
    n, k = key - 1, len(identities)
    for label, (start, end) in enumerate(ranges):
        records.append((n + 1 + label, image_record(b"", [start + 1.0, end + 1.0], n + 1 + label)))
    header = (0, image_record(b"", [n + 1.0, n + 1.0 + k], 0, 1))
    records = records + [header] if header_last else [header, *records]
    offsets = dict(zip([key for key, _ in records], write_shard(rec, idx, records)))
    expected = [
        Sample(image, label, key, os.fspath(rec), offsets[key]) for image, label, key in samples
    ]
    return expected, ranges


def images(n, start=0):
    """n distinct JPEGs of 24x20 (seeds start .. start + n - 1)."""
    from helpers.image_files import jpeg_bytes

    return [jpeg_bytes(start + k, 24, 20) for k in range(n)]


def as_pairs(ds):
    """Every (image, label) a dataset yields, in order."""
    return [(image, label) for image, label in ds]


def expected_pairs(samples):
    """The (image, label) pairs the reader must yield for these samples."""
    return [(s.image, s.label) for s in samples]


def index_arrays(prefix):
    """Return (the manifest at PREFIX.manifest.json, its binary index's arrays by name), each
    array loaded from the file its `index` entry names (no pickle)."""
    path = f"{prefix}.manifest.json"
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    folder = os.path.dirname(path)
    arrays = {
        name: np.load(os.path.join(folder, entry["file"]))
        for name, entry in manifest["index"].items()
        if isinstance(entry, dict) and "file" in entry
    }
    return manifest, arrays
