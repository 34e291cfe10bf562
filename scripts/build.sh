#!/usr/bin/env bash
# Configures and builds podlink into ./build (or $PODLINK_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PODLINK_BUILD_DIR:-build}
# PODLINK_DEBUG_INFO: the debug-info flag (-g, full; the test command uses -g1, line tables only, which keeps
# file:line in backtraces and compiles noticeably faster on CI's two cores).
DEBUG_INFO=${PODLINK_DEBUG_INFO:--g}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 $DEBUG_INFO -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 $DEBUG_INFO -DNDEBUG" >/dev/null
# PODLINK_BUILD_TARGET: one target instead of everything (the test command's plain pass: podlink_plain_pass).
cmake --build "$BUILD" -j "$(nproc)" ${PODLINK_BUILD_TARGET:+--target "$PODLINK_BUILD_TARGET"}
