#!/usr/bin/env bash
# Host memory as applications have it on a GPU machine (tests/gpu/host_memory_gpu.py), then what process memory
# costs against memfd memory there (tests/python/bench_host_memory.py), from the repository root with the bundle of
# scripts/device-bundle.sh in .devcarry/.
#
#   bash tests/gpu/host_memory_gpu.sh [OUT_DIR]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
ROOT=$(pwd)
OUT=${1:-/tmp/podlink-host-memory-gpu}
mkdir -p "$OUT"
LIB=$ROOT/.devcarry/lib
PY=${PODLINK_PYTHON:-python3}
bash tests/gpu/build_python.sh "$OUT/site" || exit $?
SOCK=$(mktemp -d /tmp/podlink-hm-gpu.XXXXXX)
LD_LIBRARY_PATH=$LIB "$ROOT/.devcarry/bin/podlinkd" --socket-dir "$SOCK" 2> "$OUT/podlinkd.log" &
DPID=$!
for _ in $(seq 300); do grep -q event=ready "$OUT/podlinkd.log" && break; sleep 0.1; done
PYTHONPATH=$OUT/site PODLINK_SOCKET_DIR=$SOCK timeout 300 "$PY" tests/gpu/host_memory_gpu.py > "$OUT/cases.jsonl" 2>&1
rc=$?
cat "$OUT/cases.jsonl"
PYTHONPATH=$OUT/site PODLINK_SOCKET_DIR=$SOCK timeout 300 "$PY" tests/python/bench_host_memory.py 64 \
  > "$OUT/bench_raw.jsonl" 2> "$OUT/bench_table.md" || rc=1
cat "$OUT/bench_table.md"
kill "$DPID" 2>/dev/null
wait "$DPID" 2>/dev/null
exit "$rc"
