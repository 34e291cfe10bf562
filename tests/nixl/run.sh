#!/usr/bin/env bash
# libplugin_PODLINK.so under the real NIXL 1.4.0 (built by tests/nixl/build_nixl.sh): NIXL's own transfer gtest
# with its PODLINK instantiation, then NIXL's Python API between two pods in a vLLM NixlConnector-shaped flow
# (tests/nixl/kv_flow.py). Host memory; needs root (pods: namespaces and cgroups, scripts/lib/pod.sh).
#
#   tests/nixl/run.sh BUILD NIXL_PREFIX [OUT]
#
# BUILD: podlink's build tree (podlinkd, libplugin_PODLINK.so, the Python package); NIXL_PREFIX: build_nixl.sh's
# PREFIX; OUT: where the raw output goes (default: a temporary folder). Exits non-zero when a check fails.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUILD NIXL_PREFIX [OUT]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$(cd "$1" && pwd)
nixl=$(cd "$2" && pwd)
out=${3:-$(mktemp -d /tmp/podlink-nixl-out-XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# shellcheck source=/dev/null
source "$nixl/env.sh"
# shellcheck source=../../scripts/lib/pod.sh
source "$repo/scripts/lib/pod.sh"

work=$(mktemp -d /tmp/podlink-nixl-XXXXXX)
chmod 755 "$work"
root="podlink-nixl-$$"
cleanup() {
  [ -n "${dpid:-}" ] && kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null || true
  pod_cleanup_cgroups "$root" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# NIXL's plugins folder for this run: NIXL_PLUGIN_DIR replaces NIXL's own, so its POSIX plugin comes along, and
# libpodlink.so goes beside the PODLINK plugin (which finds it through $ORIGIN).
plugins=$work/plugins
mkdir -p "$plugins"
ln -s "$build/client-lib/libplugin_PODLINK.so" "$plugins/"
cp -a "$build"/client-lib/libpodlink.so* "$plugins/"
for p in "$NIXL_LIBDIR"/plugins/libplugin_*.so; do [ -e "$p" ] && ln -sf "$p" "$plugins/"; done
export NIXL_PLUGIN_DIR=$plugins
echo "== NIXL plugins: $(cd "$plugins" && ls libplugin_*.so | tr '\n' ' ')" | tee "$out/summary.txt"

uid_p=$(cat /proc/sys/kernel/random/uuid)
uid_d=$(cat /proc/sys/kernel/random/uuid)
cg_p=$(pod_make_cgroup "$root" "$uid_p" besteffort)
cg_d=$(pod_make_cgroup "$root" "$uid_d" besteffort)
cat > "$work/config.json" <<JSON
{"identity": {"kubelet_cgroup_roots": ["/", "/$root"]},
 "pods": [
  {"match": {"pod_uid": "$uid_p"}, "namespace": "llm", "name": "prefill-0",
   "annotations": {"podlink.io/peer-group": "llama"}},
  {"match": {"pod_uid": "$uid_d"}, "namespace": "llm", "name": "decode-0",
   "annotations": {"podlink.io/peer-group": "llama"}}]}
JSON
sock=$work/sock
mkdir -p "$sock"
"$build/daemon/podlinkd" --socket-dir "$sock" --config "$work/config.json" --no-gpu 2> "$out/podlinkd.log" &
dpid=$!
for _ in $(seq 200); do grep -q "event=ready" "$out/podlinkd.log" 2>/dev/null && break; sleep 0.05; done
grep -q "event=ready" "$out/podlinkd.log" || { cat "$out/podlinkd.log"; exit 1; }
export PODLINK_SOCKET_DIR=$sock

rc=0
# 1. NIXL's own transfer test, PODLINK instantiation only (its two agents in this one process: one identity).
gtest=$NIXL_BUILD/test/gtest/gtest
echo "== NIXL gtest, TestTransfer for PODLINK" | tee -a "$out/summary.txt"
if timeout 600 "$gtest" --gtest_filter='*podlink*' > "$out/nixl_gtest.log" 2>&1; then
  grep -E "^\[  (PASSED|FAILED) |tests? ran" "$out/nixl_gtest.log" | tee -a "$out/summary.txt"
else
  rc=1
  echo "NIXL gtest FAILED (exit $?)" | tee -a "$out/summary.txt"
  grep -E "^\[  FAILED|Failure|error" "$out/nixl_gtest.log" | head -20 | tee -a "$out/summary.txt"
fi

# 2. The vLLM-shaped flow between two pods (NIXL's Python API), on numpy arrays as an application has them
#    (podlinkd's relay copies them) and on podlink host memory (mapped by the peer).
export PYTHONPATH="$build/python:$PYTHONPATH"
flow() {  # role cgroup memory
  pod_run "$2" -- env PODLINK_SOCKET_DIR="$sock" PYTHONPATH="$PYTHONPATH" LD_LIBRARY_PATH="$LD_LIBRARY_PATH" \
    NIXL_PLUGIN_DIR="$plugins" timeout 300 /usr/bin/python3 "$here/kv_flow.py" "$1" "$work/$3" --memory "$3" \
    > "$out/kv_flow_$1_$3.json" 2> "$out/kv_flow_$1_$3.log"
}
for memory in numpy podlink; do
  echo "== vLLM-shaped KV flow between two pods (nixl_agent, backends=[\"PODLINK\"], $memory memory)" |
    tee -a "$out/summary.txt"
  mkdir -p "$work/$memory" && chmod 777 "$work/$memory"
  flow prefill "$cg_p" "$memory" & ppid=$!
  flow decode "$cg_d" "$memory" & qpid=$!
  prc=0; drc=0
  wait "$ppid" || prc=$?
  wait "$qpid" || drc=$?
  cat "$out/kv_flow_prefill_$memory.json" "$out/kv_flow_decode_$memory.json" | tee -a "$out/summary.txt"
  if [ $prc -ne 0 ] || [ $drc -ne 0 ] || ! grep -q '"ok": true' "$out/kv_flow_decode_$memory.json" ||
     ! grep -q '"ok": true' "$out/kv_flow_prefill_$memory.json"; then
    rc=1
    echo "kv flow on $memory memory FAILED (prefill exit $prc, decode exit $drc)" | tee -a "$out/summary.txt"
    tail -n 20 "$out/kv_flow_prefill_$memory.log" "$out/kv_flow_decode_$memory.log" | tee -a "$out/summary.txt"
  fi
done
# podlinkd's log (an export per NIXL registration: NIXL's test makes 10,000), compressed once podlinkd stopped.
kill "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null || true
dpid=
gzip -9f "$out/podlinkd.log"
echo "== raw output in $out"
exit $rc
