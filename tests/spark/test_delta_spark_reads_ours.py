"""Our Delta tables read and maintained by delta-spark, the reference implementation (issue #53).

Random change streams (the sink model's machine) into ``DeltaTableSink`` append and upsert tables
(``sequence_by``, deletes; deletion vectors inline in the log and in DV files; a log checkpoint on every
commit; restores), each table read after every step by delta-spark, delta-rs and DuckDB and compared
with the model. Then delta-spark's own commands on our tables (``DESCRIBE DETAIL``/``HISTORY``, an
idempotent write with our ``txn``, a checkpoint of its own, ``VACUUM``, ``OPTIMIZE``, ``RESTORE``)
with our sink writing on afterwards (over ``OPTIMIZE``'s files it refuses, as over any other writer's).

CI runs one seed; ``DELTA_SPARK_SEEDS=1,2,3``, ``DELTA_SPARK_EXAMPLES`` and ``DELTA_SPARK_STEPS`` run more.
delta-spark's commands and the ``OPTIMIZE`` conflict run in ``make test-full`` (``FULL_TESTS=1``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import DocumentError, SinkClaimedError
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.delta_spark import delta_spark_rows, delta_spark_session, sql
from tests.spark.helpers import staged_and_committed
from tests.spark.sink_machine import Env, run
from tests.spark.sink_model import Config, Harness, Model, delta_rows, duckdb_delta_rows, scratch_root

pytestmark = pytest.mark.spark

SEEDS = [int(s) for s in os.environ.get("DELTA_SPARK_SEEDS", "53").split(",")]
EXAMPLES = int(os.environ.get("DELTA_SPARK_EXAMPLES", "1"))
STEPS = int(os.environ.get("DELTA_SPARK_STEPS", "4"))


@pytest.fixture(scope="module")
def delta_spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from delta_spark_session(tmp_path_factory.mktemp("delta-spark") / "server.log")


@pytest.fixture(scope="module")
def env(spark: Any, delta_spark: Any) -> Env:
    return Env(spark, scratch_root(), delta_spark=delta_spark)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "config",
    [
        Config("delta", "append"),
        pytest.param(Config("delta", "upsert", sequence_by=True, inline_dvs=True), marks=pytest.mark.full),
        Config("delta", "upsert", sequence_by=True, deletes=True),
    ],
    ids=["append", "upsert-seq-inline-dvs", "upsert-seq-deletes-dv-files"],
)
def test_delta_spark_reads_what_the_model_holds(config: Config, seed: int, env: Env) -> None:
    run(config, env, seed, EXAMPLES, STEPS, shrink=False)


def _log(path: Path) -> list[dict[str, Any]]:
    """Every action of every commit file of the table's log, in version order (read as plain JSON)."""
    actions = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        actions += [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
    return actions


def _version(path: Path) -> int:
    return max(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))


class Table:
    """One upsert table of our sink, its model, and checks by all three readers after each change."""

    def __init__(self, env: Env, name: str) -> None:
        self.config = Config("delta", "upsert", sequence_by=True)
        self.harness = Harness(self.config, env.spark, env.root, name, delta_spark=env.delta_spark)
        self.model, self.next_id = Model(self.config), 1

    def checkpoint(self, cold: int, hot: list[Any]) -> None:
        c, self.next_id = self.next_id, self.next_id + 1
        rows = [(f"cold{i}", i % 3, 0, "cold") for i in range(cold)] + hot
        self.harness.commit(c, self.harness.stage(c, 1, rows))
        self.model.commit(c, rows)

    def check(self, after: str) -> None:
        expected = self.model.expected()
        for reader, read in self.harness.readers().items():
            got = read()
            assert got == expected, f"{reader} after {after}: {len(got)} rows, {len(expected)} expected"


