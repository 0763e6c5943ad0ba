"""A real Redis server for the tests: Debian's ``redis-server`` on 127.0.0.1, the Celery broker.

The server listens on a free loopback port with a password (``requirepass``), keeps
nothing on disk (``--save ''``, no append-only file) and runs in a temp directory of its
own. ``scripts/install_redis.sh`` installs the binary (apt, as root); without it the tests
that need a broker are skipped, except in CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.servers.processes import stop_server

REDIS_SERVER = "redis-server"
START_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class RedisServer:
    port: int
    password: str

    def url(self, db: int = 0) -> str:
        """The broker URL Celery (kombu) connects with."""
        return f"redis://:{self.password}@127.0.0.1:{self.port}/{db}"

    def ping(self) -> bool:
        """Whether the server answers an authenticated ``PING`` (RESP, no client library)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            s.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
            answer = b""
            while answer.count(b"\r\n") < 2:
                chunk = s.recv(64)
                if not chunk:
                    break
                answer += chunk
        return answer == b"+OK\r\n+PONG\r\n"


def redis_binary() -> str | None:
    return shutil.which(REDIS_SERVER)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_redis() -> Iterator[RedisServer]:
    """Start ``redis-server`` in a fresh temp directory; stop it and remove the directory on exit."""
    binary = redis_binary()
    if binary is None:
        raise RuntimeError(f"{REDIS_SERVER} is not on PATH: run scripts/install_redis.sh (apt-get, as root)")
    directory = Path(tempfile.mkdtemp(prefix="checkpoint-redis-"))
    server = RedisServer(_free_port(), secrets.token_urlsafe(16))
    config = directory / "redis.conf"  # the password in a file of its own, not on a command line
    config.write_text(f"requirepass {server.password}\n")
    config.chmod(0o600)
    args = [binary, str(config), "--bind", "127.0.0.1", "--port", str(server.port), "--save", "",
            "--appendonly", "no", "--dir", str(directory), "--daemonize", "no"]  # fmt: skip
    started = time.monotonic()
    with open(directory / "redis.log", "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=directory)
    try:
        while True:
            try:
                if server.ping():
                    break
            except OSError:
                pass
            if time.monotonic() - started > START_TIMEOUT_SECONDS:
                raise RuntimeError(f"redis-server did not answer within {START_TIMEOUT_SECONDS:.0f}s")
            try:  # the poll interval doubles as the check that the server is still running
                process.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            log = (directory / "redis.log").read_text()
            raise RuntimeError(f"redis-server exited with {process.returncode}: {log}")
        yield server
    finally:
        stop_server(process, directory)
