"""Helpers the tests import as `helpers.<module>`; each module's name says what it builds or runs.

- handmade_datasets: .rec/.idx packs, shards and insightface folders written by hand from
  FORMAT-NOTES (no rectool import), with format 3's `.npy` index when asked (`index=True`),
  for the reader, dataset and torch tests.
- image_files: tiny real images, pack trees and .lst files.
- rec_files: build, read and damage .rec/.idx files byte by byte (verify, reindex, info, unpack).
- image_trees: identity-per-folder trees with symlinks, FIFOs and odd names (list, scan).
- damaged_jpegs: valid JPEGs damaged inside their entropy-coded scan.
- oversized_images: tiny images of every format whose headers declare a huge size.
- framing_cases: record payloads covering every corner of dmlc's framing.
- faults: os.write failing or lagging for the named files only (a full disk, a slow one).
- mxnet_oracle: run code under the real MXNet 1.9.1 in its own virtual environment.
- reader_under_test / training_under_test: rectool's reader/training module, or the emitted
  standalone copy named by RECTOOL_EMITTED_READER / RECTOOL_EMITTED_TRAINING.
"""
