"""What the live Airflow services run as: executor, metadata database, schedulers and Celery workers.

:class:`Topology` is the one option of :func:`tests.live.airflow_live.running_airflow` that changes
the deployment. Its default is the fast live tests' one: LocalExecutor, SQLite in ``AIRFLOW_HOME``,
one scheduler. A production-like topology names a PostgreSQL database and a Celery broker (Redis):
CeleryExecutor, several schedulers, Celery workers. Every service is a process group of its own,
and :func:`kill_service` ends a service with everything it started (task processes, Spark JVMs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Topology:
    """The executor, the metadata database and how many schedulers and Celery workers run."""

    database_url: str | None = None
    """SQLAlchemy URL of the metadata database; ``None``: SQLite in ``AIRFLOW_HOME``."""
    celery_broker_url: str | None = None
    """A Celery broker: CeleryExecutor with :attr:`celery_workers` workers; ``None``: LocalExecutor."""
    schedulers: int = 1
    celery_workers: int = 0
    worker_concurrency: int = 2

    def __post_init__(self) -> None:
        if (self.schedulers > 1 or self.celery_broker_url) and self.database_url is None:
            raise ValueError("several schedulers and CeleryExecutor need a shared database: set database_url")
        if (self.celery_broker_url is None) != (self.celery_workers == 0):
            raise ValueError("CeleryExecutor needs both celery_broker_url and celery_workers > 0")

    @property
    def executor(self) -> str:
        return "LocalExecutor" if self.celery_broker_url is None else "CeleryExecutor"

    def env(self) -> dict[str, str]:
        """The Airflow settings of this topology (on top of :func:`tests.live.airflow_live.service_env`)."""
        env = {"AIRFLOW__CORE__EXECUTOR": self.executor}
        if self.database_url is not None:
            env.update(
                {
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
                    # every service keeps a pool: small ones, so the services fit the test server's connections
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE": "2",
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW": "4",
                }
            )
        if self.celery_broker_url is not None:
            env.update(
                {
                    "AIRFLOW__CELERY__BROKER_URL": self.celery_broker_url,
                    "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self.database_url}",
                    # Celery's default, set: the provider warns in every process when it is not
                    "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
                }
            )
        return env

    def scheduler_names(self) -> list[str]:
        """``scheduler`` (the only one of the default topology), then ``scheduler-2``, …"""
        return ["scheduler", *(f"scheduler-{i}" for i in range(2, self.schedulers + 1))]

    def worker_names(self) -> list[str]:
        return [f"celery-worker-{i}" for i in range(1, self.celery_workers + 1)]

    def worker_command(self, name: str) -> list[str]:
        """``airflow celery worker`` for worker ``name``: task logs are local files (no log server)."""
        return ["celery", "worker", "--celery-hostname", f"{name}@%h", "--concurrency",
                str(self.worker_concurrency), "--skip-serve-logs", "--without-gossip", "--without-mingle"]  # fmt: skip


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid → (parent pid, process group, command name) of every live (not zombie) process."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            name, fields = text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                found[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), name)
    return found


def group_members(pgid: int) -> list[int]:
    """The pids of the live processes of process group ``pgid``."""
    return [pid for pid, (_, group, _) in _processes().items() if group == pgid]


def ancestors(pid: int) -> list[int]:
    """The parent, grandparent, … of process ``pid``."""
    processes, found = _processes(), []
    while pid in processes and (pid := processes[pid][0]) > 0:
        found.append(pid)
    return found


def kill_service(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> list[str]:
    """SIGKILL a service as a machine that dies would: its process group and the group of every
    descendant (Airflow's task supervisor puts each task process, with its Spark JVM, in a group of
    its own). Return once none of them is left, with the command names of the processes killed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGSTOP)  # frozen: no new child between the listing and the kill
    processes = _processes()
    tree, frontier = {proc.pid}, [proc.pid]
    while frontier:
        children = [pid for pid, (parent, _, _) in processes.items() if parent in frontier and pid not in tree]
        tree.update(children)
        frontier = children
    groups = {processes[pid][1] for pid in tree if pid in processes} | {proc.pid}
    killed = [name for pid, (_, group, name) in processes.items() if group in groups]
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while left := [pid for group in groups for pid in group_members(group)]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {left} of groups {sorted(groups)} survived SIGKILL for {timeout:.0f}s")
        time.sleep(0.05)
    return killed


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace`` seconds."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid  # the leader is gone; its group may still have members
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    # the leader may be gone while children (task runners, JVMs) linger: kill the rest
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
