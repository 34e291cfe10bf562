#!/usr/bin/env bash
# NVIDIA's nccl-tests between two pods on a two-GPU node (the device tool's
# nvidia-h200-x2), from the repository root, with the bundle made by
# scripts/device-bundle.sh in .devcarry/ (binaries, libraries, iproute2 and
# the nccl-tests binaries from ../shared/tools/nccl-tests/bin, which need no
# MPI: PMI_RANK/PMI_SIZE/MASTER_ADDR are enough):
#
#   bash tests/gpu/nccl_tests.sh [OUT_DIR]
#
# Every collective of NCCL_TESTS_COLLS (all_reduce all_gather reduce_scatter
# broadcast reduce alltoall sendrecv) runs with -c 1 (results checked at every
# size), out-of-place and in-place, in each setup of NCCL_TESTS_SETUPS:
#   plugin  isolated pods (own PID, UTS, IPC, network and mount namespaces,
#           private /dev/shm and /tmp, a veth pair, each able to open only its
#           own /dev/nvidiaN), NCCL_NET_PLUGIN=libnccl-net-podlink.so with
#           what the device plugin's Allocate sets and nothing else
#   direct  the same pods, but each can open both GPUs, PODLINK_NCCL_DIRECT=1;
#           rank 1 runs on CUDA device 1 (its own GPU sorts second, the case
#           that failed before 2026-11-24)
#   socket  the isolated pods without the plugin (NCCL's NET/Socket over the
#           veth; sizes to NCCL_TESTS_SOCKET_MAX, fewer iterations: it is slow)
#   native  the two ranks in the host namespaces (NCCL's P2P over NVLink)
#   native-plugin  the same, with the podlink plugin loaded as the device plugin's Allocate sets it (what loading
#           the plugin costs NCCL's own transport; podlinkd runs but the ranks are no pods)
#   host-plugin-bare, host-env  the same, with the plugin loaded but none of its defaults, or with only the
#           environment native-mode pods get (diagnostics for native mode below 1 MiB)
#   host-p2p-net  the same, with of the plugin's point-to-point defaults only those for the net
#           (NCCL_NCHANNELS_PER_NET_PEER, NCCL_P2P_NET_CHUNKSIZE; not NCCL_MIN/MAX_P2P_NCHANNELS, which bind
#           NCCL's own P2P transport too)
#   native-pods  the isolated pods, each able to open both GPUs (direct mode), annotated
#           podlink.io/nccl-native=true, with what the device plugin's Allocate sets and nothing else:
#           podlinkd gives them one /dev/shm and carries NCCL's IPC sockets between their network
#           namespaces, so NCCL's own P2P transport runs between them (the setup fails unless every
#           rank's NCCL log shows P2P/CUMEM and none NET); rank r on CUDA device r
#   mesh    (issue 15) the pods on two emulated nodes: each podlinkd in a network namespace of its own with the
#           mesh on, the two joined by one veth cable (10.80.1.0/30; certificates from a CA made for the run);
#           pod a uses node a's daemon, pod b node b's, and the plugin sends through both daemons' TCP link
#           (its MeshComm). Sizes and iterations as socket (compare with NCCL_TESTS_BASE=socket). Raw TCP on
#           the cable (tests/tcp_blast, 4 connections each way at once) is measured beside it: mesh/raw_tcp.json.
#           NCCL_TESTS_MESH_CONFIG adds keys to both daemons' mesh section (', "connections_per_path": 8').
# More plugin setups for experiments: NCCL_TESTS_EXTRA="name|podlinkd args|env;..."
# (each name must start with "plugin", "direct" or "host-"; host-* setups run the ranks in the host namespaces, as
# native, with that environment added). NCCL_TESTS_TRACE="setup ...": the plugin's
# step trace on in those setups (OUT_DIR/<setup>/<coll>.steps.md, raw steps beside it). Each plugin setup gets a fresh podlinkd,
# whose relay metrics are kept. Raw output: OUT_DIR/<setup>/<coll>.rank<r>.log (NCCL's
# own log beside it, .nccl.log); the KV hand-off's: OUT_DIR/<setup>/kv.rank1.log (JSON lines);
# the table (tests/gpu/nccl_tests_table.py, from that output; ratios to NCCL_TESTS_BASE, default native) is last. Exits 1
# when any rank fails, any result is wrong or any size is missing.
set -uo pipefail
# shellcheck source=scripts/lib/pod.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/pod.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${1:-/tmp/podlink-nccl-tests}
mkdir -p "$OUT"
ROOT=$(pwd)
BIN=$ROOT/.devcarry/bin
LIB=$ROOT/.devcarry/lib
NT=${NCCL_TESTS_BIN:-$ROOT/.devcarry/nccl-tests}
IPR=$ROOT/.devcarry/iproute
PLUGIN=$LIB/libnccl-net-podlink.so
COLLS=${NCCL_TESTS_COLLS-all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv}
SETUPS=${NCCL_TESTS_SETUPS:-plugin native-pods native}
ARGS=${NCCL_TESTS_ARGS:--b 8 -e 1G -f 4 -g 1 -c 1 -n 20 -w 5}
SOCKET_ARGS=${NCCL_TESTS_SOCKET_ARGS:--b 1M -e 256M -f 4 -g 1 -c 1 -n 5 -w 2}
TIMEOUT=${NCCL_TESTS_TIMEOUT:-240}
# NCCL_TESTS_PIN="CPUS0 CPUS1": rank r runs under `taskset -c CPUSr` in every setup (the same cores in each, so
# that where the scheduler happens to put a rank's launching thread does not differ between setups).
read -ra PIN <<< "${NCCL_TESTS_PIN:-}"
pin() { [ -n "${PIN[$1]:-}" ] && echo taskset -c "${PIN[$1]}"; }
# The KV hand-off (tests/gpu/kv_handoff.py: torch batch_isend_irecv of many blocks, every block checked) after
# the collectives, in every setup but socket and mesh; KV_BLOCKS and KV_ITERS pass through.
KV=${NCCL_TESTS_KV:-1}
# The same hand-off one-sided through `import podlink` (tests/gpu/kv_podlink.py) and in C++ (podlink-bench
# --kv-open), alternating rounds (tests/gpu/kv_compare.sh, KV_ROUNDS), in the plugin setups' pods,
# when NCCL_TESTS_KV_PODLINK=1: the module is built for this machine's python first (tests/gpu/build_python.sh).
KV_PODLINK=${NCCL_TESTS_KV_PODLINK:-0}
# RemoteRegion.tensor between the pods of the direct setups (tests/gpu/tensor_pods.py), when NCCL_TESTS_TENSOR=1.
TENSOR=${NCCL_TESTS_TENSOR:-0}
# NCCL's log subsystems in every setup. Not TUNING: NCCL 2.28 writes a TUNING line for every operation, which
# adds its cost to every timed small message (NCCL_TESTS_DEBUG_SUBSYS=INIT,NET,TUNING to see the choices).
SUBSYS=${NCCL_TESTS_DEBUG_SUBSYS:-INIT,NET,ENV,P2P}
WORK=/var/tmp/podlink-nccl-tests.$$  # not under /tmp: the pods get a private /tmp
mkdir -p "$WORK/sock"
POD_IP=(/lib64/ld-linux-x86-64.so.2 --library-path "$IPR/lib" "$IPR/bin/ip")
"${POD_IP[@]}" -V >/dev/null || { echo "iproute2 bundle missing in $IPR"; exit 1; }
[ -z "${COLLS// /}" ] || [ -x "$NT/all_reduce_perf" ] ||
  { echo "nccl-tests binaries missing in $NT (scripts/device-bundle.sh copies them)"; exit 1; }
