#!/usr/bin/env bash
# The soak (docs/soak.md): builds podlinkd and podlink-soak, runs the soak
# with the given podlink-soak options (default: 100000 cycles, 8 pods), keeps
# its raw output in docs/soak/<date>-<host>.log and regenerates the results in
# docs/soak.md from the logs there. Needs root (cgroups, unshare). Exits with
# the soak's status.
#
#   bash tests/soak/run.sh [--cycles N] [--pods N] [--seed S] [--fault_rate F] ...
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${PODLINK_BUILD_DIR:-build-soak}
JOBS=${PODLINK_BUILD_JOBS:-1}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
nice cmake --build "$BUILD" -j "$JOBS" --target podlinkd podlink-soak
mkdir -p docs/soak
LOG=docs/soak/$(date -u +%F)-$(hostname -s).log
for n in $(seq 2 99); do  # earlier runs of the day are kept
  [ -e "$LOG" ] || break
  LOG=docs/soak/$(date -u +%F)-$(hostname -s)-$n.log
done
# What was built: the commit, and the sources that differed from it.
CHANGED=$(git status --porcelain -- daemon client-lib common proto 2>/dev/null | awk '{print $2}' | tr '\n' ' ')
echo "git: commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown) changed=[${CHANGED% }]" > "$LOG"
echo "runner: bash tests/soak/run.sh${*:+ $*}" >> "$LOG"
set +e
nice "$BUILD/tests/soak/podlink-soak" "$@" | tee -a "$LOG"
rc=${PIPESTATUS[0]}
set -e
python3 tests/soak/summarize.py --update docs/soak.md docs/soak/*.log
echo "raw output: $LOG; results: docs/soak.md"
exit "$rc"
