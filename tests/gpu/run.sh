#!/usr/bin/env bash
# GPU tests for the broker, run on a machine with two GPUs (the device tool's
# nvidia-h200-x2) from the repository root, with the bundle made by
# scripts/device-bundle.sh in .devcarry/. On a machine with one GPU the rows
# that need a second GPU are reported as skipped and the rest run on GPU 0.
#
#   bash tests/gpu/run.sh [OUT_DIR]
#
# 1. podlinkd (with CUDA) and isolated "pods": own PID, UTS, IPC, network and
#    mount namespaces, own kubepods-style cgroup, and in each pod the other
#    GPU's /dev/nvidiaN replaced by /dev/null, as in a Kubernetes pod.
#    Pod A exports a 1 GiB GPU buffer; other pods import it through the
#    daemon, and the script reports which paths work and the bytes verified.
# 2. The GPU gtests (ctest label gpu): hostile GPU exports, round trips, leaks.
# Exits non-zero when any row fails or any gtest fails; the summary is last.
set -uo pipefail
# shellcheck source=scripts/lib/pod.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/pod.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${1:-/tmp/podlink-gpu-out}
mkdir -p "$OUT"
ROOT=$(pwd)
BIN=$ROOT/.devcarry/bin
export LD_LIBRARY_PATH=$ROOT/.devcarry/lib
export PODLINKD_PATH=$BIN/podlinkd PODLINK_DEMO_PATH=$BIN/podlink-demo
WORK=$(mktemp -d /tmp/podlink-gpu.XXXXXX)
SOCK=$WORK/sock
declare -a ROWS
FAILED=0

echo "== machine"; nvidia-smi -L; nvidia-smi topo -m | head -4; uname -r
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)  # GPUs, not MIG instances
[ "$NGPU" -ge 1 ] || { echo "no GPU"; exit 1; }
# The second GPU's device node (hidden from pods on GPU 0); none on one GPU.
OTHER=/dev/nvidia1; [ "$NGPU" -ge 2 ] || OTHER=""
skip_row() { ROWS+=("| $1 | skipped (needs 2 GPUs) | - | - | - |"); }

# --- pods (scripts/lib/pod.sh) ---------------------------------------------
CG=$(pod_cgroup_root)
CG_OK=0; [ -n "$CG" ] && mkdir -p "$CG/podlink-gpu-$$" 2>/dev/null && CG_OK=1
declare -A POD_UID POD_CG
for p in A B C D; do
  POD_UID[$p]=$(cat /proc/sys/kernel/random/uuid)
  if [ $CG_OK = 1 ]; then
    POD_CG[$p]=$(pod_make_cgroup "podlink-gpu-$$" "${POD_UID[$p]}" burstable)
  else
    POD_CG[$p]=""
  fi
done
echo "cgroup2 at '$CG' usable for pods: $CG_OK"
rule() { echo "{\"match\": {\"pod_uid\": \"${POD_UID[$1]}\"}, \"namespace\": \"gpu\", \"name\": \"$2\", \"annotations\": {\"podlink.io/peer-group\": \"gpu-job\"}}"; }
echo "{\"identity\": {\"kubelet_cgroup_roots\": [\"/podlink-gpu-$$\"]}, \"pods\": [$(rule A exporter-gpu0), $(rule B importer-gpu1-isolated), $(rule C importer-gpu1-direct), $(rule D importer-gpu0)]}" > "$WORK/config.json"

mkdir -p "$SOCK"
"$BIN/podlinkd" --socket-dir "$SOCK" --config "$WORK/config.json" 2> "$OUT/podlinkd.log" &
DPID=$!
for _ in $(seq 300); do grep -q event=ready "$OUT/podlinkd.log" && break; sleep 0.1; done
grep -q event=ready "$OUT/podlinkd.log" || { cat "$OUT/podlinkd.log"; exit 1; }

# pod NAME MASK ARGS...: podlink-demo in new namespaces; MASK = device nodes
# replaced by /dev/null inside the pod's mount namespace.
pod() {
  local name=$1 mask=$2; shift 2
  pod_run "${POD_CG[$name]}" --hide "$mask" -- env PODLINK_SOCKET_DIR="$SOCK" "$BIN/podlink-demo" "$@"
}
field() { python3 -c "import json,sys; l=sys.stdin.readline(); print(json.loads(l).get('$1','') if l.strip() else '')"; }

