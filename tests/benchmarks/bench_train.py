"""Time decoded batches reaching a training loop against bare decoding processes.

On the 100k benchmark pack (bench_read.py's, 112x112 JPEGs), with the same number N of
processes on every side, each timed over windows of `--images` images after its start-up,
in turns (bare, ours, torch, torch + BatchDecoder; best of `--repeats`, 8 by default: on a
shared machine the best short window is the one least disturbed by other jobs):

- **bare**: N forked processes that only `cv2.imdecode` the pack's payloads (mmap slices, a
  shuffled order) and keep nothing: the decode limit of N processes;
- **Loader**: `rectool.training.Loader(workers=N)`, batches of 128 in shared memory;
- **DataLoader**: torch's, N workers over `open_dataset(decode="bgr")`, default collate;
- **DataLoader + BatchDecoder**: torch's, N workers, one decoded batch per `__getitem__`.

Then `size=` on 448x448 JPEGs (2,000 of them, packed once under `.bench-cache/train-448/`):
`BatchDecoder(size=(112, 112))`, which decodes them at 1/4 scale, against a full decode and
`cv2.resize` to 112x112, one process, in turns.

    python tests/benchmarks/bench_train.py [--workers N] [--images N] [--repeats N]

`run()` returns the figures for run_all.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_read import cpu_seconds, ensure_pack, process_cpu_seconds  # noqa: E402
from common import CACHE, best_in_turns  # noqa: E402

from rectool.reader import open_dataset  # noqa: E402
from rectool.training import (  # noqa: E402
    BatchDecoder,
    Loader,
    RankSampler,
    _forking,
    epoch_order,
)

BATCH = 128
BIG_SIDE, SMALL_SIDE, BIG_IMAGES = 448, 112, 2_000
TARGETS = [
    ("loader_over_bare", "decoded batches/s: Loader / bare decoding processes", ">=", 0.9),
    ("loader_cpu_over_bare", "CPU per image: bare decoding / Loader", ">=", 0.85),
    (
        "batchdecoder_over_bare",
        "decoded batches/s: DataLoader(2 workers) + BatchDecoder / bare",
        ">=",
        0.85,
    ),
    ("batchdecoder_cpu_over_bare", "CPU per image: bare / DataLoader + BatchDecoder", ">=", 0.75),
    ("size_speedup", "size=(112, 112) from 448x448 (1/4 scale) / full decode + resize", ">=", 1.8),
]


# --- the limit: bare decoding processes ----------------------------------------------------------


def _bare_worker(rec, offsets, conn):
    import mmap

    with open(rec, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    lengths = [int.from_bytes(mm[o + 4 : o + 8], "little") & 0x1FFFFFFF for o in offsets.tolist()]
    spans = [(o + 32, o + 8 + n) for o, n in zip(offsets.tolist(), lengths)]
    position = 0
    while True:
        count = conn.recv()
        if count is None:
            return
        for _ in range(count):
            start, end = spans[position % len(spans)]
            cv2.imdecode(np.frombuffer(mm[start:end], np.uint8), cv2.IMREAD_COLOR)
            position += 1
        conn.send(count)


class BareDecoders:
    """N forked processes decoding payloads in a shuffled order on request."""

    def __init__(self, prefix, processes):
        ds = open_dataset(prefix)
        rec = ds.location(0)[0]  # a pack of one shard
        order = epoch_order(len(ds), seed=1)
        context = multiprocessing.get_context("fork")
        self.conns, self.processes = [], []
        for k in range(processes):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_bare_worker, args=(rec, ds.offsets[order[k::processes]], theirs)
            )
            with _forking(True):  # OpenCV's pool, used earlier in this process, at one thread
                process.start()
            theirs.close()  # so that a worker's death is an EOFError here, not a hang
            self.conns.append(ours)
            self.processes.append(process)
        self.decode(processes * 64)  # warm up: mappings, OpenCV

    def decode(self, images):
        share = -(-images // len(self.conns))
        for conn in self.conns:
            conn.send(share)
        return sum(conn.recv() for conn in self.conns)

    def close(self):
        for conn, process in zip(self.conns, self.processes):
            conn.send(None)
            process.join()


# --- contenders: streams of batches ---------------------------------------------------------


def loader_stream(prefix, workers):
    ds = open_dataset(prefix)
    loader = Loader(ds, BATCH, workers=workers, mode="bgr", seed=0)

    def batches():
        for epoch in itertools.count():
            loader.set_epoch(epoch)
            for images, _ in loader:
                yield len(images)

    return batches(), lambda: [w.pid for w in loader._processes], loader.close


def dataloader_stream(prefix, workers, batch_decoder):
    import torch

    if batch_decoder:
        ds = open_dataset(prefix)
        dataset = BatchDecoder(ds, mode="bgr")
        sampler = RankSampler(ds, seed=0)
        kwargs = {
            "batch_size": None,
            "sampler": torch.utils.data.BatchSampler(sampler, BATCH, False),
        }
    else:
        dataset = open_dataset(prefix, decode="bgr")
        sampler = RankSampler(dataset, seed=0)
        kwargs = {"batch_size": BATCH, "sampler": sampler}
    loader = torch.utils.data.DataLoader(
        dataset, num_workers=workers, persistent_workers=True, **kwargs
    )

    def batches():
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            for images, _ in loader:
                yield len(images)

    return batches(), lambda: [w.pid for w in loader._iterator._workers], lambda: None


def measure(pids, fn):
    """Return (wall seconds, CPU seconds of `pids` and this process, CPU seconds of this
    process: the training loop's side) per image of `fn()`."""
    pids = [os.getpid(), *pids]
    cpu, main, start = cpu_seconds(pids), process_cpu_seconds(os.getpid()), time.perf_counter()
    done = fn()
    wall, main = time.perf_counter() - start, process_cpu_seconds(os.getpid()) - main
    return wall / done, (cpu_seconds(pids) - cpu) / done, main / done


def window(stream, images):
    """Consume at least `images` images of `stream`; return how many."""
    done = 0
    while done < images:
        done += next(stream)
    return done


# --- size=: reduced-scale decoding ---------------------------------------------------------------


def ensure_big_pack(prefix_small, log=print):
    """Return the prefix of a pack of 448x448 JPEGs (upscaled from the 112 pack), made once."""
    from rectool.format.writer import pack_image_record
    from rectool.packer.indexing import index_pack
    from rectool.packer.writers import IndexedRecordWriter

    folder = CACHE / "train-448"
    prefix = folder / "faces448"
    rec, idx = Path(f"{prefix}.rec"), Path(f"{prefix}.idx")
    if Path(f"{prefix}.manifest.json").exists():
        return prefix
    log(f"writing {BIG_IMAGES} JPEGs of {BIG_SIDE}x{BIG_SIDE} under {folder} ...")
    folder.mkdir(parents=True, exist_ok=True)
    small = open_dataset(prefix_small)
    tmp_rec, tmp_idx = rec.with_suffix(".rec.tmp"), idx.with_suffix(".idx.tmp")
    with IndexedRecordWriter(tmp_rec, tmp_idx) as writer:
        for i in range(BIG_IMAGES):
            payload, label = small[i]
            image = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR)
            image = cv2.resize(image, (BIG_SIDE, BIG_SIDE), interpolation=cv2.INTER_CUBIC)
            jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
            writer.write(i, pack_image_record(jpeg, label))
    os.replace(tmp_rec, rec)
    os.replace(tmp_idx, idx)
    index_pack(rec, force=True)  # the manifest and binary index the reader maps
    return prefix


