#!/usr/bin/env bash
# Regions RDMA may not reach directly, for real, on soft-RoCE: two QEMU guests
# as in tests/vm/mesh_verbs.sh.
# - node-b's podlinkd runs without CAP_IPC_LOCK and with 3 MiB of locked
#   memory at most: enough for its own queue pairs' staging, too little to
#   register its pod's 4 MiB region or to pin a bounce pool for node-a. node-a
#   asks for RDMA access to that region; node-b cannot register it
#   (ibv_reg_mr: ENOMEM) nor stage it, so it grants it over TCP with the
#   reasons, and node-a carries that region over its TCP links to node-b
#   instead of failing the open.
# - node-a runs with mesh.verbs_staged_only: it registers no export for
#   peers, so node-b's writes, read-back and notification of node-a's region
#   go over node-b's queue pairs through node-a's bounce pool (staged: node-a
#   copies each slice in and out, RDMA carries it between the pool and
#   node-b's staging).
# Both owners check every byte.
#
#   tests/vm/mesh_verbs_over_tcp.sh [build dir] [output dir]
#
# Every wait is bounded (PODLINK_VM_TIMEOUT, default 600 s in all). Exits
# non-zero when a check fails; the guests' logs stay in the output directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bytes=4194304
limit=${PODLINK_VM_TIMEOUT:-600}
source "$here/lib.sh"
vm_dirs "tmp" "$@"
source "$here/../common/mesh_certs.sh"

vm_begin "$out"
mesh_certs "$out/certs" node-a node-b
echo "eth0 10.77.2.1/30" > "$out/node-a.net"
echo "eth0 10.77.2.2/30" > "$out/node-b.net"
port=$((20000 + ($$ + 7) % 20000))
VM_NICS_node_a="listen:$port"
VM_NICS_node_b="connect:$port"
t0=$(date +%s)
vm_log "booting node-a and node-b (kernel $VM_KVER, soft-RoCE); node-b's podlinkd may lock 3 MiB"
vm_start node_a 1 "PODLINK_VM_MESH_EXTRA=', \"verbs_staged_only\": true' PODLINK_VM_NAME=node-a sh $here/node.sh $build pair $bytes node-b"
vm_start node_b 2 "PODLINK_VM_MEMLOCK_KIB=3072 PODLINK_VM_NAME=node-b sh $here/node.sh $build pair $bytes node-a"
rc=0
vm_wait_all "$t0" "$limit" 60 node_a node_b || rc=1
python3 "$here/summary.py" "$out" node-a:node-b node-b:node-a || rc=1
vm_check "node-b could not register its pod's region and granted it over TCP ($(grep -o 'event=mesh_grant_over_tcp.*' \
  "$out/node-b.podlinkd.log" 2>/dev/null | head -1))" grep -q "event=mesh_grant_over_tcp" "$out/node-b.podlinkd.log"
vm_check "node-b counted it" grep -Eq '^podlink_mesh_grants_over_tcp_total [1-9]' "$out/node-b.metrics"
vm_check "node-a carried that region over TCP" grep -q "event=mesh_region_over_tcp node=node-b" "$out/node-a.podlinkd.log"
vm_check "node-b could not pin a bounce pool for it either" grep -q "no staging over RDMA either" "$out/node-b.podlinkd.log"
vm_check "node-a (verbs_staged_only) staged its region for node-b ($(grep -o 'event=mesh_grant_staged.*' \
  "$out/node-a.podlinkd.log" 2>/dev/null | head -1))" grep -q "event=mesh_grant_staged peer=node-b" "$out/node-a.podlinkd.log"
vm_check "node-b carried node-a's region staged over its queue pairs" \
  grep -q "event=mesh_region_staged node=node-a" "$out/node-b.podlinkd.log"
# 4 MiB in 256 KiB slices, written and read back: 32 slices through node-a's pool.
vm_check "node-a copied every slice through its bounce pool ($(grep '^podlink_mesh_verbs_staged_slices_total' \
  "$out/node-a.metrics" 2>/dev/null))" \
  awk '$1 == "podlink_mesh_verbs_staged_slices_total" && $2 >= 32 { ok = 1 } END { exit !ok }' "$out/node-a.metrics"
vm_check "node-a refused none" grep -Eq '^podlink_mesh_verbs_staged_refused_total 0$' "$out/node-a.metrics"
# node-a's writes over TCP left its pod's export without a copy into the
# kernel (MSG_ZEROCOPY); how many sends the kernel copied after all (a socket
# cable's NIC has no scatter-gather) is reported.
vm_check "node-a sent its pod's slices to node-b without a copy ($(grep -E '^podlink_mesh_tcp_zero_copy_(bytes|copied|fell_back)_total' "$out/node-a.metrics" 2>/dev/null | tr '\n' ' '))" \
  grep -Eq '^podlink_mesh_tcp_zero_copy_bytes_total\{peer="node-b"\} [1-9]' "$out/node-a.metrics"
# What each node's operator sees (kubectl podlink links): node-a's bytes to
# node-b went over TCP links; node-b's to node-a over its queue pairs.
python3 - "$out" <<'PY' || rc=1
import json, sys
ok = True
for me, peer, transport in (("node-a", "node-b", "tcp"), ("node-b", "node-a", "verbs")):
    try:
        links = json.load(open(f"{sys.argv[1]}/{me}.links.json"))
        sent = sum(p["bytes_sent"] for p in links["peers"] if p["node"] == peer and p["transport"] == transport)
    except Exception as e:  # a missing or malformed answer fails the check
        sent = repr(e)
    good = isinstance(sent, int) and sent >= 4194304
    ok &= good
    print(f"{'ok' if good else 'FAILED'}: {me} -> {peer} over {transport}: {sent} bytes sent (kubectl podlink links)")
sys.exit(0 if ok else 1)
PY
vm_machine "$out" "tests/vm/mesh_verbs_over_tcp.sh; region $bytes bytes; node-b's podlinkd: no CAP_IPC_LOCK, ulimit -l 3072; node-a's: verbs_staged_only"
[ "$rc" = 0 ] && echo "mesh over verbs, a region staged through a bounce pool and one carried over TCP (two guests): PASS" ||
  echo "mesh over verbs, a region staged through a bounce pool and one carried over TCP (two guests): FAIL"
exit "$rc"
