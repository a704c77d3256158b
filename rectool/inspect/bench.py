"""Measure how fast a packed dataset reads, the way training will read it.

`rectool bench` answers "is storage, decoding or my model the bottleneck?": time to open,
raw records/s and MB/s in file order and in random order (storage and page cache), and
decoded images/s in one process and in N worker processes (CPU). Compare the last figure with
the images/s your training step consumes.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dataset.packs import (
    PackDataset,
    open_dataset,
)
from ..reader import DEFAULT_MAX_PIXELS

if TYPE_CHECKING:
    from typing import TypeAlias

    from _typeshed import StrPath

    # What `open_dataset` opens: a manifest, prefix, .rec or folder, or several.
    Source: TypeAlias = StrPath | list[StrPath] | tuple[StrPath, ...]


@dataclass
class Phase:
    """One measurement: how many samples, bytes and seconds."""

    name: str
    samples: int
    bytes: int
    seconds: float
    workers: int = 1

    @property
    def per_second(self) -> float:
        return self.samples / self.seconds if self.seconds else float("inf")

    @property
    def mb_per_second(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else float("inf")

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["samples_per_second"] = round(self.per_second, 1)
        doc["mb_per_second"] = round(self.mb_per_second, 1)
        return doc


@dataclass
class BenchReport:
    """Every phase of `bench_dataset`, plus what was measured."""

    source: str
    samples: int
    layout: str
    open_seconds: float
    phases: list[Phase] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "samples": self.samples,
            "layout": self.layout,
            "open_seconds": round(self.open_seconds, 4),
            "phases": [p.to_json() for p in self.phases],
        }


def _timed_reads(
    ds: PackDataset, order: Iterable[int], deadline: float | None
) -> tuple[int, int, float]:
    """Read `ds[i]` for i in `order` until done or `deadline`; return (samples, bytes, seconds)."""
    total = count = 0
    start = time.perf_counter()
    for i in order:
        image, _ = ds[int(i)]
        total += image.nbytes if isinstance(image, np.ndarray) else len(image)
        count += 1
        if deadline is not None and count % 64 == 0 and time.perf_counter() > deadline:
            break
    return count, total, time.perf_counter() - start


_DATASET: PackDataset | None = None


def _init_worker(source: Source, decode: str, max_pixels: int) -> None:
    global _DATASET
    _DATASET = open_dataset(source, decode=decode, max_pixels=max_pixels)


def _decode_slice(args: tuple[Iterable[int], float | None]) -> tuple[int, int, float]:
    order, deadline = args
    assert _DATASET is not None  # set by _init_worker in this worker process
    return _timed_reads(_DATASET, order, deadline)


def bench_dataset(
    source: Source,
    samples: int = 5000,
    seconds: float = 10.0,
    workers: int | None = None,
    decode: str = "rgb",
    seed: int = 0,
    progress: Callable[[str], object] | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> BenchReport:
    """Measure the read speed of a dataset; return a `BenchReport`.

    Each phase reads at most `samples` samples and stops after about `seconds`. `workers`
    processes (default: all cores) decode in parallel in the last phase, as DataLoader
    workers would. `progress(phase_name)` is called before each phase. Images are decoded as
    `open_dataset(decode=decode, max_pixels=max_pixels)` decodes them.
    """
    workers = workers or os.cpu_count() or 1
    start = time.perf_counter()
    ds = open_dataset(source)
    opened = time.perf_counter() - start
    source_name = (
        os.fspath(source) if not isinstance(source, (list, tuple)) else ", ".join(map(str, source))
    )
    report = BenchReport(source_name, len(ds), ds.layout, opened)
    n = min(samples, len(ds))
    rng = np.random.default_rng(seed)

    def phase(
        name: str, order: Iterable[int], dataset: PackDataset, count_workers: int = 1
    ) -> None:
        if progress is not None:
            progress(name)
        count, total, spent = _timed_reads(dataset, order, time.perf_counter() + seconds)
        report.phases.append(Phase(name, count, total, spent, count_workers))

    with ds:
        phase("raw, file order", range(n), ds)
        phase("raw, random order", rng.permutation(len(ds))[:n], ds)
    with open_dataset(source, decode=decode, max_pixels=max_pixels) as decoded:
        phase(f"decoded {decode}, 1 process", rng.permutation(len(ds))[:n], decoded)
    if workers > 1 and n:
        if progress is not None:
            progress(f"decoded {decode}, {workers} processes")
        order = rng.permutation(len(ds))[:n]
        slices = [(part, None) for part in np.array_split(order, workers)]
        context = multiprocessing.get_context(
            "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        )
        pool = context.Pool(
            workers, initializer=_init_worker, initargs=(source, decode, max_pixels)
        )
        try:
            pool.map(_decode_slice, [(part[:8], None) for part, _ in slices])  # warm up
            began = time.perf_counter()
            deadline = began + seconds
            results = pool.map(_decode_slice, [(part, deadline) for part, _ in slices])
            spent = time.perf_counter() - began
            # Workers leave on the pool's sentinel. `with Pool` would terminate them instead:
            # SIGTERM to a worker that holds the task queue's lock can leave the others, and
            # the pool's own shutdown, waiting on that lock for ever (seen once, under load).
            pool.close()
            pool.join()
        finally:
            pool.terminate()  # after join: nothing left to stop; on an error: stops them
        name = f"decoded {decode}, {workers} processes"
        count, total = sum(r[0] for r in results), sum(r[1] for r in results)
        report.phases.append(Phase(name, count, total, spent, workers))
    return report
