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
    import pyarrow as pa
    from pyspark.sql import DataFrame

DELETES = ("hard", "soft")
DELETED_COLUMN = "__deleted"


@dataclass(frozen=True)
class SoftDelete:
    """``when``: the input's boolean column marking a delete; ``column``: the table's boolean column
    that keeps it."""

    when: str
    column: str

    def apply(self, uid: str, df: DataFrame) -> DataFrame:
        """``df`` as the sink writes it: ``column`` true where ``when`` is, false elsewhere (a null too),
        ``when`` dropped; refused if ``when`` is not a boolean column or ``column`` is another input column."""
        from pyspark.sql import functions as F

        types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        if types.get(self.when) != "boolean":
            raise SinkSchemaError(
                f"sink {uid}: delete_when column {self.when!r} must be boolean, the input has "
                f"{types.get(self.when) or 'no such column'}; its columns are {df.columns}"
            )
        if self.column != self.when and self.column in types:
            raise SinkSchemaError(
                f"sink {uid}: deleted_column {self.column!r} is already an input column; name another "
                f"(deleted_column=...) or drop it before the sink"
            )
        marked = df.withColumn(self.column, F.coalesce(F.col(f"`{self.when}`"), F.lit(False)))
        return marked if self.column == self.when else marked.drop(self.when)

    def marked_rows(self, rows: pa.Table) -> pa.Table:
        """:meth:`apply` of rows held in Arrow (checked by :meth:`apply` of their DataFrame first): ``column`` in
        ``when``'s place if it is ``when``, else last, as ``withColumn`` puts it."""
        import pyarrow as pa
        import pyarrow.compute as pc

        marked = pc.fill_null(rows[self.when], pa.scalar(False))
        if self.column == self.when:
            return rows.set_column(rows.schema.get_field_index(self.when), self.column, marked)
        return rows.append_column(self.column, marked).drop_columns([self.when])


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
