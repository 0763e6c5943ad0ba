"""PostgresTableSink through crashes of its server: what a step staged, and ``_metadata`` then
commits, lands exactly once.

The pipeline (a FileSource of JSON rows into two PostgreSQL sinks in one step: ``append`` with a
dead-letter table, and ``upsert``) is driven as the operators drive it (trigger → run_step →
finalize) on real Spark and a real server. The server is crashed with an immediate shutdown
(``pg_ctl stop -m immediate``: no shutdown checkpoint; its log shows that crash recovery ran at
the restart) after a step's ack, after ``_metadata`` (finalize's commit then finds no server),
and inside finalize's commit transaction. Each time the job recovers by itself, and the tables
read back with psycopg equal the input rows the test wrote: every row once, refused rows once
as dead letters. A staging table dropped by hand fails the commit with a message saying what to
do, and doing it (restore to the checkpoint before) lands every row once as well.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.model import CheckpointPlan
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow import FileSource, PipelineGraph, PostgresTableSink
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, InjectedFault, SinkUnavailableError
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.spark.runner import run_step
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from tests.servers.postgres import PostgresServer
from tests.spark.helpers import write_json

SMALLINT = range(-32768, 32768)
RECOVERY = "automatic recovery in progress"
"""What PostgreSQL logs when it starts after a crash: crash recovery runs (UNLOGGED tables are emptied)."""
Row = tuple[int, str, int]
_schemas = itertools.count()


def _input(checkpoint_id: int) -> list[Row]:
    """Input ``checkpoint_id``'s rows ``(id, user, n)``: 300 new ids (every 50th ``n`` out of a
    smallint's range: refused by the append table) and, after the first, new values for the ids
    of input 1 in one residue class mod 7 (upserted). No id repeats within an input, nor within
    inputs read together by one checkpoint after a restore."""
    new = [
        (checkpoint_id * 1000 + i, f"u{i % 13}-é", 40000 + i if i % 50 == 0 else i * checkpoint_id) for i in range(300)
    ]
    again = [(1000 + i, "again", -checkpoint_id) for i in range(checkpoint_id % 7, 300, 7)]
    return new + (again if checkpoint_id > 1 else [])


class Job:
    """One job on a fresh schema: land input, run checkpoints, read the tables back."""

    def __init__(self, spark: Any, server: PostgresServer, tmp_path: Path, schema: str) -> None:
        self.spark, self.server, self.schema = spark, server, schema
        self.landing = tmp_path / "landing"
        with server.connect() as db:
            db.execute(f"CREATE SCHEMA {schema}")
            db.execute(
                f'CREATE TABLE {schema}.events (id bigint, "user" text, n smallint, _checkpoint_id bigint NOT NULL)'
            )
        source = FileSource("rows", str(self.landing), "json", "id LONG, user STRING, n LONG")
        self.sinks = [
            PostgresTableSink(
                "events_pg", source, "pg_test", f"{schema}.events", dead_letter_table="dead", step="main"
            ),
            PostgresTableSink("latest_pg", source, "pg_test", f"{schema}.latest", "upsert", ["id"], step="main"),
        ]
        self.storage = JobStorage.for_job(str(tmp_path / "checkpoints"), "crash_job")
        self.coordinator = CheckpointCoordinator(
            self.storage, PipelineGraph([source, *self.sinks]), CheckpointSettings()
        )
        self.landed: list[list[Row]] = []

    def trigger(self) -> CheckpointPlan:
        """Land the next checkpoint's input, then trigger (which recovers the latest checkpoint)."""
        rows = _input(len(self.landed) + 1)
        write_json(
            self.landing / f"rows-{len(self.landed) + 1}.json",
            [dict(zip(("id", "user", "n"), r, strict=True)) for r in rows],
        )
        self.landed.append(rows)
        return self.coordinator.trigger(f"run-{len(self.landed)}")

    def step(self, plan: CheckpointPlan) -> list[Any]:
        return [run_step(self.spark, self.storage, self.coordinator.graph, s, plan, 1) for s in plan.steps]

    def checkpoint(self) -> None:
        plan = self.trigger()
        self.coordinator.finalize(plan, self.step(plan))

    def assert_landed_once(self, inputs: int, read_by: list[int] | None = None) -> None:
        """The tables, read with psycopg, equal the first ``inputs`` inputs: each row once, the
        refused ones as dead letters of the checkpoint that read them (``read_by``: the checkpoint
        of each input, by default input i in checkpoint i)."""
        rows = [r for batch in self.landed[:inputs] for r in batch]
        latest: dict[int, Row] = {r[0]: r for r in rows}
        read_by = read_by or list(range(1, inputs + 1))
        with self.server.connect() as db:
            events = db.execute(f'SELECT id, "user", n FROM {self.schema}.events').fetchall()
            upserted = db.execute(f'SELECT id, "user", n FROM {self.schema}.latest').fetchall()
            dead = db.execute(f"SELECT checkpoint_id, record FROM {self.schema}.dead").fetchall()
            markers = db.execute(
                f"SELECT sink_uid, checkpoint_id FROM {self.schema}.checkpoint_sink_markers ORDER BY 1, 2"
            ).fetchall()
        assert sorted(events) == sorted(r for r in rows if r[2] in SMALLINT)
        assert sorted(upserted) == sorted(latest.values())
        refused = sorted(
            (c, r)
            for c, batch in zip(read_by, self.landed[:inputs], strict=True)
            for r in batch
            if r[2] not in SMALLINT
        )
        assert sorted((c, tuple(json.loads(r).values())) for c, r in dead) == refused
        committed = sorted({c for _, c in markers})
        assert markers == [(s, c) for s in ("events_pg", "latest_pg") for c in committed]

    def staging_tables(self) -> list[str]:
        with self.server.connect() as db:
            found = db.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE '\\_cks\\_%%\\_c%%'",
                [self.schema],
            ).fetchall()
        return [r[0] for r in found]


