#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test
# that needs no GPU (unit and namespaced-pod integration tests; needs root
# for unshare and cgroups; each test program once, in the release build or
# under ASan+UBSan), the broker, relay and mesh tests again under TSan, and the fuzzers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# The plain (release) build: what users run. Each test program runs once: those labelled `script` or `release`
# (tests/CMakeLists.txt) here, every other one in the ASan+UBSan pass below, where it checks more; running both
# trees' programs had cost CI about 5 minutes of its budget. PODLINK_QUICK=1 (no sanitizer passes) runs them all
# here instead.
if [ "${PODLINK_QUICK:-0}" = 1 ]; then
  plain_target="" plain_tests=(-LE gpu)
else
  plain_target=podlink_plain_pass plain_tests=(-L 'release|script')
fi
PODLINK_DEBUG_INFO=${PODLINK_DEBUG_INFO:--g1} PODLINK_BUILD_TARGET=$plain_target bash scripts/build.sh
# Twice as many tests at a time as cores: they wait on timers, sockets and their pods' processes more than they
# compute (2 cores, 2026-11-27: -j 2 took 146 s with the cores 47% busy, -j 4 81 s; docs/testing.md).
(cd "${PODLINK_BUILD_DIR:-build}" && ctest --output-on-failure -j "$((2 * $(nproc)))" "${plain_tests[@]}")
# `import podlink` (tests/python): Debian's python3 with the package from the build tree, podlinkd and pods
# made by the tests. pytest exits 5 when it collected no test: that fails here like any other failure.
PYTHONPATH="$PWD/${PODLINK_BUILD_DIR:-build}/python" PODLINKD="$PWD/${PODLINK_BUILD_DIR:-build}/daemon/podlinkd" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python
# The mesh over the RDMA verbs backend for real: two QEMU guests with
# soft-RoCE (tests/vm/mesh_verbs.sh; under a minute here).
PODLINK_VM_TIMEOUT=${PODLINK_VM_TIMEOUT:-300} bash tests/vm/mesh_verbs.sh "${PODLINK_BUILD_DIR:-build}" \
  "$(mktemp -d /tmp/podlink-vm-XXXXXX)"
# A node whose podlinkd may not pin its pod's region: that region goes over TCP
# (tests/vm/mesh_verbs_over_tcp.sh; about 30 s).
PODLINK_VM_TIMEOUT=${PODLINK_VM_TIMEOUT:-300} bash tests/vm/mesh_verbs_over_tcp.sh "${PODLINK_BUILD_DIR:-build}" \
  "$(mktemp -d /tmp/podlink-vm-XXXXXX)"
# Queue pairs forced into error for real: a region withdrawn mid-write
# (tests/vm/mesh_verbs_qp_error.sh; about 40 s).
PODLINK_VM_TIMEOUT=${PODLINK_VM_TIMEOUT:-300} bash tests/vm/mesh_verbs_qp_error.sh "${PODLINK_BUILD_DIR:-build}" \
  "$(mktemp -d /tmp/podlink-vm-XXXXXX)"
# Zero-copy TCP sends for real: two guests on tap cables, whose NICs offer
# scatter-gather (tests/vm/mesh_tcp_zero_copy.sh; about 25 s).
PODLINK_VM_TIMEOUT=${PODLINK_VM_TIMEOUT:-300} bash tests/vm/mesh_tcp_zero_copy.sh "${PODLINK_BUILD_DIR:-build}" \
  "$(mktemp -d /tmp/podlink-vm-XXXXXX)"
# The same tests under AddressSanitizer + UndefinedBehaviorSanitizer (clang, a tree that holds the libFuzzer
# targets too), the broker and relay integration tests under ThreadSanitizer (GCC), then every libFuzzer target
# for 10 s (tests/fuzz/README.md). PODLINK_QUICK=1 skips
# these for a fast local loop.
if [ "${PODLINK_QUICK:-0}" != 1 ]; then
  bash scripts/sanitize.sh asan
  bash scripts/sanitize.sh tsan
  # The fuzz targets were built with the ASan tree (scripts/sanitize.sh): fuzzed there.
  PODLINK_FUZZ_BUILD_DIR=${PODLINK_FUZZ_BUILD_DIR:-$PWD/${PODLINK_ASAN_BUILD_DIR:-build-asan}} \
    bash tests/fuzz/run.sh "${PODLINK_FUZZ_SECONDS:-10}"
fi
