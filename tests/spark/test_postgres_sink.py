"""PostgresTableSink against a real PostgreSQL server and local Spark, checked against pandas."""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pandas as pd
import psycopg
import pytest

from airflow_provider_checkpoint.connectors.postgres import seal
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from airflow_provider_checkpoint.connectors.postgres.sql import CHECKPOINT_COLUMN
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    PipelineDefinitionError,
    RestoreError,
    SinkClaimedError,
    SinkConnectionError,
    SinkSchemaError,
    SinkValueError,
)
from airflow_provider_checkpoint.storage import JobStorage
from tests.servers.postgres import PostgresServer
from tests.spark.helpers import step_context

SCHEMA = "k string, v long, amount decimal(12,2), ts timestamp, tags array<string>"
COLUMNS = ["k", "v", "amount", "ts", "tags"]
_schemas = itertools.count()


@pytest.fixture
def target(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh schema for the test's table and bookkeeping, behind Airflow connection ``pg_test``."""
    schema = f"t{next(_schemas)}"
    monkeypatch.setenv("AIRFLOW_CONN_PG_TEST", postgres_server.uri())
    with postgres_server.connect() as db:
        db.execute(f"CREATE SCHEMA {schema}")
    yield schema


def _rows(checkpoint_id: int, keys: range) -> list[tuple[Any, ...]]:
    """Rows with any unicode, decimals, zoned timestamps and arrays (a null among them)."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        (
            f"k{i}-é✓𝄞",
            checkpoint_id * 1000 + i,
            Decimal(f"{i}.{checkpoint_id:02d}"),
            base + timedelta(hours=i, minutes=checkpoint_id),
            None if i % 5 == 0 else [f"t{checkpoint_id}", "ü"],
        )
        for i in keys
    ]


def _stage(
    spark: Any,
    sink: PostgresTableSink,
    job: str,
    checkpoint_id: int,
    rows: list[Any],
    attempt: int = 1,
    schema: str = SCHEMA,
) -> Any:
    storage = JobStorage.for_job(f"{tempfile.gettempdir()}/pg-sink-jobs", job)  # the sink writes no files
    df = spark.createDataFrame(rows, schema).repartition(3)
    ctx = step_context(spark, storage, checkpoint_id, attempt)
    sink.prepare(ctx)
    return sink.stage(ctx, df)


def _sink(schema: str, mode: str = "append", **kwargs: Any) -> PostgresTableSink:
    source = Source("src")
    return PostgresTableSink(
        "out", source, "pg_test", f"{schema}.facts", mode, keys=["k"] if mode == "upsert" else None, **kwargs
    )


def _table(server: PostgresServer, schema: str) -> pd.DataFrame:
    with server.connect() as db:
        rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM {schema}.facts").fetchall()
    return _normalised(pd.DataFrame(rows, columns=COLUMNS))


def _exists(server: PostgresServer, schema: str, table: str = "facts") -> bool:
    with server.connect() as db:
        return bool(db.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{schema}.{table}"]).fetchone()[0])


def _normalised(df: pd.DataFrame) -> pd.DataFrame:
    df = df.assign(ts=[t.astimezone(UTC) for t in df.ts], tags=[tuple(t) if t is not None else None for t in df.tags])
    return df.sort_values(["k", "v"]).reset_index(drop=True)


def _truth(mode: str, batches: list[list[tuple[Any, ...]]]) -> pd.DataFrame:
    every = pd.DataFrame([r for batch in batches for r in batch], columns=COLUMNS)
    if mode == "upsert":
        every = every.drop_duplicates("k", keep="last")
    return _normalised(every)


def _staging_tables(server: PostgresServer, schema: str) -> list[str]:
    with server.connect() as db:
        rows = db.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename LIKE '\\_cks\\_%%\\_c%%'", [schema]
        ).fetchall()
    return [r[0] for r in rows]


MODES = ["append", "append-partitions", "upsert"]
"""``append-partitions``: append with ``partition_per_checkpoint`` (commits attach, not copy)."""


def _sink_of(schema: str, mode: str) -> PostgresTableSink:
    if mode == "append-partitions":
        return _sink(schema, "append", partition_per_checkpoint=True)
    return _sink(schema, mode)


@pytest.mark.parametrize("mode", MODES)
def test_checkpoints_match_pandas_and_commit_twice_is_once(spark, postgres_server, target, mode):
    sink = _sink_of(target, mode)
    batches = [_rows(1, range(0, 40)), _rows(2, range(30, 70)), _rows(3, range(60, 65))]
    for checkpoint_id, batch in enumerate(batches, start=1):
        committables = _stage(spark, sink, "job", checkpoint_id, batch)
        staged = committables[0]["staging_table"]
        sealed = _seal(postgres_server, target, staged)
        assert committables == [
            {"checkpoint_id": checkpoint_id, "staging_table": staged, "rows": len(batch), "seal": sealed}
        ]
        if checkpoint_id == 1 and mode != "append-partitions":  # the first commit makes the table
            assert not _exists(postgres_server, target)
        else:
            assert _table(postgres_server, target).shape[0] == _truth(mode, batches[: checkpoint_id - 1]).shape[0]
        sink.commit(checkpoint_id, committables)
        sink.commit(checkpoint_id, committables)  # a finalize retry / the trigger's recovery: nothing more
        assert sink.is_committed(checkpoint_id)
        pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, batches[:checkpoint_id]))
    assert _staging_tables(postgres_server, target) == []
    assert sink.audit() == []
    with postgres_server.connect() as db:  # no seal stays on the table (made of, or attached, staging tables)
        assert db.execute("SELECT count(*) FROM pg_trigger WHERE tgname = %s", [seal.FUNCTION]).fetchone() == (0,)
        db.execute(f"DELETE FROM {target}.facts WHERE v < 0")


def _seal(server: PostgresServer, schema: str, table: str) -> str | None:
    """The seal of staging table ``schema.table`` as the catalog holds it (:func:`seal.problem` compares it)."""
    with server.connect() as db:
        return seal.current(db, schema, table)


@pytest.mark.parametrize("mode", ["append", "append-partitions"])
def test_abort_drops_every_attempt_and_audit_lists_leftovers(spark, postgres_server, target, mode):
    sink = _sink_of(target, mode)
    _stage(spark, sink, "job", 1, _rows(1, range(10)), attempt=1)
    _stage(spark, sink, "job", 1, _rows(1, range(10)), attempt=2)
    kept = _stage(spark, sink, "job", 2, _rows(2, range(5)))
    assert len(_staging_tables(postgres_server, target)) == 3
    assert len(sink.audit()) == 3
    sink.abort(1)
    assert _staging_tables(postgres_server, target) == [kept[0]["staging_table"]]
    sink.abort(2)
    assert sink.audit() == []
    with pytest.raises(Exception, match="is gone"):
        sink.commit(2, kept)
    assert (
        _table(postgres_server, target).empty if mode == "append-partitions" else not _exists(postgres_server, target)
    )


@pytest.mark.parametrize("mode", MODES)
def test_restore_returns_the_table_to_an_earlier_checkpoint(spark, postgres_server, target, mode):
    sink = _sink_of(target, mode)
    batches = [_rows(c, range(10 * c, 10 * c + 25)) for c in range(1, 5)]
    for checkpoint_id, batch in enumerate(batches, start=1):
        sink.commit(checkpoint_id, _stage(spark, sink, "job", checkpoint_id, batch))
    sink.rollback(2)
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, batches[:2]))
    assert not sink.is_committed(3)
    sink.rollback(2)  # nothing newer any more
    replay = _rows(5, range(0, 50))
    sink.commit(5, _stage(spark, sink, "job", 5, replay))
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, [*batches[:2], replay]))


def test_a_null_key_is_a_key_like_any_other_through_commits_and_restores(spark, postgres_server, target):
    """The sink creates the table ``UNIQUE NULLS NOT DISTINCT``: a null key is stored once, replaced by a
    later checkpoint, and returned to its earlier row by a restore (the before-images join it by index
    with ``IS NULL``), as in the Parquet and Delta sinks."""
    sink = _sink(target, "upsert")

    def batch(c: int, keys: range, null_at: int) -> list[tuple[Any, ...]]:
        rows = _rows(c, keys)
        rows[null_at] = (None, *rows[null_at][1:])
        return rows

    batches = [batch(1, range(0, 20), 3), batch(2, range(10, 30), 0), batch(3, range(25, 40), 7)]
    for checkpoint_id, rows in enumerate(batches, start=1):
        sink.commit(checkpoint_id, _stage(spark, sink, "job", checkpoint_id, rows))
        pd.testing.assert_frame_equal(_table(postgres_server, target), _truth("upsert", batches[:checkpoint_id]))
    with postgres_server.connect() as db:
        assert db.execute(f"SELECT count(*) FROM {target}.facts WHERE k IS NULL").fetchone() == (1,)
    sink.rollback(1)
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth("upsert", batches[:1]))


def test_a_null_key_is_refused_where_the_tables_index_would_not_match_it(spark, postgres_server, target):
    """A table of the user's with a primary key (or a plain unique index): a null key part could not be
    upserted, so the step refuses it, naming the key and the fix; nothing is committed."""
    with postgres_server.connect() as db:
        db.execute(
            f"CREATE TABLE {target}.facts (k text, v bigint, amount numeric(12, 2), ts timestamptz, tags text[], "
            "UNIQUE (k))"
        )
    sink = _sink(target, "upsert", create_table=False)
    rows = _rows(1, range(3))
    rows[1] = (None, *rows[1][1:])
    with pytest.raises(SinkValueError, match=r"\(k=None\) is a null key.*UNIQUE NULLS NOT DISTINCT"):
        _stage(spark, sink, "job", 1, rows)
    assert _table(postgres_server, target).shape[0] == 0


def test_upsert_restore_beyond_undo_retention_is_refused_and_changes_nothing(spark, postgres_server, target):
    sink = _sink(target, "upsert", undo_checkpoints=2)
    batches = [_rows(c, range(c, c + 10)) for c in range(1, 5)]
    for checkpoint_id, batch in enumerate(batches, start=1):
        sink.commit(checkpoint_id, _stage(spark, sink, "job", checkpoint_id, batch))
    with pytest.raises(RestoreError, match=r"checkpoints \[2\] were purged"):
        sink.rollback(1)
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth("upsert", batches))
    sink.rollback(2)
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth("upsert", batches[:2]))


def test_a_first_load_into_an_empty_table_and_restores_around_it(spark, postgres_server, target):
    """A commit into an empty table inserts its rows with one undo row (no before-image per key): restores
    to before, across and after two such loads (the second after deletes emptied the table) return the
    table to each checkpoint's rows, read back with psycopg."""
    sink = _sink(target, "upsert", delete_when="gone", undo_checkpoints=4)

    def batch(c: int, keys: range, gone: bool = False) -> list[tuple[Any, ...]]:
        return [(*row, gone) for row in _rows(c, keys)]

    one, two, three = batch(1, range(0, 30)), batch(2, range(0, 30), gone=True), batch(3, range(20, 50))
    four = batch(4, range(40, 60))
    states = [[], one, [], three, [*[r for r in three if r[0] not in {x[0] for x in four}], *four]]
    for checkpoint_id, rows in enumerate([one, two, three, four], start=1):
        sink.commit(checkpoint_id, _stage(spark, sink, "job", checkpoint_id, rows, schema=f"{SCHEMA}, gone boolean"))
    with postgres_server.connect() as db:
        undo = db.execute(f"SELECT _undo_checkpoint, count(*) FROM {target}._cks_{sink.digest}_undo GROUP BY 1")
        assert dict(undo.fetchall()) == {1: 1, 2: 30, 3: 1, 4: 20}  # first loads: one row each
    for restored in (3, 1, 0):  # 1: across the second first load and the deletes
        sink.rollback(restored)
        truth = _truth("upsert", [[r[:-1] for r in states[restored]]])
        pd.testing.assert_frame_equal(_table(postgres_server, target), truth, check_dtype=not truth.empty)


def test_refused_values_name_column_and_key_and_commit_nothing(spark, postgres_server, target):
    sink = _sink(target, "upsert")
    bad = [*_rows(1, range(3)), ("nul-key", 1, Decimal(1), datetime(2026, 1, 1, tzinfo=UTC), ["a\x00b"])]
    with pytest.raises(SinkValueError, match=r"column tags, key \(k='nul-key'\)"):
        _stage(spark, sink, "job", 1, bad)
    with postgres_server.connect() as db:
        db.execute(f"CREATE TABLE {target}.narrow (k text PRIMARY KEY, v smallint, note text)")
    narrow = PostgresTableSink("narrow", Source("src2"), "pg_test", f"{target}.narrow", "upsert", keys=["k"])
    multiline = [(f"k{i}", 1, 'two\nlines, "quoted"') for i in range(6)]  # sent as CSV: no arrays
    for rows, refused in (
        ([(k, 70000 if k == "k4" else v, note) for k, v, note in multiline], r"column v, key \(k='k4'\).*out of range"),
        ([(k, v, "nul\x00" if k == "k3" else note) for k, v, note in multiline], r"column note, key \(k='k3'\)"),
    ):
        with pytest.raises(SinkValueError, match=refused):
            _stage(spark, narrow, "job", 1, rows, schema="k string, v long, note string")
    assert not _exists(postgres_server, target)  # the table is made by the first commit
    sink.commit(2, _stage(spark, sink, "job", 2, [("dup", *_rows(1, range(1))[0][1:])] * 2))  # duplicates collapse
    assert _table(postgres_server, target)["k"].tolist() == ["dup"]


def test_a_table_not_matching_the_input_is_refused(spark, postgres_server, target):
    with postgres_server.connect() as db:
        db.execute(f"CREATE TABLE {target}.facts (k text, v bigint, other int, {CHECKPOINT_COLUMN} bigint)")
    with pytest.raises(SinkSchemaError, match=r"missing columns \['amount', 'ts', 'tags'\].*\['other'\]"):
        _stage(spark, _sink(target), "job", 1, _rows(1, range(3)))
    upsert = PostgresTableSink(
        "u", Source("s"), "pg_test", f"{target}.absent", "upsert", keys=["k"], create_table=False
    )
    with pytest.raises(SinkSchemaError, match="does not exist"):
        _stage(spark, upsert, "job", 1, _rows(1, range(3)))


def test_the_pipeline_check_refuses_what_the_step_would_and_creates_nothing(spark, postgres_server, target):
    df, sink = spark.createDataFrame([], SCHEMA), _sink(target)
    sink.bind_job("job")
    sink.check_input(df)  # no table yet: the first commit makes it; the check creates nothing
    with postgres_server.connect() as db:
        assert db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s", [target]).fetchone() == (0,)
        db.execute(f"CREATE TABLE {target}.facts (k text, v bigint, other int, {CHECKPOINT_COLUMN} bigint)")
    with pytest.raises(SinkSchemaError, match=r"missing columns \['amount', 'ts', 'tags'\].*\['other'\]"):
        sink.check_input(df)


def test_another_jobs_table_is_refused_before_any_spark_work(spark, postgres_server, target):
    sink = _sink(target)
    sink.commit(1, _stage(spark, sink, "job-a", 1, _rows(1, range(3))))
    with pytest.raises(SinkClaimedError, match="job-a"):
        _stage(spark, sink, "job-b", 2, _rows(2, range(3)))
    with pytest.raises(SinkClaimedError, match="upsert"):
        _stage(spark, _sink(target, "upsert"), "job-a", 2, _rows(2, range(3)))
    assert _table(postgres_server, target).shape[0] == 3


def test_a_claim_stored_by_another_job_between_the_read_and_the_insert_is_refused(postgres_server, target, monkeypatch):
    """Two jobs claiming one table at once: the one whose insert finds the other's claim there reads it back
    and is refused; the stored claim stays the other's."""
    from airflow_provider_checkpoint.connectors.postgres import claims

    real, other = claims.read, _sink(target)
    other.claim("job-a")  # the bookkeeping tables made
    with postgres_server.connect() as db:
        db.execute(f"DELETE FROM {target}.checkpoint_sink_claims")
    reads: list[object] = []

    def read_then_raced(*args: Any, **kwargs: Any) -> Any:
        reads.append(found := real(*args, **kwargs))
        if len(reads) == 1:
            monkeypatch.setattr(claims, "read", real)
            other.claim("job-a")  # on its own connection, committed before ours inserts
        return found

    monkeypatch.setattr(claims, "read", read_then_raced)
    with pytest.raises(SinkClaimedError, match="job-a"):
        _sink(target).claim("job-b")
    assert reads == [None] and other.load_claim() == other.claim_document("job-a")


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_claim_row_naming_another_job_is_refused_before_a_second_commit(spark, postgres_server, target, mode):
    """The claims table is untrusted: a row edited to name another job would make the commit look for that
    job's marker, find none and commit checkpoint 1 again. It is refused; the table keeps its rows once."""
    sink = _sink(target, mode)
    committables = _stage(spark, sink, "job", 1, _rows(1, range(5)))
    sink.commit(1, committables)
    with postgres_server.connect() as db:
        db.execute(f"UPDATE {target}.checkpoint_sink_claims SET job_id = 'other' WHERE table_name = 'facts'")
    with pytest.raises(SinkClaimedError, match=r"belongs to .*'other'"):
        sink.commit(1, committables)
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, [_rows(1, range(5))]))


