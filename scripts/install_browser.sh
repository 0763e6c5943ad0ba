#!/usr/bin/env bash
# Idempotent: installs what the live UI test (tests/live/test_ui_savepoint.py) needs that
# pip cannot: Debian's chromium at /usr/bin/chromium (apt, as root). Playwright (pinned in
# the test extra) drives this system Chromium; it never downloads a browser of its own
# (do not run `playwright install`).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -x /usr/bin/chromium ]; then
  echo "chromium present: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
else
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: /usr/bin/chromium is missing and installing it needs root." >&2
    echo "       Run as root: apt-get update && apt-get install -y chromium" >&2
    exit 1
  fi
  echo "installing chromium (apt-get)"
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
fi

