"""The ends of a step in a pipeline's dataflow graph: :class:`StepOutput` (a sink or a channel) and the
two-phase-commit :class:`Sink` every sink connector implements (stage in the step, commit or abort in
finalize, roll back on restore)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, ClassVar

from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.node import Node, step_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from airflow_provider_checkpoint.dataflow.context import StepContext
    from airflow_provider_checkpoint.dataflow.driver_rows import LazyFrame
    from airflow_provider_checkpoint.storage import JobStorage

Housekeeping = Callable[[], None]
"""What a sink's commit leaves to run once every sink of the checkpoint committed: work no guarantee depends
on (e.g. a Delta log checkpoint, the deletion of an attempt's leftovers)."""


def redact_url(url: str) -> str:
    """``url`` without a ``user:password@`` in its authority (``s3://key:secret@bucket`` → ``s3://bucket``);
    a name alone before ``@`` (an abfs container) is kept."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*:[^/@]*@", r"\1", url)


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
    feeds_nodes = False

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

    def stage(self, ctx: StepContext, data: DataFrame | LazyFrame) -> list[JsonDict]:
        """Stage the checkpoint's output ``data`` and return the committables. ``data`` is the input's DataFrame, or
        a :class:`~.driver_rows.LazyFrame` whose DataFrame is made only if the sink asks for it
        (:func:`~.driver_rows.frame_of`): the rows its source read on the driver (:class:`~.driver_rows.SourceRows`,
        when :meth:`takes_source_rows`), an operator's output merged on the driver (:attr:`StepContext.in_driver`)."""
        raise NotImplementedError

    def commit(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        raise NotImplementedError

    def commit_then(self, checkpoint_id: int, committables: list[JsonDict]) -> Housekeeping | None:
        """:meth:`commit`, returning the housekeeping it left for the caller to run once every sink of the
        checkpoint committed (work no guarantee depends on: e.g. a Delta log checkpoint); here none."""
        self.commit(checkpoint_id, committables)
        return None

    def housekeeping(self, checkpoint_id: int) -> Housekeeping | None:
        """The housekeeping of committed checkpoint ``checkpoint_id``'s commit once more, from the target alone:
        its first run failed, or the finalize that committed it died before it; here none."""
        return None

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
