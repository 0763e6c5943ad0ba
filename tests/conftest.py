"""Test-wide isolation: a private AIRFLOW_HOME (SQLite), loopback Spark, no example DAGs.

The environment is set before anything imports Airflow, so no test touches a user's
Airflow installation.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_HOME = Path(tempfile.mkdtemp(prefix="airflow-checkpoint-tests-"))

os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__CHECKPOINT__STORAGE_ROOT"] = f"file://{_HOME}/checkpoints"
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ.pop("CHECKPOINT_FAULTS", None)
os.environ.pop("CHECKPOINT_FAULTS_FILE", None)

pytest_plugins = ["tests.servers.postgres", "tests.servers.s3"]
