"""Loader and BatchDecoder: batches in order, bad samples, sizes, ranks, shared memory, torch.

Packs are written by hand (helpers/handmade_datasets.py) and every expected pixel comes from
cv2.imdecode of the image bytes the test
wrote, so nothing expected is computed by the loader or the reader.
"""

from __future__ import annotations

import os
import pickle
import signal

import cv2
import numpy as np
import pytest
from helpers.handmade_datasets import write_pack
from helpers.image_files import jpeg_bytes

from rectool import training
from rectool.reader import RecordFormatError, RectoolError, open_dataset
from rectool.training import (
    BatchDecoder,
    Loader,
    RankSampler,
    crop_box,
    reduction_factor,
)

SAMPLES = 37


def decoded(image_bytes, flag=cv2.IMREAD_COLOR):
    return cv2.imdecode(np.frombuffer(image_bytes, np.uint8), flag)


@pytest.fixture(scope="module")
def loader_shards(tmp_path_factory):
    """37 JPEGs of 40x32 in three shards; label = sample number."""
    folder = tmp_path_factory.mktemp("loader")
    items = [(1000 + n, jpeg_bytes(n, 40, 32), float(n)) for n in range(SAMPLES)]
    samples = write_pack(folder / "faces", [items[:10], items[10:25], items[25:]], index=True)
    return folder / "faces", samples


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """10 JPEGs of 40x32, sample 4 holding bytes that are no image; label = sample number."""
    folder = tmp_path_factory.mktemp("broken")
    items = [(n, jpeg_bytes(n, 40, 32), float(n)) for n in range(10)]
    items[4] = (4, b"\xff\xd8 this is not a JPEG at all", 4.0)
    samples = write_pack(folder / "bad", [items], index=True)
    return folder / "bad", samples


@pytest.fixture(scope="module")
def mixed_size_shards(tmp_path_factory):
    """Images of 64x64, 40x32 and 20x60 (height x width); label = sample number."""
    folder = tmp_path_factory.mktemp("mixed")
    shapes = [(64, 64), (40, 32), (20, 60), (64, 64), (40, 32)]
    items = [(n, jpeg_bytes(n, h, w), float(n)) for n, (h, w) in enumerate(shapes)]
    samples = write_pack(folder / "mixed", [items], index=True)
    return folder / "mixed", samples


def shm_segments():
    """This process's ring files in /dev/shm: a Loader's (which should have no name at all)
    and its DataLoader workers' BatchDecoder rings (named by this pid, then theirs). What
    other processes left, a run killed earlier say, is theirs to account for."""
    mine = (f"rectool-loader-{os.getpid()}-", f"rectool-batches-{os.getpid()}-")
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(mine))


def collect(loader):
    """Return every (image, label) of one pass, copied, and the batch sizes."""
    images, labels, sizes = [], [], []
    for batch_images, batch_labels in loader:
        sizes.append(len(batch_images))
        images += [image.copy() for image in batch_images]
        labels += batch_labels.tolist()
    return images, labels, sizes


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_every_sample_once_per_epoch_with_its_pixels(loader_shards, start_method):
    prefix, samples = loader_shards
    with Loader(open_dataset(prefix), 8, workers=2, seed=5, start_method=start_method) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            images, labels, sizes = collect(loader)
            assert sizes == [8, 8, 8, 8, 5]
            assert sorted(labels) == list(range(SAMPLES))
            for image, label in zip(images, labels):
                expected = cv2.cvtColor(decoded(samples[label].image), cv2.COLOR_BGR2RGB)
                assert np.array_equal(image, expected)
        assert loader.stats == {"batches": 10, "samples": 74, "skipped": 0, "replaced": 0}
    assert shm_segments() == []


def test_order_depends_on_seed_and_epoch_only(loader_shards):
    prefix, _ = loader_shards
    ds = open_dataset(prefix)
    orders = {}
    for workers, seed, epoch in [(1, 5, 0), (3, 5, 0), (2, 5, 1), (2, 6, 0)]:
        with Loader(ds, 6, workers=workers, seed=seed) as loader:
            loader.set_epoch(epoch)
            orders[workers, seed, epoch] = collect(loader)[1]
    assert orders[1, 5, 0] == orders[3, 5, 0]
    assert orders[2, 5, 1] != orders[1, 5, 0]
    assert orders[2, 6, 0] != orders[1, 5, 0]
    assert all(sorted(order) == list(range(SAMPLES)) for order in orders.values())


