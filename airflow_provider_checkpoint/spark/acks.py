"""What a step attempt reports back: its ack, or its decline.

A submitted driver writes ``_ack.json`` (or ``_decline.json`` before failing) into its
attempt directory; the task reads it back and verifies it before anything trusts it.
"""

from __future__ import annotations

import json

from airflow_provider_checkpoint.core.documents import load_json
from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan, JsonDict
from airflow_provider_checkpoint.core.reasons import detail, deterministic, reason
from airflow_provider_checkpoint.core.status import AbortReason
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    RefusedInputError,
    StepDeclined,
    raised_in_spark,
)
from airflow_provider_checkpoint.state.handles import is_own, stray_handles
from airflow_provider_checkpoint.storage import JobStorage

ACK_FILE = "_ack.json"
DECLINE_FILE = "_decline.json"


def decline_for(e: BaseException) -> StepDeclined:
    """How an exception of a step declines its checkpoint."""
    if isinstance(e, StepDeclined):
        return e
    full = detail(e)
    e = raised_in_spark(e) or e
    why = AbortReason.CORRUPT_STATE if isinstance(e, CheckpointStorageError) else AbortReason.DECLINED
    why = AbortReason.IO_ERROR if isinstance(e, OSError) else why
    # StateTooLargeError is refused input; a Spark analysis error or a definition error repeats on a retry
    fatal = isinstance(e, RefusedInputError | CheckpointStorageError) or deterministic(e)
    return StepDeclined(why, reason(e), fatal, full)


def decline_record(step: str, declined: StepDeclined) -> JsonDict:
    """What a failed step attempt pushes for finalize: its abort reason, a one-line message naming the step
    and the error (never blank), and the error's full text (the checkpoint's detail)."""
    return {"reason": declined.reason.value, "message": f"{step}: {declined}", "detail": declined.detail}


def read_ack(storage: JobStorage, plan: CheckpointPlan, step: str, attempt: int) -> Ack:
    """The ack the driver wrote, verified against this attempt; its state files checked.

    Raises :class:`StepDeclined` when the ack is missing, belongs to another job,
    checkpoint, step or attempt, or names a file outside the attempt directory, and
    :class:`CheckpointStorageError` when a state file is missing or altered.
    """
    attempt_dir = storage.attempt_dir(plan.checkpoint_id, step, attempt)
    where = storage.url(f"{attempt_dir}/{ACK_FILE}")
    if not storage.has_file(f"{attempt_dir}/{ACK_FILE}"):
        raise StepDeclined(AbortReason.DECLINED, f"the driver finished without writing its ack {where}", False)
    try:
        ack = Ack.from_dict(load_json(storage.read_bytes(f"{attempt_dir}/{ACK_FILE}"), where), where)
    except (ValueError, KeyError, TypeError) as e:
        raise StepDeclined(AbortReason.DECLINED, f"unreadable ack {where}: {e}", False) from e
    got = (ack.job_id, ack.checkpoint_id, ack.step, ack.attempt, ack.attempt_dir)
    want = (plan.job_id, plan.checkpoint_id, step, attempt, attempt_dir)
    if got != want:
        raise StepDeclined(AbortReason.DECLINED, f"ack {where} is for {got}, expected {want}", False)
    restored = plan.restore_point.operators if plan.restore_point else {}
    for uid, snapshot in ack.operators.items():
        for handle in stray_handles(snapshot, attempt_dir, restored.get(uid)):
            raise StepDeclined(
                AbortReason.DECLINED,
                f"ack {where} names {handle.path}, neither in {attempt_dir} nor kept from its restore point",
                False,
            )
        for handle in snapshot.handles:
            storage.verify(handle, deep=is_own(handle, attempt_dir))
    storage.delete(f"{attempt_dir}/{ACK_FILE}")
    return ack


def read_decline(storage: JobStorage, attempt_dir: str) -> StepDeclined | None:
    """The decline the driver recorded before failing, if any."""
    if not storage.has_file(f"{attempt_dir}/{DECLINE_FILE}"):
        return None
    try:
        d = load_json(storage.read_bytes(f"{attempt_dir}/{DECLINE_FILE}"), storage.url(f"{attempt_dir}/{DECLINE_FILE}"))
        reasons = {r.value: r for r in AbortReason}
        why = reasons.get(str(d["reason"]), AbortReason.DECLINED)
        return StepDeclined(why, str(d["message"]), bool(d["fatal"]), str(d.get("detail", "")))
    except (ValueError, KeyError, TypeError) as e:
        return StepDeclined(AbortReason.DECLINED, f"unreadable {DECLINE_FILE} in {attempt_dir}: {e}", False)


def write_decline(storage: JobStorage, attempt_dir: str, declined: StepDeclined) -> None:
    record: JsonDict = {
        "reason": declined.reason.value,
        "message": str(declined),
        "fatal": declined.fatal,
        "detail": declined.detail,
    }
    storage.write_atomic(f"{attempt_dir}/{DECLINE_FILE}", json.dumps(record).encode())
