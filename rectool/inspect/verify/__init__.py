"""Verify a dataset: framing, index, headers, manifest checksums, insightface layout, decoding.

`verify_dataset` reports what it finds in the data as `Problem`s, each naming the file, the
record key and the byte offset where they are known; it raises `RectoolError` only when an
input cannot be read at all (no such dataset, a manifest that is not one, an unreadable file).
It works on files written by MXNet, im2rec and insightface as well as by `rectool pack`; a
manifest, when there is one, adds checksums, counts and the class count, and a format-3
manifest a binary index, checked against the shards (a pack without one is noted, not failed).

How it reads: what is known about a dataset (`DatasetFacts`) and about each shard
(`ShardFacts`: its index, framing, headers, record keys and layout) is worked out once, then
each check is a function of those facts that yields what it finds (`Found`, and `Tally` for
work the report counts). No check depends on another having run; their order is the order
in which problems are listed.

The modules, in the order a shard is checked: `run` (`verify_dataset`), `facts` (what is
known), `index` and `framing`, `layout`, `headers`, `manifest`, `digests` (files' and records'
checksums), `binary` (the binary index of format 3 against all of them), `images` (structure
or decoding); `report` holds what they report.
"""

from .binary import (
    BinaryIndex,
    IndexFile,
    check_index_arrays,
    check_index_files,
    check_index_layout,
    read_binary_index,
)
from .digests import ShardHashes, check_record_checksums, compare_digests, expected_digests
from .facts import (
    DatasetFacts,
    FoundLayout,
    ShardFacts,
    ShardIndex,
    decide_layout,
    read_index,
    read_shard,
    size_or_zero,
)
from .framing import check_framing
from .headers import check_headers
from .images import (
    DecodeOptions,
    check_decoded,
    check_decoding,
    check_image_structure,
    decodable_rows,
)
from .index import check_index, check_index_file, check_keys_across_shards
from .layout import check_layout
from .manifest import check_listed_once, check_manifest_entry, check_totals, repeated_shards
from .report import (
    DEFAULT_KEEP,
    PROBLEM_KINDS,
    Compared,
    Findings,
    Found,
    Problem,
    Tally,
    VerifyReport,
    one_problem,
)
from .run import verify_dataset

__all__ = [
    "BinaryIndex",
    "IndexFile",
    "DEFAULT_KEEP",
    "PROBLEM_KINDS",
    "Compared",
    "DatasetFacts",
    "DecodeOptions",
    "Findings",
    "Found",
    "FoundLayout",
    "Problem",
    "ShardFacts",
    "ShardHashes",
    "ShardIndex",
    "Tally",
    "VerifyReport",
    "check_decoded",
    "check_decoding",
    "check_framing",
    "check_headers",
    "check_image_structure",
    "check_index",
    "check_index_arrays",
    "check_index_file",
    "check_index_files",
    "check_index_layout",
    "check_keys_across_shards",
    "check_layout",
    "check_listed_once",
    "check_manifest_entry",
    "check_record_checksums",
    "check_totals",
    "compare_digests",
    "decodable_rows",
    "decide_layout",
    "expected_digests",
    "one_problem",
    "read_binary_index",
    "read_index",
    "read_shard",
    "repeated_shards",
    "size_or_zero",
    "verify_dataset",
]
