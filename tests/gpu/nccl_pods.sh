#!/usr/bin/env bash
# NCCL between two isolated pods on a two-GPU node (the device tool's
# nvidia-h200-x2), from the repository root, with the bundle made by
# scripts/device-bundle.sh in .devcarry/ (binaries, libraries, iproute2):
#
#   bash tests/gpu/nccl_pods.sh [OUT_DIR]
#
# Pods: own PID, UTS (hostname), IPC, network and mount namespaces, private
# /dev/shm and /tmp, a veth pair between them, each able to open only its own
# /dev/nvidiaN (the other bind-mounted over by /dev/null), each in its own
# kubepods-style cgroup that podlinkd maps to a pod of peer group nccl-job.
# Each pod runs one rank of tests/gpu/nccl_check.py (torch.distributed):
# results of all_reduce, all_gather and send/recv are checked, then
# all_reduce bus bandwidth is measured, in the setups of NCCL_TEST_SETUPS:
#   plugin*  the pods, NCCL_NET_PLUGIN=libnccl-net-podlink.so (variants below;
#            plugin_tcp forces the plugin's other-node TCP transport)
#   socket   the same pods, no plugin (NCCL's NET/Socket over the veth)
#   native   the same two ranks in the host namespaces (NCCL's P2P over NVLink)
# Every timed size is also checked (one all_reduce of known values). Exits 1
# when any rank of any setup fails or any check fails; the table is last.
set -uo pipefail
# shellcheck source=scripts/lib/pod.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/pod.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${1:-/tmp/podlink-nccl-out}
mkdir -p "$OUT"
ROOT=$(pwd)
BIN=$ROOT/.devcarry/bin
LIB=$ROOT/.devcarry/lib
IPR=$ROOT/.devcarry/iproute
PLUGIN=$LIB/libnccl-net-podlink.so
SIZES=${NCCL_TEST_SIZES_MIB:-1,4,16,64,128,256,512,1024}
WORK=/var/tmp/podlink-nccl.$$  # not under /tmp: the pods get a private /tmp
mkdir -p "$WORK/sock"
# The bundle's iproute2 through the dynamic loader: the ip command of pod_veth.
POD_IP=(/lib64/ld-linux-x86-64.so.2 --library-path "$IPR/lib" "$IPR/bin/ip")
"${POD_IP[@]}" -V >/dev/null || { echo "iproute2 bundle missing in $IPR"; exit 1; }

echo "== machine"; nvidia-smi -L; uname -r
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'

# Pods: scripts/lib/pod.sh.
CG=$(pod_cgroup_root)
CG_OK=0; [ -n "$CG" ] && mkdir -p "$CG/podlink-nccl-$$" 2>/dev/null && CG_OK=1
declare -A POD_UID POD_CG
for p in a b; do
  POD_UID[$p]=$(cat /proc/sys/kernel/random/uuid)
  POD_CG[$p]=""
  if [ $CG_OK = 1 ]; then
    POD_CG[$p]=$(pod_make_cgroup "podlink-nccl-$$" "${POD_UID[$p]}" burstable)
  fi
done
rule() { echo "{\"match\": {\"pod_uid\": \"${POD_UID[$1]}\"}, \"namespace\": \"ml\", \"name\": \"$2\", \"annotations\": {\"podlink.io/peer-group\": \"nccl-job\"}}"; }
echo "{\"identity\": {\"kubelet_cgroup_roots\": [\"/podlink-nccl-$$\"]}, \"pods\": [$(rule a rank0-gpu0), $(rule b rank1-gpu1)]}" > "$WORK/config.json"
DPID=""
FAILED_SETUPS=()
# start_daemon ARGS...: (re)starts podlinkd; each plugin setup gets a fresh
# one, so its metrics cover that setup only.
start_daemon() {
  if [ -n "$DPID" ]; then kill "$DPID"; wait "$DPID" 2>/dev/null; fi
  local n; n=$(grep -c event=ready "$OUT/podlinkd.log" 2>/dev/null)
  LD_LIBRARY_PATH=$LIB "$BIN/podlinkd" --socket-dir "$WORK/sock" --config "$WORK/config.json" "$@" \
    2>> "$OUT/podlinkd.log" &
  DPID=$!
  for _ in $(seq 300); do [ "$(grep -c event=ready "$OUT/podlinkd.log")" -gt "${n:-0}" ] && break; sleep 0.1; done
  [ "$(grep -c event=ready "$OUT/podlinkd.log")" -gt "${n:-0}" ] || { cat "$OUT/podlinkd.log"; exit 1; }
}

