"""A Delta upsert's lookups (connectors/delta/lookups.py): a file's positions deleted after a checkpoint, its DV's and
the new hits', against a plain set union; an old DV naming rows past the file is kept for the commit to refuse."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.delta.log import DataFile
from airflow_provider_checkpoint.connectors.delta.lookups import _found

FILE = DataFile("part-b00000.parquet", ())


@given(st.integers(0, 300), st.data())
def test_the_positions_deleted_after_a_checkpoint_are_the_union_sorted(rows: int, data: st.DataObject) -> None:
    old = sorted(data.draw(st.sets(st.integers(0, max(rows - 1, 0)), max_size=rows)) if rows else set())
    live = [p for p in range(rows) if p not in set(old)]
    new = sorted(data.draw(st.sets(st.sampled_from(live), max_size=len(live))) if live else set())
    found = _found(FILE, rows, np.array(old, np.uint64), np.array(new, np.uint64), lambda: pa.table({"k": new}))
    if not new:
        assert found is None
        return
    assert found is not None and found.deleted.dtype == np.uint64
    assert found.deleted.tolist() == sorted(set(old) | set(new)) and found.old.tolist() == old


def test_an_old_deletion_vector_past_the_file_is_kept_for_the_commit_to_refuse() -> None:
    found = _found(FILE, 5, np.array([1, 9], np.uint64), np.array([2], np.uint64), lambda: pa.table({"k": [2]}))
    assert found is not None and found.deleted.tolist() == [1, 2, 9]
