#!/usr/bin/env bash
# Idempotent: installs what the metrics test (tests/airflow/test_metrics_statsd.py) needs that pip
# cannot: Etsy's StatsD daemon (npm package `statsd`, pinned) into .cache/statsd. It needs Node.js
# and npm (installed with apt-get when missing and run as root); npm's own cache makes a second
# install offline.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.9.0
DIR=.cache/statsd
if [ -f "$DIR/node_modules/statsd/stats.js" ] && grep -q "\"version\": \"$VERSION\"" "$DIR/node_modules/statsd/package.json"; then
  echo "statsd $VERSION present in $DIR"
  exit 0
fi
if { ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; } && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing nodejs and npm (apt-get) for the StatsD daemon"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; } || true
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "error: the metrics test needs Node.js and npm for the StatsD daemon; install them (apt-get install -y nodejs npm) and run scripts/install_statsd.sh" >&2
  exit 1
fi
echo "installing statsd $VERSION (npm) into $DIR"
mkdir -p "$DIR"
if ! npm install --prefix "$DIR" --no-audit --no-fund --omit=optional --no-save "statsd@$VERSION" >"$DIR/npm-install.log" 2>&1; then
  echo "error: 'npm install statsd@$VERSION' failed (no network and not in npm's cache?); see $DIR/npm-install.log, then run scripts/install_statsd.sh again" >&2
  exit 1
fi