@pytest.mark.full
def test_delta_spark_commands_on_our_table_and_our_sink_writing_on(env: Env) -> None:
    ds, table = env.delta_spark, Table(env, "maintained")
    path, at = table.harness.path, f"delta.`{table.harness.path}`"
    table.checkpoint(40, [("a", 0, 1, "x")])
    table.checkpoint(0, [("a", 0, 2, "y"), ("cold3", 0, 1, "changed")])  # deletion vectors
    table.checkpoint(5, [("cold7", 1, 3, "changed"), ("b", 7, 0, None)])
    table.check("3 checkpoints")

    # the protocol and the files delta-spark sees are those our log holds
    detail = sql(ds, f"DESCRIBE DETAIL {at}")[0]
    protocol = [a["protocol"] for a in _log(path) if "protocol" in a][-1]
    assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (
        protocol["minReaderVersion"],
        protocol["minWriterVersion"],
    )
    assert set(protocol.get("readerFeatures", [])) | set(protocol.get("writerFeatures", [])) <= set(
        detail["tableFeatures"]
    )
    from deltalake import DeltaTable

    assert detail["numFiles"] == len(DeltaTable(str(path)).file_uris())
    history = sql(ds, f"DESCRIBE HISTORY {at}")
    assert sorted(h["version"] for h in history) == list(range(_version(path) + 1))

    # delta-spark honours our txn: a write with our app id and the last checkpoint id is skipped
    app_id = [a["txn"] for a in _log(path) if "txn" in a][-1]["appId"]
    before = _version(path)
    (
        ds.createDataFrame([("dup", 0, 0, "dup")], "k1 string, k2 long, seq long, v string")
        .write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", table.next_id - 1)
        .save(str(path))
    )
    assert _version(path) == before, "delta-spark wrote a checkpoint's commit again despite our txn"

    # delta-spark's own commits: a property (and a checkpoint of its own on each commit from then on),
    # VACUUM of every file no longer referenced; our sink writes on, from delta-spark's checkpoint
    sql(ds, f"ALTER TABLE {at} SET TBLPROPERTIES ('delta.checkpointInterval' = '1')")
    assert list((path / "_delta_log").glob(f"{_version(path):020d}.checkpoint*.parquet")), "no delta-spark checkpoint"
    sql(ds, f"VACUUM {at} RETAIN 0 HOURS")
    table.check("delta-spark's ALTER TABLE and VACUUM")
    table.checkpoint(3, [("a", 0, 3, "z"), ("cold1", 1, 5, "again"), ("c", None, 0, "new")])
    table.checkpoint(0, [("cold2", 2, 9, "last"), ("a", 0, 2, "older: loses to seq 3")])
    table.check("2 checkpoints after delta-spark's commands")

    # OPTIMIZE rewrites the files (DVs applied): read the same by all; our upsert sink then refuses to
    # write over files it did not write (docs/delta-lake.md) until delta-spark's RESTORE undoes it
    before_optimize = _version(path)
    sql(ds, f"OPTIMIZE {at}")
    assert _version(path) == before_optimize + 1
    table.check("delta-spark's OPTIMIZE")
    with pytest.raises(SinkClaimedError, match=r"added \d+ file\(s\) this upsert sink did not write"):
        table.checkpoint(1, [("a", 0, 4, "refused")])
    sql(ds, f"RESTORE TABLE {at} TO VERSION AS OF {before_optimize}")
    table.check("delta-spark's RESTORE")
    table.checkpoint(2, [("a", 0, 4, "after restore"), ("d", 0, 0, "new")])
    table.check("a checkpoint after delta-spark's RESTORE")


