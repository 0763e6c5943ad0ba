"""The checkpoint in flight: the newest planned checkpoint (``chk-<id>/_plan.json``) that has no
stats record yet, whose run holds the job's lease or still runs, with each step's ack received
or pending and the lease holder.

An ack is received when the step's ack for this checkpoint is in XCom (the step task's return
value; the ``ack`` key of a chained task) or the step's task succeeded. Pure functions of the
plan, the lease (both untrusted: malformed is ``None``) and what Airflow's database knows of
the run (:class:`~.runs.RunFacts`).
"""

from __future__ import annotations

from typing import Any

from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.jobs import values
from airflow_provider_checkpoint.jobs.runs import RunFacts

RETURN_VALUE, CHAINED_ACK = "return_value", "ack"
ACTIVE_RUN = ("queued", "running")


def ack_source(step: str, chained_task: str | None) -> tuple[str, str]:
    """The task and XCom key holding ``step``'s ack."""
    return (chained_task, CHAINED_ACK) if chained_task else (step, RETURN_VALUE)


def step_ack(step: str, checkpoint_id: int, facts: RunFacts, chained_task: str | None) -> JsonDict:
    """Whether ``step`` acked checkpoint ``checkpoint_id``, when, and its task's state and latest try number."""
    task, key = ack_source(step, chained_task)
    value, pushed = facts.xcoms.get((task, key), (None, None))
    ack = values.mapping(value)
    acked = ack.get("checkpoint_id") == checkpoint_id and ack.get("step") == step
    tries = facts.tries.get(task, [])
    state = tries[-1]["state"] if tries else None
    if not acked and state == "success" and chained_task is None:
        acked, pushed = True, tries[-1]["end"]
    try_number = tries[-1]["try_number"] if tries else None
    return {
        "step": step,
        "acked": acked,
        "ack_time": pushed if acked else None,
        "state": state,
        "try_number": try_number,
    }


def in_progress(plan: Any, lease: Any, facts: RunFacts, chained_task: str | None = None) -> JsonDict | None:
    """The checkpoint ``plan`` plans as in progress; ``None`` when the plan is malformed, or nobody works
    on it any more (its run neither holds the lease nor runs: the next trigger aborts it as abandoned)."""
    p = values.mapping(plan)
    barrier = values.mapping(p.get("barrier"))
    checkpoint_id = values.positive(barrier.get("checkpoint_id"))
    run_id = values.text_or_none(p.get("run_id"), 500)
    if checkpoint_id is None or not run_id:
        return None
    holder = values.mapping(lease)
    holder_run = values.text_or_none(holder.get("run_id"), 500)
    if holder_run != run_id and facts.state not in ACTIVE_RUN:
        return None
    planned = p.get("steps")
    steps = list(dict.fromkeys(s for s in (planned if isinstance(planned, list) else []) if values.name(s)))
    return {
        "checkpoint_id": checkpoint_id,
        "run_id": run_id,
        "type": values.text(barrier.get("type"), 20) or "checkpoint",
        "trigger_time": values.seconds(barrier.get("trigger_time")),
        "lease_holder": holder_run,
        "lease_expires": values.seconds(holder.get("expires_at")),
        "steps": [step_ack(s, checkpoint_id, facts, chained_task) for s in steps],
    }
