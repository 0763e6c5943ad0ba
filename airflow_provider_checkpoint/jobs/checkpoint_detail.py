"""The detail of one checkpoint (the page's drill-down, ``airflow checkpoints show``): per step its
attempts, records, state and timings, per sink what it committed, the DAG run, ``_metadata`` and
who committed it.

Pure functions of the checkpoint's stats record (``_stats/<id>.json``, untrusted: every value is
type-checked, what is malformed or absent is ``None``), the job's topology (``_job.json``) and
what Airflow's database knows of the run (:class:`~.runs.RunFacts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.core.reasons import DETAIL_LIMIT
from airflow_provider_checkpoint.exceptions import redact
from airflow_provider_checkpoint.jobs import values
from airflow_provider_checkpoint.jobs.runs import RunFacts

ABORT_MESSAGE_LIMIT = 20_000
DEAD_LETTERS = "dead_letters"
_SINK_FIGURES = ("rows", "files", "bytes", "delta_version", "commit_time")


def dag_run_url(dag_id: str, run_id: str) -> str | None:
    """The Airflow UI path of a DAG run (``None`` without a run id)."""
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}" if dag_id and run_id else None


def is_restore(row: Mapping[str, Any]) -> bool:
    """Whether a history row's checkpoint started from a restore (request or savepoint): its ``restored``
    field when the record has one, else (older records) whether it names a restored snapshot."""
    restored = row.get("restored")
    return restored if isinstance(restored, bool) else bool(row.get("restored_from_url"))


def step_names(record_steps: Any, *planned: Any) -> list[str]:
    """The steps of a checkpoint: those of its record, else the first of ``planned`` (the plan's list,
    the topology's steps) that names any, in their order."""
    recorded = [s for s in values.mapping(record_steps) if values.name(s)]
    for names in planned:
        listed = [s for s in (names if isinstance(names, list | dict) else []) if values.name(s)]
        if listed:
            return listed + [s for s in recorded if s not in listed]
    return sorted(recorded)


def step_tries(step: str, tries: Mapping[str, list[JsonDict]], chained_task: str | None, trigger: float | None) -> list:
    """The Airflow tries that ran ``step``: its task's, or those of the one chained task. A chained
    task's retry cuts a new checkpoint: only the try running at the checkpoint's trigger time is its own."""
    if step in tries or chained_task is None:
        return list(tries.get(step, []))
    own = list(tries.get(chained_task, []))
    if trigger is None:
        return own
    during = [t for t in own if (t["start"] or 0) <= trigger <= (t["end"] if t["end"] is not None else trigger)]
    return during or own


_STEP_FIGURES = (
    *("records_in", "records_out", "state_rows", "state_bytes", "state_files"),
    *("incremental", "inline", "merged_on_driver", "seconds"),
)


def step_figures(step: str, figures: Mapping[str, Any] | None, attempts: Sequence[JsonDict]) -> JsonDict:
    """What one step did in the checkpoint (``figures``: its entry of :func:`.stats.step_details`, ``None``
    for a step the record does not name) and its attempts."""
    f = figures or {}
    return {
        "step": step,
        "attempts": list(attempts),
        "accepted_attempt": f.get("attempt") or None,
        **{k: f.get(k) for k in _STEP_FIGURES},
        "input_records": f.get("input_records") or {},
        "alignment_seconds": f.get("alignment_seconds") or {},
    }


def sink_commit(entry: Mapping[str, Any]) -> JsonDict:
    """What one sink committed (an entry of :func:`.stats.sink_details`), its target's credentials redacted."""
    target = values.target(entry["target"]) or ""
    return {**entry, "target": target, "dead_letters_path": target if entry["kind"] == DEAD_LETTERS else None}


def declared_sinks(topology: Any, steps: Sequence[str]) -> list[JsonDict]:
    """The sinks of ``steps`` as the job's topology declares them, for a record that does not say what
    each committed (older records): uid, kind, step and target; the figures unknown."""
    nodes = values.mapping(values.mapping(topology).get("nodes"))
    step_of = {
        uid: step
        for step, uids in values.mapping(values.mapping(topology).get("steps")).items()
        if step in steps and isinstance(uids, list)
        for uid in uids
        if values.name(uid)
    }
    out = []
    for uid, step in sorted(step_of.items()):
        node = values.mapping(nodes.get(uid))
        if node.get("kind") == "sink":
            where = node.get("path") if isinstance(node.get("path"), str) else node.get("table")
            entry = {"uid": uid, "kind": values.text(node.get("format"), 40), "step": step, "target": where}
            out.append(sink_commit({**entry, **dict.fromkeys(_SINK_FIGURES)}))
    return out


def checkpoint_detail(
    record: Any,
    *,
    dag_id: str,
    metadata_url: str | None,
    facts: RunFacts,
    topology: Any = None,
    plan_steps: Any = None,
    chained_task: str | None = None,
    status: str | None = None,
) -> JsonDict | None:
    """The detail of the checkpoint of ``record`` (``None`` without a valid id); ``status`` overrides
    the record's (``IN_PROGRESS`` for a checkpoint with a plan and no record yet)."""
    row = stats.history_row(record)
    if row is None:
        return None
    if status:
        row["status"] = status
    raw_steps = values.mapping(record.get("steps"))
    topology_steps = values.mapping(topology).get("steps")
    names = step_names(raw_steps, plan_steps, [] if raw_steps else topology_steps)
    figures = {f["step"]: f for f in stats.step_details(record)}
    steps = [
        step_figures(s, figures.get(s), step_tries(s, facts.tries, chained_task, row["trigger_time"])) for s in names
    ]
    if isinstance(record.get("sinks"), dict):
        sinks = [sink_commit(entry) for entry in stats.sink_details(record)]
    else:
        sinks = declared_sinks(topology, names) if row["status"] == "COMPLETED" else []
    committed_by = values.text_or_none(record.get("committed_by"), 40)
    return {
        "row": row,
        "metadata_path": metadata_url,
        "dag_run_url": dag_run_url(dag_id, row["run_id"]),
        "committed_by": committed_by,
        "committed_by_run_id": values.text_or_none(record.get("committed_by_run_id"), 250),
        "abort_message": values.text(record.get("message"), ABORT_MESSAGE_LIMIT),
        "abort_detail": redact(values.text(record.get("detail"), DETAIL_LIMIT)),
        "steps": steps,
        "sinks": sinks,
    }