def test_a_wrong_password_is_refused_without_naming_it(postgres_server, target, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_PG_TEST", postgres_server.uri(password="not-the-password"))
    with pytest.raises(SinkConnectionError, match="password authentication failed") as refused:
        _sink(target).load_claim()
    assert "not-the-password" not in str(refused.value) and postgres_server.password not in str(refused.value)


def _dead_letters(server: PostgresServer, schema: str) -> pd.DataFrame:
    with server.connect() as db:
        rows = db.execute(
            f"SELECT job_id, sink_uid, checkpoint_id, target_table, column_name, key, record, error FROM {schema}.dead"
        ).fetchall()
    columns = ["job_id", "sink_uid", "checkpoint_id", "target_table", "column_name", "key", "record", "error"]
    return pd.DataFrame(rows, columns=columns)


@pytest.mark.parametrize(("mode", "arrays"), [("upsert", False), ("append", True)], ids=["upsert-csv", "append-rows"])
def test_refused_rows_go_to_the_dead_letter_table_exactly_once_and_restore_removes_them(
    spark, postgres_server, target, mode, arrays
):
    """Rows PostgreSQL refuses (smallint out of range, NUL in text or in an array) are skipped
    and recorded once with the checkpoint; the rest is loaded; a restore removes both."""
    tags = ", tags text[]" if arrays else ""
    own = f", {CHECKPOINT_COLUMN} bigint NOT NULL" if mode == "append" else ", PRIMARY KEY (k)"
    with postgres_server.connect() as db:
        db.execute(f"CREATE TABLE {target}.narrow (k text, v smallint, note text{tags}{own})")
    sink = PostgresTableSink(
        "narrow", Source("src"), "pg_test", f"{target}.narrow", mode, keys=["k"] if mode == "upsert" else None,
        dead_letter_table="dead", max_refused_fraction=0.2,
    )  # fmt: skip
    schema = "k string, v long, note string" + (", tags array<string>" if arrays else "")

    def rows(checkpoint_id: int, bad_every: int) -> pd.DataFrame:
        keys = [f"k{i}" for i in range(2000)]
        df = pd.DataFrame({"k": keys, "v": checkpoint_id, "note": [f'n{i}, "quoted"\nline' for i in range(2000)]})
        bad = (df.index % bad_every == 0) | df.index.isin([10, 11, 1999])
        df.loc[bad & (df.index % 3 == 0), "v"] = 40000 + df.index[bad & (df.index % 3 == 0)]
        df.loc[bad & (df.index % 3 == 1), "note"] = "nul\0here"
        if arrays:
            df["tags"] = [["a\0b"] if b and i % 3 == 2 else ["ü", None] for i, b in zip(df.index, bad, strict=True)]
        else:
            df.loc[bad & (df.index % 3 == 2), "v"] = -40000
        df["column"] = [
            "v" if i % 3 == 0 or not arrays and i % 3 == 2 else "note" if i % 3 == 1 else "tags" for i in df.index
        ]
        return df.assign(bad=bad)

    def stage(checkpoint_id: int, df: pd.DataFrame) -> list[dict[str, Any]]:
        data = [tuple(r) for r in df.drop(columns=["bad", "column"]).itertuples(index=False)]
        return _stage(spark, sink, "job", checkpoint_id, data, schema=schema)

    def table() -> pd.DataFrame:
        with postgres_server.connect() as db:
            found = db.execute(f"SELECT k, v, note FROM {target}.narrow").fetchall()
        return pd.DataFrame(found, columns=["k", "v", "note"]).sort_values(["k", "v"]).reset_index(drop=True)

    def truth(batches: list[pd.DataFrame]) -> pd.DataFrame:
        good = pd.concat([b[~b.bad] for b in batches])[["k", "v", "note"]]
        if mode == "upsert":
            good = good.drop_duplicates("k", keep="last")
        return good.sort_values(["k", "v"]).reset_index(drop=True).astype({"v": "int64"})

    def expected_letters(batches: dict[int, pd.DataFrame]) -> set[tuple[Any, ...]]:
        return {
            (c, r.column, json.dumps({"k": r.k}) if mode == "upsert" else None)
            for c, b in batches.items()
            for r in b[b.bad].itertuples()
        }

    batches = {1: rows(1, 97), 2: rows(2, 61)}
    for checkpoint_id, df in batches.items():
        committables = stage(checkpoint_id, df)
        assert committables[0]["dead_letters"] == int(df.bad.sum()) > 0
        assert committables[0]["rows"] == int((~df.bad).sum())
        sink.commit(checkpoint_id, committables)
        sink.commit(checkpoint_id, committables)  # a finalize retry: nothing more
    pd.testing.assert_frame_equal(table(), truth(list(batches.values())))
    letters = _dead_letters(postgres_server, target)
    assert set(zip(letters.checkpoint_id, letters.column_name, letters.key, strict=True)) == expected_letters(batches)
    assert len(letters) == sum(int(b.bad.sum()) for b in batches.values())
    assert set(letters.job_id) == {"job"} and set(letters.target_table) == {f"{target}.narrow"}
    assert letters[letters.column_name == "v"].error.str.contains("out of range").all()
    assert letters[letters.column_name != "v"].error.str.contains("NUL").all()
    assert {json.loads(r)["k"] for r in letters.record} == {k for b in batches.values() for k in b[b.bad].k}
    assert _staging_tables(postgres_server, target) == []

    sink.rollback(1)
    pd.testing.assert_frame_equal(table(), truth([batches[1]]))
    letters = _dead_letters(postgres_server, target)
    assert set(zip(letters.checkpoint_id, letters.column_name, letters.key, strict=True)) == expected_letters(
        {1: batches[1]}
    )

    too_many = rows(3, 4)
    with pytest.raises(SinkValueError, match=rf"refused {too_many.bad.sum()} of 2000 rows .* max_refused_fraction=0.2"):
        stage(3, too_many)
    sink.abort(3)
    assert _staging_tables(postgres_server, target) == []
    pd.testing.assert_frame_equal(table(), truth([batches[1]]))


def _partitions(server: PostgresServer, schema: str) -> dict[str, list[int]]:
    """Each partition of ``schema.facts``: the checkpoint ids its rows carry (read with psycopg)."""
    with server.connect() as db:
        names = db.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%s) ORDER BY 1",
            [f"{schema}.facts"],
        ).fetchall()
        return {
            n: [r[0] for r in db.execute(f"SELECT DISTINCT {CHECKPOINT_COLUMN} FROM {schema}.{n} ORDER BY 1")]
            for (n,) in names
        }


