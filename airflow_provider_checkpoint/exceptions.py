"""Every exception the provider raises on purpose, in one small hierarchy.

- :class:`CheckpointError` — the base; catch it to catch anything the provider refuses
  or aborts on purpose.
- :class:`RefusedInputError` — a stored document, a UI or CLI param, a path, a record or
  a pipeline definition was refused. Nothing was read, moved, written or deleted because
  of it, and a retry cannot help: tasks fail without retry, the CLI prints the message and
  exits 2, the plugin answers HTTP 400 with it. The message names the document (or
  param), the field and the rule.
- :class:`CheckpointStorageError` — a checkpoint file is missing, corrupt or unreadable.
- :class:`CheckpointAbortedError` — a checkpoint cannot start or complete.

Callers catch these bases. :class:`InjectedFault` stands outside on purpose: it plays a
crash, which no ``except CheckpointError`` may turn into a clean refusal.
"""

from __future__ import annotations

import math
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_checkpoint.core.status import AbortReason, JobStatus

MAX_TIMESTAMP = 253_402_300_799.0
"""9999-12-31T23:59:59Z: the last second a datetime can show."""
REQUIRED: Any = object()
"""Default of a field that must be present (and of :class:`DocumentError`'s value: none shown)."""


_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s'\"]*@")
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;][^=&#\s'\"]*(?:secret|passw|pwd|token|key|sig|credential|auth)[^=&#\s'\"]*=)[^&;#\s'\"]*",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``.

    The one rule for everything the CLI, the Checkpoints page and error messages show: a
    URL's userinfo (from ``://`` to its last ``@`` before a space or quote; a path holding
    ``@`` is hidden too, never a secret shown) and the value of every query parameter whose
    name looks like a secret (``secret``, ``passw``, ``pwd``, ``token``, ``key``, ``sig``,
    ``credential``, ``auth``: ``X-Amz-Signature``, ``sig`` of an Azure SAS, ``access_key``).
    """
    return _SECRET_PARAM.sub(r"\g<name>***", _USERINFO.sub(r"\g<scheme>***@", text))


def redact_values(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string inside it (dicts, lists and tuples are copied)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_values(v) for v in value]
    return value


def shorten(value: Any) -> str:
    """``repr(value)`` with URL credentials redacted (:func:`redact`), cut to 120 characters for an error message."""
    text = redact(repr(value))
    return text if len(text) <= 120 else text[:117] + "..."


def how_to_restore(checkpoint: str, job_id: str | None = None) -> str:
    """What a user runs to restore ``job_id`` to ``checkpoint``: the restore DAG (and how to expose it
    when the DAGs folder lacks it), or the CLI."""
    job = job_id or "<the job>"
    return (
        f"trigger the DAG restore_from_checkpoint with job_id={job} and checkpoint={checkpoint} (if your Airflow "
        "lacks it, a file in the DAGs folder exposes it: 'from airflow_provider_checkpoint.dags import "
        f"restore_from_checkpoint_dag; dag = restore_from_checkpoint_dag()'), or run 'airflow checkpoints restore "
        f"{job} --checkpoint {checkpoint}'"
    )


class CheckpointError(Exception):
    """Base of every exception the provider raises on purpose."""


class _RaisedInSpark:
    """An error a Spark task raises, recognized on the driver by :data:`MARK` at the start of its message."""

    MARK = ""

    @classmethod
    def raised_by_spark(cls, error: BaseException) -> Any:
        """The error a Spark job raised with :data:`MARK`, as this class; ``None`` for any other error."""
        text = str(error)
        start = text.find(cls.MARK)
        if start < 0:
            return None
        message = text[start + len(cls.MARK) :].split("\n", 1)[0]
        return cls(message.split(" SQLSTATE:", 1)[0].strip())  # type: ignore[call-arg]  # Spark appends it


class RefusedInputError(CheckpointError, ValueError):
    """Input was refused before any effect; the message names the document, the field and the rule."""


class CheckpointStorageError(CheckpointError, RuntimeError):
    """A checkpoint file is missing, corrupt or unreadable; the message names it."""


class CheckpointAbortedError(CheckpointError):
    """A checkpoint cannot start or complete; subclasses carry the abort reason."""


# -- refused input -----------------------------------------------------------------------
class DocumentError(RefusedInputError):
    """A document is malformed or names an unsafe value; nothing was read, moved or written.

    The message names the document, the field and the (shortened) value.
    """

    def __init__(self, document: str, field: str, problem: str, value: Any = REQUIRED) -> None:
        shown = "" if value is REQUIRED else f" (got {shorten(value)})"
        where = f"field {field} " if field else ""
        super().__init__(f"{document}: {where}{problem}{shown}")
        self.document = document
        self.field = field


class MetadataError(DocumentError):
    """``_metadata`` cannot be read: not ours, corrupt, unsafe, or written by a newer version."""

    def __init__(self, document: str, problem: str) -> None:
        ValueError.__init__(self, f"{document}: {problem}")
        self.document = document
        self.field = ""


class JobRecordError(DocumentError):
    """``_job.json`` is unreadable, unsafe, or from an unsupported version."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.document = "_job.json"
        self.field = ""


class UnsafePathError(RefusedInputError):
    """A user-given path lies outside every allowed root, or is not a plain path."""


