"""DeltaTableSink with Spark against pandas ground truth, read back by delta-rs, DuckDB and Spark."""

from __future__ import annotations

import pathlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pandas as pd
import pytest

from airflow_provider_checkpoint.connectors.delta import commit as delta_commit
from airflow_provider_checkpoint.connectors.delta import log as delta_log
from airflow_provider_checkpoint.connectors.delta import upsert as delta_upsert
from airflow_provider_checkpoint.dataflow import DeltaSource, DeltaTableSink, FileSource
from airflow_provider_checkpoint.exceptions import SinkClaimedError, SinkSchemaError
from airflow_provider_checkpoint.fileio.writes import ENGINE_CONF, ENGINES
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.helpers import delta_commits_per_checkpoint, step_context

pytestmark = pytest.mark.spark

SOURCE = FileSource("src", "/nonexistent", "json", "x STRING")
LOCAL = fsspec.filesystem("file")


def _sorted(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    return df.sort_values(by).reset_index(drop=True)[sorted(df.columns)]


def _duckdb(path: Path) -> pd.DataFrame:
    """The table through DuckDB's delta extension, loaded from the PyPI package (never downloaded)."""
    import duckdb
    import duckdb_extension_delta

    ext = pathlib.Path(duckdb_extension_delta.__file__).parent / "extensions" / f"v{duckdb.__version__}"
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    con.load_extension(str(ext / "delta.duckdb_extension"))
    return con.sql(f"SELECT * FROM delta_scan('{path}')").df()


def _delta_rs(path: Path) -> pd.DataFrame:
    """The latest version through delta-rs's ``scan()``, which applies deletion vectors."""
    import pyarrow as pa
    from deltalake import DeltaTable

    return pa.table(DeltaTable(str(path)).scan()).to_pandas()


def _readers(spark: Any, path: Path) -> dict[str, pd.DataFrame]:
    """The latest version as delta-rs, DuckDB and Spark (the version's files, DVs applied) read it; Spark
    through both file engines (the Python one counts row indexes itself, as on object stores)."""
    read = {"pyarrow": _delta_rs(path), "duckdb": _duckdb(path)}
    for engine in ENGINES:
        spark.conf.set(ENGINE_CONF, engine)
        try:
            read[f"spark ({engine})"] = DeltaSource("read", str(path)).read_version(spark).toPandas()
        finally:
            spark.conf.unset(ENGINE_CONF)
    return read


def _batch(checkpoint_id: int, n: int = 40) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "k": [f"k{(checkpoint_id * 7 + i * 3) % 50}" for i in range(n)],
            "region": [("eu", "us/west", "ap south%")[i % 3] for i in range(n)],  # escaped in directory names
            "v": [checkpoint_id * 1000 + i for i in range(n)],
        }
    )


def test_append_and_upsert_over_checkpoints_match_pandas(spark, tmp_path):

    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    appended = DeltaTableSink("events", SOURCE, str(tmp_path / "events"), partition_by=["region"])
    upserted = DeltaTableSink("latest", SOURCE, str(tmp_path / "latest"), "upsert", ["k"], buckets=4)
    all_rows: list[pd.DataFrame] = []
    latest: pd.DataFrame | None = None
    for checkpoint_id in range(1, 5):
        batch = _batch(checkpoint_id)
        changed = batch.drop_duplicates("k", keep="last")
        for sink, df in ((appended, batch), (upserted, changed)):
            ctx = step_context(spark, storage, checkpoint_id)
            sink.commit(checkpoint_id, sink.stage(ctx, spark.createDataFrame(df)))
        all_rows.append(batch)
        latest = changed if latest is None else pd.concat([latest[~latest.k.isin(changed.k)], changed])
        for name, got in _readers(spark, tmp_path / "events").items():
            pd.testing.assert_frame_equal(
                _sorted(got, ["v"]), _sorted(pd.concat(all_rows), ["v"]), check_dtype=False, obj=name
            )
        for name, got in _readers(spark, tmp_path / "latest").items():
            assert got.k.is_unique, name
            pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(latest, ["k"]), check_dtype=False, obj=name)
        assert upserted.describe_commit(checkpoint_id) == {"delta_version": checkpoint_id}  # version 0: the create
        for path, rows in ((tmp_path / "events", sum(map(len, all_rows))), (tmp_path / "latest", len(latest))):
            files = delta_log.snapshot(LOCAL, str(path), path.name).values()
            live = sum(
                (f.num_records or 0) - (f.deletion_vector.cardinality if f.deletion_vector else 0) for f in files
            )
            assert live == rows, f"{path.name}: numRecords less the DVs' cardinalities must be the table's rows"
    for path in (tmp_path / "events", tmp_path / "latest"):
        assert delta_commits_per_checkpoint(path) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert appended.audit() == [] and upserted.audit() == []
    appended.abort(4)  # an abort of a committed checkpoint (a late one) deletes none of its files
    got = _readers(spark, tmp_path / "events")["pyarrow"]
    pd.testing.assert_frame_equal(_sorted(got, ["v"]), _sorted(pd.concat(all_rows), ["v"]), check_dtype=False)


