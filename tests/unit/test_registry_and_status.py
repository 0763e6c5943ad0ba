"""The job registry and the status rows read untrusted documents: every bad value is refused or shown as unknown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.exceptions import RegistryError
from airflow_provider_checkpoint.jobs import reports
from airflow_provider_checkpoint.jobs.registry import JobLocation, decode_entry, find_job, list_jobs


def entry(**overrides: object) -> bytes:
    good = {
        "version": 1,
        "job_id": "clicks",
        "dag_id": "clicks_dag",
        "storage_root": "s3://b/ckpt",
        "storage_conn_id": "aws_default",
        "retained_checkpoints": 3,
    }
    return json.dumps({**good, **overrides}).encode()


def test_a_valid_entry_decodes():
    assert decode_entry(entry(), "e", "clicks") == JobLocation("clicks", "clicks_dag", "s3://b/ckpt", "aws_default", 3)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"job_id": "other"}, "does not match the file name"),
        ({"dag_id": "../x"}, "is not a DAG id"),
        ({"storage_root": "file:///data/../etc"}, "without '..'"),
        ({"storage_root": "relative/root"}, "absolute URL"),
        ({"storage_root": "file:///"}, "absolute URL"),
        ({"storage_root": 7}, "absolute URL"),
        ({"storage_conn_id": "a b"}, "not a connection id"),
        ({"retained_checkpoints": 0}, "not a positive integer"),
        ({"retained_checkpoints": True}, "not a positive integer"),
        ({"version": 2}, "not a version-1 registry entry"),
    ],
)
def test_malformed_entries_are_refused_naming_the_file(overrides, message):
    with pytest.raises(RegistryError, match=message) as e:
        decode_entry(entry(**overrides), "file:///r/_registry/clicks.json", "clicks")
    assert str(e.value).startswith("file:///r/_registry/clicks.json")


def test_not_json_is_refused():
    with pytest.raises(RegistryError, match="is not valid JSON"):
        decode_entry(b"{", "e", "clicks")


def registry_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_id: str, root: Path) -> None:
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/default")
    registry = tmp_path / "default" / "_registry"
    registry.mkdir(parents=True)
    body = {"version": 1, "job_id": job_id, "dag_id": job_id, "storage_root": f"file://{root}"}
    (registry / f"{job_id}.json").write_text(json.dumps(body))


def test_an_entry_must_point_where_the_job_lives(tmp_path, monkeypatch):
    other = tmp_path / "other" / "clicks"
    other.mkdir(parents=True)
    (other / "_job.json").write_text(json.dumps({"version": 1, "job_id": "intruder"}))
    registry_at(tmp_path, monkeypatch, "clicks", tmp_path / "other")
    with pytest.raises(RegistryError, match="does not hold job 'clicks'.*belongs to job 'intruder'"):
        find_job("clicks")
    (other / "_job.json").write_text("{not json")
    with pytest.raises(RegistryError, match="is not valid JSON"):
        find_job("clicks")
    (other / "_job.json").unlink()
    with pytest.raises(RegistryError, match="has no _job.json"):
        find_job("clicks")


def test_unknown_and_invalid_job_ids(tmp_path, monkeypatch):
    registry_at(tmp_path, monkeypatch, "clicks", tmp_path / "own")
    (tmp_path / "default" / "_registry" / "broken.json").write_text("[]")
    with pytest.raises(RegistryError, match=r"unknown job 'nope'.*known jobs: clicks\)"):
        find_job("nope")
    with pytest.raises(RegistryError, match="is not a job id"):
        find_job("../clicks")
    assert [j.job_id for j in list_jobs()] == ["clicks"], "the malformed entry is skipped"


@pytest.mark.parametrize("doc", [None, [], {"checkpoint_id": -1}, {"checkpoint_id": "3"}, {"status": "COMPLETED"}])
def test_stats_without_a_valid_id_make_no_row(doc):
    assert stats.history_row(doc) is None


def test_stats_values_of_the_wrong_type_are_unknown():
    row = stats.history_row(
        {
            "checkpoint_id": 4,
            "status": "<script>",
            "trigger_time": "x",
            "end_time": float("nan"),
            "records_in": -5,
            "state_size": 1.5,
            "steps": {"a": {"state_rows": 2, "state_files": 1}, "b": "junk"},
        }
    )
    assert row is not None
    assert (row["status"], row["trigger_time"], row["end_time"], row["records_in"], row["state_size"]) == (
        "UNKNOWN",
        None,
        None,
        None,
        None,
    )
    assert (row["state_rows"], row["files"], row["duration_seconds"]) == (2, 1, None)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.25, "250ms"),
        (12.34, "12.3s"),
        (245, "4m 05s"),
        (7260, "2h 01m"),
        (3 * 86400 + 4 * 3600, "3d 04h"),
    ],
)
def test_human_duration(seconds, text):
    assert reports.human_duration(seconds) == text


@pytest.mark.parametrize(("size", "text"), [(None, "-"), (512, "512 B"), (1536, "1.5 KiB"), (5 * 2**20, "5.0 MiB")])
def test_human_bytes(size, text):
    assert reports.human_bytes(size) == text
