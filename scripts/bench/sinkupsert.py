"""Upsert sinks side by side: DeltaTableSink vs ParquetTableSink on one table of ``--users`` keys.

Checkpoint 1 writes the whole table; each further checkpoint changes ``changed`` existing keys
(uniformly drawn). Per checkpoint and sink: the step time (stage), the finalize commit time
and the bytes the step wrote (the rewritten buckets). Both tables are checked against a
pandas ground truth at the end.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.inprocess import start_spark
from bench.measure import MB, elapsed, log

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
    from airflow_provider_checkpoint.dataflow.deletion_vectors import Descriptor

    files = (Descriptor("u", d["pathOrInlineDv"], d["offset"], 1, 1).file() for d in dvs if d["storageType"] == "u")
    return {f for f in files if f}


def _read(name: str, table: Path) -> pd.DataFrame:
    if name == "delta":
        import pyarrow as pa
        from deltalake import DeltaTable

        return pa.table(DeltaTable(str(table)).scan()).to_pandas()  # scan() applies deletion vectors
    import pyarrow.dataset as ds

    return ds.dataset(str(table), format="parquet").to_table().to_pandas()


def run(users: int, changed: list[int], buckets: int, work: Path, seed: int) -> dict[str, Any]:
    from airflow_provider_checkpoint.storage import JobStorage

    sys.path.insert(0, str(REPO))
    from tests.spark.helpers import step_context  # the step context the Spark tests build

    spark, _ = start_spark()
    root = work / "sink-upsert"
    shutil.rmtree(root, ignore_errors=True)
    (work / "run").mkdir(parents=True, exist_ok=True)
    storage = JobStorage.for_job(str(root / "chk"), "bench")
    rng = np.random.default_rng(seed)
    truth = pd.DataFrame({"user": np.arange(users, dtype=np.int64), "total": rng.integers(0, 1000, users)})
    truth["label"] = "u" + truth["user"].astype(str)
    sinks = _sinks(root, buckets)
    rows: list[dict[str, Any]] = []
    batches = [truth, *(truth.sample(n, random_state=seed + i).assign(total=-i) for i, n in enumerate(changed, 1))]
    for checkpoint_id, batch in enumerate(batches, start=1):
        df = spark.createDataFrame(batch).cache()
        df.count()
        for name, sink in sinks.items():
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
    for name, sink in sinks.items():
        got = _read(name, Path(sink.path)).sort_values("user").reset_index(drop=True)
        want = truth.sort_values("user").reset_index(drop=True)[got.columns]
        if not got.astype(str).equals(want.astype(str)):
            problems.append(f"{name}: table differs from the ground truth")
    table_bytes = {n: sum(p.stat().st_size for p in Path(s.path).rglob("*.parquet")) for n, s in sinks.items()}
    return {"users": users, "buckets": buckets, "rows": rows, "problems": problems, "table_bytes": table_bytes}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"### Upsert sinks: Delta vs Parquet ({result['users']:,} keys, {result['buckets']} buckets)",
        "",
        "Checkpoint 1 writes the table; each later one changes N uniformly drawn existing keys. "
        "`written` = bytes the step wrote (Parquet: rewritten buckets; Delta: changed rows, deletion vectors, "
        "compacted files); `commit` = finalize's commit.",
        "",
        "| changed keys | sink | step s | step / Parquet's | commit s | written MB | written / Parquet's |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    by = {(r["checkpoint"], r["sink"]): r for r in result["rows"]}
    for (checkpoint, sink), r in sorted(by.items()):
        if checkpoint == 1:
            continue
        parquet = by[(checkpoint, "parquet")]
        ratio = r["written_bytes"] / max(parquet["written_bytes"], 1)
        lines.append(
            f"| {r['changed']:,} | {sink} | {r['step_s']:.2f} | {r['step_s'] / parquet['step_s']:.2f} | "
            f"{r['commit_s']:.3f} | {r['written_bytes'] / MB:.2f} | {ratio:.3f} |"
        )
    lines.append("")
    lines.append(
        f"Table size after the run: {', '.join(f'{n} {b / MB:.1f} MB' for n, b in result['table_bytes'].items())} "
        "(Delta keeps removed files for time travel until VACUUM). "
        f"Ground truth: {'both tables match' if not result['problems'] else '; '.join(result['problems'])}."
    )
    return "\n".join(lines)