def test_partition_per_checkpoint_attaches_the_attempt_metadata_names_once_and_restore_drops_newer(
    spark, postgres_server, target
):
    """A retried step (two attempts) commits the attempt it names, once, as its own partition holding
    its checkpoint's rows only, also after a crash of the server between the step and the commit; a
    restore drops the partitions of later checkpoints."""
    sink = _sink(target, partition_per_checkpoint=True)
    batches = [_rows(1, range(0, 30)), _rows(2, range(20, 45)), _rows(3, range(0, 7))]
    for checkpoint_id, batch in enumerate(batches, start=1):
        _stage(spark, sink, "job", checkpoint_id, batch, attempt=1)
        committables = _stage(spark, sink, "job", checkpoint_id, batch, attempt=2)
        if checkpoint_id == 2:  # the staged rows survive crash recovery (logged staging tables)
            postgres_server.kill()
            postgres_server.start()
        sink.verify_staged(checkpoint_id, committables)
        sink.commit(checkpoint_id, committables)
        sink.commit(checkpoint_id, committables)
        pd.testing.assert_frame_equal(_table(postgres_server, target), _truth("append", batches[:checkpoint_id]))
    parts = _partitions(postgres_server, target)
    assert sorted(parts.values()) == [[1], [2], [3]] and all(n.endswith(f"_p{c[0]}") for n, c in parts.items())
    assert _staging_tables(postgres_server, target) == [] and sink.audit() == []
    sink.rollback(1)
    assert sorted(_partitions(postgres_server, target).values()) == [[1]]
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth("append", batches[:1]))
    assert not sink.is_committed(2)
    replay = _rows(4, range(50, 60))
    sink.commit(4, _stage(spark, sink, "job", 4, replay))
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth("append", [batches[0], replay]))


