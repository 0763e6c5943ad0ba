"""The Spark side against independent ground truth computed with pandas / pyarrow."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, MalformedInputError
from airflow_provider_checkpoint.state.keygroups import range_for_index
from airflow_provider_checkpoint.state.spark_backend import key_group, read_state, write_state
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.helpers import step_context

pytestmark = pytest.mark.spark


def _events(n: int, seed: int) -> pd.DataFrame:
    import random

    rng = random.Random(seed)
    return pd.DataFrame(
        {
            "user": [f"u{rng.randint(0, 40)}" for _ in range(n)],
            "page": [f"/p{rng.randint(0, 12)}" for _ in range(n)],
            "ts": [seed * 10_000 + i for i in range(n)],
        }
    )


def _sorted(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return df.sort_values(by).reset_index(drop=True)[sorted(df.columns)]


def test_python_pyspark_matches_jvm(spark):
    import pyspark

    assert spark.version == pyspark.__version__
    assert importlib.metadata.version("pyspark") == importlib.metadata.version("pyspark-client") == spark.version


def test_state_round_trip_with_checksums(spark, tmp_path):
    storage = JobStorage.for_job(str(tmp_path), "job")
    truth = pd.DataFrame({"k": [f"key{i}" for i in range(500)], "v": list(range(500))})
    snapshot = write_state(storage, "chk-1/s/attempt-1/state/op", spark.createDataFrame(truth), ("k",), 128, 4)

    assert snapshot.rows == 500
    ranges = sorted(h.key_groups for h in snapshot.handles if h.key_groups)
    covered = [kg for lo, hi in ranges for kg in range(lo, hi + 1)]
    assert len(covered) == len(set(covered)) and set(covered) <= set(range(128))
    assert {h.key_groups for h in snapshot.handles} <= {range_for_index(128, 4, i) for i in range(4)}
    for h in snapshot.handles:
        assert h.checksum.startswith("sha256:") and h.size > 0

    back = read_state(spark, storage, snapshot).toPandas()
    pd.testing.assert_frame_equal(_sorted(back, ["k"]), _sorted(truth, ["k"]), check_dtype=False)

    # each file holds only keys of its key-group range
    for h in snapshot.handles:
        rows = spark.read.parquet(storage.url(h.path)).select(key_group(("k",), 128).alias("kg")).collect()
        assert all(h.key_groups[0] <= r.kg <= h.key_groups[1] for r in rows)

    victim = Path(storage.path(snapshot.handles[0].path))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointStorageError, match="checksum mismatch.*" + snapshot.handles[0].path.split("/")[-1]):
        read_state(spark, storage, snapshot)


@pytest.mark.parametrize(("write_parallelism", "read_partitions"), [(5, 3), (1, 7), (16, 2)])
def test_rescaling_state_gives_same_result(spark, tmp_path, write_parallelism, read_partitions):
    storage = JobStorage.for_job(str(tmp_path), "job")
    first, second = _events(400, 1), _events(300, 2)
    op = KeyedAggregate(
        uid="views",
        input=FileSource("src", str(tmp_path), "json", "x STRING"),
        keys=["page"],
        aggs={"views": "count", "first": "min(ts)", "last": "max(ts)"},
    )
    batch1 = spark.createDataFrame(first)
    state1, _ = op.apply(batch1, op.initial_state(spark, {op.inputs[0].uid: batch1}))
    snapshot = write_state(storage, "chk-1/s/attempt-1/state/views", state1, ("page",), 128, write_parallelism)

    restored = read_state(spark, storage, snapshot).repartition(read_partitions)
    assert restored.rdd.getNumPartitions() == read_partitions
    state2, output = op.apply(spark.createDataFrame(second), restored)

    both = pd.concat([first, second])
    truth = both.groupby("page").agg(views=("ts", "size"), first=("ts", "min"), last=("ts", "max")).reset_index()
    pd.testing.assert_frame_equal(_sorted(state2.toPandas(), ["page"]), _sorted(truth, ["page"]), check_dtype=False)
    changed = truth[truth.page.isin(second.page)]
    pd.testing.assert_frame_equal(_sorted(output.toPandas(), ["page"]), _sorted(changed, ["page"]), check_dtype=False)


def _read_table(path) -> pd.DataFrame:
    return ds.dataset(str(path), format="parquet").to_table().to_pandas()


def test_upsert_sink_never_exposes_staged_data(spark, tmp_path):
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    table = tmp_path / "table"
    sink = ParquetTableSink("t", FileSource("src", str(tmp_path), "json", "x STRING"), str(table), "upsert", ["k"], 4)
    v1 = pd.DataFrame({"k": [f"k{i}" for i in range(50)], "v": [1] * 50})
    committables = sink.stage(step_context(spark, storage, 1), spark.createDataFrame(v1))
    assert not table.exists() or not [p for p in table.iterdir() if not p.name.startswith("_")]
    sink.commit(1, committables)
    pd.testing.assert_frame_equal(_sorted(_read_table(table), ["k"]), _sorted(v1, ["k"]), check_dtype=False)

    v2 = pd.DataFrame({"k": [f"k{i}" for i in range(40, 60)], "v": [2] * 20})
    committables2 = sink.stage(step_context(spark, storage, 2, attempt=3), spark.createDataFrame(v2))
    assert (table / "_staging").exists()
    for reader in (lambda: _read_table(table), lambda: spark.read.parquet(str(table)).toPandas()):
        pd.testing.assert_frame_equal(_sorted(reader(), ["k"]), _sorted(v1, ["k"]), check_dtype=False)

    sink.commit(2, committables2)
    sink.commit(2, committables2)  # idempotent
    truth = pd.concat([v1[~v1.k.isin(v2.k)], v2])
    for reader in (lambda: _read_table(table), lambda: spark.read.parquet(str(table)).toPandas()):
        got = reader()
        assert got.k.is_unique
        pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(truth, ["k"]), check_dtype=False)
    assert not (table / "_staging" / "chk-2").exists()
    assert json.loads((table / "_commits" / "0000000002.json").read_text())["checkpoint_id"] == 2


def test_upsert_merges_alike_in_driver_and_in_spark(spark, tmp_path):
    """Checkpoints alternate between the Spark merge and the driver (pyarrow) merge of one table;
    null keys are keys, and Spark reads the mixed files back with the input's column types."""
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    table = tmp_path / "table"
    source = FileSource("src", str(tmp_path), "json", "x STRING")
    schema = "k STRING, g INT, v LONG, at TIMESTAMP"
    truth: pd.DataFrame | None = None
    for checkpoint_id, driver_rows in enumerate([0, 1000, 0, 1000, 1000], start=1):
        sink = ParquetTableSink("t", source, str(table), "upsert", ["k", "g"], 4, driver_merge_rows=driver_rows)
        rng = pd.Series(range(30)).sample(12, random_state=checkpoint_id).tolist()
        batch = pd.DataFrame(
            {
                "k": [None if i % 7 == 0 else f"k{i % 10}" for i in rng],
                "g": [None if i % 5 == 0 else i % 3 for i in rng],
                "v": [checkpoint_id * 100 + i for i in rng],
                "at": pd.to_datetime([1_700_000_000 + checkpoint_id * 60 + i for i in rng], unit="s"),
            }
        ).drop_duplicates(subset=["k", "g"])
        df = spark.createDataFrame(batch.astype(object).where(batch.notna(), None), schema)
        sink.commit(checkpoint_id, sink.stage(step_context(spark, storage, checkpoint_id), df))

        key = lambda d: d["k"].fillna("<null>") + "|" + d["g"].astype(object).fillna("<null>").astype(str)  # noqa: E731
        truth = batch if truth is None else pd.concat([truth[~key(truth).isin(set(key(batch)))], batch])
        read = spark.read.parquet(str(table))
        assert [(f.name, f.dataType) for f in read.schema.fields] == [(f.name, f.dataType) for f in df.schema.fields]
        for got in (read.toPandas(), _read_table(table)):
            got = got.assign(at=pd.to_datetime(got["at"]).dt.tz_localize(None), g=got["g"].astype("Int64"))
            want = truth.assign(g=truth["g"].astype("Int64"), v=truth["v"].astype("int64"))
            assert len(got) == len(want)
            pd.testing.assert_frame_equal(_sorted(got, ["k", "g"]), _sorted(want, ["k", "g"]), check_dtype=False)


