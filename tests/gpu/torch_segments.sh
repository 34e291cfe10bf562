#!/usr/bin/env bash
# torch's own GPU memory (expandable segments) between two pods on one GPU (tests/gpu/torch_segments.py), what
# the CUDA driver shows of torch's allocations (tests/gpu/torch_segments_probe.py), and the GPU broker tests,
# from the repository root with the bundle of scripts/device-bundle.sh in .devcarry/.
#
#   bash tests/gpu/torch_segments.sh [OUT_DIR]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
ROOT=$(pwd)
OUT=${1:-/tmp/podlink-torch-segments}
mkdir -p "$OUT"
LIB=$ROOT/.devcarry/lib
PY=${PODLINK_PYTHON:-python3}
rc=0
timeout 120 "$PY" tests/gpu/torch_segments_probe.py > "$OUT/probe.jsonl" 2>&1 || rc=1
(cd .devcarry && PODLINKD_PATH=$ROOT/.devcarry/bin/podlinkd LD_LIBRARY_PATH=lib timeout 300 bin/gpu_broker_test \
   > "$OUT/gpu_broker_test.log" 2>&1) || rc=1
grep -E "^\[  (PASSED|FAILED)|FAILED|GPU cycle" "$OUT/gpu_broker_test.log"
bash tests/gpu/build_python.sh "$OUT/site" > "$OUT/build_python.log" 2>&1 || { tail "$OUT/build_python.log"; exit 1; }
SOCK=$(mktemp -d /tmp/podlink-segs.XXXXXX)
chmod 755 "$SOCK"
LD_LIBRARY_PATH=$LIB "$ROOT/.devcarry/bin/podlinkd" --socket-dir "$SOCK" 2> "$OUT/podlinkd.log" &
DPID=$!
for _ in $(seq 300); do grep -q event=ready "$OUT/podlinkd.log" && break; sleep 0.1; done
PYTHONPATH=$OUT/site PODLINK_SOCKET_DIR=$SOCK timeout 400 "$PY" tests/gpu/torch_segments.py > "$OUT/cases.jsonl" 2>&1 || rc=1
cat "$OUT/cases.jsonl"
kill "$DPID" 2>/dev/null
wait "$DPID" 2>/dev/null
gzip -f "$OUT/podlinkd.log"
rm -rf "$OUT/site"
echo "torch_segments rc=$rc"
exit "$rc"
