#!/usr/bin/env bash
# Watches the NCCL check ranks (tests/gpu/nccl_check.py) and, once a rank has
# run longer than AGE seconds, writes its threads' kernel state (and user
# stacks when gdb is installed) to OUTFILE, once per process. Diagnostic aid
# for hangs; started in the background next to nccl_pods.sh:
#   bash tests/gpu/hangdump.sh AGE OUTFILE &
AGE=${1:-60} OUT=${2:-/dev/stdout}
declare -A seen
while :; do
  for pid in $(pgrep -f nccl_check.py); do
    [ "$(cat /proc/$pid/comm 2>/dev/null)" = python3 ] || continue
    [ -n "${seen[$pid]:-}" ] && continue
    age=$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ')
    [ -n "$age" ] && [ "$age" -ge "$AGE" ] || continue
    seen[$pid]=1
    {
      env=$(tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -E '^(LABEL|RANK)=' | tr '\n' ' ')
      echo "=== pid $pid after ${age}s: $env"
      for t in /proc/$pid/task/*; do
        echo "$(basename "$t") $(cat "$t/comm") state=$(awk '{print $3}' "$t/stat") wchan=$(cat "$t/wchan")"
      done
      if command -v gdb >/dev/null; then
        timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt 25" 2>/dev/null | grep -E "^#|^Thread"
      fi
    } >> "$OUT" 2>&1
  done
  sleep 5
done