@pytest.mark.parametrize("legacy", [0, 1])
def test_upsert_of_bucket_files_of_two_schemas_falls_back_to_spark_and_keeps_every_column(spark, tmp_path, legacy):
    """A table whose bucket files differ in columns (bucket ``legacy``'s lacks ``w``: written before the step
    checked the input's columns, here by hand). The driver merges the buckets before it, then that bucket's
    file sends the whole upsert to Spark: what the driver staged is dropped, no row is counted twice, and
    Spark reads the old files with the input's columns: the kept rows of every file keep their ``w``."""
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    table = tmp_path / "table"
    sink = ParquetTableSink("t", FileSource("src", str(tmp_path), "json", "x STRING"), str(table), "upsert", ["k"], 4)
    v1 = pd.DataFrame({"k": [f"k{i}" for i in range(40)], "v": range(40), "w": "old"})
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(v1)))
    old_file = table / f"part-b{legacy:05d}.parquet"
    pq.write_table(pq.read_table(old_file).drop_columns(["w"]).replace_schema_metadata(None), old_file)
    buckets = spark.createDataFrame(v1).select("k", F.pmod(F.xxhash64("k"), F.lit(4)).alias("b")).toPandas()
    truth = v1.assign(w=[None if b == legacy else "old" for b in buckets.b])
    v2 = v1[v1.index % 2 == 0].assign(v=lambda d: d.v + 1000, w="again")  # half the keys of every bucket
    ctx = step_context(spark, storage, 2)
    sink.commit(2, sink.stage(ctx, spark.createDataFrame(v2)))
    assert ctx.metrics["sink_rows"] == len(v2)
    truth = pd.concat([truth[~truth.k.isin(v2.k)], v2])
    assert sorted(p.name for p in table.glob("part-*")) == [f"part-b{b:05d}.parquet" for b in range(4)]
    got = spark.read.option("mergeSchema", "true").parquet(str(table)).toPandas()
    pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(truth, ["k"]), check_dtype=False)
    assert not (table / "_staging" / "chk-2").exists()


