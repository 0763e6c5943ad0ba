"""Incremental checkpoints of a small keyed state, merged on the driver with pyarrow.

For an operator with a per-key partial form of its input (:meth:`StatefulOperator.partials`,
e.g. :class:`~airflow_provider_checkpoint.dataflow.stateful.KeyedAggregate`) whose restored
state has at most ``driver_merge_rows`` rows (a checkpoint setting), one Spark action reads
the checkpoint's input, reduces it to one row per key tagged with its key-group range, and collects it as Arrow. The
driver reads the touched ranges' state files, merges (:meth:`StatefulOperator.merge_arrow`) and
writes the deltas and compacted ranges itself: no shuffle of the state, no Spark write job.
Files, handles and layout are those the Spark path writes, so each continues the other's
checkpoints, and a step retried on either path produces the same state.

An operator with event time merges there too when it has that form
(:meth:`StatefulOperator.partials_at`, e.g. a tumbling or sliding
:class:`~airflow_provider_checkpoint.dataflow.windows.WindowAggregate`): its input's on-time rows,
one row per window, merged with the open windows' state; the windows the watermark closes are
deleted (and emitted) in every range, read only when its files may hold a window that closes
(:class:`Closing`): each state file's handle records the least window end it holds
(:attr:`StateHandle.least_end`), so finding those ranges reads nothing. Session windows
(:attr:`StatefulOperator.moves_keys`) read every range, since a key's sessions may lie in any, and
file the sessions their merge makes by Spark's key hash computed on the driver
(:mod:`~airflow_provider_checkpoint.state.spark_hash`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.dataflow.driver_rows import (
    KEY_HASH,
    DriverRows,
    LazyFrame,
    estimated_bytes,
    key_hash,
    rows_then_bytes_within,
)
from airflow_provider_checkpoint.dataflow.operator import NEW, Ranges, StatefulOperator
from airflow_provider_checkpoint.fileio.frames import arrow_frame
from airflow_provider_checkpoint.fileio.scans import as_nullable
from airflow_provider_checkpoint.state.files import DELETED, merged_rows, overlay, write_state_file
from airflow_provider_checkpoint.state.handles import OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.incremental import FULL_VERSION_SHARE, StateLayout, ranges_for
from airflow_provider_checkpoint.state.spark_backend import SEQ, first_state_rows, range_index, state_schema
from airflow_provider_checkpoint.state.spark_hash import hashable, range_indexes, ranges_of, xxhash64
from airflow_provider_checkpoint.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.core.event_time import WatermarkProgress
    from airflow_provider_checkpoint.core.settings import CheckpointSettings

DRIVER_INPUT_BYTES = 64 << 20
"""The largest input (Spark's size estimate) whose per-key partials the driver collects."""
FIRST_STATE_INPUT_BYTES = 4 * DRIVER_INPUT_BYTES
"""The largest input (Spark's size estimate) whose first state the driver collects and writes when that state
is estimated at most ``driver_merge_rows`` rows (the bound of every later merge on the driver; an input of at most
:data:`DRIVER_INPUT_BYTES` needs no estimate): a first state is collected alone, where a later merge holds the
state and collects the input's partials beside it."""
_RANGE = "__kgr"
ARROW_MERGEABLE = {"string", "byte", "short", "integer", "long", "boolean", "date", "timestamp", "timestamp_ntz"}
ARROW_MERGEABLE |= {"decimal"}
"""Spark types (``typeName``) of state columns pyarrow groups, sums and compares as Spark does
(not floating point: Spark orders NaN above every number, pyarrow skips it)."""


def within_driver_bounds(
    settings: CheckpointSettings, state_rows: int | None, input_bytes: Callable[[], int | None], first: bool
) -> bool:
    """Whether a checkpoint's state may merge on the driver, by size: the one bound of a first state written there
    (:func:`~.first_version.first_version_on_driver`), of a later merge (:func:`driver_partials`) and of a source
    reading its rows there for the operator (the step runner). ``state_rows``: the restored state's rows, or for a
    ``first`` state Spark's estimate of its rows (``None``: not known yet, bound by the input alone);
    ``input_bytes``: the input's size (asked last; ``None``: unknown, then Spark merges). A later merge takes an
    input of at most :data:`DRIVER_INPUT_BYTES` into a state of at most ``driver_merge_rows`` rows; a first state an
    input of at most :data:`DRIVER_INPUT_BYTES`, or of at most :data:`FIRST_STATE_INPUT_BYTES` into at most
    ``driver_merge_rows`` rows. Never with ``driver_merge_rows`` 0, without incremental state or with inline state."""
    if not settings.driver_merge_rows or not settings.incremental_state or settings.max_inline_state is not None:
        return False
    if not first:
        return rows_then_bytes_within(state_rows, settings.driver_merge_rows, input_bytes, DRIVER_INPUT_BYTES)
    size = input_bytes()
    if size is None:
        return False
    rows_within = state_rows is None or state_rows <= settings.driver_merge_rows
    return size <= DRIVER_INPUT_BYTES or (size <= FIRST_STATE_INPUT_BYTES and rows_within)


def input_size(inputs: Iterable[DataFrame]) -> int | None:
    """The sum of Spark's estimates of ``inputs``' sizes (:func:`estimated_bytes`); ``None`` if one is unknown."""
    sizes = [estimated_bytes(df) for df in inputs]
    return None if None in sizes else sum(s or 0 for s in sizes)


def driver_partials(
    node: StatefulOperator,
    inputs: Mapping[str, DataFrame],
    restored: OperatorSnapshot,
    settings: CheckpointSettings,
    before: WatermarkProgress | None = None,
    held: pa.Table | None = None,
) -> DataFrame | pa.Table | None:
    """The input's per-key partials (:meth:`StatefulOperator.partials`; with the watermark ``before`` this
    checkpoint, :meth:`StatefulOperator.partials_at`) when this checkpoint of ``node`` is merged on the
    driver: its state's columns are of simple types and it is within bounds (:func:`within_driver_bounds`, the input
    by Spark's estimate; none over Spark Connect). ``held``: the partials the driver computed already from the rows
    its source read there (:func:`held_partials`), which it reads only within those bounds (by the sizes its barrier
    recorded): those, with no Spark plan and no estimate. ``None``: Spark merges."""
    struct = state_schema(restored)
    if any(f.dataType.typeName() not in ARROW_MERGEABLE for f in struct.fields):
        return None  # e.g. a struct key: pyarrow cannot group by it
    if held is not None:
        return held
    if node.moves_keys and not hashable(_arrow_schema(struct), node.keys):
        return None  # e.g. a decimal key: the driver cannot file the keys it makes
    partials: DataFrame | None = None
    if within_driver_bounds(settings, restored.rows, lambda: input_size(inputs.values()), first=False):
        partials = node.partials(inputs) if before is None else node.partials_at(inputs, before)
    return partials


def merge_on_driver(
    spark: SparkSession,
    storage: Location,
    directory: str,
    checkpoint_id: int,
    node: StatefulOperator,
    partials: DataFrame | pa.Table,
    restored: OperatorSnapshot,
    layout: StateLayout,
    fault: Callable[[str], None],
    closing: Closing | None = None,
) -> tuple[OperatorSnapshot, LazyFrame, dict[str, int], DriverRows | None]:
    """Merge this checkpoint's input, its per-key ``partials`` (:func:`driver_partials`: a DataFrame collected in
    one Spark job, or a table the driver computed already, :func:`held_partials`), into
    ``restored`` and write the deltas (and the ranges :meth:`StateLayout.to_compact` picks, or
    every range when most keys changed) under ``directory``: the new snapshot, the output
    (:meth:`StatefulOperator.output_of`, its DataFrame made only if a consumer asks: a sink taking the rows the
    driver holds never does), the ack metrics, and that output as the driver holds it (``None`` where only Spark
    computes it).

    Without ``closing``, the output is the new rows of the keys in ``partials``
    (:meth:`StatefulOperator.merge_arrow`), and only the ranges they touch (and those compacted) are
    read. With it (an event-time operator, :meth:`StatefulOperator.merge_at_arrow`), it may delete
    keys the input never names (windows the watermark closes): every range that may hold such a key
    is read too (:meth:`Closing.may_close`), and the output is what ``closing`` says.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    struct = state_schema(restored)
    schema = _arrow_schema(struct)
    columns = schema.names
    if isinstance(partials, pa.Table):
        batch = hashed(partials, node.keys, node.max_parallelism, layout.parallelism, _RANGE)
    else:
        batch = partials.withColumns(
            {_RANGE: range_index(node.keys, node.max_parallelism, layout.parallelism), KEY_HASH: key_hash(node.keys)}
        ).toArrow()
    touched = {int(i) for i in pc.unique(batch[_RANGE]).to_pylist()}
    compact = set(layout.to_compact())
    if not layout.has_deltas and len(batch) >= FULL_VERSION_SHARE * restored.rows:
        compact = set(range(layout.parallelism))  # a delta that large would make every range due
    read = touched | compact
    if closing is not None and closing.every_range:
        read = set(range(layout.parallelism))
    elif closing is not None:
        read |= {i for i, r in enumerate(layout.ranges) if i not in read and closing.may_close(storage, r.handles)}
    state: dict[int, pa.Table] = {
        i: merged_rows(storage, restored, layout.ranges[i].handles, node.uid).cast(schema) for i in sorted(read)
    }
    rows = [t.append_column(_RANGE, pa.array(np.full(len(t), i, np.int32))) for i, t in state.items()]
    old = pa.concat_tables(rows) if rows else schema.append(pa.field(_RANGE, pa.int32())).empty_table()
    new = batch.cast(_with_range(schema, batch))
    if closing is None:
        merged = node.merge_arrow(old, new)
        changes, shown = merged.append_column(DELETED, pa.array(np.zeros(len(merged), np.bool_))), merged
    else:
        changes, shown = closing.merge(
            old, new, lambda t: range_indexes(t, node.keys, node.max_parallelism, layout.parallelism)
        )

    def changes_in(i: int) -> pa.Table:
        own = changes.filter(pc.equal(changes[_RANGE], i)).select([*columns, DELETED])
        return own.append_column(SEQ, pa.array(np.full(len(own), checkpoint_id, np.int64)))

    column = None if closing is None else closing.column
    fault("step.before_state_write")
    written: dict[int, list[StateHandle]] = {}
    for i in sorted({int(i) for i in pc.unique(changes[_RANGE]).to_pylist()} - compact):
        span = layout.ranges[i].key_groups
        delta = changes_in(i)
        written[i] = [write_state_file(storage, state_file(directory, "delta", i), delta, span, checkpoint_id, column)]
    compacted: dict[int, list[StateHandle]] = {}
    if compact:
        fault("step.during_compaction")
    for i in sorted(compact):
        full = overlay(state[i], changes_in(i), node.keys)
        span = layout.ranges[i].key_groups
        path = state_file(directory, "compacted", i)
        compacted[i] = [write_state_file(storage, path, full, span, None, column)] if len(full) else []
    fault("step.after_state_write")
    inserted = int(pc.sum(changes[NEW]).as_py() or 0)
    deleted = int(pc.sum(changes[DELETED]).as_py() or 0)  # a deleted key had state: never new
    snapshot = OperatorSnapshot(
        handles=layout.handles_after(written, compacted),
        schema=restored.schema,
        keys=node.keys,
        max_parallelism=node.max_parallelism,
        rows=restored.rows + inserted - deleted,
    )
    new_files = [h for hs in (*written.values(), *compacted.values()) for h in hs]
    metrics = {
        "state_rows": snapshot.rows,
        "state_bytes": sum(h.size for h in new_files),
        "state_files": len(new_files),
        "state_keys_changed": len(changes),
        "state_ranges_compacted": len(compact),
        "state_size": snapshot.size,
        "state_merged_on_driver": 1,
        "state_incremental": int(bool(restored.handles)),  # else a first state
    }
    new_rows = shown.select(columns)
    output = LazyFrame(
        node.output_of(arrow_frame(spark, new_rows.slice(0, 0), struct)).schema,  # no rows: no data to the JVM
        lambda: node.output_of(arrow_frame(spark, new_rows, struct)),
    )
    if closing is not None:
        return snapshot, output, metrics, None
    shown_rows = node.output_arrow(new_rows)
    held = None if shown_rows is None else DriverRows(shown_rows.append_column(KEY_HASH, shown[KEY_HASH]), node.keys)
    return snapshot, output, metrics, held


def held_partials(
    node: StatefulOperator, held: Mapping[str, pa.Table] | None, before: WatermarkProgress | None
) -> pa.Table | None:
    """The per-key partials of ``node``'s one input computed by the driver (:meth:`StatefulOperator.partials_arrow`)
    from the rows its source read there (``held``, by source uid), when the driver hashes its keys as Spark does
    (:func:`~airflow_provider_checkpoint.state.spark_hash.hashable`); ``None``: Spark computes them, as it does for an
    operator with event time (``before``: the watermark before this checkpoint), whose partials leave out the rows late
    by it (:meth:`StatefulOperator.partials_at`)."""
    if before is not None or not held or len(node.inputs) != 1 or node.inputs[0].uid not in held:
        return None
    partials = node.partials_arrow(held[node.inputs[0].uid])
    return partials if partials is not None and hashable(partials, node.keys) else None


def hashed(rows: pa.Table, keys: Sequence[str], max_parallelism: int, parallelism: int, range_name: str) -> pa.Table:
    """``rows`` with their key-group range (of ``parallelism``) in ``range_name`` and :data:`KEY_HASH`, as Spark's
    :func:`~airflow_provider_checkpoint.state.spark_backend.range_index` and :func:`key_hash` give them."""
    from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of

    hashes = xxhash64(rows, keys).view("int64")
    ranges = ranges_of(hashes, max_parallelism, parallelism)
    return rows.append_column(range_name, arrow_of(ranges)).append_column(KEY_HASH, arrow_of(hashes))


def first_on_driver(
    spark: SparkSession,
    storage: Location,
    directory: str,
    checkpoint_id: int,
    node: StatefulOperator,
    inputs: Mapping[str, DataFrame],
    settings: CheckpointSettings,
    watermarks: tuple[WatermarkProgress, WatermarkProgress],
    fault: Callable[[str], None],
) -> tuple[OperatorSnapshot, LazyFrame, dict[str, int], DriverRows | None] | None:
    """An event-time operator's first state merged on the driver as its later checkpoints are
    (:func:`merge_on_driver` into an empty state: every range written whole), when that merge applies
    (:func:`driver_partials`) and Spark expects more input rows than ``inline_state_threshold`` bytes
    (a smaller state may be kept inline); else ``None``."""
    estimate = first_state_rows([inputs[n.uid] for n in node.inputs], settings.inline_state_threshold)
    if estimate is None:
        return None
    schema = as_nullable(node.initial_state(spark, inputs).schema).json()  # as state files read back
    empty = OperatorSnapshot(handles=(), schema=schema, keys=node.keys, max_parallelism=node.max_parallelism, rows=0)
    partials = driver_partials(node, inputs, empty, settings, watermarks[0])
    if partials is None:
        return None
    layout = StateLayout.empty(node.max_parallelism, ranges_for(estimate, node.max_parallelism))
    closing = Closing.of(node, watermarks[1])
    return merge_on_driver(spark, storage, directory, checkpoint_id, node, partials, empty, layout, fault, closing)


@dataclass(frozen=True)
class Closing:
    """How an event-time operator's checkpoint merges on the driver (:func:`merge_on_driver`).

    ``merge(state, partials, ranges)``: given the state rows of the ranges read and the checkpoint's
    partials (both with their range in ``__kgr``), and how to find the range of a key, the changed rows
    (the state columns, ``__deleted``, ``__new`` and ``__kgr``; a deleted row had state) and the output
    rows. ``column`` (a timestamp column) and ``closes_below`` (µs since the epoch): a key whose
    ``column`` is below it may be deleted without input; a range none of whose files may hold one (by
    their handles' :attr:`StateHandle.least_end`) is not read. ``None``: no key is deleted without input.
    ``every_range``: every range is read (the merge moves keys, :attr:`StatefulOperator.moves_keys`).
    """

    merge: Callable[[pa.Table, pa.Table, Ranges], tuple[pa.Table, pa.Table]]
    column: str
    closes_below: int | None
    every_range: bool = False

    @classmethod
    def of(cls, node: StatefulOperator, after: WatermarkProgress) -> Closing:
        """``node``'s (:meth:`StatefulOperator.merge_at_arrow`) with the watermark ``after`` the checkpoint."""
        column, below = node.closes_below(after)
        merge = partial(_merge_at, node, after)
        return cls(merge, column, below, node.moves_keys)

    def may_close(self, storage: Location, handles: Sequence[StateHandle]) -> bool:
        """Whether a file of ``handles`` may hold a key the watermark closes: by the least value its handle
        records, read from nowhere; for a handle without one (written before handles recorded it), by the
        file's footer (one read)."""
        if self.closes_below is None:
            return False
        for handle in handles:
            least = handle.least_end if handle.least_end is not None else _footer_least(storage, handle, self.column)
            if least is None or least < self.closes_below:
                return True
        return False


def closing_column(node: StatefulOperator, after: WatermarkProgress) -> str | None:
    """``node``'s closing column (:meth:`StatefulOperator.closes_below`), ``None`` if it deletes no key
    without input, so its state files' handles record no :attr:`StateHandle.least_end`."""
    if type(node).closes_below is StatefulOperator.closes_below:
        return None
    return node.closes_below(after)[0]


def _footer_least(storage: Location, handle: StateHandle, column: str) -> int | None:
    """The least value (µs) of the timestamp ``column`` in a state file by its footer's statistics (no
    data read); ``None`` when the footer does not tell (e.g. Spark's INT96 timestamps have none)."""
    import pyarrow.parquet as pq

    with storage.fs.open(storage.path(handle.path), "rb") as f:
        meta = pq.ParquetFile(f).metadata
    found = [i for i in range(meta.num_columns) if meta.schema.column(i).path == column]
    if not found or meta.schema.column(found[0]).physical_type != "INT64":
        return None
    if "micro" not in str(meta.schema.column(found[0]).logical_type).lower():
        return None
    lows = []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(found[0]).statistics
        if stats is None or not stats.has_min_max:
            return None
        lows.append(int(stats.min_raw))
    return min(lows) if lows else None


def _merge_at(
    node: StatefulOperator, after: WatermarkProgress, state: pa.Table, partials: pa.Table, ranges: Ranges
) -> tuple[pa.Table, pa.Table]:
    return node.merge_at_arrow(state, partials, after, ranges)


def _arrow_schema(struct: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct, timezone="UTC")


def _with_range(schema: pa.Schema, batch: pa.Table) -> pa.Schema:
    """``batch``'s schema with the state's column types (e.g. no large strings)."""
    import pyarrow as pa

    return pa.schema([schema.field(f.name) if f.name in schema.names else f for f in batch.schema])


def state_file(directory: str, kind: str, index: int) -> str:
    return f"{directory}/{kind}/kgr={index}/part-{uuid.uuid4().hex}.parquet"
