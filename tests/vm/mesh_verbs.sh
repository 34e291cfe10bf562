#!/usr/bin/env bash
# The mesh over the RDMA verbs backend, for real, on soft-RoCE: two QEMU
# guests (Debian's kernel, this machine's / as their root, tests/vm/lib.sh)
# joined by one Ethernet cable, each with an rxe device on it and its own
# podlinkd (mesh.transport "verbs"). A pod on each writes the other's region
# (RDMA WRITE), reads it back (RDMA READ) and notifies (WRITE WITH
# IMMEDIATE); each owner checks every byte and the notification. Then a pod on
# each runs the NCCL plugin's conformance scenarios with the other (its mesh
# transport: bytes over the two podlinkd's verbs links; tests/vm/nccl_pair.sh).
#
#   tests/vm/mesh_verbs.sh [build dir] [output dir]
#
# PODLINK_VM_BYTES: region size (default 4 MiB: TCG emulation moves soft-RoCE
# at a few MB/s). Every wait is bounded (PODLINK_VM_TIMEOUT, default 600 s in
# all). Exits non-zero when a check fails; the guests' logs stay in the
# output directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bytes=${PODLINK_VM_BYTES:-4194304}
limit=${PODLINK_VM_TIMEOUT:-600}
source "$here/lib.sh"
vm_dirs "tmp" "$@"
source "$here/../common/mesh_certs.sh"

vm_begin "$out"
mesh_certs "$out/certs" node-a node-b
echo "eth0 10.77.1.1/30" > "$out/node-a.net"
echo "eth0 10.77.1.2/30" > "$out/node-b.net"
port=$((20000 + $$ % 20000))
VM_NICS_node_a="listen:$port"
VM_NICS_node_b="connect:$port"
# Each pod holds the other's region idle for 8 s before writing, while the
# owners drop grants of nodes silent for 6 s: only the importers' keepalives
# (every second; verbs leaves no TCP connection to count) keep the grants.
# How fast the guests run does not decide it: an owner that did not run for a
# while (a starved guest) counts that pause as no importer's silence
# (podlink_mesh_own_pauses_total), and an importer's keepalives may be late by
# up to 5 s.
idle="PODLINK_VM_IDLE_MS=8000 PODLINK_VM_GRANT_IDLE=6 PODLINK_VM_KEEPALIVE=1"
t0=$(date +%s)
vm_log "booting node-a and node-b (kernel $VM_KVER, soft-RoCE); $bytes bytes each way"
vm_start node_a 1 "PODLINK_VM_NCCL=1 $idle PODLINK_VM_GDB=${PODLINK_VM_GDB:-0} PODLINK_VM_NAME=node-a sh $here/node.sh $build pair $bytes node-b"
sleep 1
vm_start node_b 2 "PODLINK_VM_NCCL=1 $idle PODLINK_VM_GDB=${PODLINK_VM_GDB:-0} PODLINK_VM_NAME=node-b sh $here/node.sh $build pair $bytes node-a"
rc=0
vm_wait_all "$t0" "$limit" 60 node_a node_b || rc=1
python3 "$here/summary.py" "$out" node-a:node-b node-b:node-a || rc=1
# What an operator sees on each node (kubectl podlink links): the peer over verbs, its QPs up.
python3 - "$out" <<'PY' || rc=1
import json, sys
ok = True
for me, peer in (("node-a", "node-b"), ("node-b", "node-a")):
    try:
        links = json.load(open(f"{sys.argv[1]}/{me}.links.json"))
        p = next(x for x in links["peers"] if x["node"] == peer)
        good = p["transport"] == "verbs" and p["connections_up"] >= 1 and p["bytes_sent"] > 0
    except Exception as e:  # a missing or malformed answer fails the check
        good, p = False, repr(e)
    ok &= good
    print(f"{me}: kubectl podlink links: {peer} " + (f"over {p['transport']}, {p['connections_up']} QPs up" if good else f"WRONG: {p}"))
sys.exit(0 if ok else 1)
PY
for n in node-a node-b; do
  if tail -1 "$out/$n.nccl.log" 2>/dev/null | grep -q "nccl: PASS"; then
    echo "$n: NCCL plugin conformance over the mesh (verbs): $(tail -1 "$out/$n.nccl.log" | sed 's/^.*nccl: //')"
  else
    echo "$n: NCCL plugin conformance over the mesh (verbs) FAILED:"; tail -5 "$out/$n.nccl.log" 2>/dev/null; rc=1
  fi
  grep -q "event=verbs_path_up" "$out/$n.podlinkd.log" 2>/dev/null && echo "$n: verbs path up" ||
    { echo "$n: no verbs path came up"; rc=1; }
  # The pods' regions are host exports: their slices go straight from and
  # into them (the daemon registers them), not through its staging.
  direct=$(awk '/^podlink_mesh_zero_copy_slices_total/ {s += $2} END {print s + 0}' "$out/$n.metrics" 2>/dev/null || echo 0)
  if [ "${direct%.*}" -gt 0 ]; then
    echo "$n: $direct slices sent from or read into the pod's export directly (no staging copy)"
  else
    echo "$n: no slice went directly from or into a pod's export (podlink_mesh_zero_copy_slices_total 0)"; rc=1
  fi
  if grep -q '"event":"idle"' "$out"/"$n".put-*.out 2>/dev/null &&
     ! grep -q "event=mesh_importer_gone" "$out/$n.podlinkd.log" 2>/dev/null; then
    pauses=$(awk '/^podlink_mesh_own_pauses_total/ {print $2}' "$out/$n.metrics" 2>/dev/null)
    echo "$n: held its peer's region idle for 8 s (grants dropped after 6 s of silence): kept by keepalives" \
         "(the owner's own pauses: ${pauses:-?})"
  else
    echo "$n: the idle hold did not happen, or a live importer's grants were dropped:"
    grep "event=mesh_importer_gone" "$out/$n.podlinkd.log" 2>/dev/null | tail -2; rc=1
  fi
done
vm_machine "$out" "tests/vm/mesh_verbs.sh; region $bytes bytes"
[ "$rc" = 0 ] && echo "mesh over verbs (soft-RoCE, two guests): PASS" || echo "mesh over verbs (soft-RoCE, two guests): FAIL"
exit "$rc"
