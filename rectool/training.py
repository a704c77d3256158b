"""What training needs only sometimes: decoded batches, epoch orders, rank views, prefetch.

`rectool reader --training -o rectool_training.py` copies this module verbatim; the copy
imports the reader emitted beside it as `rectool_reader` (a sibling in a package, or by that
name on sys.path); inside rectool it is `rectool.training` over `rectool.reader`. It raises
the reader's own errors. Standard library and numpy; OpenCV is imported to decode.

    from rectool_reader import open_dataset
    from rectool_training import Loader, prefetch

    with Loader(open_dataset("out/faces"), 256, workers=8, size=(112, 112)) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for images, labels in prefetch(loader, fn=to_gpu):  # uint8 NHWC, int64
                ...

`Loader` and `BatchDecoder` read the reader's `RecordDataset` or one built on it (rectool's
`PackDataset`), whose index and labels are mapped files that every worker shares.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import sys
import tempfile
import threading
import traceback
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING or __name__ == "rectool.training":  # rectool's own module: its reader
    from .reader import DEFAULT_MAX_PIXELS, RecordFormatError, RectoolError, imdecode
else:  # an emitted copy: the reader emitted beside it, in a package or on sys.path
    try:
        from .rectool_reader import DEFAULT_MAX_PIXELS, RecordFormatError, RectoolError, imdecode
    except ImportError:
        from rectool_reader import DEFAULT_MAX_PIXELS, RecordFormatError, RectoolError, imdecode

if TYPE_CHECKING:
    from collections.abc import Generator, Iterable, Iterator, Sequence

    from numpy.typing import NDArray

    Report = tuple[list[int], list[tuple[int, str]], list[tuple[int, int, str]]]

__all__ = ["BatchDecoder", "Loader", "Prefetcher", "RankSampler", "epoch_order", "prefetch"]

MODES, ON_ERROR, REPLACE_ATTEMPTS = ("bgr", "rgb", "gray"), ("raise", "skip", "replace"), 16


# --- sampling: epochs, ranks, resuming ---------------------------------------------------------


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
    """The samples one rank reads in an epoch: an equal share of one global order.

    Every epoch has one global order (`epoch_order`), whatever the number of ranks, cut to a
    multiple of `world_size` (`drop_last=True`) or padded by repeating its start. Rank r reads
    positions r, r + world_size, ... of it. `state_dict()` says how far the epoch got (`epoch`,
    `position` in the global order); `load_state_dict()` resumes there, on any number of ranks.
    """

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
        """Return {epoch, position, ...}: where to resume after `consumed` samples of this rank
        (default: what the last iteration yielded; with DataLoader workers, which read ahead,
        pass the samples actually trained on)."""
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


# --- prefetching on a background thread -------------------------------------------------------


class Prefetcher:
    """`prefetch(iterable, depth=2, fn=None)`: iterate `iterable` on a background thread, up to
    `depth` items ahead, applying `fn` there (a copy to the GPU, say, which then overlaps the
    training step). An exception of the source or `fn` is raised again in the consumer, with its
    traceback. Leaving early (break, an exception, `close()`, `with`, garbage collection) stops
    the thread and closes the source iterator.
    """

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
        kind, value = ("end", None) if self._stop.is_set() else self._queue.get()
        if kind == "item":
            return value
        self.close()
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the background thread and drop what it produced ahead."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass

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
        put("end", None)
    except BaseException as exc:  # handed to the consumer, which raises it
        put("error", exc)
    finally:
        getattr(iterator, "close", lambda: None)()


# --- a batch: each sample decoded into its slot, bad ones skipped or replaced -----------------


def reduction_factor(source: tuple[int, int], target: tuple[int, int]) -> int:
    """Return the largest libjpeg scale 8, 4 or 2 at which `source` (h, w) still covers `target`
    (1 when the source is less than twice the target in either dimension)."""
    (h, w), (th, tw) = source, target
    return next((f for f in (8, 4, 2) if -(-h // f) >= th and -(-w // f) >= tw), 1)


def crop_box(source: tuple[int, int], target: tuple[int, int]) -> tuple[int, int, int, int]:
    """Return (y, x, h, w): the centred region of `source` (h, w) with the target's aspect ratio,
    what "scale to cover the target, then centre-crop" keeps."""
    (h, w), (th, tw) = source, target
    scale = max(th / h, tw / w)
    ch, cw = min(h, round(th / scale)), min(w, round(tw / scale))
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def _cv2() -> Any:
    try:
        import cv2
    except ImportError:
        raise RectoolError("decoding needs OpenCV (opencv-python-headless)") from None
    return cv2


class _Decoder:
    """Decodes samples of `ds` into batch slots through the reader's guard (`imdecode`: an image
    declaring more than `max_pixels` pixels is never decoded); what a worker needs, picklable."""

    def __init__(self, ds: Any, mode: str, size: Any, max_pixels: int, *how: Any) -> None:
        self.ds, self.mode, self.size, self.max_pixels = ds, mode, size, max_pixels
        self.on_error, self.seed = how

    def flag(self, factor: int) -> int:
        """Return OpenCV's flag decoding at 1/`factor` scale, in BGR (or gray, 2-D)."""
        kind = "GRAYSCALE" if self.mode == "gray" else "COLOR"
        return getattr(
            _cv2(), f"IMREAD_REDUCED_{kind}_{factor}" if factor > 1 else "IMREAD_" + kind
        )

    def decode(self, i: int, flags: Any) -> NDArray[np.uint8]:
        """Return sample `i` decoded with `flags` (or a function of its format and size choosing
        them); raise the reader's RecordFormatError naming its file, key and offset."""
        try:
            return imdecode(self.ds.raw(i)[0], flags, self.max_pixels)
        except RecordFormatError as exc:
            raise type(exc)(exc.reason, *self.ds.location(i)) from None

    def into(self, i: int, out: NDArray[np.uint8]) -> None:
        """Decode sample `i` into `out` (H, W, C) uint8, scaled and cropped per `size` if given."""
        cv2, size, rgb = _cv2(), self.size, self.mode == "rgb"
        target = out[:, :, 0] if self.mode == "gray" else out
        if size is None:
            image = self.decode(i, self.flag(1))
            if image.shape[:2] != out.shape[:2]:
                path, offset, key = self.ds.location(i)
                raise RectoolError(
                    f"{path}: key {key}, byte offset {offset}: image of shape {image.shape[:2]}, "
                    f"but the batch holds {out.shape[:2]} (the shape of the first image): pass "
                    "size=(H, W) to resize every image to one shape"
                )
            cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=out) if rgb else np.copyto(target, image)
            return
        factor = [1]

        def scaled(kind: str, height: int, width: int) -> int:
            if kind == "jpeg":  # the largest JPEG scale still covering the target
                factor[0] = reduction_factor((height, width), size)
            return self.flag(factor[0])

        image = self.decode(i, scaled)
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
        samples written, (index, message) pairs and (index, substitute, message) triples. A
        substitute is drawn from (seed, index, attempt): the same in every run."""
        taken: list[int] = []
        skipped, replaced = [], []
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
                raise RecordFormatError(
                    f"{message}; and {REPLACE_ATTEMPTS} replacements drawn for it could not "
                    "be decoded either"
                )
            taken.append(r)
            replaced.append((i, r, message))
        return taken, skipped, replaced


class _Batches:
    """What `Loader` and `BatchDecoder` share: their options checked, the images' shape, the
    labels' dtype (int64 when every label is a whole number, else float32), `stats`."""

    def __init__(self, ds: Any, size: Any, mode: Any, on_error: str, seed: int, budget: Any):
        mode = mode or (ds.decode if getattr(ds, "decode", None) in MODES else "rgb")
        if mode not in MODES or on_error not in ON_ERROR:
            raise ValueError(
                f"need mode in {MODES}, on_error in {ON_ERROR}, not {mode}, {on_error}"
            )
        if size is not None and [type(v) is int and v > 0 for v in size] != [True, True]:
            raise ValueError(f"size must be (height, width) in pixels, not {size!r}")
        budget = getattr(ds, "max_pixels", DEFAULT_MAX_PIXELS) if budget is None else budget
        if type(budget) is not int or budget < 1:
            raise ValueError(f"max_pixels must be an int >= 1, not {budget!r}")
        labels = ds.labels
        if len(ds) == 0 or labels.dtype == object:
            raise RectoolError(f"{ds!r}: no samples, or labels of several widths, to batch")
        whole = (
            labels.ndim == 1 and np.isfinite(labels).all() and (labels == np.trunc(labels)).all()
        )
        self.mode, self.size, self._dtype = (
            mode,
            size and tuple(size),
            np.int64 if whole else np.float32,
        )
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
            self.stats[name] += len(done)
        self.stats["batches"] += 1


