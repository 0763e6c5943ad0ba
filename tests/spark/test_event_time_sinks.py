"""Windows and late data exactly once into Parquet, Delta Lake and PostgreSQL, through faults and a restore.

One job: a tumbling window emitted ``final`` into a Parquet and a Delta table (append) with its late
rows (``late="output"``) into a Parquet table, and the same window emitted on ``update`` into a Delta
and a PostgreSQL table (upsert by user and window). Checkpoints land rows out of order and late; one
step fails after staging every sink (the retry stages again), one finalize fails before ``_metadata``
(aborted: the next checkpoint reads the rows again), one fails after it (the next trigger commits),
and the job is restored to an earlier checkpoint and goes on. After every checkpoint each table, read
back with pyarrow, deltalake or psycopg, equals a plain-Python model over the checkpoints that made
the job's history: each window once, each late row once, each upserted window at its latest value.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_provider_checkpoint.core.faults import ENV as FAULTS_ENV
from airflow_provider_checkpoint.dataflow import (
    DeltaTableSink,
    FileSource,
    ParquetTableSink,
    PostgresTableSink,
    WindowAggregate,
    tumbling,
)
from airflow_provider_checkpoint.exceptions import CheckpointAborted
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.postgres import PostgresServer
from tests.spark.helpers import table, write_json

pytestmark = pytest.mark.spark

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
T0 = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
BASE = int(T0.timestamp() * 1000)
MIN, WINDOW, BOUND = 60_000, 5 * 60_000, 10 * 60_000
KEYS = ["user", "window_start", "window_end"]
Row = tuple[str, int, int]  # user, minute, amount
Window = tuple[str, int, int, int, int]  # user, start ms, end ms, clicks, total


@pytest.fixture
def pg_schema(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AIRFLOW_CONN_PG_TEST", postgres_server.uri())
    with postgres_server.connect() as db:
        db.execute("CREATE SCHEMA IF NOT EXISTS et_sinks")
    yield "et_sinks"


def declare(tmp: Path) -> None:
    events = FileSource("events", str(tmp / "landing"), "json", SCHEMA, watermark=("ts", "10 minutes"))
    aggs = {"clicks": "count", "total": "sum(amount)"}
    final = WindowAggregate("final", events, ["user"], "ts", tumbling("5 minutes"), aggs, late="output")
    ParquetTableSink("final_parquet", final, str(tmp / "final_parquet"), mode="append", step="w")
    DeltaTableSink("final_delta", final, str(tmp / "final_delta"), step="w")
    ParquetTableSink("late_parquet", final.late_data, str(tmp / "late_parquet"), mode="append", step="w")
    update = WindowAggregate("update", events, ["user"], "ts", tumbling("5 minutes"), aggs, emit="update")
    DeltaTableSink("update_delta", update, str(tmp / "update_delta"), "upsert", KEYS, step="w")
    PostgresTableSink("update_pg", update, "pg_test", "et_sinks.windows", "upsert", keys=KEYS, step="w")


def increment(n: int, rng: random.Random) -> list[Row]:
    """Rows around minute ``15 n``, up to 12 minutes out of order, every fourth 15 to 40 minutes late."""
    rows = []
    for i in range(10):
        minute = 15 * n + rng.randrange(-12, 6) - (rng.randrange(15, 40) if i % 4 == 3 else 0)
        rows.append((rng.choice("ab"), max(minute, 0), rng.randrange(1, 50)))
    return rows


class Model:
    """The documented semantics over the checkpoints of the job's history (each a list of rows)."""

    def __init__(self, history: list[list[Row]]) -> None:
        self.final: list[Window] = []
        self.late: list[Row] = []
        self.update: dict[tuple[str, int], Window] = {}
        open_: dict[tuple[str, int], list[int]] = {}
        mark: int | None = None
        top: int | None = None
        for rows in history:
            touched = set()
            for user, minute, amount in rows:
                start = minute * MIN - minute * MIN % WINDOW
                if mark is not None and start + WINDOW <= mark:
                    self.late.append((user, minute, amount))
                    continue
                open_.setdefault((user, start), []).append(amount)
                touched.add((user, start))
            if rows:
                top = max([*(m * MIN for _, m, _ in rows), *([top] if top is not None else [])])
                mark = top - BOUND if mark is None else max(mark, top - BOUND)
            for key in sorted(open_):
                user, start = key
                row = (user, BASE + start, BASE + start + WINDOW, len(open_[key]), sum(open_[key]))
                if key in touched:
                    self.update[key] = row
                if mark is not None and start + WINDOW <= mark:
                    self.final.append(row)
                    del open_[key]


