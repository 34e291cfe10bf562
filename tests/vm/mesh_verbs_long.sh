#!/usr/bin/env bash
# The longer soft-RoCE run (not in CI): three QEMU guests cabled as a triangle,
# node-a and node-b by two cables, and a fourth, node-d, cabled only to node-c;
# each node with its own podlinkd over the verbs transport. Every node of the
# triangle serves a region and writes, reads back and notifies the other two
# nodes' regions (six directed transfers over direct paths); node-a and node-d
# do the same through node-c's daemon as a relay — over verbs on both hops:
# node-c stages each slice in its bounce pool for the upstream node and sends
# it on over its own queue pairs — and node-c and node-d directly. While node-a writes to node-b, node-a's second cable to node-b goes
# down: the QPs on it fail, their slices go over the first cable, and no byte
# may be lost. The cable comes back PODLINK_VM_CUT_BACK seconds later (default
# 3) and node-a's daemon makes new QPs on it (the owner drops the failed
# ones). (Two relays in a row: tests/vm/mesh_verbs_two_relays.sh.) node-b runs with mesh.verbs_staged_only (PODLINK_VM_B_STAGED=0: it
# registers its region instead): the cut write's slices go through node-b's
# bounce pool, those outstanding on the failed QPs are sent again, and the
# write ends with a DONE record node-b answers once no old copy can land
# (podlink_mesh_verbs_staged_done_total).
#
#   tests/vm/mesh_verbs_long.sh [build dir] [output dir]
#
# PODLINK_VM_BYTES (default 16 MiB), PODLINK_VM_CUT_AFTER (seconds after node-a connected to node-b, the
# write then under way; default 0.5: four guests share the host's cores), PODLINK_VM_TIMEOUT (default 900 s).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bytes=${PODLINK_VM_BYTES:-16777216}
limit=${PODLINK_VM_TIMEOUT:-900}
cut_after=${PODLINK_VM_CUT_AFTER:-0.5}
cut_back=${PODLINK_VM_CUT_BACK:-3}
b_staged=${PODLINK_VM_B_STAGED:-1}
b_extra=
[ "$b_staged" = 1 ] && b_extra="PODLINK_VM_MESH_EXTRA=', \"verbs_staged_only\": true'"
source "$here/lib.sh"
vm_dirs "docs/results/verbs-softroce-relay-$(date -u +%Y-%m-%d)-local" "$@"
source "$here/../common/mesh_certs.sh"

vm_begin "$out"
mesh_certs "$out/certs" node-a node-b node-c node-d
# a.eth0-b.eth0, a.eth1-b.eth1 (the one that is cut), b.eth2-c.eth0, a.eth2-c.eth1, c.eth2-d.eth0
printf 'eth0 10.77.1.1/30\neth1 10.77.2.1/30\neth2 10.77.4.1/30\n' > "$out/node-a.net"
printf 'eth0 10.77.1.2/30\neth1 10.77.2.2/30\neth2 10.77.3.1/30\n' > "$out/node-b.net"
printf 'eth0 10.77.3.2/30\neth1 10.77.4.2/30\neth2 10.77.5.1/30\n' > "$out/node-c.net"
printf 'eth0 10.77.5.2/30\n' > "$out/node-d.net"
p=$((20000 + $$ % 20000))
VM_NICS_node_a="listen:$p listen:$((p + 1)) listen:$((p + 3))"
VM_NICS_node_b="connect:$p connect:$((p + 1)) listen:$((p + 2))"
VM_NICS_node_c="connect:$((p + 2)) connect:$((p + 3)) listen:$((p + 4))"
VM_NICS_node_d="connect:$((p + 4))"
env="PODLINK_VM_VERBS_TIMEOUT=${PODLINK_VM_VERBS_TIMEOUT:-16}"
t0=$(date +%s)
vm_log "booting node-a, node-b, node-c, node-d (kernel $VM_KVER, soft-RoCE); $bytes bytes per transfer"
# Peer order matters for node-a and node-d: each talks to node-c first and so
# learns node-c's addresses (its Hello), through which it routes to the other.
vm_start node_a 1 "$env PODLINK_VM_CUT='node-b eth1 $cut_after $cut_back' PODLINK_VM_NAME=node-a sh $here/node.sh $build pair $bytes node-b node-c node-d"
sleep 1
vm_start node_b 2 "$env $b_extra PODLINK_VM_NAME=node-b sh $here/node.sh $build pair $bytes node-a node-c"
sleep 1
vm_start node_c 3 "$env PODLINK_VM_NAME=node-c sh $here/node.sh $build pair $bytes node-a node-b node-d"
sleep 1
vm_start node_d 4 "$env PODLINK_VM_NAME=node-d sh $here/node.sh $build pair $bytes node-c node-a"
rc=0
vm_wait_all "$t0" "$limit" "$limit" node_a node_b node_c node_d || rc=1
python3 "$here/summary.py" "$out" node-a:node-b node-a:node-c node-b:node-a node-b:node-c node-c:node-a node-c:node-b \
  node-c:node-d node-d:node-c node-a:node-d node-d:node-a || rc=1
