"""The snapshot of PostgresCdcSource when the PostgreSQL server is killed (``pg_ctl -m immediate``: a crash, no
shutdown checkpoint) and restarted in the middle of it: the whole first snapshot while its ``COPY`` streams
(fault point ``trigger.snapshot_copy``), and the chunked snapshot (``snapshot_chunk_rows``):

- inside a trigger's chunk read (its transaction open, its snapshot taken, paused at the fault point
  ``trigger.chunk_read`` before the ``COPY``): that checkpoint fails; the next one reads the same chunk again,
  from the last completed checkpoint's cursor;
- between a trigger that read its chunk and the step that emits it: the checkpoint completes;
- down while the step would read: the step fails, the checkpoint is aborted, the next one reads the chunk again.

Between checkpoints the test inserts, updates, deletes and re-inserts keys. The model is a dict of the source
table and the set of keys changed since the slot was created: after every checkpoint the Delta target (read with
delta-rs, deletes hard) holds the keys of the chunks read so far and every changed key, as the source is, and the
PostgreSQL target (read with psycopg, soft deletes in ``deleted``) the same plus every deleted changed key,
marked; every chunk starts right after the previous completed one and holds the next ``CHUNK`` keys (none read
twice, none skipped). Once the snapshot is done both equal the source.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.dataflow import DeltaTableSink, PostgresTableSink
from airflow_provider_checkpoint.exceptions import CheckpointAborted, SinkUnavailableError
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.postgres import PostgresServer, cdc_connection

pytestmark = pytest.mark.spark
CHUNK = 6


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    with cdc_connection(postgres_server, monkeypatch, "cdc_restart_") as server:
        yield server


def kill_at_pause(server: PostgresServer, pause: Path, point: str = "trigger.chunk_read") -> None:
    """Once the trigger pauses at fault point ``point`` (``trigger.chunk_read``: inside its chunk's read
    transaction, before the ``COPY``), kill the server, restart it, and let the trigger go on."""
    deadline = time.monotonic() + 120
    while not (pause / f"{point}.paused").exists():
        if time.monotonic() > deadline:
            return  # the trigger never paused: the test fails on its missing error
        time.sleep(0.02)  # polled: the trigger gets there within moments
    server.kill()
    server.start()
    (pause / f"{point}.resume").touch()


def test_a_server_killed_while_the_initial_snapshot_copies_leaves_nothing_and_the_next_takes_it_again(
    spark, pg, tmp_path, monkeypatch
):
    """The whole first snapshot (no chunks): the server dies while the slot's exported snapshot is being read
    (``COPY`` streaming, its first rows read). The barrier fails and records nothing; the next drops the slot
    it created and takes the snapshot again: the target equals the source, changes made meanwhile included."""
    rng = random.Random(35)
    n = uuid.uuid4().hex[:6]
    table, slot = f"cdc_copykill_{n}", f"cdc_copykill_{n}"
    source = {i: rng.randrange(1000) for i in range(100_000)}
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
        with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
            for row in source.items():
                copy.write_row(row)

    def declare(tmp: Path) -> None:
        changes = PostgresCdcSource("src", [table], postgres_conn_id="cdc_pg", slot_name=slot)
        DeltaTableSink("lake", changes, str(tmp / "lake"), mode="upsert", keys=["id"], delete_when="deleted")

    def change() -> None:
        with pg.connect() as conn:
            for key in rng.sample(range(100_200), 40):
                if key in source:
                    conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                    del source[key]
                else:
                    source[key] = rng.randrange(1000)
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (key, source[key]))

    def check() -> None:
        lake = pa.table(DeltaTable(str(tmp_path / "lake")).scan()).select(["id", "v"]).to_pylist()
        assert {r["id"]: r["v"] for r in lake} == source and len(lake) == len(source)
        with pg.connect() as conn:
            slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        assert slots == (1,)

    job = make_job(spark, tmp_path, declare)
    pause = tmp_path / "pause"
    pause.mkdir()
    killer = threading.Thread(target=kill_at_pause, args=(pg, pause, "trigger.snapshot_copy"))
    killer.start()
    with monkeypatch.context() as faults:
        faults.setenv("CHECKPOINT_FAULTS", "trigger.snapshot_copy:action=pause")
        faults.setenv("CHECKPOINT_FAULTS_PAUSE_DIR", str(pause))
        with pytest.raises(
            SinkUnavailableError, match=rf"initial snapshot of public.{table} .*drops slot {slot}, which"
        ):
            job.checkpoint()  # its COPY, mid-stream: on a connection the crash closed
    killer.join()
    change()  # committed before the next barrier: in its snapshot
    job.checkpoint()
    check()
    change()  # after the slot's consistent point: the stream
    job.checkpoint()
    check()


def test_a_server_killed_mid_snapshot_loses_doubles_and_rereads_nothing(spark, pg, tmp_path, monkeypatch):
    rng = random.Random(55)
    n = uuid.uuid4().hex[:6]
    table, copy = f"cdc_restart_{n}", f"cdc_restart_{n}_copy"
    source = {i: rng.randrange(1000) for i in range(0, 80, 2)}  # odd keys come later, between the chunks
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
        conn.cursor().executemany(f"INSERT INTO {table} VALUES (%s, %s)", list(source.items()))

    def declare(tmp: Path) -> None:
        changes = PostgresCdcSource(
            "src", [table], postgres_conn_id="cdc_pg", slot_name=f"cdc_restart_{n}", snapshot_chunk_rows=CHUNK
        )
        DeltaTableSink("lake", changes, str(tmp / "lake"), mode="upsert", keys=["id"], delete_when="deleted")
        PostgresTableSink(
            f"copy_{n}", changes, "cdc_pg", copy, mode="upsert", keys=["id"],
            delete_when="deleted", deletes="soft", deleted_column="deleted",
        )  # fmt: skip

    job = make_job(spark, tmp_path, declare)
    touched: set[int] = set()
    cursor: int | None = -1  # the last key the completed checkpoints' chunks read; None: the snapshot is done

    def change() -> None:
        """A few random inserts (new keys and deleted ones again), updates and deletes, committed."""
        with pg.connect() as conn:
            for _ in range(6):
                key, v = rng.randrange(90), rng.randrange(1000)
                if key in source and rng.random() < 0.5:
                    conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                    del source[key]
                elif key in source:
                    conn.execute(f"UPDATE {table} SET v = %s WHERE id = %s", (v, key))
                    source[key] = v
                else:
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (key, v))
                    source[key] = v
                touched.add(key)

    def check(completed: Any) -> None:
        nonlocal cursor
        position = completed.source_positions["src"]
        if "chunk" in position:  # the next CHUNK keys after the last completed chunk, as the source is now
            assert cursor is not None
            after = sorted(k for k in source if k > cursor)[:CHUNK]
            assert position["chunk"]["rows"] == len(after), (completed.checkpoint_id, position["chunk"], cursor)
            cursor = after[-1] if len(after) == CHUNK else None
            expected_cursor = None if cursor is None else {"table": f"public.{table}", "after": [str(cursor)]}
            assert position.get("snapshot_cursor") == expected_cursor, (completed.checkpoint_id, position)
        live = {k: v for k, v in source.items() if cursor is None or k <= cursor or k in touched}
        lake = pa.table(DeltaTable(str(tmp_path / "lake")).scan()).select(["id", "v"]).to_pylist()
        assert {r["id"]: r["v"] for r in lake} == live and len(lake) == len(live), completed.checkpoint_id
        with pg.connect() as conn:
            rows = conn.execute(f"SELECT id, v, deleted FROM {copy}").fetchall()
        gone = {k: (None, True) for k in touched - set(source)}
        assert {k: (v, d) for k, v, d in rows} == {**{k: (v, False) for k, v in live.items()}, **gone}
        assert len(rows) == len(live) + len(gone), completed.checkpoint_id

    check(job.checkpoint())  # the slot and the first chunk
    change()
    check(job.checkpoint())
    change()

    assert cursor is not None, "still mid-snapshot"
    pause = tmp_path / "pause"
    pause.mkdir()
    killer = threading.Thread(target=kill_at_pause, args=(pg, pause))
    killer.start()
    with monkeypatch.context() as faults:
        faults.setenv("CHECKPOINT_FAULTS", "trigger.chunk_read:action=pause")
        faults.setenv("CHECKPOINT_FAULTS_PAUSE_DIR", str(pause))
        with pytest.raises(SinkUnavailableError, match=rf"snapshot chunk of public.{table} after key \['\d+'\] .*; "
                           "nothing was recorded: the next checkpoint reads this chunk again"):  # fmt: skip
            job.checkpoint()  # its chunk's COPY: on a connection the crash closed
    killer.join()
    check(job.checkpoint())  # the chunk the killed trigger was reading, read again: nothing lost or doubled
    change()

    assert cursor is not None, "still mid-snapshot"

    def crash() -> None:  # after the trigger read its chunk, before the step emits it
        pg.kill()
        pg.start()

    check(job.checkpoint(during=crash))
    change()
    assert cursor is not None, "still mid-snapshot"
    with pytest.raises(SinkUnavailableError, match="cannot connect to PostgreSQL"):
        job.checkpoint(during=pg.kill)  # down while the step would read: it fails (Airflow retries it)
    pg.start()
    assert job.plan is not None
    with pytest.raises(CheckpointAborted):  # its retries failed too: finalize aborts; the next reads the chunk
        job.coordinator.finalize(job.plan, [None])
    chunks = 0
    while cursor is not None:
        change()
        check(job.checkpoint())
        chunks += 1
        assert chunks < 20, "the snapshot never ends"
    change()
    check(job.checkpoint())  # the stream alone: both targets are the source
    assert cursor is None
