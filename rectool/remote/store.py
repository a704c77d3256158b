"""Object stores: the folder of a remote pack, read (and written) object by object, with retries.

    store = open_store("s3://bucket/packs")        # or https://host/packs, gs://, az://
    for chunk in store.stream("faces-00000.rec"):  # retried and resumed by `Retry.stream`
        ...

`s3://`, `gs://` and `az://` go through obstore (the `rectool[remote]` extra), which reads its
endpoint and credentials from the environment as its own docs say (`AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, `AWS_ALLOW_HTTP`, ...); its own retries are turned off, so that `Retry`
decides for every store. `http://` and `https://` are read with the standard library's urllib,
by byte range (`Range: bytes=N-`, to resume a dropped transfer), and are read-only.

Errors name the URL without its credentials (`safe_url` drops a user:password and a query
string; `scrub` removes the values of credential variables from a library's message): the
one rule, `rectool.redaction`.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import InputError, RectoolError
from ..redaction import safe_url, scrub
from .transfer import STALL_ENV, Limits, check_cancelled, on_cancel, run

if TYPE_CHECKING:
    from http.client import HTTPResponse

    from _typeshed import StrPath
    from obstore import GetOptions
    from obstore.store import ClientConfig
    from obstore.store import ObjectStore as ObstoreStore

T = TypeVar("T")

_CHUNK = 1 << 20
URL_SCHEMES = ("s3", "gs", "az", "abfs", "http", "https")
_URL = re.compile(r"^(s3|gs|az|abfs|https?)://", re.I)


class RemoteError(RectoolError):
    """A remote object that cannot be read or written: names the URL, never a credential."""


class NotFoundError(RemoteError):
    """The object is not at the URL (HTTP 404, no such key)."""


class RemoteConfigError(RemoteError, InputError):
    """The environment names a store obstore cannot use (a bad endpoint): exit 2, never retried."""


class TransientError(RemoteError):
    """A failure worth retrying: a dropped connection, a timeout, HTTP 5xx or 429."""


def is_url(source: object) -> bool:
    """Return whether `source` names a remote object (s3://, gs://, az://, http(s)://)."""
    return isinstance(source, str) and bool(_URL.match(source))


def split_url(url: str) -> tuple[str, str]:
    """Return (folder URL, object name) of `url` (`s3://b/p/x.json` -> `s3://b/p`, `x.json`)."""
    folder, _, name = url.rstrip("/").rpartition("/")
    if not name or folder.endswith(":/") or "://" not in url:
        raise RemoteError(f"{safe_url(url)}: not the URL of an object (a manifest, a .rec)")
    return folder, name


class Retry:
    """How often and how long to retry: `attempts` tries, backoff doubling from `backoff`
    seconds up to `max_backoff`, with jitter. `sleep` is injected (tests pass a recorder)."""

    def __init__(
        self,
        attempts: int = 6,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        sleep: Callable[[float], object] = time.sleep,
        jitter: bool = True,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        self.attempts, self.backoff, self.max_backoff = attempts, backoff, max_backoff
        self.sleep, self.jitter = sleep, jitter

    def delay(self, failures: int) -> float:
        """Return the seconds to wait after `failures` failures in a row."""
        wait = min(self.max_backoff, self.backoff * 2 ** (failures - 1))
        return wait * (0.5 + random.random() / 2) if self.jitter else wait

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Return `fn()`, retried on `TransientError`; after the last try, a `RemoteError`
        naming `what` (the URL, and the shard). Each try runs on a thread of its own
        (`transfer.run`): an interruption of this one ends the wait at once."""
        for failures in range(1, self.attempts + 1):
            try:
                return run(fn)
            except TransientError as exc:
                if failures == self.attempts:
                    raise RemoteError(f"{what}: {exc} (gave up after {failures} tries)") from None
                self.sleep(self.delay(failures))
        raise AssertionError("unreachable")

    def stream(self, store: Store, name: str, size: int, what: str) -> Iterator[bytes]:
        """Yield the `size` bytes of object `name` in chunks; a transfer that fails is retried
        from the byte it reached (a range request), the failures in a row bounded by
        `attempts`."""
        done, failures = 0, 0
        while done < size:
            try:
                for chunk in store.stream(name, done):
                    n = len(chunk)
                    if done + n > size:
                        raise RemoteError(f"{what}: more than the {size} bytes the manifest lists")
                    done += n
                    failures = 0
                    yield chunk
                if done < size:
                    raise TransientError(f"the transfer ended at byte {done} of {size}")
            except TransientError as exc:
                failures += 1
                if failures >= self.attempts:
                    raise RemoteError(
                        f"{what}: {exc} (gave up after {failures} tries in a row, at byte {done} "
                        f"of {size})"
                    ) from None
                self.sleep(self.delay(failures))


def open_store(folder_url: str) -> Store:
    """Return the store of the objects under `folder_url` (`s3://bucket/prefix`, `https://...`)."""
    scheme = folder_url.split("://", 1)[0].lower()
    if scheme in ("http", "https"):
        return HttpStore(folder_url)
    if scheme in URL_SCHEMES:
        return ObjectStore(folder_url)
    raise RemoteError(f"{safe_url(folder_url)}: not a URL rectool reads ({', '.join(URL_SCHEMES)})")


class HttpStore:
    """Objects under an http(s):// folder, read by byte range with urllib (read-only).

    Each request is bounded as `transfer.Limits` says (`limits`: from the environment by
    default): a socket that receives nothing for `stall_s` seconds times out, a trickle or a
    request past its deadline is stopped (`transfer.Watch`), and a cancelled download has its
    connection shut."""

    writable = False

    def __init__(self, folder_url: str, limits: Limits | None = None) -> None:
        self.url, self.limits = folder_url.rstrip("/"), limits or Limits.from_env()

    def object_url(self, name: str) -> str:
        return f"{safe_url(self.url)}/{name}"

    def _open(self, name: str, start: int) -> HTTPResponse:
        import http.client  # here, not at the top: only an https:// pack needs them
        import urllib.error
        import urllib.request

        headers = {"Range": f"bytes={start}-"} if start else {}
        request = urllib.request.Request(f"{self.url}/{urllib.parse.quote(name)}", headers=headers)
        try:
            response: HTTPResponse = urllib.request.urlopen(request, timeout=self.limits.stall_s)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404:
                raise NotFoundError(f"{self.object_url(name)}: not found (HTTP 404)") from None
            kind = TransientError if exc.code >= 500 or exc.code == 429 else RemoteError
            raise kind(f"HTTP {exc.code} {exc.reason}") from None
        except TimeoutError:
            raise TransientError(self._silent()) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise TransientError(self._silent()) from None
            raise TransientError(scrub(f"cannot connect ({reason})")) from None
        return response

    def _silent(self) -> str:
        stall = self.limits.stall_s
        return f"stalled: nothing received for {stall:g} s (set {STALL_ENV} to wait longer)"

    def stream(self, name: str, start: int = 0, limit: int | None = None) -> Iterator[bytes]:
        """Yield the bytes of object `name` from byte `start`; `limit`: refuse an object of
        more bytes (`transfer.Limits.too_large`), by its Content-Length before any is read."""
        from http.client import HTTPException

        response = self._open(name, start)
        with response, on_cancel(lambda: _shut(response)):
            skip = start if start and response.status != 206 else 0  # a server without ranges
            length = response.getheader("Content-Length")
            if limit is not None and length and length.isdigit() and int(length) > limit:
                raise self.limits.too_large(self.object_url(name), int(length))
            watch, total = self.limits.watch(), 0
            try:
                while chunk := response.read1(_CHUNK):
                    watch.got(len(chunk))
                    total += len(chunk)
                    if limit is not None and total > limit:
                        raise self.limits.too_large(self.object_url(name), total)
                    if skip:
                        chunk, skip = chunk[skip:], max(0, skip - len(chunk))
                    if chunk:
                        yield chunk
            except TimeoutError:
                raise TransientError(self._silent()) from None
            except (OSError, HTTPException) as exc:
                check_cancelled()
                raise TransientError(f"connection lost ({type(exc).__name__}: {exc})") from None

    def read(self, name: str, limit: int | None = None) -> bytes:
        """Return the whole object `name` (one try; see `Retry.call`), at most `limit` bytes
        (default: the limits' `max_bytes`)."""
        return b"".join(self.stream(name, limit=limit or self.limits.max_bytes))

    def put(self, name: str, path: StrPath) -> None:
        raise RemoteError(f"{self.object_url(name)}: http(s):// is read-only; write to s3://")


def _shut(response: HTTPResponse) -> None:
    """Shut the connection of `response` from another thread: a read blocked on it returns."""
    import socket

    try:
        fd = response.fileno()
    except (OSError, ValueError, AttributeError):  # closed already
        return
    with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as sock:  # a duplicate of it
        sock.shutdown(socket.SHUT_RDWR)  # shuts the connection itself, for every descriptor


_obstore_pid: int | None = (
    None  # the process that started obstore's runtime (a forked child cannot use it)
)


def obstore_forked() -> bool:
    """Return whether this process was forked from one that had used obstore (whose runtime
    threads it lacks: a request would hang; `fetch.download_elsewhere` is the way round)."""
    return _obstore_pid not in (None, os.getpid())


class ObjectStore:
    """Objects under an s3:// (gs://, az://) folder, through obstore; picklable as its URL."""

    writable = True

    def __init__(self, folder_url: str, limits: Limits | None = None) -> None:
        self.url = folder_url.rstrip("/")
        self._store: ObstoreStore | None = None
        self._limits = limits

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "_store": None, "_limits": self._limits}

    def object_url(self, name: str) -> str:
        return f"{safe_url(self.url)}/{name}"

    def fork_unsafe(self) -> bool:
        return obstore_forked()

    def store(self) -> ObstoreStore:
        global _obstore_pid
        if obstore_forked():
            raise RemoteError(
                f"{safe_url(self.url)}: obstore cannot run in a process forked after it ran "
                "(use the spawn start method, or open the pack in this process)"
            )
        _obstore_pid = os.getpid()
        if self._store is None:
            try:
                from obstore.store import from_url
            except ImportError:
                raise RemoteError(
                    f"{safe_url(self.url)}: reading object storage needs obstore: "
                    "pip install 'rectool[remote]'"
                ) from None
            check_endpoint(self.url)
            limits = self.limits()
            options: ClientConfig = {
                "connect_timeout": f"{limits.stall_s:g}s",
                "read_timeout": f"{limits.stall_s:g}s",
                "timeout": f"{limits.deadline_s:g}s",
            }
            if _http_allowed():  # read from the environment only when no options are given
                options["allow_http"] = True
            try:
                self._store = from_url(
                    self.url, retry_config={"max_retries": 0}, client_options=options
                )
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # obstore's configuration errors; a Rust panic too
                raise RemoteError(f"{safe_url(self.url)}: {_first_line(exc)}") from None
        return self._store

    def limits(self) -> Limits:
        """Return the limits of this store's requests (`transfer.Limits`, from the environment
        unless given)."""
        if self._limits is None:
            self._limits = Limits.from_env()
        return self._limits

    def stream(self, name: str, start: int = 0, limit: int | None = None) -> Iterator[bytes]:
        """Yield the bytes of object `name` from byte `start`; `limit`: refuse an object of
        more bytes (`transfer.Limits.too_large`), by its size before any is read."""
        import obstore

        options: GetOptions | None = {"range": {"offset": start}} if start else None
        limits = self.limits()
        try:
            result = obstore.get(self.store(), name, options=options)
            size = result.meta.get("size")
            if limit is not None and isinstance(size, int) and size > limit:
                raise limits.too_large(self.object_url(name), size)
            watch, total = limits.watch(), 0
            for chunk in result.stream(min_chunk_size=_CHUNK):
                watch.got(len(chunk))
                total += len(chunk)
                if limit is not None and total > limit:
                    raise limits.too_large(self.object_url(name), total)
                yield chunk
        except Exception as exc:
            raise _translated(exc, self.object_url(name)) from None

    def read(self, name: str, limit: int | None = None) -> bytes:
        """Return the whole object `name` (one try; see `Retry.call`), at most `limit` bytes
        (default: the limits' `max_bytes`)."""
        if obstore_forked():
            from .fetch import run_elsewhere

            return run_elsewhere(self.read, name, limit)
        limit = limit or self.limits().max_bytes
        return b"".join(bytes(chunk) for chunk in self.stream(name, limit=limit))

    def exists(self, name: str) -> bool:
        """Return whether object `name` is there (one try; see `Retry.call`)."""
        import obstore

        if obstore_forked():
            from .fetch import run_elsewhere

            return run_elsewhere(self.exists, name)
        try:
            obstore.head(self.store(), name)
        except Exception as exc:
            error = _translated(exc, self.object_url(name))
            if isinstance(error, NotFoundError):
                return False
            raise error from None
        return True

    def names(self) -> list[str]:
        """Return the names of the objects directly in this folder (one try)."""
        import obstore

        if obstore_forked():
            from .fetch import run_elsewhere

            return run_elsewhere(self.names)
        try:
            listing = obstore.list_with_delimiter(self.store())
        except Exception as exc:
            raise _translated(exc, safe_url(self.url)) from None
        return [meta["path"].rsplit("/", 1)[-1] for meta in listing["objects"]]

    def delete(self, names: Iterable[str]) -> None:
        """Delete the objects `names` (those not there are no error; one try)."""
        import obstore

        if obstore_forked():
            from .fetch import run_elsewhere

            return run_elsewhere(self.delete, names)
        try:
            obstore.delete(self.store(), list(names))
        except Exception as exc:
            raise _translated(exc, safe_url(self.url)) from None

    def put(self, name: str, path: StrPath) -> None:
        """Upload the local file `path` as object `name` (multipart for large files)."""
        import obstore

        if obstore_forked():
            from .fetch import run_elsewhere

            return run_elsewhere(self.put, name, path)

        from ..doors.inputs import open_input

        with open_input(path, "file to upload") as f:
            try:
                obstore.put(self.store(), name, f)
            except Exception as exc:
                raise _translated(exc, self.object_url(name)) from None


def _first_line(exc: BaseException) -> str:
    return scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)


def _translated(exc: BaseException, url: str) -> RectoolError:
    """Return the rectool error for an obstore exception about `url`: only what may pass
    (a dropped connection, a timeout, a server's 5xx) is a `TransientError`, retried."""
    from obstore import exceptions

    line = _first_line(exc)
    if isinstance(exc, (FileNotFoundError, exceptions.NotFoundError)):
        return NotFoundError(f"{url}: not found")
    if isinstance(exc, (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError)):
        return RemoteError(f"{url}: access refused ({line})")
    if isinstance(exc, RectoolError):
        return exc
    if "builder error" in str(exc):  # reqwest refused to build the request: configuration
        return RemoteError(f"{url}: the request cannot be made ({line}); {_ENDPOINT_HINT}")
    permanent = (
        exceptions.InvalidPathError,
        exceptions.NotSupportedError,
        exceptions.UnknownConfigurationKeyError,
        exceptions.PreconditionError,
    )
    if isinstance(exc, permanent):
        return RemoteError(f"{url}: {line}")
    return TransientError(line)


_ENDPOINT_HINT = (
    "check AWS_ENDPOINT_URL (a URL such as https://s3.example.com) and, for an http:// "
    "endpoint, set AWS_ALLOW_HTTP=true"
)


def _http_allowed() -> bool:
    return os.environ.get("AWS_ALLOW_HTTP", "").strip().lower() == "true"


def check_endpoint(url: str) -> None:
    """Refuse, in one line that says what to set, an s3:// store's endpoint in the
    environment that obstore cannot use: not a URL, or http:// without AWS_ALLOW_HTTP=true
    (obstore panics on the one, and fails each request of the other as a "builder error")."""
    if not url.lower().startswith("s3://"):
        return
    import urllib.parse

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
        endpoint = os.environ.get(name)
        if not endpoint:
            continue
        shown = safe_url(endpoint)
        try:
            parts = urllib.parse.urlsplit(endpoint)
            host = parts.hostname
        except ValueError:
            parts, host = None, None
        if parts is None or parts.scheme.lower() not in ("http", "https") or not host:
            raise RemoteConfigError(
                f"{name}={shown!r} is not a URL: set it to the address of the S3 server "
                "(such as https://s3.example.com or http://127.0.0.1:9000), or unset it for AWS"
            )
        if parts.scheme.lower() == "http" and not _http_allowed():
            raise RemoteConfigError(
                f"{name}={shown} is http:// (no TLS): set AWS_ALLOW_HTTP=true to use it, "
                "or give an https:// endpoint"
            )


# A store of a pack's folder: what `open_store` returns.
Store = HttpStore | ObjectStore