def test_upsert_writes_the_changed_rows_and_a_deletion_vector(spark, tmp_path):
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    sink = DeltaTableSink("latest", SOURCE, str(tmp_path / "t"), "upsert", ["k"], buckets=16)
    at = pd.to_datetime([1_700_000_000 + i for i in range(2000)], unit="s")  # a timestamp column round-trips
    base = pd.DataFrame({"k": [f"k{i}" for i in range(2000)], "v": range(2000), "at": at})
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(base)))
    one_key = pd.DataFrame({"k": ["k7"], "v": [-1], "at": pd.to_datetime([0], unit="s")})
    committables = sink.stage(step_context(spark, storage, 2), spark.createDataFrame(one_key))
    (staged,) = committables
    assert [len(staged["adds"]), len(staged["removes"]), len(staged["deletes"])] == [1, 0, 1]
    assert staged["adds"][0]["size"] < 5000 and staged["deletes"][0]["new"]["cardinality"] == 1  # not a bucket
    sink.commit(2, committables)
    truth = pd.concat([base[base.k != "k7"], one_key])
    for name, got in _readers(spark, tmp_path / "t").items():
        got["at"] = pd.to_datetime(got["at"], utc=True).dt.tz_localize(None)
        pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(truth, ["k"]), check_dtype=False, obj=name)
    assert sink.audit() == []


def test_delete_when_deletes_keys_by_deletion_vector_and_the_change_feed_reads_deletes(spark, tmp_path):
    """A delete removes its key's live row (a DV, no row added; the column not written); a delete then a value
    of one key in a checkpoint leaves the value; deleting a missing key changes nothing. Readers we did not
    write agree, and our DeltaSource's change feed reads the deletes as ``delete`` rows."""
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    sink = DeltaTableSink("latest", SOURCE, str(tmp_path / "t"), "upsert", ["k"], buckets=4, delete_when="gone")
    base = pd.DataFrame({"k": [f"k{i}" for i in range(400)], "v": range(400), "gone": False})
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(base)))
    changes = pd.DataFrame(
        {"k": ["k7", "k8", "k9", "k9", "nope"], "v": [-1, -1, -1, 900, -1], "gone": [True, True, True, False, True]}
    )
    committables = sink.stage(step_context(spark, storage, 2), spark.createDataFrame(changes))
    (staged,) = committables
    assert [len(staged["adds"]), len(staged["removes"])] == [1, 0] and staged["adds"][0]["num_records"] == 1
    assert sum(d["new"]["cardinality"] for d in staged["deletes"]) == 3  # k7, k8 and k9's old row
    sink.commit(2, committables)
    truth = pd.concat([base[~base.k.isin(["k7", "k8", "k9"])], pd.DataFrame({"k": ["k9"], "v": [900]})])
    truth = truth.drop(columns="gone")
    for name, got in _readers(spark, tmp_path / "t").items():
        pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(truth, ["k"]), check_dtype=False, obj=name)
    only_deletes = pd.DataFrame({"k": ["k1"], "v": [0], "gone": [True]})  # driver_merge_rows=0: Spark writes
    spark_sink = DeltaTableSink("latest", SOURCE, str(tmp_path / "t"), "upsert", ["k"], buckets=4, driver_merge_rows=0,
                                delete_when="gone")  # fmt: skip
    committables = spark_sink.stage(step_context(spark, storage, 3), spark.createDataFrame(only_deletes))
    assert committables[0]["adds"] == []
    spark_sink.commit(3, committables)
    source = DeltaSource("feed", str(tmp_path / "t"), change_data_feed=True)
    feed = source.read(step_context(spark, storage, 4), {**source.barrier_position(None), "version": 1},
                       source.barrier_position(None)).toPandas()  # fmt: skip
    got = sorted(zip(feed["_change_type"], feed["k"], feed["v"], feed["_commit_version"], strict=True))
    assert got == [
        ("delete", "k1", 1, 3),
        ("delete", "k7", 7, 2),
        ("delete", "k8", 8, 2),
        ("delete", "k9", 9, 2),
        ("insert", "k9", 900, 2),
    ]
    assert sink.audit() == []


