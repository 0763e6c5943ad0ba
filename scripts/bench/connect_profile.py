"""Where a step's seconds go on a warm Spark Connect server: the scheduler mode's clickstream pipeline run
checkpoint after checkpoint in this process, each step under ``cProfile``, against a server started once.

    .venv/bin/python scripts/bench/connect_profile.py [--increments 4] [--events 50000] [--users 20000] [--top 25]

Per checkpoint: the step's seconds, the gRPC calls the client made (``ExecutePlan``, ``AnalyzePlan``,
``Config``...) with their seconds, and the functions of the provider with the most cumulative time. A fresh
session per checkpoint, as each step task opens one. ``--ab``: a second job over the same landing whose size
estimates are unknown, as over Connect before the server's cost explain was read (every checkpoint on the Spark
path), the two alternating which goes first; their step seconds only.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]


def grpc_calls(stats: pstats.Stats) -> dict[str, tuple[int, float]]:
    """Calls and cumulative seconds of the Connect client's RPC methods, from a profile."""
    found: dict[str, tuple[int, float]] = {}
    for (filename, _, name), (_, calls, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if filename.endswith("connect/client/core.py") and name in {
            "_execute_and_fetch_as_iterator",
            "_analyze",
            "config",
            "_execute",
        }:
            found[name] = (calls, cumulative)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--increments", type=int, default=4)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--workload", choices=["clickstream", "large-state"], default="clickstream")
    parser.add_argument("--ab", action="store_true", help="beside a job whose steps take the Spark path")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a second job: its sessions with these settings",
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "checkpoint-connect-profile")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from airflow_provider_checkpoint.spark.session import connect_server_conf
    from bench.workloads import DataSpec, generate, land
    from tests.live.spark_connect import spark_connect_server

    confs = dict(c.split("=", 1) for c in args.conf)
    spec = DataSpec(args.workload, args.increments, args.events, args.users, 500, 42)
    files = generate(args.work / "data", spec)
    root = args.work / "run"
    if root.exists():
        import shutil

        shutil.rmtree(root)
    root.mkdir(parents=True)
    with spark_connect_server(root / "spark-connect.log", conf=connect_server_conf()) as url:
        for i, data_file in enumerate(files, start=1):
            land(data_file, root / "landing")
            sides = [("driver", root), *([("spark", root / "spark-path")] if args.ab else [])]
            sides += [("conf", root / "conf")] if confs else []
            timed = {}
            for name, job_root in sides if i % 2 else sides[::-1]:
                conf = confs if name == "conf" else {}
                timed[name], stats = one_step(url, job_root, root / "landing", i, name == "spark", conf)
                calls = ", ".join(f"{n} {c}× {s:.2f}s" for n, (c, s) in grpc_calls(stats).items())
                print(f"== checkpoint {i} {name}: step {timed[name]:.2f}s; {calls} (load {os.getloadavg()[0]:.1f})")
                if not args.ab and not confs:
                    stats.sort_stats("cumulative").print_stats(r"airflow_provider_checkpoint|connect/client", args.top)
                    stats.print_callers(r"core.py:\d+\((to_table|execute_command|_analyze)\)")  # who asks the server
            if args.ab:
                print(f"== checkpoint {i}: driver / spark path {timed['driver'] / timed['spark']:.2f}", flush=True)
            if confs:
                print(f"== checkpoint {i}: with {confs} / without {timed['conf'] / timed['driver']:.2f}", flush=True)


def one_step(
    url: str, root: Path, landing: Path, i: int, unknown_sizes: bool, conf: dict[str, str]
) -> tuple[float, pstats.Stats]:
    """Checkpoint ``i`` of the job under ``root`` on a fresh session (with ``conf``): its step's seconds and
    profile."""
    from pyspark.sql import SparkSession

    from airflow_provider_checkpoint.spark.runner import run_step
    from airflow_provider_checkpoint.state import driver_merge
    from bench.sides import Ours

    spark = SparkSession.builder.remote(url).config(map=conf).create()
    ours = Ours(spark, root, landing)
    plan = ours.coordinator.trigger(f"profile-{i}")
    estimate = driver_merge.estimated_bytes
    if unknown_sizes:
        driver_merge.estimated_bytes = lambda df: None  # as before the cost explain: no driver merge
    profile = cProfile.Profile()
    began = time.perf_counter()
    try:
        profile.enable()
        acks = [run_step(spark, ours.storage, ours.graph, s, plan, 1, settings=ours.coordinator.settings)
                for s in plan.steps]  # fmt: skip
        profile.disable()
    finally:
        driver_merge.estimated_bytes = estimate
    step = time.perf_counter() - began
    ours.coordinator.finalize(plan, acks)
    spark.stop()
    return step, pstats.Stats(profile)


if __name__ == "__main__":
    main()
