"""Keyed state read with pyarrow alone (no Spark): full versions merged with their deltas.

Used where the provider runs without Spark — savepoints written by finalize,
:func:`~airflow_provider_checkpoint.restore.requests.read_state` — with the same merge as
:func:`airflow_provider_checkpoint.state.spark_backend.merge`: per key the newest delta row wins,
a tombstone deletes the key, a null key is a key like any other.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.checksums import checksum_of
from airflow_provider_checkpoint.exceptions import StateFileError, redact
from airflow_provider_checkpoint.state.handles import NOTHING_CLOSES, OperatorSnapshot, StateHandle
from airflow_provider_checkpoint.state.incremental import StateLayout, merge_order
from airflow_provider_checkpoint.storage import Location
from airflow_provider_checkpoint.storage.job_storage import inline_parquet

if TYPE_CHECKING:
    import pyarrow as pa

DELETED, SEQ = "__deleted", "__seq"
_ARROW_NAMES = {
    "string": ("string", "large_string"),
    "binary": ("binary", "large_binary"),
    "boolean": ("bool",),
    "byte": ("int8",),
    "short": ("int16",),
    "integer": ("int32",),
    "long": ("int64",),
    "float": ("float",),
    "double": ("double",),
    "date": ("date32[day]",),
}
"""Spark's simple types and the pyarrow types Parquet files of them read as."""


DAMAGED = "damaged state file"
"""How a state file that fails to decode is named (here and in Spark's reads of it)."""


@contextmanager
def decoding(where: str, uid: str) -> Iterator[None]:
    """Decoding the state ``where`` (a file's URL) of operator ``uid`` inside: a damaged page (its checksum)
    or footer (its Thrift) raises :class:`StateFileError` naming the file and the operator."""
    import pyarrow as pa

    try:
        yield
    except (OSError, pa.ArrowException) as e:
        raise StateFileError(redact(f"{DAMAGED} {where} of operator {uid!r}: {e}")) from e


