"""Datasets across processes and threads: pickling, fork, DataLoader workers (fork and spawn),
descriptors, module imports.

Runs against `rectool.reader`, and through tests/test_emit.py against the emitted standalone
copy in a process where rectool cannot be imported (see helpers/reader_under_test.py). Datasets
are written by hand (helpers/handmade_datasets.py), never by rectool.
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers.handmade_datasets import as_pairs, expected_pairs, images, write_pack
from helpers.reader_under_test import EMITTED, rd


@pytest.fixture
def handmade_shards(tmp_path):
    """Three shards of 4, 3 and 5 JPEGs, keys out of order, labels 0.0 .. 11.0: format 3."""
    keys = [40, 3, 17, 8, 100, 5, 6, 7, 1, 0, 9, 2]
    items = [(key, image, float(n)) for n, (key, image) in enumerate(zip(keys, images(12)))]
    samples = write_pack(tmp_path / "faces", [items[:4], items[4:7], items[7:]], index=True)
    return tmp_path / "faces", samples


def rec_descriptors():
    """Return the paths of .rec files this process holds open (mmap descriptors included)."""
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".rec"):
            paths.append(target)
    return sorted(paths)


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")


@needs_proc
def test_files_open_lazily_one_descriptor_per_shard(handmade_shards):
    prefix, samples = handmade_shards
    gc.collect()  # datasets of earlier tests, kept alive by their tracebacks
    before = rec_descriptors()
    ds = rd.open_dataset(prefix)
    assert rec_descriptors() == before  # nothing held after opening
    ds[0]
    assert rec_descriptors() == sorted(before + [samples[0].rec])
    list(ds)
    assert rec_descriptors() == sorted(
        before + [s.rec for s in (samples[0], samples[4], samples[7])]
    )
    ds.close()
    assert rec_descriptors() == before
    assert ds[11] == (samples[11].image, samples[11].label)  # reopens
    del ds
    gc.collect()
    assert rec_descriptors() == before


def test_pickle_round_trip_without_open_files(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix, decode=None)
    assert len(ds.labels) == 12
    list(ds)
    blob = pickle.dumps(ds)
    copy = pickle.loads(blob)
    assert as_pairs(copy) == expected_pairs(samples)
    assert copy.labels.tolist() == ds.labels.tolist()
    if os.path.isdir("/proc/self/fd"):
        before = rec_descriptors()
        fresh = pickle.loads(blob)
        assert rec_descriptors() == before  # unpickling opens no file
        assert fresh[0] == copy[0]
    # The manifest's path and each shard's identity travel; the index and files never do.
    assert str(prefix) in str(blob) and len(blob) < 1024
    assert np.asarray(ds.offsets).tobytes() not in blob


@needs_proc
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_maps_its_own_files(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    list(ds)  # the parent holds all three shards
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what it reads and holds, then leave without cleanup
        try:
            ok = as_pairs(ds) == expected_pairs(samples)
            report = pickle.dumps((ok, rec_descriptors()))
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            report = pickle.dumps((repr(exc), []))
        os.write(write, report)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        ok, held = pickle.loads(f.read())
    os.waitpid(pid, 0)
    assert ok is True
    # Three descriptors, not six: the inherited mappings were released before remapping.
    assert held == sorted(s.rec for s in (samples[0], samples[4], samples[7]))
    assert ds[3] == (samples[3].image, samples[3].label)  # the parent's mapping still works


def test_threads_read_one_dataset(handmade_shards):
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    results, errors = {}, []

    def read(t):
        try:
            results[t] = [ds[i] for i in range(len(ds))[::-1] for _ in range(20)]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    expected = [(s.image, s.label) for s in samples[::-1] for _ in range(20)]
    assert all(r == expected for r in results.values())


def test_module_imports_only_the_standard_library_and_numpy():
    code = (
        "import importlib.util, sys\n"
        "sys.modules['rectool'] = None\n"
        "before = set(sys.modules)\n"
        f"spec = importlib.util.spec_from_file_location('standalone_reader', {rd.__file__!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "new = {name.split('.')[0] for name in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'numpy'}))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(not EMITTED, reason="only when testing the emitted reader")
def test_the_emitted_reader_runs_without_rectool():
    with pytest.raises(ImportError):
        import rectool  # noqa: F401
    assert os.path.samefile(rd.__file__, EMITTED)
    assert rd.RecordDataset.__module__ == rd.__name__ != "rectool.reader"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_every_sample(handmade_shards, context):
    torch = pytest.importorskip("torch")
    prefix, samples = handmade_shards
    ds = rd.open_dataset(prefix)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=context
    )
    assert [(bytes(image), float(label)) for image, label in loader] == expected_pairs(samples)
