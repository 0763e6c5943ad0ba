"""A file source's records read on the driver with pyarrow, only where that gives exactly Spark's rows: small Parquet
inputs for a sink that takes them there, JSON Lines for an operator that reduces them there
(:class:`~.source.FileSource`, its docstring says when)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from airflow_provider_checkpoint.connectors.files import positions as file_positions
from airflow_provider_checkpoint.connectors.files.malformed import RecordFiles, good_records, judge
from airflow_provider_checkpoint.fileio.scans import as_nullable

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

log = logging.getLogger(__name__)


class DriverReadFiles(RecordFiles, Protocol):
    """What this module needs of a file source (:class:`~.source.FileSource`)."""

    def may_read_in_driver(self, previous: Any, barrier: Any) -> bool: ...

    def declared(self) -> StructType: ...

    def checked(self, ctx: StepContext, todo: dict[str, int], barrier: Any) -> dict[str, int]: ...

    def files_to_read(self, ctx: StepContext, previous: Any, barrier: Any) -> dict[str, int]: ...


def read_in_driver(source: DriverReadFiles, ctx: StepContext, previous: Any, barrier: Any) -> SourceRows | None:
    """Parquet files of at most ``driver_read_bytes`` in all, without reader ``options``, read on the
    driver where pyarrow gives exactly Spark's rows (:mod:`~airflow_provider_checkpoint.fileio.driver_read`),
    files by name, each file's rows in order; ``None``: Spark reads them."""
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows
    from airflow_provider_checkpoint.dataflow.schema_ddl import declared_flat
    from airflow_provider_checkpoint.fileio.driver_read import expected_schema, read_exactly

    if not source.may_read_in_driver(previous, barrier):
        return None
    todo = source.split(previous, barrier)
    if not todo:
        return None
    fs, root = source.filesystem()
    names = sorted(todo)
    large = ctx.session.conf("spark.sql.execution.arrow.useLargeVarTypes") == "true"
    declared = declared_flat(source.schema, ctx.session.conf("spark.sql.timestampType")) or source.declared()
    rows = read_exactly(fs, [f"{root}/{n}" for n in names], [todo[n] for n in names], expected_schema(declared, large))
    if rows is None:
        return None
    checked = source.files_to_read(ctx, previous, barrier)  # unchanged since the barrier, as Spark would read them
    log.info("source %s: %d files, %d rows read on the driver", source.uid, len(names), rows.num_rows)
    return SourceRows(rows, as_nullable(declared), lambda: source.load(ctx, checked))


def read_for_operator(source: DriverReadFiles, ctx: StepContext, previous: Any, barrier: Any) -> SourceRows | None:
    """JSON files without reader ``options`` parsed on the driver where pyarrow gives exactly Spark's rows and
    none is malformed (:func:`~airflow_provider_checkpoint.connectors.files.json_driver.read_json_exactly`), files
    by name, counted and judged as Spark's read counts them, their DataFrame the one Spark's read gives;
    ``None``: Spark reads them (and judges malformed records as ever), with no second listing of the landing
    directory (the files checked unchanged here are so for the attempt: :meth:`~.source.FileSource.checked`)."""
    from airflow_provider_checkpoint.connectors.files.json_driver import read_json_exactly
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows
    from airflow_provider_checkpoint.fileio.writes import engine_for

    if source.format != "json" or source.options:
        return None
    todo = source.split(previous, barrier)
    fs, root = source.filesystem()
    if not todo or engine_for(ctx.spark, fs) != "hadoop":  # the Python engine has its own parser
        return None
    source.checked(ctx, todo, barrier)
    names = sorted(todo)

    def changed(i: int, size: int) -> None:  # a file of another size than at the barrier: refused, as Spark's read
        file_positions.check_unchanged(source.uid, {names[i]: todo[names[i]]}, {names[i]: size}, source.url)

    paths, sizes = [f"{root}/{n}" for n in names], [todo[n] for n in names]
    rows = read_json_exactly(fs, paths, sizes, source.declared(), changed)
    if rows is None:
        return None
    ctx.add_metric("files_in", len(todo))
    judge(source, ctx, todo, rows.num_rows, 0)  # none malformed: the dead-letter metrics say so
    log.info("source %s: %d files, %d rows read on the driver for its operator", source.uid, len(names), len(rows))
    return SourceRows(rows, as_nullable(source.declared()), lambda: good_records(source, source.load(ctx, todo)))
