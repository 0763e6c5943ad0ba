"""The replication slot is advanced beside the finalize's other work, never past a checkpoint whose sinks are
not committed: a sink commit failing in that finalize loses and doubles nothing, and a restore of the checkpoint
before it still finds its WAL (the oracle: plain ``SELECT``s of the source table at each barrier)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.connectors.postgres import cdc_slot
from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.connectors.postgres.pgoutput import lsn_to_int
from airflow_provider_checkpoint.dataflow import ParquetTableSink
from airflow_provider_checkpoint.exceptions import InjectedFault
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.testing.inprocess import Job, make_job
from tests.servers.postgres import PostgresServer, cdc_connection
from tests.spark.test_postgres_cdc import DDL, Workload, target

pytestmark = pytest.mark.spark


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    """The server, through Airflow connection ``cdc_pg``; the test's slot is dropped after it."""
    with cdc_connection(postgres_server, monkeypatch, "cdc_release_") as server:
        yield server


def _job(tmp: Path, spark: Any, table: str, slot: str, retained: int) -> Job:
    def declare(root: Path) -> None:
        changes = PostgresCdcSource("orders_cdc", [table], postgres_conn_id="cdc_pg", slot_name=slot)
        for name in ("orders", "copy"):  # two sinks: the fault falls between their commits
            ParquetTableSink(name, changes, str(root / name), mode="upsert", keys=["id"], delete_when="deleted")

    return make_job(spark, tmp, declare, retained_checkpoints=retained)


def _lsn(job: Job, checkpoint: int) -> int:
    return lsn_to_int(job.coordinator.store.load(checkpoint).source_positions["orders_cdc"]["lsn"])


@pytest.mark.parametrize("retained", [1, 2])
def test_a_sink_commit_failing_beside_the_slot_advance_loses_nothing_and_the_restore_replays(
    spark, pg, tmp_path, monkeypatch, retained
):
    table, slot = f"cdc_release_{uuid.uuid4().hex[:6]}", f"cdc_release_{uuid.uuid4().hex[:6]}"
    work = Workload(pg, table, seed=retained)
    work.conn.execute(DDL.format(t=table))
    work.transactions(10)
    job = _job(tmp_path, spark, table, slot, retained)
    states = {}
    for checkpoint in (1, 2):
        states[checkpoint] = work.state()
        assert job.checkpoint().checkpoint_id == checkpoint
        assert target(tmp_path) == states[checkpoint]
        work.at_barrier.append(work.committed)
        work.transactions(8)
    # checkpoint 3: _metadata written, sink "copy" committed, then the finalize dies before "orders" commits
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.between_sink_commits:checkpoint=3:sink=copy")
    with pytest.raises(InjectedFault):
        job.checkpoint()
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    assert target(tmp_path) == states[2], "orders: checkpoint 3 not committed"
    with pg.connect() as conn:  # retained 1: not past 2 (3's sinks failed); retained 2: the oldest kept, 2
        held = cdc_slot.state(conn, slot)
        assert held is not None and held.confirmed_flush == _lsn(job, 2)
    work.transactions(5)
    request_restore(job.storage, job.storage.url("chk-2"), False, False)
    replayed = job.checkpoint()  # replays every change since checkpoint 2's barrier, once
    assert replayed.restored_from == 2
    assert replayed.stats["records_in"] == work.committed - work.at_barrier[2]
    assert target(tmp_path) == work.state()
    with pg.connect() as conn:
        held = cdc_slot.state(conn, slot)
        oldest = _lsn(job, replayed.checkpoint_id) if retained == 1 else _lsn(job, 3)
        assert held is not None and held.confirmed_flush == oldest