# node-a and node-d reached each other through node-c's daemon, not around it.
for pair in "node-a node-d" "node-d node-a"; do
  set -- $pair
  if grep -q "event=mesh_route destination=$2 via=node-c" "$out/$1.podlinkd.log"; then
    echo "$1: routed to $2 via node-c"
  else
    echo "$1 did not route to $2 through node-c"; rc=1
  fi
done
relayed=$(grep -c 'event=mesh_relay_grant' "$out/node-c.podlinkd.log" || true)
echo "node-c: relayed $relayed regions"
[ "$relayed" -ge 2 ] || { echo "node-c relayed $relayed regions, expected 2"; rc=1; }
# RDMA into the relay: node-a's and node-d's hops to node-c carried staged
# (node-c's bounce pools), every slice of both transfers, none refused.
for n in node-a node-d; do
  if grep -q 'event=mesh_region_staged node=node-c' "$out/$n.podlinkd.log"; then
    echo "$n: reached the relay node-c over verbs ($(grep -h 'event=mesh_region_staged node=node-c' "$out/$n.podlinkd.log" |
      head -1 | sed 's/.*why=/why=/'))"
  else
    echo "$n: its hop to the relay node-c was not staged over verbs"; rc=1
  fi
done
staged=$(awk '$1 == "podlink_mesh_verbs_staged_slices_total" { print $2 + 0 }' "$out/node-c.metrics" 2>/dev/null)
refused=$(awk '$1 == "podlink_mesh_verbs_staged_refused_total" { print $2 + 0 }' "$out/node-c.metrics" 2>/dev/null)
slices=$(( 4 * ((bytes + 262143) / 262144) ))  # two transfers, each written and read back, 256 KiB slices
echo "node-c: ${staged:-no} slices staged through its bounce pools (at least $slices expected), ${refused:-no} refused"
[ "${staged:-0}" -ge "$slices" ] && [ "${refused:-1}" = 0 ] || rc=1
# The cut must have cost QPs (and so resent slices), not data.
failed=$(grep -c 'event=verbs_qp_failed' "$out/node-a.podlinkd.log" || true)
echo "node-a: $failed queue pairs failed after the cut"
[ "$failed" -ge 1 ] || { echo "the cut did not fail any queue pair"; rc=1; }
# The owner drops exactly the failed QPs (QP numbers repeat across devices).
dropped=$({ grep -h 'event=verbs_qps_dropped peer=node-a' "$out/node-b.podlinkd.log" || true; } |
  sed 's/.*count=\([0-9]*\).*/\1/' | awk '{s += $1} END {print s + 0}')
echo "node-b: dropped $dropped of node-a's queue pairs"
[ "$dropped" = "$failed" ] || { echo "node-b dropped $dropped queue pairs, node-a saw $failed fail"; rc=1; }
if [ "$b_staged" = 1 ]; then
  # The cut write was staged by node-b, and sent partly twice: it ended with
  # a DONE record node-b answered (and any old copy was dropped, counted).
  metric() { awk -v m="$1" '$1 == m { print $2 + 0 }' "$out/node-b.metrics" 2>/dev/null; }
  echo "node-b (verbs_staged_only): $(metric podlink_mesh_verbs_staged_slices_total) slices staged," \
    "$(metric podlink_mesh_verbs_staged_done_total) DONE records answered," \
    "$(metric podlink_mesh_verbs_staged_late_dropped_total) late copies dropped," \
    "$(metric podlink_mesh_verbs_staged_refused_total) refused"
  [ "$(metric podlink_mesh_verbs_staged_done_total)" -ge 1 ] 2>/dev/null ||
    { echo "node-b answered no DONE record: the cut write was not sent partly twice, or not guarded"; rc=1; }
  [ "$(metric podlink_mesh_verbs_staged_refused_total)" = 0 ] || rc=1
fi
if grep -q 'event=mesh_connection_repaired' "$out/node-a.podlinkd.log"; then
  echo "node-a: $(grep -h 'event=mesh_connection_repaired' "$out/node-a.podlinkd.log" | head -1 | sed 's/.*event=/event=/')"
else
  echo "node-a: the path was not repaired after the cable came back"; rc=1
fi
grep -h 'podlink_mesh' "$out/node-a.metrics" 2>/dev/null | grep -E 'resent|failures|connections' || true
vm_machine "$out" "tests/vm/mesh_verbs_long.sh; $bytes bytes per transfer; node-a's eth1 to node-b cut ${cut_after} s into its write, back ${cut_back} s later; node-a and node-d through node-c; node-b verbs_staged_only=$b_staged"
rm -rf "$out/certs" "$out"/*.pid "$out"/*.desc-* "$out"/*.idx
[ "$rc" = 0 ] && echo "triangle + cut cable + a node through a relay over verbs (soft-RoCE, four guests): PASS" ||
  echo "triangle + cut cable + a node through a relay over verbs (soft-RoCE, four guests): FAIL"
exit "$rc"
