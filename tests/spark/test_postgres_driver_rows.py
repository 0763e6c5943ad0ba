"""PostgresTableSink takes the rows a source read on the driver and ``COPY``s them from there, no Spark job.

A Parquet ``FileSource`` feeding only a PostgreSQL sink is read by pyarrow on the driver; the sink reduces the
rows to one row per key there (the upsert rule's own code) and stages them from the driver. Three sinks of one
job, each fed by its own source over the same landing directory: an append, an upsert by ``sequence_by`` with
deletes (``delete_when``) and an upsert with soft deletes; over checkpoints with repeated keys, null key parts,
ties in ``sequence_by``, deletes and one checkpoint above a sink's ``driver_rows`` (staged from the driver too:
that bound is for rows collected out of Spark). After every
checkpoint each table, read with psycopg, equals a plain-Python model of the rule. Then Hypothesis feeds the same
random rows to a sink through the driver path and to a twin through Spark: the two tables are equal, and equal
to the model. An append of a keyed aggregate merged on the driver stages the merged rows from there too, with no
DataFrame made of them, and equals the same pipeline merged by Spark.
"""

from __future__ import annotations

import random
import tempfile
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.postgres import staging
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate
from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import SinkValueError
from airflow_provider_checkpoint.fileio.frames import arrow_frame
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.postgres import PostgresServer
from tests.spark.helpers import step_context

pytestmark = pytest.mark.spark

KEYS = ["k", "part"]
SCHEMA = "k STRING, part INT, v BIGINT, seq BIGINT, deleted BOOLEAN, note STRING"
COLUMNS = ["k", "part", "v", "seq", "deleted", "note"]
TYPES = {"k": pa.string(), "part": pa.int32(), "v": pa.int64(), "seq": pa.int64(), "deleted": pa.bool_()}
Row = dict[str, Any]


def _latest(rows: list[Row], sequence_by: bool, keys: list[str] = KEYS) -> dict[tuple[Any, ...], Row]:
    """The rule in plain Python: per key the greatest ``seq`` (a null below any value), then the later row."""
    won: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        key = tuple(row[k] for k in keys)
        old = won.get(key)
        if old is None or not sequence_by or _rank(row["seq"]) >= _rank(old["seq"]):
            won[key] = row
    return won


def _rank(seq: int | None) -> tuple[bool, int]:
    return (seq is not None, seq or 0)


class Model:
    """The three tables after each checkpoint: append (rows and their checkpoint), hard and soft upserts."""

    def __init__(self) -> None:
        self.appended: list[tuple[Any, ...]] = []
        self.latest: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.soft: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def checkpoint(self, checkpoint_id: int, rows: list[Row]) -> None:
        self.appended += [(*(r[c] for c in COLUMNS), checkpoint_id) for r in rows]
        for key, row in _latest(rows, sequence_by=True).items():
            if row["deleted"]:
                self.latest.pop(key, None)
            else:
                self.latest[key] = tuple(row[c] for c in COLUMNS if c != "deleted")
        for key, row in _latest(rows, sequence_by=False).items():
            self.soft[key] = (*(row[c] for c in COLUMNS if c != "deleted"), bool(row["deleted"]))


def _select(server: PostgresServer, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    with server.connect() as db:
        return sorted(db.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall(), key=repr)


def _land(landing: Path, n: int, seed: int) -> list[Row]:
    """``n`` rows in a new Parquet file: few keys (repeats, null parts), ``seq`` ties and nulls, deletes."""
    rng = random.Random(seed)
    rows = [
        {
            "k": rng.choice([None, "", "a", "b", "é", 'x,"y"\n']),
            "part": rng.choice([None, 1, 2]),
            "v": rng.choice([None, seed * 1000 + i]),
            "seq": rng.choice([None, 1, 2, 3]),
            "deleted": rng.choice([None, False, False, True]),
            "note": rng.choice([None, "", "plain", "tab\there", 'quote"d', "back\\slash"]),
        }
        for i in range(n)
    ]
    table = pa.table({c: pa.array([r[c] for r in rows], TYPES.get(c, pa.string())) for c in COLUMNS})
    landing.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, landing / f".e{seed}")
    (landing / f".e{seed}").rename(landing / f"events-{seed:03d}.parquet")
    return rows


