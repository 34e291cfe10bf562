#!/usr/bin/env bash
# Queue pairs forced into error for real, on soft-RoCE: two QEMU guests as in
# tests/vm/mesh_verbs.sh. node-a's pod writes a 64 MiB region of node-b's pod
# over the verbs links; 1 s into the write node-b's pod is killed, so its
# export goes and node-b's podlinkd drops its RDMA registration. The rxe
# device then refuses node-a's next RDMA WRITEs (remote access error): each
# queue pair that gets one goes into the error state. Checked: the write
# fails (no hang, within the bound) with the reason, node-a logs the failed
# queue pairs with that status, node-b's export can no longer be written by
# anyone, and the link recovers: node-a writes, reads back and notifies a
# second region of node-b's, every byte checked by its owner.
#
#   tests/vm/mesh_verbs_qp_error.sh [build dir] [output dir]
#
# In the test command (about 40 s here). Every wait is bounded (PODLINK_VM_TIMEOUT,
# default 300 s in all).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bytes=${PODLINK_VM_BYTES:-67108864}
limit=${PODLINK_VM_TIMEOUT:-300}
source "$here/lib.sh"
vm_dirs "tmp" "$@"
source "$here/../common/mesh_certs.sh"

vm_begin "$out"
rm -f "$out"/*.writing
mesh_certs "$out/certs" node-a node-b
echo "eth0 10.77.6.1/30" > "$out/node-a.net"
echo "eth0 10.77.6.2/30" > "$out/node-b.net"
port=$((20000 + ($$ + 11) % 20000))
VM_NICS_node_a="listen:$port"
VM_NICS_node_b="connect:$port"
t0=$(date +%s)
vm_log "booting node-a and node-b (kernel $VM_KVER, soft-RoCE); node-b withdraws a $bytes-byte region mid-write"
vm_start node_a 1 "PODLINK_VM_NAME=node-a sh $here/node.sh $build write-withdrawn $bytes node-b"
vm_start node_b 2 "PODLINK_VM_NAME=node-b sh $here/node.sh $build withdraw $bytes node-a"
rc=0
vm_wait_all "$t0" "$limit" 60 node_a node_b || rc=1
vm_check "node-a's write to the withdrawn region failed ($(grep -o 'failed after.*' "$out/node_a.log" 2>/dev/null | head -1))" \
  grep -q "the write to the withdrawn region failed" "$out/node_a.log"
vm_check "the pod was told UNAVAILABLE ($(grep -o '"code":"[A-Z_]*"' "$out/node-a.put-first.out" 2>/dev/null))" \
  grep -q '"code":"UNAVAILABLE"' "$out/node-a.put-first.out"
vm_check "node-a's queue pairs went into error on the remote access error ($(grep -c 'event=verbs_qp_failed node=node-b' \
  "$out/node-a.podlinkd.log" 2>/dev/null) failed; $(grep -o 'event=verbs_qp_failed.*' "$out/node-a.podlinkd.log" 2>/dev/null | head -1))" \
  grep -Eq 'event=verbs_qp_failed node=node-b .*why="[^"]*remote access' "$out/node-a.podlinkd.log"
vm_check "node-a's second region write, read-back and notification went through" \
  grep -q '"event":"read_back".*"mismatches":0' "$out/node-a.put-second.out"
vm_check "node-a wrote the second region over verbs ($(grep -c 'event=verbs_path_up node=node-b' "$out/node-a.podlinkd.log" 2>/dev/null) path(s) up in all)" \
  python3 -c 'import json,sys
p = next(x for x in json.load(open(sys.argv[1]))["peers"] if x["node"] == "node-b")
sys.exit(0 if p["transport"] == "verbs" and p["connections_up"] >= 1 else 1)' "$out/node-a.links.json"
vm_check "node-b found every byte of its second region right" \
  grep -q '"event":"verified".*"mismatches":0' "$out/node-b.serve-second.out"
vm_machine "$out" "tests/vm/mesh_verbs_qp_error.sh; region $bytes bytes, withdrawn 1 s into the write"
[ "$rc" = 0 ] && echo "queue pairs forced into error by a withdrawn region, and the link after (two guests): PASS" ||
  echo "queue pairs forced into error by a withdrawn region, and the link after (two guests): FAIL"
exit "$rc"