def size_figures(prefix, repeats):
    """Return seconds per image: BatchDecoder(size=112) and full decode + resize, in turns."""
    cv2.setNumThreads(1)
    ds = open_dataset(prefix)
    payloads = [ds[i][0] for i in range(len(ds))]
    decoder = BatchDecoder(ds, mode="bgr", size=(SMALL_SIDE, SMALL_SIDE))
    indices = np.arange(len(ds))

    def reduced():
        start = time.perf_counter()
        for k in range(0, len(indices), BATCH):
            decoder[indices[k : k + BATCH]]
        return (time.perf_counter() - start) / len(indices)

    def full():
        start = time.perf_counter()
        side = (SMALL_SIDE, SMALL_SIDE)
        for payload in payloads:
            image = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR)
            cv2.resize(image, side, interpolation=cv2.INTER_AREA)
        return (time.perf_counter() - start) / len(payloads)

    return best_in_turns(repeats, reduced, full)


def run(workers=2, images=8_000, repeats=8, log=print):
    """Run every side; return the rates (images/s), CPU per image and ratios."""
    prefix = ensure_pack(log)
    log(f"starting {workers} bare decoders, Loader, DataLoader x2 ...")
    bare = BareDecoders(prefix, workers)
    sides = {"bare": (lambda: bare.decode(images), lambda: [p.pid for p in bare.processes])}
    closers = [bare.close]
    try:
        for name, make in (
            ("loader", lambda: loader_stream(prefix, workers)),
            ("dataloader", lambda: dataloader_stream(prefix, workers, batch_decoder=False)),
            ("batchdecoder", lambda: dataloader_stream(prefix, workers, batch_decoder=True)),
        ):
            stream, pids, close = make()
            closers.append(close)
            next(stream)  # start-up does not count
            sides[name] = (lambda s=stream: window(s, images), pids)
        wall = dict.fromkeys(sides, float("inf"))
        cpu = dict.fromkeys(sides, float("inf"))
        main = dict.fromkeys(sides, float("inf"))
        for _ in range(repeats):  # in turns, so that a slow spell falls on every side alike
            for name, (fn, pids) in sides.items():
                w, c, m = measure(pids(), fn)
                wall[name], cpu[name] = min(wall[name], w), min(cpu[name], c)
                main[name] = min(main[name], m)
    finally:
        for close in closers:
            close()
    log(f"size=: {BIG_IMAGES} JPEGs of {BIG_SIDE}x{BIG_SIDE} to {SMALL_SIDE}x{SMALL_SIDE} ...")
    reduced, full = size_figures(ensure_big_pack(prefix, log), repeats)
    figures = {
        "workers": workers,
        "batch": BATCH,
        "images_per_window": images,
        "rates": {k: round(1 / v) for k, v in wall.items()},
        "cpu_us_per_image": {k: round(v * 1e6, 1) for k, v in cpu.items()},
        # of which the training loop's process (the rest: the workers)
        "main_cpu_us_per_image": {k: round(v * 1e6, 1) for k, v in main.items()},
        "size_rates": {"reduced": round(1 / reduced), "full_resize": round(1 / full)},
        "size_speedup": full / reduced,
    }
    for name in ("loader", "dataloader", "batchdecoder"):
        figures[f"{name}_over_bare"] = wall["bare"] / wall[name]
        figures[f"{name}_cpu_over_bare"] = cpu["bare"] / cpu[name]
    return figures