# NCCL from the machine's PyTorch (the nccl-tests binaries link it dynamically).
NCCL_DIR=${NCCL_LIB_DIR:-$(dirname "$(find /opt /usr/local/lib /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)")}
[ -f "$NCCL_DIR/libnccl.so.2" ] || { echo "libnccl.so.2 not found"; exit 1; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "bundle: $(cat "$ROOT/.devcarry/COMMIT" 2>/dev/null)"
  echo "nccl: $(readlink -f "$NCCL_DIR/libnccl.so.2")"
  echo "args: $ARGS"
  echo "socket args: $SOCKET_ARGS"
  echo "pinned: ${NCCL_TESTS_PIN:-no}"
  nvidia-smi -L
  nvidia-smi topo -m | head -3
  uname -r
} | tee "$OUT/machine.txt"

# One GPU (a single-GPU machine): both pods share GPU 0, nothing to hide; the
# relay then copies within one GPU (per-request costs, not NVLink), and native
# is skipped (NCCL refuses two ranks of one host on one GPU).
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
if [ "$NGPU" -lt 2 ]; then
  echo "one GPU: both pods on GPU 0; native skipped" | tee -a "$OUT/machine.txt"
  SETUPS=$(echo "$SETUPS" | tr ' ' '\n' | grep -vx native | tr '\n' ' ')