# run_pods LABEL ENV... : rank 0 in pod a (GPU0), rank 1 in pod b (GPU1); each starts once the veth pair
# between them is up. pod_exec in the background: $! is the pod's unshare, in the pod's network namespace.
run_pods() {
  local label=$1; shift
  local port=$((29500 + RANDOM % 1000))
  rm -f "$WORK"/net-ready
  local pids=()
  for r in 0 1; do
    local p mask; [ $r = 0 ] && p=a mask=/dev/nvidia1 || { p=b; mask=/dev/nvidia0; }
    pod_exec "${POD_CG[$p]}" --private-tmp --hide "$mask" --hostname "pod-$p" --wait-for "$WORK/net-ready" -- \
      env RANK=$r WORLD_SIZE=2 MASTER_ADDR=10.78.0.1 MASTER_PORT=$port LABEL="$label" NCCL_SOCKET_IFNAME=pl \
          NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH,ENV "$@" \
      timeout "${NCCL_TEST_TIMEOUT:-300}" python3 "$ROOT/tests/gpu/nccl_check.py" --sizes-mib "$SIZES" \
      > "$OUT/$label-rank$r.jsonl" 2> "$OUT/$label-rank$r.log" &
    pids+=($!)
  done
  pod_veth "${pids[0]}" "${pids[1]}" pla plb 10.78.0.1/24 10.78.0.2/24
  touch "$WORK/net-ready"
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  echo "$label: exit $rc"
  [ "$rc" = 0 ] || FAILED_SETUPS+=("$label (a rank exited $rc)")
}

run_native() {
  local label=$1; shift
  local port=$((29500 + RANDOM % 1000)) pids=()
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port LABEL="$label" CUDA_VISIBLE_DEVICES=$r \
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH,ENV "$@" \
      timeout "${NCCL_TEST_TIMEOUT:-300}" python3 "$ROOT/tests/gpu/nccl_check.py" --sizes-mib "$SIZES" \
      > "$OUT/$label-rank$r.jsonl" 2> "$OUT/$label-rank$r.log" &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  echo "$label: exit $rc"
  [ "$rc" = 0 ] || FAILED_SETUPS+=("$label (a rank exited $rc)")
}

SETUPS=${NCCL_TEST_SETUPS:-plugin plugin_tuned plugin_tcp socket native}
# What the device plugin's Allocate sets for the plugin (see docs/usage.md).
PLUGIN_ENV=(NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=podlink NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1)
# Plugin setups: "podlinkd arguments|extra NCCL environment". The tuned ones
# use the Simple protocol only (see docs/nccl.md); _w1 runs the relay on one
# thread (podlinkd's default is one per GPU).
TUNED=${PODLINK_NCCL_TUNED:-NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=16 NCCL_BUFFSIZE=16777216}
TUNED2=${PODLINK_NCCL_TUNED2:-NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=32 NCCL_BUFFSIZE=67108864}
declare -A PSETUP=([plugin]="|${PODLINK_NCCL_EXTRA_ENV:-}" [plugin_tuned]="|$TUNED" [plugin_tuned2]="|$TUNED2"
                   [plugin_tuned_w1]="--relay-workers 1|$TUNED" [plugin_tuned2_w1]="--relay-workers 1|$TUNED2"
                   [plugin_tcp]="|PODLINK_NCCL_TRANSPORT=tcp")
