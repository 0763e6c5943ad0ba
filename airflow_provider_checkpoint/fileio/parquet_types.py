"""A Parquet file's columns read into a declared schema with exactly the values Spark's Parquet reader gives, or
refused.

Spark's reader (the vectorized one, Spark 4) matches names ignoring case (nested fields too) and converts a
file's type to the declared one only along some paths; elsewhere it refuses, or gives values pyarrow's
``cast`` would not (an ``int32`` declared ``TINYINT`` wraps, a ``uint32`` declared ``DOUBLE`` reads as
signed, a decimal declared ``DOUBLE`` reads its unscaled integer). :func:`convert` takes only the paths
where both agree for every value, checked with Spark as the oracle
(``tests/spark/test_python_parquet_types.py``); any other pair of types is refused with a
:class:`ParquetTypeError` naming the file, the column and both types:

- a type read as itself (a string or binary's large variant, a list's item name aside);
- a signed integer widened (``int8``/``int16``/``int32`` to a wider integer, to ``DOUBLE``, or to a
  ``DECIMAL`` of at least 10 integer digits; ``int64`` to a ``DECIMAL`` of at least 20); ``uint8`` and
  ``uint16`` to a wider signed integer or ``DOUBLE``, ``uint32`` to ``BIGINT``; ``FLOAT`` to ``DOUBLE``;
- a decimal to one of no smaller scale and no fewer integer digits;
- a string to ``BINARY``, a binary to ``STRING`` (valid UTF-8 only);
- a date to ``DATE``, ``TIMESTAMP_NTZ`` (its midnight) or ``INT`` (its days);
- a timestamp of milliseconds or microseconds (with or without a zone), or INT96 (read in microseconds,
  rounded down as Spark does), to ``TIMESTAMP`` or ``TIMESTAMP_NTZ`` (its UTC wall clock);
- arrays, maps and structs of these, a struct's fields matched by name ignoring case (a missing one null).

Dates before 1582-10-15 and timestamps before 1900 are refused where Spark would rebase them from the
hybrid calendar or refuse them (:func:`check_rebase`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

OLDEST_DATE_DAYS = -141427
"""1582-10-15, the Gregorian calendar's first day: Spark may rebase or refuse an older date."""
OLDEST_TIMESTAMP_US = -2208988800 * 1_000_000
"""1900-01-01T00:00:00Z: Spark may rebase or refuse an older timestamp (time zones' rebase differs before it)."""
REBASE_CONF = "spark.sql.parquet.datetimeRebaseModeInRead"
INT96_REBASE_CONF = "spark.sql.parquet.int96RebaseModeInRead"


class ParquetTypeError(ValueError):
    """A Parquet file's column the Python engine cannot read as declared with exactly Spark's values."""


def file_columns(found: Sequence[str], declared: Sequence[str], where: str) -> dict[str, str]:
    """The columns (or a struct's fields) of a Parquet file to read, each to the declared name it is read as:
    matched ignoring case, as Spark's reader matches them in a case-insensitive session (a declared name no
    file column matches reads as null); a declared name two file columns match is refused, as Spark
    refuses it."""
    matched: dict[str, str] = {}
    for name in declared:
        folded = [f for f in found if f.lower() == name.lower()]
        if len(folded) > 1:
            raise ParquetTypeError(
                f"Parquet file {where}: found duplicate fields {folded} for declared column {name!r}, equal "
                "ignoring case (Spark's reader refuses them too, the session being case-insensitive); rename one"
            )
        if folded:
            matched[folded[0]] = name
    return matched


def convert(array: pa.Array, declared: pa.DataType, where: str, column: str) -> pa.Array:
    """``array`` (a file's column ``column``, INT96 read in microseconds) as Spark reads it into ``declared``;
    :class:`ParquetTypeError` where the types are not a path of the module doc."""
    import pyarrow as pa
    import pyarrow.types as pt

    found = array.type
    if pt.is_dictionary(found):
        return convert(array.dictionary_decode(), declared, where, column)
    if _nested(found) or _nested(declared):
        return _convert_nested(array, declared, where, column)
    if not _readable(found, declared):
        raise ParquetTypeError(
            f"Parquet file {where}: column {column!r} is {found} in the file, declared {declared}: Spark's reader "
            "refuses it or reads other values than a cast would; declare the file's type (or read it with Spark)"
        )
    try:
        return array.cast(declared)
    except pa.ArrowInvalid as e:  # a binary that is not UTF-8
        raise ParquetTypeError(
            f"Parquet file {where}: column {column!r} ({found}) does not read as {declared}: {e}"
        ) from e