fi

CG=$(pod_cgroup_root)
CG_OK=0; [ -n "$CG" ] && mkdir -p "$CG/podlink-nt-$$" 2>/dev/null && CG_OK=1
declare -A POD_UID POD_CG
for p in a b; do
  POD_UID[$p]=$(cat /proc/sys/kernel/random/uuid)
  POD_CG[$p]=""
  [ $CG_OK = 1 ] && POD_CG[$p]=$(pod_make_cgroup "podlink-nt-$$" "${POD_UID[$p]}" burstable)
done
# rule POD NAME [EXTRA_ANNOTATION]: a standalone pod rule of podlinkd's config.
rule() { echo "{\"match\": {\"pod_uid\": \"${POD_UID[$1]}\"}, \"namespace\": \"ml\", \"name\": \"$2\", \"annotations\": {\"podlink.io/peer-group\": \"nccl-job\"${3:+, $3}}}"; }
echo "{\"identity\": {\"kubelet_cgroup_roots\": [\"/podlink-nt-$$\"]}, \"pods\": [$(rule a rank0), $(rule b rank1)]}" > "$WORK/config.json"
NATIVE_ANN='"podlink.io/nccl-native": "true"'
echo "{\"identity\": {\"kubelet_cgroup_roots\": [\"/podlink-nt-$$\"]}, \"pods\": [$(rule a rank0 "$NATIVE_ANN"), $(rule b rank1 "$NATIVE_ANN")],
 \"nccl_native\": {\"shm_dir\": \"$WORK/nccl-shm\"}}" > "$WORK/config-native.json"

DPID=""
FAILED=()
if [ "$KV_PODLINK" = 1 ] || [ "$TENSOR" = 1 ]; then
  bash "$ROOT/tests/gpu/build_python.sh" "$WORK/site" > "$OUT/build_python.log" 2>&1 ||
    { cat "$OUT/build_python.log"; echo "import podlink could not be built for this machine's python"; exit 1; }
fi
POD_ENV=()  # per rank, after the setup's environment (the mesh setup: each pod its own node's daemon)
start_daemon() {
  stop_daemon
  local n; n=$(grep -c event=ready "$OUT/podlinkd.log" 2>/dev/null)
  LD_LIBRARY_PATH=$LIB "$BIN/podlinkd" --socket-dir "$WORK/sock" --config "$WORK/config.json" "$@" \
    2>> "$OUT/podlinkd.log" &
  DPID=$!
  for _ in $(seq 300); do [ "$(grep -c event=ready "$OUT/podlinkd.log")" -gt "${n:-0}" ] && break; sleep 0.1; done
  [ "$(grep -c event=ready "$OUT/podlinkd.log")" -gt "${n:-0}" ] || { tail -20 "$OUT/podlinkd.log"; exit 1; }
}
stop_daemon() {
  if [ -n "$DPID" ]; then kill "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; DPID=""; fi
}
metrics() {  # podlinkd's relay counters and latency histogram after a setup
  python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:9477/metrics").read().decode())' \
    2>/dev/null | grep -E "^podlink_relay" > "$OUT/$1/metrics.txt" || true
}