def test_drop_last_bgr_and_int64_labels(loader_shards):
    prefix, samples = loader_shards
    with Loader(open_dataset(prefix), 8, mode="bgr", drop_last=True, shuffle=False) as loader:
        batches = [(images.copy(), labels.copy()) for images, labels in loader]
    assert [len(images) for images, _ in batches] == [8, 8, 8, 8]
    images, labels = batches[1]
    assert labels.dtype == np.int64 and labels.tolist() == list(range(8, 16))
    assert images.dtype == np.uint8 and images.shape == (8, 40, 32, 3)
    assert np.array_equal(images[0], decoded(samples[8].image))


def test_float_labels_stay_float32(tmp_path):
    items = [(n, jpeg_bytes(n, 12, 10), n * 0.5) for n in range(5)]
    write_pack(tmp_path / "half", [items], index=True)
    with Loader(open_dataset(tmp_path / "half"), 5, shuffle=False, workers=1) as loader:
        ((_, labels),) = list(loader)
        assert labels.dtype == np.float32 and labels.tolist() == [0, 0.5, 1, 1.5, 2]


def test_label_vectors_stay_float32_even_of_zeros_and_ones(tmp_path):
    items = [(n, jpeg_bytes(n, 12, 10), [n % 2, 1 - n % 2, 1]) for n in range(4)]
    write_pack(tmp_path / "multi", [items], index=True)
    with Loader(open_dataset(tmp_path / "multi"), 4, shuffle=False, workers=1) as loader:
        ((_, labels),) = list(loader)
        assert labels.dtype == np.float32 and labels.tolist() == [[0, 1, 1], [1, 0, 1]] * 2


def test_gray_mode(loader_shards):
    prefix, samples = loader_shards
    with Loader(open_dataset(prefix), 4, mode="gray", shuffle=False, workers=1) as loader:
        images, labels = next(iter(loader))
        assert images.shape == (4, 40, 32, 1)
        expected = decoded(samples[2].image, cv2.IMREAD_GRAYSCALE)
        assert np.array_equal(images[2, :, :, 0], expected)


def test_size_decodes_at_reduced_scale_and_crops_the_centre(mixed_size_shards):
    prefix, samples = mixed_size_shards
    with Loader(open_dataset(prefix), 5, size=(16, 16), mode="bgr", shuffle=False) as loader:
        ((images, labels),) = [(i.copy(), lab.copy()) for i, lab in loader]
    assert images.shape == (5, 16, 16, 3) and labels.tolist() == [0, 1, 2, 3, 4]
    # 64x64 covers 16x16 at 1/4 scale exactly: libjpeg's own output, no resize.
    assert np.array_equal(images[0], decoded(samples[0].image, cv2.IMREAD_REDUCED_COLOR_4))
    # 40x32 at 1/2 is 20x16: the middle 16 rows.
    assert np.array_equal(images[1], decoded(samples[1].image, cv2.IMREAD_REDUCED_COLOR_2)[2:18])
    # 20x60 is not twice 16 high: full decode, the middle 20x20 shrunk to 16x16.
    middle = decoded(samples[2].image)[:, 20:40]
    expected = cv2.resize(middle, (16, 16), interpolation=cv2.INTER_AREA)
    assert np.array_equal(images[2], expected)


def test_size_enlarges_small_images(mixed_size_shards):
    prefix, samples = mixed_size_shards
    decoder = BatchDecoder(open_dataset(prefix), size=(48, 48), mode="bgr")
    images, labels = decoder[[1]]
    middle = decoded(samples[1].image)[4:36]  # 40x32 to cover 48x48: the middle 32 rows
    assert np.array_equal(images[0], cv2.resize(middle, (48, 48), interpolation=cv2.INTER_LINEAR))


def test_mixed_shapes_without_size_name_the_first_mismatch(mixed_size_shards):
    prefix, samples = mixed_size_shards
    with Loader(open_dataset(prefix), 5, shuffle=False, workers=1) as loader:
        with pytest.raises(RectoolError, match=r"key 1, byte offset \d+: image of shape") as info:
            list(loader)
        assert str(samples[1].rec) in str(info.value)
        assert "size=(H, W)" in str(info.value)


