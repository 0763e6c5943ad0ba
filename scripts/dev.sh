#!/usr/bin/env bash
# The two commands of the README: `demo` runs the example pipeline, `test` the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
export SPARK_LOCAL_IP=127.0.0.1
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export PYTHONUNBUFFERED=1
case "${1:-}" in
  demo)
    shift
    exec python scripts/demo.py "$@"
    ;;
  test)
    shift
    # what the tests need beside Python: in CI each must install, elsewhere a warning names what is skipped
    need() {
      if ! bash "scripts/install_$1.sh"; then
        if [ "${CI:-}" = "true" ]; then exit 1; fi
        echo "warning: $2" >&2
      fi
    }
    need browser "no Chromium; the UI test will be skipped"
    need statsd "no StatsD daemon; the metrics test will be skipped"
    need redis "no redis-server; the Celery topology test will be skipped"
    need delta_spark "no delta-spark jars; the Delta interoperability tests will be skipped"
    need kafka "no Apache Kafka broker; the Kafka tests will be skipped"
    # two workers (pytest-xdist; TEST_WORKERS=0: none), each test module whole in one of them,
    # the longest first (tests/conftest.py)
    exec python -m pytest -n "${TEST_WORKERS:-2}" --no-loadscope-reorder "$@"
    ;;
  *)
    echo "usage: scripts/dev.sh demo|test [args...]" >&2
    exit 2
    ;;
esac