def _nested(t: pa.DataType) -> bool:
    import pyarrow.types as pt

    return bool(pt.is_list(t) or pt.is_large_list(t) or pt.is_map(t) or pt.is_struct(t) or pt.is_fixed_size_list(t))


def _convert_nested(array: pa.Array, declared: pa.DataType, where: str, column: str) -> pa.Array:
    import pyarrow as pa
    import pyarrow.types as pt

    found = array.type
    nulls = array.is_null() if array.null_count else None
    if pt.is_map(found) and pt.is_map(declared):
        entries = array.values  # the offsets index them
        keys = convert(entries.field(0), declared.key_type, where, f"{column}.key")
        items = convert(entries.field(1), declared.item_type, where, f"{column}.value")
        return pa.MapArray.from_arrays(array.offsets, keys, items, type=declared, mask=nulls)
    if (pt.is_list(found) or pt.is_large_list(found)) and pt.is_list(declared):
        values = convert(array.values, declared.value_type, where, f"{column}.element")
        return pa.ListArray.from_arrays(array.offsets.cast(pa.int32()), values, type=declared, mask=nulls)
    if pt.is_struct(found) and pt.is_struct(declared):
        names = [found.field(i).name for i in range(found.num_fields)]
        matched = {name: f for f, name in file_columns(names, [d.name for d in declared], where).items()}
        children = [
            convert(array.field(matched[d.name]), d.type, where, f"{column}.{d.name}")
            if d.name in matched
            else pa.nulls(len(array), d.type)
            for d in declared
        ]
        return pa.StructArray.from_arrays(children, fields=list(declared), mask=nulls)
    raise ParquetTypeError(
        f"Parquet file {where}: column {column!r} is {found} in the file, declared {declared}: Spark's reader "
        "refuses it or reads other values; declare the file's type (or read it with Spark)"
    )


def _readable(found: pa.DataType, declared: pa.DataType) -> bool:
    """Whether a flat column of type ``found`` reads as ``declared`` by a cast, with Spark's values."""
    import pyarrow as pa
    import pyarrow.types as pt

    if found.equals(declared):
        return True
    strings, binaries = (pa.string(), pa.large_string()), (pa.binary(), pa.large_binary())
    if any(found.equals(t) for t in (*strings, *binaries)) and any(declared.equals(t) for t in (*strings, *binaries)):
        return True
    if pt.is_fixed_size_binary(found):
        return any(declared.equals(t) for t in binaries)
    if pt.is_signed_integer(found) or pt.is_unsigned_integer(found):
        return _widened_integer(found, declared)
    if pt.is_float32(found):
        return pt.is_float64(declared)
    if pt.is_decimal(found) and pt.is_decimal(declared):
        return declared.scale >= found.scale and declared.precision - declared.scale >= found.precision - found.scale
    if pt.is_date32(found):
        return pt.is_int32(declared) or (pt.is_timestamp(declared) and declared.tz is None)
    if pt.is_timestamp(found) and pt.is_timestamp(declared):
        return found.unit in ("s", "ms", "us") and declared.unit == "us" and declared.tz in (None, "UTC")
    return False


def _widened_integer(found: pa.DataType, declared: pa.DataType) -> bool:
    import pyarrow.types as pt

    bits = found.bit_width
    if pt.is_unsigned_integer(found):  # Spark reads uint8 and uint16 as INT32, uint32 as INT64
        wider = pt.is_signed_integer(declared) and declared.bit_width > bits
        return (bits <= 16 and (wider or pt.is_float64(declared))) or (bits == 32 and pt.is_int64(declared))
    if pt.is_signed_integer(declared):
        return declared.bit_width >= bits
    if pt.is_float64(declared):
        return bits <= 32
    if pt.is_decimal(declared):
        return declared.precision - declared.scale >= (10 if bits <= 32 else 20)
    return False