def check_file(
    base: Location, handle: StateHandle, state: OperatorSnapshot, uid: str, data: bytes | None = None
) -> None:
    """The columns in the Parquet footer of ``handle`` are those ``state`` records (one small read, none
    given the file's bytes ``data``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pa.BufferReader(data) if data is not None else base.fs.open(base.path(handle.path), "rb") as f:
        try:
            schema = pq.read_schema(f)
        except pa.ArrowException as e:
            raise StateFileError(f"state file {base.url(handle.path)} of operator {uid!r} is not Parquet: {e}") from e
    check_columns(schema, state, handle.delta is not None, base.url(handle.path), uid)


def check_columns(schema: pa.Schema, state: OperatorSnapshot, delta: bool, where: str, uid: str) -> None:
    """Raise :class:`StateFileError` unless ``schema`` has exactly the recorded state columns, with
    types of the recorded kinds (a delta: also ``__deleted`` and ``__seq``); ``where`` names the file."""
    expected = _recorded_columns(state, uid)
    if delta:
        expected |= {DELETED: "boolean", SEQ: "long"}
    problems = []
    missing = [name for name in expected if name not in schema.names]
    if missing:
        keys = [k for k in state.keys if k in missing]
        problems.append(f"missing column(s) {missing}" + (f", among them declared key(s) {keys}" if keys else ""))
    unexpected = [name for name in schema.names if name not in expected]
    if unexpected:
        problems.append(f"unexpected column(s) {unexpected}")
    for field in schema:
        if field.name in expected and not _same_kind(expected[field.name], field.type):
            problems.append(f"column {field.name!r} is {field.type}, recorded as {json.dumps(expected[field.name])}")
    if problems:
        raise StateFileError(
            f"state file {where} of operator {uid!r} does not match the state schema recorded in its _metadata: "
            + "; ".join(problems)
        )


def _recorded_columns(state: OperatorSnapshot, uid: str) -> dict[str, Any]:
    """Column name → Spark type (JSON form) of the state schema recorded for operator ``uid``."""
    try:
        return {f["name"]: f["type"] for f in json.loads(state.schema)["fields"]}
    except (ValueError, KeyError, TypeError) as e:
        raise StateFileError(
            f"the state schema recorded for operator {uid!r} in its _metadata is not a Spark struct schema: {e!r}"
        ) from e


def _same_kind(spark_type: Any, arrow_type: pa.DataType) -> bool:
    """``arrow_type`` can hold Spark type ``spark_type`` (JSON form); types it cannot judge pass."""
    import pyarrow as pa

    if pa.types.is_null(arrow_type):  # a column of nulls only
        return True
    if isinstance(spark_type, dict):
        kind = spark_type.get("type")
        checks = {"struct": pa.types.is_struct, "array": _is_list, "map": pa.types.is_map}
        return kind not in checks or checks[kind](arrow_type)
    if spark_type in _ARROW_NAMES:
        return str(arrow_type) in _ARROW_NAMES[spark_type]
    if spark_type.startswith("timestamp"):
        return bool(pa.types.is_timestamp(arrow_type))
    if spark_type.startswith("decimal"):
        return bool(pa.types.is_decimal(arrow_type))
    return True


def _is_list(arrow_type: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type))


def read_table(base: Location, state: OperatorSnapshot, uid: str) -> pa.Table:
    """The whole state of operator ``uid`` (checksums unchecked: verify them first; columns checked)."""
    if state.inline is not None:
        return read_inline(state, uid)
    return merged_rows(base, state, state.handles, uid)


def read_inline(state: OperatorSnapshot, uid: str) -> pa.Table:
    """The inline state of operator ``uid``, checked against its recorded columns."""
    import pyarrow.parquet as pq

    where = f"(inline in _metadata, {state.size} bytes)"
    with decoding(where, uid):
        table = pq.read_table(io.BytesIO(inline_parquet(state, uid)))
    check_columns(table.schema, state, False, where, uid)
    return table


def range_tables(base: Location, state: OperatorSnapshot, uid: str) -> Iterator[tuple[tuple[int, int], pa.Table]]:
    """The merged state per key-group range (all key groups at once if the files have no ranges)."""
    layout = StateLayout.of(state)
    if layout is None:
        yield (0, state.max_parallelism - 1), merged_rows(base, state, state.handles, uid)
        return
    for r in layout.ranges:
        yield r.key_groups, merged_rows(base, state, r.handles, uid)


def merged_rows(base: Location, state: OperatorSnapshot, handles: Sequence[StateHandle], uid: str) -> pa.Table:
    """The state rows held by ``handles`` (full versions overlaid with their deltas; columns checked)."""
    full, deltas = merge_order(tuple(handles))
    table = _concat(base, full, state, uid)
    if not deltas:
        return table
    changes = _concat(base, [h for _, hs in deltas for h in hs], state, uid)
    if _types(table) != {n: t for n, t in _types(changes).items() if n in table.column_names}:
        table, changes = with_instants(table, state, uid), with_instants(changes, state, uid)  # see _concat
    return overlay(table, changes, state.keys)


def _types(table: pa.Table) -> dict[str, pa.DataType]:
    return {f.name: f.type for f in table.schema}


def overlay(table: pa.Table, changes: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``table`` (one row per key) with ``changes`` applied: rows of its columns plus ``__deleted``
    and ``__seq``; per key the row with the highest ``__seq`` wins over older ones and over
    ``table``'s row, and a tombstone deletes the key (a null key is a key like any other)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    changes = changes.select([*table.column_names, DELETED, SEQ])
    if any(changes[k].null_count for k in keys):  # joins never match null keys: group instead
        return _newest(table, changes, keys)
    if len(pc.unique(changes[SEQ])) > 1:  # several checkpoints' deltas: the newest row per key
        changes = _newest(changes.slice(0, 0), changes, keys, drop=False)
    kept = table
    if len(table):  # joined by keys and row number: a join carries no list or binary value column
        rows = table.select(list(keys)).append_column("__row", pa.array(np.arange(len(table), dtype=np.int64)))
        kept_rows = rows.join(changes.select(list(keys)), list(keys), join_type="left anti", use_threads=False)
        kept = table.take(np.sort(kept_rows["__row"].to_numpy()))
    alive = changes.filter(pc.invert(pc.fill_null(changes[DELETED], False))).drop_columns([DELETED, SEQ])
    return pa.concat_tables([kept.select(table.column_names), alive], promote_options="permissive")


def _newest(table: pa.Table, changes: pa.Table, keys: Sequence[str], drop: bool = True) -> pa.Table:
    """Per key the row of ``changes`` with the highest ``__seq``, else ``table``'s row, by
    grouping (null keys group together); ``drop``: without tombstones and their columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if DELETED not in table.column_names:
        rows = len(table)
        table = table.append_column(DELETED, pa.array(np.zeros(rows, np.bool_)))
        table = table.append_column(SEQ, pa.array(np.full(rows, -1, np.int64)))
    both = pa.concat_tables([table, changes.select(table.column_names)], promote_options="permissive")
    both = both.append_column("__row", pa.array(np.arange(len(both), dtype=np.int64)))
    newest = both.sort_by([(SEQ, "descending"), ("__row", "ascending")])
    first = newest.group_by(list(keys), use_threads=False).aggregate([("__row", "first")])["__row_first"]
    latest = both.take(pc.take(first, pc.sort_indices(first))).drop_columns(["__row"])
    if not drop:
        return latest
    return latest.filter(pc.invert(pc.fill_null(latest[DELETED], False))).drop_columns([DELETED, SEQ])


