"""Windows mode: event-time windows (5-minute tumbling, 30-minute sessions) vs Structured Streaming.

A steady stream: checkpoint ``i`` holds ``events`` clicks of ``users`` users over the next 5 minutes
of event time, 30% of them up to 10 minutes out of order (never behind the watermark), 0.1% late
(more than a session gap behind it: dropped by every engine). Per shape, two fresh jobs alternate:
ours (FileSource → WindowAggregate ``emit="final"`` → ParquetTableSink append, trigger → step →
finalize as the provider's tasks run them, in process as the ``clickstream`` mode measures) and
Structured Streaming (``withWatermark`` + ``window``/``session_window``, append mode into its
Parquet file sink, RocksDB with changelog checkpointing, ``Trigger.AvailableNow`` per increment).
Both final tables are checked against pandas over the on-time rows the generator made.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from bench.inprocess import run_round, start_run
from bench.measure import MB, elapsed, footprint, listing, log, measured, written
from bench.report import machine_lines, verdict
from bench.sides import STORES, Ours, SideResult
from bench.workloads import land, read_parquet_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
COLUMNS = ["user", "window_start", "window_end", "clicks", "total"]
T0 = 1_700_000_000_000  # ms
SPAN_MS = 5 * 60_000  # event time per checkpoint
BOUND_MS = 10 * 60_000  # the watermark's bound of out-of-orderness
SIZE_MS = 5 * 60_000  # the tumbling window
GAP_MS = 30 * 60_000  # the session gap
SHAPES = ("tumbling", "session")


@dataclass(frozen=True)
class WindowSpec:
    increments: int
    events: int
    users: int
    seed: int


def stream(spec: WindowSpec) -> list[pd.DataFrame]:
    """The increments, each with an ``on_time`` column (False: late, to be dropped); deterministic in the spec."""
    rng = np.random.default_rng(spec.seed)
    width = max(6, len(str(spec.users - 1)))
    frames, top = [], None
    for i in range(spec.increments):
        n = spec.events
        ts = T0 + i * SPAN_MS + rng.integers(0, SPAN_MS, n)
        ts = ts - np.where(rng.random(n) < 0.3, rng.integers(0, BOUND_MS, n), 0)
        on_time = np.ones(n, dtype=bool)
        if top is not None:
            mark = top - BOUND_MS
            ts = np.maximum(ts, mark + 1)  # never behind the watermark: not late in any engine
            on_time = rng.random(n) >= 0.001
            ts = np.where(on_time, ts, mark - GAP_MS - rng.integers(1, 30 * 60_000, n))
        top = int(ts.max()) if top is None else max(top, int(ts.max()))
        users = np.char.add("u", np.char.zfill(rng.integers(0, spec.users, n).astype(str), width)).astype(object)
        frames.append(
            pd.DataFrame(
                {
                    "user": users,
                    "ts": pd.to_datetime(ts, unit="ms", utc=True),
                    "amount": rng.integers(1, 100, n),
                    "on_time": on_time,
                }
            )
        )
    return frames


def generate(data_dir: Path, spec: WindowSpec) -> tuple[list[Path], list[pd.DataFrame]]:
    """The increments as Parquet files (without ``on_time``), rewritten when the spec changed."""
    frames = stream(spec)
    files = [data_dir / f"events-{i:04d}.parquet" for i in range(1, spec.increments + 1)]
    manifest = data_dir / "manifest.json"
    if not (manifest.exists() and json.loads(manifest.read_text()) == asdict(spec) and all(f.exists() for f in files)):
        shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.mkdir(parents=True)
        for frame, path in zip(frames, files, strict=True):
            frame.drop(columns="on_time").to_parquet(path, index=False, coerce_timestamps="us")
        manifest.write_text(json.dumps(asdict(spec)))
    return files, frames


def truth(frames: list[pd.DataFrame], shape: str) -> pd.DataFrame:
    """The final windows of the on-time rows, by pandas: those whose end the last watermark passed."""
    rows = pd.concat(frames, ignore_index=True)
    mark = int(rows["ts"].astype("int64").max() // 1_000_000) - BOUND_MS  # late rows are earlier: no effect
    rows = rows[rows["on_time"]].copy()
    rows["ms"] = rows["ts"].astype("int64") // 1_000_000
    if shape == "tumbling":
        rows["window_start"] = rows["ms"] - rows["ms"] % SIZE_MS
        out = rows.groupby(["user", "window_start"]).agg(clicks=("ms", "size"), total=("amount", "sum")).reset_index()
        out["window_end"] = out["window_start"] + SIZE_MS
    else:
        rows = rows.sort_values(["user", "ms"])
        ends = (rows["ms"] + GAP_MS).groupby(rows["user"]).cummax()
        before = ends.groupby(rows["user"]).shift()
        rows["session"] = (before.isna() | (rows["ms"] > before)).cumsum()
        rows["end"] = rows["ms"] + GAP_MS
        out = (
            rows.groupby(["user", "session"])
            .agg(window_start=("ms", "min"), window_end=("end", "max"), clicks=("ms", "size"), total=("amount", "sum"))
            .reset_index()
        )
    return normalized(out[out["window_end"] <= mark], ms=True)


def normalized(df: pd.DataFrame, ms: bool = False) -> pd.DataFrame:
    df = df.reindex(columns=COLUMNS)  # a table nothing was emitted to has no columns
    if not ms:
        for c in ("window_start", "window_end"):
            df[c] = (pd.to_datetime(df[c], utc=True) - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
    df = df.astype({"user": str, "window_start": "int64", "window_end": "int64", "clicks": "int64", "total": "int64"})
    return df.sort_values(["user", "window_start"]).reset_index(drop=True)


class OursWindows(Ours):
    """Our pipeline: the shape's WindowAggregate, emitted when final into an append Parquet table."""

    def __init__(self, spark: SparkSession, root: Path, landing: Path, shape: str) -> None:
        self.shape = shape
        super().__init__(spark, root, landing)
        self.name = f"ours-{shape}"

    def nodes(self, landing: Path, clean_source: str, archive: str | None) -> list[Any]:
        from airflow_provider_checkpoint.dataflow import (
            FileSource,
            ParquetTableSink,
            WindowAggregate,
            session,
            tumbling,
        )

        source = FileSource("events", str(landing), "parquet", SCHEMA)
        window = tumbling("5 minutes") if self.shape == "tumbling" else session("30 minutes")
        aggs = {"clicks": "count", "total": "sum(amount)"}
        agg = WindowAggregate("windows", source, ["user"], "ts", window, aggs, watermark=("ts", "10 minutes"))
        return [source, agg, ParquetTableSink("windows_table", agg, str(self.table), mode="append")]

    def state_bytes(self) -> int:
        """On disk: every state file the retained checkpoints hold."""
        return sum(size for path, (size, *_) in listing(self.job_dir).items() if "/state/" in path)


