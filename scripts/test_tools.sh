#!/usr/bin/env bash
# What the tests need beyond the virtualenv (and the servers, scripts/services.sh): headless
# Chromium, for the test that the API docs render without internet access, and
# systemd-analyze (Debian's systemd package), for the test that verifies deploy/systemd's
# units. Installed once.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
if ((${#missing[@]})); then
  echo "test tools: installing ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
