#!/usr/bin/env bash
# Two relays in a row over verbs, for real (not in CI): four QEMU guests
# cabled as a chain node-a - node-b - node-c - node-d, each with its own
# podlinkd over the verbs transport and soft-RoCE on every cable. node-a and
# node-d have no route to each other but through node-b and node-c: each
# serves a region, writes 16 MiB into the other's, reads it back and
# notifies, every byte checked by the owner. Every hop is over queue pairs:
# the origin reaches the first relay as a staged grant (its bounce pool holds
# each slice), the first relay reaches the second the same way (relay to
# relay), and the second reaches the owner, which registers the region.
# Each node is told only its cable neighbours (mesh.peers) and trades signed
# node adverts every second, which is how node-a learns the way to node-d.
#
#   tests/vm/mesh_verbs_two_relays.sh [build dir] [output dir]
#
# PODLINK_VM_BYTES (default 16 MiB), PODLINK_VM_TIMEOUT (default 900 s).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bytes=${PODLINK_VM_BYTES:-16777216}
limit=${PODLINK_VM_TIMEOUT:-900}
source "$here/lib.sh"
vm_dirs "docs/results/verbs-softroce-two-relays-$(date -u +%Y-%m-%d)-local" "$@"
source "$here/../common/mesh_certs.sh"

vm_begin "$out"
mesh_certs "$out/certs" node-a node-b node-c node-d
# a.eth0-b.eth0, b.eth1-c.eth0, c.eth1-d.eth0
printf 'eth0 10.77.1.1/30\n' > "$out/node-a.net"
printf 'eth0 10.77.1.2/30\neth1 10.77.2.1/30\n' > "$out/node-b.net"
printf 'eth0 10.77.2.2/30\neth1 10.77.3.1/30\n' > "$out/node-c.net"
printf 'eth0 10.77.3.2/30\n' > "$out/node-d.net"
p=$((20000 + $$ % 20000))
VM_NICS_node_a="listen:$p"
VM_NICS_node_b="connect:$p listen:$((p + 1))"
VM_NICS_node_c="connect:$((p + 1)) listen:$((p + 2))"
VM_NICS_node_d="connect:$((p + 2))"
# Cable neighbours, adverts every second, and opens that may wait 30 s per
# node ahead (each hop may first set up its queue pairs to the next node:
# 10-15 s with emulated guests sharing two cores).
peer() { printf '{"node": "%s", "addresses": ["%s"], "port": 7446}' "$1" "$2"; }
mesh() { printf ', "advert_seconds": 1, "open_timeout_seconds": 30, "peers": [%s]' "$1"; }
extra_a=$(mesh "$(peer node-b 10.77.1.2/30)")
extra_b=$(mesh "$(peer node-a 10.77.1.1/30), $(peer node-c 10.77.2.2/30)")
extra_c=$(mesh "$(peer node-b 10.77.2.1/30), $(peer node-d 10.77.3.2/30)")
extra_d=$(mesh "$(peer node-c 10.77.3.1/30)")
env="PODLINK_VM_VERBS_TIMEOUT=${PODLINK_VM_VERBS_TIMEOUT:-16}"
t0=$(date +%s)
vm_log "booting node-a, node-b, node-c, node-d as a chain (kernel $VM_KVER, soft-RoCE); $bytes bytes per transfer"
vm_start node_a 1 "$env PODLINK_VM_MESH_EXTRA='$extra_a' PODLINK_VM_NAME=node-a sh $here/node.sh $build pair $bytes node-d"
sleep 1
vm_start node_b 2 "$env PODLINK_VM_MESH_EXTRA='$extra_b' PODLINK_VM_NAME=node-b sh $here/node.sh $build relay node-a node-d"
sleep 1
vm_start node_c 3 "$env PODLINK_VM_MESH_EXTRA='$extra_c' PODLINK_VM_NAME=node-c sh $here/node.sh $build relay node-a node-d"
sleep 1
vm_start node_d 4 "$env PODLINK_VM_MESH_EXTRA='$extra_d' PODLINK_VM_NAME=node-d sh $here/node.sh $build pair $bytes node-a"
rc=0
vm_wait_all "$t0" "$limit" "$limit" node_a node_b node_c node_d || rc=1
python3 "$here/summary.py" "$out" node-a:node-d node-d:node-a || rc=1

metric() { awk -v m="$2" '$1 == m { print $2 + 0 }' "$out/$1.metrics" 2>/dev/null; }
# Each end routed through both relays, in order.
vm_check "node-a routed to node-d via node-b,node-c" grep -q 'event=mesh_route destination=node-d via=node-b,node-c$' \
  "$out/node-a.podlinkd.log"
vm_check "node-d routed to node-a via node-c,node-b" grep -q 'event=mesh_route destination=node-a via=node-c,node-b$' \
  "$out/node-d.podlinkd.log"
# Every hop over queue pairs: the origins' hops to the first relay, and the
# first relay's on to the second (relay to relay), staged by the relay ahead.
for hop in "node-a node-b" "node-d node-c" "node-b node-c" "node-c node-b"; do
  set -- $hop
  vm_check "$1 reached the relay $2 over verbs (staged by it)" \
    grep -q "event=mesh_region_staged node=$2 .*why=\"relay $2 stores and forwards\"" "$out/$1.podlinkd.log"
done
vm_check "node-b relayed node-a's open on to the relay node-c" \
  grep -q 'event=mesh_relay_grant peer=node-a origin=node-a next=node-c ' "$out/node-b.podlinkd.log"
vm_check "node-c relayed node-d's open on to the relay node-b" \
  grep -q 'event=mesh_relay_grant peer=node-d origin=node-d next=node-b ' "$out/node-c.podlinkd.log"
for n in node-a node-b node-c node-d; do
  vm_check "$n took no hop over TCP" bash -c "! grep -q 'event=mesh_relay_over_tcp\|event=mesh_verbs_fallback' '$out/$n.podlinkd.log'"
done
# Each relay staged every slice of both transfers for the node before it
# (written and read back: 4 x bytes / 256 KiB), none refused.
slices=$(( 4 * ((bytes + 262143) / 262144) ))
for n in node-b node-c; do
  staged=$(metric "$n" podlink_mesh_verbs_staged_slices_total)
  refused=$(metric "$n" podlink_mesh_verbs_staged_refused_total)
  vm_check "$n staged ${staged:-no} slices (at least $slices), ${refused:-no} refused" \
    test "${staged:-0}" -ge "$slices" -a "${refused:-1}" = 0
done
vm_machine "$out" "tests/vm/mesh_verbs_two_relays.sh; $bytes bytes per transfer; chain node-a - node-b - node-c - node-d"
rm -rf "$out/certs" "$out"/*.pid "$out"/*.desc-* "$out"/*.idx
[ "$rc" = 0 ] && echo "two relays in a row over verbs (soft-RoCE, four guests): PASS" ||
  echo "two relays in a row over verbs (soft-RoCE, four guests): FAIL"
exit "$rc"