def test_a_bad_sample_raises_with_file_key_and_offset(broken):
    prefix, samples = broken
    with Loader(open_dataset(prefix), 4, shuffle=False, workers=2) as loader:
        with pytest.raises(RecordFormatError) as info:
            list(loader)
    error = info.value
    assert (error.path, error.key, error.offset) == (samples[4].rec, 4, samples[4].offset)
    assert "cannot be decoded" in str(error)
    assert shm_segments() == []


def test_skip_drops_and_counts_the_bad_sample(broken):
    prefix, _ = broken
    with Loader(open_dataset(prefix), 4, shuffle=False, on_error="skip") as loader:
        images, labels, sizes = collect(loader)
        assert sizes == [4, 3, 2] and labels == [0, 1, 2, 3, 5, 6, 7, 8, 9]
        assert loader.stats == {"batches": 3, "samples": 9, "skipped": 1, "replaced": 0}
        ((index, substitute, message),) = loader.bad_samples
        assert (index, substitute) == (4, None) and "key 4" in message


def test_replace_substitutes_the_same_sample_every_time(broken):
    prefix, samples = broken
    runs = []
    for workers in (1, 2):
        with Loader(
            open_dataset(prefix), 4, shuffle=False, on_error="replace", workers=workers
        ) as loader:
            images, labels, sizes = collect(loader)
            assert sizes == [4, 4, 2] and loader.stats["replaced"] == 1
            ((index, substitute, _),) = loader.bad_samples
            assert index == 4 and substitute != 4 and labels[4] == substitute
            expected = cv2.cvtColor(decoded(samples[substitute].image), cv2.COLOR_BGR2RGB)
            assert np.array_equal(images[4], expected)
            runs.append(labels)
    assert runs[0] == runs[1]


def test_batch_decoder_counts_skips(broken):
    prefix, _ = broken
    decoder = BatchDecoder(open_dataset(prefix), on_error="skip")
    images, labels = decoder[[3, 4, 5]]
    assert labels.tolist() == [3, 5] and len(images) == 2
    assert decoder.stats["skipped"] == 1


def test_ranks_partition_the_epoch(loader_shards):
    prefix, _ = loader_shards
    ds = open_dataset(prefix)
    shares = []
    for rank in range(3):
        with Loader(ds, 5, rank=rank, world_size=3, seed=1, workers=1) as loader:
            shares.append(collect(loader)[1])
    assert [len(share) for share in shares] == [13, 13, 13]  # 37 padded to 39
    seen = [label for share in shares for label in share]
    assert sorted(set(seen)) == list(range(SAMPLES))
    assert len(seen) - len(set(seen)) == 2  # only the padding repeats


def test_no_shared_memory_left_after_an_exception_in_the_loop(loader_shards):
    prefix, _ = loader_shards
    before = shm_segments()
    with pytest.raises(ZeroDivisionError):
        with Loader(open_dataset(prefix), 4, workers=2) as loader:
            for _ in loader:
                assert shm_segments() == before  # unlinked once every worker mapped it
                raise ZeroDivisionError
    assert shm_segments() == before
    assert loader._processes == []


def test_abandoned_epoch_then_a_full_one(loader_shards):
    prefix, _ = loader_shards
    with Loader(open_dataset(prefix), 4, workers=2, seed=2) as loader:
        first = next(iter(loader))[1].tolist()
        labels = collect(loader)[1]
        assert labels[:4] == first and sorted(labels) == list(range(SAMPLES))


def test_copy_survives_the_next_step_and_tensors(loader_shards):
    prefix, samples = loader_shards
    torch = pytest.importorskip("torch")
    with Loader(open_dataset(prefix), 4, copy=True, tensors=True, shuffle=False) as loader:
        batches = list(loader)
    images, labels = batches[0]
    assert isinstance(images, torch.Tensor) and labels.dtype == torch.int64
    expected = cv2.cvtColor(decoded(samples[1].image), cv2.COLOR_BGR2RGB)
    assert np.array_equal(images[1].numpy(), expected)


@pytest.mark.parametrize("slots", [8, 0])
def test_batch_decoder_in_a_torch_dataloader(loader_shards, slots):
    prefix, samples = loader_shards
    torch = pytest.importorskip("torch")
    ds = open_dataset(prefix)
    batches = BatchDecoder(ds, mode="bgr", slots=slots)
    sampler = torch.utils.data.BatchSampler(RankSampler(ds, seed=4), 8, drop_last=False)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, sampler=sampler, num_workers=2)
    seen = []
    for images, labels in loader:
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        for image, label in zip(images, labels.tolist()):
            assert np.array_equal(image.numpy(), decoded(samples[label].image))
            seen.append(label)
    assert sorted(seen) == list(range(SAMPLES))
    del loader
    assert shm_segments() == []


