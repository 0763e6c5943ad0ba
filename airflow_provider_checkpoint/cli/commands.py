"""Implementations of ``airflow checkpoints …`` (see :mod:`.definition` for the exit codes).

Messages are those of the DAGs: a refused restore prints ``restore refused: <reason>``,
a refused savepoint directory ``savepoint_dir refused: <reason>``.

Everything printed is untrusted text (it comes from stored documents and registry files):
URL credentials are redacted (:func:`~airflow_provider_checkpoint.exceptions.redact`) and
table cells are escaped, so no value is read as rich markup. With ``-o json`` / ``-o yaml``
stdout carries the document only: log lines go to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow.cli.simple_table import AirflowConsole
from airflow.utils.providers_configuration_loader import providers_configuration_loaded
from rich.markup import escape

from airflow_provider_checkpoint.exceptions import CheckpointError, RegistryError, redact, redact_values
from airflow_provider_checkpoint.jobs import reports, views
from airflow_provider_checkpoint.jobs.actions import job_of_dag, restore_job, savepoint_conf
from airflow_provider_checkpoint.jobs.checkpoint_detail import is_restore
from airflow_provider_checkpoint.jobs.registry import find_job, list_jobs
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore

REFUSED, FINDINGS = 2, 3


@contextmanager
def _refusals(prefix: str = "") -> Iterator[None]:
    """A refusal becomes its message on stderr and exit code 2 (no traceback)."""
    try:
        yield
    except CheckpointError as e:
        _say(f"{prefix}{e}", error=True)
        raise SystemExit(REFUSED) from e


def _say(text: str, error: bool = False) -> None:
    """Print ``text`` redacted, to stderr if ``error``."""
    print(redact(text), file=sys.stderr if error else sys.stdout)


@contextmanager
def _logs_to_stderr(output: str) -> Iterator[None]:
    """For ``json`` and ``yaml`` output, whatever the block writes to stdout (Airflow's log handlers,
    which hold stdout itself, a provider's INFO line) goes to stderr: stdout keeps the document only.

    The file descriptor is swapped, so even a handler holding the stream object is diverted.
    """
    if output not in ("json", "yaml"):
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _time(timestamp: float | None) -> str:
    """A timestamp in Airflow's ``[core] default_timezone``, ISO 8601 with its offset."""
    if timestamp is None:
        return "-"
    from airflow.settings import TIMEZONE

    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return str(moment.astimezone(TIMEZONE).isoformat(timespec="seconds"))


def _print(rows: list[dict[str, Any]], output: str, mapper: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Typed raw values for json (numbers stay numbers), human ones (times, durations, sizes) otherwise;
    every string redacted, and escaped in a table (rich reads ``[...]`` there as markup)."""
    if output == "json":
        print(json.dumps(redact_values(rows), indent=1))
        return

    def cells(row: dict[str, Any]) -> dict[str, Any]:
        shown = redact_values(mapper(row))
        return {k: escape(v) if output == "table" and isinstance(v, str) else v for k, v in shown.items()}

    AirflowConsole().print_as(rows, output=output, mapper=cells)


def _malformed_cell(row: dict[str, Any]) -> str:
    """Total malformed records and, when any, per source: ``3 (events 2, orders 1)``."""
    if row["malformed_records"] is None:
        return "-"
    per_source = ", ".join(f"{uid} {n}" for uid, n in sorted(row["source_malformed"].items()) if n)
    return f"{row['malformed_records']} ({per_source})" if per_source else str(row["malformed_records"])


def _restored_from(row: dict[str, Any]) -> Any:
    """The snapshot a restore started from (its URL, else its checkpoint id); ``-`` for every other checkpoint."""
    if not is_restore(row):
        return "-"
    return row["restored_from_url"] or _count(row["restored_from"])


def _history_cells(row: dict[str, Any]) -> dict[str, Any]:
    reason = f"{row['reason']}: {row['message']}" if row["reason"] else ""
    return {
        "id": row["checkpoint_id"],
        "type": row["type"],
        "status": row["status"],
        "trigger time": _time(row["trigger_time"]),
        "end time": _time(row["end_time"]),
        "duration": reports.human_duration(row["duration_seconds"]),
        "records in": _count(row["records_in"]),
        "malformed": _malformed_cell(row),
        "state rows": _count(row["state_rows"]),
        "state size": reports.human_bytes(row["state_size"]),
        "written": reports.human_bytes(row["bytes_written"]),
        "files": _count(row["files"]),
        "restored from": _restored_from(row),
        "abort reason": reason,
    }


@providers_configuration_loaded
def list_jobs_command(args: argparse.Namespace) -> None:
    rows = []
    with _logs_to_stderr(args.output):
        for location in list_jobs():
            try:
                rows.append(reports.job_status(location))
            except CheckpointError as e:
                rows.append(
                    {
                        "job_id": location.job_id,
                        "dag_id": location.dag_id,
                        "status": "UNREADABLE",
                        "status_reason": str(e),
                        "latest_completed": None,
                        "storage": "",
                    }
                )

    def cells(s: dict[str, Any]) -> dict[str, Any]:
        latest = s.get("latest_completed") or {}
        return {
            "job": s["job_id"],
            "dag": s["dag_id"],
            "status": s["status"],
            "why": s.get("status_reason", ""),
            "latest completed": latest.get("checkpoint_id", "-"),
            "completed at": _time(latest.get("completion_time")),
            "storage": s["storage"],
        }

    _print(rows, args.output, cells)


@providers_configuration_loaded
def history(args: argparse.Namespace) -> None:
    with _refusals(), _logs_to_stderr(args.output):
        page = reports.history(find_job(args.job_id).storage(), args.offset, args.limit)
    _print(page["rows"], args.output, _history_cells)
    if args.output in ("table", "plain") and page["total"] > args.offset + len(page["rows"]):
        print(f"({page['total']} checkpoints; next page: --offset {args.offset + args.limit})")


@providers_configuration_loaded
def show(args: argparse.Namespace) -> None:
    """The detail the Checkpoints page shows (:func:`.views.detail_of`) and the operators' state in ``_metadata``."""
    with _refusals(), _logs_to_stderr(args.output):
        location = find_job(args.job_id)
        storage = location.storage()
        detail = views.detail_of(location, args.checkpoint_id)
        store = CompletedCheckpointStore(storage)
        completed = store.load(args.checkpoint_id) if store.is_completed(args.checkpoint_id) else None
    if detail is None:
        _say(f"job {args.job_id} has no checkpoint {args.checkpoint_id} in {storage.url()}", error=True)
        raise SystemExit(REFUSED)
    operators = (
        [
            {"operator": uid, "files": len(s.handles), "bytes": s.size, "rows": s.rows, "keys": list(s.keys)}
            for uid, s in sorted(completed.operators.items())
        ]
        if completed is not None
        else []
    )
    if args.output in ("json", "yaml"):
        by_uid = {o["operator"]: {k: v for k, v in o.items() if k != "operator"} for o in operators}
        document = {
            **detail["row"],
            "metadata": detail["metadata_path"],
            **{k: v for k, v in detail.items() if k not in ("row", "metadata_path")},
            **({"operators": by_uid} if completed is not None else {}),
        }
        _document(document, args.output)
        return
    row = detail["row"]
    fields = {
        **_history_cells(row),
        "run id": row["run_id"],
        "dag run": _ui_url(detail["dag_run_url"]),
        "metadata": detail["metadata_path"] or "-",
        "committed by": _committed_by(detail),
        "abort message": detail["abort_message"],
        "abort detail": detail["abort_detail"],
    }
    _print([{"field": k, "value": v} for k, v in fields.items()], args.output, dict)
    for title, rows, mapper in (
        ("steps", detail["steps"], _step_cells),
        ("sinks", detail["sinks"], _sink_cells),
        ("operators (state in _metadata)", operators, _operator_cells),
    ):
        if rows:
            print(f"\n{title}:")
            _print(rows, args.output, mapper)


def _ui_url(path: str | None) -> str:
    """An Airflow UI path as a link to ``[api] base_url`` (the path alone when that is not set)."""
    from airflow.configuration import conf

    return f"{conf.get('api', 'base_url', fallback='').rstrip('/')}{path}" if path else "-"


def _document(document: dict[str, Any], output: str) -> None:
    """One document on stdout, every string redacted."""
    if output == "json":
        print(json.dumps(redact_values(document), indent=1))
    else:
        import yaml

        print(yaml.safe_dump(redact_values(document), sort_keys=False), end="")


def _committed_by(detail: dict[str, Any]) -> str:
    if detail["committed_by"] == "trigger":
        return f"the trigger of the next run ({detail['committed_by_run_id'] or '?'})"
    return detail["committed_by"] or "-"


def _count(value: int | None) -> Any:
    return "-" if value is None else value


def _flag(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "no"


def _attempts_cell(attempts: list[dict[str, Any]]) -> str:
    """``1 failed 12.3s, 2 success 4.1s``."""
    return (
        ", ".join(f"{a['try_number']} {a['state'] or '?'} {reports.human_duration(a['duration'])}" for a in attempts)
        or "-"
    )


def _step_cells(step: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": step["step"],
        "attempts": _attempts_cell(step["attempts"]),
        "records in": _count(step["records_in"]),
        "records out": _count(step["records_out"]),
        "state rows": _count(step["state_rows"]),
        "state size": reports.human_bytes(step["state_bytes"]),
        "state files": _count(step["state_files"]),
        "incremental": _flag(step["incremental"]),
        "merged on driver": _flag(step["merged_on_driver"]),
        "duration": reports.human_duration(step["seconds"]),
        "inputs": ", ".join(f"{uid} {_count(n)}" for uid, n in sorted(step["input_records"].items())) or "-",
    }


def _sink_cells(sink: dict[str, Any]) -> dict[str, Any]:
    return {
        "sink": sink["uid"],
        "kind": sink["kind"],
        "step": sink["step"],
        "target": sink["target"],
        "rows": _count(sink["rows"]),
        "files": _count(sink["files"]),
        "written": reports.human_bytes(sink["bytes"]),
        "delta version": _count(sink["delta_version"]),
        "committed at": _time(sink["commit_time"]),
    }


def _operator_cells(operator: dict[str, Any]) -> dict[str, Any]:
    return {**operator, "bytes": reports.human_bytes(operator["bytes"]), "keys": ", ".join(operator["keys"])}


@providers_configuration_loaded
def savepoint(args: argparse.Namespace) -> None:
    """Trigger the savepoint run through Airflow's own client (what ``airflow dags trigger`` uses)."""
    from airflow.api.client import get_current_api_client

    with _refusals():
        conf = savepoint_conf(job_of_dag(args.dag_id), args.savepoint_dir, args.stop)
    try:
        run = get_current_api_client().trigger_dag(dag_id=args.dag_id, conf=conf, triggering_user_name=_user())
    except Exception as e:  # DagNotFound and friends: same exit code as every refusal
        _say(f"savepoint refused: {e}", error=True)
        raise SystemExit(REFUSED) from e
    run_id = run["dag_run_id"] if run else "?"
    stop = " and stop the job" if args.stop else ""
    print(
        f"triggered savepoint run {run_id} of DAG {args.dag_id}{stop}; follow it with: "
        f"airflow dags list-runs {args.dag_id}"
    )


def _user() -> str | None:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


@providers_configuration_loaded
def restore(args: argparse.Namespace) -> None:
    with _refusals("restore refused: "):
        summary = restore_job(args.job_id, args.checkpoint, args.allow_non_restored_state, args.dry_run)
    what = f"{summary['type']} {summary['checkpoint_id']} at {summary['snapshot']}"
    if args.dry_run:
        _say(f"dry run: job {summary['job_id']} can be restored from {what}; nothing written")
    else:
        _say(
            f"restore of job {summary['job_id']} from {what} requested; the next run of DAG "
            f"{summary['dag_id']} takes it (airflow dags trigger {summary['dag_id']})"
        )
    for key in ("operators_restored", "operators_dropped", "operators_starting_empty"):
        print(f"  {key.replace('_', ' ')}: {', '.join(summary[key]) or '-'}")


@providers_configuration_loaded
def audit(args: argparse.Namespace) -> None:
    from airflow_provider_checkpoint.jobs.audit import audit_job

    with _refusals():
        location = find_job(args.job_id)
        storage = location.storage()
        try:
            sinks, unaudited = location.deployed_sinks(), []
        except RegistryError as e:
            sinks, unaudited = [], [f"sinks not audited: {e}"]
        findings = [*unaudited, *audit_job(storage, location.retained(), sinks)]
    for finding in findings:
        _say(str(finding))
    if findings:
        raise SystemExit(FINDINGS)
    _say(f"job {args.job_id}: clean ({storage.url()})")


@providers_configuration_loaded
def check(args: argparse.Namespace) -> None:
    """The pipeline check of a DAG as Airflow parses it (``airflow dags test``'s lookup: ``--bundle-name``,
    ``--dagfile-path``): one problem a line with its node and fix, exit 3 when there is any."""
    from airflow.exceptions import AirflowException
    from airflow.utils.cli import get_bagged_dag

    from airflow_provider_checkpoint.dataflow.version import pipeline_version
    from airflow_provider_checkpoint.jobs.check import check_job, job_of

    with _refusals("check refused: "), _logs_to_stderr(args.output):
        try:
            dag = get_bagged_dag(args.bundle_name, args.dag_id, args.dagfile_path)
        except (AirflowException, ValueError) as e:  # not found, failed to parse, a file outside the bundle
            _say(
                f"check refused: {e} (airflow dags list-import-errors shows why a file fails to parse; with "
                "--dagfile-path, name the file's bundle with --bundle-name)",
                error=True,
            )
            raise SystemExit(REFUSED) from e
        job = job_of(dag)
        problems = check_job(job)
    version = pipeline_version(job.graph)
    if args.output in ("json", "yaml"):
        found = [{"uid": p.uid, "message": p.message, "fix": p.fix} for p in problems]
        _document({"dag_id": args.dag_id, "job_id": job.job_id, "version": version, "problems": found}, args.output)
    else:
        for problem in problems:
            _say(str(problem))
        verdict = f"{len(problems)} problem(s)" if problems else "passes the pipeline check"
        _say(f"DAG {args.dag_id} (job {job.job_id}), version {version}: {verdict}")
    if problems:
        raise SystemExit(FINDINGS)