class PipelineDefinitionError(RefusedInputError):
    """The pipeline graph is not valid; the message says which node and why."""


class InvalidPositionError(RefusedInputError):
    """A stored source position is not of the shape the source writes."""


class MalformedInputError(RefusedInputError):
    """Input records do not match the source's format or schema; the message names file and line."""


class TooManyMalformedError(MalformedInputError):
    """More of a checkpoint's records are malformed than the source's ``max_malformed_fraction``."""


class InputChangedError(MalformedInputError):
    """A file cut into the barrier changed or vanished before the step read it."""


class DeltaSourceError(RefusedInputError):
    """A Delta source table cannot give a checkpoint its changes: history vacuumed past the position,
    a replaced table, data removed without change data feed, or a feature it does not read; the
    message names the table and the versions."""


class PipelineCheckError(PipelineDefinitionError):
    """The pipeline check (a dry run on empty input) found problems in a version of the pipeline; the
    message lists each with its node's uid and a fix. No checkpoint was started."""


class SinkClaimedError(PipelineDefinitionError):
    """A sink's target belongs to another (job, sink uid) or was written with another layout."""


class SinkSchemaError(RefusedInputError):
    """The input's columns do not match the sink's table; the message names the table and the columns."""


class KafkaSourceError(_RaisedInSpark, RefusedInputError):
    """A Kafka source cannot give a checkpoint its records: a missing topic, offsets the barrier needs
    that are gone (``fail_on_data_loss``), a refused connection; the message names the topic,
    partition and offsets, or the broker address, never a secret."""

    MARK = "[kafka source refused] "


class CdcSourceError(RefusedInputError):
    """A change-data-capture source cannot give a checkpoint its changes: its replication slot is gone,
    invalidated or already past the position a restore needs, a change it cannot represent (TRUNCATE, a
    column type it does not convert, a schema change), or a message it cannot decode."""


class KafkaUnavailableError(CheckpointError, OSError):
    """The Kafka broker cannot be reached (refused, timed out): the step or trigger is retried."""


class SinkConnectionError(RefusedInputError):
    """A sink's connection is undefined, of the wrong type, or refused (credentials, host); never names a secret."""


class SinkUnavailableError(CheckpointError, OSError):
    """A sink's (or a PostgreSQL source's) server cannot be reached (refused, timed out, went away): the step or
    trigger is retried."""


class SinkValueError(MalformedInputError):
    """The target refused a value of the checkpoint's output; the message names the column and the key."""


class RestoreError(RefusedInputError):
    """A snapshot cannot be restored into this job; the message lists every reason."""


class StateTooLargeError(RefusedInputError):
    """State exceeds ``max_state_size`` of memory checkpoint storage; the message says what to change."""


# -- storage -----------------------------------------------------------------------------
class StateFileError(_RaisedInSpark, CheckpointStorageError):
    """A state file (or inline state) does not hold the columns, or the key groups, its ``_metadata`` records."""

    MARK = "[state file refused] "


class RegistryError(CheckpointStorageError):
    """A job is unknown, or its registry entry is malformed or points where the job is not."""


# -- aborted -----------------------------------------------------------------------------
class CheckpointAborted(CheckpointAbortedError):
    """A pending checkpoint cannot complete; ``reason`` says why, ``detail`` holds the full text of the
    errors behind it (empty when ``message`` says everything)."""

    def __init__(self, reason: AbortReason, message: str, detail: str = "") -> None:
        super().__init__(f"checkpoint aborted ({reason.value}): {message}")
        self.reason = reason
        self.message = message
        self.detail = detail


class StepDeclined(CheckpointAbortedError):
    """The step declined the checkpoint with a one-line ``message``; ``fatal`` ones are not retried (bad
    input, corrupt state, a deterministic error); ``detail`` is the full text of the error behind it."""

    def __init__(self, reason: AbortReason, message: str, fatal: bool, detail: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.fatal = fatal
        self.detail = detail


class LeaseHeld(CheckpointAbortedError, RuntimeError):
    """Another checkpoint of this job is in flight."""

    def __init__(self, holder: dict[str, Any]) -> None:
        super().__init__(
            f"another checkpoint of this job is in flight (run {holder.get('run_id')!r}, "
            f"lease expires at {_utc(holder.get('expires_at'))})"
        )
        self.holder = holder


class JobNotRunning(CheckpointError):
    """The job is FAILED or STOPPED: no checkpoint is triggered until a restore resets it."""

    def __init__(self, status: JobStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _utc(timestamp: Any) -> str:
    if timestamp is None or timestamp == math.inf:
        return "never"
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float) or not 0 <= timestamp <= MAX_TIMESTAMP:
        return f"{str(timestamp)[:40]!r} (not a time)"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


# -- outside the hierarchy ---------------------------------------------------------------
class InjectedFault(RuntimeError):
    """Raised at a fault point that a test switched on."""


def raised_in_spark(error: BaseException) -> CheckpointError | None:
    """The refusal a Spark task raised (:class:`StateFileError`, :class:`KafkaSourceError`), recognized in
    the error Spark reports on the driver; ``None`` for any other error."""
    for kind in (StateFileError, KafkaSourceError):
        found = kind.raised_by_spark(error)
        if found is not None:
            return found  # type: ignore[no-any-return]
    return None
