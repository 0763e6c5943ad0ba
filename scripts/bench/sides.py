"""The sides of the comparison, each running one increment per call of ``run``.

``Ours`` drives the provider's pipeline the way its Airflow tasks do (trigger → step →
finalize); ``Streaming`` runs the same job as a Structured Streaming query started once per
increment with ``availableNow``, on the default or the RocksDB state store.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd

from bench.breakdown import recorded
from bench.measure import footprint, listing, measured, written
from bench.workloads import AGGS, COLUMNS, SCHEMA, read_parquet_dir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
STORES = {
    # as a knowledgeable user configures RocksDB: changelog checkpointing on
    "rocksdb": {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    },
    "default": {"spark.sql.streaming.stateStore.providerClass": HDFS},
}


@dataclass
class SideResult:
    seconds: float
    parts: dict[str, float]
    bytes_chk: int
    bytes_state: int
    bytes_table: int
    files: int
    spark_jobs: int
    cpu_ours: float
    cpu_other: float
    records_in: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def bytes_total(self) -> int:
        return self.bytes_chk + self.bytes_table


class Side(Protocol):
    name: str

    def run(self, i: int) -> SideResult: ...

    def output(self) -> pd.DataFrame: ...

    def footprint(self) -> int: ...


class Ours:
    """The provider's pipeline, one checkpoint per call of :meth:`run`."""

    name = "ours"

    def __init__(
        self, spark: SparkSession, root: Path, landing: Path, retained: int = 3, clean_source: str = "off"
    ) -> None:
        from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
        from airflow_provider_checkpoint.core.settings import CheckpointSettings
        from airflow_provider_checkpoint.dataflow import PipelineGraph
        from airflow_provider_checkpoint.storage import JobStorage

        self.spark = spark
        self.job_dir = root / "checkpoints" / "bench"
        self.table = root / "table"
        archive = str(root / "archive") if clean_source == "archive" else None
        self.graph = PipelineGraph(self.nodes(landing, clean_source, archive))
        self.storage = JobStorage.for_job(str(root / "checkpoints"), "bench")
        settings = CheckpointSettings(retained_checkpoints=retained)
        self.coordinator = CheckpointCoordinator(self.storage, self.graph, settings)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        self.table.mkdir(parents=True, exist_ok=True)
        self.profile = False  # record where the next checkpoints' time goes (bench.breakdown)

    def nodes(self, landing: Path, clean_source: str, archive: str | None) -> list[Any]:
        """The pipeline: per-user totals of the click events, upserted into a Parquet table."""
        from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink

        source = FileSource("events", str(landing), "json", SCHEMA, clean_source=clean_source, archive_dir=archive)
        totals = KeyedAggregate("user_totals", source, keys=["user"], aggs=AGGS)
        return [
            source,
            totals,
            ParquetTableSink("user_totals_table", totals, str(self.table), mode="upsert", keys=["user"]),
        ]

    def run(self, i: int) -> SideResult:
        from airflow_provider_checkpoint.spark.runner import run_step

        profile = recorded(self.spark) if self.profile else nullcontext({})
        with measured(self.spark, (self.job_dir, self.table)) as m, profile as breakdown:
            t0 = time.perf_counter()
            plan = self.coordinator.trigger(f"bench-run-{i}")
            t1 = time.perf_counter()
            settings = self.coordinator.settings
            acks = [
                run_step(self.spark, self.storage, self.graph, step, plan, 1, settings=settings) for step in plan.steps
            ]
            t2 = time.perf_counter()
            completed = self.coordinator.finalize(plan, acks)
            t3 = time.perf_counter()
        before, after = m["before"], m["after"]
        job = str(self.job_dir) + "/"
        chk, files_chk = written(before, after, lambda p: p.startswith(job))
        state, _ = written(before, after, lambda p: p.startswith(job) and "/state/" in p)
        table, files_table = written(before, after, lambda p: p.startswith(str(self.table) + "/"))
        return SideResult(
            seconds=t3 - t0,
            parts={"trigger": t1 - t0, "step": t2 - t1, "finalize": t3 - t2},
            bytes_chk=chk,
            bytes_state=state,
            bytes_table=table,
            files=files_chk + files_table,
            spark_jobs=m["jobs"],
            cpu_ours=m["cpu"][0],
            cpu_other=m["cpu"][1],
            records_in=int(acks[0].metrics.get("records_in") or 0),
            info={
                "checkpoint_id": completed.checkpoint_id,
                "metadata_bytes": self.metadata_bytes(),
                **({"breakdown": breakdown} if self.profile else {}),
            },
        )

    def metadata_bytes(self) -> int:
        """Size of the newest ``chk-*/_metadata`` (the storage layout, read as a user would)."""
        found = sorted(self.job_dir.glob("chk-*/_metadata"), key=lambda p: int(p.parent.name.split("-")[-1]))
        return found[-1].stat().st_size if found else 0

    def output(self) -> pd.DataFrame:
        return read_parquet_dir(self.table)

    def footprint(self) -> int:
        return footprint(listing(self.job_dir, self.table))


