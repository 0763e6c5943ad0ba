"""The source of a pipeline's dataflow graph: what every source connector implements (positions, the
barrier, reads of a range of them, and what follows a committed checkpoint)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.event_time import WatermarkSpec
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.node import Node

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.defaults import SourceDefaults
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows
    from airflow_provider_checkpoint.dataflow.sink import Sink
    from airflow_provider_checkpoint.storage import JobStorage


Release = Callable[[Callable[[], bool]], None]
"""What :meth:`Source.release_input` returns: called with the function telling whether it may release (it waits)."""


class Source(Node):
    """Reads input up to a barrier. Positions are JSON values defined by the source."""

    kind = "source"

    in_source_order = False
    """:meth:`read` must deliver the records in source order across partitions (set by
    :class:`~.planner.PipelineGraph` when an upsert sink resolves several rows of a key by that order)."""

    def __init__(self, uid: str, watermark: tuple[str, str] | None = None) -> None:
        super().__init__(uid)
        self.watermark = None if watermark is None else WatermarkSpec.of(watermark, uid)
        """``watermark=("ts", "10 minutes")``: the event time of this source's records, at most that much
        out of order; every event-time operator downstream without a ``watermark=`` of its own uses it."""

    def upstream_watermark(self) -> WatermarkSpec | None:
        """The watermark this source declares."""
        return self.watermark

    def attach(self, defaults: SourceDefaults | None) -> Sequence[Sink]:
        """Take the pipeline's ``defaults`` (``None``: the built-in ones) where the source set nothing
        of its own, and return the sinks it brings along (its dead-letter table); none here."""
        return ()

    def to_spec(self) -> JsonDict:
        """The constructor arguments, JSON values only, that rebuild this source in another process
        (a deferred sensor's trigger watches the source with them). A source that cannot be
        watched that way raises :class:`TypeError`, naming itself."""
        raise TypeError(f"source {self.uid}: {type(self).__name__} cannot be watched by a deferred sensor")

    @classmethod
    def from_spec(cls, spec: JsonDict) -> Source:
        """The source :meth:`to_spec` described."""
        return cls(**spec)

    def declared_schema(self) -> str | None:
        """The schema DDL the definition declares for the records :meth:`read` returns (``""``: no
        columns of the user's); ``None`` when only Spark knows them. Checked when the DAG is parsed."""
        return None

    def added_columns(self) -> str:
        """The DDL of the columns :meth:`read` adds to :meth:`declared_schema` (metadata); none here."""
        return ""

    def reads_target(self, target: str) -> bool:
        """Whether a sink writing ``target`` (a :meth:`Sink.targets` entry) would feed this source; no here."""
        return False

    def initial_position(self) -> Any:
        raise NotImplementedError

    def new_input(self, previous: Any) -> bool:
        """Whether a barrier cut now would hold input beyond ``previous`` (the deferred input sensor asks)."""
        return bool(self.barrier_position(previous) != previous)

    def barrier_position(self, previous: Any) -> Any:
        """The end position (exclusive) at trigger time, given the restored position."""
        raise NotImplementedError

    def input_bytes(self, previous: Any, barrier: Any) -> int | None:
        """The bytes in ``[previous, barrier)`` where the source knows them without reading (a file
        source: its files' sizes); ``None`` otherwise. Positions are validated as :meth:`read` does."""
        return None

    def offsets_behind(self, previous: Any, barrier: Any) -> int | None:
        """How far ``barrier`` lies past ``previous`` in the source's own offsets, where positions
        alone tell it (Kafka: the offsets of every partition in between); ``None`` otherwise."""
        return None

    def read(self, ctx: StepContext, previous: Any, barrier: Any) -> DataFrame:
        """Everything in ``[previous, barrier)``, deterministically, as a cached DataFrame."""
        raise NotImplementedError

    def empty(self, spark: SparkSession) -> DataFrame | None:
        """What :meth:`read` gives for a range without records (its columns, no rows), built without reading
        any record: the pipeline check (:mod:`~airflow_provider_checkpoint.spark.dry_run`) analyses the plans
        downstream on it. ``None`` (the default): the source cannot tell its columns before it reads, and
        what depends on it is not checked."""
        return None

    def may_read_in_driver(self, previous: Any, barrier: Any) -> bool:
        """Whether :meth:`read_in_driver` may take ``[previous, barrier)``, as the positions alone tell. ``False``
        is sure (it gives ``None``): a step task of this source that would start Spark on first use
        (:func:`~airflow_provider_checkpoint.spark.step_reads.may_skip_spark`) starts it at once, beside opening the
        storage. ``True``: it may, or the source cannot tell before reading. Here: whether the source's class
        has a :meth:`read_in_driver` of its own."""
        return type(self).read_in_driver is not Source.read_in_driver

    def read_in_driver(self, ctx: StepContext, previous: Any, barrier: Any) -> SourceRows | None:
        """The records in ``[previous, barrier)`` read on the driver, exactly as Spark reads them, for a
        consumer that takes them there (:meth:`Sink.takes_source_rows`); ``None`` (nothing read, nothing
        counted): :meth:`read_counted` reads them. None here."""
        return None

    def read_for_operator(self, ctx: StepContext, previous: Any, barrier: Any) -> SourceRows | None:
        """The records in ``[previous, barrier)`` read on the driver, exactly as :meth:`read` gives them (its
        DataFrame made by :meth:`SourceRows.frame`), for a stateful consumer that reduces them there
        (:meth:`StatefulOperator.partials_arrow`); counted and checked as :meth:`read_counted` does. ``None``
        (nothing read, nothing counted): :meth:`read_counted` reads them. None here."""
        return None

    def read_counted(self, ctx: StepContext, previous: Any, barrier: Any) -> tuple[DataFrame, int]:
        """:meth:`read` and its number of records; a source that can count while it reads overrides it."""
        df = self.read(ctx, previous, barrier)
        return df, df.count()

    def read_once(self, ctx: StepContext, previous: Any, barrier: Any) -> tuple[DataFrame, Callable[[], int]]:
        """:meth:`read_counted` for a consumer that reads its input once, in full (see
        :attr:`StatefulOperator.reads_input_once`): the DataFrame need not be cached, and the
        function, called after that read, gives the number of records or raises on bad input.
        """
        df, records = self.read_counted(ctx, previous, barrier)
        return df, lambda: records

    def on_checkpoint_committed(self, checkpoint_id: int, position: Any) -> None:
        """Called after checkpoint ``checkpoint_id`` committed with ``position``; idempotent.

        Runs in finalize after ``_metadata`` and again in the next trigger's recovery of
        the latest completed checkpoint, so it must tolerate running twice. No-op here.
        """

    def bind_storage(self, storage: JobStorage) -> None:
        """Bind the job's storage (the coordinator does): a source that keeps files of its own there (a CDC
        source's initial snapshot) finds it. No-op here."""

    def release_input(self, positions: Sequence[Any]) -> Release | None:
        """Called as each checkpoint is finished, before its sinks commit, with this source's positions in the
        completed checkpoints a restore may still start from once it is finished; idempotent. A source that holds
        input for restores (a replication slot's WAL) returns what releases the input none of them needs: it runs
        beside the sinks' commits, on another thread (so it looks nothing up in Airflow: do that here), and
        calls its argument right before releasing anything: ``False`` (after waiting for the commits when a
        position is the finishing checkpoint's own) means release nothing. ``None`` here: nothing to release."""
        return None
