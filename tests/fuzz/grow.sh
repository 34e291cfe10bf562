#!/usr/bin/env bash
# Grows and minimizes the committed corpus of fuzz targets with a long run
# (tests/fuzz/README.md, "Growing the corpus"). Not part of the test command.
#
#   tests/fuzz/grow.sh SECONDS TARGET...
#
# Per target: fuzzes for SECONDS from the committed corpus into a scratch
# folder, then adds to tests/fuzz/corpus/TARGET/ the fewest of the inputs it
# found that keep every feature they add (-merge=1; the committed inputs stay). The targets come from a tree built for fuzzing
# (PODLINK_FUZZ_BUILD_DIR, default build-fuzz; tests/fuzz/run.sh builds it),
# run one at a time (PODLINK_FUZZ_PARALLEL at once, default 1). Prints a line
# per target: executions and executions per second, inputs and features before
# and after; the raw libFuzzer logs stay in <build>/fuzz/grow-logs/.
# A crash stops that target (its corpus is left as it was) and fails the run.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${PODLINK_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
PARALLEL=${PODLINK_FUZZ_PARALLEL:-1}
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -eq 0 ]; then
  echo "usage: $0 SECONDS TARGET..." >&2
  exit 2
fi
SECONDS_PER_TARGET=$1
shift
LOGS=$BUILD/fuzz/grow-logs
mkdir -p "$LOGS"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/podlink-fuzz-grow.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# The number of features ("ft:") libFuzzer reports once it has read `dir` (-runs=0 reads and stops).
features() {
  local bin=$1 dir=$2 log=$3
  "$bin" -runs=0 -rss_limit_mb=2048 "$dir" >"$log" 2>&1
  grep -h -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*'
}

grow() {
  local t=$1 bin corpus found merged runs before_n after_n before_ft after_ft start secs rate
  bin=$BUILD/tests/fuzz/$t
  corpus=$ROOT/tests/fuzz/corpus/$t
  [ -x "$bin" ] || { echo "$t: $bin not built (tests/fuzz/run.sh builds it)"; echo fail >"$WORK/$t.result"; return; }
  found=$WORK/$t.found merged=$WORK/$t.merged
  mkdir -p "$found" "$merged" "$corpus"
  before_n=$(find "$corpus" -type f | wc -l)
  before_ft=$(features "$bin" "$corpus" "$LOGS/$t.before.log")
  start=$(date +%s)
  if ! "$bin" -rss_limit_mb=2048 -timeout=10 -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
      -artifact_prefix="$WORK/$t." "$found" "$corpus" >"$LOGS/$t.log" 2>&1; then
    echo "$t: crashed; corpus left as it was; log $LOGS/$t.log"
    grep -h -o 'Test unit written to .*' "$LOGS/$t.log" | sed 's/^/  /'
    echo fail >"$WORK/$t.result"
    return
  fi
  secs=$(($(date +%s) - start))
  runs=$(grep -h -o 'stat::number_of_executed_units: *[0-9]*' "$LOGS/$t.log" | grep -o '[0-9]*$' | tail -1)
  # The committed inputs stay as they are (the seeds are named after what they do); of what the run found, only
  # the inputs that add a feature to them join, named by content (libFuzzer's SHA-1 names).
  cp "$corpus"/. "$merged"/ -r
  "$bin" -rss_limit_mb=2048 -timeout=10 -merge=1 "$merged" "$found" >"$LOGS/$t.merge.log" 2>&1 || {
    echo "$t: merge failed; log $LOGS/$t.merge.log"
    echo fail >"$WORK/$t.result"
    return
  }
  cp -n "$merged"/* "$corpus"/
  after_n=$(find "$corpus" -type f | wc -l)
  after_ft=$(features "$bin" "$corpus" "$LOGS/$t.after.log")
  rate=$(( ${runs:-0} / (secs > 0 ? secs : 1) ))
  printf '%-20s runs=%-10s seconds=%-6s runs_per_s=%-7s inputs=%s->%s features=%s->%s\n' "$t" "${runs:-0}" "$secs" \
    "$rate" "$before_n" "$after_n" "${before_ft:-?}" "${after_ft:-?}" >"$WORK/$t.summary"
  cat "$WORK/$t.summary"
  echo ok >"$WORK/$t.result"
}

running=0
for t in "$@"; do
  if [ "$running" -ge "$PARALLEL" ]; then wait -n; running=$((running - 1)); fi
  grow "$t" &
  running=$((running + 1))
done
wait
failed=0
echo "== summary"
for t in "$@"; do
  cat "$WORK/$t.summary" 2>/dev/null || echo "$t did not finish"
  [ "$(cat "$WORK/$t.result" 2>/dev/null)" = ok ] || failed=$((failed + 1))
done
exit $((failed > 0))
