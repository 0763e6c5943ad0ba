"""Confinement of UI-given paths to allowed roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_checkpoint.exceptions import UnsafePathError
from airflow_provider_checkpoint.storage.paths import resolve_under_roots


@pytest.fixture
def roots(tmp_path: Path) -> list[str]:
    (tmp_path / "sp").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "sp" / "link").symlink_to(tmp_path / "outside")
    return [f"file://{tmp_path}/sp", "s3://conn@bucket/savepoints"]


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        ("{tmp}/sp", "file://{tmp}/sp"),
        ("{tmp}/sp/new/dir", "file://{tmp}/sp/new/dir"),
        ("file://{tmp}/sp/./x//y/", "file://{tmp}/sp/x/y"),
        ("s3://conn@bucket/savepoints/a", "s3://conn@bucket/savepoints/a"),
    ],
)
def test_paths_under_a_root_are_accepted(roots, tmp_path, candidate, expected):
    assert resolve_under_roots(candidate.format(tmp=tmp_path), roots) == expected.format(tmp=tmp_path)


@pytest.mark.parametrize(
    "candidate",
    [
        "{tmp}/sp/../outside",
        "{tmp}/sp/x/../../outside",
        "{tmp}/outside",
        "{tmp}/sp-sibling",
        "{tmp}/sp/link",
        "{tmp}/sp/link/deeper",
        "sp/relative",
        "file://otherhost{tmp}/sp",
        "s3://other@bucket/savepoints/a",
        "s3://conn@bucket/savepoints-x",
        "gs://conn@bucket/savepoints",
        "{tmp}/sp/a\\..\\..",
        "",
    ],
)
def test_escapes_are_refused(roots, tmp_path, candidate):
    with pytest.raises(UnsafePathError, match="allowed roots"):
        resolve_under_roots(candidate.format(tmp=tmp_path), roots)
