"""What training needs only sometimes: decoded batches, epoch orders, rank views, prefetch.

Standard library and numpy only, like the reader: `rectool reader --training -o FILE` copies
this module verbatim beside it. OpenCV is imported on first decode, torch only where the
caller has imported it (`tensors=True`, DataLoader).

    from rectool_reader import open_dataset
    from rectool_training import Loader, prefetch

    ds = open_dataset("out/faces")
    with Loader(ds, batch_size=256, workers=8, size=(112, 112), seed=0) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for images, labels in prefetch(loader, fn=to_gpu):   # uint8 NHWC, int64
                ...

- `Loader`: worker processes decode whole batches straight into a ring of batch slots in
  shared memory and hand back only the slot number. Nothing is pickled, copied or allocated
  per batch: torch's DataLoader spends about 35 µs an image on that with 112x112 images, more
  than half of what decoding them costs.
- `BatchDecoder`: one decoded batch per call, for training code that keeps torch's DataLoader
  (`batch_size=None`, a `BatchSampler` over a `RankSampler` as its sampler).
- `RankSampler`, `epoch_order`: one seeded order per epoch, an equal share per rank, resumable.
- `prefetch`: the next batches on a background thread, overlapping the training step.

The dataset is the reader's (`open_dataset`); this module reaches the reader only through it
(`ds.raw`, `ds.location`, `ds.labels`, and the module that defines its class for
`decode_image`, `imdecode` and the errors: its decode guard), so it works beside an emitted
reader of any file name.
"""

from __future__ import annotations

import mmap
import os
import pickle
import queue
import sys
import tempfile
import threading
import traceback
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # for the checker only: the standard library and numpy
    from collections.abc import Callable, Generator, Iterable, Iterator, Sequence

    from numpy.typing import NDArray

    Dataset = Any  # the reader's RecordDataset (of whichever module defines it), or one like it
    Report = tuple[int, list[tuple[int, str]], list[tuple[int, int, str]]]  # see fill_batch

__all__ = ["BatchDecoder", "Loader", "Prefetcher", "RankSampler", "epoch_order", "prefetch"]


# --- sampling: epochs, ranks, resuming ---------------------------------------------------------


def epoch_order(
    size: int, epoch: int = 0, seed: int = 0, shuffle: bool = True
) -> NDArray[np.int64]:
    """Return the order of all `size` samples in one epoch (int64), the same on every rank.

    Shuffled from PCG64 raw bits seeded by (seed, epoch), whose stream numpy keeps stable
    across versions, so a run resumed elsewhere sees the same order.
    """
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    if epoch < 0 or seed < 0:
        raise ValueError("epoch and seed must be >= 0")
    bits = np.random.PCG64([seed, epoch]).random_raw(size)
    return np.argsort(bits, kind="stable").astype(np.int64, copy=False)


