"""No blank reason: every error a step can raise reads as one line naming its class, on the page and in the CLI,
with the full text in the checkpoint's detail; deterministic errors decline for good, transient ones are retried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, ParseException, PySparkTypeError

from airflow_provider_checkpoint import exceptions as ex
from airflow_provider_checkpoint.cli.commands import _history_cells
from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.core.reasons import deterministic, error_class, first_line, reason
from airflow_provider_checkpoint.core.status import AbortReason, JobStatus
from airflow_provider_checkpoint.jobs.checkpoint_detail import checkpoint_detail
from airflow_provider_checkpoint.jobs.runs import RunFacts
from airflow_provider_checkpoint.spark.acks import decline_for, decline_record
from tests.unit.helpers import STEP, T0, Env, make_env

PARSE_TEXT = (
    "\n[PARSE_SYNTAX_ERROR] Syntax error at or near 'STRNG'. SQLSTATE: 42601 (line 1, pos 5)\n\n"
    "== SQL ==\nuser STRNG, ts LONG\n-----^^^\n"
)
ANALYSIS_TEXT = (
    "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name `tss` cannot be "
    "resolved. Did you mean one of the following? [`ts`, `user`]. SQLSTATE: 42703;\n'Project ['tss]\n+- Range"
)

ERRORS: list[tuple[BaseException, str, bool]] = [
    # (error, the class its reason names, whether a retry is refused)
    (ParseException(message=PARSE_TEXT), "ParseException [PARSE_SYNTAX_ERROR]", True),
    (AnalysisException(message=ANALYSIS_TEXT), "AnalysisException [UNRESOLVED_COLUMN.WITH_SUGGESTION]", True),
    (AnalysisException(message="[PATH_NOT_FOUND] Path does not exist: file:/x."), "[PATH_NOT_FOUND]", False),
    (PySparkTypeError(message="\n\n[NOT_COLUMN] Argument `col` should be a Column"), "[NOT_COLUMN]", True),
    (ex.PipelineDefinitionError("\nper_user: keys: 'usr' not among the columns"), "PipelineDefinitionError", True),
    (ex.DocumentError("_metadata", "barrier", "must be an object", 3), "DocumentError", True),
    (ex.MetadataError("chk-1/_metadata", "written by a newer version"), "MetadataError", True),
    (ex.JobRecordError("_job.json: unreadable"), "JobRecordError", True),
    (ex.UnsafePathError("/etc is outside every allowed root"), "UnsafePathError", True),
    (ex.InvalidPositionError("position of events: files must be an object"), "InvalidPositionError", True),
    (ex.MalformedInputError("source events: malformed json record(s)\nline 3"), "MalformedInputError", True),
    (ex.TooManyMalformedError("source events: 60% malformed"), "TooManyMalformedError", True),
    (ex.InputChangedError("source events: a.json changed size"), "InputChangedError", True),
    (ex.DeltaSourceError("table t: version 3 was vacuumed"), "DeltaSourceError", True),
    (ex.SinkClaimedError("sink out: table belongs to another job"), "SinkClaimedError", True),
    (ex.SinkSchemaError("sink out: missing columns ['a']"), "SinkSchemaError", True),
    (ex.KafkaSourceError("topic t[0]: offsets 3-5 are gone"), "KafkaSourceError", True),
    (ex.SinkConnectionError("sink pg: connection pg is undefined"), "SinkConnectionError", True),
    (ex.SinkValueError("sink pg: column a refused the value of key 1"), "SinkValueError", True),
    (ex.RestoreError("cannot restore:\n- operator x is gone"), "RestoreError", True),
    (ex.StateTooLargeError("state of counts is 6 MiB"), "StateTooLargeError", True),
    (ex.StateFileError("state file x holds columns [a]"), "StateFileError", True),
    (ex.RegistryError("job j is unknown"), "RegistryError", True),
    (ex.CheckpointStorageError("chk-1/counts/part-0.parquet is missing"), "CheckpointStorageError", True),
    (ex.KafkaUnavailableError("broker 127.0.0.1:9 refused the connection"), "KafkaUnavailableError", False),
    (ex.SinkUnavailableError("\nserver closed the connection"), "SinkUnavailableError", False),
    (ex.LeaseHeld({"run_id": "r", "expires_at": T0}), "LeaseHeld", False),
    (ex.JobNotRunning(JobStatus.FAILED, "job j is FAILED"), "JobNotRunning", False),
    (ex.CheckpointAborted(AbortReason.EXPIRED, "took longer than 600s"), "CheckpointAborted", False),
    (ex.InjectedFault("fault step.before_ack injected"), "InjectedFault", False),
    (OSError("\n[Errno 5] Input/output error"), "OSError", False),
    (MemoryError(), "MemoryError", False),
    (RuntimeError("\n\n   \n"), "RuntimeError", False),
    (TypeError("fn() takes 1 positional argument but 2 were given"), "TypeError", True),
    (KeyError("user"), "KeyError", False),
]


def _ids() -> list[str]:
    return [type(e).__name__ + (f"-{error_class(e)}" if error_class(e) else "") for e, _, _ in ERRORS]


@pytest.mark.parametrize(("error", "named", "fatal"), ERRORS, ids=_ids())
def test_every_error_reads_as_one_non_blank_line_naming_its_class(
    error: BaseException, named: str, fatal: bool
) -> None:
    line = reason(error)
    assert line.strip() and "\n" not in line
    assert named in line
    text = first_line(str(error))
    assert text.split("] ", 1)[-1][:20] in line, "the first non-empty line of the message is kept"
    assert deterministic(error) or isinstance(error, ex.RefusedInputError | ex.CheckpointStorageError) or not fatal


def test_a_parse_error_with_a_leading_newline_keeps_its_first_line_and_its_class() -> None:
    line = reason(ParseException(message=PARSE_TEXT))
    assert line == (
        "ParseException [PARSE_SYNTAX_ERROR]: Syntax error at or near 'STRNG'. SQLSTATE: 42601 (line 1, pos 5)"
    )


def test_credentials_never_reach_a_reason() -> None:
    error = OSError("\ncannot reach s3://AKIA:secret@bucket/x?X-Amz-Signature=abc")
    assert "secret" not in reason(error) and "abc" not in reason(error)
    assert "secret" not in decline_for(error).detail


def test_a_step_s_decline_is_never_blank_on_the_page_and_in_the_cli(tmp_path: Path) -> None:
    env = make_env(tmp_path, tolerable=len(ERRORS) + 1)  # one job, one aborted checkpoint per error
    for i, (error, named, fatal) in enumerate(ERRORS):
        declined = decline_for(error)
        assert declined.fatal is fatal, f"{error!r}: deterministic errors decline for good, transient ones retry"
        plan = env.coordinator.trigger(f"run-{i}", now=T0 + 10 * i)
        with pytest.raises(ex.CheckpointAborted):
            env.coordinator.finalize(plan, [None], now=T0 + 10 * i + 1, declines={STEP: decline_record(STEP, declined)})
        record = env.stats(plan.checkpoint_id)
        row = stats.history_row(record)
        assert row is not None
        cli = _history_cells(row)["abort reason"]
        page = checkpoint_detail(record, dag_id="d", metadata_url=None, facts=RunFacts(state="failed", tries={}))
        assert page is not None
        for shown in (cli, page["abort_message"]):
            assert f"{STEP}: {type(error).__name__}" in shown and named in shown, shown
            assert shown.split(f"{STEP}: ", 2)[-1].strip(), f"a blank reason: {shown!r}"
        assert page["abort_detail"].startswith(f"{STEP}: {type(error).__name__}")
        assert str(error).strip()[-30:] in page["abort_detail"], "the full text is kept in the checkpoint's detail"


def test_an_unexpected_finalize_error_is_named_too(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = env.coordinator.trigger("run-1", now=T0)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ValueError("\nlisting failed\nsecond line")

    monkeypatch.setattr(env.coordinator.store, "discard_attempts_except", broken)
    with pytest.raises(ex.CheckpointAborted) as caught:
        env.coordinator.finalize(plan, [None], now=T0 + 1)
    assert caught.value.message == "ValueError: listing failed"
    record = env.stats(plan.checkpoint_id)
    assert record["message"] == "ValueError: listing failed" and "second line" in record["detail"]