def test_partition_per_checkpoint_keeps_a_users_partitioned_table_its_indexes_and_constraints(
    spark, postgres_server, target
):
    """A table the user made (``LIST (_checkpoint_id)``, an index, a ``CHECK``, a partition of its own)
    gets one partition per checkpoint carrying the index; the sink adds nothing else to it."""
    with postgres_server.connect() as db:
        db.execute(
            f"CREATE TABLE {target}.facts (k text NOT NULL, v bigint CHECK (v >= 0), amount numeric(12,2), "
            f"ts timestamptz, tags text[], {CHECKPOINT_COLUMN} bigint NOT NULL) PARTITION BY LIST ({CHECKPOINT_COLUMN})"
        )
        db.execute(f"CREATE INDEX facts_v ON {target}.facts (v)")
        db.execute(f"CREATE TABLE {target}.old PARTITION OF {target}.facts FOR VALUES IN (0)")
    sink = _sink(target, partition_per_checkpoint=True, create_table=False)
    batch = _rows(1, range(0, 12))
    sink.commit(1, _stage(spark, sink, "job", 1, batch))
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth("append", [batch]))
    with postgres_server.connect() as db:
        indexed = db.execute(
            "SELECT count(*) FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%s)",
            [f"{target}.facts_v"],
        ).fetchone()[0]
        checks = db.execute(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'c' AND conrelid = to_regclass(%s)", [f"{target}.facts"]
        ).fetchone()[0]
    assert indexed == 2 and checks == 1  # both partitions indexed; the sink's staging CHECK is gone
    assert sorted(_partitions(postgres_server, target).values()) == [[], [1]]