def test_soft_deletes_refuse_a_clashing_or_non_boolean_column_before_anything_is_staged(spark, tmp_path):
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    sink = DeltaTableSink("soft", SOURCE, str(tmp_path / "t"), "upsert", ["k"], delete_when="gone", deletes="soft")
    clash = spark.createDataFrame(pd.DataFrame({"k": ["a"], "gone": [True], "__deleted": [False]}))
    with pytest.raises(SinkSchemaError, match="deleted_column '__deleted' is already an input column; name another"):
        sink.stage(step_context(spark, storage, 1), clash)
    with pytest.raises(SinkSchemaError, match="delete_when column 'gone' must be boolean, the input has string"):
        sink.check_input(spark.createDataFrame(pd.DataFrame({"k": ["a"], "gone": ["yes"]})))
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("inline", [True, False], ids=["inline-dvs", "dv-files"])
def test_upsert_compacts_a_file_once_half_its_rows_are_deleted(spark, tmp_path, monkeypatch, inline):
    monkeypatch.setattr(delta_commit, "CHECKPOINT_INTERVAL", 2)  # the log replay starts from a log checkpoint
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "t"
    sink = DeltaTableSink("latest", SOURCE, str(path), "upsert", ["k"], buckets=1, inline_deletion_vectors=inline)
    at = pd.to_datetime([1_700_000_000 + i for i in range(100)], unit="s")  # timestamps survive compaction
    truth = pd.DataFrame({"k": [f"k{i}" for i in range(100)], "v": range(100), "at": at})
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(truth)))
    kinds = []
    for checkpoint_id, keys in ((2, range(0, 30)), (3, range(20, 60)), (4, range(0, 5))):
        changed = pd.DataFrame({"k": [f"k{i}" for i in keys], "v": [-checkpoint_id] * len(keys), "at": at[0]})
        (staged,) = sink.stage(step_context(spark, storage, checkpoint_id), spark.createDataFrame(changed))
        kinds.append((len(staged["removes"]), len(staged["deletes"])))
        sink.commit(checkpoint_id, [staged])
        truth = pd.concat([truth[~truth.k.isin(changed.k)], changed])
        for name, got in _readers(spark, path).items():
            got["at"] = pd.to_datetime(got["at"], utc=True).dt.tz_localize(None)
            pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(truth, ["k"]), check_dtype=False, obj=name)
    # 2: 30 of the bucket file's 100 rows deleted (a DV); 3: the bucket file reaches 60 of 100 (rewritten),
    # checkpoint 2's file 10 of 30 (a DV); 4: checkpoint 2's file reaches 15 of 30 (rewritten)
    assert kinds == [(0, 1), (1, 1), (1, 0)]
    assert (path / "_delta_log" / f"{4:020d}.checkpoint.parquet").exists()
    assert sink.audit() == []
    changed = spark.createDataFrame(pd.DataFrame({"k": ["k70"], "v": [-5], "at": at[:1]}))
    (staged,) = sink.stage(step_context(spark, storage, 5), changed)  # an attempt that never commits
    dv_files = [p for p in (path / "chk-5").rglob("deletion_vector_*.bin")]
    assert len(dv_files) == (0 if inline else 1) and len(staged["deletes"]) == 1
    assert len(sink.audit()) == 1 + len(dv_files)  # its update file and DV file are orphans
    sink.abort(5)
    assert sink.audit() == [] and not (path / "chk-5").exists()
    for name, got in _readers(spark, path).items():
        got["at"] = pd.to_datetime(got["at"], utc=True).dt.tz_localize(None)
        pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(truth, ["k"]), check_dtype=False, obj=name)


