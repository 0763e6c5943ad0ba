"""File sources: a landing directory whose files are each processed exactly once."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.base.sink import known_table_url
from airflow_provider_checkpoint.connectors.files import dead_letters, driver_reads
from airflow_provider_checkpoint.connectors.files.landing import check_clean_source, hidden
from airflow_provider_checkpoint.connectors.files.landing_source import LandingFiles
from airflow_provider_checkpoint.connectors.files.malformed import CORRUPT, dead_letter_rows, good_records, judge
from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.dataflow.defaults import SourceDefaults, check_malformed_policy, resolve_malformed
from airflow_provider_checkpoint.dataflow.graph import Sink, Source
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError
from airflow_provider_checkpoint.fileio import scans as file_scans
from airflow_provider_checkpoint.fileio.driver_read import DRIVER_READ_BYTES
from airflow_provider_checkpoint.fileio.scans import FileColumn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

_FORMATS = ("json", "csv", "parquet")


class FileSource(LandingFiles, Source):
    """Files landing in a directory (recursively), in ``json`` (JSON Lines), ``csv`` or ``parquet``.

    The barrier adds the files visible at trigger time to the files already processed;
    each file is processed by exactly one completed checkpoint, also when files arrive
    while a checkpoint runs (they belong to the next barrier). Files whose name or
    directory starts with ``.`` or ``_`` are ignored: writers should land files under such
    a name and rename them when complete. A file that changes size after it was cut into a
    barrier fails the step with a clear error, because it would break exactly-once.

    **Bounded position.** The position lists the processed files that are still visible
    (:mod:`~airflow_provider_checkpoint.connectors.files.positions`): a visible file not in it
    is new, whatever its modification time, so a late file is still read exactly once and
    no lateness bound can drop data. We chose this over a modification-time watermark
    with a lateness bound because a file older than such a watermark cannot be told apart
    from a processed one without remembering it, which is the unbounded list again. The
    position stays small when processed files leave the landing directory:
    ``clean_source="archive"`` (moved under ``archive_dir``, same relative name) or
    ``"delete"``, applied only after the checkpoint that read a file has committed
    (idempotent; a crash in between is finished by the next trigger). With
    ``clean_source="off"`` the position is as large as the processed files you keep.

    ``max_files_per_checkpoint`` splits a backlog over several checkpoints, oldest files
    (modification time, then name) first.

    **Date-partitioned landing directories.** ``partition_pattern`` (a ``strptime``
    format of the partition directories, e.g. ``dt=%Y-%m-%d`` or ``%Y/%m/%d``) bounds the
    listing and the position with ``clean_source="off"`` too: partitions dated more than
    ``partition_lateness`` before the newest one are closed once all their files are
    processed, and are no longer listed. This is a promise by the writer: a file landed
    in a closed partition is not read (land late data in an open partition).

    **Small Parquet inputs on the driver.** When this source feeds only a sink that takes rows on the
    driver (a ``DeltaTableSink`` or ``ParquetTableSink`` upsert merged there, a ``PostgresTableSink``),
    Parquet files of at most ``driver_read_bytes`` in all (16 MiB by default; ``0``: never) are read by
    pyarrow on the driver and handed to the sink: no Spark job. Only where that gives exactly Spark's rows
    (flat declared types, the file's types equal to them, names matching in case, no date or timestamp
    Spark would rebase; :mod:`~airflow_provider_checkpoint.fileio.driver_read`), else Spark reads.

    **JSON inputs of a keyed aggregate on the driver.** When this source feeds only an operator that reduces
    its rows on the driver (:meth:`~airflow_provider_checkpoint.dataflow.operator.StatefulOperator.takes_source_rows`)
    and the checkpoint merges there, JSON files are parsed by pyarrow on the driver where that gives exactly
    Spark's rows with none malformed (:mod:`~airflow_provider_checkpoint.connectors.files.json_driver`), else
    Spark reads them.

    **Malformed records** (not parseable, or not matching ``schema``; JSON and CSV) with
    ``on_malformed="fail"`` fail the step with an error naming the file and line; nothing of
    that checkpoint is committed, and the next run proceeds once the file is fixed or
    removed. With ``"dead_letter"`` the good records go on into the pipeline and the
    malformed ones go to a dead-letter table (:mod:`.dead_letters`) committed exactly once
    with the checkpoint: ``dead_letter_path`` (with this source's ``storage_options``), else
    ``<pipeline dead_letter_path>/<uid>``. Either way a checkpoint in which more than
    ``max_malformed_fraction`` of this source's records are malformed is declined
    (:class:`TooManyMalformedError`, no retry). ``None`` takes the pipeline's setting
    (:class:`~airflow_provider_checkpoint.dataflow.defaults.SourceDefaults`: ``"fail"``, 0.5).
    """

    def __init__(
        self,
        uid: str,
        path: str,
        format: str,
        schema: str,
        pattern: str = "*",
        options: dict[str, str] | None = None,
        storage_options: dict[str, Any] | None = None,
        max_files_per_checkpoint: int | None = None,
        clean_source: str = "off",
        archive_dir: str | None = None,
        partition_pattern: str | None = None,
        partition_lateness: timedelta = timedelta(days=1),
        on_malformed: str | None = None,
        max_malformed_fraction: float | None = None,
        dead_letter_path: str | None = None,
        watermark: tuple[str, str] | None = None,
        driver_read_bytes: int = DRIVER_READ_BYTES,
    ) -> None:
        super().__init__(uid, watermark)
        if format not in _FORMATS:
            raise PipelineDefinitionError(f"{uid}: format must be one of {_FORMATS}, got {format!r}")
        check_malformed_policy(uid, on_malformed, max_malformed_fraction)
        if format == "parquet" and on_malformed == "dead_letter":
            raise PipelineDefinitionError(f"{uid}: on_malformed='dead_letter' applies to json and csv, not parquet")
        if dead_letter_path is not None and on_malformed == "fail":
            raise PipelineDefinitionError(f"{uid}: dead_letter_path needs on_malformed='dead_letter'")
        self._own_policy = (on_malformed, max_malformed_fraction)
        self.on_malformed = on_malformed or "fail"
        self.max_malformed_fraction = 0.5 if max_malformed_fraction is None else max_malformed_fraction
        self.dead_letter_path = dead_letter_path
        if max_files_per_checkpoint is not None and max_files_per_checkpoint < 1:
            raise PipelineDefinitionError(f"{uid}: max_files_per_checkpoint must be at least 1")
        self.path = path
        self.format = format
        self.schema = schema
        self.pattern = pattern
        self.options = dict(options or {})
        self.storage_options = dict(storage_options or {})
        self.max_files_per_checkpoint = max_files_per_checkpoint
        self.clean_source = clean_source
        self.archive_dir = archive_dir
        check_clean_source(uid, path, clean_source, archive_dir)
        if partition_pattern is not None and (
            not partition_pattern or partition_pattern.startswith("/") or ".." in partition_pattern.split("/")
        ):
            raise PipelineDefinitionError(f"{uid}: partition_pattern {partition_pattern!r} must be a relative format")
        if partition_lateness < timedelta(0):
            raise PipelineDefinitionError(f"{uid}: partition_lateness must not be negative")
        self.partition_pattern = partition_pattern
        self.partition_lateness = partition_lateness
        if driver_read_bytes < 0:
            raise PipelineDefinitionError(f"{uid}: driver_read_bytes must not be negative")
        self.driver_read_bytes = driver_read_bytes

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": self.path, "format": self.format}

    def declared_schema(self) -> str:
        return self.schema

    def reads_target(self, target: str) -> bool:
        """Whether a table written at ``target`` lies in the landing directory, not under a hidden name,
        with data files (``*.parquet``) that ``pattern`` matches."""
        landing = known_table_url(self.uid, self.path)
        if landing is None or (target != landing and not target.startswith(landing + "/")):
            return False
        inside = target[len(landing) + 1 :]
        return not (inside and hidden(inside)) and fnmatch.fnmatch("part-00000.parquet", self.pattern)

    def to_spec(self) -> JsonDict:
        """What decides which files are new: location, format, pattern and partitions (lateness in seconds)."""
        return {
            "uid": self.uid,
            "path": self.path,
            "format": self.format,
            "schema": self.schema,
            "pattern": self.pattern,
            "options": self.options,
            "storage_options": self.storage_options,
            "partition_pattern": self.partition_pattern,
            "partition_lateness": self.partition_lateness.total_seconds(),
        }

    @classmethod
    def from_spec(cls, spec: JsonDict) -> FileSource:
        fields = dict(spec)
        lateness = timedelta(seconds=float(fields.pop("partition_lateness", 86400)))
        return cls(**fields, partition_lateness=lateness)

    def attach(self, defaults: SourceDefaults | None) -> Sequence[Sink]:
        """Resolve ``on_malformed`` and ``max_malformed_fraction``; the dead-letter sink if routing to one."""
        parseable = self.format != "parquet"
        policy = resolve_malformed(self.uid, self._own_policy, self.dead_letter_path, defaults, parseable)
        self.on_malformed, self.max_malformed_fraction, table = policy
        if table is None:
            return ()
        options = self.storage_options if table == self.dead_letter_path else None  # the pipeline's: its own
        return [dead_letters.DeadLetterSink(self, table, functools.partial(dead_letter_rows, self), options)]

    # -- reading (Spark) ---------------------------------------------------------------
    def read(self, ctx: StepContext, previous: Any, barrier: Any) -> DataFrame:
        return self.read_counted(ctx, previous, barrier)[0]

    def empty(self, spark: SparkSession) -> DataFrame:
        """The declared schema's columns, no rows (what a checkpoint without new files reads)."""
        return spark.createDataFrame([], self.schema)

    def read_counted(self, ctx: StepContext, previous: Any, barrier: Any) -> tuple[DataFrame, int]:
        """The (good) records in ``[previous, barrier)``, cached, and their count.

        JSON and CSV are counted and checked for malformed records in one pass, which also
        fills the cache; the malformed records are only looked up when there are some.
        """
        from pyspark.sql import functions as F

        todo = self.files_to_read(ctx, previous, barrier)
        if not todo:
            return self.empty(ctx.spark).cache(), judge(self, ctx, todo, 0, 0)
        df = self.load(ctx, todo).cache()
        if self.format == "parquet":
            return df, df.count()
        (counts,) = df.agg(F.count(F.lit(1)), F.count(F.col(CORRUPT))).collect()  # no limit: one job
        return good_records(self, df), judge(self, ctx, todo, int(counts[0]), int(counts[1]))  # served from the cache

    def read_once(self, ctx: StepContext, previous: Any, barrier: Any) -> tuple[DataFrame, Callable[[], int]]:
        """The (good) records in ``[previous, barrier)``, uncached, counted and checked on the consumer's one pass.

        The count and the malformed-record check are observed on that pass
        (``DataFrame.observe``), so the returned function raises
        :class:`MalformedInputError` once it has run, before the step acks.
        """
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        from airflow_provider_checkpoint.dataflow.observation import observed_metrics

        todo = self.files_to_read(ctx, previous, barrier)
        if not todo:
            return self.empty(ctx.spark), lambda: judge(self, ctx, todo, 0, 0)
        observation = Observation()
        metrics = [F.count(F.lit(1)).alias("records")]
        df = self.load(ctx, todo)
        if self.format != "parquet":  # every declared column is parsed and checked, used downstream or not
            declared = F.hash(*[F.col(c) for c in df.columns if c != CORRUPT])  # not optimized away
            metrics += [F.count(F.col(CORRUPT)).alias("malformed"), F.max(declared).alias("parsed")]
        observed = df.observe(observation, *metrics)

        def records() -> int:
            counts = observed_metrics(observation, lambda: df.agg(*metrics).first())
            return judge(self, ctx, todo, int(counts["records"]), int(counts.get("malformed") or 0))

        return (observed if self.format == "parquet" else good_records(self, observed)), records

    def may_read_in_driver(self, previous: Any, barrier: Any) -> bool:
        """Parquet files of at most ``driver_read_bytes`` in all, without reader ``options``."""
        return (
            self.format == "parquet"
            and not self.options
            and self.input_bytes(previous, barrier) <= self.driver_read_bytes
        )

    def read_in_driver(self, ctx: StepContext, previous: Any, barrier: Any) -> SourceRows | None:
        """:func:`.driver_reads.read_in_driver`: small Parquet inputs for a sink that takes them on the driver."""
        return driver_reads.read_in_driver(self, ctx, previous, barrier)

    def read_for_operator(self, ctx: StepContext, previous: Any, barrier: Any) -> SourceRows | None:
        """:func:`.driver_reads.read_for_operator`: JSON Lines for an operator that reduces them on the driver."""
        return driver_reads.read_for_operator(self, ctx, previous, barrier)

    def declared(self) -> StructType:
        """The declared ``schema`` as Spark's columns."""
        from pyspark.sql.types import StructType

        declared = StructType.fromDDL(self.schema)
        assert isinstance(declared, StructType)
        return declared

    def files_to_read(self, ctx: StepContext, previous: Any, barrier: Any) -> dict[str, int]:
        """The files to read, checked unchanged since the barrier was cut (:meth:`checked`), counted."""
        todo = self.checked(ctx, self.split(previous, barrier), barrier)
        ctx.add_metric("files_in", len(todo))
        return todo

    def load(self, ctx: StepContext, todo: dict[str, int], file_column: FileColumn | None = None) -> DataFrame:
        """``todo`` parsed with the declared schema; JSON and CSV keep malformed records in ``_corrupt_record``
        (:mod:`~airflow_provider_checkpoint.fileio.writes`: Spark's readers where Hadoop serves the landing
        directory, else fsspec and pyarrow).

        With :attr:`~.graph.Source.in_source_order` and no ``file_column`` the partitions hold the
        rows in source order: files by name, each file's records in line order (what an upsert
        sink's "later record wins" rule means for this source)."""
        fs, root = self.filesystem()
        sizes = {f"{root}/{name}": size for name, size in todo.items()}
        ordered = self.in_source_order and file_column is None
        declared = self.declared()
        return file_scans.read_files(
            ctx.spark, fs, sizes, self.format, declared, self.options, CORRUPT, file_column, ordered
        )