def _recoveries(server: PostgresServer) -> int:
    return (server.pgdata / "server.log").read_text(errors="replace").count(RECOVERY)


def _start_after_crash(server: PostgresServer, recoveries: int) -> None:
    server.start()
    assert _recoveries(server) == recoveries + 1, "the restart ran crash recovery"


def _crash_while_paused(
    server: PostgresServer, pause_dir: Path, point: str, finalize: Callable[[], Any]
) -> BaseException | None:
    """Run ``finalize`` in a thread until it pauses at fault point ``point``, crash the server
    there, let it go on (against no server) and return what it raised. The server stays down."""
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            finalize()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not (pause_dir / f"{point}.paused").exists():
        assert thread.is_alive() and time.monotonic() < deadline, f"finalize never reached {point}: {outcome}"
        time.sleep(0.05)
    server.kill()
    (pause_dir / f"{point}.resume").touch()
    thread.join(120)
    assert not thread.is_alive()
    return outcome.get("error")


@pytest.fixture
def job(spark, postgres_server, tmp_path, monkeypatch) -> Job:
    monkeypatch.setenv("AIRFLOW_CONN_PG_TEST", postgres_server.uri())
    monkeypatch.setenv("CHECKPOINT_FAULTS_PAUSE_DIR", str(tmp_path))
    return Job(spark, postgres_server, tmp_path, f"crash{next(_schemas)}")