def test_upsert_merges_update_files_past_the_bound(spark, tmp_path, monkeypatch):
    """Every checkpoint adds an update file; past ``MAX_UPDATE_FILES`` (2 here) one checkpoint merges them
    into one with their live rows: the table keeps at most 3 (2 and its own), every reader reads the model."""
    import random

    monkeypatch.setattr(delta_upsert, "MAX_UPDATE_FILES", 2)
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "t"
    sink = DeltaTableSink("latest", SOURCE, str(path), "upsert", ["k"], buckets=2)
    truth = pd.DataFrame({"k": [f"k{i}" for i in range(60)], "v": range(60)})
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(truth)))
    rng, merges = random.Random(7), 0
    for checkpoint_id in range(2, 12):
        keys = rng.sample(range(80), rng.randint(1, 25))  # new keys too
        changed = pd.DataFrame({"k": [f"k{i}" for i in keys], "v": [checkpoint_id * 100 + i for i in keys]})
        (staged,) = sink.stage(step_context(spark, storage, checkpoint_id), spark.createDataFrame(changed))
        merges += any("part-u" in r["path"] for r in staged["removes"])
        sink.commit(checkpoint_id, [staged])
        truth = pd.concat([truth[~truth.k.isin(changed.k)], changed])
        live = delta_log.snapshot(fsspec.filesystem("file"), str(path), str(path))
        assert sum("part-u" in p for p in live) <= 3, sorted(live)
        for name, got in _readers(spark, path).items():
            pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(truth, ["k"]), check_dtype=False, obj=name)
    assert merges >= 2 and sink.audit() == []


def test_commit_is_idempotent_and_other_attempts_are_deleted(spark, tmp_path):
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "events"
    sink = DeltaTableSink("events", SOURCE, str(path))
    first = sink.stage(step_context(spark, storage, 1, attempt=1), spark.createDataFrame(_batch(1)))
    second = sink.stage(step_context(spark, storage, 1, attempt=2), spark.createDataFrame(_batch(1)))
    assert len(sink.audit()) == len(first[0]["adds"]) + len(second[0]["adds"])  # staged, nothing committed
    sink.commit(1, second)
    sink.commit(1, second)  # finalize retry
    sink.commit(1, first)  # recovery with another attempt's committables: already committed
    assert delta_commits_per_checkpoint(path) == {1: 1}
    assert not any((path / a["path"]).exists() for a in first[0]["adds"])
    assert sink.audit() == []
    got = _readers(spark, path)["pyarrow"]
    pd.testing.assert_frame_equal(_sorted(got, ["v"]), _sorted(_batch(1), ["v"]), check_dtype=False)


def test_abort_deletes_the_checkpoints_files(spark, tmp_path):
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "events"
    sink = DeltaTableSink("events", SOURCE, str(path))
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(_batch(1))))
    staged = sink.stage(step_context(spark, storage, 2), spark.createDataFrame(_batch(2)))
    assert all((path / a["path"]).exists() for a in staged[0]["adds"]) and sink.audit()
    sink.abort(2)
    assert not (path / "chk-2").exists() and sink.audit() == []
    assert delta_commits_per_checkpoint(path) == {1: 1}