class RankSampler:
    """The samples one rank reads in an epoch: an equal share of one global order.

    Every epoch has one global order (`epoch_order`), independent of the number of ranks,
    cut to a multiple of `world_size` (`drop_last=True`) or padded by repeating its start.
    Rank r reads positions r, r + world_size, ... of it, so every rank gets the same count.
    `state_dict()` says how far the epoch got (`epoch`, `position` in the global order);
    `load_state_dict()` resumes there, on any number of ranks. Use as a DataLoader `sampler`.
    """

    def __init__(
        self,
        size: int | Sequence[Any],
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        size = size if isinstance(size, int) else len(size)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
        self.size, self.rank, self.world_size = size, rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self.position = 0  # where in the epoch's global order this view starts
        self._yielded = 0

    def __repr__(self) -> str:
        return (
            f"RankSampler(size={self.size}, rank={self.rank}, world_size={self.world_size}, "
            f"epoch={self.epoch}, position={self.position})"
        )

    @property
    def total(self) -> int:
        """Return the length of an epoch's global order after padding or dropping."""
        w = self.world_size
        return self.size // w * w if self.drop_last else -(-self.size // w) * w

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its beginning."""
        self.epoch, self.position, self._yielded = epoch, 0, 0

    def global_order(self) -> NDArray[np.int64]:
        """Return the epoch's global order, padded or cut to `total`."""
        order = epoch_order(self.size, self.epoch, self.seed, self.shuffle)
        if self.total <= self.size:
            return order[: self.total]
        return np.resize(order, self.total)  # repeats the order from its start

    def indices(self) -> NDArray[np.int64]:
        """Return the sample indices this rank reads from `position` to the end of the epoch."""
        start = min(self.position, self.total)
        return self.global_order()[start + self.rank :: self.world_size]

    def __len__(self) -> int:
        return max(0, self.total - self.position) // self.world_size

    def __iter__(self) -> Iterator[int]:
        self._yielded = 0
        return self._count_yielded(self.indices())

    def _count_yielded(self, indices: NDArray[np.int64]) -> Iterator[int]:
        for start in range(0, len(indices), 1 << 16):  # Python ints a block at a time, not
            for i in indices[start : start + (1 << 16)].tolist():  # one per sample at once
                self._yielded += 1
                yield i

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Return {epoch, position, ...}: where to resume after `consumed` samples of this rank.

        `consumed` defaults to what the last iteration yielded, exact without DataLoader
        workers; with workers (which read ahead) pass the samples actually trained on.
        """
        consumed = self._yielded if consumed is None else consumed
        return {
            "epoch": self.epoch,
            "position": min(self.position + consumed * self.world_size, self.total),
            "seed": self.seed,
            "size": self.size,
            "shuffle": self.shuffle,
        }

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

_ITEM, _END, _ERROR = range(3)


def prefetch(
    iterable: Iterable[Any], depth: int = 2, fn: Callable[[Any], Any] | None = None
) -> Prefetcher:
    """Iterate `iterable` on a background thread, up to `depth` items ahead; return a `Prefetcher`.

    `fn` (optional) runs on that thread for each item, e.g. a copy to the GPU with
    `non_blocking=True` from pinned memory, so the copy overlaps the training step.
    """
    return Prefetcher(iterable, depth, fn)


class Prefetcher:
    """An iterator that produces items on a background thread into a bounded queue.

    An exception raised by the source (or `fn`) is raised again in the consumer, with its
    traceback. Leaving early (break, an exception, `close()`, garbage collection or `with`)
    stops the thread and closes the source iterator.
    """

    def __init__(
        self, iterable: Iterable[Any], depth: int = 2, fn: Callable[[Any], Any] | None = None
    ) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue(depth)
        self._stop = threading.Event()
        self._done = False
        # The thread must not reference self, or an abandoned Prefetcher would never be freed.
        self._thread = threading.Thread(
            target=_produce,
            args=(iterable, fn, self._queue, self._stop),
            name="rectool-prefetch",
            daemon=True,
        )
        self._thread.start()

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == _ITEM:
            return value
        self.close()
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the background thread and drop what it produced ahead."""
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # No join here: the thread sees the flag within 50 ms and ends by itself.
        if getattr(self, "_stop", None) is not None:
            self._done = True
            self._stop.set()


def _produce(
    iterable: Iterable[Any],
    fn: Callable[[Any], Any] | None,
    out: queue.Queue[tuple[int, Any]],
    stop: threading.Event,
) -> None:
    def put(entry: tuple[int, Any]) -> bool:
        while not stop.is_set():
            try:
                out.put(entry, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    iterator = None
    try:
        iterator = iter(iterable)
        for item in iterator:
            if stop.is_set() or not put((_ITEM, fn(item) if fn is not None else item)):
                return
        put((_END, None))
    except BaseException as exc:  # handed to the consumer, which raises it
        put((_ERROR, exc))
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


# --- decoding one sample into a batch slot: full size, or scaled and cropped ------------------

MODES = ("bgr", "rgb", "gray")


def reduction_factor(source: tuple[int, int], target: tuple[int, int]) -> int:
    """Return the largest libjpeg scale 8, 4 or 2 at which `source` (h, w) still covers `target`.

    1 when the source is less than twice the target in either dimension.
    """
    (h, w), (th, tw) = source, target
    for factor in (8, 4, 2):
        if -(-h // factor) >= th and -(-w // factor) >= tw:
            return factor
    return 1


def crop_box(source: tuple[int, int], target: tuple[int, int]) -> tuple[int, int, int, int]:
    """Return (y, x, h, w): the centred region of `source` (h, w) with the target's aspect ratio.

    The region is what "scale to cover the target, then centre-crop" keeps: the whole of the
    shorter side (relative to the target's aspect ratio) and the middle of the other.
    """
    (h, w), (th, tw) = source, target
    scale = max(th / h, tw / w)
    ch, cw = min(h, round(th / scale)), min(w, round(tw / scale))
    return (h - ch) // 2, (w - cw) // 2, ch, cw


class _BadSample(Exception):
    """A sample that cannot be read or decoded; `error` is the RecordFormatError to report."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class ShapeMismatchError(Exception):
    """Images of different shapes where the batch needs one (raised as the reader's error)."""


def _reader(ds: Dataset) -> Any:
    """Return the reader module that defines the dataset (or the class it extends, as a remote
    pack's does): its decoders and errors."""
    for cls in type(ds).__mro__:
        module = sys.modules.get(cls.__module__)
        if hasattr(module, "imdecode"):
            return module
    return sys.modules[type(ds).__module__]


class _SampleDecoder:
    """Decodes one sample into a (H, W, C) slot of a batch; picklable for spawned workers.

    Every decode goes through the reader's guard (its `decode_image` and `imdecode`): an
    image whose header declares more than `max_pixels` pixels is a bad sample, never decoded.
    """

    def __init__(
        self, ds: Dataset, mode: str, size: tuple[int, int] | None, max_pixels: int
    ) -> None:
        self.ds, self.mode, self.size, self.max_pixels = ds, mode, size, max_pixels
        self._cv2: Any = None  # OpenCV, False without it, None until asked
        self._flags: dict[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cv2"] = None
        return state

    def cv2(self) -> Any:
        if self._cv2 is None:
            try:
                import cv2

                self._cv2 = cv2
            except ImportError:
                self._cv2 = False
        return self._cv2

    def read(self, i: int) -> Any:
        """Return the image bytes of sample `i`; raise _BadSample if its record is damaged."""
        try:
            return self.ds.raw(i)[0]
        except _reader(self.ds).RecordFormatError as exc:
            raise _BadSample(exc) from None

    def release(self) -> None:
        """Unmap what the batch read (`ds.close()`): a worker holds no pages between batches."""
        close = getattr(self.ds, "close", None)
        if close is not None:
            close()

    def _bad(self, i: int, exc: Any) -> _BadSample:
        """Return the _BadSample of the reader's error `exc`, naming sample `i`'s location."""
        return _BadSample(type(exc)(exc.reason, *self.ds.location(i)))

    def decode(self, i: int, payload: Any) -> NDArray[np.uint8]:
        """Return sample `i` decoded at full size by the reader, as (H, W, C) uint8."""
        reader = _reader(self.ds)
        try:
            return reader.decode_image(payload, self.mode, self.max_pixels)
        except reader.RecordFormatError as exc:
            raise self._bad(i, exc) from None

    def _flag(self, factor: int) -> int:
        """Return OpenCV's flag decoding at 1/`factor` scale, in BGR (or gray, 2-D)."""
        if self._flags is None:
            cv2, gray = self.cv2(), self.mode == "gray"
            self._flags = {
                1: (cv2.IMREAD_COLOR, cv2.IMREAD_GRAYSCALE)[gray],
                2: (cv2.IMREAD_REDUCED_COLOR_2, cv2.IMREAD_REDUCED_GRAYSCALE_2)[gray],
                4: (cv2.IMREAD_REDUCED_COLOR_4, cv2.IMREAD_REDUCED_GRAYSCALE_4)[gray],
                8: (cv2.IMREAD_REDUCED_COLOR_8, cv2.IMREAD_REDUCED_GRAYSCALE_8)[gray],
            }
        return self._flags[factor]

    def _imdecode(
        self, i: int, payload: Any, flags: int | Callable[[str, int, int], int]
    ) -> NDArray[np.uint8]:
        """Return sample `i` decoded by the reader's `imdecode` (`flags`: a flag, or a function
        of the image's format and size choosing one)."""
        reader = _reader(self.ds)
        try:
            return reader.imdecode(payload, flags, self.max_pixels)
        except reader.RecordFormatError as exc:
            raise self._bad(i, exc) from None

    def into(self, i: int, payload: Any, out: NDArray[np.uint8]) -> None:
        """Decode sample `i` into `out` (H, W, C) uint8, resized per `size` when given."""
        if self.size is None:
            if self.mode == "rgb" and self.cv2():  # converted straight into the slot
                image = self._imdecode(i, payload, self._flag(1))
                self._check_shape(i, image.shape, out.shape)
                self._cv2.cvtColor(image, self._cv2.COLOR_BGR2RGB, dst=out)
            else:
                image = self.decode(i, payload)
                self._check_shape(i, image.shape, out.shape)
                out[...] = image
            return
        cv2 = self.cv2()
        if not cv2:
            raise _reader(self.ds).RectoolError("size= needs OpenCV (opencv-python-headless)")
        factor, size = [1], self.size

        def scaled(kind: str, height: int, width: int) -> int:
            if kind == "jpeg":  # the largest JPEG scale still covering the target
                factor[0] = reduction_factor((height, width), size)
            return self._flag(factor[0])

        image = self._imdecode(i, payload, scaled)
        if factor[0] > 1 and (image.shape[0] < size[0] or image.shape[1] < size[1]):
            image = self._imdecode(i, payload, self._flag(1))  # EXIF turned it: decode in full
        if self.mode == "rgb":
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        y, x, h, w = crop_box(image.shape[:2], size)
        crop = image[y : y + h, x : x + w]
        target = out[:, :, 0] if self.mode == "gray" else out
        if (h, w) == size:
            target[...] = crop
            return
        shrink = h >= size[0] and w >= size[1]
        cv2.resize(
            crop,
            (size[1], size[0]),
            dst=target,
            interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR,
        )

    def _check_shape(self, i: int, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
        if shape != expected:
            path, offset, key = self.ds.location(i)
            raise ShapeMismatchError(
                f"{path}: key {key}, byte offset {offset}: image of shape {tuple(shape)}, but "
                f"the batch holds {tuple(expected)} (the shape of the first image): pass "
                "size=(H, W) to resize every image to one shape"
            )


# --- a batch: its samples, bad ones skipped or replaced, its labels ---------------------------


ON_ERROR = ("raise", "skip", "replace")
REPLACE_ATTEMPTS = 16


def replacement(seed: int, i: int, attempt: int, size: int) -> int:
    """Return the sample that stands in for bad sample `i` (`attempt`-th try): a pure function."""
    return int(np.random.Generator(np.random.PCG64([seed, i, attempt])).integers(size))


def fill_batch(
    decoder: _SampleDecoder,
    label_table: NDArray[Any],
    indices: Iterable[int],
    images: NDArray[np.uint8],
    labels: NDArray[Any],
    on_error: str,
    seed: int,
) -> Report:
    """Decode samples `indices` into `images[:n]`, their labels into `labels[:n]`; return a report.

    The report is (n, skipped, replaced): n samples written; `skipped` a list of (index,
    message); `replaced` a list of (index, substitute, message). With on_error="raise" a bad
    sample raises its RecordFormatError.
    """
    n, skipped, replaced = 0, [], []
    size = len(label_table)
    for i in indices:
        try:
            decoder.into(i, decoder.read(i), images[n])
            labels[n] = label_table[i]
            n += 1
            continue
        except _BadSample as bad:
            if on_error == "raise":
                raise bad.error from None
            message = str(bad.error)
        if on_error == "skip":
            skipped.append((i, message))
            continue
        for attempt in range(REPLACE_ATTEMPTS):
            r = replacement(seed, i, attempt, size)
            if r == i:
                continue
            try:
                decoder.into(r, decoder.read(r), images[n])
            except _BadSample:
                continue
            labels[n] = label_table[r]
            n += 1
            replaced.append((i, r, message))
            break
        else:
            raise _reader(decoder.ds).RecordFormatError(
                f"{message}; and {REPLACE_ATTEMPTS} replacements drawn for it could not be "
                "decoded either"
            )
    return n, skipped, replaced


def label_table(ds: Dataset) -> NDArray[Any]:
    """Return every label for batching: int64 (N,) when all are whole numbers, else float32.

    Scalar whole-number labels (class indices, what `rectool pack` writes) become int64, what
    a classification loss takes; other scalars (regression targets) stay float32 (N,), and
    label vectors (multi-label packs, even of 0s and 1s) stay float32 (N, k).
    """
    labels = ds.labels
    if labels.dtype == object:
        widths = sorted({np.size(label) for label in labels})
        raise _reader(ds).RectoolError(
            f"the samples carry labels of {widths} values: a batch needs one label width"
        )
    labels = np.asarray(labels, np.float32)
    if labels.ndim == 1 and np.isfinite(labels).all() and (labels == np.trunc(labels)).all():
        return labels.astype(np.int64)
    return labels


class _SharedLabels:
    """A label table in an unlinked shared-memory file: every worker maps the same pages.

    `array` is the table (read-only). Forked workers inherit the mapping; pickled while a
    process is being spawned (multiprocessing's, torch's DataLoader workers), it travels as
    its descriptor and the worker maps it, so eight workers over 42M labels share one table
    of 336 MB instead of holding eight copies. Pickled anywhere else, it carries the array.
    """

    def __init__(self, array: NDArray[Any]) -> None:
        array = np.asarray(array)
        self._fd = _unlinked_shared_file(max(1, array.nbytes))
        weakref.finalize(self, os.close, self._fd)
        self._map(array.dtype, array.shape, mmap.ACCESS_WRITE)[...] = array
        self.array.flags.writeable = False

    def _map(self, dtype: Any, shape: tuple[int, ...], access: int) -> NDArray[Any]:
        dtype, count = np.dtype(dtype), int(np.prod(shape, dtype=np.int64))
        mm = mmap.mmap(self._fd, max(1, count * dtype.itemsize), access=access)
        self.spec = dtype.str, tuple(shape)
        self.array = np.frombuffer(mm, dtype, count).reshape(shape)
        return self.array

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import context, reduction

        if self._fd is None or context.get_spawning_popen() is None:
            return _SharedLabels, (np.array(self.array),)
        return _SharedLabels._attach, (reduction.DupFd(self._fd), self.spec)

    @classmethod
    def _attach(cls, dup: Any, spec: tuple[str, tuple[int, ...]]) -> _SharedLabels:
        self = cls.__new__(cls)
        self._fd = dup.detach()
        try:
            self._map(*spec, mmap.ACCESS_READ)
        finally:
            os.close(self._fd)
            self._fd = None  # type: ignore[assignment]  # the mapping is all a worker needs
        return self


def _new_shared_file(kind: str, size: int) -> tuple[int, str]:
    """Create a file of `size` bytes under /dev/shm (else the temporary folder) that only this
    user can open, named `rectool-KIND-PID-RANDOM`; return (descriptor, path)."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = os.path.join(folder, f"rectool-{kind}-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        os.unlink(path)
        raise
    return fd, path


def _unlinked_shared_file(size: int) -> int:
    """Return the descriptor of a new shared-memory file of `size` bytes that has no name."""
    if not hasattr(os, "memfd_create"):
        fd, path = _new_shared_file("labels", size)
        os.unlink(path)
        return fd
    fd = os.memfd_create("rectool-labels")
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def _check_options(mode: str, size: Sequence[int] | None, on_error: str) -> Any:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, not {on_error!r}")
    if size is not None:
        size = tuple(size)
        if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
            raise ValueError(f"size must be (height, width) in pixels, not {size!r}")
    return size


def _max_pixels(ds: Dataset, max_pixels: int | None) -> int:
    """Return the decode budget: `max_pixels`, else the dataset's (`open_dataset(max_pixels=)`)."""
    reader = _reader(ds)
    if max_pixels is None:
        max_pixels = getattr(ds, "max_pixels", None) or reader.DEFAULT_MAX_PIXELS
    return reader.check_max_pixels(max_pixels)


def _default_mode(ds: Dataset, mode: str | None) -> str:
    if mode is not None:
        return mode
    decode = getattr(ds, "decode", None)
    return decode if decode in MODES else "rgb"


def _sample_shape(
    decoder: _SampleDecoder, mode: str, size: tuple[int, int] | None, count: int
) -> tuple[int, ...]:
    """Return the (H, W, C) of every image: from `size`, else from the first decodable image."""
    channels = 1 if mode == "gray" else 3
    if size is not None:
        return (*size, channels)
    first: Exception | None = None
    for i in range(min(count, 100)):
        try:
            return decoder.decode(i, decoder.read(i)).shape
        except _BadSample as bad:
            first = first or bad.error
    raise first  # type: ignore[misc]  # set: the loaders refuse an empty dataset


# --- shared memory: a ring of batch slots -----------------------------------------------------


class _Ring:
    """`slots` batch slots (images [B, H, W, C] uint8 and labels [B, ...]) in one shared mapping.

    The mapping is a file under /dev/shm (or the temporary folder). `named=False` (the
    Loader's): unlinked at once, before any worker starts, and shared as its descriptor
    (`handle()`), so even SIGKILL of the parent leaves nothing; else mapped by name and
    unlinked as soon as every process that needs it has (`unlink`).
    """

    def __init__(
        self,
        slots: int,
        batch: int,
        shape: Sequence[int],
        label_shape: Sequence[int],
        label_dtype: Any,
        path: str | None = None,
        fd: int | None = None,
        named: bool = True,
    ) -> None:
        self.spec = (slots, batch, tuple(shape), tuple(label_shape), np.dtype(label_dtype).str)
        image_bytes = slots * batch * int(np.prod(shape))
        self._label_start = -(-image_bytes // 64) * 64
        label_bytes = slots * batch * int(np.prod(label_shape, dtype=np.int64))
        label_bytes *= np.dtype(label_dtype).itemsize
        total = max(1, self._label_start + label_bytes)
        if fd is not None:
            pass  # a descriptor passed to this process (`handle()`): mapped, then closed
        elif path is None:
            fd, path = _new_shared_file("loader", total)
            if not named:
                os.unlink(path)
                path = None
        else:
            fd = os.open(path, os.O_RDWR)
        self.path, self._fd = path, None
        try:
            self._mm = mmap.mmap(fd, total)
        finally:
            if named or path is not None:
                os.close(fd)
            else:
                self._fd = fd  # shared with the workers until they have mapped it
        self.images = np.frombuffer(self._mm, np.uint8, slots * batch * int(np.prod(shape)))
        self.images = self.images.reshape(slots, batch, *shape)
        self.labels = np.frombuffer(
            self._mm, label_dtype, slots * batch * int(np.prod(label_shape)), self._label_start
        ).reshape(slots, batch, *label_shape)

    @classmethod
    def attach(cls, path: str, spec: tuple[Any, ...]) -> _Ring:
        slots, batch, shape, label_shape, label_dtype = spec
        return cls(slots, batch, shape, label_shape, label_dtype, path=path)

    def handle(self) -> _SharedFd:
        """Return the ring's descriptor as workers receive it (see `_SharedFd`)."""
        return _SharedFd(self._fd)  # type: ignore[arg-type]  # held until release()

    def release(self) -> None:
        """Close the descriptor kept for the workers (the mapping stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def unlink(self) -> None:
        self.release()
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None

    def close(self) -> None:
        """Unmap, unless the caller still holds views of a batch (then the last view unmaps)."""
        self.unlink()
        self.images = self.labels = None  # type: ignore[assignment]  # closed
        try:
            self._mm.close()
        except BufferError:
            pass


class _SharedFd:
    """A descriptor handed to a worker process: inherited under fork, duplicated into the
    child by multiprocessing under spawn and forkserver (as it passes a Pipe's ends)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return _SharedFd._rebuild, (reduction.DupFd(self.fd),)

    @staticmethod
    def _rebuild(dup: Any) -> _SharedFd:
        return _SharedFd(dup.detach())


# --- Loader: worker processes that fill the ring, and the loop that reads it ------------------


class _forking:
    """Fork with OpenCV's thread pool at one thread, then give the parent its threads back.

    A child forked while the pool's threads exist inherits their condition variables in use:
    its first `cv2.setNumThreads` blocks forever. With one thread while forking, the child
    starts with the single-threaded pool a worker wants anyway.
    """

    def __init__(self, forked: bool) -> None:
        self.cv2 = sys.modules.get("cv2") if forked else None
        self.threads = None

    def __enter__(self) -> None:
        if self.cv2 is not None:
            self.threads = self.cv2.getNumThreads()
            self.cv2.setNumThreads(1)

    def __exit__(self, *exc: object) -> None:
        if self.threads is not None:
            self.cv2.setNumThreads(self.threads)


def _work(
    decoder: _SampleDecoder,
    table: Any,
    ring_fd: _SharedFd,
    ring_spec: tuple[Any, ...],
    conn: Any,
    parent: int,
    on_error: str,
    seed: int,
    forked: bool,
) -> None:
    """A worker: decode each batch it is sent into its slot, answer with the report."""
    table = table.array
    try:
        cv2 = decoder.cv2()
        if cv2 and not forked:  # a forked worker inherits one thread (see _forking)
            cv2.setNumThreads(1)  # one process per core already
        slots, batch, shape, label_shape, label_dtype = ring_spec
        ring = _Ring(slots, batch, shape, label_shape, label_dtype, fd=ring_fd.fd)
        conn.send(("ready",))
    except BaseException as exc:
        conn.send(("error", None, _portable_error(exc)))
        return
    while True:
        try:
            # Wake now and then to notice a parent that died without closing the pipe.
            while not conn.poll(1.0):
                if os.getppid() != parent:
                    return
            task = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if task is None:
            return
        number, slot, indices = task
        try:
            report = fill_batch(
                decoder, table, indices, ring.images[slot], ring.labels[slot], on_error, seed
            )
            decoder.release()
            conn.send(("ok", number, report))
        except BaseException as exc:
            conn.send(("error", number, _portable_error(exc)))


def _portable_error(
    exc: BaseException,
) -> tuple[str, str, tuple[Any, ...] | None, bytes | None, str]:
    """Return what the parent needs to raise `exc` again: the error, or its text if unpicklable."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    fields = None
    if hasattr(exc, "reason") and hasattr(exc, "key"):  # the reader's RecordFormatError
        fields = (exc.reason, exc.path, exc.offset, exc.key)  # type: ignore[attr-defined]
    try:
        blob = pickle.dumps(exc)
    except Exception:
        blob = None
    return type(exc).__name__, str(exc), fields, blob, text


class _RemoteTraceback(Exception):
    """The traceback of an error in a loader worker (the `__cause__` of what is raised)."""

    def __str__(self) -> str:
        return self.args[0]


class _WorkerDied(RuntimeError):
    """A worker process ended while a batch was due from it."""


class Loader:
    """Decoded batches from `workers` processes through reused shared memory, in order.

    `for images, labels in loader` yields this rank's share of epoch `set_epoch(e)` (0 by
    default) in `batch_size` batches: `images` uint8 (n, H, W, C) in `mode` ("rgb", "bgr" or
    "gray"; default the dataset's decode mode, else "rgb"), `labels` int64 (n,) when every
    label is a whole number, else float32 (n,), or (n, k) for label vectors (`label_table`).

    - **Order.** The order is `RankSampler(len(ds), rank, world_size, shuffle, seed)`: one
      seeded permutation per epoch, every sample exactly once (ranks padded to equal shares);
      the same for a given seed and epoch whatever the number of workers. `loader.sampler`
      resumes mid-epoch (`load_state_dict`). The last, partial batch is kept unless
      `drop_last=True`. A dataset with a `rank_sampler` method (a remote pack) gives its own,
      called as `RankSampler` is (rectool.remote's streams blocks of shards).
    - **Lifetime.** A batch is a view of a slot that is reused: it is valid until the next
      batch is asked for. Keep it longer with `copy=True` (fresh arrays) or copy it yourself;
      `prefetch(loader, fn=to_gpu)` is safe, since `fn` copies each batch before the next.
      `tensors=True` yields `torch.from_numpy` views (torch must already be imported).
    - **Size.** Without `size`, every image must have the shape of the first one (else an
      error names the first that differs). `size=(H, W)` scales each image to cover H x W,
      keeping its aspect ratio, and crops the centre (INTER_AREA when shrinking, else
      INTER_LINEAR); a JPEG at least twice the target in both dimensions is decoded by
      libjpeg at 1/2, 1/4 or 1/8 scale first (the largest that still covers the target).
    - **Bad samples.** `on_error="raise"` (default) raises the reader's RecordFormatError
      naming file, key and byte offset; "skip" drops the sample (that batch is shorter);
      "replace" decodes a substitute drawn from (seed, index), the same in every run. Both
      are counted in `stats` and listed (first 1,000) in `bad_samples`. A sample is bad when
      its record is damaged, its bytes do not decode or are cut (a JPEG without its end
      marker, a PNG without IEND), or its header declares more than `max_pixels` pixels
      (default: the dataset's, 50 million from `open_dataset`): such an image is refused
      (`ImageTooLargeError`) before anything is allocated for it, so a worker's memory is
      bounded by the budget.
    - **Processes.** Workers start on the first iteration and stay until `close()` (or
      `with`, or garbage collection); they exit by themselves if this process dies. Any
      start method works (`start_method`, default multiprocessing's); under spawn the dataset
      is pickled to each worker and this module must be importable by name.
    """

    def __init__(
        self,
        ds: Dataset,
        batch_size: int,
        *,
        workers: int = 2,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        size: Sequence[int] | None = None,
        mode: str | None = None,
        on_error: str = "raise",
        copy: bool = False,
        tensors: bool = False,
        slots: int | None = None,
        start_method: str | None = None,
        max_pixels: int | None = None,
    ) -> None:
        if batch_size < 1 or workers < 1:
            raise ValueError("batch_size and workers must be >= 1")
        mode = _default_mode(ds, mode)
        self.size = _check_options(mode, size, on_error)
        self.mode, self.on_error, self.seed = mode, on_error, seed
        self.batch_size, self.workers, self.drop_last = batch_size, workers, drop_last
        self.copy, self.tensors = copy, tensors
        self.slots = slots or 2 * workers + 1
        if self.slots < 2:
            raise ValueError("slots must be >= 2: one for the loop, one for a worker")
        self.start_method = start_method
        if len(ds) == 0:
            raise _reader(ds).RectoolError(f"{ds!r} has no samples to load")
        # A dataset may bring its own order (a remote pack's streams: rectool.remote).
        self.sampler = getattr(ds, "rank_sampler", RankSampler)(
            len(ds), rank, world_size, shuffle, seed
        )
        self._decoder = _SampleDecoder(ds, mode, self.size, _max_pixels(ds, max_pixels))
        self._table = _SharedLabels(label_table(ds))  # mapped by every worker, never copied
        self._labels = self._table.array
        self.shape = tuple(_sample_shape(self._decoder, mode, self.size, len(ds)))
        self.stats = {"batches": 0, "samples": 0, "skipped": 0, "replaced": 0}
        self.bad_samples: list[tuple[int, int | None, str]] = []
        self._processes: list[Any] = []
        self._conns: list[Any] = []
        self._ring: Any = None  # a _Ring while the workers run
        self._active: Generator[tuple[Any, Any]] | None = None
        self._broken = False

    def __repr__(self) -> str:
        return (
            f"Loader({len(self.sampler)} samples of {self.shape}, batch_size={self.batch_size}, "
            f"workers={self.workers}, epoch={self.sampler.epoch})"
        )

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

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_processes", None):
            self.close()

    # -- workers ---------------------------------------------------------------------------
    def _start(self) -> None:
        import multiprocessing

        context: Any = multiprocessing.get_context(self.start_method)
        forked = context.get_start_method() == "fork"
        self._ring = _Ring(
            self.slots,
            self.batch_size,
            self.shape,
            self._labels.shape[1:],
            self._labels.dtype,
            named=False,  # no name in /dev/shm that a killed parent could leave behind
        )
        try:
            for _ in range(self.workers):
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=_work,
                    args=(
                        self._decoder,
                        self._table,
                        self._ring.handle(),
                        self._ring.spec,
                        theirs,
                        os.getpid(),
                        self.on_error,
                        self.seed,
                        forked,
                    ),
                    name="rectool-loader",
                    daemon=True,
                )
                with _forking(forked):
                    process.start()
                theirs.close()
                self._processes.append(process)
                self._conns.append(ours)
            for w in range(self.workers):
                self._receive(w, None)  # "ready": the worker has mapped the ring
        except _WorkerDied as exc:
            self._stop_workers()
            raise _reader(self._decoder.ds).RectoolError(
                f"{exc} while starting; under the spawn start method the training script "
                "must start its work under `if __name__ == '__main__':`"
            ) from None
        except BaseException:
            self._stop_workers()  # not close(): this runs inside the pass being started
            raise
        finally:
            if self._ring is not None:
                self._ring.release()  # every worker has mapped it (or none will)

    def close(self) -> None:
        """Stop the workers and release the shared memory (batches still held stay readable)."""
        if self._active is not None:
            active, self._active = self._active, None
            active.close()
        self._stop_workers()

    def _stop_workers(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:  # that worker is gone already
                pass
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join()
        for conn in self._conns:
            conn.close()
        self._processes, self._conns = [], []
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    def _send(self, w: int, task: tuple[int, int, NDArray[np.int64]]) -> None:
        try:
            self._conns[w].send(task)
        except OSError:  # its end of the pipe is closed: the worker is gone
            process = self._processes[w]
            process.join(timeout=1)
            raise _WorkerDied(
                f"loader worker {w} (pid {process.pid}) died with exit code {process.exitcode}"
            ) from None

    def _receive(self, w: int, number: int | None) -> Any:
        """Return worker `w`'s next answer, which must be about batch `number`."""
        conn, process = self._conns[w], self._processes[w]
        while not conn.poll(0.5):
            if not process.is_alive():
                raise _WorkerDied(
                    f"loader worker {w} (pid {process.pid}) died with exit code "
                    f"{process.exitcode} (out of memory, or killed?)"
                )
        try:
            kind, *rest = conn.recv()
        except (EOFError, OSError):  # the pipe closed: the worker ended
            process.join(timeout=1)
            raise _WorkerDied(
                f"loader worker {w} (pid {process.pid}) died with exit code {process.exitcode}"
            ) from None
        if kind == "error":
            self._raise(*rest[1])
        if kind == "ok" and rest[0] != number:
            raise AssertionError(f"worker {w} answered batch {rest[0]}, expected {number}")
        return rest[1] if kind == "ok" else None

    def _raise(
        self, name: str, message: str, fields: tuple[Any, ...] | None, blob: bytes | None, text: str
    ) -> None:
        reader = _reader(self._decoder.ds)
        if fields is not None:  # the reader's error class, by name (ImageTooLargeError...)
            kind = getattr(reader, name, None)
            if not (isinstance(kind, type) and issubclass(kind, reader.RecordFormatError)):
                kind = reader.RecordFormatError
            error = kind(*fields)
        elif name == "ShapeMismatchError":
            error = reader.RectoolError(message)
        else:
            try:
                error = pickle.loads(blob)  # type: ignore[arg-type]  # None raises: caught
            except Exception:
                error = reader.RectoolError(f"in a loader worker: {name}: {message}")
        raise error from _RemoteTraceback(text)

    # -- batches ---------------------------------------------------------------------------
    def _batches(self) -> Generator[tuple[Any, Any]]:
        if self._broken:
            self._stop_workers()
            self._broken = False
        if not self._processes:
            self._start()
        indices = self.sampler.indices()
        count = len(self)
        free = list(range(self.slots))
        slot_of: dict[int, int] = {}  # batch number -> slot, for batches sent to a worker
        received = 0
        try:
            while received < count:
                try:
                    # Batch b goes to worker b % workers, which answers its batches in order.
                    while len(slot_of) < self.slots and received + len(slot_of) < count:
                        number = received + len(slot_of)
                        chunk = indices[number * self.batch_size : (number + 1) * self.batch_size]
                        slot_of[number] = free.pop()
                        self._send(number % self.workers, (number, slot_of[number], chunk))
                    slot = slot_of.pop(received)
                    report = self._receive(received % self.workers, received)
                except _WorkerDied as exc:
                    self._broken = True
                    slot_of.clear()  # nothing more will come from a broken set of workers
                    raise _reader(self._decoder.ds).RectoolError(str(exc)) from None
                received += 1
                try:
                    yield self._deliver(slot, report)
                finally:
                    free.append(slot)  # the consumer asked for the next batch: reuse it
        finally:
            # Leave the workers idle and in step: collect what they are still decoding.
            for number in sorted(slot_of):
                try:
                    self._receive(number % self.workers, number)
                except _WorkerDied:
                    self._broken = True  # the next pass starts new workers
                    break
                except Exception:  # an error in a batch nobody will see
                    pass

    def _deliver(self, slot: int, report: Report) -> tuple[Any, Any]:
        n, skipped, replaced = report
        stats = self.stats
        stats["batches"] += 1
        stats["samples"] += n
        stats["skipped"] += len(skipped)
        stats["replaced"] += len(replaced)
        room = 1000 - len(self.bad_samples)
        if room > 0:
            self.bad_samples.extend(
                [(i, None, message) for i, message in skipped]
                + [(i, r, message) for i, r, message in replaced]
            )
            del self.bad_samples[1000:]
        images, labels = self._ring.images[slot, :n], self._ring.labels[slot, :n]
        if self.copy:
            images, labels = images.copy(), labels.copy()
        if self.tensors:
            torch: Any = sys.modules.get("torch")
            if torch is None:
                raise ValueError("tensors=True needs torch imported first")
            images, labels = torch.from_numpy(images), torch.from_numpy(labels)
        return images, labels


# --- BatchDecoder: one batch per call, inside torch's DataLoader ------------------------------


class BatchDecoder:
    """`batches[indices] -> (images, labels)`: one decoded batch per call, for torch's DataLoader.

    For training code that keeps `torch.utils.data.DataLoader`: give it batches of indices
    and no batching of its own, and each worker decodes a whole batch into one array::

        batches = BatchDecoder(ds, size=(112, 112))
        sampler = torch.utils.data.BatchSampler(RankSampler(ds, rank, world_size), 256, False)
        loader = DataLoader(batches, batch_size=None, sampler=sampler, num_workers=8)

    Images are uint8 (n, H, W, C), labels as in `Loader` (`label_table`), with `size`,
    `mode`, `on_error` and `max_pixels` as in `Loader` (replacements drawn from `seed`).

    Inside a DataLoader worker, each worker decodes into a ring of `slots` batch slots in
    shared memory that it reuses, and only the slot's name travels to the training loop,
    which gets torch tensors viewing it: no copy and no new shared memory per batch (which
    is what torch's own transport costs). The images of a batch therefore stay valid until
    that worker reuses the slot: for at least `slots - prefetch_factor - 1` further batches
    of the same worker (5 with the defaults), so `prefetch` and `pin_memory` are safe but
    images kept for later must be copied (`.clone()`); labels are always fresh. `slots=0`
    sends every batch through torch's transport instead. Outside a worker, each call returns
    a new pair of numpy arrays. `stats` counts what this process skipped or replaced (a
    DataLoader worker's counts stay in that worker).
    """

    def __init__(
        self,
        ds: Dataset,
        *,
        size: Sequence[int] | None = None,
        mode: str | None = None,
        on_error: str = "raise",
        seed: int = 0,
        slots: int = 8,
        max_pixels: int | None = None,
    ) -> None:
        mode = _default_mode(ds, mode)
        self.size = _check_options(mode, size, on_error)
        self.mode, self.on_error, self.seed, self.slots = mode, on_error, seed, slots
        self._decoder = _SampleDecoder(ds, mode, self.size, _max_pixels(ds, max_pixels))
        self._table = _SharedLabels(label_table(ds))  # mapped by every worker, never copied
        self._labels = self._table.array
        self.shape = tuple(_sample_shape(self._decoder, mode, self.size, len(ds)))
        self.stats = {"batches": 0, "samples": 0, "skipped": 0, "replaced": 0}
        self._ring: Any = None  # this worker's _Ring, made on first use
        self._next_slot = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_ring"] = None  # each worker makes its own
        state["_labels"] = None  # the table travels as itself
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._labels = self._table.array

    def __len__(self) -> int:
        """Return the number of samples (indices range over the dataset)."""
        return len(self._labels)

    def __getitem__(self, indices: Sequence[int] | NDArray[np.integer[Any]]) -> Any:
        indices = np.asarray(indices, np.int64).reshape(-1)
        labels = np.empty((len(indices), *self._labels.shape[1:]), self._labels.dtype)
        torch: Any = sys.modules.get("torch")
        in_worker = torch is not None and torch.utils.data.get_worker_info() is not None
        slot = None
        if in_worker and self.slots:
            slot = self._take_slot(len(indices))
        if slot is not None:
            images = self._ring.images[slot]
        elif in_worker:
            shared = torch.empty((len(indices), *self.shape), dtype=torch.uint8).share_memory_()
            images = shared.numpy()
        else:
            images = np.empty((len(indices), *self.shape), np.uint8)
        try:
            n, skipped, replaced = fill_batch(
                self._decoder, self._labels, indices, images, labels, self.on_error, self.seed
            )
        except ShapeMismatchError as exc:
            raise _reader(self._decoder.ds).RectoolError(str(exc)) from None
        if in_worker:
            self._decoder.release()
        self.stats["batches"] += 1
        self.stats["samples"] += n
        self.stats["skipped"] += len(skipped)
        self.stats["replaced"] += len(replaced)
        if slot is not None:
            return _RingBatch(self._ring.path, self._ring.spec, slot, n, labels[:n])
        if in_worker:
            return shared[:n], torch.from_numpy(labels[:n])
        return images[:n], labels[:n]

    def _take_slot(self, n: int) -> int | None:
        """Return the next slot of this worker's ring (made on first use); None if n is larger."""
        if self._ring is None:
            self._ring = _Ring(self.slots, n, self.shape, (), np.uint8)
            # The training loop unlinks the file once it has mapped it; this covers a worker
            # that ends before any of its batches was received.
            import multiprocessing.util

            multiprocessing.util.Finalize(self._ring, self._ring.unlink, exitpriority=0)
        if n > self._ring.spec[1]:
            return None
        slot, self._next_slot = self._next_slot, (self._next_slot + 1) % self.slots
        return slot


class _RingBatch:
    """A batch in a worker's ring, pickled as its place: unpickled as (images, labels) views."""

    def __init__(
        self, path: str, spec: tuple[Any, ...], slot: int, n: int, labels: NDArray[Any]
    ) -> None:
        self.place = (path, spec, slot, n, labels)

    def __reduce__(self) -> tuple[Any, ...]:
        return _attach_batch, self.place


_ATTACHED: dict[str, _Ring] = {}  # ring path -> _Ring, in the process that receives batches
_ATTACHED_MAX = 256


def _attach_batch(
    path: str, spec: tuple[Any, ...], slot: int, n: int, labels: NDArray[Any]
) -> tuple[Any, Any]:
    """Return batch `slot` of the ring at `path` as torch tensors (numpy without torch)."""
    ring = _ATTACHED.pop(path, None)
    if ring is None:
        ring = _Ring.attach(path, spec)
        ring.unlink()  # mapped here and in its worker: the name is no longer needed
        if len(_ATTACHED) >= _ATTACHED_MAX:  # rings of workers long gone
            del _ATTACHED[next(iter(_ATTACHED))]
    _ATTACHED[path] = ring  # most recent last
    images = ring.images[slot, :n]
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return images, labels
    return torch.from_numpy(images), torch.from_numpy(labels)
