"""Named fault points, switched on only by tests and demos; free when off.

``CHECKPOINT_FAULTS`` holds comma-separated specs ``point[:key=value]...``, for example
``step.before_ack:checkpoint=2:attempt=1,finalize.after_metadata:checkpoint=4``. A fault
point fires when its name and every given key match. The optional ``action`` key says
what happens: ``raise`` (default, :class:`InjectedFault`), ``oserror`` (an ``OSError``,
as a failing filesystem would raise), ``kill`` (SIGKILL of the current process, as a
dead worker) or ``pause``: the process creates ``<point>.paused`` in the directory named
by ``CHECKPOINT_FAULTS_PAUSE_DIR`` and waits (at most ten minutes) until a test creates
``<point>.resume`` there — so a test can act at an exact moment, e.g. kill an executor
in the middle of a step.

Within :func:`fault_scope` every fault point also matches the scope's keys: a chained
checkpoint task passes ``attempt`` (its try number) to the trigger and finalize points too.

``CHECKPOINT_FAULTS_FILE`` names a file with more specs (one per line), re-read at every
fault point: a test can change the faults of running Airflow services between DAG runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from contextvars import ContextVar

from airflow_provider_checkpoint.exceptions import InjectedFault

ENV = "CHECKPOINT_FAULTS"
FILE_ENV = "CHECKPOINT_FAULTS_FILE"
PAUSE_DIR_ENV = "CHECKPOINT_FAULTS_PAUSE_DIR"
PAUSE_LIMIT_SECONDS = 600.0
_SCOPE: ContextVar[tuple[tuple[str, object], ...]] = ContextVar("fault_scope", default=())


def _specs() -> list[str]:
    specs = [s for s in os.environ.get(ENV, "").split(",") if s.strip()]
    path = os.environ.get(FILE_ENV)
    if path:
        try:
            with open(path) as f:
                specs += [line.strip() for line in f if line.strip() and not line.startswith("#")]
        except FileNotFoundError:
            pass
    return specs


@contextlib.contextmanager
def fault_scope(**where: object) -> Iterator[None]:
    """Add ``where`` to every fault point inside (keys a point passes itself win)."""
    token = _SCOPE.set(tuple({**dict(_SCOPE.get()), **where}.items()))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def fault_point(name: str, **where: object) -> None:
    for action, message in armed(name, **where):
        fire(name, action, message)


def armed(name: str, **where: object) -> list[tuple[str, str]]:
    """``(action, message)`` of every fault spec that matches point ``name`` at ``where`` now; a process
    that cannot see the specs (a Spark executor's long-lived Python worker) is handed them to :func:`fire`."""
    if ENV not in os.environ and FILE_ENV not in os.environ:
        return []
    where = {**dict(_SCOPE.get()), **where}
    found = []
    for spec in _specs():
        point, *conditions = spec.strip().split(":")
        if point != name:
            continue
        wanted = dict(c.split("=", 1) for c in conditions)
        action = wanted.pop("action", "raise")
        if all(str(where.get(k)) == v for k, v in wanted.items()):
            found.append((action, f"injected fault at {name} ({', '.join(f'{k}={v}' for k, v in where.items())})"))
    return found


def fire(name: str, action: str, message: str) -> None:
    """Do what an armed fault point does: pause, kill this process, or raise."""
    if action == "pause":
        _pause(name)
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "oserror":
        raise OSError(message)
    raise InjectedFault(message)


def _pause(name: str) -> None:
    directory = os.environ.get(PAUSE_DIR_ENV)
    if not directory:
        raise InjectedFault(f"fault action pause at {name} needs {PAUSE_DIR_ENV}")
    resume = os.path.join(directory, f"{name}.resume")
    with open(os.path.join(directory, f"{name}.paused"), "w"):
        pass
    deadline = time.monotonic() + PAUSE_LIMIT_SECONDS
    while not os.path.exists(resume):
        if time.monotonic() > deadline:
            raise InjectedFault(f"paused at {name} for {PAUSE_LIMIT_SECONDS:.0f}s: nobody created {resume}")
        time.sleep(0.05)