def test_restore_returns_the_table_to_the_checkpoints_version(spark, tmp_path):
    from deltalake import DeltaTable

    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "latest"
    sink = DeltaTableSink("latest", SOURCE, str(path), "upsert", ["k"], buckets=4)
    states = {}
    for checkpoint_id in (1, 2, 3):
        batch = _batch(checkpoint_id).drop_duplicates("k", keep="last")
        sink.commit(
            checkpoint_id, sink.stage(step_context(spark, storage, checkpoint_id), spark.createDataFrame(batch))
        )
        states[checkpoint_id] = _delta_rs(path)
    sink.rollback(1)
    table = DeltaTable(str(path))
    assert table.history(1)[0]["operation"] == "RESTORE" and table.version() == 4
    for name, got in _readers(spark, path).items():
        pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(states[1], ["k"]), check_dtype=False, obj=name)
    sink.rollback(1)  # the trigger's recovery repeats it: no second commit
    sink.commit(1, [])  # and re-commits the restored checkpoint: already in the log
    assert DeltaTable(str(path)).version() == 4
    batch = _batch(4).drop_duplicates("k", keep="last")  # replay continues from the restored table
    sink.commit(4, sink.stage(step_context(spark, storage, 4), spark.createDataFrame(batch)))
    truth = pd.concat([states[1][~states[1].k.isin(batch.k)], batch])
    for name, got in _readers(spark, path).items():
        pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(truth, ["k"]), check_dtype=False, obj=name)
    assert delta_commits_per_checkpoint(path) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert sink.audit() == []


def test_a_reader_never_sees_a_partial_checkpoint(spark, tmp_path):
    from deltalake import DeltaTable

    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "events"
    sink = DeltaTableSink("events", SOURCE, str(path))
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(_batch(1)).repartition(3)))
    seen: list[Counter[int]] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(Counter(v // 1000 for v in DeltaTable(str(path)).to_pyarrow_table().column("v").to_pylist()))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for checkpoint_id in range(2, 7):
            staged = sink.stage(
                step_context(spark, storage, checkpoint_id), spark.createDataFrame(_batch(checkpoint_id)).repartition(3)
            )
            assert len(staged[0]["adds"]) == 3  # several files per checkpoint
            sink.commit(checkpoint_id, staged)
    finally:
        done.set()
        reader.join()
    assert seen
    for counts in seen:  # every checkpoint whole or absent, and a prefix of the checkpoints
        assert set(counts.values()) == {40}
        assert sorted(counts) == list(range(1, len(counts) + 1))


def test_refusals_before_anything_commits(spark, tmp_path):
    from deltalake import DeltaTable

    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "data.csv").write_text("a\n1\n")
    with pytest.raises(SinkSchemaError, match="not a Delta table"):
        DeltaTableSink("s", SOURCE, str(plain)).stage(step_context(spark, storage, 1), spark.createDataFrame(_batch(1)))
    assert sorted(p.name for p in plain.iterdir()) == ["data.csv"]

    path = tmp_path / "events"
    sink = DeltaTableSink("events", SOURCE, str(path))
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(_batch(1))))
    other = JobStorage.for_job(str(tmp_path / "chk"), "other-job")
    with pytest.raises(SinkClaimedError, match="belongs to"):
        sink.stage(step_context(spark, other, 2), spark.createDataFrame(_batch(2)))
    cases = {
        "missing column\\(s\\) \\['region'\\]": _batch(2).drop(columns=["region"]),
        "retyped column\\(s\\) v \\(long in the table, string in the input\\)": _batch(2).astype({"v": str}),
        "added column\\(s\\) \\['w'\\]": _batch(2).assign(w=1.5),
    }
    for message, df in cases.items():
        with pytest.raises(SinkSchemaError, match=message):
            sink.stage(step_context(spark, storage, 2), spark.createDataFrame(df))
    assert DeltaTable(str(path)).version() == 1 and not (path / "chk-2").exists()


def test_commits_alongside_another_writer_on_another_partition(spark, tmp_path):
    """Another writer appends to its own partition in a loop: Delta's conflict rules let both commit
    (delta-rs retries ours on a newer version), and every row of both is in the table once."""
    from deltalake import DeltaTable, write_deltalake

    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "events"
    sink = DeltaTableSink("events", SOURCE, str(path), partition_by=["region"])
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(_batch(1))))
    theirs: list[int] = []
    done = threading.Event()

    def other_writer() -> None:
        while not done.is_set() or len(theirs) < 3:
            row = pd.DataFrame({"k": ["x"], "region": ["other"], "v": [-len(theirs) - 1]})
            write_deltalake(str(path), row, mode="append")
            theirs.append(-len(theirs) - 1)

    writer = threading.Thread(target=other_writer)
    writer.start()
    try:
        for checkpoint_id in range(2, 5):
            sink.commit(
                checkpoint_id,
                sink.stage(step_context(spark, storage, checkpoint_id), spark.createDataFrame(_batch(checkpoint_id))),
            )
    finally:
        done.set()
        writer.join()
    got = DeltaTable(str(path)).to_pyarrow_table().to_pandas()
    truth = pd.concat([_batch(c) for c in range(1, 5)])
    pd.testing.assert_frame_equal(_sorted(got[got.region != "other"], ["v"]), _sorted(truth, ["v"]), check_dtype=False)
    assert sorted(got[got.region == "other"].v) == sorted(theirs)
    assert delta_commits_per_checkpoint(path) == {1: 1, 2: 1, 3: 1, 4: 1}