def rebase_modes(
    file: Any, names: Mapping[str, str], schema: pa.Schema, where: str, rebase: tuple[str, str], int96_conversion: bool
) -> dict[str, str]:
    """By column of the ``pyarrow.parquet.ParquetFile`` ``file`` to read (``names``: file column -> declared one
    of ``schema``): how Spark reads its dates and timestamps (:func:`rebase_mode`; ``rebase``: the session's
    modes for dates and timestamps, and for INT96). Refuses a column whose type does not read as declared
    (:func:`convert`) before any row, a file of none too, and INT96 columns when ``int96_conversion`` (the
    session's ``spark.sql.parquet.int96TimestampConversion``) is on."""
    import pyarrow as pa

    for name, declared in names.items():
        convert(pa.nulls(0, file.schema_arrow.field(name).type), schema.field(declared).type, where, name)
    int96 = {c.path.split(".")[0] for c in file.schema if c.physical_type == "INT96"}
    if int96 & set(names) and int96_conversion:
        raise ParquetTypeError(
            f"Parquet file {where}: INT96 columns {sorted(int96 & set(names))} with "
            "spark.sql.parquet.int96TimestampConversion on are read by Spark's reader only"
        )
    meta = file.metadata.metadata
    return {n: rebase_mode(meta, rebase[n in int96], n in int96) for n in names}


def conform(
    batch: pa.RecordBatch, names: Mapping[str, str], schema: pa.Schema, modes: Mapping[str, str], where: str
) -> pa.RecordBatch:
    """``batch`` (of the file columns ``names``, each to its declared name) with exactly ``schema``'s columns as
    Spark reads them (:func:`convert`, :func:`check_rebase` by ``modes``; a column the file lacks is null)."""
    import pyarrow as pa

    read = {names[n]: n for n in batch.schema.names}
    columns = []
    for f in schema:
        if f.name not in read:
            columns.append(pa.nulls(batch.num_rows, f.type))
            continue
        column = convert(batch.column(read[f.name]), f.type, where, read[f.name])
        check_rebase(column, modes[read[f.name]], where, read[f.name])
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def rebase_mode(metadata: Mapping[bytes, bytes] | None, configured: str, int96: bool = False) -> str:
    """How Spark reads a file's dates and timestamps (``CORRECTED``, ``LEGACY`` or ``EXCEPTION``) by its
    key-value ``metadata``, as ``DataSourceUtils.datetimeRebaseSpec``: a file Spark 3+ wrote as is, one an
    older Spark or one with the legacy mark wrote rebased, any other by the session's ``configured`` mode."""
    meta = metadata or {}
    version = meta.get(b"org.apache.spark.version")
    if version is None:
        return configured.upper()
    legacy = b"org.apache.spark.legacyINT96" if int96 else b"org.apache.spark.legacyDateTime"
    major = version.decode("utf-8", "replace").split(".")[0]
    old = not major.isdigit() or int(major) < 3
    return "LEGACY" if old or legacy in meta else "CORRECTED"


def check_rebase(column: pa.Array, mode: str, where: str, name: str) -> None:
    """Refuse a date before 1582-10-15 or a timestamp before 1900 (the declared columns, nested ones too)
    unless Spark reads the file as is (``mode`` ``CORRECTED``): it would rebase or refuse them."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as pt

    if mode == "CORRECTED":
        return
    t = column.type
    if pt.is_struct(t):
        for i in range(t.num_fields):
            check_rebase(column.field(i), mode, where, f"{name}.{t.field(i).name}")
        return
    if pt.is_list(t) or pt.is_large_list(t):
        check_rebase(column.flatten(), mode, where, name)
        return
    if pt.is_map(t):
        check_rebase(column.keys, mode, where, name)
        check_rebase(column.items, mode, where, name)
        return
    limit = OLDEST_DATE_DAYS if pt.is_date32(t) else OLDEST_TIMESTAMP_US if pt.is_timestamp(t) else None
    if limit is None or not len(column):
        return
    oldest = pc.min(column.cast(pa.int32() if pt.is_date32(t) else pa.int64())).as_py()
    if oldest is not None and oldest < limit:
        raise ParquetTypeError(
            f"Parquet file {where}: column {name!r} holds a date before 1582-10-15 or a timestamp before 1900, "
            f"which Spark's reader rebases from the hybrid calendar or refuses (rebase mode {mode}); read it with "
            f"Spark, or set {REBASE_CONF} (and {INT96_REBASE_CONF}) to CORRECTED if it was written proleptic"
        )