# More plugin setups for experiments: NCCL_EXTRA_SETUPS="name|podlinkd args|NCCL env;..." (names start with plugin).
IFS=';' read -ra extra <<< "${NCCL_EXTRA_SETUPS:-}"
for e in "${extra[@]}"; do [ -n "$e" ] && PSETUP[${e%%|*}]=${e#*|}; done
for t in $SETUPS; do
  [ -n "${PSETUP[$t]+x}" ] || continue
  dargs=${PSETUP[$t]%%|*} nenv=${PSETUP[$t]#*|}
  echo "== $t: pods, NCCL_NET_PLUGIN=libnccl-net-podlink.so ${nenv:-(NCCL defaults)}; podlinkd ${dargs:-(defaults)}"
  start_daemon $dargs
  run_pods "$t" "${PLUGIN_ENV[@]}" PODLINK_SOCKET_DIR="$WORK/sock" $nenv
  # podlinkd's relay counters and latency histogram after the run.
  python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:9477/metrics").read().decode())' \
    | grep -E "^podlink_relay" > "$OUT/metrics-$t.txt" || true
done
if [[ " $SETUPS " == *" socket "* ]]; then
  echo "== socket: the same pods without the plugin"
  run_pods socket NCCL_NET_PLUGIN=none
fi
if [[ " $SETUPS " == *" native "* ]]; then
  echo "== native: host namespaces"
  run_native native NCCL_NET_PLUGIN=none
fi

[ -n "$DPID" ] && { kill "$DPID"; wait "$DPID" 2>/dev/null; }
[ $CG_OK = 1 ] && pod_cleanup_cgroups "podlink-nccl-$$"

for l in $SETUPS; do
  echo "-- $l: transport lines (rank 0)"
  grep -E "NET/podlink|Using network|via NET|via P2P|Channel 00/|nChannels|GDR" "$OUT/$l-rank0.log" | sed 's/^.*NCCL INFO //' | sort | uniq -c | sort -rn | head -8
  grep -E '"event": "(checks|start)"' "$OUT/$l-rank0.jsonl" "$OUT/$l-rank1.jsonl" | cut -c1-300
  grep -iE "error|Traceback|WARN" "$OUT/$l-rank0.log" | head -5
done
python3 - "$OUT" $SETUPS <<'EOF' | tee "$OUT/nccl-summary.md"
import json, sys, os, datetime
out, setups = sys.argv[1], sys.argv[2:]
def load(label):
    """Rank 0's bus bandwidth per size, and whether every check passed on
    every rank (the ranks agree on each check; None: no result)."""
    bw, ok = {}, None
    p = os.path.join(out, f"{label}-rank0.jsonl")
    if not os.path.exists(p): return bw, ok
    for line in open(p):
        try: j = json.loads(line)
        except ValueError: continue
        if j.get("event") == "bw":
            bw[j["mib"]] = j["busbw"]
            if not j.get("ok", False): ok = False
        if j.get("event") == "checks": ok = j["ok"] if ok is None else ok and j["ok"]
    return bw, ok
data = {l: load(l) for l in setups}
print(f"NCCL all_reduce bus bandwidth, 2 ranks (GB/s) — {datetime.datetime.utcnow():%Y-%m-%dT%H:%MZ}")
print("checks (all_reduce, all_gather, send/recv results): " +
      ", ".join(f"{l} {'pass' if d[1] else 'FAIL' if d[1] is False else 'not run'}" for l, d in data.items()))
print()
plugins = [l for l in setups if l.startswith("plugin")]
print("| size | " + " | ".join(setups) + " | best plugin/native |")
print("|---|" + "---|" * len(setups) + "---|")
for s in sorted(set().union(*[d[0].keys() for d in data.values()])):
    vals = {l: data[l][0].get(s) for l in setups}
    best = max([vals[l] for l in plugins if vals[l] is not None], default=None)
    n = vals.get("native")
    ratio = f"{best / n:.2f}" if best and n else "-"
    print(f"| {s} MiB | " + " | ".join("-" if vals[l] is None else str(vals[l]) for l in setups) + f" | {ratio} |")
failed = [l for l, d in data.items() if d[1] is not True]
print(f"\nresults checked at every timed size: {'all pass' if not failed else 'FAILED: ' + ', '.join(failed)}")
sys.exit(1 if failed else 0)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || FAILED_SETUPS+=("result checks")
rm -rf "$WORK"
# Few files travel back from the device tool: pack the logs.
(cd "$OUT" && tar czf nccl-logs.tgz ./*.log ./*.jsonl && rm -f ./*-rank*.log ./*-rank*.jsonl)
if [ ${#FAILED_SETUPS[@]} -gt 0 ]; then
  echo "FAILED: ${FAILED_SETUPS[*]}"
  exit 1
fi
echo "all setups ran and every check passed"