def _same_rows(got: pd.DataFrame, model: dict[tuple[Any, ...], int], keys: list[str], where: str) -> None:
    """``got`` holds exactly the model's rows, each key once (keys compared as Python values: None stays None)."""
    seen = [(tuple(None if pd.isna(r[k]) else r[k] for k in keys), int(r["v"])) for r in got.to_dict("records")]
    assert len(seen) == len(dict(seen)), f"{where}: a key appears twice"
    missing = {k: v for k, v in model.items() if k not in dict(seen)}
    assert dict(seen) == model, f"{where}: {len(missing)} of {len(model)} keys missing, e.g. {list(missing)[:3]}"


@pytest.mark.parametrize(
    ("keys", "rows"),
    [
        # a compound key holding a null and an empty string, changed in every checkpoint
        (
            ["a", "b"],
            lambda c: (
                [(None, "", c), ("x", None, c), ("", "", c)]
                if c > 1
                else [(None, "", 0), ("x", None, 0), ("", "", 0), *((f"a{i}", str(i), 0) for i in range(12))]
            ),
        ),
        # an id re-sent in a later update file, alone in its checkpoint
        (["id"], lambda c: [(i, c) for i in range(20)] if c == 1 else [(c % 2, c)] if c < 5 else [(1, c), (7, c)]),
    ],
)
def test_upsert_of_a_key_changed_again_and_again_keeps_every_other_row(spark, tmp_path, keys, rows):
    """Issue #30 defect 1: a key changed three times or more, its older rows already deleted by their
    files' DVs, must not make a checkpoint drop those files (delta-rs, DuckDB and Spark read the table as
    a plain dict model of the upserts)."""
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "t"
    sink = DeltaTableSink("latest", SOURCE, str(path), "upsert", keys, buckets=2)
    schema = ", ".join(f"{k} {'STRING' if k != 'id' else 'LONG'}" for k in keys) + ", v LONG"
    model: dict[tuple[Any, ...], int] = {}
    models = {}
    # checkpoints 7 to 9 replay 4 to 6 after a restore to checkpoint 3 (the defect recurred after restores)
    for checkpoint_id, batch_of in [*((c, c) for c in range(1, 7)), *((c, c - 3) for c in range(7, 10))]:
        if checkpoint_id == 7:
            sink.rollback(3)
            model = dict(models[3])
            _same_rows(_delta_rs(path), model, keys, "delta-rs after the restore to checkpoint 3")
        batch = rows(batch_of)
        df = spark.createDataFrame(pd.DataFrame(batch, columns=[*keys, "v"]), schema)
        sink.commit(checkpoint_id, sink.stage(step_context(spark, storage, checkpoint_id), df))
        model.update({tuple(r[:-1]): r[-1] for r in batch})
        models[checkpoint_id] = dict(model)
        for name, read in (("delta-rs", _delta_rs), ("duckdb", _duckdb)):
            _same_rows(read(path), model, keys, f"{name} after checkpoint {checkpoint_id}")
    for name, got in _readers(spark, path).items():
        _same_rows(got, model, keys, name)
    assert sink.audit() == []


