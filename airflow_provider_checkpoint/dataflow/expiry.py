"""Spark side of state that expires (:mod:`airflow_provider_checkpoint.core.ttl`): event times of rows,
the watermark a checkpoint reaches, and the live rows of a state with :data:`~.core.ttl.EXPIRES_AT`.

Event times are compared in microseconds, as Spark does: a row is late when ``ts <= watermark``
and state expiring at ``expires_at`` (ms) is gone once ``expires_at <= watermark``; an event time's
expiry is computed from its time rounded *up* to the millisecond, so both tests agree with Spark's
microsecond ones exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.event_time import WatermarkProgress
from airflow_provider_checkpoint.core.ttl import EXPIRES_AT
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row

TS_US = "__ts_us"
"""A row's event time in microseconds (:func:`with_event_time`)."""
TS_MS_UP = "__ts_ms_up"
"""A row's event time in milliseconds, rounded up (:func:`with_event_time`)."""
EVENT_TIME_COLUMNS = (TS_US, TS_MS_UP)
"""The columns :func:`with_event_time` adds."""


def with_event_time(df: DataFrame, uid: str, column: str, keep_nulls: bool = False) -> DataFrame:
    """``df`` with its event time in microseconds (:data:`TS_US`) and in milliseconds rounded up
    (:data:`TS_MS_UP`); rows without one dropped unless
    ``keep_nulls``. ``column`` must be a timestamp (an error naming ``uid`` and the fix otherwise)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    field = df.schema[column] if column in df.columns else None
    if field is None or not isinstance(field.dataType, TimestampType):
        found = field.dataType.simpleString() if field is not None else "no such column"
        raise PipelineDefinitionError(
            f"{uid}: watermark column {column!r} must be a timestamp ({found}); "
            f"cast it in a Transform first, e.g. F.col({column!r}).cast('timestamp')"
        )
    us = F.unix_micros(F.col(column))
    up = F.unix_millis(F.col(column)) + F.when(F.pmod(us, F.lit(1000)) > 0, 1).otherwise(0)
    timed = df.withColumn(TS_US, us).withColumn(TS_MS_UP, up.cast("long"))
    return timed if keep_nulls else timed.where(F.col(TS_US).isNotNull())


def late(before: WatermarkProgress) -> Column:
    """A row (with :data:`TS_US`) is late: its event time is at or before the watermark ``before``."""
    from pyspark.sql import functions as F

    if before.watermark is None:
        return F.lit(False)
    return F.col(TS_US) <= F.lit(before.watermark * 1000)


@dataclass(frozen=True)
class Seen:
    """What one pass over an input's rows found (:func:`observe`)."""

    top: int | None
    """The greatest event time (ms, rounded down), ``None``: no row has one."""
    late: int
    """Rows the ``late`` rule given to :func:`observe` marks (0 without one)."""
    untimed: int
    """Rows without event time."""


def observe(rows: DataFrame, late: Column | None = None) -> Seen:
    """One pass over ``rows`` (with :data:`TS_US`, nulls kept): :class:`Seen`."""
    top = rows.agg(*_seen(late)).first()
    assert top is not None
    return _as_seen(top)


def observe_each(rows: DataFrame, by: str, late: Column | None = None) -> dict[Any, Seen]:
    """:func:`observe` per value of column ``by`` (e.g. which input a row came from), in one pass; a
    value without rows is absent."""
    return {row[by]: _as_seen(row) for row in rows.groupBy(by).agg(*_seen(late)).collect()}


def _seen(late: Column | None) -> list[Column]:
    from pyspark.sql import functions as F

    return [
        F.max(TS_US).alias("top"),
        F.count(F.when(late if late is not None else F.lit(False), 1)).alias("late"),
        F.count(F.when(F.col(TS_US).isNull(), 1)).alias("untimed"),
    ]


def _as_seen(row: Row) -> Seen:
    return Seen(None if row["top"] is None else row["top"] // 1000, int(row["late"]), int(row["untimed"]))


def advance(
    rows: DataFrame, before: WatermarkProgress, bound_ms: int, late: Column | None = None
) -> tuple[WatermarkProgress, dict[str, int]]:
    """One pass over ``rows`` (with :data:`TS_US`, nulls kept): the watermark reached from ``before``
    and the metrics ``rows_without_event_time`` and, given a ``late`` rule, ``late_rows_dropped``."""
    seen = observe(rows, late)
    metrics = {"rows_without_event_time": seen.untimed}
    if late is not None:
        metrics["late_rows_dropped"] = seen.late
    return before.advance(seen.top, bound_ms), metrics


def live_state(state: DataFrame, clock: int | None) -> DataFrame:
    """The rows of ``state`` still live at ``clock`` (ms; ``None``: every row): ``clock < expires_at``."""
    from pyspark.sql import functions as F

    return state if clock is None else state.where(F.col(EXPIRES_AT) > F.lit(clock))
