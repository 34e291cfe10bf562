#!/usr/bin/env bash
# Builds podlink with a sanitizer into build-<name> and runs the tests there.
#
#   scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer, every test that needs no GPU
#
# ThreadSanitizer is not offered: Debian's Abseil is built without it, so
# absl::Mutex is invisible to TSan and every access it protects is reported
# as a race (tried 2026-11-23: RelayEngine's change lists under Worker::mu).
# Any report fails the run (halt_on_error / -fno-sanitize-recover).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
jobs=$(nproc)
case "$mode" in
  asan)
    build=${PODLINK_ASAN_BUILD_DIR:-build-asan}
    flags="address,undefined"
    # The daemon and test binaries run as child processes too: the options reach them through the environment.
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
    targets=(all)
    ctest_args=(-LE gpu)
    ;;
  *)
    echo "usage: $0 asan" >&2
    exit 2
    ;;
esac
start=$(date +%s)
echo "== $mode: configure and build $build (-fsanitize=$flags)"
# -O1 -g1 (line tables): reports keep file:line, and the build takes far less of CI's time than -O2 -g.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DPODLINK_SANITIZE="$flags" >/dev/null
for t in "${targets[@]}"; do cmake --build "$build" -j "$jobs" --target "$t"; done
echo "== $mode: built in $(($(date +%s) - start)) s; running tests"
cd "$build"
ctest --output-on-failure -j 2 --timeout 900 "${ctest_args[@]}"
echo "== $mode: done in $(($(date +%s) - start)) s"