class StreamingWindows:
    """Structured Streaming's own windowed aggregation, append mode into its Parquet file sink."""

    def __init__(self, spark: SparkSession, root: Path, landing: Path, shape: str) -> None:
        self.name, self.shape, self.spark, self.landing = f"ss-{shape}", shape, spark, landing
        self.checkpoint, self.table = root / "checkpoint", root / "table"

    def run(self, i: int) -> SideResult:
        from pyspark.sql import functions as F

        events = self.spark.readStream.schema(SCHEMA).parquet(str(self.landing)).withWatermark("ts", "10 minutes")
        window = F.window("ts", "5 minutes") if self.shape == "tumbling" else F.session_window("ts", "30 minutes")
        windows = events.groupBy(window.alias("w"), "user").agg(
            F.count(F.lit(1)).alias("clicks"), F.sum("amount").alias("total")
        )
        out = windows.select(
            "user", F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "clicks", "total"
        )
        writer = (
            out.writeStream.outputMode("append")
            .format("parquet")
            .option("path", str(self.table))
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
        )
        for key, value in STORES["rocksdb"].items():
            self.spark.conf.set(key, value)
        with measured(self.spark, (self.checkpoint, self.table)) as m:
            t0 = time.perf_counter()
            query = writer.start()
            query.awaitTermination()
            seconds = time.perf_counter() - t0
        chk, files_chk = written(m["before"], m["after"], lambda p: p.startswith(str(self.checkpoint) + "/"))
        state, _ = written(m["before"], m["after"], lambda p: p.startswith(str(self.checkpoint / "state") + "/"))
        table, files_table = written(m["before"], m["after"], lambda p: p.startswith(str(self.table) + "/"))
        progress = list(query.recentProgress)
        return SideResult(
            seconds=seconds,
            parts={},
            bytes_chk=chk,
            bytes_state=state,
            bytes_table=table,
            files=files_chk + files_table,
            spark_jobs=m["jobs"],
            cpu_ours=m["cpu"][0],
            cpu_other=m["cpu"][1],
            records_in=sum(p.numInputRows for p in progress),
        )

    def state_bytes(self) -> int:
        return footprint(listing(self.checkpoint / "state")) if (self.checkpoint / "state").exists() else 0

    def output(self) -> pd.DataFrame:
        return read_parquet_dir(self.table) if self.table.exists() else pd.DataFrame()


