#!/usr/bin/env bash
# What the tests need beyond the virtualenv (and the servers, scripts/services.sh): headless
# Chromium, for the test that the API docs render without internet access. Installed once.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "test tools: installing Chromium" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