# --- Loader: worker processes that fill a ring of batch slots in shared memory ----------------


class _Ring:
    """`slots` batch slots of images, (slots, batch, H, W, C) uint8, in a shared file with no
    name (a memfd, or a file unlinked at once): a killed run leaves nothing behind. Workers map
    its descriptor, inherited under fork, duplicated into them under spawn (`__reduce__`)."""

    def __init__(self, spec: tuple[Any, ...], fd: int | None = None) -> None:
        self.spec, size = spec, int(spec[0] * spec[1] * np.prod(spec[2]))
        if fd is None and hasattr(os, "memfd_create"):
            fd = os.memfd_create("rectool-loader")
            os.ftruncate(fd, size)
        elif fd is None:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            fd, path = tempfile.mkstemp(prefix=f"rectool-loader-{os.getpid()}-", dir=shm)
            os.unlink(path)
            os.ftruncate(fd, size)
        self.fd: int | None = fd
        self._mm = mmap.mmap(fd, size)
        self.images = np.frombuffer(self._mm, np.uint8).reshape(spec[0], spec[1], *spec[2])

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.reduction import DupFd

        return _Ring._mapped, (self.spec, DupFd(self.fd))

    @staticmethod
    def _mapped(spec: tuple[Any, ...], dup: Any) -> _Ring:
        return _Ring(spec, dup.detach())

    def close(self, mapping: bool = True) -> None:
        """Close the descriptor, and unless the caller still views a batch, the mapping."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if mapping:
            with contextlib.suppress(BufferError):  # a batch still viewed: its last view unmaps
                self._mm.close()


@contextlib.contextmanager
def _forking(forked: bool) -> Iterator[None]:
    """Fork with OpenCV's thread pool at one thread, then give the parent its threads back: a
    child forked while the pool's threads exist inherits their condition variables in use, and
    its first `cv2.setNumThreads` blocks forever."""
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
    """Return (class, arguments) to raise a worker's error again in the loop: the reader's own
    errors whole (pickling would keep a RecordFormatError's message only), others as text."""
    if isinstance(exc, RecordFormatError):
        return type(exc), (exc.reason, exc.path, exc.offset, exc.key)
    if isinstance(exc, RectoolError):
        return type(exc), exc.args
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return RectoolError, (f"in a loader worker: {text}",)


def _work(decoder: _Decoder, ring: _Ring, conn: Any, parent: int, forked: bool) -> None:
    """A worker: decode each batch it is sent, (slot, indices), into the ring; answer with the
    report, or the error."""
    try:
        if not forked:  # a forked worker inherits one thread (see _forking)
            _cv2().setNumThreads(1)  # one process per core already
        ring.close(mapping=False)  # mapped: the descriptor is not needed any more
        conn.send(("ok", None))
        while True:
            while not conn.poll(1.0):  # wake now and then to notice a parent that died
                if os.getppid() != parent:
                    return
            task = conn.recv()
            if task is None:
                return
            try:
                conn.send(("ok", decoder.fill(task[1], ring.images[task[0]])))
            except Exception as exc:
                conn.send(("error", _portable(exc)))
    except (EOFError, OSError, KeyboardInterrupt):  # the parent is gone, or interrupted
        return
    except Exception as exc:  # while starting (OpenCV missing...)
        conn.send(("error", _portable(exc)))


class _WorkerDied(RectoolError):
    """A worker process ended while a batch was due from it."""


class Loader(_Batches):
    """Decoded batches from `workers` processes through reused shared memory, in order.

    `for images, labels in loader` yields this rank's share of epoch `set_epoch(e)` in batches:
    images uint8 (n, H, W, C) in `mode` (default the dataset's decode mode, else "rgb"), labels
    int64 (n,) when every label is a whole number, else float32 (n,) or (n, k).

    - Order: `RankSampler(len(ds), rank, world_size, shuffle, seed)` (`loader.sampler`, which
      resumes), or the dataset's own `rank_sampler`; a partial last batch unless `drop_last`.
    - Images view a slot that is reused: valid until the next batch is asked for (`copy=True`
      copies them). Labels are fresh. `tensors=True`: `torch.from_numpy` views.
    - `size=(H, W)` scales each image to cover H x W keeping its aspect ratio and crops the
      centre (a JPEG at least twice the target is decoded at 1/2, 1/4 or 1/8 scale); without
      it every image must have the shape of the first.
    - A bad sample (a damaged record, bytes that do not decode or are cut, a header declaring
      over `max_pixels` pixels, refused before any allocation) raises the reader's
      RecordFormatError naming file, key and offset (`on_error="raise"`), is dropped ("skip")
      or replaced by a sample drawn from (seed, index) ("replace"); see `stats`, `bad_samples`.
    - Workers start on the first iteration and stay until `close()` (or `with`); they exit if
      this process dies. Any `start_method`; under spawn this module must be importable.
    """

    def __init__(
        self, ds: Any, batch_size: int, *, workers: int = 2, shuffle: bool = True, seed: int = 0,
        rank: int = 0, world_size: int = 1, drop_last: bool = False,
        size: Sequence[int] | None = None, mode: str | None = None, on_error: str = "raise",
        copy: bool = False, tensors: bool = False, slots: int | None = None,
        start_method: str | None = None, max_pixels: int | None = None,
    ) -> None:  # fmt: skip
        if batch_size < 1 or workers < 1 or (slots is not None and slots < 2):
            raise ValueError("batch_size and workers must be >= 1, slots >= 2")
        super().__init__(ds, size, mode, on_error, seed, max_pixels)
        self.batch_size, self.workers, self.drop_last = batch_size, workers, drop_last
        self.copy, self.tensors, self.start_method = copy, tensors, start_method
        self.slots = slots or 2 * workers + 1
        sampler = getattr(ds, "rank_sampler", RankSampler)
        self.sampler = sampler(len(ds), rank, world_size, shuffle, seed)
        self.bad_samples: list[tuple[int, int | None, str]] = []
        self._processes: list[Any] = []
        self._conns: list[Any] = []
        self._ring: Any = None  # while the workers run
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
        self._ring = _Ring((self.slots, self.batch_size, self.shape))
        try:
            for _ in range(self.workers):
                ours, theirs = context.Pipe()
                args = (self._decoder, self._ring, theirs, os.getpid(), forked)
                process = context.Process(target=_work, args=args, name="rectool-loader")
                process.daemon = True
                with _forking(forked):
                    process.start()
                theirs.close()
                self._processes.append(process)
                self._conns.append(ours)
            for w in range(self.workers):
                self._receive(w)  # the worker has mapped the ring
            self._ring.close(mapping=False)
        except _WorkerDied as exc:
            raise RectoolError(
                f"{exc} while starting; under the spawn start method the training script "
                "must start its work under `if __name__ == '__main__':`"
            ) from None
        except BaseException:
            self._stop()  # not close(): this runs inside the pass being started
            raise

    def _stop(self) -> None:
        for process in self._processes:
            process.terminate()  # they hold nothing to clean up: the ring has no name
        for process, conn in zip(self._processes, self._conns):
            process.join()
            conn.close()
        self._processes, self._conns = [], []
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    def _receive(self, w: int) -> Any:
        """Return worker `w`'s next answer; raise its error, or `_WorkerDied` if it ended (then
        every worker is stopped, and the next pass starts new ones)."""
        conn, process = self._conns[w], self._processes[w]
        try:
            while not conn.poll(0.5):
                if not process.is_alive():
                    raise EOFError
            kind, answer = conn.recv()
        except (EOFError, OSError):  # the worker ended
            process.join(timeout=1)
            self._stop()
            raise _WorkerDied(
                f"loader worker {w} (pid {process.pid}) died with exit code "
                f"{process.exitcode} (out of memory, or killed?)"
            ) from None
        if kind == "error":
            raise answer[0](*answer[1])
        return answer

    def _batches(self) -> Generator[tuple[Any, Any]]:
        if not self._processes:
            self._start()
        indices, size, count = self.sampler.indices(), self.batch_size, len(self)
        free, sent, done = list(range(self.slots)), {}, 0  # sent: batch number -> its slot
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
        except _WorkerDied as exc:
            sent.clear()  # nothing more comes from stopped workers
            raise RectoolError(str(exc)) from None
        finally:
            for b in sorted(sent):  # leave the workers idle and in step
                with contextlib.suppress(Exception):  # an error in a batch nobody will see
                    self._receive(b % self.workers)

    def _deliver(self, slot: int, report: Report) -> tuple[Any, Any]:
        self._count(report)
        taken, skipped, replaced = report
        self.bad_samples += [(i, None, why) for i, why in skipped] + replaced
        del self.bad_samples[1000:]
        images, labels = self._ring.images[slot, : len(taken)], self._labels(taken)
        images = images.copy() if self.copy else images
        if self.tensors:
            torch: Any = sys.modules.get("torch")
            if torch is None:
                raise ValueError("tensors=True needs torch imported first")
            images, labels = torch.from_numpy(images), torch.from_numpy(labels)
        return images, labels


# --- BatchDecoder: one batch per call, inside torch's DataLoader ------------------------------


class BatchDecoder(_Batches):
    """`batches[indices] -> (images, labels)`: one decoded batch per call, for torch's DataLoader.

    Give the DataLoader batches of indices and no batching of its own::

        batches = BatchDecoder(ds, size=(112, 112))
        sampler = torch.utils.data.BatchSampler(RankSampler(ds, rank, world_size), 256, False)
        loader = DataLoader(batches, batch_size=None, sampler=sampler, num_workers=8)

    Images, labels, `size`, `mode`, `on_error`, `seed` and `max_pixels` as in `Loader`. In a
    DataLoader worker, each worker decodes into its own ring of `slots` batches of shared
    tensors, which the training loop maps once, not a new shared segment per batch. A batch's
    images stay valid until that worker reuses the slot, at least `slots - prefetch_factor - 1`
    of its batches later (5 by default): `prefetch` and `pin_memory` are safe, images kept
    longer must be `.clone()`d. `slots=0` allocates each batch anew instead. Outside a worker,
    each call returns new numpy arrays. `stats` counts this process's batches.
    """

    def __init__(
        self, ds: Any, *, size: Sequence[int] | None = None, mode: str | None = None,
        on_error: str = "raise", seed: int = 0, slots: int = 8, max_pixels: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__(ds, size, mode, on_error, seed, max_pixels)
        self.slots, self._ring, self._next_slot = slots, None, 0  # the ring: made in a worker

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ring": None}  # each worker makes its own

    def __len__(self) -> int:
        """Return the number of samples (indices range over the dataset)."""
        return len(self._decoder.ds)

    def __getitem__(self, indices: Sequence[int] | NDArray[np.integer[Any]]) -> Any:
        indices, torch = np.asarray(indices, np.int64).reshape(-1), sys.modules.get("torch")
        n, shape = len(indices), (len(indices), *self.shape)
        if torch is None or torch.utils.data.get_worker_info() is None:  # not in a worker
            report = self._decoder.fill(indices, images := np.empty(shape, np.uint8))
            self._count(report)
            return images[: len(report[0])], self._labels(report[0])
        if self.slots and (self._ring is None or n > self._ring.shape[1]):
            self._ring = torch.empty((self.slots, *shape), dtype=torch.uint8).share_memory_()
        if self.slots:
            batch = self._ring[self._next_slot, :n]
            self._next_slot = (self._next_slot + 1) % self.slots
        else:
            batch = torch.empty(shape, dtype=torch.uint8).share_memory_()
        report = self._decoder.fill(indices, batch.numpy())
        self._count(report)
        return _Kept(batch[: len(report[0])], torch.from_numpy(self._labels(report[0])))


class _Kept:
    """A batch that travels as itself and keeps its storage mapped in the training loop, so that
    torch maps a worker's ring there once, not once a batch (`_kept`)."""

    def __init__(self, *batch: Any) -> None:
        self.batch = batch

    def __reduce__(self) -> tuple[Any, ...]:
        return _kept, self.batch


_KEPT: dict[int, Any] = {}  # in the training loop: the storages of the last rings received


def _kept(images: Any, labels: Any) -> tuple[Any, Any]:
    storage = images.untyped_storage()
    _KEPT[storage.data_ptr()] = _KEPT.pop(storage.data_ptr(), storage)  # most recent last
    if len(_KEPT) > 64:  # rings of workers long gone
        del _KEPT[next(iter(_KEPT))]
    return images, labels