def report(figures):
    r = figures["rates"]
    n = figures["workers"]
    c, m = figures["cpu_us_per_image"], figures["main_cpu_us_per_image"]
    lines = [
        f"{n} processes, batches of {figures['batch']}: images/s and CPU µs per image (all "
        "processes of a side; in brackets, the training loop's process), best of the windows; "
        "ratios against bare",
        f"  bare cv2.imdecode processes   {r['bare']:>8,}/s {c['bare']:6.1f} µs ({m['bare']:.1f})",
    ]
    for name, what, target in (
        ("loader", "Loader", 0.9),
        ("batchdecoder", "DataLoader + BatchDecoder", 0.85),
        ("dataloader", "DataLoader, per sample", None),
    ):
        rate, cpu = figures[name + "_over_bare"], figures[name + "_cpu_over_bare"]
        lines.append(
            f"  {what:<29} {r[name]:>8,}/s {c[name]:6.1f} µs ({m[name]:.1f})   rate {rate:.2f}x  "
            f"CPU {cpu:.2f}x" + (f"  (target >= {target})" if target else "")
        )
    lines += [
        f"size=(112, 112) from 448x448, one process: {figures['size_rates']['reduced']:,}/s "
        f"against full decode + resize {figures['size_rates']['full_resize']:,}/s: "
        f"{figures['size_speedup']:.2f}x (target >= 1.8)",
    ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=8_000, help="images per timed window")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    def log(message):
        print(message, file=sys.stderr, flush=True)

    figures = run(args.workers, args.images, args.repeats, log=log)
    print(json.dumps(figures, indent=2) if args.json else report(figures))
    missed = [key for key, _, _, limit in TARGETS if figures[key] < limit]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
