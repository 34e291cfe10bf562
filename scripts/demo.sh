#!/usr/bin/env bash
# The README's run command: installs dependencies, builds, starts podlinkd in
# its standalone default (/run/podlink) and shows two isolated "pods" (own
# PID, UTS, IPC, network and mount namespaces, own cgroups) sharing memory
# through it: GPU memory when a GPU is usable, host memory otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/pod.sh
source scripts/lib/pod.sh
bash scripts/deps.sh
bash scripts/build.sh
BUILD=${PODLINK_BUILD_DIR:-build}
PODLINKD=$BUILD/daemon/podlinkd
DEMO=$(realpath "$BUILD/client-lib/tools/podlink-demo")
SOCK=${PODLINK_SOCKET_DIR:-/run/podlink}
WORK=$(mktemp -d /tmp/podlink-demo.XXXXXX)

# Two pods, each in a kubepods-style cgroup so podlinkd resolves a pod UID (scripts/lib/pod.sh).
pod_uid() { cat /proc/sys/kernel/random/uuid; }
UID_A=$(pod_uid); UID_B=$(pod_uid)
if [ -n "$(pod_cgroup_root)" ]; then
  A_CG=$(pod_make_cgroup "podlink-demo-$$" "$UID_A" besteffort)
  B_CG=$(pod_make_cgroup "podlink-demo-$$" "$UID_B" besteffort)
else
  echo "note: no writable cgroup2 mount; the two pods will share one identity"; A_CG=""; B_CG=""
fi

# podlinkd believes pod cgroups only under the kubelet's root; the demo's
# stand-in for it is its own folder.
cat > "$WORK/config.json" <<JSON
{"identity": {"kubelet_cgroup_roots": ["/", "/podlink-demo-$$"]},
 "pods": [
  {"match": {"pod_uid": "$UID_A"}, "namespace": "demo", "name": "prefill-0",
   "annotations": {"podlink.io/peer-group": "demo-job"}},
  {"match": {"pod_uid": "$UID_B"}, "namespace": "demo", "name": "decode-0",
   "annotations": {"podlink.io/peer-group": "demo-job"}}]}
JSON

cleanup() {
  [ -n "${DPID:-}" ] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null || true
  if [ -n "$A_CG" ]; then pod_cleanup_cgroups "podlink-demo-$$" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== starting podlinkd (socket dir $SOCK)"
"$PODLINKD" --socket-dir "$SOCK" --config "$WORK/config.json" 2> "$WORK/podlinkd.log" &
DPID=$!
for _ in $(seq 100); do grep -q "event=ready" "$WORK/podlinkd.log" 2>/dev/null && break; sleep 0.05; done
grep -q "event=ready" "$WORK/podlinkd.log" || { cat "$WORK/podlinkd.log"; exit 1; }

# pod CGROUP ARGS...: run podlink-demo in fresh namespaces inside CGROUP.
pod() {
  local cg=$1; shift
  pod_run "$cg" -- env PODLINK_SOCKET_DIR="$SOCK" "$DEMO" "$@"
}

SIZE=$((64 << 20)); MEM=(); KIND="host memory (memfd)"
if pod "$A_CG" info | tee "$WORK/info.json" | grep -q '"cuda":true'; then
  MEM=(--gpu 0); KIND="GPU memory (cuMem, POSIX-FD handle)"
fi
echo "== node and pod identity as podlinkd sees it:"; cat "$WORK/info.json"
echo "== pod prefill-0 exports 64 MiB of $KIND named 'kv-demo' and waits for its peer"
pod "$A_CG" export --size $SIZE --name kv-demo --seed 7 "${MEM[@]}" --await-import --expect-writeback 42 &
EPID=$!
sleep 0.5
echo "== a process outside the peer group is refused (deny by default):"
pod "" import --name demo/kv-demo || true
echo "== pod decode-0 imports it, checks the exporter's bytes and writes its own into the last quarter"
pod "$B_CG" import --name kv-demo --verify 7 --writeback 42 "${MEM[@]}"
wait $EPID
echo "== podlinkd log:"; cat "$WORK/podlinkd.log"
echo "== demo finished: both pods saw each other's bytes through podlinkd"