SIZE=$((1 << 30))
echo "== pod A (sees only /dev/nvidia0) exports 1 GiB on its GPU"
pod A "$OTHER" info > "$WORK/pod-a-info.json"; cat "$WORK/pod-a-info.json"
coproc EXP { pod A "$OTHER" export --gpu 0 --size $SIZE --name kv-1g --seed 7 --commands 2>&1; }
read -r -t 120 line <&"${EXP[0]}"; echo "$line" | cat
echo "$line" | grep -q '"exported"' || { echo "export failed"; kill $DPID; exit 1; }

run_import() {  # label pod mask args...
  local label=$1 p=$2 mask=$3; shift 3
  local t0=$(date +%s%N)
  pod "$p" "$mask" import --name kv-1g "$@" > "$WORK/pod-$p-import.json" 2>&1
  local rc=$? t1=$(date +%s%N)
  cat "$WORK/pod-$p-import.json"
  local verified=$(grep '"verified"' "$WORK/pod-$p-import.json" | field bytes)
  local bad=$(grep '"verified"' "$WORK/pod-$p-import.json" | field mismatches)
  local err=$(grep '"error"' "$WORK/pod-$p-import.json" | field code)
  local result
  if [ $rc = 0 ] && [ "$bad" = 0 ]; then result="works"; else result="fails (${err:-rc=$rc})"; fi
  [ "$result" = works ] || [ "$p" = B ] || FAILED=1
  ROWS+=("| $label | $result | ${verified:-0} | ${bad:--} | $(( (t1 - t0) / 1000000 )) ms |")
}
if [ "$NGPU" -ge 2 ]; then
  echo "== pod B (sees only /dev/nvidia1) imports: direct mapping must fail with an actionable error"
  run_import "pod on GPU1, peer device node hidden (normal k8s pod)" B /dev/nvidia0 --gpu 0 --verify 7
  if grep -q "not accessible in this container" "$WORK/pod-B-import.json"; then
    echo "B: error names the missing device node and the alternatives"
  else
    echo "B: FAIL: the error does not name the missing device node"; FAILED=1
  fi
  echo "== pod C (own GPU1, peer node visible = direct mode) imports, maps with access from GPU1, verifies, writes back"
  run_import "pod on GPU1, peer device node visible (direct mode)" C "" --gpu 1 --verify 7 --writeback 42
else
  skip_row "pod on GPU1, peer device node hidden (normal k8s pod)"
  skip_row "pod on GPU1, peer device node visible (direct mode)"
fi
echo "== pod D (sees only /dev/nvidia0, same GPU as exporter) imports"
run_import "pod on GPU0 (same GPU as exporter)" D "$OTHER" --gpu 0 --verify 7
if [ "$NGPU" -ge 2 ]; then
  echo "check-writeback 42" >&"${EXP[1]}"
  read -r -t 120 line <&"${EXP[0]}"; echo "$line" | cat
  WB_BAD=$(echo "$line" | field mismatches); WB_BYTES=$(echo "$line" | field bytes)
  [ "$WB_BAD" = 0 ] || FAILED=1
  ROWS+=("| exporter reads back pod C's writes (NVLink, GPU1 -> GPU0 memory) | $([ "$WB_BAD" = 0 ] && echo works || echo fails) | $WB_BYTES | $WB_BAD | - |")
else
  skip_row "exporter reads back pod C's writes (NVLink, GPU1 -> GPU0 memory)"
fi
echo "exit" >&"${EXP[1]}"; wait "$EXP_PID" 2>/dev/null

