"""Killing a submitted step: the driver through its hook, then every local process it left."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

log = logging.getLogger(__name__)
SUBMITTED_STEP_ENV = "CHECKPOINT_SUBMITTED_STEP"
"""Tags every local process of a submitted step attempt, so killing the task finds them all."""
KILL_SECONDS = 30.0


def kill_step_processes(hook: Any, tag: str) -> None:
    """The hook's ``on_kill`` (kills spark-submit, i.e. the driver JVM, and cluster-side
    work), then every local process this attempt started that outlived it: the Python
    driver and its workers, found by the tag in their environment (reparented ones
    too), until none is left or :data:`KILL_SECONDS` pass."""
    import psutil

    process = getattr(hook, "_submit_sp", None)
    try:
        started = psutil.Process(process.pid).children(recursive=True) if process is not None else []
    except psutil.Error:
        started = []
    hook.on_kill()
    deadline = time.monotonic() + KILL_SECONDS
    while True:
        alive = [p for p in {*started, *tagged_processes(tag)} if _running(p)]
        if not alive or time.monotonic() > deadline:
            break
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=2)
    if alive:
        log.warning("processes of the killed step still alive: %s", sorted(p.pid for p in alive))


def _running(process: Any) -> bool:
    import psutil

    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def tagged_processes(tag: str) -> list[Any]:
    """Every local process whose environment carries ``tag`` (:data:`SUBMITTED_STEP_ENV`)."""
    import psutil

    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get(SUBMITTED_STEP_ENV) == tag:
                found.append(p)
    return found
