"""A step that reads and merges on the driver starts no Spark session; one that falls back starts it.

A Parquet ``FileSource`` feeding only an upsert sink merged on the driver (``DeltaTableSink``,
``ParquetTableSink``) reads and merges its checkpoint with pyarrow: its session handle
(:class:`~airflow_provider_checkpoint.spark.session.SparkHandle`) is never started, and in a fresh process no
JVM starts for the trigger, the steps or the finalize; also for more rows than ``driver_merge_rows`` (that
bounds what a sink collects out of Spark, not what a source read on the driver already). Where the driver
cannot take the input (more bytes than ``driver_read_bytes``; a column the driver does not read as Spark does)
the step starts the session and commits the same rows.
Every table is read back (delta-rs, pyarrow) and compared with pandas over the landed files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource, ParquetTableSink
from airflow_provider_checkpoint.dataflow.schema_ddl import declared_flat
from airflow_provider_checkpoint.spark.session import SPARK_DEFAULTS, SparkHandle, embedded_conf
from airflow_provider_checkpoint.spark.step_reads import spark_on_first_use
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.test_parquet_source_on_driver import KEYS, SCHEMA, land, normalized

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
READ_BYTES = 10_000
"""The sources' ``driver_read_bytes``: a checkpoint of 1,500 rows (about 16 kB) is read by Spark."""


def declare(base: Path) -> None:
    for name, sink, merge_rows in (("delta", DeltaTableSink, 100), ("parquet", ParquetTableSink, 2000)):
        source = FileSource(f"events_{name}", f"{base}/landing", "parquet", SCHEMA, driver_read_bytes=READ_BYTES)
        sink(name, source, f"{base}/{name}", mode="upsert", keys=KEYS, buckets=4, driver_merge_rows=merge_rows)


def truth(landing: Path) -> pd.DataFrame:
    """The later row in source order wins per key: files by name, each file's rows in order (pandas only)."""
    frames = []
    for path in sorted(landing.glob("events-*.parquet")):
        table = pq.read_table(path)
        ts = table["ts"].cast(pa.int32()) if pa.types.is_date32(table["ts"].type) else table["ts"]
        frames.append(table.set_column(2, "ts", ts.cast(pa.int64())).to_pandas())  # dates: Spark reads the days
    events = pd.concat(frames, ignore_index=True)
    events = events.astype(object).where(events.notna(), None)
    events["key"] = list(zip(events["user"].map(repr), events["page"].map(repr), strict=True))
    return normalized(events.drop_duplicates("key", keep="last"))


def tables(base: Path) -> dict[str, pd.DataFrame]:
    from deltalake import DeltaTable

    return {
        "delta": normalized(pa.table(DeltaTable(str(base / "delta")).scan()).to_pandas()),
        "parquet": normalized(ds.dataset(str(base / "parquet"), format="parquet").to_table().to_pandas()),
    }


def test_driver_steps_start_no_session_and_fallbacks_start_it(spark, tmp_path: Path) -> None:
    job = make_job(SparkHandle(lambda: spark, embedded_conf(None)), tmp_path, declare)
    landing = tmp_path / "landing"
    checkpoints = [  # rows landed, which sinks' steps need Spark, and of those which the plan shows it
        (300, pa.int64(), set(), set()),  # delta: a first load of at most 8 x 100 rows, written by the driver
        (120, pa.int64(), set(), set()),  # over delta's driver_merge_rows: read on the driver, merged there too
        (1500, pa.int64(), {"delta", "parquet"}, {"delta", "parquet"}),  # over driver_read_bytes: from the listing
        (50, pa.date32(), {"delta", "parquet"}, set()),  # dates in a BIGINT column: the driver does not read them
    ]
    for i, (n, ts_type, spark_steps, planned) in enumerate(checkpoints, start=1):
        land(landing, n, seed=i, ts_type=ts_type)
        job.checkpoint()
        started = {step.removeprefix("step_") for (c, step), s in job.started.items() if c == i and s}
        assert started == spark_steps, (i, job.started)
        assert job.plan is not None
        eager = {
            step.removeprefix("step_") for step in job.graph.steps if not spark_on_first_use(job.graph, step, job.plan)
        }
        assert eager == planned, (i, eager)  # a task starts the session at once for these, beside the storage
        expected = truth(landing)
        for name, got in tables(tmp_path).items():
            pd.testing.assert_frame_equal(got, expected, obj=f"{name} after checkpoint {i}")