# --- one-sided KV transfers between isolated pods (relay and direct) --------
kv() {  # label server-pod server-mask client-pod client-mask client-gpu expect-transport [kv-put flags]
  local label=$1 sp=$2 sm=$3 cp=$4 cm=$5 cg=$6 expect=$7; shift 7
  coproc SRV { pod "$sp" "$sm" kv-serve --gpu 0 --size $SIZE --verify 99 2>&1; }
  read -r -t 120 line <&"${SRV[0]}"; echo "$line"
  local desc=$(echo "$line" | field descriptor)
  pod "$cp" "$cm" kv-put --desc "$desc" --gpu "$cg" --seed 99 "$@" > "$WORK/kv.json" 2>&1; cat "$WORK/kv.json"
  read -r -t 120 vline <&"${SRV[0]}"; echo "$vline"
  wait "$SRV_PID" 2>/dev/null
  local put=$(grep '"put"' "$WORK/kv.json")
  local tr=$(echo "$put" | field transport) gbps=$(echo "$put" | field gbps)
  local bad=$(echo "$vline" | field mismatches) bytes=$(echo "$vline" | field bytes)
  local ok=fails; [ "$bad" = 0 ] && [ "$tr" = "$expect" ] && ok=works
  [ $ok = works ] || FAILED=1
  ROWS+=("| $label | $ok ($tr) | $bytes | ${bad:--} | $(printf '%.1f' "${gbps:-0}") GB/s incl. setup |")
}
if [ "$NGPU" -ge 2 ]; then
  echo "== KV: pod B (GPU1 only) writes 1 GiB into pod A's GPU0 region: must go via the relay"
  kv "one-sided write, pod on GPU1 -> pod on GPU0, no peer device node" A /dev/nvidia1 B /dev/nvidia0 0 podlink/relay
  echo "== KV: pod C (both device nodes, direct mode) writes 1 GiB into pod A's GPU0 region"
  kv "one-sided write, direct-mode pod on GPU1 -> pod on GPU0" A /dev/nvidia1 C "" 1 podlink/direct
else
  skip_row "one-sided write, pod on GPU1 -> pod on GPU0, no peer device node"
  skip_row "one-sided write, direct-mode pod on GPU1 -> pod on GPU0"
fi
echo "== KV: pod D (same GPU) writes 1 GiB into pod A's GPU0 region through the relay (--relay)"
kv "one-sided write, pod on GPU0 -> pod on GPU0, relay forced" A "$OTHER" D "$OTHER" 0 podlink/relay --relay
echo "== KV: pod D (same GPU) writes 1 GiB into pod A's GPU0 region, mapping it"
kv "one-sided write, pod on GPU0 -> pod on GPU0, mapped" A "$OTHER" D "$OTHER" 0 podlink/direct

DST_GPU=$((NGPU >= 2 ? 1 : 0))
echo "== podlink-bench (host namespaces, GPU0 -> GPU$DST_GPU)"
PODLINK_SOCKET_DIR=$SOCK "$BIN/podlink-bench" --src-gpu 0 --dst-gpu $DST_GPU --csv "$OUT/bench.csv" --json "$OUT/bench.json" \
  > "$OUT/bench.md" || { echo "podlink-bench failed"; FAILED=1; }
cat "$OUT/bench.md"
echo "relay counters in the daemon log:"; grep -c "event=relay_open" "$OUT/podlinkd.log"

kill $DPID; wait $DPID 2>/dev/null
[ $CG_OK = 1 ] && pod_cleanup_cgroups "podlink-gpu-$$"

echo "== GPU gtests"
"$BIN/gpu_broker_test" 2>&1 | tee "$OUT/gpu_broker_test.log" | grep -E "^\[|gpu |GPU cycle" 
[ "${PIPESTATUS[0]}" = 0 ] || FAILED=1
GT=$(grep -E "^\[  (PASSED|FAILED)  \]" "$OUT/gpu_broker_test.log" | head -2 | tr '\n' ' ')

{
  echo "podlink GPU broker test — $(date -u +%Y-%m-%dT%H:%MZ) — $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPU, driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1), kernel $(uname -r)"
  echo "fabric handles: $(grep -o 'fabric=[a-z]* (attribute [a-z]*)' "$OUT/podlinkd.log" | sort -u | tr '\n' ' ')"
  echo "pods in own cgroups: $CG_OK"
  echo
  echo "| path (1 GiB GPU buffer exported by pod A on GPU0) | result | bytes verified | mismatches | wall |"
  echo "|---|---|---|---|---|"
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo
  echo "gtests: $GT"
  echo
  echo "podlink-bench (GPU0 -> GPU$DST_GPU, 1 GiB written whole in operations of each size, mean of 5 passes):"
  cat "$OUT/bench.md"
  grep -E "^GPU cycle" "$OUT/gpu_broker_test.log"
} | tee "$OUT/summary.md"
rm -rf "$WORK"
echo "result: $([ $FAILED = 0 ] && echo all checks passed || echo FAILED)"
exit $FAILED
