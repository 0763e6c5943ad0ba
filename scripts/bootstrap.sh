#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: checks Python >= 3.11 and Java 17+, creates .venv,
# installs the provider with pinned versions (constraints.txt). Prints what it does.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1 || ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: Python 3.11 or newer is required (found: $("$PY" --version 2>&1 || echo none)). Install it, or set PYTHON=/path/to/python3.11." >&2
  exit 1
fi
if ! command -v java >/dev/null 2>&1; then
  echo "error: Java 17 is required by Spark and 'java' is not on PATH. Install OpenJDK 17 (e.g. apt-get install openjdk-17-jre-headless) and set JAVA_HOME." >&2
  exit 1
fi
JAVA_MAJOR=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ -z "$JAVA_MAJOR" ] || [ "$JAVA_MAJOR" -lt 17 ]; then
  echo "error: Java 17 or newer is required by Spark 4; 'java -version' says: $(java -version 2>&1 | head -1)" >&2
  exit 1
fi

STAMP=.venv/.installed-compiled
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv"
  "$PY" -m venv .venv
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ constraints.txt -nt "$STAMP" ]; then
  echo "installing airflow-provider-checkpoint and its pinned dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip uv
  # PyPI has pyspark only as a source distribution (450 MB of jars): build its wheel once per
  # machine and install from it, instead of a fresh build (a minute, 900 MB of cache) per venv
  WHEELHOUSE="${XDG_CACHE_HOME:-$HOME/.cache}/airflow-provider-checkpoint/wheels"
  PYSPARK_VERSION=$(sed -n 's/^pyspark==//p' constraints.txt)
  if ! ls "$WHEELHOUSE/pyspark-$PYSPARK_VERSION-"*.whl >/dev/null 2>&1; then
    echo "building pyspark $PYSPARK_VERSION's wheel (once per machine, about a minute) into $WHEELHOUSE"
    .venv/bin/python -m pip wheel -q --no-deps -w "$WHEELHOUSE" "pyspark==$PYSPARK_VERSION"
  fi
  .venv/bin/uv pip install -q --python .venv/bin/python --find-links "$WHEELHOUSE" -c constraints.txt -e ".[test]"
  # every Airflow task, Spark Python worker and test process imports airflow, pyspark, pandas and
  # pyarrow: without .pyc files (uv writes none, and PYTHONDONTWRITEBYTECODE=1 keeps Python from
  # caching them) each process compiles them again, which doubled the time of the test suite
  echo "compiling the installed modules to bytecode (once, about half a minute)"
  # in the background, beside the class-data sharing archive below (a JVM that leaves a core idle)
  { .venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages >/dev/null \
    || echo "warning: some installed modules did not compile; they compile on every import instead"; } &
  COMPILING=$!
fi
.venv/bin/python -m compileall -q -j 0 airflow_provider_checkpoint dags plugins tests scripts >/dev/null \
  || echo "warning: some of the repository's modules did not compile; they compile on every import instead"
CDS_ARCHIVE="$(.venv/bin/python -c 'from airflow_provider_checkpoint.spark.session import archive_path; print(archive_path())')"
if [ ! -f "$CDS_ARCHIVE" ]; then
  echo "creating the Spark driver's class-data sharing archive (once, about a minute)"
  SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python -m airflow_provider_checkpoint.spark.cds \
    || echo "no class-data sharing archive (optional): the embedded Spark JVM starts slower"
fi
if [ -n "${COMPILING:-}" ]; then
  wait "$COMPILING"
  touch "$STAMP"
fi
