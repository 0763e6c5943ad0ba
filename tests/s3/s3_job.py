"""A job of the unit tests' pipeline (:mod:`tests.unit.helpers`) whose storage root is on the S3 server.

The landing directory and the table stay local; the state files a step would write go to S3.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan
from airflow_provider_checkpoint.storage import JobStorage
from tests.unit.helpers import Env, make_ack, state_rel


def coordinator_on(env: Env, storage: JobStorage, *allowed_roots: str) -> CheckpointCoordinator:
    """``env``'s pipeline and settings on ``storage``; savepoints may also go under ``allowed_roots``."""
    roots = [storage.url().rsplit("/", 1)[0], *allowed_roots] if allowed_roots else None
    return CheckpointCoordinator(storage, env.coordinator.graph, env.coordinator.settings, None, roots)


def s3_ack(env: Env, storage: JobStorage, plan: CheckpointPlan) -> Ack:
    """The ack of a step attempt whose state file was written to ``storage``."""
    ack = make_ack(env, plan)
    rel = state_rel(plan.checkpoint_id, 1)
    storage.write_atomic(rel, (env.job_dir / rel).read_bytes())
    return ack


@contextmanager
def counted_requests(storage: JobStorage) -> Iterator[Counter[str]]:
    """Count the S3 API calls ``storage``'s real client makes (botocore's own event hooks)."""
    storage.fs.connect()
    events = storage.fs.s3.meta.events
    counts: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        counts[model.name] += 1

    events.register("before-call.s3", count)
    try:
        yield counts
    finally:
        events.unregister("before-call.s3", count)
