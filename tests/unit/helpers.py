"""Helpers of the unit tests: a job on the local filesystem whose checkpoints run without Spark.

The graph is a FileSource over a landing directory feeding an append ParquetTableSink.
Instead of running the Spark step, a test writes the files a step would write (a state
file under its attempt directory, a staged file under the table's staging area) and
hands the coordinator the corresponding Ack (:func:`make_ack`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.connectors.files.source import FileSource
from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.model import Ack, Barrier, CheckpointPlan, CheckpointType, CompletedCheckpoint
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.core.status import AbortReason
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.dataflow.stateful import KeyedAggregate
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.storage import JobStorage
from tests.unit.state_files import SCHEMA
from tests.unit.state_files import state_file as parquet_state

JOB = "job"
STEP = "step_table"
T0 = 1_700_000_000.0
TIMEOUT = 600.0


@dataclass
class Env:
    root: Path
    landing: Path
    table: Path
    storage: JobStorage
    coordinator: CheckpointCoordinator

    @property
    def job_dir(self) -> Path:
        return self.root / "ckpt" / JOB

    def chk(self, checkpoint_id: int) -> Path:
        return self.job_dir / f"chk-{checkpoint_id}"

    def table_parts(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.table.glob("part-*.parquet"))}

    def stats(self, checkpoint_id: int) -> dict:
        return json.loads((self.job_dir / "_stats" / f"{checkpoint_id}.json").read_bytes())

    def job_record(self) -> dict:
        return json.loads((self.job_dir / "_job.json").read_bytes())


def make_env(tmp_path: Path, retained: int = 3, tolerable: int = 3, **source_options: object) -> Env:
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_bytes(b'{"k": 1}\n')
    table = tmp_path / "table"
    source = FileSource("events", str(landing), "json", "k INT", **source_options)  # type: ignore[arg-type]
    counts = KeyedAggregate("counts", source, keys=["k"], aggs={"n": "count"})
    sink = ParquetTableSink("table", counts, str(table), mode="append")
    graph = PipelineGraph([source, counts, sink])
    storage = JobStorage.for_job(str(tmp_path / "ckpt"), JOB)
    settings = CheckpointSettings(
        retained_checkpoints=retained, checkpoint_timeout_seconds=TIMEOUT, tolerable_failed_checkpoints=tolerable
    )
    roots = [f"file://{tmp_path}/ckpt", f"file://{tmp_path}/savepoints"]
    return Env(tmp_path, landing, table, storage, CheckpointCoordinator(storage, graph, settings, None, roots))


def target_name(checkpoint_id: int) -> str:
    return f"part-c{checkpoint_id:010d}-00000.parquet"


def state_rel(checkpoint_id: int, attempt: int) -> str:
    return f"{JobStorage.attempt_dir(checkpoint_id, STEP, attempt)}/state/counts/kgr=0/part-00000.parquet"


def make_ack(
    env: Env,
    plan: CheckpointPlan,
    attempt: int = 1,
    state: bytes | None = None,
    staged: bytes | None = None,
    extra_handles: tuple = (),
) -> Ack:
    """Write what attempt ``attempt`` of the step would write, and return its ack."""
    cid = plan.checkpoint_id
    state = state if state is not None else parquet_state(f"state of chk {cid} attempt {attempt}")
    staged = staged if staged is not None else f"rows of chk {cid} attempt {attempt}".encode()
    rel = state_rel(cid, attempt)
    state_file = env.job_dir / rel
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.write_bytes(state)
    handle = env.storage.handle_for(rel, (0, 127))
    staged_rel = f"_staging/chk-{cid}/{JOB}/{STEP}/attempt-{attempt}/part-00000.parquet"
    staged_file = env.table / staged_rel
    staged_file.parent.mkdir(parents=True, exist_ok=True)
    staged_file.write_bytes(staged)
    return Ack(
        job_id=JOB,
        checkpoint_id=cid,
        step=STEP,
        attempt=attempt,
        operators={"counts": OperatorSnapshot((handle, *extra_handles), SCHEMA, ("k",), 128, rows=1)},
        sinks={"table": [{"checkpoint_id": cid, "moves": [[staged_rel, target_name(cid)]]}]},
        metrics={
            "source_records": {"events": 1},
            "sinks": {
                "table": {
                    "kind": "parquet",
                    "target": f"file://{env.table}",
                    "rows": 1,
                    "files": 1,
                    "bytes": len(staged),
                }
            },
        },
        attempt_dir=JobStorage.attempt_dir(cid, STEP, attempt),
    )


def run_checkpoint(env: Env, run_id: str, now: float) -> tuple[CheckpointPlan, Ack]:
    plan = env.coordinator.trigger(run_id, now=now)
    ack = make_ack(env, plan)
    env.coordinator.finalize(plan, [ack], now=now + 1)
    return plan, ack


def sample(type_: CheckpointType = CheckpointType.CHECKPOINT, restored_from: int | None = 6) -> CompletedCheckpoint:
    handles = (
        StateHandle("chk-7/step_a/attempt-2/state/counts/kgr=0/p0.parquet", 123, "sha256:" + "a" * 64, (0, 63)),
        StateHandle("chk-7/step_a/attempt-2/state/counts/kgr=1/p1.parquet", 456, "sha256:" + "b" * 64, (64, 127)),
    )
    return CompletedCheckpoint(
        job_id="clicks",
        checkpoint_id=7,
        type=type_,
        trigger_time=1700000000.25,
        completion_time=1700000012.5,
        restored_from=restored_from,
        barrier=Barrier(7, 1700000000.25, type_, {"events": {"files": {"a.json": 10, "sub/b.json": 20}}}),
        operators={
            "counts": OperatorSnapshot(handles, '{"type":"struct","fields":[]}', ("page", "user"), 128, rows=42),
            "empty": OperatorSnapshot((), "{}", ("k",), 16, rows=0),
        },
        sinks={"table": [{"checkpoint_id": 7, "moves": [["_staging/chk-7/x.parquet", "part-c7.parquet"]]}]},
        stats={"run_id": "r1", "records_in": 5},
    )


SharedState = tuple[Env, StateHandle]
"""The ``shared_state`` fixture: a job whose checkpoint 2 references a state file of checkpoint 1."""

# which abort reasons count towards tolerable_failed_checkpoints (Flink's CheckpointFailureManager)
COUNTED = {
    AbortReason.DECLINED,
    AbortReason.EXPIRED,
    AbortReason.IO_ERROR,
    AbortReason.CORRUPT_STATE,
    AbortReason.FINALIZE_FAILURE,
    AbortReason.ABANDONED,
}
NOT_COUNTED = {
    AbortReason.SUBSUMED,
    AbortReason.TOO_MANY_CONCURRENT,
    AbortReason.MIN_PAUSE,
    AbortReason.JOB_NOT_RUNNING,
}