@pytest.fixture
def from_driver(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The uids of the sinks staging rows from the driver (Arrow, not a DataFrame) while the test runs."""
    staged: list[str] = []
    original = staging.stage

    def spy(sink: Any, conn: Any, ctx: Any, schema: Any, rows: Any, *args: Any, **kwargs: Any) -> Any:
        staged.extend([sink.uid] if isinstance(rows, pa.Table) else [])
        return original(sink, conn, ctx, schema, rows, *args, **kwargs)

    monkeypatch.setattr(staging, "stage", spy)
    return staged


def test_a_file_source_loads_postgres_from_the_driver(spark, postgres_server, pg_schema, tmp_path, from_driver) -> None:
    def declare(base: Path) -> None:
        def source(name: str) -> FileSource:
            return FileSource(f"events_{name}", f"{base}/landing", "parquet", SCHEMA)

        PostgresTableSink("appended", source("append"), "pg_test", f"{pg_schema}.appended")
        PostgresTableSink(
            "latest", source("latest"), "pg_test", f"{pg_schema}.latest", "upsert", KEYS,
            sequence_by=["seq"], delete_when="deleted", driver_rows=100,
        )  # fmt: skip
        PostgresTableSink(
            "soft", source("soft"), "pg_test", f"{pg_schema}.soft", "upsert", KEYS,
            delete_when="deleted", deletes="soft",
        )  # fmt: skip

    tracker = spark.sparkContext.statusTracker()
    job, model = make_job(spark, tmp_path, declare), Model()
    for checkpoint_id, n in enumerate([60, 40, 150], start=1):  # the third: above latest's driver_rows, still
        rows = _land(tmp_path / "landing", n, seed=checkpoint_id)
        from_driver.clear()
        before = set(tracker.getJobIdsForGroup())
        job.checkpoint()
        model.checkpoint(checkpoint_id, rows)
        assert sorted(from_driver) == ["appended", "latest", "soft"], (checkpoint_id, from_driver)
        assert not set(tracker.getJobIdsForGroup()) - before, checkpoint_id  # no Spark job at all
        appended = _select(postgres_server, f"{pg_schema}.appended", [*COLUMNS, "_checkpoint_id"])
        assert appended == sorted(model.appended, key=repr), checkpoint_id
        latest = _select(postgres_server, f"{pg_schema}.latest", [c for c in COLUMNS if c != "deleted"])
        assert latest == sorted(model.latest.values(), key=repr), checkpoint_id
        soft = _select(postgres_server, f"{pg_schema}.soft", [c for c in COLUMNS if c != "deleted"] + ["__deleted"])
        assert soft == sorted(model.soft.values(), key=repr), checkpoint_id


MODES = {
    "append": {},
    "append, partitions": {"partition_per_checkpoint": True},
    "upsert": {"mode": "upsert", "keys": KEYS},
    "upsert, one integer key": {"mode": "upsert", "keys": ["v"]},  # proven unique by a sort, or grouped
    "upsert, deletes": {"mode": "upsert", "keys": KEYS, "delete_when": "deleted"},
    "upsert, soft deletes": {"mode": "upsert", "keys": KEYS, "delete_when": "deleted", "deletes": "soft"},
}


@st.composite
def batches(draw: st.DrawFn) -> pa.Table:
    """Rows with few keys (repeats, null parts), ``seq`` ties and nulls, deletes, timestamps (staged as CSV)."""
    n = draw(st.integers(0, 30))

    def column(values: st.SearchStrategy[Any]) -> list[Any]:
        return draw(st.lists(values, min_size=n, max_size=n))

    start = datetime(2025, 1, 1, tzinfo=UTC)
    return pa.table(
        {
            "k": pa.array(column(st.sampled_from([None, "", "a", "b", "é"])), pa.string()),
            "part": pa.array(column(st.sampled_from([None, 1, 2])), pa.int32()),
            "v": pa.array(column(st.none() | st.integers(-(2**40), 2**40)), pa.int64()),
            "seq": pa.array(column(st.sampled_from([None, 1, 2])), pa.int64()),
            "deleted": pa.array(column(st.sampled_from([None, False, True])), pa.bool_()),
            "at": pa.array([start + timedelta(seconds=s) for s in column(st.integers(0, 10**6))], pa.timestamp("us")),
        }
    ).replace_schema_metadata(None)


REPEATED_INTEGER_KEY = pa.table(
    {
        "k": pa.array(["a", "b", "c", "d", "e"], pa.string()),
        "part": pa.array([1, 1, 2, 2, None], pa.int32()),
        "v": pa.array([5, None, 5, None, 7], pa.int64()),  # a value and a null twice: not unique, grouped
        "seq": pa.array([2, 1, 1, 2, None], pa.int64()),
        "deleted": pa.array([False, False, True, False, None], pa.bool_()),
        "at": pa.array([datetime(2025, 1, 1, tzinfo=UTC)] * 5, pa.timestamp("us")),
    }
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=batches(), mode=st.sampled_from(list(MODES)), sequence_by=st.booleans())
@example(data=REPEATED_INTEGER_KEY, mode="upsert, one integer key", sequence_by=False)
@example(data=REPEATED_INTEGER_KEY.slice(0, 2), mode="upsert, one integer key", sequence_by=True)  # unique
def test_the_driver_path_stages_what_spark_stages(
    spark, postgres_server, pg_schema, data: pa.Table, mode: str, sequence_by: bool
) -> None:
    options = dict(MODES[mode])
    if sequence_by and options.get("mode") == "upsert":
        options["sequence_by"] = ["seq"]
    df = arrow_frame(spark, data).coalesce(1)  # source order: the list's
    storage = JobStorage.for_job(f"{tempfile.gettempdir()}/pg-driver-rows-jobs", "job")
    tables = {}
    for path in ("driver", "spark"):
        name = f"{path}_{uuid.uuid4().hex[:8]}"
        sink = PostgresTableSink(path, Source("src"), "pg_test", f"{pg_schema}.{name}", driver_rows=1000, **options)
        ctx = step_context(spark, storage, 1)
        sink.prepare(ctx)
        read = SourceRows(df.toArrow(), df.schema, lambda: df)
        sink.commit(1, sink.stage(ctx, read if path == "driver" else df))
        with postgres_server.connect() as db:
            cursor = db.execute(f"SELECT * FROM {pg_schema}.{name}")
            tables[path] = Counter(cursor.fetchall())
            columns = [c.name for c in cursor.description or []]
    assert tables["driver"] == tables["spark"]

    rows = df.toArrow().to_pylist()  # the model: every row in append mode, else the rule's winner of each key
    if options.get("mode") != "upsert":
        expected = [{**r, "_checkpoint_id": 1} for r in rows]
    else:
        won = _latest(rows, sequence_by=bool(options.get("sequence_by")), keys=options["keys"]).values()
        if "deletes" in options:
            expected = [
                {**{c: v for c, v in r.items() if c != "deleted"}, "__deleted": bool(r["deleted"])} for r in won
            ]
        elif "delete_when" in options:
            expected = [{c: v for c, v in r.items() if c != "deleted"} for r in won if not r["deleted"]]
        else:
            expected = list(won)
    assert tables["driver"] == Counter(tuple(r[c] for c in columns) for r in expected)


class _Keyed(Source):
    """A source whose rows hold each ``k`` once (as a stateful operator's output by ``k``): no reduction."""

    def unique_keys(self) -> tuple[str, ...]:
        return ("k",)


MESSY = "k STRING, v BIGINT, seq BIGINT, amount DECIMAL(12,2), at TIMESTAMP, note STRING"


def _messy(spark: Any, checkpoint_id: int, unique: bool) -> Any:
    """Unicode, nulls (a null key too), zoned timestamps, decimals, NUL bytes (refused), keys repeated (``seq``
    ties: source order decides) unless ``unique``; in the slices of the list Spark makes (source order: the list's),
    cached, so Spark's estimate of its size is known (as of a stateful operator's output, read from its files)."""
    start = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # a daylight-saving change in many zones
    keys = ["é✓𝄞", None, "", "a", 'x,"y"\n', "tab\t"] + [f"k{i}" for i in range(40)]
    rows = [
        (
            keys[i % len(keys)] if not unique else (keys[i] if i < len(keys) else f"u{i}"),
            None if i % 7 == 0 else checkpoint_id * 1000 + i,
            None if i % 5 == 0 else i % 2,  # a key's rows (i, i + 46, i + 92) tie: source order decides
            None if i % 6 == 0 else Decimal(f"{i * 37 - 500}.{i % 100:02d}"),
            None if i % 8 == 0 else start + timedelta(minutes=37 * i),
            "nul\0here" if i % 11 == 3 else (None if i % 4 == 0 else f'ü-{i}-\\-"q"'),
        )
        for i in range(120)
    ]
    df = spark.createDataFrame(rows, MESSY).cache()
    df.count()
    return df


DATAFRAME_CASES = {  # partition_per_checkpoint stages as append does (the model suite's -collected runs it)
    "append": {},
    "upsert, repeated keys": {"mode": "upsert", "keys": ["k"], "sequence_by": ["seq"]},
    "upsert, unique keys": {"mode": "upsert", "keys": ["k"]},
}


@pytest.mark.parametrize("case", list(DATAFRAME_CASES))
def test_a_dataframe_collected_into_the_driver_stages_what_its_executors_stage(
    spark, postgres_server, pg_schema, from_driver, case: str
) -> None:
    """The same DataFrame (a stateful operator's output, its row count known to the step) into two sinks, over
    a first load and a load into the table: one collects it into the driver and ``COPY``s it from there, its twin
    (``driver_bytes=1``: Spark estimates it larger) has the executors ``COPY`` it. Read back with psycopg, tables
    and dead letters are equal, and so are the staged counts."""
    options: dict[str, Any] = dict(DATAFRAME_CASES[case])
    unique = case.endswith("unique keys")
    node = _Keyed("src") if unique else Source("src")
    storage = JobStorage.for_job(f"{tempfile.gettempdir()}/pg-collected-jobs", "job")
    sinks = {
        path: PostgresTableSink(
            path, node, "pg_test", f"{pg_schema}.{path}", dead_letter_table=f"dead_{path}", max_refused_fraction=1.0,
            driver_bytes=1 if path == "executors" else 1 << 30, **options,
        )
        for path in ("driver", "executors")
    }  # fmt: skip
    staged: dict[str, list[tuple[int, int]]] = {path: [] for path in sinks}
    checkpoints = (1, 2) if "upsert" in case else (1,)  # a first load, then (upsert) rows into the table
    for checkpoint_id in checkpoints:
        df = _messy(spark, checkpoint_id, unique)
        for path, sink in sinks.items():
            ctx = step_context(spark, storage, checkpoint_id)
            ctx.output_rows["src"] = 120
            sink.prepare(ctx)
            [committable] = sink.stage(ctx, df)
            staged[path].append((committable["rows"], committable["dead_letters"]))
            sink.commit(checkpoint_id, [committable])
        assert from_driver == ["driver"], (checkpoint_id, from_driver)
        from_driver.clear()
    assert staged["driver"] == staged["executors"], staged
    winners = 46 if case == "upsert, repeated keys" else 120  # its keys, or its rows
    assert all(rows + refused == winners and refused for rows, refused in staged["driver"]), staged
    tables = {}
    with postgres_server.connect() as db:
        for path in sinks:
            rows = db.execute(f"SELECT * FROM {pg_schema}.{path}").fetchall()
            dead = db.execute(
                f"SELECT checkpoint_id, column_name, key, record, error FROM {pg_schema}.dead_{path}"
            ).fetchall()
            tables[path] = (Counter(rows), Counter(dead))
    assert tables["driver"] == tables["executors"]
    if unique:  # an input said to hold each key once repeats one: refused, and no retried Spark task is blamed
        df = _messy(spark, 3, unique=False)
        for sink in sinks.values():
            ctx = step_context(spark, storage, 3)
            ctx.output_rows["src"] = 120
            with pytest.raises(SinkValueError, match="staged twice"):
                sink.stage(ctx, df)
        assert from_driver == ["driver"], from_driver


def test_an_append_of_an_operator_merged_on_the_driver_is_staged_from_there_with_no_dataframe(
    spark, postgres_server, pg_schema, tmp_path, from_driver, monkeypatch
) -> None:
    """A keyed aggregate merged on the driver feeding a PostgreSQL append: the sink ``COPY``s the merged rows the
    driver holds, as it does a source's rows read there, and no Arrow rows reach the JVM (``createDataFrame``, as
    tests/spark/test_step_jobs.py checks for an upsert). Over a first checkpoint and a merge (null key parts, keys
    repeated across checkpoints) its table, read with psycopg, equals that of the same pipeline merged by Spark
    (``driver_merge_rows=0``) and staged by its executors (``driver_rows=0``)."""
    sent: list[int] = []  # rows of every Arrow table handed to the JVM
    create = spark.createDataFrame

    def counted(data: object, *args: object, **kwargs: object) -> object:
        sent.extend([data.num_rows] if isinstance(data, pa.Table) else [])
        return create(data, *args, **kwargs)

    monkeypatch.setattr(spark, "createDataFrame", counted)

    def declare(base: Path) -> None:
        events = FileSource("events", f"{base}/landing", "parquet", SCHEMA)
        totals = KeyedAggregate("totals", events, keys=KEYS, aggs={"n": "count", "top": "max(v)"})
        driver_rows = 10**6 if base.name == "driver" else 0  # the twin: its executors COPY the rows
        PostgresTableSink("appended", totals, "pg_test", f"{pg_schema}.{base.name}", driver_rows=driver_rows)

    jobs = {
        path: make_job(spark, tmp_path / path, declare, inline_state_threshold=0, driver_merge_rows=m)
        for path, m in [("driver", 10**6), ("spark", 0)]
    }
    columns = [*KEYS, "n", "top", "_checkpoint_id"]
    for checkpoint_id, n in enumerate([60, 40], start=1):
        for path, job in jobs.items():
            _land(tmp_path / path / "landing", n, seed=checkpoint_id)
            from_driver.clear()
            completed = job.checkpoint()
            merged = any(m.get("state_merged_on_driver") for m in completed.stats["steps"].values())
            assert merged is (path == "driver") and (from_driver == ["appended"]) is merged, (checkpoint_id, path)
        assert not sent, (checkpoint_id, sent)
        tables = {path: _select(postgres_server, f"{pg_schema}.{path}", columns) for path in jobs}
        assert tables["driver"] == tables["spark"] and len(tables["driver"]) > 0, checkpoint_id
