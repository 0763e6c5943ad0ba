"""Upsert sinks side by side: DeltaTableSink, ParquetTableSink and delta-rs's own ``MERGE`` on one
table of ``--users`` keys.

Checkpoint 1 writes the whole table; each further checkpoint changes ``changed`` existing keys
(uniformly drawn). Per checkpoint and sink: the step time (stage), the finalize commit time
and the bytes the step wrote (the rewritten buckets). The ``merge`` side is a plain delta-rs table
(``write_deltalake``, then ``DeltaTable.merge(...).when_matched_update_all().when_not_matched_insert_all()``
of the same cached Spark DataFrame, taken to Arrow with ``toArrow()`` as a user replacing the sink would):
its whole time counts as commit. Every table is checked against a pandas ground truth at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

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

    def commit(self, batch: DataFrame) -> int:
        """Merge ``batch`` (the first one creates the table); the bytes of the files it added."""
        from deltalake import DeltaTable, write_deltalake

        source = batch.toArrow()
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


def _read(name: str, table: Path) -> pd.DataFrame:
    if name in ("delta", "merge"):
        import pyarrow as pa
        from deltalake import DeltaTable

        return pa.table(DeltaTable(str(table)).scan()).to_pandas()  # scan() applies deletion vectors
    import pyarrow.dataset as ds

    return ds.dataset(str(table), format="parquet").to_table().to_pandas()


def run(users: int, changed: list[int], buckets: int, work: Path, seed: int) -> dict[str, Any]:
    """Every side on every checkpoint, the order rotating by one per checkpoint; then the ground truth."""
    from airflow_provider_checkpoint.storage import JobStorage

    sys.path.insert(0, str(REPO))
    from tests.spark.helpers import step_context  # the step context the Spark tests build

    load_before, cpu_all = os.getloadavg(), CpuMeter()
    spark, session_seconds = start_spark()
    root = work / "sink-upsert"
    shutil.rmtree(root, ignore_errors=True)
    (work / "run").mkdir(parents=True, exist_ok=True)
    storage = JobStorage.for_job(str(root / "chk"), "bench")
    rng = np.random.default_rng(seed)
    truth = pd.DataFrame({"user": np.arange(users, dtype=np.int64), "total": rng.integers(0, 1000, users)})
    truth["label"] = "u" + truth["user"].astype(str)
    sinks = _sinks(root, buckets)
    merge = Merge(root / "merge")
    rows: list[dict[str, Any]] = []
    batches = [truth, *(truth.sample(n, random_state=seed + i).assign(total=-i) for i, n in enumerate(changed, 1))]
    for checkpoint_id, batch in enumerate(batches, start=1):
        df = spark.createDataFrame(batch).cache()
        df.count()
        names = [*sinks, "merge"]
        shift = (checkpoint_id - 1) % len(names)
        for name in names[shift:] + names[:shift]:
            if name == "merge":
                started = time.perf_counter()
                step, written = 0.0, merge.commit(df)
                commit = elapsed(started)
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
    problems = []
    tables = {**{n: s.path for n, s in sinks.items()}, "merge": merge.path}
    for name, path in tables.items():
        got = _read(name, Path(path)).sort_values("user").reset_index(drop=True)
        want = truth.sort_values("user").reset_index(drop=True)[got.columns]
        if not got.astype(str).equals(want.astype(str)):
            problems.append(f"{name}: table differs from the ground truth")
    table_bytes = {n: sum(p.stat().st_size for p in Path(path).rglob("*.parquet")) for n, path in tables.items()}
    return {
        "users": users,
        "buckets": buckets,
        "rows": rows,
        "problems": problems,
        "table_bytes": table_bytes,
        "machine": machine_facts(spark, session_seconds),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "other_processes_cores": round(cpu_all.stop()[1], 2),
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"### Upsert sinks: Delta vs Parquet vs delta-rs MERGE ({result['users']:,} keys, {result['buckets']} buckets)",
        "",
        *machine_lines(result),
        "",
        "Checkpoint 1 writes the table; each later one changes N uniformly drawn existing keys. "
        "`written` = bytes the step wrote (Parquet: rewritten buckets; Delta: changed rows, deletion vectors, "
        "compacted files; MERGE: the files it rewrote); `commit` = finalize's commit (MERGE: the whole merge); "
        "`total / MERGE's` = step + commit against delta-rs's `MERGE` of the same rows.",
        "",
        "| changed keys | sink | step s | commit s | total / MERGE's | step / Parquet's | written MB "
        "| written / MERGE's |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["checkpoint"], r["sink"]): r for r in result["rows"]}
    for (checkpoint, sink), r in sorted(by.items()):
        if checkpoint == 1:
            continue
        parquet, merge = by[(checkpoint, "parquet")], by[(checkpoint, "merge")]
        total = (r["step_s"] + r["commit_s"]) / merge["commit_s"]
        step = f"{r['step_s'] / parquet['step_s']:.2f}" if sink != "merge" else ""
        ratio = r["written_bytes"] / max(merge["written_bytes"], 1)
        lines.append(
            f"| {r['changed']:,} | {sink} | {r['step_s']:.2f} | {r['commit_s']:.3f} | {total:.2f} | {step} | "
            f"{r['written_bytes'] / MB:.2f} | {ratio:.3f} |"
        )
    lines.append("")
    lines.append(
        f"Table size after the run: {', '.join(f'{n} {b / MB:.1f} MB' for n, b in result['table_bytes'].items())} "
        "(Delta keeps removed files for time travel until VACUUM). "
        f"Ground truth: {'every table matches' if not result['problems'] else '; '.join(result['problems'])}."
    )
    return "\n".join(lines)