def _create_facts(server: PostgresServer, schema: str, partitioned: str = "") -> None:
    """``schema.facts`` for the append input, as a user would create it (replacing any)."""
    with server.connect() as db:
        db.execute(f"DROP TABLE IF EXISTS {schema}.facts")
        db.execute(f"CREATE TABLE {schema}.facts (k text, v bigint, amount numeric(12,2), ts timestamptz, "
                   f"tags text[], {CHECKPOINT_COLUMN} bigint NOT NULL){partitioned}")  # fmt: skip


def test_a_table_partitioned_other_than_the_option_says_is_refused(spark, postgres_server, target):
    _create_facts(postgres_server, target)
    sink = _sink(target, partition_per_checkpoint=True)
    with pytest.raises(SinkSchemaError, match=r"PARTITION BY LIST \(_checkpoint_id\), and it is not partitioned"):
        _stage(spark, sink, "job", 1, _rows(1, range(3)))
    assert _partitions(postgres_server, target) == {} and _staging_tables(postgres_server, target) == []
    _create_facts(postgres_server, target, f" PARTITION BY LIST ({CHECKPOINT_COLUMN})")
    with pytest.raises(SinkSchemaError, match="without a DEFAULT partition, so a commit could not insert"):
        _stage(spark, _sink(target), "job", 1, _rows(1, range(3)))  # the option off: its INSERT would fail
    with pytest.raises(PipelineDefinitionError, match="partition_per_checkpoint is for append mode"):
        _sink(target, "upsert", partition_per_checkpoint=True)


