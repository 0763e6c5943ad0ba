"""The pending checkpoint: counts acks against the plan and decides complete or abort."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan, CompletedCheckpoint, JsonDict
from airflow_provider_checkpoint.core.status import AbortReason
from airflow_provider_checkpoint.exceptions import CheckpointAborted
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, stray_handles


class AckOutcome(enum.StrEnum):
    """What acknowledging did."""

    ACCEPTED = "accepted"
    """First valid ack of a step, or one of a newer attempt that replaces the older one."""
    DUPLICATE = "duplicate"
    """The same step and attempt acked again: changes nothing."""
    STALE_ATTEMPT = "stale_attempt"
    """An older attempt of a step whose newer attempt already acked: discarded."""
    LATE = "late"
    """An ack for an older checkpoint id: discarded."""
    UNKNOWN = "unknown"
    """An ack for a newer id, or for a step the plan does not have: discarded."""
    OTHER_JOB = "other_job"
    """An ack of another job: ignored (its files are not ours to discard)."""
    EXPIRED = "expired"
    """Arrived after the checkpoint timed out: the checkpoint expires."""


@dataclass
class PendingCheckpoint:
    """Acks received for one checkpoint attempt, judged against its plan.

    Complete when every planned step has acked for this job and checkpoint id, with its
    latest attempt, before ``trigger_time + timeout``. Acks that are not accepted are
    collected in ``discarded`` so their files can be deleted.
    """

    plan: CheckpointPlan
    acks: dict[str, Ack] = field(default_factory=dict)
    discarded: list[Ack] = field(default_factory=list)
    expired: bool = False

    @property
    def checkpoint_id(self) -> int:
        return self.plan.checkpoint_id

    @property
    def deadline(self) -> float:
        return self.plan.barrier.trigger_time + self.plan.timeout_seconds

    @property
    def missing_steps(self) -> list[str]:
        return [s for s in self.plan.steps if s not in self.acks]

    @property
    def is_fully_acknowledged(self) -> bool:
        return not self.missing_steps

    def acknowledge(self, ack: Ack, now: float) -> AckOutcome:
        if ack.job_id != self.plan.job_id:
            return AckOutcome.OTHER_JOB
        if ack.checkpoint_id < self.checkpoint_id:
            self.discarded.append(ack)
            return AckOutcome.LATE
        if ack.checkpoint_id > self.checkpoint_id or ack.step not in self.plan.steps:
            self.discarded.append(ack)
            return AckOutcome.UNKNOWN
        if now > self.deadline:
            self.expired = True
            self.discarded.append(ack)
            return AckOutcome.EXPIRED
        current = self.acks.get(ack.step)
        if current is not None:
            if ack.attempt == current.attempt:
                return AckOutcome.DUPLICATE
            if ack.attempt < current.attempt:
                self.discarded.append(ack)
                return AckOutcome.STALE_ATTEMPT
            self.discarded.append(current)
        self.acks[ack.step] = ack
        return AckOutcome.ACCEPTED

    def _check_channel_alignment(self) -> None:
        """Every step read exactly the channels of the accepted attempts of its upstream steps."""
        producers = {uid: ack.attempt_dir for ack in self.acks.values() for uid in ack.channels}
        for ack in self.acks.values():
            for uid, read in sorted(ack.inputs.items()):
                if producers.get(uid) != read:
                    raise CheckpointAborted(
                        AbortReason.DECLINED,
                        f"checkpoint {self.checkpoint_id}: step {ack.step} read channel {uid} of {read}, "
                        f"but the accepted attempt producing it is {producers.get(uid) or 'none'}",
                    )

    def _check_kept_files(self, inheritable: Mapping[str, OperatorSnapshot]) -> None:
        """A step's state files are its own (in its attempt directory) or files of its restore
        point's snapshot of the same operator (``inheritable``), kept by incremental state."""
        for ack in self.acks.values():
            for uid, snapshot in sorted(ack.operators.items()):
                for handle in stray_handles(snapshot, ack.attempt_dir, inheritable.get(uid)):
                    raise CheckpointAborted(
                        AbortReason.CORRUPT_STATE,
                        f"checkpoint {self.checkpoint_id}: step {ack.step} lists state file {handle.path} "
                        f"of operator {uid}, which is neither its own nor one of its restore point",
                    )

    def with_declines(self, aborted: CheckpointAborted, declines: Mapping[str, JsonDict]) -> CheckpointAborted:
        """``aborted`` for missing acks, given the reason and message of the steps that declined
        (``declines``: step → ``{"reason", "message"}``); any other abort unchanged."""
        declined = {s: declines[s] for s in self.missing_steps if isinstance(declines.get(s), dict)}
        if aborted.reason is not AbortReason.DECLINED or not declined:
            return aborted
        reasons = {r.value: r for r in AbortReason}
        first = next(iter(declined.values()))
        return CheckpointAborted(
            reasons.get(str(first.get("reason")), AbortReason.DECLINED),
            f"{aborted.message}: " + "; ".join(str(d.get("message"))[:2000] for d in declined.values()),
            "\n\n".join(f"{s}: {d['detail']}" for s, d in declined.items() if d.get("detail")),
        )

    def complete(
        self,
        completion_time: float,
        restored_from: int | None,
        inheritable: Mapping[str, OperatorSnapshot] | None = None,
    ) -> CompletedCheckpoint:
        """The completed checkpoint, or :class:`CheckpointAborted` with the reason.

        ``inheritable``: the restore point's state in this job's directory, whose files
        acks may keep (incremental state); none by default.
        """
        if self.expired or completion_time > self.deadline:
            raise CheckpointAborted(
                AbortReason.EXPIRED,
                f"checkpoint {self.checkpoint_id} took longer than its {self.plan.timeout_seconds:.0f}s timeout",
            )
        if self.missing_steps:
            raise CheckpointAborted(
                AbortReason.DECLINED,
                f"checkpoint {self.checkpoint_id}: no ack from step(s) {', '.join(self.missing_steps)}",
            )
        self._check_channel_alignment()
        self._check_kept_files(inheritable or {})
        operators = {uid: s for ack in self.acks.values() for uid, s in ack.operators.items()}
        channels = [c for ack in self.acks.values() for c in ack.channels.values()]
        sinks = {uid: c for ack in self.acks.values() for uid, c in ack.sinks.items()}
        return CompletedCheckpoint(
            job_id=self.plan.job_id,
            checkpoint_id=self.checkpoint_id,
            type=self.plan.barrier.type,
            trigger_time=self.plan.barrier.trigger_time,
            completion_time=completion_time,
            restored_from=restored_from,
            barrier=self.plan.barrier,
            operators=operators,
            sinks=sinks,
            options=self.plan.options,
            stats=stats.completion(self.plan, self.acks, operators, channels, completion_time, restored_from),
        )
