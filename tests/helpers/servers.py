"""Real servers on 127.0.0.1 for the remote tests: an S3 server (moto's) and a plain HTTP
server of byte ranges, both counting GETs and injecting faults as told.

    faults.plan("faces-00001.rec", "500", "500")   # its next two GETs answer 500
    faults.plan("faces-00002.rec", "drop")         # the next one stops half way, connection shut
    faults.latency = 0.05                          # every request waits 50 ms first (benchmarks)
    faults.gets["faces-00001.rec"]                 # GETs of that object so far
    faults.refused_puts.add("faces-00002.rec")     # (S3) its uploads answer 403 Access Denied
    faults.uploaded                                # (S3) objects stored, in the order they were

Hostile answers (issue 36), released by `faults.release.set()` (`reset` and `stop` do it):

    faults.plan("x.manifest.json", "stall")    # half the body, then nothing until released
    faults.plan("x.manifest.json", "trickle")  # a byte each time `faults.pace.set()` is called
    faults.plan("x.manifest.json", "endless")  # (HTTP) no length, bytes until the client goes
    faults.plan("x.manifest.json", "huge")     # (HTTP) Content-Length 3 GB, a few bytes, cut
    faults.wait_get("faces-00001.rec")         # block until it was asked for (a bound, not a test)

The test and the server run in one process: nothing here depends on timing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter, defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Faults:
    """What the servers do wrong, per object name, and what they were asked."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.gets, self.puts = Counter(), Counter()
            self.ranges = defaultdict(list)  # name -> the first byte asked for, per GET
            self.planned = defaultdict(deque)
            self.latency = 0.0
            self.refused_puts = set()
            self.uploaded = []  # names of the objects PUT, as each is stored
            self.stored = threading.Condition(self.lock)
            self.asked = threading.Condition(self.lock)
            release = getattr(self, "release", None)
            if release is not None:
                release.set()  # a handler still stalled from before lets go
            self.release = threading.Event()
            self.pace = Pace()
            self.endless_bytes = 64 << 20  # "endless": a bound for a test that would not end

    def on_stored(self, name):
        with self.lock:
            self.uploaded.append(name)
            self.stored.notify_all()

    def wait_stored(self, name, timeout=120):
        """Return whether object `name` is stored (waiting for it, at most `timeout` s: a
        bound for a test that would otherwise hang, never a condition it tests)."""
        with self.lock:
            return self.stored.wait_for(lambda: name in self.uploaded, timeout)

    def plan(self, name, *actions):
        """Answer the next GETs of `name` with `actions` ("500", "drop"), then normally."""
        with self.lock:
            self.planned[name].extend(actions)

    def on_get(self, name, start):
        with self.lock:
            self.gets[name] += 1
            self.ranges[name].append(start)
            self.asked.notify_all()
            queue = self.planned.get(name)
            return queue.popleft() if queue else None

    def wait_get(self, name, timeout=120):
        """Return whether object `name` was asked for (waiting at most `timeout` s: a bound
        for a test that would otherwise hang, never a condition it tests)."""
        with self.lock:
            return self.asked.wait_for(lambda: self.gets[name] > 0, timeout)

    def stall(self, release_after=600):
        """Wait until released (the bound: a test never leaves a handler behind for ever)."""
        self.release.wait(release_after)

    def trickle(self, write, body, turns):
        """Write `body` a byte at each of its `turns` (`Pace.begin`), until released or the
        body is done."""
        for i in range(len(body)):
            while not turns.acquire(timeout=0.05):
                if self.release.is_set():
                    return
            try:
                write(body[i : i + 1])
            except OSError:  # the client gave up: what a stall timeout does
                return

    def wait(self):
        if self.latency:
            time.sleep(self.latency)


class Pace:
    """A trickling response's turns: `set` (a test's injected clock, at each reading) lets
    the newest trickling response write one byte more. Each response has turns of its own,
    taken before its headers are sent: one the client gave up on (a first try, still
    trickling) never takes a byte of the next one's, whatever the load."""

    def __init__(self):
        self.lock = threading.Lock()
        self.current = threading.Semaphore(0)

    def begin(self):
        with self.lock:
            self.current = threading.Semaphore(0)
            return self.current

    def set(self):
        with self.lock:
            self.current.release()


def _range_start(header):
    if header and header.startswith("bytes="):
        return int(header[6:].split("-", 1)[0] or 0)
    return 0


# --- a plain HTTP server of byte ranges -----------------------------------------------------------


