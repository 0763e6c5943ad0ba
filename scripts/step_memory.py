"""Peak resident memory of one checkpoint of the example clickstream pipeline in `local` mode.

Runs one ``dag.test()`` (its three steps in this process, one embedded Spark JVM, Spark's default
1 GiB heap) over N landed events in a fresh temporary ``AIRFLOW_HOME`` and samples, every 0.2 s,
the resident memory of this process, its Spark JVM and its other children (Spark's Python workers).
docs/deploying.md quotes its figures. Run by hand::

    SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python scripts/step_memory.py 1000000
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", type=int, help="events landed before the checkpoint (JSON Lines, one file)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="step-memory-"))
    os.environ.update(
        AIRFLOW_HOME=str(tmp / "home"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CHECKPOINT__STORAGE_ROOT=f"file://{tmp}/checkpoints",
        CLICKSTREAM_DIR=str(tmp / "clickstream"),
    )
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)
    from airflow_provider_checkpoint.testing.clickstream import land_events

    landing = tmp / "clickstream" / "landing"
    landing.mkdir(parents=True)
    land_events(landing, "e1.json", args.events, 1, users=max(1, args.events // 10), pages=1000)
    spec = importlib.util.spec_from_file_location("example_clickstream", REPO / "dags" / "example_clickstream.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    peak = dict.fromkeys(("python", "jvm", "workers", "total"), 0)
    done = threading.Event()

    def sample() -> None:
        me = psutil.Process()
        while not done.wait(0.2):
            try:
                children = me.children(recursive=True)
                jvm = sum(p.memory_info().rss for p in children if "java" in p.name())
                workers = sum(p.memory_info().rss for p in children if "java" not in p.name())
                python = me.memory_info().rss
            except psutil.Error:
                continue
            for key, value in zip(peak, (python, jvm, workers, python + jvm + workers), strict=True):
                peak[key] = max(peak[key], value)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.monotonic()
    state = module.dag.test().state
    done.set()
    sampler.join()
    figures = ", ".join(f"{key} {value / 2**20:.0f} MiB" for key, value in peak.items())
    print(f"{args.events:,} events: {state} in {time.monotonic() - start:.1f}s; peak resident: {figures}")


if __name__ == "__main__":
    main()