def windows(df: pd.DataFrame) -> list[Window]:
    if df.empty:
        return []
    ms = {c: pd.to_datetime(df[c], utc=True).dt.as_unit("ms").astype("int64") for c in ("window_start", "window_end")}
    rows = zip(df["user"], ms["window_start"], ms["window_end"], df["clicks"], df["total"], strict=True)
    return sorted((u, int(s), int(e), int(c), int(t)) for u, s, e, c, t in rows)


def late_rows(df: pd.DataFrame) -> list[Row]:
    if df.empty:
        return []
    minutes = (pd.to_datetime(df["ts"], utc=True).dt.as_unit("ms").astype("int64") - BASE) // MIN
    return sorted((u, int(m), int(a)) for u, m, a in zip(df["user"], minutes, df["amount"], strict=True))


def delta(path: Path) -> pd.DataFrame:
    import pyarrow as pa
    from deltalake import DeltaTable

    return pa.table(DeltaTable(str(path)).scan()).to_pandas() if (path / "_delta_log").exists() else pd.DataFrame()


def postgres(server: PostgresServer) -> pd.DataFrame:
    with server.connect() as db:
        exists = db.execute("SELECT to_regclass('et_sinks.windows')").fetchone()
        if exists is None or exists[0] is None:
            return pd.DataFrame()
        rows = db.execute('SELECT "user", window_start, window_end, clicks, total FROM et_sinks.windows').fetchall()
    return pd.DataFrame(rows, columns=["user", "window_start", "window_end", "clicks", "total"])


def test_windows_and_late_rows_land_exactly_once_through_faults_and_a_restore(
    spark: Any, tmp_path: Path, pg_schema: str, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(spark, tmp_path, declare)
    rng = random.Random(50)
    history: list[list[Row]] = []  # rows of each completed checkpoint of the job's history
    landed: list[Row] = []  # every row landed, in order
    read = 0  # rows of ``landed`` read by the history
    completed_at: dict[int, tuple[int, int]] = {}  # checkpoint id -> (len(history), read)
    plan = [
        "ok",
        "ok",
        "step fails after staging",
        "abort before metadata",
        "fail after metadata",
        "ok",
        "restore",
        "ok",
    ]
    for n, action in enumerate(plan, start=1):
        rows = increment(n, rng)
        write_json(tmp_path / "landing" / f"e{n}.json", [_json(r) for r in rows])
        landed += rows
        faults = {
            "step fails after staging": f"step.before_ack:checkpoint={job.checkpoints + 1}:attempt=1",
            "abort before metadata": "finalize.before_metadata",
            "fail after metadata": "finalize.after_metadata",
        }
        if action == "restore":  # back to the second checkpoint, then on
            restored = 2
            request_restore(job.storage, job.storage.url(job.storage.chk_dir(restored)), False, False)
            del history[completed_at[restored][0] :]
            read = completed_at[restored][1]
        if action in faults:
            monkeypatch.setenv(FAULTS_ENV, faults[action])
        try:
            if action == "abort before metadata":
                with pytest.raises(CheckpointAborted):
                    job.checkpoint()
                continue  # nothing of it is visible; the next checkpoint reads its rows again
            if action == "fail after metadata":
                with pytest.raises(Exception, match="finalize.after_metadata"):
                    job.checkpoint()
                checkpoint_id = job.checkpoints  # completed: its sinks are committed by the next trigger
            else:
                checkpoint_id = job.checkpoint().checkpoint_id
        finally:
            monkeypatch.delenv(FAULTS_ENV, raising=False)
        history.append(landed[read:])
        read = len(landed)
        completed_at[checkpoint_id] = (len(history), read)
        if action == "fail after metadata":
            continue  # the tables catch up with the next checkpoint
        model = Model(history)
        assert windows(table(tmp_path / "final_parquet")) == sorted(model.final), f"final parquet after {n}"
        assert windows(delta(tmp_path / "final_delta")) == sorted(model.final), f"final delta after {n}"
        assert late_rows(table(tmp_path / "late_parquet")) == sorted(model.late), f"late rows after {n}"
        assert windows(delta(tmp_path / "update_delta")) == sorted(model.update.values()), f"update delta after {n}"
        assert windows(postgres(postgres_server)) == sorted(model.update.values()), f"update postgres after {n}"
    model = Model(history)
    assert model.final and model.late and len(model.update) > len(model.final), "the data must exercise every table"
    assert any(attempt == 2 for _, _, attempt in job.step_runs), "the failed step must have been retried"


def _json(row: Row) -> dict[str, Any]:
    user, minute, amount = row
    return {"user": user, "ts": (T0 + datetime.timedelta(minutes=minute)).isoformat(), "amount": amount}
