"""What every transactional sink shares: a writer (step side) and a committer (finalize side).

Like Flink's two-phase-commit sink, a :class:`TransactionalSink` splits into

- the **writer** (:meth:`TransactionalSink.write`, in the step): claims the target for one
  (job, sink uid), stages the checkpoint's output under a name unique to the attempt
  (:meth:`TransactionalSink.staging_name`) and returns committables;
- the **committer** (finalize and the trigger's recovery): validates committables read back
  from stored, untrusted documents (:meth:`TransactionalSink.read_committables`), commits
  idempotently (:meth:`TransactionalSink.is_committed` is checked first, so a finalize retry
  and recovery may both call :meth:`~TransactionalSink.commit`), aborts every attempt of a
  checkpoint, rolls back on restore, audits leftovers and describes a commit for savepoints
  and Asset events (:meth:`~airflow_provider_checkpoint.dataflow.graph.Sink.describe_commit`).

:class:`TableDirectorySink` adds what sinks writing a directory of files share: the
confined :class:`~airflow_provider_checkpoint.storage.job_storage.Location`, the claim
file and the staging area ``_staging/chk-<id>/<job>/<step>/attempt-<n>``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import fsspec

from airflow_provider_checkpoint.connectors.base.soft_delete import SoftDelete, check_deletes
from airflow_provider_checkpoint.connectors.base.table_files import Listing, delete_tree, list_tree, read_document
from airflow_provider_checkpoint.connectors.base.table_urls import known_table_url as known_table_url
from airflow_provider_checkpoint.connectors.base.table_urls import table_url, url_of
from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows, check_delete_when, check_key_columns
from airflow_provider_checkpoint.core.documents import load_json
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.driver_rows import LazyFrame, SourceRows, frame_of
from airflow_provider_checkpoint.dataflow.graph import Node, Sink
from airflow_provider_checkpoint.dataflow.sink import Housekeeping
from airflow_provider_checkpoint.exceptions import (
    PipelineDefinitionError,
    SinkClaimedError,
    SinkSchemaError,
    UnsafePathError,
)
from airflow_provider_checkpoint.storage.job_storage import Location
from airflow_provider_checkpoint.storage.object_store import check_reachable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.connectors.base.bucketed import BucketedUpsert
    from airflow_provider_checkpoint.dataflow.context import StepContext

log = logging.getLogger(__name__)

CLAIM_FILE = "_table.json"


MODES = ("append", "upsert")


def check_input_columns(table: str, table_columns: dict[str, str], input_columns: dict[str, str], evolve: str) -> None:
    """Refuse input whose columns (name → type) differ from the ``table``'s: missing, retyped or added;
    ``evolve`` says how to add a column to such a table (no schema evolution is automatic)."""
    missing = sorted(set(table_columns) - set(input_columns))
    added = sorted(set(input_columns) - set(table_columns))
    retyped = sorted(c for c in set(table_columns) & set(input_columns) if table_columns[c] != input_columns[c])
    problems = []
    if missing:
        problems.append(f"missing column(s) {missing}")
    if retyped:
        problems.append(
            "retyped column(s) "
            + ", ".join(f"{c} ({table_columns[c]} in the table, {input_columns[c]} in the input)" for c in retyped)
        )
    if added:
        problems.append(f"added column(s) {added} ({evolve})")
    if problems:
        raise SinkSchemaError(f"{table}: the input does not match the table's schema: {'; '.join(problems)}")


SCHEMA_EVOLUTION = ("none", "additive")
"""A sink's ``schema_evolution``: ``none`` refuses input whose columns differ from the table's; ``additive``
adds an input column the table lacks (nullable, its earlier rows null) and widens a number column
(PostgreSQL) in the checkpoint's own commit. Neither drops, narrows or retypes a column."""


def check_schema_evolution(uid: str, value: str) -> str:
    """Refuse a ``schema_evolution`` other than :data:`SCHEMA_EVOLUTION`'s when the pipeline is defined."""
    if value not in SCHEMA_EVOLUTION:
        raise PipelineDefinitionError(f"{uid}: schema_evolution must be one of {list(SCHEMA_EVOLUTION)}, got {value!r}")
    return value


