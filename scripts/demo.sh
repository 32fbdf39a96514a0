#!/usr/bin/env bash
# One command for a fresh machine: install dependencies, build, run `sentinel demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
status=0
./"${SENTINEL_BUILD_DIR:-build}"/sentinel demo "$@" || status=$?
# The demo is meant to find an overflow: exit code 3 is its success.
if [ "$status" -eq 3 ]; then exit 0; fi
exit "$status"