WRITES_BY_HAND = {
    "insert": "INSERT INTO {t} (k, v) SELECT k || '-x', v FROM {t}",
    "delete": "DELETE FROM {t} WHERE v % 2 = 0",
    "update": "UPDATE {t} SET v = v + 1",
    "truncate": "TRUNCATE {t}",
    "copy": "COPY {t} (k, v) FROM PROGRAM 'echo x,1' (FORMAT csv)",
}
CHANGES_BY_HAND = {  # each gets past the seal's trigger; the seal the catalog holds then is not the step's
    "disabled, written, enabled": [
        "ALTER TABLE {t} DISABLE TRIGGER ALL",
        "DELETE FROM {t} WHERE v % 2 = 0",
        f"ALTER TABLE {{t}} ENABLE ALWAYS TRIGGER {seal.FUNCTION}",
    ],
    "rewritten": ["ALTER TABLE {t} ALTER COLUMN v TYPE bigint USING v + 1"],
    "seal re-created": [
        f"DROP TRIGGER {seal.FUNCTION} ON {{t}}",
        "UPDATE {t} SET v = -v",
        f"CREATE TRIGGER {seal.FUNCTION} BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {{t}} FOR EACH STATEMENT "
        f"EXECUTE FUNCTION {{s}}.{seal.FUNCTION}()",
        f"ALTER TABLE {{t}} ENABLE ALWAYS TRIGGER {seal.FUNCTION}",
    ],
    "function replaced": [
        f"CREATE OR REPLACE FUNCTION {{s}}.{seal.FUNCTION}() RETURNS trigger LANGUAGE plpgsql "
        "AS 'BEGIN RETURN NULL; END'",
        "INSERT INTO {t} (k, v) VALUES ('x', 1)",
    ],
}


