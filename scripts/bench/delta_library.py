"""Our Delta log code against what delta-rs (``deltalake``, as pinned) offers for the same job, on one local
table of ``--commits`` commits (each: ``commitInfo``, ``txn``, one ``add``; no log checkpoint until the
checkpoint pair runs). Issue #53 item 4: where delta-rs does it as well and as cheaply, we use it.

Pairs, each timed ``--rounds`` times in alternation (median, min–max):

- log replay of the latest version: :func:`.log.live_actions` vs ``DeltaTable(path).get_add_actions()``
  (delta-rs's open replays the log; the actions as Arrow);
- log checkpoint: :func:`.log_checkpoint.replay` + :func:`.log_checkpoint.write` vs
  ``DeltaTable(path).create_checkpoint()`` (open + checkpoint), each checkpoint deleted after its round;
- a finalize's commit cycle as the sink runs it (a log checkpoint after every commit,
  :data:`.commit.CHECKPOINT_INTERVAL`), on the table with a checkpoint at its latest version: an append of
  one file with a ``txn``, then the checkpoint of the new version. delta-rs: ``DeltaTable(path)``,
  ``create_write_transaction([AddAction], "append", schema, commit_properties=CommitProperties(
  app_transactions=[Transaction(app, id)]))``, ``update_incremental()``, ``create_checkpoint()``; ours: the
  log listed and replayed, one commit file created exclusively, the checkpoint written from that replay
  (what :func:`.commit.commit` and :func:`.commit.log_checkpoint` do, without the sink's checks).

Run: ``.venv/bin/python scripts/bench/delta_library.py --commits 1000 --rounds 11``.

Measured 2026-11-28 (deltalake 1.6.6, load average 38–42 on 2 cores: medians, min in brackets; noisy):

| pair | 50 commits: ours | delta-rs | 1,000 commits: ours | delta-rs |
|---|---:|---:|---:|---:|
| log replay | 0.010 (0.002) | 0.119 (0.009) | 0.863 (0.133) | 2.971 (1.819) |
| log checkpoint from the commits | 0.067 (0.007) | 0.141 (0.026) | 1.729 (0.828) | 7.032 (2.386) |
| commit + log checkpoint | 0.043 (0.008) | 0.026 (0.008) | 0.627 (0.402) | 0.232 (0.124) |

Locally delta-rs's commit + checkpoint wins on a large table; on S3 it re-reads the log (a finalize makes
about 10 requests with ours, 42 with delta-rs's checkpoint: ``tests/s3/test_s3_delta_commit_requests.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def build(root: Path, commits: int) -> None:
    """A table of ``commits`` commits written as delta-rs writes an append with a ``txn`` (no data files:
    only the log is read)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(root), pa.table({"user": pa.array([1], pa.int64()), "total": pa.array([1], pa.int64())}))
    for v in range(1, commits):
        now = int(time.time() * 1000)
        stats = json.dumps({"numRecords": 100})
        add = {"path": f"part-{v:05d}.parquet", "partitionValues": {}, "size": 1000, "modificationTime": now}
        actions = [
            {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append"}}},
            {"txn": {"appId": "airflow-checkpoint:bench:t", "version": v, "lastUpdated": now}},
            {"add": {**add, "dataChange": True, "stats": stats}},
        ]
        (root / "_delta_log" / f"{v:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    import fsspec
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
    from deltalake.transaction import AddAction

    from airflow_provider_checkpoint.connectors.delta import log_checkpoint
    from airflow_provider_checkpoint.connectors.delta.log import live_actions
    from airflow_provider_checkpoint.connectors.delta.log_checks import listing
    from airflow_provider_checkpoint.storage.writes import create_exclusive

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    fs = fsspec.filesystem("file")
    work = Path(tempfile.mkdtemp(prefix="delta-library-"))
    table = work / "t"
    build(table, args.commits)
    root, log = str(table), table / "_delta_log"
    schema = pa.schema([("user", pa.int64()), ("total", pa.int64())])

    def ours_checkpoint() -> None:
        state = log_checkpoint.replay(fs, root, "t", args.commits - 1, listing(fs, root))
        assert log_checkpoint.write(fs, root, state), state.unsupported

    def drop_checkpoints() -> None:
        for p in [*log.glob("*.checkpoint*.parquet"), log / "_last_checkpoint"]:
            p.unlink(missing_ok=True)

    def ours_commit() -> None:
        files = listing(fs, root)
        state = log_checkpoint.replay(fs, root, "t", max(_versions(files)), files)
        version = state.version + 1
        now = int(time.time() * 1000)
        add = {"path": f"ours-{version}.parquet", "partitionValues": {}, "size": 1000, "modificationTime": now}
        actions = [
            {"commitInfo": {"timestamp": now, "operation": "WRITE"}},
            {"txn": {"appId": "airflow-checkpoint:bench:ours", "version": version, "lastUpdated": now}},
            {"add": {**add, "dataChange": True, "stats": '{"numRecords":100}'}},
        ]
        body = "".join(json.dumps(a) + "\n" for a in actions).encode()
        assert create_exclusive(fs, f"{root}/_delta_log/{version:020d}.json", body)
        state.apply(version, actions)
        assert log_checkpoint.write(fs, root, state), state.unsupported

    def theirs_commit() -> None:
        dt = DeltaTable(root)
        version = dt.version() + 1
        now = int(time.time() * 1000)
        add = AddAction(f"theirs-{version}.parquet", 1000, {}, now, True, '{"numRecords":100}')
        txn = Transaction("airflow-checkpoint:bench:theirs", version)
        no_hooks = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
        properties = CommitProperties(app_transactions=[txn])
        dt.create_write_transaction(
            [add], "append", schema, commit_properties=properties, post_commithook_properties=no_hooks
        )
        dt.update_incremental()
        dt.create_checkpoint()
        assert json.loads((log / "_last_checkpoint").read_text())["version"] == version

    pairs: dict[str, dict[str, Callable[[], object]]] = {
        "log replay (latest version)": {
            "ours": lambda: live_actions(fs, root, "t"),
            "delta-rs": lambda: DeltaTable(root).get_add_actions(),
        },
        "log checkpoint": {
            "ours": ours_checkpoint,
            "delta-rs": lambda: DeltaTable(root).create_checkpoint(),
        },
    }
    cycle = {"ours": ours_commit, "delta-rs": theirs_commit}

    print(f"{args.commits} commits, {args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
    for pair, sides in pairs.items():
        times: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, fn in sides.items():
                times[side].append(timed(fn))
                if pair == "log checkpoint":
                    drop_checkpoints()
        report(pair, times)
    DeltaTable(root).create_checkpoint()
    times = {side: [] for side in cycle}
    for _ in range(args.rounds):
        for side, fn in cycle.items():
            times[side].append(timed(fn))
    report("commit + log checkpoint", times)
    print(f"load after {os.getloadavg()[0]:.1f}")
    shutil.rmtree(work)


def report(pair: str, times: dict[str, list[float]]) -> None:
    for side, ts in times.items():
        print(f"{pair}: {side} {statistics.median(ts):.3f} s (min {min(ts):.3f}, max {max(ts):.3f})")


def _versions(files: dict[str, int | None]) -> list[int]:
    return [int(n[:20]) for n in files if n.endswith(".json") and n[:20].isdigit()]


if __name__ == "__main__":
    main()
