"""Upsert sinks side by side: DeltaTableSink, ParquetTableSink, delta-rs's own ``MERGE`` and delta-spark's
``MERGE`` on one table of ``--users`` keys.

Checkpoint 1 writes the whole table; each further checkpoint changes ``changed`` existing keys
(uniformly drawn). Per checkpoint and sink: the step time (stage), the finalize commit time
and the bytes the step wrote (the rewritten buckets). The ``merge`` side is a plain delta-rs table
(``write_deltalake``, then ``DeltaTable.merge(...).when_matched_update_all().when_not_matched_insert_all()``
of the same rows, read with pyarrow from the Parquet file the sinks' DataFrame is read from; a ``toArrow()``
of 10M rows does not fit the driver's JVM): its whole time, the read included, counts as commit. The
``spark-merge`` side is Delta Lake's own Spark connector (delta-spark, in
a Spark Connect server of its own with the jars ``scripts/install_delta_spark.sh`` fetches): the ``MERGE INTO
... WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *`` a Spark user runs in ``foreachBatch``
(``DeltaTable.merge(...).whenMatchedUpdateAll().whenNotMatchedInsertAll()`` is the same command) of the same
rows, cached in that session beforehand; its whole time counts as commit. Every table is checked against a
pandas ground truth after every checkpoint (read by delta-rs, outside the timings).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bench.inprocess import machine_facts, start_spark
from bench.measure import MB, CpuMeter, elapsed, log
from bench.report import machine_lines

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

REPO = Path(__file__).resolve().parents[2]


def _sinks(root: Path, buckets: int) -> dict[str, Any]:
    from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource, ParquetTableSink

    source = FileSource("src", str(root / "none"), "json", "x STRING")
    return {
        "delta": DeltaTableSink("t", source, str(root / "delta"), "upsert", ["user"], buckets=buckets),
        "parquet": ParquetTableSink("t", source, str(root / "parquet"), "upsert", ["user"], buckets),
    }


def _staged_bytes(table: Path, committables: list[dict[str, Any]]) -> int:
    """Bytes the step wrote: the staged files the committables name (before the commit moves them), with
    a Delta upsert's deletion vectors (inline ones go into the commit)."""
    adds = [a["size"] for c in committables for a in c.get("adds", [])]
    moves = [(table / staged).stat().st_size for c in committables for staged, _ in c.get("moves", [])]
    dvs = [d["new"] for c in committables for d in c.get("deletes", [])]
    dv_files = {next(table.glob(f"chk-*/**/{p.name}")) for p in map(Path, _dv_file_names(dvs))}
    inline = [d["sizeInBytes"] for d in dvs if d["storageType"] == "i"]
    return sum(adds) + sum(moves) + sum(inline) + sum(p.stat().st_size for p in dv_files)


def _dv_file_names(dvs: list[dict[str, Any]]) -> set[str]:
    from airflow_provider_checkpoint.connectors.delta.deletion_vectors import Descriptor

    files = (Descriptor("u", d["pathOrInlineDv"], d["offset"], 1, 1).file() for d in dvs if d["storageType"] == "u")
    return {f for f in files if f}


