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

from ..errors import RectoolError
from ..redaction import safe_url, scrub

if TYPE_CHECKING:
    from http.client import HTTPResponse

    from _typeshed import StrPath
    from obstore import GetOptions
    from obstore.store import ObjectStore as ObstoreStore

T = TypeVar("T")

_CHUNK = 1 << 20
URL_SCHEMES = ("s3", "gs", "az", "abfs", "http", "https")
_URL = re.compile(r"^(s3|gs|az|abfs|https?)://", re.I)


class RemoteError(RectoolError):
    """A remote object that cannot be read or written: names the URL, never a credential."""


class NotFoundError(RemoteError):
    """The object is not at the URL (HTTP 404, no such key)."""


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
        naming `what` (the URL, and the shard)."""
        for failures in range(1, self.attempts + 1):
            try:
                return fn()
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
    """Objects under an http(s):// folder, read by byte range with urllib (read-only)."""

    writable = False

    def __init__(self, folder_url: str, timeout: float = 60.0) -> None:
        self.url, self.timeout = folder_url.rstrip("/"), timeout

    def object_url(self, name: str) -> str:
        return f"{safe_url(self.url)}/{name}"

    def _open(self, name: str, start: int) -> HTTPResponse:
        import http.client  # here, not at the top: only an https:// pack needs them
        import urllib.error
        import urllib.request

        headers = {"Range": f"bytes={start}-"} if start else {}
        request = urllib.request.Request(f"{self.url}/{urllib.parse.quote(name)}", headers=headers)
        try:
            response: HTTPResponse = urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404:
                raise NotFoundError(f"{self.object_url(name)}: not found (HTTP 404)") from None
            kind = TransientError if exc.code >= 500 or exc.code == 429 else RemoteError
            raise kind(f"HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise TransientError(scrub(f"cannot connect ({reason})")) from None
        return response

    def stream(self, name: str, start: int = 0) -> Iterator[bytes]:
        """Yield the bytes of object `name` from byte `start`."""
        from http.client import HTTPException

        response = self._open(name, start)
        with response:
            skip = start if start and response.status != 206 else 0  # a server without ranges
            try:
                while chunk := response.read(_CHUNK):
                    if skip:
                        chunk, skip = chunk[skip:], max(0, skip - len(chunk))
                    if chunk:
                        yield chunk
            except (TimeoutError, OSError, HTTPException) as exc:
                raise TransientError(f"connection lost ({type(exc).__name__}: {exc})") from None

    def read(self, name: str) -> bytes:
        """Return the whole object `name` (one try; see `Retry.call`)."""
        return b"".join(self.stream(name))

    def put(self, name: str, path: StrPath) -> None:
        raise RemoteError(f"{self.object_url(name)}: http(s):// is read-only; write to s3://")


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

    def __init__(self, folder_url: str) -> None:
        self.url = folder_url.rstrip("/")
        self._store: ObstoreStore | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "_store": None}

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
            try:
                self._store = from_url(self.url, retry_config={"max_retries": 0})
            except Exception as exc:  # obstore's configuration errors
                raise RemoteError(f"{safe_url(self.url)}: {_first_line(exc)}") from None
        return self._store

    def stream(self, name: str, start: int = 0) -> Iterator[bytes]:
        """Yield the bytes of object `name` from byte `start`."""
        import obstore

        options: GetOptions | None = {"range": {"offset": start}} if start else None
        try:
            result = obstore.get(self.store(), name, options=options)
            yield from result.stream(min_chunk_size=_CHUNK)
        except Exception as exc:
            raise _translated(exc, self.object_url(name)) from None

    def read(self, name: str) -> bytes:
        """Return the whole object `name` (one try; see `Retry.call`)."""
        if obstore_forked():
            from .fetch import run_elsewhere

            return run_elsewhere(self.read, name)
        return b"".join(bytes(chunk) for chunk in self.stream(name))

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
    """Return the rectool error for an obstore exception about `url`."""
    from obstore import exceptions

    line = _first_line(exc)
    if isinstance(exc, (FileNotFoundError, exceptions.NotFoundError)):
        return NotFoundError(f"{url}: not found")
    if isinstance(exc, (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError)):
        return RemoteError(f"{url}: access refused ({line})")
    if isinstance(exc, RectoolError):
        return exc
    return TransientError(line)


# A store of a pack's folder: what `open_store` returns.
Store = HttpStore | ObjectStore
