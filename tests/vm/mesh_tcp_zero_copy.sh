#!/usr/bin/env bash
# Zero-copy TCP sends (mesh.tcp_zero_copy, MSG_ZEROCOPY) where the kernel
# really does not copy: two QEMU guests whose cable is a pair of tap devices
# on a bridge of this machine. QEMU passes the virtio-net header on a tap, so
# the guests' NICs offer scatter-gather and checksum offload and the guest
# kernel hands the pod's pages to the device (a socket cable, as in the other
# VM tests, offers neither, and veth and loopback copy on delivery: there
# every zero-copy send comes back COPIED). Both daemons use the TCP transport;
# each pod writes its peer's region, reads it back and notifies it, and both
# owners check every byte. Passes when each node handed its pod's slices to
# the kernel without a copy and the guest kernel reported more such sends done
# than it copied; prints both nodes' counters.
#
#   tests/vm/mesh_tcp_zero_copy.sh [build dir] [output dir]
#
# Needs root and /dev/net/tun (two tap devices and a bridge, made here and
# removed on exit; without them it says SKIP). In the test command (about
# 25 s here). Every wait is bounded (PODLINK_VM_TIMEOUT, default
# 300 s).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bytes=${PODLINK_VM_BYTES:-16777216}
limit=${PODLINK_VM_TIMEOUT:-300}
source "$here/lib.sh"
vm_dirs "tmp" "$@"
source "$here/../common/mesh_certs.sh"

if [ "$(id -u)" != 0 ] || [ ! -c /dev/net/tun ]; then
  echo "SKIP: needs root and /dev/net/tun for its tap cables"
  exit 0
fi
tag=$(( $$ % 10000 ))
br=plzcbr$tag tap_a=plzca$tag tap_b=plzcb$tag
cleanup_net() {
  ip link del "$tap_a" 2>/dev/null || true
  ip link del "$tap_b" 2>/dev/null || true
  ip link del "$br" 2>/dev/null || true
}
cleanup_net  # names left by an earlier run killed before its cleanup
vm_begin "$out"
trap 'vm_stop_all; cleanup_net' EXIT
# The bridge passes the guests' frames without the host's firewall (with
# br_netfilter loaded, a FORWARD policy of DROP would drop them).
ip link add "$br" type bridge nf_call_iptables 0 nf_call_ip6tables 0 2>/dev/null || ip link add "$br" type bridge
for t in "$tap_a" "$tap_b"; do
  ip tuntap add dev "$t" mode tap
  ip link set "$t" master "$br"
  ip link set "$t" up
done
ip link set "$br" up
mesh_certs "$out/certs" node-a node-b
echo "eth0 10.77.5.1/30" > "$out/node-a.net"
echo "eth0 10.77.5.2/30" > "$out/node-b.net"
VM_NICS_node_a="tap:$tap_a"
VM_NICS_node_b="tap:$tap_b"
tcp="PODLINK_VM_MESH_EXTRA=', \"transport\": \"tcp\"'"
t0=$(date +%s)
vm_log "booting node-a and node-b (kernel $VM_KVER) on tap cables; TCP transport, $bytes bytes each way"
vm_start node_a 1 "$tcp PODLINK_VM_NAME=node-a sh $here/node.sh $build pair $bytes node-b"
vm_start node_b 2 "$tcp PODLINK_VM_NAME=node-b sh $here/node.sh $build pair $bytes node-a"
rc=0
vm_wait_all "$t0" "$limit" 60 node_a node_b || rc=1
python3 "$here/summary.py" "$out" node-a:node-b node-b:node-a || rc=1
for n in node-a node-b; do
  echo "$n: $(grep -E '^podlink_mesh_tcp_zero_copy_' "$out/$n.metrics" 2>/dev/null | tr '\n' ' ')"
done
python3 - "$out" <<'PY' || rc=1
import re, sys
def value(node, series):
    try:
        text = open(f"{sys.argv[1]}/{node}.metrics").read()
    except OSError:
        return None
    m = re.search("^" + re.escape(series) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None
ok = True
for node, peer in (("node-a", "node-b"), ("node-b", "node-a")):
    zc = value(node, f'podlink_mesh_tcp_zero_copy_bytes_total{{peer="{peer}"}}')
    done = value(node, f'podlink_mesh_tcp_zero_copy_completed_total{{peer="{peer}"}}')
    copied = value(node, f'podlink_mesh_tcp_zero_copy_copied_total{{peer="{peer}"}}')
    good = zc is not None and zc > 0 and done is not None and copied is not None and done > copied
    print(f"{'ok' if good else 'FAILED'}: {node} -> {peer}: {zc} bytes sent without a copy into the kernel, "
          f"{done} sends completed, {copied} of them copied by the kernel after all")
    ok = ok and good
sys.exit(0 if ok else 1)
PY
vm_machine "$out" "tests/vm/mesh_tcp_zero_copy.sh; region $bytes bytes; cable: two tap devices on a bridge; transport tcp"
[ "$rc" = 0 ] && echo "mesh TCP links sending without a copy (two guests on tap cables): PASS" ||
  echo "mesh TCP links sending without a copy (two guests on tap cables): FAIL"
exit "$rc"