class Merge:
    """delta-rs's ``MERGE`` of the same rows into a table it wrote itself (copy-on-write: it rewrites
    every file holding a matched key)."""

    path: str

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def commit(self, landed: Path) -> int:
        """Merge the rows of the Parquet file ``landed`` (the first one creates the table); the bytes of the
        files it added."""
        from deltalake import DeltaTable, write_deltalake

        source = pq.read_table(landed)
        before = set(Path(self.path).glob("*.parquet"))
        if not before:
            write_deltalake(self.path, source)
        else:
            (
                DeltaTable(self.path)
                .merge(source, "t.user = s.user", source_alias="s", target_alias="t")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
        return sum(p.stat().st_size for p in set(Path(self.path).glob("*.parquet")) - before)


class SparkMerge:
    """delta-spark's ``MERGE`` of the same rows into a table it wrote itself, in a Spark Connect server
    running delta-spark (the batch is written to Parquet and cached there before the clock starts)."""

    def __init__(self, session: Any, path: Path, batches: Path) -> None:
        self.session, self.path, self.batches = session, str(path), batches

    def commit(self, batch: DataFrame, checkpoint_id: int) -> tuple[int, float]:
        """Merge ``batch`` (the first one creates the table); the bytes of the files it added, its seconds."""
        staged = str(self.batches / str(checkpoint_id))
        batch.write.parquet(staged)
        updates = self.session.read.parquet(staged).cache()
        updates.count()
        updates.createOrReplaceTempView("updates")
        before = set(Path(self.path).glob("*.parquet"))
        started = time.perf_counter()
        if not before:
            updates.write.format("delta").save(self.path)
        else:
            self.session.sql(
                f"MERGE INTO delta.`{self.path}` t USING updates u ON t.user = u.user "
                "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
            ).collect()
        seconds = elapsed(started)
        updates.unpersist()
        return sum(p.stat().st_size for p in set(Path(self.path).glob("*.parquet")) - before), seconds


@contextmanager
def _delta_spark(work: Path, shuffle_partitions: str) -> Iterator[Any]:
    """A remote session on a Spark Connect server running delta-spark (the interop tests' server)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    from tests.live.spark_connect import spark_connect_server
    from tests.spark.delta_spark import CONF, JARS

    found = sorted(JARS.glob("*.jar")) if any(JARS.glob(".complete-*")) else []
    if not found:
        raise SystemExit(f"no delta-spark jars in {JARS}: run scripts/install_delta_spark.sh")
    conf = {**CONF, "spark.jars": ",".join(map(str, found)), "spark.sql.shuffle.partitions": shuffle_partitions}
    with spark_connect_server(work / "run" / "delta-spark-server.log", conf=conf) as url:
        session = RemoteSession.builder.remote(url).create()  # create(): the classic session stays the active one
        try:
            yield session
        finally:
            session.stop()


def _read(name: str, table: Path) -> pa.Table:
    if name != "parquet":
        from deltalake import DeltaTable

        return pa.table(DeltaTable(str(table)).scan())  # scan() applies deletion vectors
    import pyarrow.dataset as ds

    return ds.dataset(str(table), format="parquet").to_table()


def _differs(got: pa.Table, truth: pd.DataFrame) -> bool:
    """Whether ``got`` holds other rows than ``truth`` (one row per user)."""
    labels = got.column("label").cast(pa.string())  # delta-rs reads strings as string_view, which take() lacks
    got = got.set_column(got.schema.get_field_index("label"), "label", labels).sort_by("user")
    want = truth.sort_values("user")
    if got.num_rows != len(want):
        return True
    same = [np.array_equal(got.column(c).to_numpy(), want[c].to_numpy()) for c in ("user", "total")]
    labels = got.column("label").combine_chunks()
    return not (all(same) and labels.equals(pa.array(want["label"], pa.string())))


def run(users: int, changed: list[int], buckets: int, work: Path, seed: int) -> dict[str, Any]:
    """Every side on every checkpoint, the order rotating by one per checkpoint; every table checked against
    the ground truth after every checkpoint."""
    sys.path.insert(0, str(REPO))
    load_before, cpu_all = os.getloadavg(), CpuMeter()
    spark, session_seconds = start_spark()
    root = work / "sink-upsert"
    shutil.rmtree(root, ignore_errors=True)
    (work / "run").mkdir(parents=True, exist_ok=True)
    with _delta_spark(work, spark.conf.get("spark.sql.shuffle.partitions") or "8") as remote:
        spark_merge = SparkMerge(remote, root / "spark-merge", root / "batches")
        result = _run(spark, spark_merge, users, changed, buckets, root, seed)
    return {
        "users": users,
        "buckets": buckets,
        **result,
        "machine": machine_facts(spark, session_seconds),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "other_processes_cores": round(cpu_all.stop()[1], 2),
    }


def _run(
    spark: Any, spark_merge: SparkMerge, users: int, changed: list[int], buckets: int, root: Path, seed: int
) -> dict[str, Any]:
    from airflow_provider_checkpoint.storage import JobStorage
    from tests.spark.helpers import step_context  # the step context the Spark tests build

    storage = JobStorage.for_job(str(root / "chk"), "bench")
    rng = np.random.default_rng(seed)
    truth = pd.DataFrame({"user": np.arange(users, dtype=np.int64), "total": rng.integers(0, 1000, users)})
    truth["label"] = "u" + truth["user"].astype(str)
    sinks = _sinks(root, buckets)
    merge = Merge(root / "merge")
    tables = {**{n: s.path for n, s in sinks.items()}, "merge": merge.path, "spark-merge": spark_merge.path}
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    batches = [truth, *(truth.sample(n, random_state=seed + i).assign(total=-i) for i, n in enumerate(changed, 1))]
    for checkpoint_id, batch in enumerate(batches, start=1):
        landed = root / "input" / f"{checkpoint_id}.parquet"  # read by Spark: no 10M-row pandas conversion
        landed.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pandas(batch, preserve_index=False), landed)
        df = spark.read.parquet(str(landed)).cache()
        df.count()
        names = [*sinks, "merge", "spark-merge"]
        shift = (checkpoint_id - 1) % len(names)
        for name in names[shift:] + names[:shift]:
            if name == "merge":
                started = time.perf_counter()
                step, written = 0.0, merge.commit(landed)
                commit = elapsed(started)
            elif name == "spark-merge":
                step, (written, commit) = 0.0, spark_merge.commit(df, checkpoint_id)
            else:
                sink = sinks[name]
                started = time.perf_counter()
                committables = sink.stage(step_context(spark, storage, checkpoint_id), df)
                step = elapsed(started)
                written = _staged_bytes(Path(sink.path), committables)
                started = time.perf_counter()
                sink.commit(checkpoint_id, committables)
                commit = elapsed(started)
            rows.append(
                {
                    "sink": name,
                    "checkpoint": checkpoint_id,
                    "changed": len(batch),
                    "step_s": step,
                    "commit_s": commit,
                    "written_bytes": written,
                }
            )
            log(
                f"{name} checkpoint {checkpoint_id}: {len(batch)} rows, step {step:.2f}s, commit {commit:.3f}s, "
                f"{written / MB:.1f} MB written"
            )
        df.unpersist()
        truth = pd.concat([truth[~truth.user.isin(batch.user)], batch])
        problems += [
            f"{name}: table differs from the ground truth after checkpoint {checkpoint_id}"
            for name, path in tables.items()
            if _differs(_read(name, Path(path)), truth)
        ]
    table_bytes = {n: sum(p.stat().st_size for p in Path(path).rglob("*.parquet")) for n, path in tables.items()}
    return {"rows": rows, "problems": problems, "table_bytes": table_bytes}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"### Upsert sinks: Delta vs Parquet vs delta-rs MERGE vs delta-spark MERGE ({result['users']:,} keys, "
        f"{result['buckets']} buckets)",
        "",
        *machine_lines(result),
        "",
        "Checkpoint 1 writes the table; each later one changes N uniformly drawn existing keys. "
        "`written` = bytes the step wrote (Parquet: rewritten buckets; Delta: changed rows, deletion vectors, "
        "compacted files; MERGE: the files it rewrote); `commit` = finalize's commit (MERGE: the whole merge); "
        "`total / MERGE's` = step + commit against delta-rs's `MERGE` of the same rows, `total / spark MERGE's` "
        "against delta-spark's (`spark-merge`, in its own Spark Connect server).",
        "",
        "| changed keys | sink | step s | commit s | total / MERGE's | total / spark MERGE's | step / Parquet's "
        "| written MB | written / MERGE's |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["checkpoint"], r["sink"]): r for r in result["rows"]}
    for (checkpoint, sink), r in sorted(by.items()):
        if checkpoint == 1:
            continue
        parquet, merge = by[(checkpoint, "parquet")], by[(checkpoint, "merge")]
        total = r["step_s"] + r["commit_s"]
        step = f"{r['step_s'] / parquet['step_s']:.2f}" if "merge" not in sink else ""
        ratio = r["written_bytes"] / max(merge["written_bytes"], 1)
        lines.append(
            f"| {r['changed']:,} | {sink} | {r['step_s']:.2f} | {r['commit_s']:.3f} | {total / merge['commit_s']:.2f} "
            f"| {total / by[(checkpoint, 'spark-merge')]['commit_s']:.2f} | {step} | {r['written_bytes'] / MB:.2f} "
            f"| {ratio:.3f} |"
        )
    lines.append("")
    lines.append(
        f"Table size after the run: {', '.join(f'{n} {b / MB:.1f} MB' for n, b in result['table_bytes'].items())} "
        "(Delta keeps removed files for time travel until VACUUM). "
        f"Ground truth: {'every table matches' if not result['problems'] else '; '.join(result['problems'])}."
    )
    return "\n".join(lines)
