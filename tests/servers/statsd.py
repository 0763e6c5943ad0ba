"""A real StatsD daemon for the tests: Etsy's ``statsd`` (npm, installed by ``scripts/install_statsd.sh``
into ``.cache/statsd``) on 127.0.0.1, UDP for metrics, its TCP admin interface for reading them back.

The session fixture starts it once, with no backend and a flush interval of an hour: nothing is
flushed (and reset) during a test session, so the admin commands ``counters``, ``gauges`` and
``timers`` show everything received since the start. Tests keep apart by a metric prefix of their own.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.servers.s3 import free_ports

STATS_JS = REPO / ".cache" / "statsd" / "node_modules" / "statsd" / "stats.js"
_ENTRY = re.compile(r"(?:'((?:[^'\\]|\\.)*)'|([A-Za-z_$][\w$]*)):\s*(\[[^\]]*\]|[-+0-9.eE]+)")


def parse_dump(text: str) -> dict[str, Any]:
    """The ``{name: number | [numbers]}`` of one admin answer (Node's ``util.inspect`` of an object)."""
    out: dict[str, Any] = {}
    for quoted, bare, value in _ENTRY.findall(text):
        if value.startswith("["):
            out[quoted or bare] = [float(v) for v in value.strip("[] \n").replace("\n", " ").split(",") if v.strip()]
        else:
            out[quoted or bare] = float(value)
    return out


@dataclass
class StatsdDaemon:
    """One ``statsd`` process: metrics on UDP ``127.0.0.1:port``, admin on TCP ``127.0.0.1:admin_port``."""

    port: int
    admin_port: int
    process: subprocess.Popen[bytes]
    log: Path

    def admin(self, command: str) -> str:
        """The daemon's answer to admin ``command``, up to its ``END`` line."""
        with socket.create_connection(("127.0.0.1", self.admin_port), timeout=5) as s:
            s.sendall(command.encode() + b"\n")
            data = b""
            while not data.endswith(b"END\n\n"):
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError(f"statsd admin closed the connection after {data[-500:]!r}")
                data += chunk
        return data.decode()

    def dump(self, kind: str) -> dict[str, Any]:
        """``counters``, ``gauges`` or ``timers`` (every value received since the daemon started)."""
        return parse_dump(self.admin(kind).rsplit("END", 1)[0])


def _start(directory: Path) -> StatsdDaemon:
    if not STATS_JS.exists():
        setup = subprocess.run(["bash", str(REPO / "scripts" / "install_statsd.sh")], capture_output=True, text=True)
        if setup.returncode != 0:
            message = f"no StatsD daemon: {setup.stderr.strip() or setup.stdout.strip()}"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
    port, admin_port = free_ports(2)
    config = directory / "statsd-config.js"
    config.write_text(
        json.dumps(
            {
                "address": "127.0.0.1",
                "port": port,
                "mgmt_address": "127.0.0.1",
                "mgmt_port": admin_port,
                "backends": [],
                "flushInterval": 3_600_000,
                "automaticConfigReload": False,
            }
        )
    )
    log = directory / "statsd.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            ["node", str(STATS_JS), str(config)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    daemon = StatsdDaemon(port, admin_port, process, log)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"statsd exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            daemon.dump("counters")
            return daemon
        except OSError:
            time.sleep(0.05)  # polling the admin port: the daemon binds it when ready
    process.terminate()
    raise RuntimeError(f"statsd did not listen on 127.0.0.1:{admin_port}: {log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def statsd_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StatsdDaemon]:
    daemon = _start(tmp_path_factory.mktemp("statsd"))
    yield daemon
    daemon.process.terminate()
    try:
        daemon.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        daemon.process.kill()
