"""What training needs only sometimes: decoded batches, epoch orders, rank views, prefetch.

`rectool reader --training -o rectool_training.py` copies this module verbatim; the copy imports
the reader emitted beside it (`rectool_reader`: a sibling in a package, or on sys.path) and raises
its errors. It reads the reader's `RecordDataset` (or rectool's `PackDataset`) in every worker."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING or __name__ == "rectool.training":  # rectool's own module: its reader
    from .reader import RecordFormatError, RectoolError, check_max_pixels, decode_image
else:  # an emitted copy: the reader emitted beside it, in a package or on sys.path
    try:
        from .rectool_reader import RecordFormatError, RectoolError, check_max_pixels, decode_image
    except ImportError:
        from rectool_reader import RecordFormatError, RectoolError, check_max_pixels, decode_image

if TYPE_CHECKING:
    from collections.abc import Generator, Iterable, Iterator, Sequence

    from numpy.typing import NDArray

    Report = tuple[list[int], list[tuple[int, str]], list[tuple[int, int, str]]]

__all__ = ["BatchDecoder", "Loader", "Prefetcher", "RankSampler", "epoch_order", "prefetch"]

MODES, ON_ERROR, REPLACE_ATTEMPTS = ("bgr", "rgb", "gray"), ("raise", "skip", "replace"), 16


def epoch_order(size: int, epoch: int = 0, seed: int = 0, shuffle: bool = True) -> NDArray[Any]:
    """Return the order of all `size` samples in one epoch (int64), the same on every rank:
    from PCG64 raw bits seeded by (seed, epoch), a stream numpy keeps stable across versions."""
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    if epoch < 0 or seed < 0:
        raise ValueError("epoch and seed must be >= 0")
    bits = np.random.PCG64([seed, epoch]).random_raw(size)
    return np.argsort(bits, kind="stable").astype(np.int64, copy=False)


class RankSampler:
    """The samples one rank reads in an epoch: positions r, r + world_size, ... of the epoch's
    global order (`epoch_order`), cut to a multiple of `world_size` (`drop_last`) or padded by
    repeating its start. `state_dict()`/`load_state_dict()` resume mid-epoch on any world size."""

    def __init__(
        self, size: Any, rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0,
        drop_last: bool = False,
    ) -> None:  # fmt: skip
        size = size if isinstance(size, int) else len(size)  # or a sized object: the dataset
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = self.position = self._yielded = 0

    @property
    def total(self) -> int:
        """Return the length of an epoch's global order after padding or dropping."""
        w = self.world_size
        return self.size // w * w if self.drop_last else -(-self.size // w) * w

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its beginning."""
        self.epoch, self.position, self._yielded = epoch, 0, 0

    def indices(self) -> NDArray[np.int64]:
        """Return the sample indices this rank reads from `position` to the end of the epoch."""
        order = epoch_order(self.size, self.epoch, self.seed, self.shuffle)
        order = order[: self.total] if self.total <= self.size else np.resize(order, self.total)
        return order[min(self.position, self.total) + self.rank :: self.world_size]

    def __len__(self) -> int:
        return max(0, self.total - self.position) // self.world_size

    def __iter__(self) -> Iterator[int]:
        self._yielded = 0  # now, not on the first next()
        return self._count(self.indices())

    def _count(self, indices: NDArray[np.int64]) -> Iterator[int]:
        for start in range(0, len(indices), 1 << 16):  # Python ints a block at a time
            for i in indices[start : start + (1 << 16)].tolist():
                self._yielded += 1
                yield i

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Return where to resume after `consumed` samples of this rank (default: what the last
        iteration yielded; DataLoader workers read ahead: pass the samples trained on)."""
        consumed = self._yielded if consumed is None else consumed
        position = min(self.position + consumed * self.world_size, self.total)
        return {"epoch": self.epoch, "position": position, "seed": self.seed, "size": self.size,
                "shuffle": self.shuffle}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a `state_dict()`: the next iteration reads the rest of that epoch."""
        for name in ("seed", "size", "shuffle"):
            if name in state and state[name] != getattr(self, name):
                raise ValueError(
                    f"state was saved with {name}={state[name]!r}, this sampler has "
                    f"{getattr(self, name)!r}"
                )
        self.epoch, self.position, self._yielded = int(state["epoch"]), int(state["position"]), 0


class Prefetcher:
    """`prefetch(iterable, depth=2, fn=None)`: iterate `iterable` on a background thread, up to
    `depth` items ahead, applying `fn` there (a copy to the GPU overlaps the training step). Its
    errors are raised in the consumer; leaving early (break, `close()`, `with`, garbage
    collection) stops the thread and closes the source."""

    def __init__(self, iterable: Iterable[Any], depth: int = 2, fn: Any = None) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(depth)
        self._stop = threading.Event()
        # The thread must not reference self, or an abandoned Prefetcher would never be freed.
        args = (iterable, fn, self._queue, self._stop)
        self._thread = threading.Thread(target=_produce, args=args, name="rectool-prefetch")
        self._thread.daemon = True
        self._thread.start()

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        kind, value = ("end", StopIteration()) if self._stop.is_set() else self._queue.get()
        if kind == "item":
            return value
        self.close()
        raise value  # the source's error, or StopIteration

    def close(self) -> None:
        """Stop the background thread and drop what it produced ahead."""
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # no join: the thread sees the flag within 50 ms and ends
        getattr(self, "_stop", threading.Event()).set()


prefetch = Prefetcher


def _produce(iterable: Iterable[Any], fn: Any, out: queue.Queue[Any], stop: Any) -> None:
    def put(kind: str, value: Any) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                out.put((kind, value), timeout=0.05)
                return True
        return False

    iterator = None
    try:
        iterator = iter(iterable)
        for item in iterator:
            if not put("item", fn(item) if fn is not None else item):
                return
        put("end", StopIteration())
    except BaseException as exc:  # handed to the consumer, which raises it
        put("error", exc)
    finally:
        getattr(iterator, "close", lambda: None)()


def reduction_factor(source: tuple[int, int], target: tuple[int, int]) -> int:
    """Return the largest libjpeg scale 8, 4 or 2 (else 1) at which `source` covers `target`."""
    (h, w), (th, tw) = source, target
    return next((f for f in (8, 4, 2) if -(-h // f) >= th and -(-w // f) >= tw), 1)


def crop_box(source: tuple[int, int], target: tuple[int, int]) -> tuple[int, int, int, int]:
    """Return (y, x, h, w): the centred region of `source` (h, w) of the target's aspect ratio."""
    (h, w), (th, tw) = source, target
    scale = max(th / h, tw / w)
    ch, cw = min(h, round(th / scale)), min(w, round(tw / scale))
    return (h - ch) // 2, (w - cw) // 2, ch, cw


