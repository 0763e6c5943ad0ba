"""``fileio.arrow_numpy`` against pyarrow's own conversions (the model), and without importing pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, numpy_of, strings_of

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
TYPES += [pa.float32(), pa.float64(), pa.bool_()]


def _values(type_: pa.DataType) -> st.SearchStrategy[object]:
    if pa.types.is_boolean(type_):
        return st.booleans()
    if pa.types.is_floating(type_):
        return st.floats(width=type_.bit_width, allow_nan=False)
    info = np.iinfo(np.dtype(f"{'u' if pa.types.is_unsigned_integer(type_) else 'i'}{type_.bit_width // 8}"))
    return st.integers(int(info.min), int(info.max))


@st.composite
def arrays(draw: st.DrawFn) -> pa.Array | pa.ChunkedArray:
    """An array of one type, maybe with nulls, maybe a slice (an offset into its buffers), maybe chunked."""
    type_ = draw(st.sampled_from(TYPES))
    values = st.one_of(st.none(), _values(type_)) if draw(st.booleans()) else _values(type_)
    chunks = []
    for _ in range(draw(st.integers(1, 2))):
        array = pa.array(draw(st.lists(values, max_size=12)), type_)
        start = draw(st.integers(0, len(array)))
        chunks.append(array.slice(start, draw(st.integers(0, len(array) - start))))
    return pa.chunked_array(chunks, type_) if draw(st.booleans()) else chunks[0]


SLICES = [pa.array(range(10), t).slice(3, 5) for t in (pa.int8(), pa.uint64(), pa.float32())]
SLICES += [pa.array([i % 3 == 0 for i in range(20)]).slice(5, 11), pa.chunked_array([SLICES[0], SLICES[0]])]
"""Arrays with offsets into their buffers (bits for booleans), always checked beside the drawn ones."""
FAST = settings(max_examples=40, deadline=None)


@FAST
@given(arrays())
def test_numpy_of_is_pyarrows_to_numpy(array: pa.Array | pa.ChunkedArray) -> None:
    for a in (array, *SLICES):
        want = a.to_numpy() if isinstance(a, pa.ChunkedArray) else a.to_numpy(zero_copy_only=False)
        got = numpy_of(a)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@FAST
@given(arrays().map(lambda a: a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a), st.integers(1, 3))
def test_arrow_of_is_pa_array(array: pa.Array, step: int) -> None:
    values = array.drop_null().to_numpy(zero_copy_only=False)[::step]  # a strided view too
    got = arrow_of(values)
    want = pa.array(values)
    got.validate(full=True)
    assert got.type == want.type and got.equals(want)


def test_arrow_of_refuses_what_it_does_not_convert() -> None:
    for values in (np.array(["a"]), np.zeros((2, 2)), np.array([1.5], dtype=object)):
        try:
            arrow_of(values)
        except TypeError:
            continue
        raise AssertionError(values)


@given(st.lists(st.text()))
def test_strings_of_equals_pa_array(values: list[str]) -> None:
    values = [v for v in values if v.encode(errors="replace") == v.encode(errors="surrogatepass")]  # encodable
    got = strings_of(values)
    got.validate(full=True)
    assert got.equals(pa.array(values, pa.string()))


def test_neither_imports_pandas_nor_does_the_schema_evolution_read(tmp_path: Path) -> None:
    """In a fresh process: the conversions, reading the values a file holds in columns an upsert's input
    lacks (:func:`~.missing_columns.held_values`, its row 1 deleted), and the key-group ranges of string keys
    a driver merge files its rows by (:func:`~.spark_hash.range_indexes`), the CDC source's decode of text,
    integer and float columns (:func:`~.pgoutput_columns.decode_rows`: its op and table names, the metadata
    columns), the rows an upsert keeps (:func:`~.bucket_merge.kept_rows`: deletes dropped) and the last row of
    each repeated integer key (:func:`~.upsert_rule.latest_in_arrow`, no ``group_by``) import no pandas, nor
    ``pyarrow.acero``."""
    import pickle

    from tests.unit.test_pgoutput import begin, commit, tuple_data
    from tests.unit.test_pgoutput_columns import CATALOG, COLUMNS, relation

    insert = b"I" + (16384).to_bytes(4, "big") + b"N" + tuple_data(1, "x", "1.5")
    stream = [relation(16384, ["id", "a", "c"], b"d"), begin(0x100, 7), insert, commit(0x100, 0x110)]
    (tmp_path / "cdc.pickle").write_bytes(pickle.dumps(("src", "slot", stream, COLUMNS, CATALOG, (0, 0x200))))
    path = tmp_path / "held.parquet"
    pq.write_table(pa.table({"k": pa.array([1, 2, 3]), "c": pa.array([None, 2, 3])}), path)
    code = (
        "import sys, numpy as np, pyarrow as pa, fsspec\n"
        "from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, numpy_of\n"
        "from airflow_provider_checkpoint.connectors.base.missing_columns import TableFile, held_values\n"
        "a = arrow_of(np.arange(10)); b = arrow_of(np.arange(10) % 2 == 0)\n"
        "assert numpy_of(pa.chunked_array([a, a])).sum() == 90 and numpy_of(b.slice(1)).sum() == 4\n"
        f"file = TableFile({str(path)!r}, {path.stat().st_size}, lambda: np.array([1], dtype=np.uint64))\n"
        "held = held_values(fsspec.filesystem('file'), file, ['k'], ['c', 'd'])\n"
        "assert held.to_pylist() == [{'k': 3, 'c': 3, 'd': None}], held\n"
        "import pyarrow.json as pj\n"
        "from airflow_provider_checkpoint.state.spark_hash import range_indexes\n"
        'keys = pj.read_json(pa.py_buffer(b\'{"k": "a"}\\n{"k": null}\\n\'))\n'
        "assert range_indexes(keys, ['k'], 128, 8).type == pa.int32()\n"
        "import pickle\n"
        "from airflow_provider_checkpoint.connectors.postgres.pgoutput_columns import decode_rows\n"
        f"(rows,) = decode_rows(*pickle.loads(open({str(tmp_path / 'cdc.pickle')!r}, 'rb').read()))\n"
        "assert rows['c'].to_pylist() == [1.5] and rows['op'].to_pylist() == ['insert']\n"  # a timestamp's: pandas
        "from airflow_provider_checkpoint.connectors.base.bucket_merge import kept_rows\n"
        "deleted = pa.concat_arrays([b.slice(0, 2), pa.nulls(1, pa.bool_())])\n"  # true, false, null
        "flags = pa.Table.from_arrays([a.slice(0, 3), deleted], ['k', 'd'])\n"
        "assert kept_rows(flags, 'd')['k'].to_pylist() == [1, 2]\n"
        "from airflow_provider_checkpoint.connectors.base.upsert_rule import latest_in_arrow\n"
        "repeated = pa.Table.from_arrays([arrow_of(np.arange(6) % 3), a.slice(0, 6)], ['k', 'v'])\n"
        "last = latest_in_arrow(repeated, ['k'], [])\n"
        "assert last['v'].to_pylist() == [3, 4, 5]\n"
        "print('pandas' in sys.modules, 'pyarrow.acero' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False False"