def run(spec: WindowSpec, work: Path) -> dict[str, Any]:
    """Both shapes, ours and Spark's alternating per increment; the raw figures (JSON-able)."""
    files, frames = generate(work / "data" / "windows", spec)
    run_dir = work / "run" / "windows"
    measured_run = start_run(run_dir)
    spark = measured_run.spark
    landing = run_dir / "landing"
    landing.mkdir(parents=True)
    sides: list[Any] = [
        cls(spark, run_dir / f"{cls.__name__}-{shape}", landing, shape)
        for shape in SHAPES
        for cls in (OursWindows, StreamingWindows)
    ]
    rows: list[dict[str, Any]] = []
    for i, data_file in enumerate(files, start=1):
        land(data_file, landing)
        started = time.perf_counter()
        results = run_round(sides, i, spark)
        wrong = {n: r.records_in for n, r in results.items() if r.records_in != len(frames[i - 1])}
        if wrong:
            log(f"!! increment {i}: records in {wrong}, expected {len(frames[i - 1])}")
        state = {side.name: side.state_bytes() for side in sides}
        rows.append({"increment": i, "results": results, "state_bytes": state})
        log(
            f"increment {i} ({elapsed(started):.0f}s): "
            + " | ".join(f"{n} {r.seconds:.2f}s state {state[n] / MB:.1f} MB" for n, r in results.items())
        )
    problems: dict[str, str] = {}
    for shape in SHAPES:
        expected = truth(frames, shape)
        for side in sides[SHAPES.index(shape) * 2 :][:2]:
            try:
                pd.testing.assert_frame_equal(normalized(side.output()), expected)
            except AssertionError as e:
                problems[side.name] = str(e)
        log(f"{shape}: {len(expected)} final windows in the pandas truth")
    return {"spec": spec, **measured_run.finish(), "rows": rows, "problems": problems}


def render(result: dict[str, Any]) -> str:
    spec: WindowSpec = result["spec"]
    rows = result["rows"]
    steady = rows[1:] or rows  # the first checkpoint builds the state from nothing
    lines = [
        f"### Event-time windows: {spec.events:,} events per checkpoint over {spec.users:,} users, "
        f"{spec.increments} checkpoints",
        "",
        *machine_lines(result),
        "",
        "| shape | ours s/checkpoint (median) | SS s/checkpoint (median) | time ratio | ours state MB "
        "(last) | SS state MB (last) | state ratio | state MB at ½ → end (ours, SS) |",
        "|---|---:|---:|---|---:|---:|---|---|",
    ]
    for shape in SHAPES:
        ours, ss = f"ours-{shape}", f"ss-{shape}"
        t_ours = median(r["results"][ours].seconds for r in steady)
        t_ss = median(r["results"][ss].seconds for r in steady)
        s_ours, s_ss = rows[-1]["state_bytes"][ours], rows[-1]["state_bytes"][ss]
        half = rows[len(rows) // 2]["state_bytes"]
        lines.append(
            f"| {shape} | {t_ours:.2f} | {t_ss:.2f} | {verdict(t_ours / t_ss, 0.5)} | {s_ours / MB:.1f} | "
            f"{s_ss / MB:.1f} | {verdict(s_ours / max(s_ss, 1), 0.6)} | {half[ours] / MB:.1f} → {s_ours / MB:.1f}, "
            f"{half[ss] / MB:.1f} → {s_ss / MB:.1f} |"
        )
    lines += [
        "",
        "Per checkpoint (seconds; state on disk in MB after it):",
        "",
        "| # | " + " | ".join(f"{s} s | {s} MB" for s in rows[0]["results"]) + " |",
        "|---:|" + "---:|---:|" * len(rows[0]["results"]),
    ]
    for r in rows:  # the sides in the first increment's order (run_round rotates who starts)
        cells = [f"{r['results'][n].seconds:.2f} | {r['state_bytes'][n] / MB:.1f}" for n in rows[0]["results"]]
        lines.append(f"| {r['increment']} | " + " | ".join(cells) + " |")
    ok = "equal to the pandas truth" if not result["problems"] else f"WRONG: {sorted(result['problems'])}"
    lines += ["", f"Final tables of every side: {ok}."]
    return "\n".join(lines)