class _Decoder:
    """Decodes samples of `ds` into batch slots through the reader's guard (`decode_image`: an
    image over `max_pixels` pixels is never decoded); what a worker needs, picklable."""

    def __init__(self, ds: Any, mode: str, size: Any, max_pixels: int, *how: Any) -> None:
        self.ds, self.mode, self.size, self.max_pixels = ds, mode, size, max_pixels
        self.on_error, self.seed = how

    def flag(self, factor: int) -> int:
        """OpenCV's IMREAD_ flag at 1/`factor` scale, BGR or gray (the enum's values: no import)."""
        return {1: 1, 2: 17, 4: 33, 8: 65}[factor] - (self.mode == "gray")

    def decode(self, i: int, flags: Any) -> NDArray[np.uint8]:
        """Return sample `i` decoded with `flags` (or a function of its format and size choosing
        them); raise the reader's RecordFormatError naming its file, key and offset."""
        try:
            return decode_image(self.ds.raw(i)[0], flags, self.max_pixels)
        except RecordFormatError as exc:
            raise type(exc)(exc.reason, *self.ds.location(i)) from None

    def into(self, i: int, out: NDArray[np.uint8]) -> None:
        """Decode sample `i` into `out` (H, W, C) uint8, scaled and cropped per `size` if given."""
        size, rgb, factor = self.size, self.mode == "rgb", [1]
        target = out[:, :, 0] if self.mode == "gray" else out

        def scaled(kind: str, height: int, width: int) -> int:
            if kind == "jpeg":  # the largest JPEG scale still covering the target
                factor[0] = reduction_factor((height, width), size)
            return self.flag(factor[0])

        image = self.decode(i, self.flag(1) if size is None else scaled)
        cv2 = sys.modules["cv2"]  # imported by the reader to decode it
        if size is None:
            if image.shape[:2] != out.shape[:2]:
                path, offset, key = self.ds.location(i)
                raise RectoolError(
                    f"{path}: key {key}, byte offset {offset}: image of shape {image.shape[:2]}, "
                    f"not the first image's {out.shape[:2]}: pass size=(H, W) to resize them"
                )
            cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=out) if rgb else np.copyto(target, image)
            return
        if factor[0] > 1 and (image.shape[0] < size[0] or image.shape[1] < size[1]):
            image = self.decode(i, self.flag(1))  # EXIF turned it: decode in full
        y, x, h, w = crop_box(image.shape[:2], size)
        image = image[y : y + h, x : x + w]
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if rgb else image
        if (h, w) == size:
            np.copyto(target, image)
        else:
            how = cv2.INTER_AREA if h >= size[0] and w >= size[1] else cv2.INTER_LINEAR
            cv2.resize(image, size[::-1], dst=target, interpolation=how)

    def fill(self, indices: Any, images: Any) -> Report:
        """Decode samples `indices` into `images[:n]`; return (taken, skipped, replaced): the n
        samples written, (index, why) and (index, substitute drawn from the seed, why)."""
        taken, skipped, replaced = list[int](), list[tuple[int, str]](), []
        for i in map(int, indices):
            try:
                self.into(i, images[len(taken)])
                taken.append(i)
                continue
            except RecordFormatError as exc:
                if self.on_error == "raise":
                    raise
                message = str(exc)
            if self.on_error == "skip":
                skipped.append((i, message))
                continue
            for attempt in range(REPLACE_ATTEMPTS):
                draw = np.random.Generator(np.random.PCG64([self.seed, i, attempt]))
                r = int(draw.integers(len(self.ds)))
                with contextlib.suppress(RecordFormatError):
                    if r != i:
                        self.into(r, images[len(taken)])
                        break
            else:
                raise RecordFormatError(f"{message}; and {REPLACE_ATTEMPTS} substitutes failed too")
            taken.append(r)
            replaced.append((i, r, message))
        return taken, skipped, replaced


