"""File sources: a landing directory whose files are each processed exactly once."""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import fsspec

from airflow_provider_checkpoint.dataflow import dead_letters, file_positions
from airflow_provider_checkpoint.dataflow.dead_letters import SourceDefaults, check_malformed_policy
from airflow_provider_checkpoint.dataflow.graph import Sink, Source
from airflow_provider_checkpoint.dataflow.landing import Listing, clean_file, hidden, list_landing
from airflow_provider_checkpoint.exceptions import (
    InputChangedError,
    MalformedInputError,
    PipelineDefinitionError,
    TooManyMalformedError,
)
from airflow_provider_checkpoint.storage.paths import owned_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.spark.context import StepContext

log = logging.getLogger(__name__)

_CORRUPT = "_corrupt_record"
_FORMATS = ("json", "csv", "parquet")
_CLEAN_SOURCE = ("off", "archive", "delete")


def _check_clean_source(uid: str, path: str, clean_source: str, archive_dir: str | None) -> None:
    if clean_source not in _CLEAN_SOURCE:
        raise PipelineDefinitionError(f"{uid}: clean_source must be one of {_CLEAN_SOURCE}, got {clean_source!r}")
    if (clean_source == "archive") != (archive_dir is not None):
        raise PipelineDefinitionError(f"{uid}: archive_dir is required with clean_source='archive' and only then")
    if archive_dir is None:
        return
    (landing_protocol, landing), (archive_protocol, archive) = map(fsspec.core.split_protocol, (path, archive_dir))
    if (landing_protocol or "file") != (archive_protocol or "file"):
        raise PipelineDefinitionError(f"{uid}: archive_dir {archive_dir!r} must be on the filesystem of {path!r}")
    landing, archive = posixpath.normpath(landing), posixpath.normpath(archive)
    inside = posixpath.relpath(archive, landing) if archive.startswith(landing.rstrip("/") + "/") else None
    if archive == landing or (inside is not None and not hidden(inside)):
        raise PipelineDefinitionError(
            f"{uid}: archive_dir {archive_dir!r} lies in the landing directory, so archived files would be read "
            "again; put it elsewhere or under a hidden name (starting with '.' or '_')"
        )