def test_append_sink_abort_discards_and_commit_once(spark, tmp_path):
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    table = tmp_path / "events"
    sink = ParquetTableSink("a", FileSource("src", str(tmp_path), "json", "x STRING"), str(table), "append")
    rows = _events(100, 3)
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(rows)))
    sink.stage(step_context(spark, storage, 2), spark.createDataFrame(_events(10, 4)))
    sink.abort(2)
    assert not (table / "_staging" / "chk-2").exists()
    committed = sink.stage(step_context(spark, storage, 3), spark.createDataFrame(rows.head(7)))
    sink.commit(3, committed)
    sink.commit(3, committed)
    got = _read_table(table)
    truth = pd.concat([rows, rows.head(7)])
    pd.testing.assert_frame_equal(_sorted(got, ["ts", "user"]), _sorted(truth, ["ts", "user"]), check_dtype=False)


def test_malformed_json_names_file_and_line(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "good.json").write_text('{"user": "a", "page": "/x", "ts": 1}\n')
    (landing / "bad.json").write_text(
        '{"user": "a", "page": "/x", "ts": 1}\n{"user": "b", "page": "/y", "ts": 2}\n{"user": "c", "page": \n'
    )
    (landing / ".inflight.json").write_text("not json at all")
    source = FileSource("events", str(landing), "json", "user STRING, page STRING, ts LONG")
    barrier = source.barrier_position(None)
    assert set(barrier["files"]) == {"good.json", "bad.json"}
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    with pytest.raises(MalformedInputError, match=r"bad\.json line 3"):
        source.read(step_context(spark, storage, 1), None, barrier)

    (landing / "typed.json").write_text('{"user": "d", "page": "/z", "ts": "yesterday"}\n')
    only_typed = {"files": {"typed.json": (landing / "typed.json").stat().st_size}}
    with pytest.raises(MalformedInputError, match=r"typed\.json line 1"):
        source.read(step_context(spark, storage, 1), None, only_typed)


@pytest.mark.parametrize(
    ("state_rows", "shuffle_merge_rows"),
    [(0, 250_000), (10**9, 250_000), (4, 1)],
    ids=["one-aggregation", "semi-join", "big-increment"],
)
def test_keyed_aggregate_merges_alike_with_any_plan(spark, monkeypatch, state_rows, shuffle_merge_rows):
    """Every plan of ``KeyedAggregate.changes`` (one aggregation of input and state; a semi-join
    of a large state with the input's keys; one aggregation of a large state with the input's
    per-key aggregates when they cover a big share of it) and the full-state ``apply`` give
    pandas' aggregates over all input; null keys are keys, null values are skipped."""
    from airflow_provider_checkpoint.core.model import Barrier, CheckpointType
    from airflow_provider_checkpoint.dataflow import stateful

    monkeypatch.setattr(stateful, "SHUFFLE_MERGE_ROWS", shuffle_merge_rows)

    schema = "user STRING, amount LONG, ts LONG"
    NULL = "<null key>"  # stands for the null key on both sides
    first = [("a", 1, 10), ("b", None, 11), (None, 5, 12), ("c", 2, 13), ("a", 3, 14)]
    second = [("a", 4, 20), (None, None, 21), ("d", None, 22), ("d", 6, 5), ("b", 7, 23)]
    agg = KeyedAggregate(
        "agg",
        FileSource("src", "/unused", "json", schema),
        keys=["user"],
        aggs={"n": "count", "seen": "count(amount)", "total": "sum(amount)", "lo": "min(ts)", "hi": "max(ts)"},
    )

    def barrier(n: int) -> Barrier:
        return Barrier(n, 0.0, CheckpointType.CHECKPOINT, {})

    def frame(df) -> pd.DataFrame:
        got = df.toPandas()
        return got.assign(user=got.user.fillna(NULL)).set_index("user").sort_index()

    inputs = {"src": spark.createDataFrame(first, schema)}
    state, _ = agg.process(inputs, agg.initial_state(spark, inputs), barrier(1))
    batch = spark.createDataFrame(second, schema)
    changelog = frame(agg.changes({"src": batch}, state, barrier(2), state_rows))
    every_key = "__changed" in changelog  # the one-aggregation plan lists every key, the changed ones marked
    assert every_key == (state_rows < 10**9)
    new_state, output = agg.process({"src": batch}, state, barrier(2))

    everything = pd.DataFrame(first + second, columns=["user", "amount", "ts"])
    grouped = everything.assign(user=everything.user.fillna(NULL)).groupby("user")
    expected = grouped.agg(n=("ts", "size"), seen=("amount", "count"), lo=("ts", "min"), hi=("ts", "max"))
    expected["total"] = grouped["amount"].sum(min_count=1)
    expected = expected.sort_index()
    touched = expected.loc[sorted({r[0] or NULL for r in second})]
    columns = ["n", "seen", "total", "lo", "hi"]
    pd.testing.assert_frame_equal(frame(new_state)[columns], expected[columns], check_dtype=False)
    pd.testing.assert_frame_equal(frame(output)[columns], touched[columns], check_dtype=False)
    if every_key:
        pd.testing.assert_frame_equal(changelog[columns], expected[columns], check_dtype=False)
        changelog = changelog[changelog["__changed"]]
    pd.testing.assert_frame_equal(changelog[columns], touched[columns], check_dtype=False)
    assert not changelog["__deleted"].any()
    assert changelog["__new"].to_dict() == {k: k not in {r[0] or NULL for r in first} for k in touched.index}