class _Batches:
    """What `Loader` and `BatchDecoder` share: their options checked, the images' shape, the
    labels' dtype (int64 when every label is a whole number, else float32), `stats`."""

    def __init__(self, ds: Any, size: Any, mode: Any, on_error: str, seed: int, budget: Any):
        mode = mode or (ds.decode if getattr(ds, "decode", None) in MODES else "rgb")
        if mode not in MODES or on_error not in ON_ERROR:
            raise ValueError(f"mode must be one of {MODES}, on_error one of {ON_ERROR}")
        if size is not None and [type(v) is int and v > 0 for v in size] != [True, True]:
            raise ValueError(f"size must be (height, width) in pixels, not {size!r}")
        budget = check_max_pixels(getattr(ds, "max_pixels", None) if budget is None else budget)
        if len(ds) == 0 or (labels := ds.labels).dtype == object:
            raise RectoolError(f"{ds!r}: no samples, or labels of several widths, to batch")
        finite = labels.ndim == 1 and np.isfinite(labels).all()  # whole numbers: class indices
        self._dtype = np.int64 if finite and (labels == np.trunc(labels)).all() else np.float32
        self.mode, self.size = mode, size and tuple(size)
        self._decoder = _Decoder(ds, mode, self.size, budget, on_error, seed)
        self.shape = (*self.size, 1 if mode == "gray" else 3) if size else self._first_shape()
        self.stats = {"batches": 0, "samples": 0, "skipped": 0, "replaced": 0}

    def _first_shape(self) -> tuple[int, ...]:
        """Return the (H, W, C) of the first decodable image of the first 100."""
        first = None
        for i in range(min(len(self._decoder.ds), 100)):
            try:
                image = self._decoder.decode(i, self._decoder.flag(1))
                return image.shape if image.ndim == 3 else (*image.shape, 1)
            except RecordFormatError as exc:
                first = first or exc
        raise first  # type: ignore[misc]  # set: the dataset is not empty

    def _labels(self, taken: list[int]) -> NDArray[Any]:
        return self._decoder.ds.labels[np.asarray(taken, np.int64)].astype(self._dtype)

    def _count(self, report: Report) -> None:
        for name, done in zip(("samples", "skipped", "replaced"), report):
            self.stats[name] += len(done)  # type: ignore[arg-type]  # each a list
        self.stats["batches"] += 1


