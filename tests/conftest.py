from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import settings

# Test helpers are imported as the package `helpers` (tests/helpers/).
sys.path.insert(0, str(Path(__file__).parent))

from helpers.handmade_datasets import write_pack  # noqa: E402
from helpers.image_files import jpeg_bytes, write_list, write_pack_tree  # noqa: E402
from helpers.image_trees import make_mixed_tree  # noqa: E402

# Property tests draw the same examples on every run, so a CI run never fails on an example
# no earlier run drew; explore new ones by hand with HYPOTHESIS_PROFILE=explore. No deadline:
# a loaded machine must not fail a test.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Progress lines in a log come every RECTOOL_PROGRESS_SECONDS of wall time: never, in the suite
# (here and in every rectool process a test starts), so no output depends on machine load.
# tests/test_cli_progress.py injects a clock to see them.
os.environ["RECTOOL_PROGRESS_SECONDS"] = "1e9"
# A manifest records when it was made; the suite fixes that instant (the reproducible-builds
# convention rectool honours), so two packs of the same inputs are byte-identical whenever the
# clock ticks. tests/test_manifest_date.py checks the date with and without it.
os.environ["SOURCE_DATE_EPOCH"] = "1764547200"  # 2025-12-01T00:00:00Z


# --- Shared fixtures: each name means one thing across the suite. -----------------------------
# Nothing here imports rectool at module level: tests/test_emit.py runs the dataset, torch and
# training suites where `import rectool` fails.


class PackTree(NamedTuple):
    """A tree of real JPEGs and the .lst that lists it."""

    root: Path
    list_path: Path
    items: list  # (index, label, relative path) as written to the list


class HandmadeShards(NamedTuple):
    """A pack written by hand (no rectool): its prefix and its samples in reading order."""

    prefix: Path
    samples: list


class MixedTree(NamedTuple):
    """helpers.image_trees.MIXED_TREE built under tmp_path: its root and the files made."""

    root: Path
    files: object


@pytest.fixture
def small_tree(tmp_path):
    """alice, bob and carol with 4 JPEGs of 40x32 each, and tmp_path/faces.lst listing them."""
    root = tmp_path / "tree"
    items = write_pack_tree(root, ["alice", "bob", "carol"], 4)
    return PackTree(root, write_list(tmp_path / "faces.lst", items), items)


@pytest.fixture
def small_pack(tmp_path):
    """helpers.rec_files.make_pack: alice, bob, carol x 4 JPEGs packed by rectool (images
    layout, label map, manifest, .rec.crc), described by hand (rec, idx, manifest, lines...)."""
    from helpers.rec_files import make_pack  # imports rectool

    return make_pack(tmp_path)


@pytest.fixture
def handmade_shards(tmp_path):
    """Three shards of 4, 3 and 5 JPEGs of 24x20 with keys out of order; labels 0.0 .. 11.0.

    Written by hand (helpers.handmade_datasets), prefix tmp_path/faces, with a manifest.
    """
    keys = [40, 3, 17, 8, 100, 5, 6, 7, 1, 0, 9, 2]
    items = [(key, jpeg_bytes(n, 24, 20), float(n)) for n, key in enumerate(keys)]
    samples = write_pack(tmp_path / "faces", [items[:4], items[4:7], items[7:]])
    return HandmadeShards(tmp_path / "faces", samples)


@pytest.fixture
def mixed_tree(tmp_path):
    """MIXED_TREE (odd names, symlinks, a FIFO, skipped files) under tmp_path/faces."""
    root = tmp_path / "faces"
    return MixedTree(root, make_mixed_tree(root))


@pytest.fixture
def alarm():
    """Return `arm(seconds)`: past that, the test fails as blocked (SIGALRM; disarmed after)."""

    def blocked(*args):
        raise AssertionError("blocked: the alarm went off")

    previous = signal.signal(signal.SIGALRM, blocked)
    yield signal.alarm
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# --- Remote packs: real servers on 127.0.0.1 (tests/helpers/servers.py) ------------------------


class RemotePack(NamedTuple):
    """A rectool pack of 4 shards (alice, bob, carol x 4 JPEGs, 3 records a shard), packed
    locally and served: `url` is its manifest's URL, `local` its local manifest."""

    url: str
    local: Path
    folder: Path  # the local pack's folder (what the server serves)
    faults: object  # helpers.servers.Faults of the server


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 for the whole session (buckets are per test)."""
    from helpers.servers import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server, its faults reset, and the environment obstore reads pointed at it."""
    s3_server.faults.reset()
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    yield s3_server
    s3_server.faults.reset()


def _remote_pack_files(tmp_path):
    from helpers.rec_files import make_pack  # imports rectool

    pack = make_pack(tmp_path, shard_records=3)
    return pack.manifest


@pytest.fixture
def s3_pack(s3, tmp_path, request):
    """A 4-shard pack in a fresh bucket of the S3 server."""
    local = _remote_pack_files(tmp_path)
    bucket = "pack-" + format(abs(hash(request.node.nodeid)), "x")[:12]
    s3.upload_folder(bucket, local.parent, "packs/")
    return RemotePack(f"s3://{bucket}/packs/{local.name}", local, local.parent, s3.faults)


@pytest.fixture
def http_pack(tmp_path):
    """The same 4-shard pack served by a plain HTTP server of byte ranges."""
    from helpers.servers import RangeServer

    local = _remote_pack_files(tmp_path)
    server = RangeServer(local.parent)
    yield RemotePack(f"{server.url}/{local.name}", local, local.parent, server.faults)
    server.stop()


@pytest.fixture(params=["s3", "http"])
def remote_pack(request):
    """The pack on S3, then on the HTTP server."""
    return request.getfixturevalue(f"{request.param}_pack")


@pytest.fixture
def no_hang():
    """Fail a test that blocks (a FIFO opened for reading, a regression) instead of hanging
    the suite: an alarm far beyond what any of these tiny operations takes."""

    def hung(*args):
        raise AssertionError("blocked for 60 s: a FIFO opened and waited on?")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
