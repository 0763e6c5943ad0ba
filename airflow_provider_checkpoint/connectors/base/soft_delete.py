"""Soft deletes in an upsert sink: a delete keeps its key's row, marked, instead of removing it.

With ``delete_when`` an upsert sink removes a key whose winning row (the rule of :mod:`.upsert_rule`)
has that boolean column true. With ``deletes="soft"`` the same winning row is written instead, with a
boolean column ``deleted_column`` (default ``__deleted``, the name Debezium's ``ExtractNewRecordState``
gives it in ``rewrite`` mode; Fivetran's ``_fivetran_deleted`` and Hudi's ``_hoodie_is_deleted`` are
boolean too) true, and every other row is written with it false: a later row of the key (an insert
of it again) revives it, by the same rule. The row a delete leaves is the delete's own row, as the
source sends it (a PostgreSQL CDC delete: the key only unless the table has ``REPLICA IDENTITY
FULL``), as Debezium's rewrite does.

The sink applies it by rewriting its input before anything else sees it: ``deleted_column`` =
``coalesce(delete_when, false)``, ``delete_when`` dropped (unless it is the same column), and then
upserts as without deletes; its table has ``deleted_column`` as an ordinary column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, SinkSchemaError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

DELETES = ("hard", "soft")
DELETED_COLUMN = "__deleted"


@dataclass(frozen=True)
class SoftDelete:
    """``when``: the input's boolean column marking a delete; ``column``: the table's boolean column
    that keeps it."""

    when: str
    column: str

    def check(self, uid: str, schema: StructType) -> None:
        """Refuse an input of ``schema`` whose ``when`` is not a boolean column, or with ``column`` as another
        of its columns."""
        types = {f.name: f.dataType.simpleString() for f in schema.fields}
        if types.get(self.when) != "boolean":
            raise SinkSchemaError(
                f"sink {uid}: delete_when column {self.when!r} must be boolean, the input has "
                f"{types.get(self.when) or 'no such column'}; its columns are {schema.fieldNames()}"
            )
        if self.column != self.when and self.column in types:
            raise SinkSchemaError(
                f"sink {uid}: deleted_column {self.column!r} is already an input column; name another "
                f"(deleted_column=...) or drop it before the sink"
            )

    def apply(self, uid: str, df: DataFrame) -> DataFrame:
        """``df`` as the sink writes it: ``column`` true where ``when`` is, false elsewhere (a null too),
        ``when`` dropped; refused as :meth:`check` refuses."""
        from pyspark.sql import functions as F

        self.check(uid, df.schema)
        marked = df.withColumn(self.column, F.coalesce(F.col(f"`{self.when}`"), F.lit(False)))
        return marked if self.column == self.when else marked.drop(self.when)

    def marked(self, uid: str, read: SourceRows) -> SourceRows:
        """:meth:`apply` of rows a source read on the driver, in Arrow (no Spark): the same columns in the
        same places, ``column`` in ``when``'s place if it is ``when``, else last, as ``withColumn`` puts it;
        the DataFrame of them, if a consumer needs it, :meth:`apply` of theirs."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark.sql.types import BooleanType, StructField, StructType

        from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows

        self.check(uid, read.schema)
        rows, flags = read.rows, pc.fill_null(read.rows[self.when], pa.scalar(False))
        field = StructField(self.column, BooleanType(), nullable=False)  # coalesce(..., false) is never null
        fields = list(read.schema.fields)
        if self.column == self.when:
            at = rows.schema.get_field_index(self.when)
            rows = rows.set_column(at, pa.field(self.column, pa.bool_(), nullable=False), flags)
            fields[at] = field
        else:
            rows = rows.append_column(pa.field(self.column, pa.bool_(), nullable=False), flags)
            rows = rows.drop_columns([self.when])
            fields = [f for f in fields if f.name != self.when] + [field]
        return SourceRows(rows, StructType(fields), lambda: self.apply(uid, read.frame()))


def check_deletes(
    uid: str,
    mode: str,
    keys: Sequence[str],
    sequence_by: Sequence[str],
    delete_when: str | None,
    deletes: str,
    deleted_column: str | None,
) -> SoftDelete | None:
    """The sink's soft deletes (``None``: deletes remove their key, or no deletes), refused when the
    pipeline is defined unless ``deletes`` is ``"hard"`` or ``"soft"``, soft deletes have a
    ``delete_when`` (checked by :func:`~.upsert_rule.check_delete_when`), and ``deleted_column`` is
    given with soft deletes only and names no key or ``sequence_by`` column."""
    if deletes not in DELETES:
        raise PipelineDefinitionError(f"{uid}: deletes must be 'hard' or 'soft', got {deletes!r}")
    if deletes == "hard":
        if deleted_column is not None:
            raise PipelineDefinitionError(
                f"{uid}: deleted_column applies to soft deletes only: set deletes='soft', or leave it out"
            )
        return None
    if mode != "upsert" or delete_when is None:
        raise PipelineDefinitionError(
            f"{uid}: deletes='soft' needs mode='upsert' and delete_when (the boolean input column marking a delete)"
        )
    column = DELETED_COLUMN if deleted_column is None else deleted_column
    if not isinstance(column, str) or not column or column in [*keys, *sequence_by]:
        raise PipelineDefinitionError(
            f"{uid}: deleted_column must name one boolean column, not a key or sequence_by column, got {column!r}"
        )
    return SoftDelete(delete_when, column)
