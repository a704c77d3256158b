"""Every remote request bounded: in bytes, in time, and by an interruption.

    limits = Limits.from_env()          # RECTOOL_REMOTE_STALL_S, _DEADLINE_S, _MAX_BYTES
    watch = limits.watch("URL")         # one per request: `watch.got(n)` as bytes arrive
    run_all(fetch, objects, threads=8)  # on daemon threads; Ctrl-C or SIGTERM ends the wait

- **Bytes.** An object whose size no manifest gives (a manifest, a checksum or failures file
  read whole) is refused past `max_bytes` (default 256 MiB): by its `Content-Length` before a
  byte is read, else as its bytes arrive; never read into memory without bound. An object the
  manifest sizes (a shard, an index array) is refused past that size (`store.Retry.stream`).
- **Time.** A request that receives fewer than `STALL_BYTES` (64 KiB) in `stall_s` seconds
  (default 60: nothing at all, or a trickle) before it is done is stalled; one not done in
  `deadline_s` (default an hour) is too slow. Both are transient (retried, a shard resumed
  where it was), and after the last try the error names the URL and the limit to raise. The
  clock is injected in tests.
- **Interruptions.** Downloads run on daemon threads, never on the thread that waits for them:
  a Ctrl-C or SIGTERM raised there (the CLI makes SIGTERM an interruption) ends the wait at
  once (within `WAKE_S` when the signal missed the wait), cancels the downloads (each stops
  at its next chunk, an HTTP connection is shut), and a download stalled in a library call
  is left behind rather than waited for: a process exits within seconds, with the status of
  its interruption.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from ..errors import RectoolError

T = TypeVar("T")
R = TypeVar("R")

STALL_ENV = "RECTOOL_REMOTE_STALL_S"
DEADLINE_ENV = "RECTOOL_REMOTE_DEADLINE_S"
MAX_BYTES_ENV = "RECTOOL_REMOTE_MAX_BYTES"
STALL_BYTES = 64 << 10  # a request not done must receive this much every stall_s seconds
# How often the thread waiting for downloads wakes to run the handler of a signal that did not
# interrupt its wait: CPython runs a handler only in the main thread, between bytecodes, and
# a lock's wait returns early only when the signal arrives while it blocks. A SIGINT that the
# kernel gave to a download thread, or that came just before the wait began, set the flag
# but left the wait to run until a download ended: never, when one stalls.
WAKE_S = 0.25
_DEFAULTS = {STALL_ENV: 60.0, DEADLINE_ENV: 3600.0, MAX_BYTES_ENV: float(256 << 20)}


def _setting(name: str) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return _DEFAULTS[name]
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        from .store import RemoteError  # here: store imports this module

        unit = "bytes" if name == MAX_BYTES_ENV else "seconds"
        raise RemoteError(f"{name}={text!r}: set it to a number of {unit} above 0")
    return value


@dataclass(frozen=True)
class Limits:
    """How long a request may stall or last, and how large an unsized object may be."""

    stall_s: float = _DEFAULTS[STALL_ENV]
    deadline_s: float = _DEFAULTS[DEADLINE_ENV]
    max_bytes: int = int(_DEFAULTS[MAX_BYTES_ENV])
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    @classmethod
    def from_env(cls) -> Limits:
        """Return the limits `RECTOOL_REMOTE_STALL_S`, `..._DEADLINE_S` and `..._MAX_BYTES`
        set (the defaults for those unset); a value that is not a positive number is refused."""
        return cls(_setting(STALL_ENV), _setting(DEADLINE_ENV), int(_setting(MAX_BYTES_ENV)))

    def watch(self) -> Watch:
        """Return the watch of one request that starts now."""
        return Watch(self)

    def too_large(self, what: str, size: int) -> RectoolError:
        """Return the error of an unsized object of `size` bytes or more, past `max_bytes`."""
        from .store import RemoteError  # here: store imports this module

        return RemoteError(
            f"{what}: {size} bytes or more, past the {self.max_bytes} an object without a size "
            f"in a manifest may have (a manifest, a checksum file); set {MAX_BYTES_ENV} to "
            "allow more"
        )


class Watch:
    """The time limits of one request, checked each time bytes arrive (`got`)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.start = self.window = limits.clock()
        self.window_bytes = 0

    def got(self, n: int) -> None:
        """Note `n` more bytes; raise a `TransientError` when the request stalled or is past
        its deadline (a `RemoteError` when the download was cancelled)."""
        from .store import TransientError  # here: store imports this module

        check_cancelled()
        now, limits = self.limits.clock(), self.limits
        if now - self.start > limits.deadline_s:
            raise TransientError(
                f"not done within {limits.deadline_s:g} s (set {DEADLINE_ENV} to allow more)"
            )
        self.window_bytes += n
        if self.window_bytes >= STALL_BYTES:
            self.window, self.window_bytes = now, 0
        elif now - self.window > limits.stall_s:
            raise TransientError(
                f"stalled: {self.window_bytes} bytes in {now - self.window:.3g} s, fewer than "
                f"{STALL_BYTES} in {limits.stall_s:g} s (set {STALL_ENV} to wait longer)"
            )


