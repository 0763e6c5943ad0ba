"""The upsert sink's pyarrow bucket merge (no Spark), checked against a pandas merge."""

from __future__ import annotations

from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.base import bucket_merge
from airflow_provider_checkpoint.connectors.delta import checks

FS = fsspec.filesystem("file")


def upsert_truth(old: pd.DataFrame, changed: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Old rows whose key tuple (None equal to None) is not changed, then the changed rows."""

    def key(df: pd.DataFrame) -> pd.Series:
        return df[keys].astype(object).where(df[keys].notna(), "<null>").astype(str).agg("|".join, axis=1)

    kept = old[~key(old).isin(set(key(changed)))]
    return pd.concat([kept, changed], ignore_index=True)


def merge(old: Path | None, changed: pa.Table, keys: list[str], out: Path) -> int:
    """:func:`bucket_merge.merge_bucket` of the file ``old`` (if any); the rows it wrote (its size checked)."""
    if old is None:
        rows, size = bucket_merge.merge_bucket(FS, None, changed, keys, str(out))
    else:
        with bucket_merge.open_parquet(FS, str(old), old.stat().st_size) as reader:
            rows, size = bucket_merge.merge_bucket(FS, reader, changed, keys, str(out))
    assert size == out.stat().st_size
    return rows


def schema_of(path: Path) -> pa.Schema:
    with bucket_merge.open_parquet(FS, str(path), path.stat().st_size) as reader:
        return reader.schema_arrow


def canonical(table: pa.Table) -> list[tuple[object, ...]]:
    return sorted((tuple(row.values()) for row in table.select(["k", "j", "v"]).to_pylist()), key=repr)


@pytest.mark.parametrize("keys", [["k"], ["k", "j"]])
def test_merge_equals_pandas_upsert_with_null_keys_and_many_batches(
    tmp_path: Path, keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bucket_merge, "BATCH_ROWS", 7)  # many batches: the streaming path
    rng = np.random.default_rng(3)
    k = pd.array([f"k{i}" if i % 11 else None for i in range(60)], dtype=object)
    old = pd.DataFrame({"k": k, "j": pd.array([i % 3 if i % 13 else None for i in range(60)], dtype="Int64")})
    old["v"] = rng.integers(0, 100, len(old))
    old = old.drop_duplicates(subset=keys).reset_index(drop=True)
    changed = pd.concat(
        [old.sample(9, random_state=1), pd.DataFrame({"k": ["new", None], "j": pd.array([7, None], dtype="Int64")})]
    )
    changed = changed.drop_duplicates(subset=keys).assign(v=lambda d: np.arange(len(d)) + 1000)
    pq.write_table(pa.Table.from_pandas(old, preserve_index=False), tmp_path / "old.parquet")

    changed_table = pa.Table.from_pandas(changed, preserve_index=False)
    rows = merge(tmp_path / "old.parquet", changed_table, keys, tmp_path / "out.parquet")

    truth = upsert_truth(old, changed, keys)
    assert rows == len(truth)
    merged = pq.read_table(tmp_path / "out.parquet")
    assert canonical(merged) == canonical(pa.Table.from_pandas(truth, preserve_index=False))


def test_new_bucket_holds_the_changed_rows_all_nullable(tmp_path: Path) -> None:
    changed = pa.table(
        {"k": pa.array(["a", "b"]), "n": pa.array([1, 2])},
        schema=pa.schema([("k", pa.string()), pa.field("n", pa.int64(), nullable=False)]),
    )
    assert merge(None, changed, ["k"], tmp_path / "out.parquet") == 2
    written = pq.read_table(tmp_path / "out.parquet")
    assert written.to_pydict() == {"k": ["a", "b"], "n": [1, 2]}
    assert all(f.nullable for f in written.schema)


def test_old_rows_are_cast_to_the_changed_rows_representation(tmp_path: Path) -> None:
    # a Spark-written file: INT96 timestamps (UTC instants, read back as naive), plain strings
    old = pa.table(
        {"k": pa.array(["a", "b"], pa.large_string()), "t": pa.array([1_000_000, 2_000_000], pa.timestamp("us"))}
    )
    pq.write_table(old, tmp_path / "old.parquet", use_deprecated_int96_timestamps=True)
    changed = pa.table({"k": pa.array(["b"]), "t": pa.array([5_000_000], pa.timestamp("us", tz="UTC"))})
    assert bucket_merge.mergeable(schema_of(tmp_path / "old.parquet"), changed.schema)

    merge(tmp_path / "old.parquet", changed, ["k"], tmp_path / "out.parquet")

    written = pq.read_table(tmp_path / "out.parquet")
    assert written.schema.field("t").type == pa.timestamp("us", tz="UTC")
    assert written.column("t").cast(pa.int64()).to_pylist() == [1_000_000, 5_000_000]


@pytest.mark.parametrize(
    "old_columns",
    [
        {"k": pa.array(["a"]), "v": pa.array(["text"])},  # a column changed type
        {"k": pa.array(["a"]), "w": pa.array([1])},  # a column renamed
        {"k": pa.array(["a"])},  # a column added since
    ],
)
def test_files_with_other_columns_are_left_to_spark(tmp_path: Path, old_columns: dict[str, pa.Array]) -> None:
    pq.write_table(pa.table(old_columns), tmp_path / "old.parquet")
    changed = pa.table({"k": pa.array(["a"]), "v": pa.array([1])}).schema
    assert not bucket_merge.mergeable(schema_of(tmp_path / "old.parquet"), changed)


def test_keys_of_nested_types_are_left_to_spark() -> None:
    changed = pa.schema([("k", pa.list_(pa.int64())), ("v", pa.int64())])
    assert not bucket_merge.keys_mergeable(changed, ["k"])


def test_rows_marked_by_delete_when_delete_their_key_and_the_column_is_not_written(tmp_path: Path) -> None:
    """Old keys a..e; changed: b updated, c and z (absent) deleted, f added: pyarrow reads back a, b', d, e, f
    with the old file's columns only."""
    old = pa.table({"k": ["a", "b", "c", "d", "e"], "j": [1, 2, 3, 4, 5], "v": [10, 20, 30, 40, 50]})
    pq.write_table(old, tmp_path / "old.parquet")
    changed = pa.table(
        {
            "k": ["b", "c", "z", "f"],
            "j": [2, None, None, 6],
            "v": [21, None, None, 60],
            "gone": [False, True, True, None],
        }
    )
    path = tmp_path / "old.parquet"
    with bucket_merge.open_parquet(FS, str(path), path.stat().st_size) as reader:
        rows, _ = bucket_merge.merge_bucket(FS, reader, changed, ["k"], str(tmp_path / "out.parquet"), "gone")
    got = pq.read_table(tmp_path / "out.parquet")
    assert got.schema.names == ["k", "j", "v"] and rows == got.num_rows == 5
    assert canonical(got) == sorted([("a", 1, 10), ("b", 2, 21), ("d", 4, 40), ("e", 5, 50), ("f", 6, 60)], key=repr)
    rows, _ = bucket_merge.merge_bucket(FS, None, changed.filter(pa.array([False, True, True, False])), ["k"],
                                        str(tmp_path / "none.parquet"), "gone")  # fmt: skip
    assert rows == 0 and pq.read_table(tmp_path / "none.parquet").num_rows == 0, "a bucket of deletes only: empty"


ints = st.lists(
    st.one_of(st.none(), st.integers(-3, 6), st.sampled_from([2**40, -(2**40), 2**63 - 1, -(2**63), 2**31 - 1])),
    max_size=12,
)


def fits(value: int | None, type_: pa.DataType) -> bool:
    if value is None or type_ == pa.int64():
        return True
    return value >= 0 if type_ == pa.uint64() else -(2**31) <= value < 2**31


@settings(max_examples=200)
@given(ints, ints, st.sampled_from([pa.int64(), pa.int32(), pa.uint64()]), st.sampled_from([pa.int64(), pa.int32()]))
def test_a_key_set_finds_changed_keys_as_a_set_of_tuples_does(changed, rows, changed_type, rows_type) -> None:
    """One integer key without nulls in a bitmap over its span (a narrow one) or by binary search, else (nulls,
    another type) by ``is_in``: either way the rows whose key is among the changed ones, a null equal to a null;
    and the keys repeated."""
    rows_type = changed_type if changed_type == pa.uint64() else rows_type  # callers cast rows to the key types
    changed = [v for v in changed if fits(v, changed_type)]
    rows = [v for v in rows if fits(v, rows_type)]
    keys = bucket_merge.KeySet(pa.table({"k": pa.array(changed, changed_type)}), ["k"])
    got = keys.changed(pa.table({"k": pa.array(rows, rows_type)}))
    assert got.tolist() == [v in set(changed) for v in rows]
    assert (keys.index is not None) == (None not in changed)  # indexed where it applies
    narrow = keys.index is not None and changed and max(changed) - min(changed) < bucket_merge.DENSE_KEY_SPAN
    assert (keys.index is not None and keys.index.bitmap is not None) == bool(narrow)  # the bitmap where it applies
    if keys.index is not None:
        assert keys.index.repeats == (len(set(changed)) < len(changed))
    repeated = set(checks._repeated(pa.table({"k": pa.array(changed, changed_type)}), ["k"]))
    want = {(v,) for v in changed if changed.count(v) > 1}
    assert repeated == want if len(want) <= 5 else len(repeated) == 5 and repeated <= want


def test_a_table_file_keeps_small_dictionaries_and_is_read_by_another_reader(tmp_path: Path) -> None:
    """A column of few values stays dictionary-encoded; one of distinct values falls back to plain once its
    dictionary passes :data:`bucket_merge.DICTIONARY_PAGE_BYTES`; DuckDB (not Arrow's reader) reads the rows."""
    import duckdb

    n = 20_000
    labels = [f"{v:016x}" for v in np.random.default_rng(7).integers(0, 2**62, n)]  # distinct, incompressible
    rows = pa.table({"id": pa.array(range(n), pa.int64()), "label": labels,
                     "op": [("insert", "update", None)[i % 3] for i in range(n)]})  # fmt: skip
    out = str(tmp_path / "t.parquet")
    with bucket_merge.table_writer(FS, out, bucket_merge.target_schema(rows.schema)) as writer:
        writer.write_table(rows)
    chunk = pq.ParquetFile(out).metadata.row_group(0)
    columns = {chunk.column(i).path_in_schema: chunk.column(i) for i in range(3)}
    dictionary = {name: c.data_page_offset - c.dictionary_page_offset for name, c in columns.items()}
    assert dictionary["label"] <= bucket_merge.DICTIONARY_PAGE_BYTES + 100  # 400 kB of distinct labels: cut short
    assert dictionary["op"] < 100 and columns["op"].total_compressed_size < 1000  # two values, a dictionary
    got = duckdb.sql(f"SELECT id, label, op FROM read_parquet('{out}') ORDER BY id").fetchall()
    assert got == [tuple(r.values()) for r in rows.to_pylist()]


def test_one_integer_key_is_indexed_once_for_the_upsert_rule_and_the_lookups() -> None:
    """The rows the upsert rule found one per key (a bitmap over their span, no sort) are looked up with that
    index; other memory (another column, a slice) is indexed for itself; a wide span is sorted."""
    from airflow_provider_checkpoint.connectors.base.upsert_rule import unique_integer_key

    rows = pa.table({"k": pa.array([5, 1, 3], pa.int64()), "v": ["a", "b", "c"]})
    assert unique_integer_key(rows, ["k"])
    found = bucket_merge.int_keys(rows, ["k"])
    assert found is not None and found.bitmap is not None and found.lowest == 1
    assert np.flatnonzero(found.bitmap).tolist() == [0, 2, 4] and not found.repeats
    assert bucket_merge.KeySet(rows.select(["k"]), ["k"]).index is found  # the same memory: not indexed again
    other = bucket_merge.KeySet(pa.table({"k": pa.array([5, 1, 4], pa.int64())}), ["k"]).index
    assert other is not None and other is not found and other.holds(np.array([4, 3])).tolist() == [True, False]
    sliced = bucket_merge.KeySet(rows.slice(1), ["k"]).index
    assert sliced is not None and sliced.holds(np.array([5, 1, 3])).tolist() == [False, True, True]
    nulls = bucket_merge.int_keys(pa.table({"k": pa.array([2, None, 2])}), ["k"])
    assert nulls is not None and nulls.nulls == 1 and nulls.repeats
    wide = bucket_merge.int_keys(pa.table({"k": pa.array([1 << 40, 0, 5], pa.int64())}), ["k"])
    assert wide is not None and wide.bitmap is None and wide.ordered is not None
    assert wide.ordered.tolist() == [0, 5, 1 << 40] and not wide.repeats
