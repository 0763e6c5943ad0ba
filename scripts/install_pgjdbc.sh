#!/usr/bin/env bash
# Debian's pgjdbc (libpostgresql-jdbc-java) for `scripts/benchmark.py postgres`, which then also times
# Spark's JDBC writer for reference. Neither the demo nor the tests need it. Idempotent.
set -euo pipefail
if [ -f /usr/share/java/postgresql.jar ]; then
  echo "pgjdbc present: /usr/share/java/postgresql.jar"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
  echo "error: installing pgjdbc needs apt-get as root (apt-get install libpostgresql-jdbc-java)" >&2
  exit 1
fi
echo "installing libpostgresql-jdbc-java (pgjdbc)"
apt-get update -qq && apt-get install -y -qq libpostgresql-jdbc-java >/dev/null