def with_instants(table: pa.Table, state: OperatorSnapshot, uid: str) -> pa.Table:
    """``table`` with each column recorded as a Spark ``timestamp`` (an instant) typed as one: Spark's INT96
    files read back without a time zone, and Spark reads such a column back only as ``timestamp_ntz``."""
    import pyarrow as pa

    recorded = _recorded_columns(state, uid)
    for i, field in enumerate(table.schema):
        if recorded.get(field.name) == "timestamp" and pa.types.is_timestamp(field.type) and field.type.tz is None:
            instant = pa.timestamp("us", tz="UTC")
            table = table.set_column(i, field.with_type(instant), table.column(i).cast(instant))
    return table


def write_state_file(
    base: Location,
    relative: str,
    table: pa.Table,
    key_groups: tuple[int, int] | None,
    delta: int | None = None,
    closing: str | None = None,
) -> StateHandle:
    """Write ``table`` as the Parquet file ``relative`` and return its handle, hashed from the
    bytes written rather than read back. Zstandard without dictionaries (state rows are mostly
    distinct keys and values: a third smaller than Spark's default Snappy with dictionaries),
    with page checksums. ``closing``: the operator's closing column, whose least live value the
    handle records (:attr:`StateHandle.least_end`)."""
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", use_dictionary=False, write_page_checksum=True)
    data = buffer.getvalue()
    base.write_atomic(relative, data)
    least = None if closing is None else least_live(table, closing)
    return StateHandle(relative, len(data), checksum_of([data]), key_groups, delta, least)


def least_live(table: pa.Table, column: str) -> int:
    """The least value (µs since the epoch) of the timestamp ``column`` over the live rows of ``table`` (a
    tombstone, ``__deleted``, is not live), :data:`NOTHING_CLOSES` when none has one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = table[column]
    if DELETED in table.column_names:
        values = values.filter(pc.invert(pc.fill_null(table[DELETED], False)))
    micros = values.cast(pa.timestamp("us", tz=values.type.tz), safe=False).cast(pa.int64())
    least = pc.min(micros).as_py()
    return NOTHING_CLOSES if least is None else int(least)


def least_in_file(base: Location, relative: str, column: str) -> int:
    """:func:`least_live` of the state file ``relative``, reading only that column (and the tombstones)."""
    import pyarrow.parquet as pq

    with base.fs.open(base.path(relative), "rb") as f:
        file = pq.ParquetFile(f)
        names = [n for n in (column, DELETED) if n in file.schema_arrow.names]
        return least_live(file.read(columns=names), column)


def _concat(base: Location, handles: Sequence[StateHandle], state: OperatorSnapshot, uid: str) -> pa.Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for handle in handles:
        data, where = base.read_verified(handle, deep=False), base.url(handle.path)
        with decoding(where, uid):
            file = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
        check_columns(file.schema_arrow, state, handle.delta is not None, where, uid)
        with decoding(where, uid):
            tables.append(file.read())
    if len({tuple(_types(t).items()) for t in tables}) > 1:  # files by Spark (INT96 times) and by pyarrow
        tables = [with_instants(t, state, uid) for t in tables]
    if tables:
        return pa.concat_tables(tables, promote_options="default")
    names = [field["name"] for field in json.loads(state.schema)["fields"]]
    return pa.table({name: pa.array([], pa.null()) for name in names})
