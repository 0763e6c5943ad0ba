"""Malformed records of a file source: which go on, when a checkpoint is declined, what the dead letters are.

JSON and CSV are parsed permissively, keeping a malformed record's raw text in
:data:`CORRUPT`. With ``on_malformed="fail"`` any malformed record declines the checkpoint;
with ``"dead_letter"`` they go to the source's dead-letter table unless more than
``max_malformed_fraction`` of the checkpoint's records are malformed.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

from airflow_provider_checkpoint.connectors.files import dead_letters
from airflow_provider_checkpoint.exceptions import MalformedInputError, TooManyMalformedError

if TYPE_CHECKING:
    import fsspec
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.fileio.scans import FileColumn

CORRUPT = "_corrupt_record"


class RecordFiles(Protocol):
    """What this module needs of a source of records in files (:class:`~.source.FileSource`)."""

    uid: str
    format: str
    schema: str
    options: dict[str, str]
    on_malformed: str
    max_malformed_fraction: float

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]: ...

    def split(self, previous: Any, barrier: Any) -> dict[str, int]: ...

    def load(self, ctx: StepContext, todo: dict[str, int], file_column: FileColumn | None = None) -> DataFrame: ...

    def url(self, relative: str) -> str: ...


def good_records(source: RecordFiles, df: DataFrame) -> DataFrame:
    """The records of ``df`` that go on into the pipeline (all of them with ``on_malformed="fail"``,
    which refuses malformed ones)."""
    from pyspark.sql import functions as F

    return (df.where(F.col(CORRUPT).isNull()) if source.on_malformed == "dead_letter" else df).drop(CORRUPT)


def judge(source: RecordFiles, ctx: StepContext, todo: dict[str, int], records: int, malformed: int) -> int:
    """The number of good records of ``records``; raises :class:`MalformedInputError` on any malformed one
    with ``on_malformed="fail"``, :class:`TooManyMalformedError` above ``max_malformed_fraction``."""
    if malformed and source.on_malformed == "fail":
        raise_malformed(source, ctx, todo, MalformedInputError, "")
    if records and malformed / records > source.max_malformed_fraction:
        header = (
            f"{malformed:,} of the {records:,} records of this checkpoint are malformed "
            f"({malformed / records:.1%}), more than max_malformed_fraction {source.max_malformed_fraction:g}: "
            "the checkpoint is declined. "
        )
        raise_malformed(source, ctx, todo, TooManyMalformedError, header)
    if source.on_malformed == "dead_letter":
        ctx.add_metric("malformed_records", malformed)
        ctx.metrics.setdefault("source_malformed", {})[source.uid] = malformed
    return records - malformed


def dead_letter_rows(source: RecordFiles, ctx: StepContext) -> DataFrame | None:
    """This checkpoint's malformed records as dead-letter rows (:data:`.dead_letters.SCHEMA`), read
    again only when the step's read counted some; ``None`` when there are none."""
    if not ctx.metrics.get("source_malformed", {}).get(source.uid):
        return None
    from pyspark.sql.types import StructType

    restore = ctx.plan.restore_point
    previous = restore.source_positions.get(source.uid) if restore else None
    todo = source.split(previous, ctx.plan.barrier.positions[source.uid])
    fs, root = source.filesystem()
    declared = StructType.fromDDL(source.schema)
    assert isinstance(declared, StructType)
    columns = len(declared.fields)
    rows = [
        (
            source.uid,
            posixpath.relpath(path, root),
            line,
            raw,
            dead_letters.reason(source.format, raw, source.schema, columns, source.options),
            ctx.checkpoint_id,
        )
        for path, line, raw in dead_letters.locate_all(fs, _malformed_rows(source, ctx, todo))
    ]
    return ctx.spark.createDataFrame(rows, dead_letters.SCHEMA)


def _malformed_rows(
    source: RecordFiles, ctx: StepContext, todo: dict[str, int], limit: int | None = None
) -> list[tuple[str, str]]:
    """``(file path, raw text)`` of the malformed records of ``todo`` (the first ``limit``)."""
    from pyspark.sql import functions as F

    from airflow_provider_checkpoint.fileio.scans import FileColumn

    fs, _ = source.filesystem()
    df = source.load(ctx, todo, FileColumn("_source_file")).cache()
    bad = df.where(F.col(CORRUPT).isNotNull()).select("_source_file", CORRUPT)
    rows = (bad if limit is None else bad.limit(limit)).collect()
    df.unpersist()
    return [(fs._strip_protocol(unquote(r[0])), r[1]) for r in rows]


def raise_malformed(
    source: RecordFiles, ctx: StepContext, todo: dict[str, int], error: type[MalformedInputError], header: str
) -> None:
    """Raise ``error`` naming the first malformed records of ``todo`` (file and line) after ``header``."""
    lines = [
        f"  {source.url(posixpath.relpath(path, source.filesystem()[1]))} line {line or '?'}: {raw[:200]!r}"
        for path, line, raw in dead_letters.locate_all(source.filesystem()[0], _malformed_rows(source, ctx, todo, 5))
    ]
    raise error(
        f"source {source.uid}: {header}malformed {source.format} record(s) not matching schema "
        f"<{source.schema}>:\n" + "\n".join(lines) + "\nFix or remove the file; nothing of this "
        "checkpoint was committed and the next run will read it again."
    )