def test_a_source_that_never_reads_on_the_driver_starts_spark_at_once(tmp_path: Path) -> None:
    """A JSON ``FileSource`` (read by Spark only) and a source class without a driver read of its own: the plan
    shows their steps need Spark, whatever the range."""
    from airflow_provider_checkpoint.dataflow.source import Source

    class Plain(Source):
        pass

    parquet = FileSource("p", str(tmp_path), "parquet", SCHEMA)
    position = {"files": {}}
    assert parquet.may_read_in_driver(position, position)
    assert not FileSource("j", str(tmp_path), "json", SCHEMA).may_read_in_driver(position, position)
    assert not Plain("plain").may_read_in_driver(None, None)


def test_an_unstarted_handle_knows_the_settings_the_session_has(spark) -> None:
    handle = SparkHandle(lambda: spark, embedded_conf(None))
    for key in [*SPARK_DEFAULTS, "spark.sql.session.timeZone"]:
        assert handle.conf(key) == spark.conf.get(key), key
    assert not handle.started
    assert handle.conf("spark.sql.shuffle.partitions") == spark.conf.get("spark.sql.shuffle.partitions")
    assert handle.conf("spark.app.name") == spark.conf.get("spark.app.name") and handle.started  # not known


SCRIPT = """
import json, logging, sys
from pathlib import Path

import psutil
from pyspark import SparkContext

from airflow_provider_checkpoint.dataflow.schema_ddl import declared_flat
from airflow_provider_checkpoint.spark.session import SparkHandle, embedded_conf, get_spark
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.test_parquet_source_on_driver import land
from tests.spark.test_step_without_jvm import declare

logging.basicConfig(level=logging.INFO)
base = Path(sys.argv[1])
job = make_job(SparkHandle(get_spark, embedded_conf(None)), base, declare)
for i, n in enumerate([300, 80], start=1):
    land(base / "landing", n, seed=i)
    job.checkpoint()
java = [p.name() for p in psutil.Process().children(recursive=True) if "java" in p.name()]
print(json.dumps({"started": any(job.started.values()), "context": SparkContext._active_spark_context is not None,
                  "java": java, "steps": len(job.started)}))
"""


def test_a_fresh_process_runs_driver_checkpoints_without_a_jvm(tmp_path: Path) -> None:
    """Trigger, both steps and finalize of two checkpoints in a fresh process: no session, no java process."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts == {"started": False, "context": False, "java": [], "steps": 4}, facts
    assert "Spark session started" not in done.stderr
    expected = truth(tmp_path / "landing")
    for name, got in tables(tmp_path).items():
        pd.testing.assert_frame_equal(got, expected, obj=name)


FLAT_TYPES = [
    "BOOLEAN", "TINYINT", "BYTE", "SMALLINT", "SHORT", "INT", "INTEGER", "BIGINT", "LONG", "FLOAT", "REAL",
    "DOUBLE", "STRING", "BINARY", "DATE", "TIMESTAMP", "TIMESTAMP_LTZ", "TIMESTAMP_NTZ", "DECIMAL", "DEC(12,3)",
    "NUMERIC(38, 0)", "decimal(5,5)", "string",
]  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    columns=st.lists(
        st.tuples(st.sampled_from(["a", "B", "`x y`", "`t``q`", "user"]), st.sampled_from(FLAT_TYPES), st.booleans()),
        min_size=1,
        max_size=4,
        unique_by=lambda c: c[0].lower(),
    )
)
def test_a_flat_schema_is_read_without_spark_as_spark_reads_it(spark, columns: list[tuple[str, str, bool]]) -> None:
    from pyspark.sql.types import StructType

    ddl = ", ".join(f"{name} {kind}{' NOT NULL' if not_null else ''}" for name, kind, not_null in columns)
    assert declared_flat(ddl, "TIMESTAMP_LTZ") == StructType.fromDDL(ddl), ddl


def test_a_schema_the_driver_does_not_read_is_left_to_spark() -> None:
    for ddl in ("a ARRAY<INT>", "a INT, b STRUCT<c: INT>", "a CHAR(3)", "a VARCHAR(3)", "a MAP<INT, INT>", "a INT,"):
        assert declared_flat(ddl, "TIMESTAMP_LTZ") is None, ddl
    assert declared_flat("a TIMESTAMP", "TIMESTAMP_NTZ") is None  # the session decides what TIMESTAMP is
    assert declared_flat("a TIMESTAMP_NTZ", "TIMESTAMP_NTZ") is not None