class RangeServer:
    """Serves the files under `root` at http://127.0.0.1:PORT/, honouring `Range: bytes=N-`."""

    def __init__(self, root, faults=None):
        self.root, self.faults = Path(root), faults or Faults()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                server.faults.wait()
                name = self.path.lstrip("/").split("?", 1)[0]
                start = _range_start(self.headers.get("Range"))
                action = server.faults.on_get(Path(name).name, start)
                turns = server.faults.pace.begin() if action == "trickle" else None
                path = server.root / name
                if action == "500":
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if action in ("endless", "huge"):
                    self._hostile(action)
                    return
                if not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = path.read_bytes()
                body = data[start:]
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if action == "drop":
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if action == "stall":
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    server.faults.stall()
                    self.close_connection = True
                    return
                if action == "trickle":
                    self.wfile.flush()
                    server.faults.trickle(self._write_flushed, body, turns)
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def _write_flushed(self, data):
                self.wfile.write(data)
                self.wfile.flush()

            def _hostile(self, action):
                """An endless body (no length) or a 3 GB Content-Length over a few bytes."""
                self.send_response(200)
                if action == "huge":
                    self.send_header("Content-Length", str(3 << 30))
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                if action == "huge":
                    self.wfile.write(b"{" * 100)
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                block, sent = b" " * (1 << 20), 0
                try:
                    while sent < server.faults.endless_bytes and not server.faults.release.is_set():
                        self.wfile.write(block)
                        sent += len(block)
                except OSError:  # the client went away: what a refusal does
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self):
        self.faults.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


# --- moto's S3 server, behind a counting and faulting middleware ---------------------------------


class _Middleware:
    def __init__(self, app, faults):
        self.app, self.faults = app, faults

    def __call__(self, environ, start_response):
        self.faults.wait()
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        name = path.rstrip("/").rsplit("/", 1)[-1]
        is_object = path.strip("/").count("/") >= 1  # /bucket/key...: not a bucket request
        if method == "PUT" and is_object and "uploadId" not in environ.get("QUERY_STRING", ""):
            with self.faults.lock:
                self.faults.puts[name] += 1
                refused = name in self.faults.refused_puts
            if refused:
                body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
                start_response("403 Forbidden", [("Content-Length", str(len(body)))])
                return [body]
            answer = self.app(environ, start_response)  # the object is stored when it returns
            self.faults.on_stored(name)
            return answer
        if method != "GET" or not is_object:
            return self.app(environ, start_response)
        action = self.faults.on_get(name, _range_start(environ.get("HTTP_RANGE")))
        if action == "500":
            start_response("500 Internal Server Error", [("Content-Length", "0")])
            return [b""]
        if action not in ("drop", "stall"):
            return self.app(environ, start_response)
        answer = {}

        def keep(status, headers, exc_info=None):
            answer.update(status=status, headers=headers)

        body = b"".join(self.app(environ, keep))
        start_response(answer["status"], answer["headers"])
        return _cut(body) if action == "drop" else _stalled(body, self.faults)


def _cut(body):
    yield body[: len(body) // 2]
    raise ConnectionAbortedError("the test server drops this connection half way")


def _stalled(body, faults):
    yield body[: len(body) // 2]
    faults.stall()
    raise ConnectionAbortedError("the test server ends a stalled answer")


class S3Server:
    """moto's S3 on 127.0.0.1 (its in-memory backend), with `faults`; `env` for obstore."""

    def __init__(self, faults=None):
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
        self.faults = faults or Faults()
        app = _Middleware(DomainDispatcherApplication(create_backend_app), self.faults)
        # Port 0: the kernel's free port, bound at once (a port found free, then bound, may
        # be taken meanwhile by another test process running beside this one).
        self.httpd = make_server(
            "127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler
        )
        self.port = self.httpd.server_port
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "testing-key-id",
            "AWS_SECRET_ACCESS_KEY": "testing-secret-never-shown",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )

    def upload_folder(self, bucket, folder, prefix=""):
        """Create `bucket` and put every file of `folder` under `prefix`."""
        client = self.client()
        client.create_bucket(Bucket=bucket)
        for path in sorted(Path(folder).iterdir()):
            if path.is_file():
                client.put_object(Bucket=bucket, Key=prefix + path.name, Body=path.read_bytes())

    def objects(self, bucket, prefix=""):
        """Return {key: bytes} of the objects under `prefix`."""
        client, out = self.client(), {}
        for item in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
            out[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return out

    def stop(self):
        self.faults.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


def use_env(env):
    """Set `env` in os.environ; return a function that puts the old values back."""
    old = {name: os.environ.get(name) for name in env}
    os.environ.update(env)

    def restore():
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return restore


def no_wait(seconds):
    """A `Retry(sleep=...)` that does not wait (picklable, for helper processes)."""
