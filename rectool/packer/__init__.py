"""Building a pack: walking a tree and its list files, checking and re-encoding images, passing
them through, shards, layouts, the manifest, and the pack pipeline (local and on Dask)."""
