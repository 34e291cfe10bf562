#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a while
# (tests/fuzz/README.md). From anywhere:
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET]      (default 60)
#
# Environment: PODLINK_FUZZ_BUILD_DIR (default build-fuzz), PODLINK_FUZZ_JOBS
# (build parallelism, default nproc), PODLINK_FUZZ_PARALLEL (targets fuzzed at
# once, one core each; default nproc).
#
# Per target: first every saved crash in tests/fuzz/regressions/<target>/ is
# replayed (each must now pass), then the target fuzzes for the given time,
# starting from the committed corpus. New inputs go to a temporary folder,
# never into the repository; a crashing input is written under
# <build>/fuzz/artifacts/<target>/ and its path printed. Ends with
# "N passed, M failed" and exits non-zero if any target failed.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FUZZ_DIR=$ROOT/tests/fuzz
SECONDS_PER_TARGET=${1:-60}
BUILD=${PODLINK_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
JOBS=${PODLINK_FUZZ_JOBS:-$(nproc)}
PARALLEL=${PODLINK_FUZZ_PARALLEL:-$(nproc)}
TARGETS=(fd_channel_fuzz cgroup_parser_fuzz config_fuzz ring_layout_fuzz relay_fuzz broker_fuzz mesh_frame_fuzz
         owner_answer_fuzz kube_pods_fuzz seal_window_fuzz)
LIBFUZZER_FLAGS=(-rss_limit_mb=2048 -timeout=10)

if ! [[ $SECONDS_PER_TARGET =~ ^[0-9]+$ ]] || [ "$SECONDS_PER_TARGET" -eq 0 ]; then
  echo "usage: $0 [SECONDS_PER_TARGET]" >&2
  exit 2
fi

start=$(date +%s)
configure=(true)
if grep -qs '^PODLINK_FUZZ:BOOL=ON' "$BUILD/CMakeCache.txt"; then
  # A tree configured for fuzzing already (scripts/sanitize.sh asan builds the tests and these targets in one):
  # built as it was configured.
  echo "== build ($BUILD as configured, -j $JOBS)"
else
  echo "== configure and build ($BUILD, -j $JOBS)"
  # -O1 with line tables, as OSS-Fuzz builds its fuzzers: stack traces keep
  # file:line, and it compiles faster than RelWithDebInfo's -O2 -g.
  configure=(env CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -DPODLINK_FUZZ=ON -DPODLINK_BUILD_TESTS=OFF
             -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only"
             -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only")
fi
if ! "${configure[@]}" >/dev/null || ! cmake --build "$BUILD" --target "${TARGETS[@]}" -j "$JOBS"; then
  echo "build failed"
  echo "0 passed, ${#TARGETS[@]} failed"
  exit 1
fi
echo "built in $(($(date +%s) - start)) s"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/podlink-fuzz.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'kill $(jobs -p) 2>/dev/null; exit 130' INT TERM

# Prints the input that failed and why, from a libFuzzer log: the file it
# was replaying, or where it wrote the input it generated.
report_failure() {
  local log=$1
  if grep -q 'Test unit written to' "$log"; then
    grep -h -o 'Test unit written to .*' "$log" | sed 's/^Test unit written to /  crashing input: /'
  else
    grep -h '^Running: ' "$log" | tail -1 | sed 's/^Running: /  crashing input: /'
  fi
  grep -h -m1 -E '^(==[0-9]+== ?ERROR|.*runtime error:|.*check failed:)' "$log" | sed 's/^/  /'
  echo "  log: $log"
}

# One target: replay, then fuzz; leaves its summary line in $WORK/$t.summary
# and "ok" or why not in $WORK/$t.result.
fuzz_target() {
  local t=$1 bin logs artifacts result runs secs start rc f
  local -a regressions
  bin=$BUILD/tests/fuzz/$t
  logs=$BUILD/fuzz/logs
  artifacts=$BUILD/fuzz/artifacts/$t
  mkdir -p "$logs" "$artifacts" "$WORK/$t"
  result=ok
  runs=0
  secs=0

  # 1. Saved crashes stay fixed.
  regressions=()
  if [ -d "$FUZZ_DIR/regressions/$t" ]; then
    while IFS= read -r -d '' f; do regressions+=("$f"); done \
      < <(find "$FUZZ_DIR/regressions/$t" -type f -print0 | sort -z)
  fi
  if [ ${#regressions[@]} -gt 0 ]; then
    echo "== $t: replaying ${#regressions[@]} saved input(s)"
    if ! "$bin" "${LIBFUZZER_FLAGS[@]}" -artifact_prefix="$artifacts/" "${regressions[@]}" \
      >"$logs/$t.regressions.log" 2>&1; then
      result="regression"
      echo "$t: a saved input in tests/fuzz/regressions/$t/ fails again"
      report_failure "$logs/$t.regressions.log"
    fi
  fi

  # 2. Fuzz: new inputs go to $WORK/$t, the committed corpus is only read.
  if [ "$result" = ok ]; then
    echo "== $t: fuzzing ${SECONDS_PER_TARGET}s"
    start=$(date +%s)
    "$bin" "${LIBFUZZER_FLAGS[@]}" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "$WORK/$t" "$FUZZ_DIR/corpus/$t" >"$logs/$t.log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    runs=$(grep -h -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t.log" | grep -o '[0-9]*$' | tail -1)
    runs=${runs:-$(grep -h -o '^#[0-9]*' "$logs/$t.log" | tail -1 | tr -d '#')}
    if [ $rc -ne 0 ]; then
      result="crash"
      echo "$t: failed (exit $rc)"
      report_failure "$logs/$t.log"
    fi
  fi

  printf '%-20s runs=%-10s seconds=%-5s result=%s\n' "$t" "${runs:-0}" "$secs" "$result" > "$WORK/$t.summary"
  echo "$result" > "$WORK/$t.result"
}

# PARALLEL targets at a time (libFuzzer uses one core per process).
running=0
for t in "${TARGETS[@]}"; do
  if [ "$running" -ge "$PARALLEL" ]; then wait -n; running=$((running - 1)); fi
  fuzz_target "$t" &
  running=$((running + 1))
done
wait
passed=0
failed=0
SUMMARY=()
for t in "${TARGETS[@]}"; do
  if [ "$(cat "$WORK/$t.result" 2>/dev/null)" = ok ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  SUMMARY+=("$(cat "$WORK/$t.summary" 2>/dev/null || echo "$t result=did-not-finish")")
done

echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