@pytest.mark.parametrize("seed", [1, 2])
def test_random_upserts_match_a_dict_model(spark, tmp_path, monkeypatch, seed):
    """Random changes of a few keys (a compound key with nulls and empty strings) over many checkpoints:
    keys changed again and again, files given DVs, compacted, DVs in files and inline, a restore; every
    reader equals a dict model after each checkpoint, and every commit passes the writer's checks."""
    import random

    monkeypatch.setattr(delta_upsert, "INLINE_DV_BYTES", 40)  # inline, and some DVs in DV files
    rng = random.Random(seed)
    space = [(a, b) for a in (None, "", "x", "y") for b in (None, "", "1", "2", "3")]
    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "t"
    sink = DeltaTableSink("latest", SOURCE, str(path), "upsert", ["a", "b"], buckets=3, inline_deletion_vectors=True)
    model: dict[tuple[Any, ...], int] = {}
    models = {}
    for checkpoint_id in range(1, 13):
        if checkpoint_id == 9:
            sink.rollback(5)
            model = dict(models[5])
        keys = space if checkpoint_id == 1 else rng.sample(space, rng.randint(1, 6))
        batch = [(a, b, checkpoint_id * 100 + i) for i, (a, b) in enumerate(keys)]
        df = spark.createDataFrame(pd.DataFrame(batch, columns=["a", "b", "v"]), "a STRING, b STRING, v LONG")
        sink.commit(checkpoint_id, sink.stage(step_context(spark, storage, checkpoint_id), df))
        model.update({(a, b): v for a, b, v in batch})
        models[checkpoint_id] = dict(model)
        for name, read in (("delta-rs", _delta_rs), ("duckdb", _duckdb)):
            _same_rows(read(path), model, ["a", "b"], f"{name} after checkpoint {checkpoint_id}")
    assert sink.audit() == []


@pytest.mark.parametrize("claim", [{"job_id": "other"}, {"sink": "other"}, {"job_id": ["multi"]}])
def test_a_claim_naming_another_job_is_refused_before_recovery_commits(spark, tmp_path, claim):
    """``_table.json`` is untrusted: edited to name another job (or sink, or not a job id at all), the
    next trigger's recovery refuses it instead of looking up that job's ``txn`` and committing the latest
    checkpoint a second time (the same files added by two versions). Nothing under the table changes."""
    import hashlib
    import json

    from airflow_provider_checkpoint.testing.inprocess import make_job
    from tests.spark.helpers import write_json

    def declare(base: Path) -> None:
        events = FileSource("events", f"{base}/landing", "json", "id STRING, v LONG")
        DeltaTableSink("delta", events, f"{base}/delta", mode="upsert", keys=["id"])

    job = make_job(spark, tmp_path, declare)
    write_json(tmp_path / "landing" / "0.json", [{"id": "a", "v": 1}, {"id": "b", "v": 2}])
    job.checkpoint()
    table = tmp_path / "delta"
    stored = json.loads((table / "_table.json").read_text())
    (table / "_table.json").write_text(json.dumps({**stored, **claim}))

    def digest() -> dict[str, str]:
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(table.rglob("*")) if p.is_file()}

    before = digest()
    with pytest.raises(SinkClaimedError, match=r"belongs to .*not \{'job_id': 'multi', 'sink': 'delta'"):
        job.checkpoint()
    assert digest() == before
    assert delta_commits_per_checkpoint(table) == {1: 1}


def _digest(root: Path) -> dict[str, str]:
    import hashlib

    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("link", ["the log", "a commit in the log", "a data file"])
def test_a_link_in_the_log_or_out_of_the_table_is_refused_before_delta_rs_or_pyarrow_follows_it(spark, tmp_path, link):
    """The log linked out (delta-rs would create the next commit there), a commit file linked out, a data
    file of the log linked out (the upsert's lookup would read it): the step is refused with
    :class:`UnsafePathError`, and nothing outside, nor the table, changes."""
    import shutil

    from airflow_provider_checkpoint.exceptions import UnsafePathError

    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path, outside = tmp_path / "events", tmp_path / "outside"
    outside.mkdir()
    sink = DeltaTableSink("events", SOURCE, str(path), "upsert", ["k"])
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(_batch(1))))
    if link == "the log":
        shutil.move(path / "_delta_log", outside / "_delta_log")
        (path / "_delta_log").symlink_to(outside / "_delta_log")
    elif link == "a commit in the log":
        commit = path / "_delta_log" / f"{1:020d}.json"
        shutil.move(commit, outside / commit.name)
        commit.symlink_to(outside / commit.name)
    else:
        data = next(path.rglob("part-b*.parquet"))
        shutil.move(data, outside / data.name)
        data.symlink_to(outside / data.name)
    before = _digest(tmp_path)
    with pytest.raises(UnsafePathError, match=r"symbolic link|resolves to"):
        sink.stage(step_context(spark, storage, 2), spark.createDataFrame(_batch(2)))
    assert _digest(tmp_path) == before