# The mesh setup's two emulated nodes, each with its own podlinkd (mesh on), and one cable between them.
MESH_NS=(plnt$$a plnt$$b)
MESH_DPIDS=()
mesh_up() {
  local n i=0
  # shellcheck source=tests/common/mesh_certs.sh
  source "$ROOT/tests/common/mesh_certs.sh"
  mesh_certs "$WORK/certs" node-a node-b || return 1
  for n in a b; do
    "${POD_IP[@]}" netns add "${MESH_NS[$i]}" && "${POD_IP[@]}" -n "${MESH_NS[$i]}" link set lo up || return 1
    i=$((i + 1))
  done
  "${POD_IP[@]}" link add plc$$a netns "${MESH_NS[0]}" type veth peer name plc$$b netns "${MESH_NS[1]}" || return 1
  "${POD_IP[@]}" -n "${MESH_NS[0]}" addr add 10.80.1.1/30 dev plc$$a
  "${POD_IP[@]}" -n "${MESH_NS[1]}" addr add 10.80.1.2/30 dev plc$$b
  "${POD_IP[@]}" -n "${MESH_NS[0]}" link set plc$$a up
  "${POD_IP[@]}" -n "${MESH_NS[1]}" link set plc$$b up
  i=0
  for n in a b; do
    mkdir -p "$WORK/sock-$n"
    cat > "$WORK/config-$n.json" <<EOF
{"node": {"name": "node-$n", "id": "node-$n"},
 "identity": {"kubelet_cgroup_roots": ["/podlink-nt-$$"]}, "pods": [$(rule a rank0), $(rule b rank1)],
 "mesh": {"enabled": true, "cert_dir": "$WORK/certs/node-$n", "interfaces": ["plc$$$n"]${NCCL_TESTS_MESH_CONFIG:-}}}
EOF
    "${POD_IP[@]}" netns exec "${MESH_NS[$i]}" env LD_LIBRARY_PATH="$LIB" "$BIN/podlinkd" --socket-dir "$WORK/sock-$n" \
      --config "$WORK/config-$n.json" 2>> "$OUT/mesh/podlinkd-node-$n.log" &
    MESH_DPIDS+=($!)
    i=$((i + 1))
  done
  for n in a b; do
    for _ in $(seq 300); do grep -q event=ready "$OUT/mesh/podlinkd-node-$n.log" 2>/dev/null && break; sleep 0.1; done
    grep -q event=ready "$OUT/mesh/podlinkd-node-$n.log" || { tail -20 "$OUT/mesh/podlinkd-node-$n.log"; return 1; }
  done
}
mesh_raw_tcp() {  # raw TCP both ways at once on the cable, 4 connections each: what the cable carries without podlink
  local bytes=$((1 << 30)) t0 t1
  "${POD_IP[@]}" netns exec "${MESH_NS[1]}" "$BIN/tcp_blast" serve 9100 4 > "$WORK/raw.b" &
  local sb=$!
  "${POD_IP[@]}" netns exec "${MESH_NS[0]}" "$BIN/tcp_blast" serve 9101 4 > "$WORK/raw.a" &
  local sa=$!
  sleep 0.5
  t0=$(date +%s.%N)
  "${POD_IP[@]}" netns exec "${MESH_NS[0]}" "$BIN/tcp_blast" send 10.80.1.2 9100 $bytes 4 > /dev/null &
  local x=$!
  "${POD_IP[@]}" netns exec "${MESH_NS[1]}" "$BIN/tcp_blast" send 10.80.1.1 9101 $bytes 4 > /dev/null
  wait $x
  t1=$(date +%s.%N)
  wait $sa $sb
  python3 -c "import json,sys; b=$bytes; s=$t1-$t0; print(json.dumps({'bytes_each_way': b, 'seconds': s, 'GB_per_s_each_way': b/s/1e9}))" \
    | tee "$OUT/mesh/raw_tcp.json"
}
mesh_down() {
  local p ns
  for p in "${MESH_DPIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  MESH_DPIDS=()
  for ns in "${MESH_NS[@]}"; do "${POD_IP[@]}" netns del "$ns" 2>/dev/null; done
}