def check_mode(uid: str, mode: str) -> None:
    """Refuse a sink ``mode`` other than ``append`` or ``upsert`` when the pipeline is defined."""
    if mode not in MODES:
        raise PipelineDefinitionError(f"{uid}: mode must be 'append' or 'upsert', got {mode!r}")


class TransactionalSink(Sink):
    """A sink committed once per checkpoint: the template every transactional sink fills in.

    Subclasses implement :meth:`claim_document`, :meth:`load_claim`, :meth:`store_claim`,
    :meth:`write`, :meth:`read_committables`, :meth:`is_committed`, :meth:`commit_checked`
    and :meth:`abort`; :meth:`rollback`, :meth:`audit` and ``describe_commit`` are optional.
    They set ``mode`` (``append`` or ``upsert``), ``keys`` and ``sequence_by``
    (:func:`~.upsert_rule.check_sequence_by`), and ``delete_when`` where they apply deletes
    (:meth:`set_deletes`): in upsert mode :meth:`write_upsert` receives the input as
    :class:`~.upsert_rule.UpsertRows`, which yields one row per key (:mod:`.upsert_rule`); with soft deletes
    (:mod:`.soft_delete`) that input is rewritten first and ``delete_when`` is ``None``. An append of rows a
    source read on the driver goes to :meth:`write_source_rows` (:meth:`takes_source_rows`).
    """

    mode: str
    keys: list[str]
    sequence_by: list[str]
    delete_when: str | None = None
    soft_delete: SoftDelete | None = None
    upsert: BucketedUpsert | None = None
    """The bucketed merge of an upsert table of files (:mod:`.bucketed`); ``None`` for a sink that merges otherwise."""

    def takes_source_rows(self) -> bool:
        """An upsert merged in the driver (``driver_merge_rows`` above 0) takes the rows its source read there,
        unless soft deletes rewrite them first."""
        return self.upsert is not None and self.upsert.driver_merge_rows > 0 and self.soft_delete is None

    def set_deletes(self, delete_when: str | None, deletes: str, deleted_column: str | None) -> None:
        """Set ``delete_when`` (deletes remove their key) or ``soft_delete`` (``deletes="soft"``: they keep it,
        marked in ``deleted_column``) after ``mode``, ``keys`` and ``sequence_by``; refused when the pipeline is
        defined (:func:`~.upsert_rule.check_delete_when`, :func:`~.soft_delete.check_deletes`)."""
        delete_when = check_delete_when(self.uid, self.mode, self.keys, self.sequence_by, delete_when)
        soft = check_deletes(self.uid, self.mode, self.keys, self.sequence_by, delete_when, deletes, deleted_column)
        self.delete_when, self.soft_delete = (None, soft) if soft else (delete_when, None)

    def marks_deletes(self) -> str | None:
        """The input column whose true value deletes a key (hard or soft), if any."""
        return self.soft_delete.when if self.soft_delete else self.delete_when

    def written_input(self, df: DataFrame) -> DataFrame:
        """The input as the sink writes it: with soft deletes, marked (:meth:`.SoftDelete.apply`)."""
        return self.soft_delete.apply(self.uid, df) if self.soft_delete else df

    # -- claim -------------------------------------------------------------------------
    def claim_document(self, job_id: str) -> JsonDict:
        """What identifies this job's ownership of the target (and the layout it must keep)."""
        return {"job_id": job_id, "sink": self.uid}

    def load_claim(self) -> JsonDict | None:
        raise NotImplementedError

    def store_claim(self, claim: JsonDict) -> None:
        raise NotImplementedError

    def target_name(self) -> str:
        """How messages name the target (a URL, a table name)."""
        return self.asset_uri() or self.uid

    def claim(self, job_id: str) -> None:
        """Record (job, sink uid) as the target's only writer; refuse another job, sink or layout."""
        self.bind_job(job_id)
        claim = self.claim_document(job_id)
        existing = self.load_claim()
        if existing is None:
            self.store_claim(claim)
        else:
            self.owned_claim(existing)

    def owned_claim(self, claim: JsonDict | None) -> JsonDict | None:
        """``claim`` (the target's stored claim) if it is exactly the bound job's: ``None`` when the target
        has none yet; :class:`SinkClaimedError` if it names another job, sink or layout. A stored claim
        is untrusted: commits, restores and audits use the bound job's id, never the one it names."""
        if claim is None:
            return None
        if self.job_id is None:
            raise RuntimeError(f"sink {self.uid} is not bound to a job (bind_job)")
        expected = self.claim_document(self.job_id)
        if claim != expected:
            raise SinkClaimedError(
                f"sink {self.uid}: {self.target_name()} belongs to {str(claim)[:300]}, not {expected}; "
                "one job and sink write a target, and its layout cannot change"
            )
        return expected

    # -- writer (step side) ------------------------------------------------------------
    @staticmethod
    def staging_name(ctx: StepContext) -> str:
        """``chk-<id>/<job>/<step>/attempt-<n>``: unique per attempt, so retries never mix files."""
        return f"chk-{ctx.checkpoint_id}/{ctx.attempt_tag}"

    def check_target(self) -> None:
        """Refuse a target this sink must not write (e.g. not its format), before the claim touches it."""

    def stage(self, ctx: StepContext, data: DataFrame | LazyFrame) -> list[JsonDict]:
        """Check the target, claim it, stage ``data``. A sink taking rows on the driver (:meth:`takes_source_rows`)
        gets them as they are: a source's read there (:class:`SourceRows`; soft deletes marked as :meth:`written_input`
        marks a DataFrame: :meth:`.SoftDelete.marked`) or an append's input merged there (:meth:`held_input`). An
        upsert without soft deletes takes a :class:`LazyFrame` as it is (:class:`UpsertRows`), so a writer merging the
        rows the driver holds (:meth:`UpsertRows.held`) never makes its DataFrame; otherwise the DataFrame is made."""
        self.check_target()
        held = self.held_input(ctx) if self.mode == "append" and self.takes_source_rows() else None
        if held is not None:  # taken as a source's rows read on the driver, their DataFrame made only if asked for
            data = SourceRows(held, data.schema, partial(frame_of, data))
        read = data if isinstance(data, SourceRows) and self.takes_source_rows() else None
        if read is not None and self.soft_delete is not None:  # its refusals before the claim
            read = self.soft_delete.marked(self.uid, read)
        elif read is None and (self.mode != "upsert" or self.soft_delete is not None):
            data = self.written_input(frame_of(data))  # its refusals before the claim
        self.claim(ctx.plan.job_id)
        if self.mode == "upsert":
            return self.write_upsert(ctx, self._upsert_rows(ctx, data, read))
        return self.write(ctx, frame_of(data)) if read is None else self.write_source_rows(ctx, read)

    def _upsert_rows(self, ctx: StepContext, data: DataFrame | LazyFrame, read: SourceRows | None) -> UpsertRows:
        """The input of :meth:`write_upsert`: ``data`` with the rows the driver holds of it (unless soft deletes marked
        it: those are held unmarked) and its row count where the step knows them, or the rows ``read`` on the driver."""
        upstream = self.inputs[0].uid
        held = None if self.soft_delete or read is not None else ctx.in_driver.get(upstream)
        count = read.rows.num_rows if read is not None else ctx.output_rows.get(upstream)
        df = None if read is not None else data
        return UpsertRows(self.uid, df, self.keys, self.sequence_by, self.needs_source_order(), held, count, read)

    def write_source_rows(self, ctx: StepContext, read: SourceRows) -> list[JsonDict]:
        """Stage an append of rows on the driver (:meth:`stage`); by default :meth:`write` of their DataFrame."""
        return self.write(ctx, read.frame())

    def held_input(self, ctx: StepContext) -> pa.Table | None:
        """The input's rows the driver holds already (merged there), for a write from there: in append mode, or in
        upsert mode when they are one row per key (:meth:`needs_source_order` false; a sink staging upserts by bucket
        takes them through :class:`UpsertRows` instead). None with soft deletes (held unmarked)."""
        if self.needs_source_order() or self.soft_delete:
            return None
        held = ctx.in_driver.get(self.inputs[0].uid)
        return None if held is None else held.rows()

    def required_columns(self) -> dict[str, list[str]]:
        """``keys`` in upsert mode, ``sequence_by``, ``delete_when``."""
        marker = self.marks_deletes()
        deletes = [marker] if marker else []
        return {
            "keys": self.keys if self.mode == "upsert" else [],
            "sequence_by": self.sequence_by,
            "delete_when": deletes,
        }

    def needs_source_order(self) -> bool:
        """In upsert mode, unless the input already has at most one row per key (its node's
        ``unique_keys`` are among the keys)."""
        unique = self.unique_keys()
        return self.mode == "upsert" and (unique is None or not set(unique) <= set(self.keys))

    def check_input(self, df: DataFrame) -> None:
        """The target (:meth:`check_target`), its claim (this job's, or none yet), an upsert input's key
        columns, and the input's columns against the existing table (:meth:`check_columns`); read only."""
        self.check_target()
        self.owned_claim(self.load_claim())
        df = self.written_input(df)
        if self.mode == "upsert":
            check_key_columns(self.uid, df.columns, self.keys, self.sequence_by)
        self.check_columns(df.schema)

    def check_columns(self, schema: StructType) -> None:
        """Refuse input columns ``schema`` that do not fit the existing target, reading only its metadata;
        nothing to check when it has none yet (the first stage creates it from the input). None here."""

    def write(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        """Stage ``df`` as checkpoint ``ctx.checkpoint_id``'s output; return the committables."""
        raise NotImplementedError

    def write_upsert(self, ctx: StepContext, rows: UpsertRows) -> list[JsonDict]:
        """Stage an upsert, one row per key (:mod:`.upsert_rule`); by default :meth:`write` of the rows as
        Spark reduces them. A sink that can take a small input in the driver uses :meth:`UpsertRows.collect`."""
        return self.write(ctx, rows.frame())

    # -- committer (finalize / recovery side) ------------------------------------------
    def read_committables(self, checkpoint_id: int, committables: Any, document: str) -> Any:
        """The committables in this sink's own form if they have exactly the shape :meth:`write`
        returns for ``checkpoint_id``; otherwise :class:`~airflow_provider_checkpoint.exceptions.DocumentError`.
        """
        raise NotImplementedError

    def check_committables(self, checkpoint_id: int, committables: list[JsonDict], document: str) -> None:
        self.read_committables(checkpoint_id, committables, document)

    def is_committed(self, checkpoint_id: int) -> bool:
        raise NotImplementedError

    def commit(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        """Commit checkpoint ``checkpoint_id`` exactly once (:meth:`commit_then`), its housekeeping after it."""
        housekeeping = self.commit_then(checkpoint_id, committables)
        if housekeeping is not None:
            housekeeping()

    def commit_then(self, checkpoint_id: int, committables: list[JsonDict]) -> Housekeeping | None:
        """Commit checkpoint ``checkpoint_id`` exactly once: a committed one is skipped, then every
        committable is validated before the first effect. Returns the commit's housekeeping, not run; for a
        committed one (a finalize retried, the trigger's recovery) :meth:`housekeeping`, which it may have missed."""
        if self.is_committed(checkpoint_id):
            log.info("sink %s: checkpoint %d already committed, skipped", self.uid, checkpoint_id)
            return self.housekeeping(checkpoint_id)
        document = f"committables of sink {self.uid} for checkpoint {checkpoint_id}"
        return self.commit_checked(checkpoint_id, self.read_committables(checkpoint_id, committables, document))

    def commit_checked(self, checkpoint_id: int, committables: Any) -> Housekeeping | None:
        """Commit validated committables (as :meth:`read_committables` returns them); the work left that no
        guarantee depends on (:data:`~airflow_provider_checkpoint.dataflow.sink.Housekeeping`), if any."""
        raise NotImplementedError

    def abort(self, checkpoint_id: int) -> None:
        """Discard what every attempt of ``checkpoint_id`` staged (never committed output)."""
        raise NotImplementedError


class TableDirectorySink(TransactionalSink):
    """A sink writing a directory of files: every path confined to it, the claim in ``_table.json``.

    Staged files live under ``_staging/chk-<id>/<job>/<step>/attempt-<n>/`` unless the
    subclass stages elsewhere; :meth:`abort` deletes ``_staging/chk-<id>``.
    """

    def __init__(
        self, uid: str, input: Node, path: str, storage_options: dict[str, Any] | None = None, step: str | None = None
    ) -> None:
        super().__init__(uid, input, step)
        self.path = path
        self.storage_options = dict(storage_options or {})

    def _fs(self) -> tuple[fsspec.AbstractFileSystem, str]:
        table = Location.from_url(self.path, **self.storage_options)
        return table.fs, table.base

    def table(self) -> Location:
        """The table directory: every path in it is confined to it (``..``, absolute, a symlink out)."""
        return Location(*self._fs())

    def url(self, path: str) -> str:
        """The URL of ``path`` (a path on the table's filesystem), for Spark and delta-rs."""
        return url_of(self._fs()[0].protocol, path)

    def asset_uri(self) -> str:
        """The table's URL, from its path alone (:func:`table_url`)."""
        return table_url(self.uid, self.path)

    def load_claim(self) -> JsonDict | None:
        """The stored claim, ``None`` if the table has none: one GET on S3."""
        table = self.table()
        data = read_document(table.fs, table.path(CLAIM_FILE))
        if data is None:
            return None
        claim: JsonDict = load_json(data, table.url(CLAIM_FILE))
        return claim

    def store_claim(self, claim: JsonDict) -> None:
        self.table().write_atomic(CLAIM_FILE, json.dumps(claim, sort_keys=True).encode())

    @staticmethod
    def staging_dir(checkpoint_id: int) -> str:
        return f"_staging/chk-{checkpoint_id}"

    def attempt_staging(self, ctx: StepContext) -> str:
        """The attempt's empty staging directory (a path on the table's filesystem): what an earlier
        run of the same attempt left there is deleted (one LIST on S3 when nothing is)."""
        return self.clear(f"_staging/{self.staging_name(ctx)}")

    def clear(self, relative: str, listing: Listing | None = None) -> str:
        """Delete the directory ``relative`` (its files listed once unless ``listing`` holds them, then
        one bulk DELETE on S3, none if it is empty); its path on the table's filesystem."""
        table = self.table()
        path = table.path(relative)
        delete_tree(table.fs, path, list_tree(table.fs, path) if listing is None else listing, table.base)
        return path

    def abort(self, checkpoint_id: int) -> None:
        self.clear(self.staging_dir(checkpoint_id))

    @contextmanager
    def storage_errors(self) -> Iterator[None]:
        """A storage error of the table (``OSError``) on S3 is checked with one ``HeadBucket``: a missing
        bucket or denied access raises :class:`CheckpointStorageError` naming the table and the fix, as
        for the storage root; otherwise the error stays as it was (the task's retry may help)."""
        try:
            yield
        except OSError:
            fs, base = self._fs()
            check_reachable(fs, base, self.asset_uri(), self.storage_options.get("conn_id"))
            raise

    def audit(self) -> list[str]:
        """Staged files nobody will commit, and links out of the table (reported, not followed)."""
        table, findings = self.table(), list[str]()
        try:
            files = table.files_under("", findings) if table.exists("") else []
        except UnsafePathError as e:
            return [str(e)]
        staged = [table.url(f) for f in files if f.startswith("_staging/")]
        return findings + [f"staged sink data left behind: {u}" for u in staged]