@contextlib.contextmanager
def _forking(forked: bool) -> Iterator[None]:
    """Fork with OpenCV's thread pool at one thread, then give the parent its threads back: a
    child forked beside the pool's threads inherits their condition variables in use (a hang)."""
    cv2 = sys.modules.get("cv2") if forked else None
    threads = cv2.getNumThreads() if cv2 else 0
    if cv2:
        cv2.setNumThreads(1)
    try:
        yield
    finally:
        if cv2:
            cv2.setNumThreads(threads)


def _portable(exc: BaseException) -> tuple[Any, tuple[Any, ...]]:
    """Return (class, arguments) to raise a worker's error again: the reader's errors whole
    (a pickled RecordFormatError keeps its message only), others as text."""
    if isinstance(exc, RecordFormatError):
        return type(exc), (exc.reason, exc.path, exc.offset, exc.key)
    if isinstance(exc, RectoolError):
        return type(exc), exc.args
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return RectoolError, (f"in a loader worker: {text}",)


def _work(decoder: _Decoder, ring: Any, shape: Any, conn: Any, parent: int, forked: bool) -> None:
    """A worker: decode each batch it is sent, (slot, indices), into the ring; answer."""
    try:
        if not forked:  # a forked worker inherits one thread (see _forking)
            __import__("cv2").setNumThreads(1)  # one process per core already
        images = np.frombuffer(ring, np.uint8).reshape(shape)
        answer: Any = ("ok", None)  # the first says it started, then each a batch's report
        while True:
            decoder.ds.close(mapped=False)  # pread, nothing mapped; a batch's files shut after it
            conn.send(answer)
            while not conn.poll(1.0):  # wake now and then to notice a parent that died
                if os.getppid() != parent:
                    return
            task = conn.recv()
            if task is None:
                return
            try:
                answer = ("ok", decoder.fill(task[1], images[task[0]]))
            except Exception as exc:
                answer = ("error", _portable(exc))
    except (EOFError, OSError, KeyboardInterrupt):  # the parent is gone, or interrupted
        return
    except Exception as exc:  # while starting (OpenCV missing...)
        conn.send(("error", _portable(exc)))