@pytest.mark.parametrize(
    ("command", "operation"),
    [
        pytest.param("DELETE FROM {at} WHERE k1 = 'cold3'", "DELETE", marks=pytest.mark.full),
        pytest.param("OPTIMIZE {at}", "OPTIMIZE", marks=pytest.mark.full),
    ],
    ids=["delete", "optimize"],
)
def test_another_writer_between_stage_and_commit_is_a_conflict_and_nothing_is_committed(
    env: Env, command: str, operation: str
) -> None:
    """delta-spark deletes from (or rewrites) a file our staged upsert deletes from, after the step
    staged it and before the finalize commits: the commit is refused naming delta-spark's version and
    operation, the table keeps delta-spark's write alone, and after the way on the refusal names
    (delta-spark's ``RESTORE``) the same committables commit the checkpoint, each row once."""
    ds, table = env.delta_spark, Table(env, f"conflict-{operation.lower()}")
    path, at = table.harness.path, f"delta.`{table.harness.path}`"
    table.checkpoint(10, [("a", 0, 1, "x")])
    table.checkpoint(5, [("b", 1, 1, "y")])  # a second file: OPTIMIZE has files to compact
    c, table.next_id = table.next_id, table.next_id + 1
    rows = [("cold3", 0, 1, "changed"), ("a", 0, 2, "x2"), ("new", 2, 0, "n")]
    staged = table.harness.stage(c, 1, rows)
    since = _version(path)
    sql(ds, command.format(at=at))
    assert _version(path) == since + 1
    after_other = table.harness.readers()["delta-spark"]()
    refusal = rf"versions {since + 1} \({operation}\).*TO VERSION AS OF {since},"
    with pytest.raises(DocumentError, match=refusal):
        table.harness.commit(c, staged)
    assert _version(path) == since + 1, "the refused commit wrote a version"
    assert table.harness.readers()["delta-spark"]() == after_other, "the refused commit changed the table"

    sql(ds, f"RESTORE TABLE {at} TO VERSION AS OF {since}")
    table.check("delta-spark's RESTORE of its own write")
    table.harness.commit(c, staged)  # the finalize's next attempt
    table.model.commit(c, rows)
    table.check("the checkpoint committed after the RESTORE")


@pytest.mark.full  # delta-spark runs four MERGEs and writes: minutes on a loaded machine
@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_missing_column_is_written_as_delta_spark_writes_it(
    spark: Any, delta_spark: Any, tmp_path: Path, mode: str
) -> None:
    """``schema_evolution="additive"`` and an input lacking ``w``: our table and delta-spark's twin given the
    same inputs (an append; a ``MERGE … UPDATE SET * INSERT *`` with schema evolution) read the same with
    delta-spark, delta-rs and DuckDB: an appended row and a new key null in ``w``, an updated key keeping its
    value (key 1's in an update file, its bucket file's row deleted by a deletion vector)."""
    full, lacking = "k long, v string, w string", "k long, v string"
    inputs = [
        (full, [(i, f"v{i}", f"w{i}" if i % 2 else None) for i in range(6)]),
        (full, [(1, "u1", "w1-u"), (9, "v9", "w9")]),
        (lacking, [(1, "x1"), (3, "x3"), (4, "x4"), (20, "x20")]),
    ]
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    delta_spark.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")  # MERGE's schema evolution
    ours, twin = tmp_path / "ours", tmp_path / "twin"
    keys = ["k"] if mode == "upsert" else None
    sink = DeltaTableSink("out", Source("src"), str(ours), mode, keys, schema_evolution="additive")
    for checkpoint_id, (schema, rows) in enumerate(inputs, start=1):
        staged_and_committed(spark, sink, storage, checkpoint_id, rows, schema)
        given = delta_spark.createDataFrame(rows, schema)
        if checkpoint_id == 1 or mode == "append":
            given.write.format("delta").mode("append").save(str(twin))
        else:
            given.createOrReplaceTempView("given")
            sql(delta_spark, f"MERGE INTO delta.`{twin}` t USING given s ON t.k = s.k "
                             "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")  # fmt: skip
    expected = delta_spark_rows(delta_spark, twin, ["k", "v", "w"])
    assert {(3, "x3", "w3"), (1, "x1", "w1-u"), (20, "x20", None)} <= set(expected) or mode == "append"
    for reader, rows in {
        "delta-spark": delta_spark_rows(delta_spark, ours, ["k", "v", "w"]),
        "delta-rs": delta_rows(ours, ["k", "v", "w"]),
        "duckdb": duckdb_delta_rows(ours, ["k", "v", "w"]),
    }.items():
        assert sorted(rows, key=repr) == expected, f"{mode}: {reader} reads our table unlike delta-spark's twin"
