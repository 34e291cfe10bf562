#!/usr/bin/env bash
# GPU checks that need one GPU (the device tool's nvidia-h100-x1 or
# nvidia-h200), run from the repository root with the bundle made by
# scripts/device-bundle.sh in .devcarry/:
#
#   bash tests/gpu/run_one_gpu.sh [OUT_DIR]
#
# 1. gpu_broker_test: GPU exports, imports, maps, hostile GPU exports, leaks
#    (its two-GPU test skips); gpu_dmabuf_test: the node's dma-buf support and
#    the daemon's dma-buf of a pod's GPU export.
# 2. The NCCL plugin's conformance scenarios on GPU memory between two pods
#    (nccl_net_conformance_test GpuModes/*): exported cuMem buffers through
#    podlinkd's relay, the plugin's GPU bounce buffers, TCP with page-locked
#    staging.
# 3. mesh_test's GPU cases: a pod on another (emulated) node writes and reads a
#    GPU export through both daemons' mesh, and through a relay node too
#    (two-hop striping, GPU memory at both ends); the NCCL plugin between two nodes
#    with GPU buffers, one device per GPU and one per rail group.
# 4. podlink-bench on GPU 0 (relay and in-process copies, timed).
# Exits non-zero when any step fails; the last lines are a summary table.
set -uo pipefail
OUT=${1:-/tmp/podlink-gpu1-out}
mkdir -p "$OUT"
ROOT=$(pwd)
BIN=$ROOT/.devcarry/bin
IPR=$ROOT/.devcarry/iproute
export LD_LIBRARY_PATH=$ROOT/.devcarry/lib
export PODLINKD_PATH=$BIN/podlinkd PODLINK_DEMO_PATH=$BIN/podlink-demo
export PODLINK_NCCL_PLUGIN_PATH=$ROOT/.devcarry/lib/libnccl-net-podlink.so PODLINK_NCCL_PEER_PATH=$BIN/nccl_net_peer
export PODLINK_TEST_IP="/lib64/ld-linux-x86-64.so.2 --library-path $IPR/lib $IPR/bin/ip"
export NCCL_NVLS_ENABLE=0
declare -a ROWS
FAILED=0

echo "== machine"; nvidia-smi -L; uname -r; echo "bundle of commit $(cat "$ROOT/.devcarry/COMMIT" 2>/dev/null)"
$PODLINK_TEST_IP -V || { echo "iproute2 bundle missing in $IPR"; exit 1; }

step() {  # step NAME LOG COMMAND...
  local name=$1 log=$2; shift 2
  echo "== $name"
  local start=$SECONDS
  "$@" > "$log" 2>&1
  local rc=$?
  tail -n 40 "$log"
  [ $rc = 0 ] || FAILED=1
  ROWS+=("$(printf '| %-44s | %-4s | %4ss |' "$name" "$([ $rc = 0 ] && echo pass || echo FAIL)" $((SECONDS - start)))")
}

step "gpu_broker_test" "$OUT/gpu_broker_test.log" "$BIN/gpu_broker_test"
step "gpu_dmabuf_test (dma-buf of a GPU export)" "$OUT/gpu_dmabuf_test.log" "$BIN/gpu_dmabuf_test"
step "nccl_net_conformance_test GpuModes/*" "$OUT/nccl_net_gpu.log" \
  "$BIN/nccl_net_conformance_test" --gtest_filter='GpuModes/*'
# The mesh serving a GPU export to a pod of another node (two emulated nodes
# in network namespaces; `ip` from the bundle through a wrapper on PATH; the
# test makes its CA with openssl and skips without it, which counts as failed here).
IPW=$(mktemp -d /tmp/podlink-ipw.XXXXXX)
printf '#!/bin/sh\nexec %s "$@"\n' "$PODLINK_TEST_IP" > "$IPW/ip" && chmod +x "$IPW/ip"
mesh_gpu() {
  PATH="$IPW:$PATH" "$BIN/mesh_test" \
    --gtest_filter='Mesh.APodWritesAndReadsAGpuExportOfAnotherNode:Mesh.TwoHopStripingCarriesGpuMemory' || return 1
}
step "mesh_test: another node's pod writes a GPU export (direct, two-hop)" "$OUT/mesh_gpu.log" mesh_gpu
grep -q '^\[  SKIPPED' "$OUT/mesh_gpu.log" && { echo "mesh GPU test skipped (no openssl or ip netns?)"; FAILED=1; }
# The NCCL plugin across the emulated nodes with NCCL's buffers in GPU memory:
# the conformance scenarios, and one device per rail group of a fake sysfs
# (each rail's traffic on its own cables, copies on the GPU nearest to it).
mesh_nccl_gpu() {
  PATH="$IPW:$PATH" PODLINK_TEST_MEM=cuda "$BIN/mesh_test" \
    --gtest_filter='Mesh.NcclPluginBetweenPodsOnTwoNodesGoesThroughTheMesh:Mesh.RailGroupsAreTheNcclDevicesWithTheirSpeed'
}
step "mesh_test: NCCL plugin, GPU buffers, rail devices" "$OUT/mesh_nccl_gpu.log" mesh_nccl_gpu
SOCK=$(mktemp -d /tmp/podlink-bench.XXXXXX)
"$BIN/podlinkd" --socket-dir "$SOCK" 2> "$OUT/podlinkd-bench.log" &
DPID=$!
for _ in $(seq 300); do grep -q event=ready "$OUT/podlinkd-bench.log" && break; sleep 0.1; done
step "podlink-bench GPU0 -> GPU0" "$OUT/bench.md" env PODLINK_SOCKET_DIR="$SOCK" "$BIN/podlink-bench" \
  --src-gpu 0 --dst-gpu 0 --json "$OUT/bench.json"
kill "$DPID"; wait "$DPID" 2>/dev/null

grep -E '^\[ +(OK|FAILED|SKIPPED) +\]' "$OUT/gpu_broker_test.log" "$OUT/nccl_net_gpu.log" "$OUT/mesh_gpu.log" \
  "$OUT/mesh_nccl_gpu.log" | sed 's|.*/||' \
  > "$OUT/gtests.txt"
echo "== gtests"; cat "$OUT/gtests.txt"
echo "== summary"
echo "| step | result | time |"
echo "|---|---|---|"
printf '%s\n' "${ROWS[@]}"
exit $FAILED
