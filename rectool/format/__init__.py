"""The RecordIO format core beyond the reader: writing records and indexes, records by key,
per-record checksums, keys, digests, and the .idx sidecar cache."""
