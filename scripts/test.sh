#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test
# that needs no GPU (unit and namespaced-pod integration tests; needs root
# for unshare and cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
cd "${PODLINK_BUILD_DIR:-build}"
ctest --output-on-failure -j 2 -LE gpu
