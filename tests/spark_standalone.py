"""A real Spark standalone cluster (master + one worker) from the installed pyspark, on loopback.

Master and worker are started with ``spark-class``, each in its own process group (the
worker's executor JVMs are in the worker's group), web UIs on free ports. Everything is
stopped on exit, also after a failure. The worker's environment has no ``AWS_*`` variable:
executors reach an object store only with what the step gives them. Every local file an
executor writes is under ``root``: its work directory (``work/``) and scratch space (``local/``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyspark

from tests.live.airflow_live import free_port, poll, stop_process_group, tail

SPARK_HOME = Path(pyspark.__file__).parent


@dataclass
class StandaloneCluster:
    master_url: str
    ui_url: str
    worker: subprocess.Popen[bytes]
    root: Path

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, active and completed applications)."""
        return dict(httpx.get(f"{self.ui_url}/json/", timeout=10).json())

    def executor_pids(self) -> list[int]:
        """Pids of the executor JVMs (CoarseGrainedExecutorBackend) the worker runs now."""
        children = psutil.Process(self.worker.pid).children(recursive=True)
        return [p.pid for p in children if "CoarseGrainedExecutorBackend" in " ".join(_cmdline(p))]

    def executor_files(self) -> list[Path]:
        """Every file the executors left on local disk: work directories and scratch space."""
        return sorted(
            p for d in ("work", "local") if (self.root / d).exists() for p in (self.root / d).rglob("*") if p.is_file()
        )


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextlib.contextmanager
def standalone_cluster(
    root: Path, cores: int = 2, memory: str = "2g", timeout: float = 120.0
) -> Iterator[StandaloneCluster]:
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # executors get no credentials
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(root))
    env["SPARK_LOCAL_DIRS"] = str(root / "local")  # the executors' scratch space (shuffle, spills)
    env.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    port, ui = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            _spawn(
                ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", str(ui)],
                root / "master.log", env,
            )
        )  # fmt: skip
        cluster_ui = f"http://127.0.0.1:{ui}"

        def master_up() -> bool:
            if procs[0].poll() is not None:
                raise RuntimeError(f"Spark master exited:\n{tail(root / 'master.log')}")
            return httpx.get(f"{cluster_ui}/json/", timeout=5).status_code == 200

        poll("the Spark master", master_up, timeout)
        master_url = f"spark://127.0.0.1:{port}"
        worker = _spawn(
            ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", str(free_port()),
             "--webui-port", str(free_port()), "--cores", str(cores), "--memory", memory,
             "--work-dir", str(root / "work"), master_url],
            root / "worker.log", env,
        )  # fmt: skip
        procs.append(worker)
        cluster = StandaloneCluster(master_url, cluster_ui, worker, root)

        def worker_alive() -> bool:
            if worker.poll() is not None:
                raise RuntimeError(f"Spark worker exited:\n{tail(root / 'worker.log')}")
            return any(w["state"] == "ALIVE" for w in cluster.state()["workers"])

        poll("the Spark worker to register", worker_alive, timeout)
        yield cluster
    finally:
        for proc in reversed(procs):
            stop_process_group(proc, grace=10.0)