# The plugin's step trace for SETUP/COLL when NCCL_TESTS_TRACE names SETUP: trace_env prints the variable for
# the pods (nothing otherwise), trace_keep joins both pods' steps into OUT/SETUP/COLL.steps.md.
trace_env() {
  if [[ " ${NCCL_TESTS_TRACE:-} " == *" $1 "* ]]; then
    mkdir -p "$WORK/trace/$1/$2" && echo "PODLINK_NCCL_STEP_TRACE=$WORK/trace/$1/$2"
  fi
}
trace_keep() {
  [ -d "$WORK/trace/$1/$2" ] || return 0
  mkdir -p "$OUT/$1/steps-$2" && cp "$WORK/trace/$1/$2"/*.tsv "$OUT/$1/steps-$2/" 2>/dev/null
  python3 "$ROOT/tests/gpu/nccl_steps.py" "$OUT/$1/steps-$2" > "$OUT/$1/$2.steps.md" 2>&1
  gzip -f "$OUT/$1/steps-$2"/*.tsv 2>/dev/null
}

# finish SETUP COLL PID...: waits for the ranks, keeps NCCL's logs beside theirs, records the outcome.
finish() {
  local setup=$1 coll=$2 rc=0 x r; shift 2
  for x in "$@"; do wait "$x" || rc=$?; done
  for r in 0 1; do mv "$WORK/nccl.$setup.$coll.rank$r.log" "$OUT/$setup/$coll.rank$r.nccl.log" 2>/dev/null; done
  echo "$rc" > "$OUT/$setup/$coll.rc"
  [ "$rc" = 0 ] || FAILED+=("$setup/$coll (a rank exited $rc)")
  echo "  $coll: exit $rc $(grep -m1 'Avg bus bandwidth' "$OUT/$setup/$coll.rank0.log" | sed 's/^# *//')"
}

# pods SETUP COLL BOTH_GPUS ARGS ENV...: rank 0 in pod a, rank 1 in pod b; BOTH_GPUS=1 lets each open both GPUs
# (rank r then runs on CUDA device r), otherwise each sees only its own (device 0 in the pod).
pods() {
  local setup=$1 coll=$2 both=$3 args=$4; shift 4
  local port=$((29600 + RANDOM % 1000)) pids=()
  local cmd=("$NT/${coll}_perf")
  [ "$coll" = kv ] && cmd=(python3 "$ROOT/tests/gpu/kv_handoff.py")
  [ "$coll" = kvpl ] && cmd=(bash "$ROOT/tests/gpu/kv_compare.sh")
  [ "$coll" = tensor ] && cmd=(python3 "$ROOT/tests/gpu/tensor_pods.py")
  rm -f "$WORK"/net-ready
  for r in 0 1; do
    local p=a mask=/dev/nvidia1 dev=0
    [ "$r" = 1 ] && p=b mask=/dev/nvidia0
    [ "$both" = 1 ] && mask="" dev=$r
    [ "$NGPU" -lt 2 ] && mask="" dev=0
    # shellcheck disable=SC2086  # args is a word list
    pod_exec "${POD_CG[$p]}" --private-tmp --hide "$mask" --hostname "pod-$p" --wait-for "$WORK/net-ready" -- \
      env PMI_RANK=$r PMI_SIZE=2 MASTER_ADDR=10.79.0.1 MASTER_PORT=$port NCCL_TESTS_DEVICE=$dev KV_DEVICE=$dev \
          PYTHONPATH="$WORK/site" \
          LD_LIBRARY_PATH="$NCCL_DIR" NCCL_SOCKET_IFNAME=pl NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS="$SUBSYS" \
          NCCL_DEBUG_FILE="$WORK/nccl.$setup.$coll.rank$r.log" "$@" ${POD_ENV[$r]:-} \
          MPI_SHIM_TIMEOUT=60 $(pin $r) timeout -k 5 "$TIMEOUT" "${cmd[@]}" $args \
      > "$OUT/$setup/$coll.rank$r.log" 2>&1 &
    pids+=($!)
  done
  pod_veth "${pids[0]}" "${pids[1]}" pla plb 10.79.0.1/24 10.79.0.2/24
  touch "$WORK/net-ready"
  finish "$setup" "$coll" "${pids[@]}"
}