def test_a_workers_ring_travels_with_its_first_batch_only(loader_shards, monkeypatch):
    """In a DataLoader worker a batch pickles as its ring of shared tensors the first time and
    as the ring's key after (torch would send a tensor's descriptor through a socket for every
    batch); the training loop rebuilds each batch from the ring it kept."""
    prefix, samples = loader_shards
    torch = pytest.importorskip("torch")
    batches = BatchDecoder(open_dataset(prefix), mode="bgr", slots=4)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: "a worker")
    decoded_batches = [batches[indices] for indices in ([0, 11, 30], [5, 36], [7])]
    sent = [pickle.dumps(batch) for batch in decoded_batches]  # the ring's bytes as they are
    assert len(sent[0]) > 4 * 40 * 32 * 3 and max(map(len, sent[1:])) < 2_000
    monkeypatch.setattr(training, "_RINGS", {})  # the training loop's
    for data in sent:
        images, labels = pickle.loads(data)
        assert labels.dtype == torch.int64 and len(images) == len(labels)
        for image, label in zip(images, labels.tolist()):
            assert np.array_equal(image.numpy(), decoded(samples[label].image))
    assert len(training._RINGS) == 1
    training._RINGS.clear()  # a batch whose ring this process never received
    with pytest.raises(RectoolError, match="never arrived"):
        pickle.loads(sent[1])


def test_the_decoders_flags_are_opencvs(loader_shards):
    color = BatchDecoder(open_dataset(loader_shards[0]), mode="bgr")._decoder
    gray = BatchDecoder(open_dataset(loader_shards[0]), mode="gray")._decoder
    assert [color.flag(f) for f in (1, 2, 4, 8)] == [
        cv2.IMREAD_COLOR, cv2.IMREAD_REDUCED_COLOR_2, cv2.IMREAD_REDUCED_COLOR_4,
        cv2.IMREAD_REDUCED_COLOR_8,
    ]  # fmt: skip
    assert [gray.flag(f) for f in (1, 2, 4, 8)] == [
        cv2.IMREAD_GRAYSCALE, cv2.IMREAD_REDUCED_GRAYSCALE_2, cv2.IMREAD_REDUCED_GRAYSCALE_4,
        cv2.IMREAD_REDUCED_GRAYSCALE_8,
    ]  # fmt: skip


def test_options_are_checked(loader_shards):
    ds = open_dataset(loader_shards[0])
    with pytest.raises(ValueError, match="size"):
        Loader(ds, 4, size=(16,))
    with pytest.raises(ValueError, match="on_error"):
        Loader(ds, 4, on_error="ignore")
    with pytest.raises(ValueError, match="mode"):
        BatchDecoder(ds, mode="yuv")


@pytest.mark.parametrize(
    ("source", "target", "factor"),
    [
        ((448, 448), (112, 112), 4),
        ((445, 448), (112, 112), 4),
        ((444, 448), (112, 112), 2),
        ((900, 120), (112, 14), 8),
        ((221, 500), (112, 112), 1),
        ((112, 112), (112, 112), 1),
    ],
)
def test_reduction_factor(source, target, factor):
    assert reduction_factor(source, target) == factor


def test_crop_box_keeps_the_centre_at_the_target_aspect():
    assert crop_box((40, 32), (16, 16)) == (4, 0, 32, 32)
    assert crop_box((20, 60), (16, 16)) == (0, 20, 20, 20)
    assert crop_box((100, 100), (50, 100)) == (25, 0, 50, 100)


def test_a_dead_worker_is_an_error_and_the_next_pass_starts_afresh(loader_shards):
    prefix, _ = loader_shards
    with Loader(open_dataset(prefix), 2, workers=2, shuffle=False) as loader:
        passes = iter(loader)
        next(passes)
        victim = loader._processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        with pytest.raises(RectoolError, match=rf"loader worker 1 \(pid {victim.pid}\) died"):
            list(passes)
        assert sorted(collect(loader)[1]) == list(range(SAMPLES))
    assert shm_segments() == []


