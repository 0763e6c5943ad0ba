"""The dataflow graph of a pipeline: sources, transforms, unions, channels and sinks (stateful
operators: :mod:`~airflow_provider_checkpoint.dataflow.operator`).

Nodes are declared at DAG-parse time and import no Spark: Spark is only touched when a
step runs. Every node has a stable ``uid`` that keys its state and its position in
checkpoints, so renaming a task or reordering code never loses state.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_checkpoint.core.event_time import WatermarkSpec
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.defaults import SourceDefaults
    from airflow_provider_checkpoint.dataflow.driver_rows import SourceRows
    from airflow_provider_checkpoint.storage import JobStorage

_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def redact_url(url: str) -> str:
    """``url`` without a ``user:password@`` in its authority (``s3://key:secret@bucket`` → ``s3://bucket``);
    a name alone before ``@`` (an abfs container) is kept."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*:[^/@]*@", r"\1", url)


def step_name(uid: str, step: str | None) -> str | None:
    """``step``, the name of the step (Airflow task) a node runs in, if it looks like a uid."""
    if step is not None and not _UID.match(step):
        raise PipelineDefinitionError(f"{uid}: step name {step!r} must look like a uid")
    return step


class Node:
    """A vertex of the dataflow graph."""

    kind: ClassVar[str] = "node"

    def __init__(self, uid: str, inputs: Sequence[Node] = ()) -> None:
        if not _UID.match(uid):
            raise PipelineDefinitionError(
                f"uid {uid!r} must be 1-100 characters of letters, digits, '_', '.', '-' "
                "and start with a letter or digit"
            )
        self.uid = uid
        self.inputs = tuple(inputs)
        for node in self.inputs:
            if isinstance(node, Sink):
                raise PipelineDefinitionError(f"{uid}: a sink ({node.uid}) cannot be an input")
        _register(self)

    def describe(self) -> JsonDict:
        """The topology entry of this node (recorded in the job record)."""
        return {"kind": self.kind, "inputs": [n.uid for n in self.inputs]}

    def upstream_watermark(self) -> WatermarkSpec | None:
        """The watermark of this node's records, declared on the sources upstream (through transforms,
        unions that agree, and channels); ``None``: none declared, or a stateful operator in between."""
        if isinstance(self, Source):
            return self.watermark
        if not self.inputs:
            return None
        specs = {n.upstream_watermark() for n in self.inputs}
        return specs.pop() if len(specs) == 1 else None

    def unique_keys(self) -> tuple[str, ...] | None:
        """Columns whose values identify at most one row of this node's output in a checkpoint;
        ``None``: not known (an upsert sink then resolves several rows per key itself)."""
        return None

    def deletes_column(self) -> str | None:
        """The boolean output column whose true value deletes the row's key (upsert Kafka tombstones), if any."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(uid={self.uid!r})"


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

    def read_in_driver(self, ctx: StepContext, previous: Any, barrier: Any) -> SourceRows | None:
        """The records in ``[previous, barrier)`` read on the driver, exactly as Spark reads them, for a
        consumer that takes them there (:meth:`Sink.takes_source_rows`); ``None`` (nothing read, nothing
        counted): :meth:`read_counted` reads them. None here."""
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

    def on_positions_retained(self, positions: Sequence[Any]) -> None:
        """Called after retention with this source's positions in every retained completed checkpoint (a
        restore may still start from any of them); idempotent. A source that holds input for restores (a
        replication slot's WAL) releases what none of them needs. No-op here."""


class Transform(Node):
    """A stateless DataFrame → DataFrame function (filter, projection, parsing)."""

    kind = "transform"

    def __init__(self, uid: str, input: Node, fn: Any) -> None:
        super().__init__(uid, [input])
        self.fn = fn

    def apply(self, df: DataFrame) -> DataFrame:
        return self.fn(df)  # type: ignore[no-any-return]


class Union(Node):
    """The records of several inputs with the same columns (by name and type), as one input."""

    kind = "union"

    def __init__(self, uid: str, inputs: Sequence[Node]) -> None:
        super().__init__(uid, inputs)
        if len(self.inputs) < 2:
            raise PipelineDefinitionError(f"{uid}: a union needs at least two inputs")

    def apply(self, dfs: Sequence[DataFrame]) -> DataFrame:
        first = dfs[0]
        columns = {f.name: f.dataType for f in first.schema.fields}
        for node, df in zip(self.inputs[1:], dfs[1:], strict=True):
            if {f.name: f.dataType for f in df.schema.fields} != columns:
                raise PipelineDefinitionError(
                    f"{self.uid}: input {node.uid} has columns <{df.schema.simpleString()}> but "
                    f"{self.inputs[0].uid} has <{first.schema.simpleString()}>; a union needs the same columns"
                )
        out = first
        for df in dfs[1:]:
            out = out.unionByName(df)
        return out


class StepOutput(Node):
    """The end of a step: a node of one input that a named step (default ``step_<uid>``) writes
    for one job, a sink or a channel."""

    job_id: str | None = None
    """The job this node writes for, once bound (:meth:`bind_job`)."""

    def __init__(self, uid: str, input: Node, step: str | None = None) -> None:
        super().__init__(uid, [input])
        self.step = step_name(uid, step)

    def bind_job(self, job_id: str) -> None:
        """Bind the node to the job it writes for (the coordinator, the step and the audit do): what the
        target's stored claim says is checked against it, never used in its place."""
        self.job_id = job_id


class Sink(StepOutput):
    """A two-phase-commit sink: ``stage`` in the step, ``commit`` or ``abort`` in finalize.

    ``commit`` is idempotent: committing the same committables twice is a no-op. Sinks
    given the same ``step`` name run in one Spark job (one Airflow task).
    """

    kind = "sink"

    follows_input: ClassVar[bool] = False
    """Runs last in the first step that reads its input (a source), instead of in a step of
    its own, and is not a consumer of that input for
    :attr:`~airflow_provider_checkpoint.dataflow.operator.StatefulOperator.reads_input_once`."""

    reads_input_once: ClassVar[bool] = False
    """:meth:`stage`'s first Spark action reads its whole input, and it never reads the input again: a
    source feeding only this sink is then read in one pass, uncached (:meth:`Source.read_once`),
    counted and checked for malformed records on that pass."""

    job_storage: JobStorage | None = None
    """The job's storage, once bound (:meth:`bind_storage`)."""

    def takes_source_rows(self) -> bool:
        """Whether :meth:`stage` takes its input's rows from the driver when its source, feeding only this
        sink, read them there (:meth:`Source.read_in_driver`); no sink does by default."""
        return False

    def bind_storage(self, storage: JobStorage) -> None:
        """Bind the job's storage (the coordinator does, for its committer): a sink that stages its records in
        the checkpoint's own attempt directory (Kafka) reads them from there when it commits."""
        self.job_storage = storage

    def audit(self) -> list[str]:
        """Findings about leftovers (staged output nobody will commit, orphaned files); empty when clean."""
        return []

    def job_files(self, checkpoint_id: int, committables: list[JsonDict]) -> set[str]:
        """The files, relative to the job directory, that a retained checkpoint's ``committables`` stage there
        (kept with the checkpoint, not orphans); none here: sinks stage in their targets."""
        return set()

    def unique_keys(self) -> tuple[str, ...] | None:
        return self.inputs[0].unique_keys()

    def needs_source_order(self) -> bool:
        """Whether the sink resolves several rows of one key by the order its input delivers them."""
        return False

    def required_columns(self) -> dict[str, list[str]]:
        """The input columns the sink's parameters name, by parameter (``keys``, ``sequence_by``); none here."""
        return {}

    def targets(self) -> list[str]:
        """What the sink writes, normalized so that two sinks writing the same table give the same
        string: its :meth:`asset_uri`, or the tables of a connection it writes."""
        uri = self.asset_uri()
        return [] if uri is None else [uri]

    def check_input(self, df: DataFrame) -> None:
        """The dry run of :meth:`stage` (the pipeline check): raise what staging input with ``df``'s columns
        would raise about the target (another job's, of another kind, columns that do not fit its existing
        table), changing nothing: no claim stored, no table created, no row read. No check here."""

    def prepare(self, ctx: StepContext) -> None:
        """Called before the step does any Spark work: check the target (reachable, writable by
        this job) so a bad connection fails fast. No-op here."""

    @contextmanager
    def storage_errors(self) -> Iterator[None]:
        """Around what the step, finalize and an abort do to the target: a storage error whose cause
        can be told (a missing bucket, denied access) becomes one naming the target and the fix. No-op here."""
        yield

    def stage(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        raise NotImplementedError

    def stage_source_rows(self, ctx: StepContext, read: SourceRows) -> list[JsonDict]:
        """:meth:`stage` of the rows its source read on the driver (when :meth:`takes_source_rows`); here
        their DataFrame staged."""
        return self.stage(ctx, read.frame())

    def commit(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        raise NotImplementedError

    def check_committables(self, checkpoint_id: int, committables: list[JsonDict], document: str) -> None:
        """Raise :class:`~airflow_provider_checkpoint.exceptions.DocumentError` unless ``committables``
        have exactly the shape this sink's ``stage`` writes for ``checkpoint_id``.

        Committables come back from stored documents (``_metadata``, savepoints, acks), which
        are untrusted: a sink must check every path they name before ``commit`` uses it.
        """
        raise NotImplementedError

    def verify_staged(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        """Raise :class:`~airflow_provider_checkpoint.exceptions.CheckpointStorageError` unless what
        a step staged for ``checkpoint_id`` (``committables``, already shape-checked) is still
        there. Finalize calls it just before ``_metadata``, so staged output lost on the sink's
        side (a database that lost transactions, a table dropped by hand) aborts the checkpoint,
        and the next one reads its input again, instead of completing a checkpoint that can
        never commit. No-op here: staged files live on storage as durable as the checkpoint's."""

    def abort(self, checkpoint_id: int) -> None:
        raise NotImplementedError

    def rollback(self, checkpoint_id: int) -> None:
        """Withdraw committed output of checkpoints newer than ``checkpoint_id`` (on restore).

        The default keeps it: right for sinks whose replayed output overwrites (upserts).
        """

    def asset_uri(self) -> str | None:
        """The Airflow Asset URI of what this sink writes, if any."""
        return None

    def describe_commit(self, checkpoint_id: int) -> JsonDict:
        """What a savepoint and the Asset event record about the commit of ``checkpoint_id``
        (e.g. a table version); empty when the sink has nothing to add."""
        return {}

    record_kind: ClassVar[str] = "sink"
    """The sink's ``kind`` in a checkpoint's stats record (``parquet``, ``delta``, ``postgres``, ``dead_letters``)."""

    def record_target(self) -> str:
        """Where the sink writes, as a checkpoint's stats record shows it (a table URL or ``schema.table``):
        never credentials."""
        return redact_url(self.asset_uri() or self.uid)

    def staged_records(self, grown: Mapping[str, int]) -> dict[str, JsonDict]:
        """The stats record entries (uid → ``kind``, ``target``, ``rows``, ``files``, ``bytes``) of what
        this sink staged in a step, from what the step's metrics grew by while it staged (``sink_rows``,
        ``sink_files_staged``, ``sink_bytes_staged``). A sink writing a second target (dead letters)
        adds its entry."""
        return {
            self.uid: {
                "kind": self.record_kind,
                "target": self.record_target(),
                "rows": int(grown.get("sink_rows", 0)),
                "files": int(grown.get("sink_files_staged", 0)),
                "bytes": int(grown.get("sink_bytes_staged", 0)),
            }
        }

    def commit_record(self, checkpoint_id: int) -> dict[str, JsonDict]:
        """What the target records about its commit of ``checkpoint_id``, by stats entry uid (this sink's,
        and its dead letters'): ``delta_version``, ``commit_time`` (seconds since the epoch) where the sink
        knows them. Read after the commit; informational (empty when the sink records nothing)."""
        return {}


# -- declaration context --------------------------------------------------------------
_active: list[list[Node]] = []


def _register(node: Node) -> None:
    if _active:
        _active[-1].append(node)


@contextmanager
def collecting() -> Iterator[list[Node]]:
    """Collect every node declared inside the block, in declaration order."""
    nodes: list[Node] = []
    _active.append(nodes)
    try:
        yield nodes
    finally:
        _active.pop()
