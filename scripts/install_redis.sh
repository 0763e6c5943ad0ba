#!/usr/bin/env bash
# Idempotent: installs what the Celery topology test (tests/live/test_celery_topology.py) needs that
# pip cannot: Debian's redis-server (apt, as root), the Celery broker. The test starts its own
# server on a free loopback port in a temp directory; the package's own service is never used.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
  echo "redis-server present: $(redis-server --version)"
else
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: redis-server is missing and installing it needs root." >&2
    echo "       Run as root: apt-get update && apt-get install -y redis-server" >&2
    exit 1
  fi
  echo "installing redis-server (apt-get)"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server
fi
