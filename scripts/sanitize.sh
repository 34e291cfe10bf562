#!/usr/bin/env bash
# Builds podlink with a sanitizer into build-<name> and runs the tests there.
#
#   scripts/sanitize.sh asan   AddressSanitizer + UndefinedBehaviorSanitizer, every test that needs no GPU
#   scripts/sanitize.sh tsan   ThreadSanitizer, the broker and relay integration tests
#
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
  tsan)
    build=${PODLINK_TSAN_BUILD_DIR:-build-tsan}
    flags="thread"
    # libgrpc, libprotobuf and libabsl are not instrumented: their internal
    # synchronization is invisible to TSan, so reports whose every frame is in
    # them are dropped (ignore_noninstrumented_modules) or suppressed.
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/tests/sanitizers/tsan.supp"
    targets=(podlinkd podlink-demo relay_test broker_namespaces_test hostile_clients_test leak_test)
    ctest_args=(-R "^(Workers/Relay|BrokerNamespaces|HostileClients|Attacks|Leaks)\\.")
    ;;
  *)
    echo "usage: $0 asan|tsan" >&2
    exit 2
    ;;
esac
start=$(date +%s)
echo "== $mode: configure and build $build (-fsanitize=$flags)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPODLINK_SANITIZE="$flags" >/dev/null
for t in "${targets[@]}"; do cmake --build "$build" -j "$jobs" --target "$t"; done
echo "== $mode: built in $(($(date +%s) - start)) s; running tests"
cd "$build"
ctest --output-on-failure -j 2 --timeout 900 "${ctest_args[@]}"
echo "== $mode: done in $(($(date +%s) - start)) s"
