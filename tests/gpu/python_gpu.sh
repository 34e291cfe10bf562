#!/usr/bin/env bash
# `import podlink` on the GPU machine (tests/gpu/python_gpu.py), from the repository root with the bundle of
# scripts/device-bundle.sh in .devcarry/: builds the module there against that machine's python
# (tests/gpu/build_python.sh), starts a podlinkd, runs the checks and the benchmark.
#
#   bash tests/gpu/python_gpu.sh [OUT_DIR]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
ROOT=$(pwd)
OUT=${1:-/tmp/podlink-python-gpu}
LIB=$ROOT/.devcarry/lib
PY=${PODLINK_PYTHON:-python3}
bash tests/gpu/build_python.sh "$OUT/site" || exit $?
SOCK=$(mktemp -d /tmp/podlink-py-gpu.XXXXXX)
LD_LIBRARY_PATH=$LIB "$ROOT/.devcarry/bin/podlinkd" --socket-dir "$SOCK" 2> "$OUT/podlinkd.log" &
DPID=$!
for _ in $(seq 300); do grep -q event=ready "$OUT/podlinkd.log" && break; sleep 0.1; done
PYTHONPATH=$OUT/site PODLINK_SOCKET_DIR=$SOCK timeout 600 "$PY" tests/gpu/python_gpu.py 2>&1 | tee "$OUT/python_gpu.log"
rc=${PIPESTATUS[0]}
kill "$DPID" 2>/dev/null
wait "$DPID" 2>/dev/null
exit "$rc"
