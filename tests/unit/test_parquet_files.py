"""Which files of an append table a step reads the columns of (connectors/files/parquet_files.py): the newest
checkpoint's before the step's, found by listings of the last ten checkpoints' names first, wider ones only
when those wrote nothing, compared with the table's files as a plain directory listing sorts them."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from airflow_provider_checkpoint.connectors.files import parquet_files
from airflow_provider_checkpoint.connectors.files.parquet_files import newest_appended
from airflow_provider_checkpoint.storage.job_storage import Location


@pytest.mark.parametrize(
    ("written", "step", "lists"),
    [
        ([], 1, 3),  # a new table: every width listed, nothing found
        ([1, 2, 3], 4, 1),
        ([1, 2, 3, 9], 4, 1),  # a later checkpoint's files (none in practice) are not the newest before it
        ([1, 2, 3], 12, 2),  # checkpoints 10 and 11 wrote nothing: the ten thousand around them listed
        ([3, 10_007], 20_001, 3),  # nothing in the last ten thousand: the whole table
        ([123_456_789, 123_456_790], 123_456_791, 1),
    ],
)
def test_the_newest_files_before_a_step_are_found_with_few_listings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: list[int], step: int, lists: int
) -> None:
    table = tmp_path / "table"
    table.mkdir()
    for checkpoint in written:
        for n in range(2):
            (table / f"part-c{checkpoint:010d}-{n:05d}.parquet").write_bytes(b"x" * (n + 1))
    (table / "part-b00001.parquet").write_bytes(b"bucket")  # another naming scheme: never among them
    prefixes: list[str] = []
    listed = parquet_files.list_names

    def counting(fs: fsspec.AbstractFileSystem, directory: str, prefix: str) -> dict[str, int]:
        prefixes.append(prefix)
        return listed(fs, directory, prefix)

    monkeypatch.setattr(parquet_files, "list_names", counting)
    found = newest_appended(Location.from_url(f"file://{table}"), step)
    names = sorted(Path(p).name for p in found)
    before = [c for c in written if c < step]
    assert (names[-1] if names else None) == (f"part-c{max(before):010d}-00001.parquet" if before else None)
    assert all(int(name[6:16]) < step for name in names), "only earlier checkpoints' append files"
    assert found == {p: Path(p).stat().st_size for p in found}, "sizes as listed"
    assert len(prefixes) == lists, prefixes
