"""A checkpoint's stats record names what each sink committed: checked against the tables themselves.

One step writes a JSON source with malformed lines to a Parquet table, a Delta table and a
PostgreSQL table (with a dead-letter table for the rows PostgreSQL refuses); the source's
malformed lines go to its own dead-letter Parquet table. Every figure of the record's
``sinks`` (rows, files, bytes, Delta version, commit time) is compared with what reading the
tables back gives (pyarrow, deltalake, psycopg), and checkpoint 2, whose finalize dies after
``_metadata``, is recorded as committed by the next run's trigger.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.dataflow import FileSource, ParquetTableSink
from airflow_provider_checkpoint.exceptions import InjectedFault
from airflow_provider_checkpoint.storage.stats import StatsStore
from airflow_provider_checkpoint.testing.inprocess import make_job
from airflow_provider_checkpoint.testing.malformed import SCHEMA, land_mixed
from tests.servers.postgres import PostgresServer

pytestmark = pytest.mark.spark
_schemas = itertools.count()


def _land_refused(landing: Path, name: str, n: int) -> None:
    """``n`` good JSON records whose page holds a NUL character: PostgreSQL refuses them (text)."""
    lines = [json.dumps({"user": f"n{i}", "page": "/nul\u0000", "ts": i}) for i in range(n)]
    (landing / f".{name}").write_text("".join(line + "\n" for line in lines))
    (landing / f".{name}").rename(landing / name)


def _parquet_output(table: Path, checkpoint_id: int) -> tuple[int, int, int]:
    """(rows, files, bytes) of the files a checkpoint committed to an append Parquet table."""
    files = sorted(table.glob(f"part-c{checkpoint_id:010d}-*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files), len(files), sum(f.stat().st_size for f in files)


def _delta_output(table: Path, version: int) -> tuple[int, int, int]:
    """(rows, files, bytes) that Delta ``version`` added to an append table (read back with delta-rs)."""
    from deltalake import DeltaTable

    before = DeltaTable(str(table), version=version - 1)
    after = DeltaTable(str(table), version=version)
    added = set(after.file_uris()) - set(before.file_uris())
    rows = after.to_pyarrow_table().num_rows - before.to_pyarrow_table().num_rows
    return rows, len(added), sum(Path(u.removeprefix("file://")).stat().st_size for u in added)


def test_sinks_figures_match_the_tables_and_a_commit_finished_by_the_trigger_says_so(
    spark: Any, tmp_path: Path, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = f"rec{next(_schemas)}"
    monkeypatch.setenv("AIRFLOW_CONN_PG_TEST", postgres_server.uri())
    with postgres_server.connect() as db:
        db.execute(f"CREATE SCHEMA {schema}")

    def declare(base: Path) -> None:
        events = FileSource(
            "events", f"{base}/json", "json", SCHEMA, on_malformed="dead_letter", dead_letter_path=f"{base}/dead"
        )
        ParquetTableSink("archive", events, f"{base}/archive", step="load")
        DeltaTableSink("lake", events, f"{base}/lake", step="load")
        PostgresTableSink("facts", events, "pg_test", f"{schema}.facts", dead_letter_table="refused", step="load")

    job = make_job(spark, tmp_path, declare)
    windows: dict[int, tuple[float, float]] = {}
    for checkpoint_id in (1, 2, 3):
        land_mixed(tmp_path / "json", f"mixed-{checkpoint_id}.json", "json", 30 + 7 * checkpoint_id, seed=checkpoint_id)
        _land_refused(tmp_path / "json", f"nul-{checkpoint_id}.json", checkpoint_id)
        started = time.time()
        if checkpoint_id == 2:
            monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.after_metadata:checkpoint=2")
            with pytest.raises(InjectedFault):
                job.checkpoint()
            monkeypatch.delenv("CHECKPOINT_FAULTS")
        else:
            job.checkpoint()  # checkpoint 3's trigger finishes the commit of checkpoint 2
        windows[checkpoint_id] = (started, time.time())
    windows[2] = (windows[2][0], windows[3][1])

    from deltalake import DeltaTable

    lake = DeltaTable(str(tmp_path / "lake"))
    versions = {h["checkpoint_id"]: h["version"] for h in lake.history() if "checkpoint_id" in h}
    assert lake.version() == versions[3] == 3, "version 0 creates the table, then one commit per checkpoint"
    records = {r["checkpoint_id"]: r for r in StatsStore(job.storage).read_all()}
    for checkpoint_id in (1, 2, 3):
        record = records[checkpoint_id]
        sinks = record["sinks"]
        assert set(sinks) == {"archive", "lake", "facts", "facts.dead_letters", "events.dead_letters"}
        assert {s["step"] for s in sinks.values()} == set(record["steps"]) == {"step_load"}
        begun, ended = windows[checkpoint_id]
        assert all(begun <= s["commit_time"] <= ended for s in sinks.values()), sinks

        archive = sinks["archive"]
        assert (archive["kind"], archive["target"]) == ("parquet", f"file://{tmp_path}/archive")
        assert (archive["rows"], archive["files"], archive["bytes"]) == _parquet_output(
            tmp_path / "archive", checkpoint_id
        )
        dead = sinks["events.dead_letters"]
        assert (dead["kind"], dead["target"]) == ("dead_letters", f"file://{tmp_path}/dead")
        assert (dead["rows"], dead["files"], dead["bytes"]) == _parquet_output(tmp_path / "dead", checkpoint_id)
        assert dead["rows"] > 0 and archive["delta_version"] is None and dead["delta_version"] is None

        delta = sinks["lake"]
        assert (delta["kind"], delta["target"]) == ("delta", f"file://{tmp_path}/lake")
        assert delta["delta_version"] == versions[checkpoint_id]
        assert (delta["rows"], delta["files"], delta["bytes"]) == _delta_output(
            tmp_path / "lake", delta["delta_version"]
        )

        with postgres_server.connect() as db:
            rows = db.execute(f"SELECT count(*) FROM {schema}.facts WHERE _checkpoint_id = %s", [checkpoint_id])
            refused = db.execute(
                f"SELECT count(*) FROM {schema}.refused WHERE sink_uid = 'facts' AND checkpoint_id = %s",
                [checkpoint_id],
            )
            truth = (rows.fetchone()[0], refused.fetchone()[0])
        facts, letters = sinks["facts"], sinks["facts.dead_letters"]
        assert (facts["kind"], facts["target"], facts["files"], facts["bytes"]) == (
            "postgres",
            f"{schema}.facts",
            None,
            None,
        )
        assert (letters["kind"], letters["target"]) == ("dead_letters", f"{schema}.refused")
        assert (facts["rows"], letters["rows"]) == truth == (archive["rows"] - checkpoint_id, checkpoint_id)

        assert record["sink_bytes"] == archive["bytes"] + dead["bytes"] + delta["bytes"]
        step = record["steps"]["step_load"]
        assert step["attempt"] == 1
        assert step["records_out"] == sum(s["rows"] for s in sinks.values())
        assert step["input_records"] == {"events": record["records_in"]}
        assert "sinks" not in step
        assert record["restored"] is False
        row = stats.history_row(record)
        assert row is not None and row["bytes_written"] == record["sink_bytes"] and row["restored_from"] is None

    by = {c: (records[c]["committed_by"], records[c]["committed_by_run_id"]) for c in (1, 2, 3)}
    assert by == {1: ("finalize", "run-1"), 2: ("trigger", "run-3"), 3: ("finalize", "run-3")}