class FileSource(Source):
    """Files landing in a directory (recursively), in ``json`` (JSON Lines), ``csv`` or ``parquet``.

    The barrier adds the files visible at trigger time to the files already processed;
    each file is processed by exactly one completed checkpoint, also when files arrive
    while a checkpoint runs (they belong to the next barrier). Files whose name or
    directory starts with ``.`` or ``_`` are ignored: writers should land files under such
    a name and rename them when complete. A file that changes size after it was cut into a
    barrier fails the step with a clear error, because it would break exactly-once.

    **Bounded position.** The position lists the processed files that are still visible
    (:mod:`~airflow_provider_checkpoint.dataflow.file_positions`): a visible file not in it
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

    **Malformed records** (not parseable, or not matching ``schema``; JSON and CSV) with
    ``on_malformed="fail"`` fail the step with an error naming the file and line; nothing of
    that checkpoint is committed, and the next run proceeds once the file is fixed or
    removed. With ``"dead_letter"`` the good records go on into the pipeline and the
    malformed ones go to a dead-letter table (:mod:`.dead_letters`) committed exactly once
    with the checkpoint: ``dead_letter_path`` (with this source's ``storage_options``), else
    ``<pipeline dead_letter_path>/<uid>``. Either way a checkpoint in which more than
    ``max_malformed_fraction`` of this source's records are malformed is declined
    (:class:`TooManyMalformedError`, no retry). ``None`` takes the pipeline's setting
    (:class:`~.dead_letters.SourceDefaults`: ``"fail"``, 0.5).
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
    ) -> None:
        super().__init__(uid)
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
        _check_clean_source(uid, path, clean_source, archive_dir)
        if partition_pattern is not None and (
            not partition_pattern or partition_pattern.startswith("/") or ".." in partition_pattern.split("/")
        ):
            raise PipelineDefinitionError(f"{uid}: partition_pattern {partition_pattern!r} must be a relative format")
        if partition_lateness < timedelta(0):
            raise PipelineDefinitionError(f"{uid}: partition_lateness must not be negative")
        self.partition_pattern = partition_pattern
        self.partition_lateness = partition_lateness

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": self.path, "format": self.format}

    def attach(self, defaults: SourceDefaults | None) -> Sequence[Sink]:
        """Resolve ``on_malformed`` and ``max_malformed_fraction``; the dead-letter sink if routing to one."""
        defaults = defaults or SourceDefaults()
        own, fraction = self._own_policy
        self.on_malformed = "fail" if self.format == "parquet" else own or defaults.on_malformed
        self.max_malformed_fraction = defaults.max_malformed_fraction if fraction is None else fraction
        if self.on_malformed == "fail":
            return ()
        if self.dead_letter_path is not None:
            return [dead_letters.DeadLetterSink(self, self.dead_letter_path, self.dead_letters, self.storage_options)]
        if defaults.dead_letter_path is None:
            raise PipelineDefinitionError(
                f"{self.uid}: on_malformed='dead_letter' needs a dead-letter table: set dead_letter_path "
                "on the source or on the pipeline (a pipeline whose storage uses a connection has no default)"
            )
        path = f"{defaults.dead_letter_path.rstrip('/')}/{self.uid}"
        return [dead_letters.DeadLetterSink(self, path, self.dead_letters)]

    # -- positions (no Spark) ----------------------------------------------------------
    def _fs(self) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, root = fsspec.core.url_to_fs(self.path, **self.storage_options)
        return fs, root.rstrip("/")

    def listing(self, partition_floor: datetime | None = None) -> Listing:
        """Visible files now present (partitions before ``partition_floor`` not listed)."""
        fs, root = self._fs()
        if not fs.exists(root):
            raise FileNotFoundError(f"source {self.uid}: landing directory {self.path} does not exist")
        return list_landing(fs, root, self.pattern, self.partition_pattern, partition_floor)

    def list_files(self, partition_floor: datetime | None = None) -> dict[str, int]:
        """Visible files now present, relative name → size."""
        return {name: size for name, (size, _) in self.listing(partition_floor).files.items()}

    def initial_position(self) -> dict[str, Any]:
        return {"files": {}}

    def barrier_position(self, previous: Any) -> dict[str, Any]:
        processed = file_positions.validate_position(self.uid, previous)
        listing = self.listing(processed.partition_floor)
        return file_positions.next_position(
            processed,
            listing.files,
            self.max_files_per_checkpoint,
            listing.partitions if self.partition_pattern else None,
            self.partition_lateness,
        )

    def split(self, previous: Any, barrier: Any) -> dict[str, int]:
        """The files in ``[previous, barrier)``: in the barrier, not yet processed (validated)."""
        return file_positions.split(
            file_positions.validate_position(self.uid, previous).files,
            file_positions.validate_position(self.uid, barrier).files,
        )

    def on_checkpoint_committed(self, checkpoint_id: int, position: Any) -> None:
        """``clean_source``: archive or delete the processed files of a committed position.

        Only files still present with the size they were read at are touched, so running
        it again (recovery after a crash) or for an older position changes nothing. A file
        or archive path that resolves (through a link) out of its directory is refused.
        """
        if self.clean_source == "off":
            return
        processed = file_positions.validate_position(self.uid, position)
        visible = self.listing(processed.partition_floor).files
        fs, root = self._fs()
        done: dict[str, int] = {}
        for name, size in processed.files.items():
            if name in visible and visible[name][0] == size:
                outcome = clean_file(fs, owned_path(fs, root, name), size, self._archive_target(name))
                done[outcome] = done.get(outcome, 0) + 1
        if done.pop("kept", 0):
            log.warning("source %s: files whose archive copy differs were left in %s", self.uid, self.path)
        for outcome, count in done.items():
            log.info("source %s: %s %d file(s) read up to checkpoint %d", self.uid, outcome, count, checkpoint_id)

    def _archive_target(self, name: str) -> tuple[fsspec.AbstractFileSystem, str] | None:
        if self.archive_dir is None:
            return None
        archive_fs, archive_root = fsspec.core.url_to_fs(self.archive_dir, **self.storage_options)
        return archive_fs, owned_path(archive_fs, archive_root.rstrip("/"), name)

    # -- reading (Spark) ---------------------------------------------------------------
    def url(self, relative: str) -> str:
        fs, root = self._fs()
        protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
        protocol = "file" if protocol in ("file", "local") else protocol
        return f"{protocol}://{root}/{relative}"

    def read(self, ctx: StepContext, previous: Any, barrier: Any) -> DataFrame:
        return self.read_counted(ctx, previous, barrier)[0]

    def read_counted(self, ctx: StepContext, previous: Any, barrier: Any) -> tuple[DataFrame, int]:
        """The (good) records in ``[previous, barrier)``, cached, and their count.

        JSON and CSV are counted and checked for malformed records in one pass, which also
        fills the cache; the malformed records are only looked up when there are some.
        """
        from pyspark.sql import functions as F

        todo = self._todo(ctx, previous, barrier)
        if not todo:
            return ctx.spark.createDataFrame([], self.schema).cache(), self._judge(ctx, todo, 0, 0)
        df = self._load(ctx, todo).cache()
        if self.format == "parquet":
            return df, df.count()
        (counts,) = df.agg(F.count(F.lit(1)), F.count(F.col(_CORRUPT))).collect()  # no limit: one job
        return self._good(df), self._judge(ctx, todo, int(counts[0]), int(counts[1]))  # served from the cache

    def read_once(self, ctx: StepContext, previous: Any, barrier: Any) -> tuple[DataFrame, Callable[[], int]]:
        """The (good) records in ``[previous, barrier)``, uncached, counted and checked on the consumer's one pass.

        The count and the malformed-record check are observed on that pass
        (``DataFrame.observe``), so the returned function raises
        :class:`MalformedInputError` once it has run, before the step acks.
        """
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        todo = self._todo(ctx, previous, barrier)
        if not todo:
            return ctx.spark.createDataFrame([], self.schema), lambda: self._judge(ctx, todo, 0, 0)
        observation = Observation()
        metrics = [F.count(F.lit(1)).alias("records")]
        df = self._load(ctx, todo)
        if self.format != "parquet":  # every declared column is parsed and checked, used downstream or not
            declared = F.hash(*[F.col(c) for c in df.columns if c != _CORRUPT])  # not optimized away
            metrics += [F.count(F.col(_CORRUPT)).alias("malformed"), F.max(declared).alias("parsed")]
        observed = df.observe(observation, *metrics)

        def records() -> int:
            counts = observation.get
            return self._judge(ctx, todo, int(counts["records"]), int(counts.get("malformed") or 0))

        return (observed if self.format == "parquet" else self._good(observed)), records

    def _good(self, df: DataFrame) -> DataFrame:
        """The records of ``df`` that go on into the pipeline (all of them with ``on_malformed="fail"``,
        which refuses malformed ones)."""
        from pyspark.sql import functions as F

        return (df.where(F.col(_CORRUPT).isNull()) if self.on_malformed == "dead_letter" else df).drop(_CORRUPT)

    def _judge(self, ctx: StepContext, todo: dict[str, int], records: int, malformed: int) -> int:
        """The number of good records of ``records``; raises :class:`MalformedInputError` on any malformed one
        with ``on_malformed="fail"``, :class:`TooManyMalformedError` above ``max_malformed_fraction``."""
        if malformed and self.on_malformed == "fail":
            self._raise_malformed(ctx, todo, MalformedInputError, "")
        if records and malformed / records > self.max_malformed_fraction:
            header = (
                f"{malformed:,} of the {records:,} records of this checkpoint are malformed "
                f"({malformed / records:.1%}), more than max_malformed_fraction {self.max_malformed_fraction:g}: "
                "the checkpoint is declined. "
            )
            self._raise_malformed(ctx, todo, TooManyMalformedError, header)
        if self.on_malformed == "dead_letter":
            ctx.add_metric("malformed_records", malformed)
            ctx.metrics.setdefault("source_malformed", {})[self.uid] = malformed
        return records - malformed

    def dead_letters(self, ctx: StepContext) -> DataFrame | None:
        """This checkpoint's malformed records as dead-letter rows (:data:`.dead_letters.SCHEMA`), read
        again only when the step's read counted some; ``None`` when there are none."""
        if not ctx.metrics.get("source_malformed", {}).get(self.uid):
            return None
        from pyspark.sql.types import StructType

        restore = ctx.plan.restore_point
        previous = restore.source_positions.get(self.uid) if restore else None
        todo = self.split(previous, ctx.plan.barrier.positions[self.uid])
        fs, root = self._fs()
        declared = StructType.fromDDL(self.schema)
        assert isinstance(declared, StructType)
        columns = len(declared.fields)
        rows = [
            (
                self.uid,
                posixpath.relpath(path, root),
                line,
                raw,
                dead_letters.reason(self.format, raw, self.schema, columns, self.options),
                ctx.checkpoint_id,
            )
            for path, line, raw in dead_letters.locate_all(fs, self._malformed_rows(ctx, todo))
        ]
        return ctx.spark.createDataFrame(rows, dead_letters.SCHEMA)

    def _todo(self, ctx: StepContext, previous: Any, barrier: Any) -> dict[str, int]:
        """The files to read, checked unchanged since the barrier was cut."""
        todo = self.split(previous, barrier)
        self._check_unchanged(todo, barrier)
        ctx.add_metric("files_in", len(todo))
        return todo

    def _load(self, ctx: StepContext, todo: dict[str, int]) -> DataFrame:
        """``todo`` parsed with the declared schema; JSON and CSV keep malformed records in ``_corrupt_record``."""
        reader = ctx.spark.read.format(self.format).options(**self.options)
        if self.format == "csv":
            reader = reader.option("header", self.options.get("header", "true"))
        if self.format == "parquet":
            return reader.schema(self.schema).load([self.url(n) for n in sorted(todo)])
        from pyspark.sql.types import StringType, StructField, StructType

        declared = StructType.fromDDL(self.schema)
        assert isinstance(declared, StructType)
        schema = StructType([*declared.fields, StructField(_CORRUPT, StringType(), True)])
        reader = reader.schema(schema).option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", _CORRUPT)
        return reader.load([self.url(n) for n in sorted(todo)])

    def _malformed_rows(
        self, ctx: StepContext, todo: dict[str, int], limit: int | None = None
    ) -> list[tuple[str, str]]:
        """``(file path, raw text)`` of the malformed records of ``todo`` (the first ``limit``)."""
        from pyspark.sql import functions as F

        fs, _ = self._fs()
        df = self._load(ctx, todo).withColumn("_source_file", F.col("_metadata.file_path")).cache()
        bad = df.where(F.col(_CORRUPT).isNotNull()).select("_source_file", _CORRUPT)
        rows = (bad if limit is None else bad.limit(limit)).collect()
        df.unpersist()
        return [(fs._strip_protocol(unquote(r[0])), r[1]) for r in rows]

    def _raise_malformed(
        self, ctx: StepContext, todo: dict[str, int], error: type[MalformedInputError], header: str
    ) -> None:
        """Raise ``error`` naming the first malformed records of ``todo`` (file and line) after ``header``."""
        lines = [
            f"  {self.url(posixpath.relpath(path, self._fs()[1]))} line {line or '?'}: {raw[:200]!r}"
            for path, line, raw in dead_letters.locate_all(self._fs()[0], self._malformed_rows(ctx, todo, 5))
        ]
        raise error(
            f"source {self.uid}: {header}malformed {self.format} record(s) not matching schema "
            f"<{self.schema}>:\n" + "\n".join(lines) + "\nFix or remove the file; nothing of this "
            "checkpoint was committed and the next run will read it again."
        )

    def _check_unchanged(self, todo: dict[str, int], barrier: Any) -> None:
        if not todo:
            return
        now = self.list_files(file_positions.validate_position(self.uid, barrier).partition_floor)
        for name, size in todo.items():
            if name not in now:
                raise InputChangedError(
                    f"source {self.uid}: {self.url(name)} was cut into this checkpoint's barrier but "
                    "has been removed; this checkpoint is aborted and the next one cuts a new barrier"
                )
            if now[name] != size:
                raise InputChangedError(
                    f"source {self.uid}: {self.url(name)} changed size after the barrier "
                    f"({size} → {now[name]} bytes); land files under a hidden name (.x or _x) and "
                    "rename them when complete"
                )