@pytest.mark.parametrize("mode", MODES)
def test_a_staging_table_changed_after_the_step_is_refused_and_nothing_commits(spark, postgres_server, target, mode):
    """The step seals its staging table: a write by hand is refused, also as a replica would apply it; one that
    gets past the seal (trigger disabled, table rewritten, seal or its function re-made) fails finalize's check
    before ``_metadata`` and the commit, which rolls back: the table is as before. Another attempt commits."""
    sink = _sink_of(target, mode)
    batch = _rows(1, range(0, 9))
    for n, (change, statements) in enumerate(CHANGES_BY_HAND.items(), start=1):
        committables = _stage(spark, sink, "job", 1, batch, attempt=n)
        staged = f"{target}.{committables[0]['staging_table']}"
        with postgres_server.connect() as db:
            db.execute("SET session_replication_role = replica")
            for write in WRITES_BY_HAND.values():
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f"{staged} is sealed"):
                    db.execute(write.format(t=staged))
            db.execute("RESET session_replication_role")
            for statement in statements:
                db.execute(statement.format(t=staged, s=target))
        refused = rf"staging table {staged} of checkpoint 1 (was written|has lost)"
        with pytest.raises(CheckpointStorageError, match=refused):
            sink.verify_staged(1, committables)
        with pytest.raises(CheckpointStorageError, match=rf"cannot commit checkpoint 1: its staging table {staged} "):
            sink.commit(1, committables)
        assert not sink.is_committed(1), change
        made = mode != "append-partitions"  # else the partitioned table exists, empty
        assert (not _exists(postgres_server, target)) if made else _table(postgres_server, target).empty, change
        sink.abort(1)
        if change == "function replaced":
            with postgres_server.connect() as db:
                db.execute(f"DROP FUNCTION {target}.{seal.FUNCTION}() CASCADE")
    committables = _stage(spark, sink, "job", 1, batch, attempt=9)
    sink.verify_staged(1, committables)
    sink.commit(1, committables)
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, [batch]))


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_partition_loaded_twice_by_spark_task_attempts_fails_the_step(
    spark, postgres_server, target, monkeypatch, mode
):
    """A Spark task attempt that committed its load and was lost before reporting it, and the retry that loaded
    the partition again: the step counts the table under its seal (the first upsert load: once its key index
    refused the partition's keys staged twice, telling that from an input repeating a key) and fails, to be retried;
    nothing is committed."""
    from airflow_provider_checkpoint.connectors.postgres import staging

    real = staging.copy_partitions

    def lost_then_retried(*args: Any, **kwargs: Any) -> Any:
        load = real(*args, **kwargs)

        def attempts(batches: Iterator[Any]) -> Iterator[Any]:
            from pyspark import TaskContext

            held = list(batches)
            if TaskContext.get().partitionId() == 0:
                list(load(iter(held)))  # committed; its report lost with its executor
            yield from load(iter(held))

        return attempts

    monkeypatch.setattr(staging, "copy_partitions", lost_then_retried)
    sink = _sink_of(target, mode)
    with pytest.raises(CheckpointStorageError, match=r"holds [0-9]+ rows, its load reported 30 \(a Spark task"):
        _stage(spark, sink, "job", 1, _rows(1, range(30)))
    assert not _exists(postgres_server, target)