@pytest.mark.parametrize("tamper", ["inline DV of zero bytes", "DV deleting row 10^9", "DV file at offset 2^40"])
def test_crafted_deletion_vectors_in_committables_are_refused_before_the_commit(spark, tmp_path, monkeypatch, tamper):
    """Committables come back from an ack in XCom (untrusted): a DV that does not decode, deletes a row the
    file does not have (its ``num_records`` raised to match), or sits at an offset past its file's end is
    refused with a :class:`DocumentError`; the table keeps its version and every reader its rows."""
    import numpy as np
    from deltalake import DeltaTable

    from airflow_provider_checkpoint.connectors.delta import deletion_vectors
    from airflow_provider_checkpoint.exceptions import DocumentError

    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "events"
    sink = DeltaTableSink("events", SOURCE, str(path), "upsert", ["k"], buckets=2)
    first = pd.DataFrame({"k": [f"k{i}" for i in range(200)], "region": "eu", "v": range(200)})
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(first)))
    changed = first.head(3).assign(v=-1)
    committables = sink.stage(step_context(spark, storage, 2), spark.createDataFrame(changed))
    delete = committables[0]["deletes"][0]
    if tamper == "inline DV of zero bytes":
        delete["new"] = {**delete["new"], "pathOrInlineDv": "", "sizeInBytes": 0, "cardinality": 0}
    elif tamper == "DV deleting row 10^9":
        delete["new"] = deletion_vectors.inline(np.array([5, 10**9], dtype=np.uint64)).to_json()
        delete["num_records"] = 10**9 + 1
    else:
        delete["new"] = {**delete["new"], "offset": 2**40}
    version = DeltaTable(str(path)).version()
    with pytest.raises(DocumentError):
        sink.commit(2, committables)
    assert DeltaTable(str(path)).version() == version
    for name, got in _readers(spark, path).items():
        pd.testing.assert_frame_equal(_sorted(got, ["k"]), _sorted(first, ["k"]), check_dtype=False, obj=name)


@pytest.mark.parametrize("damage", ["a commit nested too deep", "garbage _last_checkpoint", "a damaged checkpoint"])
def test_a_damaged_sink_log_is_refused_naming_the_table(spark, tmp_path, damage):
    """The sink's own log is untrusted too: a commit delta-rs would crash on, a ``_last_checkpoint`` that is
    not JSON, a log checkpoint that is not Parquet: the step is refused with a :class:`DocumentError` naming
    the table (not a raw ``DeltaError``), and nothing changes."""
    from deltalake import DeltaTable

    from airflow_provider_checkpoint.exceptions import DocumentError

    storage = JobStorage.for_job(str(tmp_path / "chk"), "job")
    path = tmp_path / "events"
    sink = DeltaTableSink("events", SOURCE, str(path))
    sink.commit(1, sink.stage(step_context(spark, storage, 1), spark.createDataFrame(_batch(1))))
    log = path / "_delta_log"
    if damage == "a commit nested too deep":
        (log / f"{2:020d}.json").write_text('{"commitInfo":{"x":' + "[" * 100_000 + "]" * 100_000 + "}}\n")
    elif damage == "garbage _last_checkpoint":
        (log / "_last_checkpoint").write_bytes(b"\x00garbage")
    else:
        DeltaTable(str(path)).create_checkpoint()
        next(log.glob("*.checkpoint.parquet")).write_bytes(b"PAR1garbagePAR1")
    before = _digest(tmp_path)
    with pytest.raises(DocumentError, match=str(path)):
        sink.stage(step_context(spark, storage, 2), spark.createDataFrame(_batch(2)))
    assert _digest(tmp_path) == before
