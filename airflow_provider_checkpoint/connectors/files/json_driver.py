"""JSON Lines inputs read on the driver with pyarrow, only where that gives exactly Spark's rows.

A file source whose only consumer merges its state on the driver (a keyed aggregate, :mod:`~.state.driver_merge`)
hands it the rows pyarrow reads, with no Spark job. Those rows must be the ones Spark's JSON Lines reader gives
with the declared schema (permissive, no reader options), in source order, with no malformed record. So
:func:`read_json_exactly` returns ``None`` (Spark reads the files, and judges malformed records as it always
does) unless every one of these holds, and otherwise pyarrow's own parse raises:

- every declared column is a string, a long or a boolean (no number Spark and pyarrow could convert
  differently, no date or timestamp with its time zones and formats);
- no file name ends like a compressed file (Spark decompresses by the name);
- each file has exactly the size the barrier recorded (else the caller refuses it), is valid UTF-8 with no
  byte-order mark and no control character but the line feed (a tab or carriage return, even between tokens,
  sends it to Spark), holds no escaped surrogate, and each of its lines starts with ``{`` and ends with ``}``
  (no blank line, no space around a record);
- pyarrow parses every line into exactly one row, with no field the schema does not declare (a name that
  differs from a declared one only in case is such a field), and no value of another type than declared
  (pyarrow raises where Spark would keep a malformed record or convert a number into a string).

The test ``tests/spark/test_json_driver.py`` holds Spark as the oracle: on generated messy lines, every
answer that is not ``None`` equals Spark's rows, and Spark finds no malformed record in it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa
    from pyspark.sql.types import StructType


EXACT_TYPES = {"string": "string", "long": "int64", "boolean": "bool"}
"""Spark types (``typeName``) of declared columns read on the driver, and their Arrow types."""
CODEC_SUFFIXES = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst", ".xz", ".br", ".lzo", ".z")
"""File name endings Spark's reader decompresses (a Hadoop codec's extension): read by Spark."""
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_CONTROLS = bytes(range(0x20)).replace(b"\n", b"")


def arrow_schema(declared: StructType) -> pa.Schema | None:
    """The Arrow schema of ``declared`` read on the driver (every column nullable), ``None`` if a column's
    type is not one pyarrow reads exactly as Spark (:data:`EXACT_TYPES`) or two names repeat."""
    import pyarrow as pa

    names = [f.name for f in declared.fields]
    types = [EXACT_TYPES.get(f.dataType.typeName()) for f in declared.fields]
    if not names or None in types or len({n.lower() for n in names}) < len(names):
        return None
    return pa.schema([pa.field(n, t) for n, t in zip(names, types, strict=True)])


def read_json_exactly(
    fs: fsspec.AbstractFileSystem,
    paths: Sequence[str],
    sizes: Sequence[int],
    declared: StructType,
    changed: Callable[[int, int], None],
) -> pa.Table | None:
    """The rows of the JSON Lines files ``paths`` (in this order, each file's lines in order) as Spark's JSON
    reader gives them with ``declared`` (``toArrow``'s types, no ``_corrupt_record``), when none is malformed;
    ``None`` wherever pyarrow's answer could differ from Spark's (module doc). ``sizes``: each file's size at
    the barrier; ``changed(i, size)`` is called when file ``i`` has another ``size`` (it raises: the file changed
    after the barrier, whoever reads it), else that file is left to Spark."""
    import pyarrow as pa

    schema = arrow_schema(declared)
    if schema is None or any(p.lower().endswith(CODEC_SUFFIXES) for p in paths):
        return None
    tables = []
    for i, (path, size) in enumerate(zip(paths, sizes, strict=True)):
        data = fs.cat_file(path)
        if len(data) != size:
            changed(i, len(data))
            return None
        table = parse_lines(data, schema)
        if table is None:
            return None
        tables.append(table)
    return pa.concat_tables(tables) if tables else schema.empty_table()


def parse_lines(data: bytes, schema: pa.Schema) -> pa.Table | None:
    """The rows of the JSON Lines ``data`` in ``schema``, one per line, or ``None`` (module doc)."""
    import pyarrow as pa
    import pyarrow.json as pj

    if not data:
        return schema.empty_table()
    body = data[:-1] if data.endswith(b"\n") else data
    lines = body.count(b"\n") + 1
    # every line one object: "{" first, "}" last (pyarrow crashes on a buffer that starts with a bare null)
    if not (body.startswith(b"{") and body.endswith(b"}")) or body.count(b"\n{") + 1 != lines:
        return None
    if body.count(b"}\n") + 1 != lines or len(body.translate(None, _CONTROLS)) != len(body):
        return None
    if b"\xef\xbb\xbf" in body or (b"\\u" in body and _SURROGATE.search(body)):
        return None
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error", newlines_in_values=False)
    try:
        table = pj.read_json(pa.py_buffer(data), parse_options=options)
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != lines or table.schema != schema:
        return None
    return table