class VersionedTable:
    """A ``foreachBatch`` target for Structured Streaming's ``update`` output: each batch publishes
    (previous table − changed users) ∪ changed rows as a new full version ``table-versions/v-<batch>``,
    atomically, by replacing the symlink ``table``; a replayed batch already published is skipped."""

    def __init__(self, root: Path) -> None:
        self.versions, self.table = root / "table-versions", root / "table"
        self.versions.mkdir(parents=True, exist_ok=True)

    def current(self) -> int | None:
        if not os.path.islink(self.table):
            return None
        return int(re.fullmatch(r"v-(\d+)", Path(os.readlink(self.table)).name).group(1))  # type: ignore[union-attr]

    def merge(self, batch: DataFrame, batch_id: int, columns: list[str] | None, files: int) -> None:
        current = self.current()
        if current is not None and current >= batch_id:
            return  # a replayed batch that was already published
        changed = batch.persist()
        merged = changed
        if current is not None:
            old = batch.sparkSession.read.parquet(str(self.versions / f"v-{current:010d}"))
            merged = old.join(changed.select("user"), "user", "left_anti").unionByName(changed)
        target = self.versions / f"v-{batch_id:010d}"
        (merged.select(*columns) if columns else merged).coalesce(files).write.mode("overwrite").parquet(str(target))
        changed.unpersist()
        link = self.table.parent / f".table.{uuid.uuid4().hex}"
        os.symlink(f"{self.versions.name}/{target.name}", link)
        os.replace(link, self.table)  # atomic publish
        for old_version in self.versions.iterdir():
            if old_version.name != target.name:
                shutil.rmtree(old_version)


class Streaming:
    """The same job as a Structured Streaming query, restarted per increment (availableNow).

    ``store`` picks the state store (:data:`STORES`); its settings are applied to the session
    right before each start (Spark records them in the checkpoint's offset log).
    """

    def __init__(self, spark: SparkSession, root: Path, landing: Path, store: str = "rocksdb") -> None:
        if store not in STORES:
            raise ValueError(f"unknown state store {store!r}: expected one of {', '.join(STORES)}")
        self.name = f"ss-{store}"
        self.store = store
        self.spark = spark
        self.landing = landing
        self.checkpoint = root / "checkpoint"
        self.published = VersionedTable(root)
        self.table = self.published.table
        self.checkpoint.mkdir(parents=True, exist_ok=True)

    def run(self, i: int) -> SideResult:
        from pyspark.sql import functions as F

        stream = self.spark.readStream.schema(SCHEMA).json(str(self.landing))
        totals = stream.groupBy("user").agg(
            F.count(F.lit(1)).alias("events"), F.min("ts").alias("first_seen"), F.max("ts").alias("last_seen")
        )
        writer = (
            totals.writeStream.outputMode("update")
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            # the table alone (no session) goes into the function: over Spark Connect it is pickled to the server
            .foreachBatch(functools.partial(self.published.merge, columns=COLUMNS, files=8))
        )
        for key, value in STORES[self.store].items():
            self.spark.conf.set(key, value)
        with measured(self.spark, (self.checkpoint, self.published.versions)) as m:
            t0 = time.perf_counter()
            query = writer.start()
            query.awaitTermination()
            t1 = time.perf_counter()
        before, after = m["before"], m["after"]
        chk, files_chk = written(before, after, lambda p: p.startswith(str(self.checkpoint) + "/"))
        state, _ = written(before, after, lambda p: p.startswith(str(self.checkpoint / "state") + "/"))
        table, files_table = written(before, after, lambda p: p.startswith(str(self.published.versions) + "/"))
        progress = list(query.recentProgress)
        durations: dict[str, float] = {}
        for p in progress:
            for key, ms in (p.durationMs or {}).items():
                durations[key] = durations.get(key, 0.0) + ms / 1000
        add_batch = durations.get("addBatch", 0.0)
        return SideResult(
            seconds=t1 - t0,
            parts={"add_batch": add_batch, "other": t1 - t0 - add_batch},
            bytes_chk=chk,
            bytes_state=state,
            bytes_table=table,
            files=files_chk + files_table,
            spark_jobs=m["jobs"],
            cpu_ours=m["cpu"][0],
            cpu_other=m["cpu"][1],
            records_in=sum(p.numInputRows for p in progress),
            info={
                "batches": sorted({p.batchId for p in progress if p.numInputRows}),
                "durations": {k: round(v, 3) for k, v in durations.items()},
            },
        )

    def output(self) -> pd.DataFrame:
        return read_parquet_dir(self.table)

    def footprint(self) -> int:
        return footprint(listing(self.checkpoint, self.published.versions))