native() {  # native SETUP COLL ARGS [ENV...]
  local setup=$1 coll=$2 args=$3; shift 3
  local port=$((29600 + RANDOM % 1000)) pids=()
  local cmd=("$NT/${coll}_perf")
  [ "$coll" = kv ] && cmd=(python3 "$ROOT/tests/gpu/kv_handoff.py")
  for r in 0 1; do
    # shellcheck disable=SC2086
    env PMI_RANK=$r PMI_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NCCL_TESTS_DEVICE=$r KV_DEVICE=$r \
        LD_LIBRARY_PATH="$NCCL_DIR" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS="$SUBSYS" NCCL_NET_PLUGIN=none \
        NCCL_DEBUG_FILE="$WORK/nccl.$setup.$coll.rank$r.log" "$@" \
        MPI_SHIM_TIMEOUT=60 $(pin $r) timeout -k 5 "$TIMEOUT" "${cmd[@]}" $args \
      > "$OUT/$setup/$coll.rank$r.log" 2>&1 &
    pids+=($!)
  done
  finish "$setup" "$coll" "${pids[@]}"
}

# What the device plugin's Allocate sets for the plugin (daemon/deviceplugin/device_plugin.cc, checked by
# deviceplugin_test); the plugin picks the rest itself.
PLUGIN_ENV=(NCCL_NET_PLUGIN="$PLUGIN" NCCL_NET=podlink NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1
            NCCL_NCHANNELS_PER_NET_PEER=16 PODLINK_SOCKET_DIR="$WORK/sock")
declare -A PSETUP=([plugin]="||0" [direct]="||1" [native-pods]="--config $WORK/config-native.json||1"
  # Diagnostics for native mode below 1 MiB: host processes with the plugin loaded but none of its defaults
  # (tuner off, NCCL's protocol and channels kept), and with only the environment native-mode pods get.
  [native-plugin]="--config $WORK/config-native.json|${PLUGIN_ENV[*]}|0"
  [host-plugin-bare]="--config $WORK/config-native.json|${PLUGIN_ENV[*]} NCCL_TUNER_PLUGIN=none PODLINK_NCCL_KEEP_PROTO=1 PODLINK_NCCL_KEEP_CHANNELS=1 PODLINK_NCCL_KEEP_P2P=1|0"
  [host-p2p-net]="--config $WORK/config-native.json|${PLUGIN_ENV[*]} PODLINK_NCCL_KEEP_P2P=1 NCCL_P2P_NET_CHUNKSIZE=2097152|0"
  [host-env]="|NCCL_NCHANNELS_PER_NET_PEER=16 NCCL_NET_GDR_LEVEL=SYS NCCL_NET_GDR_READ=1 NCCL_TUNER_PLUGIN=none NCCL_HOSTID=podlink-host-env|0")
IFS=';' read -ra extra <<< "${NCCL_TESTS_EXTRA:-}"
# (names starting with "direct": pods that can open both GPUs, as in the direct setup)
for e in "${extra[@]}"; do
  [ -n "$e" ] || continue
  b=0; [[ ${e%%|*} == direct* ]] && b=1
  PSETUP[${e%%|*}]="${e#*|}|$b"