STANDALONE = """
import sys
sys.modules["rectool"] = None  # the copies must stand alone
from rectool_reader import RecordFormatError, open_dataset
from rectool_training import Loader

if __name__ == "__main__":
    for method in ("fork", "spawn"):
        with Loader(open_dataset(sys.argv[1]), 8, start_method=method, seed=1) as loader:
            labels = sorted(label for _, batch in loader for label in batch.tolist())
        assert labels == list(range(37)), labels
        # The reader's own error, found through the dataset under the copy's file name.
        with Loader(open_dataset(sys.argv[2]), 4, start_method=method, shuffle=False) as loader:
            try:
                list(loader)
            except RecordFormatError as exc:
                assert exc.key == 4 and "cannot be decoded" in str(exc), exc
            else:
                raise AssertionError("the broken sample was not reported")
    assert "torch" not in sys.modules
    print("ok")
"""


def test_the_emitted_pair_works_without_rectool(loader_shards, broken, tmp_path):
    import subprocess
    import sys

    from rectool.emit import emit_reader

    emit_reader(tmp_path / "rectool_reader.py")
    emit_reader(tmp_path / "rectool_training.py", training_module=True)
    (tmp_path / "run.py").write_text(STANDALONE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, str(tmp_path / "run.py"), str(loader_shards[0]), str(broken[0])],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
        timeout=300,
    )
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr


def test_a_worker_that_cannot_start_is_named(loader_shards, tmp_path):
    import subprocess
    import sys

    script = "from rectool.reader import open_dataset\nfrom rectool.training import Loader\n"
    script += "import sys\nfor _ in Loader(open_dataset(sys.argv[1]), 8, start_method='spawn'):\n"
    script += "    pass\n"  # no __main__ guard: each spawned worker runs this again and fails
    (tmp_path / "unguarded.py").write_text(script, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(tmp_path / "unguarded.py"), str(loader_shards[0])],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,  # a loader that hangs on dead workers fails here, not the whole run
    )
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("rectool.reader.RectoolError: loader worker 0 (pid"), out.stderr
    assert "if __name__ == '__main__':" in last


def test_forked_workers_start_after_opencv_ran_threads_in_the_parent(loader_shards, tmp_path):
    # A child forked while OpenCV's thread pool runs inherits its condition variables in use:
    # the worker's first cv2.setNumThreads blocked forever (a hang at the Loader's start). The
    # subprocess's timeout only guards the test run; the assertion is that it finishes.
    import subprocess
    import sys

    script = (
        "import sys, numpy as np, cv2\n"
        "big = np.random.default_rng(0).integers(0, 255, (2000, 2000, 3), np.uint8)\n"
        "for _ in range(3):\n"
        "    cv2.GaussianBlur(big, (31, 31), 5)  # runs on OpenCV's thread pool\n"
        "from rectool.reader import open_dataset\n"
        "from rectool.training import Loader\n"
        "with Loader(open_dataset(sys.argv[1]), 8, workers=2, start_method='fork') as loader:\n"
        "    print(sum(len(images) for images, _ in loader), cv2.getNumThreads())\n"
    )
    (tmp_path / "pooled.py").write_text(script, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(tmp_path / "pooled.py"), str(loader_shards[0])],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["37", str(cv2.getNumThreads())]  # the parent's threads kept


SIBLINGS = """
import sys
sys.modules["rectool"] = None  # the copies must stand alone
from train import rectool_reader, rectool_training

ds = rectool_reader.open_dataset(sys.argv[1])
assert rectool_training.RecordFormatError is rectool_reader.RecordFormatError
with rectool_training.Loader(ds, 4, workers=1, shuffle=False, on_error="skip") as loader:
    print(sum(len(labels) for _, labels in loader), loader.stats["skipped"])
"""


def test_the_emitted_pair_works_as_siblings_in_a_package(broken, tmp_path):
    """Emitted into a package of the user's, the training module imports its sibling reader
    (`from .rectool_reader import ...`), whose error classes it raises and catches."""
    import subprocess
    import sys

    from rectool.emit import emit_reader

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "__init__.py").write_text("")
    emit_reader(tmp_path / "train" / "rectool_reader.py")
    emit_reader(tmp_path / "train" / "rectool_training.py", training_module=True)
    out = subprocess.run(
        [sys.executable, "-c", SIBLINGS, str(broken[0])],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,
        check=False,
        timeout=300,
    )
    assert (out.returncode, out.stdout.split()) == (0, ["9", "1"]), out.stderr