class Loader(_Batches):
    """Decoded batches of this rank's share of epoch `set_epoch(e)`, in the order of
    `loader.sampler` (a `RankSampler`, or the dataset's `rank_sampler`), from `workers` processes
    that decode into a ring of slots in shared memory: images uint8 (n, H, W, C) in `mode`
    viewing a slot, valid until the next batch is asked for (`copy=True` copies them); fresh
    labels, int64 when all are whole numbers, else float32 (n,) or (n, k). `size=(H, W)` covers
    H x W keeping the aspect ratio, then crops the centre (JPEGs decoded at 1/2, 1/4, 1/8 scale
    when that still covers it). A bad sample (damaged, undecodable, cut, or over `max_pixels`)
    raises the reader's RecordFormatError (`on_error="raise"`), is dropped ("skip") or replaced
    ("replace"); see `stats`, `bad_samples`. Workers run from the first iteration to `close()`
    and exit if this process dies; under spawn this module must be importable by name."""

    def __init__(
        self, ds: Any, batch_size: int, *, workers: int = 2, shuffle: bool = True, seed: int = 0,
        rank: int = 0, world_size: int = 1, drop_last: bool = False,
        size: Sequence[int] | None = None, mode: str | None = None, on_error: str = "raise",
        copy: bool = False, tensors: bool = False, slots: int | None = None,
        start_method: str | None = None, max_pixels: int | None = None,
    ) -> None:  # fmt: skip
        if batch_size < 1 or workers < 1 or (slots is not None and slots < 2):
            raise ValueError("batch_size and workers must be >= 1, slots >= 2")
        if tensors and "torch" not in sys.modules:
            raise ValueError("tensors=True needs torch imported first")
        super().__init__(ds, size, mode, on_error, seed, max_pixels)
        self.batch_size, self.workers, self.drop_last = batch_size, workers, drop_last
        self.copy, self.tensors, self.start_method = copy, tensors, start_method
        self.slots = slots or 2 * workers + 1
        sampler = getattr(ds, "rank_sampler", RankSampler)
        self.sampler = sampler(len(ds), rank, world_size, shuffle, seed)
        self.bad_samples: list[tuple[int, int | None, str]] = []
        self._processes: list[Any] = []
        self._conns: list[Any] = []
        self._ring: Any = None  # the slots' images, while the workers run
        self._active: Generator[tuple[Any, Any]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch `epoch` from its start next (its own seeded order)."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        """Return the number of batches of the next iteration."""
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        if self._active is not None:
            self._active.close()  # one pass at a time: finish the previous one first
        self._active = self._batches()
        return self._active

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_processes", None):
            self.close()

    def close(self) -> None:
        """Stop the workers and release the shared memory (batches still held stay readable)."""
        if self._active is not None:
            self._active.close()
            self._active = None
        self._stop()

    def _start(self) -> None:
        import multiprocessing

        context: Any = multiprocessing.get_context(self.start_method)
        forked = context.get_start_method() == "fork"
        shape = (self.slots, self.batch_size, *self.shape)
        # Shared memory with no name (multiprocessing's heap): a killed run leaves nothing.
        ring = context.RawArray("B", int(np.prod(shape)))
        self._ring = np.frombuffer(ring, np.uint8).reshape(shape)
        try:
            for _ in range(self.workers):
                ours, theirs = context.Pipe()
                args = (self._decoder, ring, shape, theirs, os.getpid(), forked)
                process = context.Process(target=_work, args=args, name="rectool-loader")
                process.daemon = True
                with _forking(forked):
                    process.start()
                theirs.close()
                self._processes.append(process)
                self._conns.append(ours)
            for w in range(self.workers):
                self._receive(w)  # the worker has mapped the ring
        except BaseException:
            self._stop()  # not close(): this runs inside the pass being started
            raise

    def _stop(self) -> None:
        for process in self._processes:
            process.terminate()  # they hold nothing to clean up: the ring has no name
        for process, conn in zip(self._processes, self._conns):
            process.join()
            conn.close()
        self._processes, self._conns, self._ring = [], [], None  # views of it keep it mapped

    def _receive(self, w: int) -> Any:
        """Return worker `w`'s answer; raise its error, or if it ended, stop them all and say so."""
        conn, process = self._conns[w], self._processes[w]
        try:
            while not conn.poll(0.5):
                if not process.is_alive():
                    raise EOFError
            kind, answer = conn.recv()
        except (EOFError, OSError):  # the worker ended
            process.join(timeout=1)
            self._stop()
            raise RectoolError(
                f"loader worker {w} (pid {process.pid}) died with exit code {process.exitcode}: "
                "out of memory, killed, or started by spawn from a training script that does "
                "not start its work under `if __name__ == '__main__':`"
            ) from None
        if kind == "error":
            raise answer[0](*answer[1])
        return answer

    def _batches(self) -> Generator[tuple[Any, Any]]:
        if not self._processes:
            self._start()
        indices, size, count = self.sampler.indices(), self.batch_size, len(self)
        free, sent, done = list(range(self.slots)), dict[int, int](), 0  # batch -> its slot
        try:
            while done < count:
                while len(sent) < self.slots and done + len(sent) < count:
                    b = done + len(sent)
                    sent[b] = free.pop()
                    try:  # batch b goes to worker b % workers, which answers in order
                        self._conns[b % self.workers].send((sent[b], indices[b * size :][:size]))
                    except OSError:  # the worker is gone: _receive says how
                        self._receive(b % self.workers)
                slot, report = sent.pop(done), self._receive(done % self.workers)
                done += 1
                try:
                    yield self._deliver(slot, report)
                finally:
                    free.append(slot)  # the consumer asked for the next batch: reuse it
        finally:
            for b in sorted(sent) if self._processes else ():  # leave the workers in step
                with contextlib.suppress(Exception):  # an error in a batch nobody will see
                    self._receive(b % self.workers)

    def _deliver(self, slot: int, report: Report) -> tuple[Any, Any]:
        self._count(report)
        taken, skipped, replaced = report
        self.bad_samples += [*((i, None, why) for i, why in skipped), *replaced]
        del self.bad_samples[1000:]
        images, labels = self._ring[slot, : len(taken)], self._labels(taken)
        images = images.copy() if self.copy else images
        if self.tensors:
            torch = sys.modules["torch"]  # imported by the caller: checked by __init__
            images, labels = torch.from_numpy(images), torch.from_numpy(labels)
        return images, labels


class BatchDecoder(_Batches):
    """`batches[indices] -> (images, labels)`, as `Loader` decodes them, for torch's DataLoader
    (`DataLoader(batches, batch_size=None, sampler=BatchSampler(RankSampler(ds), 256, False))`).

    Each DataLoader worker decodes into its own ring of `slots` batches of shared tensors, which
    travels to the training loop once: a batch's images stay valid until its worker reuses the
    slot, `slots - prefetch_factor - 1` of its batches later (5 by default), enough for
    `prefetch` and `pin_memory` (`.clone()` what you keep). `slots=0`: a new one a batch."""

    def __init__(
        self, ds: Any, *, size: Sequence[int] | None = None, mode: str | None = None,
        on_error: str = "raise", seed: int = 0, slots: int = 8, max_pixels: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__(ds, size, mode, on_error, seed, max_pixels)
        self.slots, self._next_slot = slots, 0
        self._ring: Any = None  # made in a worker

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ring": None}  # each worker makes its own

    def __len__(self) -> int:  # the number of samples: indices range over the dataset
        return len(self._decoder.ds)

    def __getitem__(self, indices: Sequence[int] | NDArray[np.integer[Any]]) -> Any:
        indices, torch = np.asarray(indices, np.int64).reshape(-1), sys.modules.get("torch")
        n, shape = len(indices), (len(indices), *self.shape)
        if torch is None or torch.utils.data.get_worker_info() is None:  # not in a worker
            report = self._decoder.fill(indices, images := np.empty(shape, np.uint8))
            self._count(report)
            return images[: len(report[0])], self._labels(report[0])
        if not self.slots or self._ring is None or n > self._ring.shape[1]:
            self._ring = torch.empty((self.slots or 1, *shape), dtype=torch.uint8).share_memory_()
            self._ring_key = (os.getpid(), next(_RING_NUMBERS)) if self.slots else None
        slot, self._next_slot = self._next_slot % len(self._ring), self._next_slot + 1
        self._decoder.ds.close(mapped=False)  # read by pread, as a Loader worker reads
        report = self._decoder.fill(indices, self._ring[slot, :n].numpy())
        self._count(report)
        return _Kept(self._ring, self._ring_key, slot, len(report[0]), self._labels(report[0]))


class _Kept:
    """A batch in a worker's ring (`images, labels = batch`), sent as its ring, or once the
    ring has been sent, the ring's key (torch sends a tensor's descriptor through a socket)."""

    def __init__(self, *parts: Any) -> None:  # ring, key, slot, n, labels
        self.parts = parts

    def __iter__(self) -> Iterator[Any]:
        ring, _, slot, n, labels = self.parts
        return iter((ring[slot, :n], sys.modules["torch"].from_numpy(labels)))

    def __reduce__(self) -> tuple[Any, ...]:
        ring, key, *rest = self.parts
        ring = None if key is not None and key in _SENT else ring  # sent: its key will do
        _SENT.add(key)
        return _unkept, (ring, key, *rest)


# In a worker: ring numbers, the keys of rings sent; in the training loop: rings, latest last.
_RING_NUMBERS, _SENT, _RINGS = itertools.count(), set[Any](), dict[Any, Any]()


def _unkept(ring: Any, key: Any, slot: int, n: int, labels: Any) -> tuple[Any, Any]:
    ring = _RINGS.pop(key, None) if ring is None else ring  # key None: a ring of one batch
    if ring is None:
        raise RectoolError(f"a batch names a ring of worker {key[0]} that never arrived")
    if key is not None:  # kept, most recent last: later batches name it by its key
        _RINGS[key] = ring
        if len(_RINGS) > 64:  # rings of workers long gone
            del _RINGS[next(iter(_RINGS))]
    return ring[slot, :n], sys.modules["torch"].from_numpy(labels)