done

for s in $SETUPS; do
  mkdir -p "$OUT/$s"
  echo "$s" >> "$OUT/setups.txt"
  echo "$COLLS" > "$OUT/$s/colls.txt"
  case $s in
    mesh)
      echo "== mesh: pods on two emulated nodes, bytes through both daemons' mesh link"
      echo "$SOCKET_ARGS" > "$OUT/mesh/args.txt"
      echo "two network namespaces, one veth cable (unshaped), a podlinkd with the mesh on in each" > "$OUT/mesh/setup.txt"
      if mesh_up; then
        mesh_raw_tcp
        POD_ENV=("PODLINK_SOCKET_DIR=$WORK/sock-a" "PODLINK_SOCKET_DIR=$WORK/sock-b")
        for c in $COLLS; do
          # shellcheck disable=SC2046  # the trace variable, or nothing
          pods mesh "$c" 0 "$SOCKET_ARGS" "${PLUGIN_ENV[@]}" $(trace_env mesh "$c")
          trace_keep mesh "$c"
        done
        POD_ENV=()
        for n in a b; do
          "${POD_IP[@]}" netns exec "${MESH_NS[$([ $n = a ] && echo 0 || echo 1)]}" python3 -c \
            'import urllib.request as u; print(u.urlopen("http://127.0.0.1:9477/metrics").read().decode())' \
            2>/dev/null | grep -E "^podlink_(mesh|relay)" > "$OUT/mesh/metrics-node-$n.txt" || true
        done
      else
        FAILED+=("mesh (emulated nodes did not come up)")
      fi
      mesh_down
      ;;
    socket)
      echo "== socket: isolated pods, NCCL's NET/Socket over the veth"
      echo "$SOCKET_ARGS" > "$OUT/socket/args.txt"
      for c in $COLLS; do pods socket "$c" 0 "$SOCKET_ARGS" NCCL_NET_PLUGIN=none; done
      ;;
    native)
      echo "== native: host namespaces, NCCL's P2P"
      echo "$ARGS" > "$OUT/native/args.txt"
      for c in $COLLS; do native native "$c" "$ARGS"; done
      [ "$KV" = 1 ] && native native kv ""
      ;;
    native-plugin|host-*)
      [ -n "${PSETUP[$s]+x}" ] || { echo "unknown setup $s"; FAILED+=("$s (unknown)"); continue; }
      IFS='|' read -r dargs nenv both <<< "${PSETUP[$s]}"
      echo "== $s: host namespaces, NCCL's P2P; podlinkd ${dargs:-(defaults)}; NCCL env: ${nenv:-none}"
      echo "$ARGS" > "$OUT/$s/args.txt"
      echo "host processes; podlinkd: ${dargs:-defaults}; env: ${nenv:-none}" > "$OUT/$s/setup.txt"
      # shellcheck disable=SC2086
      start_daemon $dargs
      # shellcheck disable=SC2086
      for c in $COLLS; do native "$s" "$c" "$ARGS" $nenv; done
      stop_daemon
      ;;
    *)
      [ -n "${PSETUP[$s]+x}" ] || { echo "unknown setup $s"; FAILED+=("$s (unknown)"); continue; }
      IFS='|' read -r dargs nenv both <<< "${PSETUP[$s]}"
      [ "$s" = direct ] && nenv="PODLINK_NCCL_DIRECT=1"
      echo "== $s: podlinkd ${dargs:-(defaults)}; NCCL env: ${nenv:-(what the device plugin sets)}"
      echo "podlinkd: ${dargs:-defaults}; env: ${nenv:-none}" > "$OUT/$s/setup.txt"
      echo "$ARGS" > "$OUT/$s/args.txt"
      # shellcheck disable=SC2086
      start_daemon $dargs
      # shellcheck disable=SC2086
      for c in $COLLS; do
        # shellcheck disable=SC2046
        pods "$s" "$c" "$both" "$ARGS" "${PLUGIN_ENV[@]}" $nenv $(trace_env "$s" "$c")
        trace_keep "$s" "$c"
      done
      # shellcheck disable=SC2086
      [ "$KV" = 1 ] && pods "$s" kv "$both" "" "${PLUGIN_ENV[@]}" $nenv
      # shellcheck disable=SC2086
      [ "$KV_PODLINK" = 1 ] && [[ $s == plugin* ]] && pods "$s" kvpl "$both" "" "${PLUGIN_ENV[@]}" $nenv
      # shellcheck disable=SC2086
      [ "$TENSOR" = 1 ] && [ "$both" = 1 ] && pods "$s" tensor "$both" "" "${PLUGIN_ENV[@]}" $nenv
      metrics "$s"
      python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:9477/metrics").read().decode())' \
        2>/dev/null | grep -E "^podlink_nccl_ipc" > "$OUT/$s/nccl_ipc_metrics.txt" || true
      stop_daemon
      # Which NCCL parameters NCCL itself read from the environment (its own INFO lines), per collective.
      for c in $COLLS; do
        grep -ho 'NCCL_[A-Z0-9_]* set by environment to [^ .]*' "$OUT/$s/$c.rank0.nccl.log" 2>/dev/null | sort -u \
          > "$OUT/$s/$c.nccl_env.txt"
      done
      if [ "$s" = plugin ] && [[ " $COLLS " == *" sendrecv "* ]]; then
        # The relay's defaults must reach NCCL (issue 32): NCCL reports each with the plugin's value.
        for kv in NCCL_NCHANNELS_PER_NET_PEER=16 NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_P2P_LL_THRESHOLD=0 \
                  NCCL_MIN_NCHANNELS=16 NCCL_BUFFSIZE=16777216; do
          grep -q "^${kv%%=*} set by environment to ${kv#*=}\$" "$OUT/$s/sendrecv.nccl_env.txt" 2>/dev/null ||
            FAILED+=("$s: NCCL did not report ${kv} (sendrecv.nccl_env.txt)")
        done
        # And none that would bind NCCL's own P2P transport inside a pod as well.
        for k in NCCL_PROTO NCCL_MIN_P2P_NCHANNELS NCCL_MAX_P2P_NCHANNELS; do
          ! grep -q "^$k set by environment" "$OUT/$s/sendrecv.nccl_env.txt" 2>/dev/null ||
            FAILED+=("$s: NCCL read $k from the environment (sendrecv.nccl_env.txt)")
        done
      fi
      if [ "$s" = native-pods ]; then
        # What NCCL itself chose, from its own log: P2P on every channel, never the network.
        for c in $COLLS $([ "$KV" = 1 ] && echo kv); do
          for r in 0 1; do
            f="$OUT/$s/$c.rank$r.nccl.log"
            p2p=$(grep -c 'via P2P/CUMEM' "$f" 2>/dev/null); net=$(grep -c 'via NET/' "$f" 2>/dev/null)
            echo "$c rank$r: ${p2p:-0} channel connections via P2P/CUMEM, ${net:-0} via NET" >> "$OUT/$s/transport.txt"
            { [ "${p2p:-0}" -gt 0 ] && [ "${net:-0}" = 0 ]; } || FAILED+=("$s/$c rank$r: NCCL did not use P2P/CUMEM only")
          done
        done
        cat "$OUT/$s/transport.txt"
      fi
      ;;
  esac
done
stop_daemon
[ $CG_OK = 1 ] && pod_cleanup_cgroups "podlink-nt-$$"
rm -rf "$WORK"

python3 "$ROOT/tests/gpu/nccl_tests_table.py" "$OUT" --base "${NCCL_TESTS_BASE:-native}" | tee "$OUT/table.md"
[ "${PIPESTATUS[0]}" = 0 ] || FAILED+=("result checks (table.md)")
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAILED: ${FAILED[*]}"
  exit 1
fi
echo "every rank of every setup passed and every result was checked"