@pytest.mark.parametrize("small", [True, False], ids=["broadcast", "shuffle"])
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("value", ["string", "double"], ids=["ranked", "hashed"])
def test_merge_takes_the_newest_delta_row_per_key(spark, small, layers, value):
    """Per key the newest delta row wins over older ones and the full version (a null value
    included), a tombstone deletes, a key deleted then written again is back, a null key is a key:
    alike whether several layers are ranked per key (a string value) or hash-aggregated (fixed-width values)."""
    import random

    from airflow_provider_checkpoint.state.spark_backend import merge

    rng = random.Random(layers)
    keys = [None, *[f"k{i}" for i in range(30)]]
    cast = str if value == "string" else float
    full = {k: (i, cast(i + 0.5)) for i, k in enumerate(keys) if rng.random() < 0.7}
    changes, want = [], dict(full)
    for seq in range(2, 2 + layers):
        for k in rng.sample(keys, 12):
            deleted = rng.random() < 0.3
            row = (None if rng.random() < 0.2 else seq * 100, None if rng.random() < 0.2 else cast(seq + 0.25))
            changes.append((k, None if deleted else row[0], None if deleted else row[1], deleted, seq))
            if deleted:
                want.pop(k, None)
            else:
                want[k] = row
    rng.shuffle(changes)
    full_df = spark.createDataFrame([(k, *v) for k, v in full.items()], f"k string, n long, s {value}")
    changes_df = spark.createDataFrame(changes, f"k string, n long, s {value}, __deleted boolean, __seq long")
    got = merge(full_df, changes_df, ["k"], small, layers).collect()
    assert sorted(((r["k"], r["n"], r["s"]) for r in got), key=str) == sorted(
        ((k, *v) for k, v in want.items()), key=str
    )
    assert [f.name for f in merge(full_df, changes_df, ["k"], small, layers).schema.fields] == ["k", "n", "s"]


def test_spark_s_own_analysis_and_parse_errors_decline_for_good_with_their_class(spark) -> None:
    """Real Spark errors (a parse error's message starts with a newline) read as one line naming their class,
    and decline for good; a path not found yet is retried."""
    from pyspark.errors import AnalysisException  # ParseException is one

    from airflow_provider_checkpoint.spark.acks import decline_for

    mistakes = {
        'ParseException [UNSUPPORTED_DATATYPE]: Unsupported data type "STRNG"': lambda: spark.createDataFrame(
            [], "user STRNG, ts LONG"
        ),
        "ParseException [PARSE_SYNTAX_ERROR]: Syntax error at or near 'SELEC'": lambda: spark.sql("SELEC 1"),
        "AnalysisException [UNRESOLVED_COLUMN.WITH_SUGGESTION]: A column": lambda: spark.range(1).select("tss"),
        "AnalysisException [PATH_NOT_FOUND]: Path does not exist": lambda: spark.read.json("/nonexistent/x"),
    }
    for start, mistake in mistakes.items():
        with pytest.raises(AnalysisException) as caught:
            mistake()
        declined = decline_for(caught.value)
        assert str(declined).startswith(start), str(declined)
        assert declined.fatal is ("PATH_NOT_FOUND" not in start)
        assert str(caught.value).strip() in declined.detail
