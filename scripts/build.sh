#!/usr/bin/env bash
# Configures and builds podlink into ./build (or $PODLINK_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PODLINK_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
