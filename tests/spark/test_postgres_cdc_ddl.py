"""Schema changes of a captured table against the real PostgreSQL server, into a Delta upsert table read
back with delta-rs and compared with psycopg SELECTs of the source.

In one checkpoint's span: transactions, an added column, transactions writing it, a varchar(10) → text
widening, transactions writing long values; the Delta sink refuses the added column naming it and the fix,
the fix is applied, the next checkpoint replays the span (rows before the DDL null in the new column).
Across checkpoints: a dropped column stays in the target, null in rows changed since. Then an int4 → int8
widening reaches the sink as BIGINT (which the Delta table refuses); a change that does not widen, and a
column added with a default (old rows hold it with no WAL record), are refused at the trigger naming them.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field

from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.dataflow import DeltaTableSink
from airflow_provider_checkpoint.exceptions import CdcSourceError, CheckpointAborted, SinkSchemaError
from airflow_provider_checkpoint.testing.inprocess import Job, make_job
from tests.servers.postgres import PostgresServer, cdc_connection

pytestmark = pytest.mark.spark


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    with cdc_connection(postgres_server, monkeypatch, "cdc_ddl_") as server:
        yield server


class Churn:
    """Random single- and multi-row transactions over the table's current columns; remembers the keys it
    wrote (inserted or updated) since :meth:`forget`."""

    def __init__(self, conn: Any, table: str) -> None:
        self.conn, self.table, self.rng = conn, table, random.Random(55)
        self.keys: set[int] = set()
        self.next_id, self.written = 1, set[int]()

    def run(self, n: int, columns: dict[str, Any]) -> None:
        """``n`` transactions; ``columns``: the non-key columns and a function of the rng giving a value."""
        names = ", ".join(["id", *columns])
        for _ in range(n):
            with self.conn.transaction():
                for _ in range(self.rng.choice([1, 3])):
                    op = self.rng.choice(["insert", "insert", "update", "delete"]) if self.keys else "insert"
                    values = [make(self.rng) for make in columns.values()]
                    if op == "insert":
                        key, self.next_id = self.next_id, self.next_id + 1
                        marks = ", ".join(["%s"] * (len(columns) + 1))
                        self.conn.execute(f"INSERT INTO {self.table} ({names}) VALUES ({marks})", (key, *values))
                        self.keys.add(key)
                        self.written.add(key)
                        continue
                    key = self.rng.choice(sorted(self.keys))
                    if op == "delete":
                        self.conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
                        self.keys.discard(key)
                    else:
                        assign = ", ".join(f"{c} = %s" for c in columns)
                        self.conn.execute(f"UPDATE {self.table} SET {assign} WHERE id = %s", (*values, key))
                        self.written.add(key)

    def select(self, columns: list[str]) -> dict[int, tuple[Any, ...]]:
        rows = self.conn.execute(f"SELECT id, {', '.join(columns)} FROM {self.table}").fetchall()
        return {r[0]: tuple(r[1:]) for r in rows}


def delta(path: Path, columns: list[str]) -> dict[int, tuple[Any, ...]]:
    rows = pa.table(DeltaTable(str(path)).scan()).select(["id", *columns]).to_pylist()  # deletion vectors applied
    found = {r["id"]: tuple(r[c] for c in columns) for r in rows}
    assert len(found) == len(rows), "one row per key"
    return found


def refused(job: Job, match: str) -> None:
    """The next checkpoint's sink step refuses its input; the checkpoint is aborted, as finalize would."""
    with pytest.raises(SinkSchemaError, match=match):
        job.checkpoint()
    assert job.plan is not None
    with pytest.raises(CheckpointAborted):  # finalize without the step's ack: aborted, the lease released
        job.coordinator.finalize(job.plan, [None])


def short(rng: random.Random) -> str | None:
    return rng.choice([None, f"s{rng.randrange(10**6)}"])


NUMBER = {"n": lambda r: r.randrange(-1000, 1000)}


def captured(pg: PostgresServer, table: str, v: str) -> tuple[Any, Churn]:
    """A connection and the churn of a new table ``(id int PRIMARY KEY, n int, <v>)``, eight transactions in."""
    conn = pg.connect()
    conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n int, {v})")
    churn = Churn(conn, table)
    churn.run(8, {**NUMBER, "v": short})
    return conn, churn


def test_added_dropped_and_widened_columns_within_and_across_checkpoints(spark, pg, tmp_path):
    table, slot = f"cdc_ddl_{uuid.uuid4().hex[:6]}", f"cdc_ddl_{uuid.uuid4().hex[:6]}"
    path = tmp_path / "lake"
    conn, churn = captured(pg, table, "v varchar(10)")
    number = NUMBER

    def declare(tmp: Path) -> None:
        changes = PostgresCdcSource("ddl", [table], postgres_conn_id="cdc_pg", slot_name=slot)
        DeltaTableSink("lake", changes, str(path), mode="upsert", keys=["id"], delete_when="deleted")

    job = make_job(spark, tmp_path, declare, retained_checkpoints=3)
    job.checkpoint()
    assert delta(path, ["n", "v"]) == churn.select(["n", "v"])

    # one span: before the DDL, an added column, a widened varchar, rows of each shape
    churn.run(4, {**number, "v": short})
    conn.execute(f"ALTER TABLE {table} ADD COLUMN note text")
    churn.run(4, {**number, "v": short, "note": lambda r: f"note{r.randrange(99)}"})
    conn.execute(f"ALTER TABLE {table} ALTER COLUMN v TYPE text")
    churn.run(4, {**number, "v": lambda r: "long " * r.randrange(3, 9), "note": short})
    refused(job, r"added column\(s\) \['note'\] \(.*DeltaTable.alter.add_columns")
    DeltaTable(str(path)).alter.add_columns([Field("note", "string", nullable=True)])
    job.checkpoint()  # replays the span from the first checkpoint's position
    assert delta(path, ["n", "v", "note"]) == churn.select(["n", "v", "note"])

    # across checkpoints: a dropped column stays in the target, null in the rows changed since
    kept = churn.select(["v"])
    conn.execute(f"ALTER TABLE {table} DROP COLUMN v")
    churn.written.clear()
    churn.run(6, {**number, "note": short})
    job.checkpoint()
    expected = {
        k: (n, None if k in churn.written else kept[k][0], note) for k, (n, note) in churn.select(["n", "note"]).items()
    }
    assert delta(path, ["n", "v", "note"]) == expected

    # int4 -> int8 widens: the rows reach the sink as BIGINT, which the Delta table (integer) refuses
    conn.execute(f"ALTER TABLE {table} ALTER COLUMN n TYPE bigint")
    churn.run(2, {"n": lambda r: 2**40 + r.randrange(9)})
    refused(job, r"retyped column\(s\) n \(integer in the table, long in the input\)")
    conn.execute(f"ALTER TABLE {table} ALTER COLUMN n TYPE text")
    with pytest.raises(CdcSourceError, match=rf"column n of table public.{table} changed type from integer to text"):
        job.checkpoint()
    conn.execute(f"ALTER TABLE {table} ALTER COLUMN n TYPE bigint USING n::bigint")
    conn.execute(f"ALTER TABLE {table} ADD COLUMN flag boolean DEFAULT true")  # old rows: true, in no WAL record
    with pytest.raises(CdcSourceError, match=rf"column flag of table public.{table} was added with a default"):
        job.checkpoint()
    conn.close()
