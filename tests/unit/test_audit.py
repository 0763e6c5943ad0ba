"""audit_job: a quiescent job directory holds its retained checkpoints and nothing else.

The job is produced by the coordinator over real local files (helpers of
``test_coordinator``), then damaged in one way per test; every finding must name the
path it is about.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from tests.unit.helpers import JOB, STEP, T0, Env, SharedState, make_ack, make_env, run_checkpoint, state_rel

RETAINED = 3


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    """Five completed checkpoints with retained=3: chk-3, chk-4 and chk-5 remain."""
    env = make_env(tmp_path, retained=RETAINED)
    for i in range(1, 6):
        run_checkpoint(env, f"run-{i}", T0 + 10 * i)
    assert CompletedCheckpointStore(env.storage).completed_ids() == [3, 4, 5]
    return env


def audit(env: Env, retained: int = RETAINED) -> list[str]:
    return audit_job(env.storage, retained, env.coordinator.graph.sinks)


def test_clean_job_has_no_findings(env: Env) -> None:
    assert audit(env) == []


def test_clean_job_with_files_shared_across_retention(shared_state: SharedState) -> None:
    """chk-1 lost its _metadata to retention but keeps the file chk-2 still references: not a leftover."""
    env, shared = shared_state
    assert CompletedCheckpointStore(env.storage).completed_ids() == [2]
    assert env.chk(1).is_dir()
    assert audit_job(env.storage, 1, env.coordinator.graph.sinks) == []


def test_missing_job_directory(tmp_path: Path) -> None:
    storage = JobStorage.for_job(str(tmp_path), "nope")
    findings = audit_job(storage, RETAINED)
    assert len(findings) == 1
    assert storage.url() in findings[0]


def test_stray_file_in_a_retained_checkpoint(env: Env) -> None:
    stray = env.chk(4) / STEP / "attempt-1" / "state" / "counts" / "stray.bin"
    stray.write_bytes(b"junk")
    findings = audit(env)
    assert findings == [f"orphaned file {env.storage.url('chk-4/step_table/attempt-1/state/counts/stray.bin')}"]


def test_stray_file_at_the_top_of_a_retained_checkpoint(env: Env) -> None:
    (env.chk(5) / "notes.txt").write_bytes(b"junk")
    findings = audit(env)
    assert len(findings) == 1
    assert env.storage.url("chk-5/notes.txt") in findings[0]


def test_leftover_checkpoint_of_a_dead_run(env: Env) -> None:
    """A run triggered chk-6, its step wrote state and staged output, then the run died (lease released)."""
    plan = env.coordinator.trigger("run-6", now=T0 + 100)
    make_ack(env, plan)
    JobRecordStore(env.storage).release_lease("run-6")
    cid = plan.checkpoint_id
    assert not CompletedCheckpointStore(env.storage).is_completed(cid)

    findings = audit(env)

    expected_files = {f"chk-{cid}/_plan.json", state_rel(cid, 1)}
    for rel in expected_files:
        assert any(env.storage.url(rel) in f for f in findings), (rel, findings)
    staged = [f for f in findings if f.startswith("staged sink data left behind")]
    assert len(staged) == 1
    assert str(env.table / "_staging" / f"chk-{cid}" / JOB / STEP / "attempt-1" / "part-00000.parquet") in staged[0]
    assert len(findings) == len(expected_files) + 1, findings


def test_leftover_checkpoint_directory_without_metadata(env: Env) -> None:
    leftover = env.chk(9) / STEP / "attempt-1" / "state" / "counts" / "kgr=0" / "part-00000.parquet"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"partial")
    findings = audit(env)
    assert len(findings) == 1
    assert env.storage.url("chk-9/step_table/attempt-1/state/counts/kgr=0/part-00000.parquet") in findings[0]


def test_empty_leftover_checkpoint_directory(shared_state: SharedState) -> None:
    env, shared = shared_state
    run_checkpoint(env, "run-3", T0 + 20)  # chk-1's last referenced file goes, and retention removes chk-1
    assert not env.chk(1).exists()
    assert audit_job(env.storage, 1, env.coordinator.graph.sinks) == []

    (env.job_dir / "chk-9" / "step_table" / "attempt-1").mkdir(parents=True)  # an empty leftover
    findings = audit_job(env.storage, 1, env.coordinator.graph.sinks)
    assert any(env.storage.url("chk-9") in f for f in findings), findings


def test_stale_lease(env: Env) -> None:
    JobRecordStore(env.storage).acquire_lease("run-dead", 600, now=T0 + 100)
    findings = audit(env)
    assert len(findings) == 1
    assert env.storage.url("_lease") in findings[0]
    assert "run-dead" in findings[0]


def test_more_completed_checkpoints_than_retained(env: Env) -> None:
    findings = audit(env, retained=2)
    assert findings == [f"{env.storage.url()}: 3 completed checkpoints retained (3, 4, 5), expected at most 2"]


def test_more_completed_checkpoints_than_retained_names_the_path(env: Env) -> None:
    (finding,) = audit(env, retained=2)
    assert env.storage.url() in finding or env.storage.url("chk-3") in finding


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_corrupted_referenced_state_file(env: Env, damage: str) -> None:
    rel = state_rel(4, 1)
    state_file = env.job_dir / rel
    data = state_file.read_bytes()
    if damage == "flip":
        state_file.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    elif damage == "truncate":
        state_file.write_bytes(data[:-1])
    else:
        state_file.unlink()
    findings = audit(env)
    assert len(findings) == 1, findings
    assert env.storage.url(rel) in findings[0]
    assert ("missing" if damage == "delete" else "corrupt") in findings[0]


def test_corrupt_metadata(env: Env) -> None:
    (env.chk(4) / "_metadata").write_bytes(b"{not json")
    findings = audit(env)
    assert any(env.storage.url("chk-4/_metadata") in f for f in findings), findings
    # the files only that checkpoint referenced are now unaccounted for
    assert any(env.storage.url(state_rel(4, 1)) in f for f in findings), findings


def test_staged_sink_data(env: Env) -> None:
    staged = env.table / "_staging" / "chk-42" / JOB / STEP / "attempt-1" / "part-00000.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"rows")
    findings = audit(env)
    assert findings == [f"staged sink data left behind: file://{staged}"]


def test_staged_sink_data_is_only_checked_for_given_sinks(env: Env) -> None:
    staged = env.table / "_staging" / "chk-42" / "part-00000.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"rows")
    assert audit_job(env.storage, RETAINED) == []


def test_unexpected_entry_in_the_job_directory(env: Env) -> None:
    (env.job_dir / "backup.tar").write_bytes(b"x")
    findings = audit(env)
    assert findings == [f"unexpected entry {env.storage.url('backup.tar')}"]


def test_an_attempt_directory_linked_out_is_a_finding_and_not_followed(env: Env, tmp_path: Path) -> None:
    """docs/security.md: the audit reports a link out and does not follow it (it used to stop with exit 2
    and no findings); the files outside are neither listed as orphans nor touched."""
    outside = tmp_path / "elsewhere"
    (outside / "state").mkdir(parents=True)
    (outside / "state" / "secret.bin").write_bytes(b"not ours")
    link = env.chk(5) / "step_linked"
    link.symlink_to(outside)
    findings = audit(env)
    assert len(findings) == 1 and str(link) in findings[0] and "resolves to" in findings[0]
    assert "secret.bin" not in findings[0]
    assert (outside / "state" / "secret.bin").read_bytes() == b"not ours"


def test_a_link_out_of_a_sink_table_is_named_and_not_followed(env: Env, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "part-00000.parquet").write_bytes(b"not the table's")
    env.table.mkdir(parents=True, exist_ok=True)
    (env.table / "part-link").symlink_to(outside)
    findings = audit(env)
    assert len(findings) == 1 and str(env.table / "part-link") in findings[0], findings
    assert "elsewhere/part-00000.parquet" not in findings[0]


def test_a_delta_table_refused_as_a_whole_is_a_finding(env: Env, tmp_path: Path) -> None:
    from airflow_provider_checkpoint.dataflow import DeltaTableSink

    outside = tmp_path / "elsewhere-log"
    outside.mkdir()
    table = tmp_path / "delta-table"
    table.mkdir()
    (table / "_delta_log").symlink_to(outside)
    sink = DeltaTableSink("lake", env.coordinator.graph.sources[0], str(table))
    findings = audit_job(env.storage, RETAINED, [sink])
    assert len(findings) == 1 and findings[0].startswith("sink lake: ") and "_delta_log" in findings[0], findings