def _facts_of(server: PostgresServer, schema: str, table: str) -> pd.DataFrame:
    with server.connect() as db:
        rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM {schema}.{table}").fetchall()
    return _normalised(pd.DataFrame(rows, columns=COLUMNS))


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_one_jobs_sink_uid_commits_the_same_checkpoints_into_two_tables_each_its_own(
    spark, postgres_server, target, mode
):
    """A job started afresh under an old job id, or two environments' jobs of one id, writing tables of one
    schema through sinks of the same uid: each table's commits and restores are its own (a checkpoint marked
    committed into one table was once taken for the other's and its rows were lost)."""
    keys = ["k"] if mode == "upsert" else None
    first = PostgresTableSink("out", Source("src"), "pg_test", f"{target}.facts", mode, keys=keys)
    second = PostgresTableSink("out", Source("src"), "pg_test", f"{target}.facts_again", mode, keys=keys)
    batches = [_rows(c, range(10 * c, 10 * c + 15)) for c in range(1, 4)]
    for checkpoint_id, batch in enumerate(batches, start=1):
        first.commit(checkpoint_id, _stage(spark, first, "job", checkpoint_id, batch))
    for checkpoint_id, batch in enumerate(batches[:2], start=1):
        assert not second.is_committed(checkpoint_id)
        second.commit(checkpoint_id, _stage(spark, second, "job", checkpoint_id, batch))
    pd.testing.assert_frame_equal(_facts_of(postgres_server, target, "facts_again"), _truth(mode, batches[:2]))
    second.rollback(1)  # the other table's markers and rows stay
    assert [first.is_committed(c) for c in (1, 2, 3)] == [True, True, True]
    assert [second.is_committed(c) for c in (1, 2)] == [True, False]
    pd.testing.assert_frame_equal(_facts_of(postgres_server, target, "facts_again"), _truth(mode, batches[:1]))
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth(mode, batches))


def test_a_markers_table_keyed_without_the_table_is_rekeyed_at_the_next_commit_and_keeps_its_markers(
    spark, postgres_server, target
):
    """Markers tables created by earlier versions have the primary key (job_id, sink_uid, checkpoint_id)."""
    with postgres_server.connect() as db:
        db.execute(
            f"CREATE TABLE {target}.checkpoint_sink_markers (job_id text, sink_uid text, checkpoint_id bigint, "
            "table_name text NOT NULL, rows bigint NOT NULL, undo_kept boolean NOT NULL, committed_at timestamptz "
            "NOT NULL DEFAULT now(), PRIMARY KEY (job_id, sink_uid, checkpoint_id))"
        )
        db.execute(
            f"INSERT INTO {target}.checkpoint_sink_markers (job_id, sink_uid, checkpoint_id, table_name, rows, "
            "undo_kept) VALUES ('job', 'out', 1, 'elsewhere', 5, false)"
        )
    sink = _sink(target)
    batch = _rows(1, range(4))
    sink.commit(1, _stage(spark, sink, "job", 1, batch))
    pd.testing.assert_frame_equal(_table(postgres_server, target), _truth("append", [batch]))
    with postgres_server.connect() as db:
        key = db.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
            [f"{target}.checkpoint_sink_markers"],
        ).fetchone()
        kept = db.execute(
            f"SELECT table_name, rows FROM {target}.checkpoint_sink_markers WHERE checkpoint_id = 1 ORDER BY 1"
        ).fetchall()
    assert key == ("PRIMARY KEY (job_id, sink_uid, table_name, checkpoint_id)",)
    assert kept == [("elsewhere", 5), ("facts", 4)]