def test_a_server_crash_after_the_ack_after_metadata_and_inside_the_commit_loses_nothing(
    job, postgres_server, tmp_path, monkeypatch
):
    job.checkpoint()
    job.assert_landed_once(1)

    # (a) after the step's ack, before _metadata: what the step staged survives crash recovery
    plan = job.trigger()
    acks = job.step(plan)
    recoveries = _recoveries(postgres_server)
    postgres_server.kill()
    _start_after_crash(postgres_server, recoveries)
    job.coordinator.finalize(plan, acks)
    job.assert_landed_once(2)

    # (b) after _metadata: finalize's commit finds no server and fails; once the server is back,
    # the next trigger's recovery commits checkpoint 3 before it plans checkpoint 4
    plan = job.trigger()
    acks = job.step(plan)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.after_metadata:checkpoint=3:action=pause")
    recoveries = _recoveries(postgres_server)
    failed = _crash_while_paused(
        postgres_server, tmp_path, "finalize.after_metadata", lambda: job.coordinator.finalize(plan, acks)
    )
    assert isinstance(failed, SinkUnavailableError), failed
    assert postgres_server.password not in str(failed)
    assert CompletedCheckpointStore(job.storage).is_completed(3)
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    _start_after_crash(postgres_server, recoveries)
    job.assert_landed_once(2)
    plan = job.trigger()
    job.assert_landed_once(3)

    # (c) inside the first sink's commit transaction (rows moved, marker not yet written): the
    # transaction is lost with the server; finalize's retry commits checkpoint 4 once
    acks = job.step(plan)
    point = "finalize.inside_sink_commit"
    monkeypatch.setenv("CHECKPOINT_FAULTS", f"{point}:checkpoint=4:sink=events_pg:action=pause")
    recoveries = _recoveries(postgres_server)
    failed = _crash_while_paused(postgres_server, tmp_path, point, lambda: job.coordinator.finalize(plan, acks))
    assert isinstance(failed, psycopg.OperationalError), failed  # the connection died mid-transaction
    assert CompletedCheckpointStore(job.storage).is_completed(4)
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    _start_after_crash(postgres_server, recoveries)
    job.assert_landed_once(3)
    job.coordinator.finalize(plan, acks)  # Airflow's retry of finalize
    job.assert_landed_once(4)

    job.checkpoint()
    job.assert_landed_once(5)
    assert job.staging_tables() == [] and [s.audit() for s in job.sinks] == [[], []]


def test_a_staging_table_dropped_by_hand_says_what_to_do_and_a_restore_lands_every_row_once(
    job, postgres_server, monkeypatch
):
    job.checkpoint()
    plan = job.trigger()
    acks = job.step(plan)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.after_metadata:checkpoint=2")
    with pytest.raises(InjectedFault):
        job.coordinator.finalize(plan, acks)
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    staged = next(c["staging_table"] for a in acks for c in a.sinks["events_pg"])
    with postgres_server.connect() as db:
        db.execute(f"DROP TABLE {job.schema}.{staged}")

    for attempt in (lambda: job.coordinator.finalize(plan, acks), job.trigger):  # a finalize retry, the next run
        with pytest.raises(CheckpointStorageError) as stuck:
            attempt()
        message = str(stuck.value)
        assert f"staging table {job.schema}.{staged} is gone" in message and "checkpoint 2" in message
        assert "restore_from_checkpoint with job_id=<the job> and checkpoint=<an id before 2>" in message
        assert postgres_server.password not in message
    job.assert_landed_once(1)

    # what the message says: restore the checkpoint before; the next run reads checkpoint 2's input again
    request_restore(job.storage, job.storage.url("chk-1"), allow_non_restored_state=False, dry_run=False)
    plan = job.coordinator.trigger("run-after-restore")
    job.coordinator.finalize(plan, job.step(plan))
    job.assert_landed_once(3, read_by=[1, 3, 3])  # input 3 landed before the failed trigger
    assert job.staging_tables() == [] and [s.audit() for s in job.sinks] == [[], []]


def test_a_staging_table_lost_before_metadata_aborts_the_checkpoint_and_the_next_one_lands_its_rows(
    job, postgres_server
):
    """Finalize checks the staging tables just before ``_metadata``: one lost by then (dropped, or
    a database that lost transactions) aborts the checkpoint instead of wedging the job."""
    from airflow_provider_checkpoint.exceptions import CheckpointAborted

    job.checkpoint()
    plan = job.trigger()
    acks = job.step(plan)
    staged = next(c["staging_table"] for a in acks for c in a.sinks["latest_pg"])
    with postgres_server.connect() as db:  # past the step's seal (its trigger), as a person could
        db.execute(f"ALTER TABLE {job.schema}.{staged} DISABLE TRIGGER ALL")
        db.execute(f"DELETE FROM {job.schema}.{staged} WHERE id % 2 = 0")
    with pytest.raises(
        CheckpointAborted, match=rf"staging table {job.schema}\.{staged} of checkpoint 2 has lost its step's seal"
    ):
        job.coordinator.finalize(plan, acks)
    assert not CompletedCheckpointStore(job.storage).is_completed(2)
    job.assert_landed_once(1)
    job.checkpoint()  # checkpoint 3 reads inputs 2 and 3
    job.assert_landed_once(3, read_by=[1, 3, 3])
    assert job.staging_tables() == [] and [s.audit() for s in job.sinks] == [[], []]