# --- cancellation ---------------------------------------------------------------------------


class Token:
    """The cancellation of one group of downloads (and of those they start themselves)."""

    def __init__(self, parent: Token | None = None) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._closers: set[Callable[[], object]] = set()
        self._children: list[Token] = []
        if parent is not None:
            with parent._lock:
                parent._children.append(self)
            if parent.event.is_set():
                self.event.set()

    def cancel(self) -> None:
        """Cancel the downloads: each stops at its next chunk; open connections are shut."""
        self.event.set()
        with self._lock:
            closers, children = list(self._closers), list(self._children)
        for close in closers:
            try:
                close()
            except OSError:
                pass
        for child in children:
            child.cancel()

    @contextmanager
    def closing(self, close: Callable[[], object]) -> Iterator[None]:
        """Call `close` (shut a connection) if the downloads are cancelled meanwhile."""
        with self._lock:
            self._closers.add(close)
        try:
            if self.event.is_set():
                close()
            yield
        finally:
            with self._lock:
                self._closers.discard(close)


_current = threading.local()  # .token: the token of the downloads this thread runs


def current_token() -> Token | None:
    """Return the token of the downloads this thread runs (None: on a thread of its own)."""
    return getattr(_current, "token", None)


def check_cancelled() -> None:
    """Raise `Cancelled` if the downloads this thread runs were cancelled."""
    token = current_token()
    if token is not None and token.event.is_set():
        from .store import RemoteError  # here: store imports this module

        raise RemoteError("the download was cancelled")


@contextmanager
def on_cancel(close: Callable[[], object]) -> Iterator[None]:
    """Call `close` if this thread's downloads are cancelled while the block runs."""
    token = current_token()
    if token is None:
        yield
        return
    with token.closing(close):
        yield


def within(token: Token, fn: Callable[[T], R]) -> Callable[[T], R]:
    """Return `fn` run under `token` (for threads made elsewhere: a prefetcher's pool)."""

    def run(item: T) -> R:
        previous = current_token()
        _current.token = token
        try:
            return fn(item)
        finally:
            _current.token = previous

    return run


def run_all(fn: Callable[[T], R], items: Iterable[T], threads: int = 1) -> list[R]:
    """Return `[fn(item) for item in items]`, run on up to `threads` daemon threads; raise
    the first error one raised (the others are cancelled). An interruption of the waiting
    thread (KeyboardInterrupt, the CLI's SIGTERM) cancels them and is raised at once."""
    todo = list(enumerate(items))
    results: dict[int, R] = {}
    errors: list[BaseException] = []
    token = Token(current_token())
    done = threading.Condition()
    running = min(max(1, threads), len(todo))
    task = within(token, fn)

    def work() -> None:
        nonlocal running
        try:
            while True:
                with done:
                    if not todo or errors or token.event.is_set():
                        return
                    i, item = todo.pop(0)
                try:
                    value = task(item)
                except BaseException as exc:  # handed to the waiting thread, which raises it
                    with done:
                        errors.append(exc)
                    token.cancel()  # the others stop: their errors come after this one
                    return
                with done:
                    results[i] = value
        finally:
            with done:
                running -= 1
                done.notify_all()

    if not todo:
        return []
    for n in range(running):
        threading.Thread(target=work, name=f"rectool-download-{n}", daemon=True).start()
    try:
        with done:
            while running:
                # Woken now and then, not only when a thread ends: a signal whose handler ran
                # while this thread was on its way into the wait (or on another thread) does
                # not interrupt it, and is raised at the next wake-up (see `WAKE_S`).
                done.wait(WAKE_S)
    except BaseException:
        token.cancel()
        raise
    if errors:
        raise errors[0]  # the first: those after it were cancelled because of it
    return [results[i] for i in range(len(results))]


def run(fn: Callable[[], R]) -> R:
    """Return `fn()` run on a daemon thread (see `run_all`): a download the waiting thread
    can be interrupted out of, even when it stalls inside a library call."""
    return run_all(lambda _: fn(), [None])[0]
