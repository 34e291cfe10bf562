#!/bin/sh
# Runs inside a test guest (tests/vm/lib.sh) as one mesh node: brings up the
# cables listed in /mnt/NAME.net ("netdev addr/prefix" per line) with a
# soft-RoCE device on each, starts podlinkd with the verbs transport, then
# plays the pods of the test:
#
#   node.sh BUILD pair SIZE PEER...  serve a region per PEER (kv-serve), write,
#                                    read back and notify the region each PEER
#                                    serves us (kv-put --read-back), wait for
#                                    our regions' notifications and check every
#                                    byte (PODLINK_VM_IDLE_MS: hold each peer
#                                    region that long before writing, with
#                                    PODLINK_VM_GRANT_IDLE / _KEEPALIVE as the
#                                    daemons' grant_idle / keepalive seconds).
#                                    With PODLINK_VM_NCCL=1 and one PEER,
#                                    then the NCCL plugin's conformance
#                                    scenarios with it (nccl_pair.sh; the node
#                                    whose name sorts first sends).
#   node.sh BUILD relay NODE...     serve nothing; relay for the others until
#                                    each NODE has finished (at most 600 s)
#
# PODLINK_VM_MESH_EXTRA: more of the daemon's mesh options, as JSON that
# follows the others (', "verbs_staged_only": true').
#
# Every wait is bounded. Results are JSON lines in /mnt/NAME.*.out.
set -eu
build=$1
shift
role=$1
shift
name=$PODLINK_VM_NAME
out=/mnt
log() { echo "[$name $(date +%T)] $*"; }
echo "$PODLINK_VM_IDX" > "$out/$name.idx"

ifs=""
while read -r dev addr; do
  [ -n "$dev" ] || continue
  ip addr add "$addr" dev "$dev"
  ip link set "$dev" up
  rdma link add "rxe_$dev" type rxe netdev "$dev"
  ifs="$ifs${ifs:+, }\"$dev\""
done < "$out/$name.net"
log "cables: $(ip -brief addr show | grep -v '^lo' | tr '\n' ';')"
log "rdma: $(rdma link show | tr '\n' ';')"

mkdir -p /run/podlink-test
cat > /run/podlink-test/config.json <<CFG
{"node": {"name": "$name", "id": "$name"},
 "mesh": {"enabled": true, "transport": "verbs", "cert_dir": "$out/certs/$name", "interfaces": [$ifs],
          "connections_per_path": 2, "slice_kib": 256, "verbs_timeout": ${PODLINK_VM_VERBS_TIMEOUT:-18},
          "grant_idle_seconds": ${PODLINK_VM_GRANT_IDLE:-600}, "keepalive_seconds": ${PODLINK_VM_KEEPALIVE:-60}${PODLINK_VM_MESH_EXTRA:-}},
 "pods": [{"match": {"uid": 0}, "namespace": "vmtest", "name": "pod-$name",
           "annotations": {"podlink.io/peer-group": "vmtest"}}]}
CFG
wrap=""
[ "${PODLINK_VM_GDB:-0}" = 1 ] && wrap="gdb -q -batch -ex run -ex bt -ex quit --args"
# PODLINK_VM_MEMLOCK_KIB: podlinkd without CAP_IPC_LOCK and with that much
# locked memory at most (RLIMIT_MEMLOCK), as a daemon run unprivileged would
# be: ibv_reg_mr of more fails with ENOMEM (the kernel's pinning limit).
(
  if [ -n "${PODLINK_VM_MEMLOCK_KIB:-}" ]; then
    ulimit -l "$PODLINK_VM_MEMLOCK_KIB"
    wrap="$wrap setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock --"
  fi
  exec $wrap "$build/daemon/podlinkd" --socket-dir /run/podlink-test --config /run/podlink-test/config.json \
    --no-gpu --metrics-addr 127.0.0.1:9464 > "$out/$name.podlinkd.log" 2>&1
) &
daemon=$!
i=0
until [ -S /run/podlink-test/podlink.fd.sock ]; do
  i=$((i + 1))
  [ "$i" -lt 600 ] || { log "podlinkd did not start in 60 s"; exit 1; }
  kill -0 "$daemon" || { log "podlinkd exited"; exit 1; }
  sleep 0.1
done
log "podlinkd up"
export PODLINK_SOCKET_DIR=/run/podlink-test
demo="$build/client-lib/tools/podlink-demo"

wait_for() {  # file seconds
  i=0
  until [ -s "$1" ]; do
    i=$((i + 1))
    [ "$i" -lt "$(($2 * 10))" ] || { log "no $1 after $2 s"; return 1; }
    sleep 0.1
  done
}

case "$role" in
  pair)
    # One region per peer (each writer notifies its own owner), so a region
    # is withdrawn only after its one writer finished with it.
    size=$1
    shift
    servers=""
    for peer in "$@"; do
      "$demo" kv-serve --size "$size" --verify "$PODLINK_VM_IDX" > "$out/$name.serve-$peer.out" \
        2> "$out/$name.serve-$peer.err" &
      server=$!
      servers="$servers $server"
      i=0
      until grep -q '"serving"' "$out/$name.serve-$peer.out" 2>/dev/null; do
        i=$((i + 1))
        [ "$i" -lt 600 ] || { log "kv-serve did not start"; exit 1; }
        kill -0 "$server" 2>/dev/null || { log "kv-serve failed: $(cat "$out/$name.serve-$peer.err")"; exit 1; }
        sleep 0.1
      done
      python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["descriptor"])' \
        "$out/$name.serve-$peer.out" > "$out/$name.desc-$peer.tmp"
      mv "$out/$name.desc-$peer.tmp" "$out/$name.desc-$peer"
    done
    rc=0
    for peer in "$@"; do
      wait_for "$out/$peer.desc-$name" 240 || { rc=1; continue; }
      peer_idx=$(cat "$out/$peer.idx")
      log "writing $size bytes to $peer's region, reading them back, notifying"
      # PODLINK_VM_CUT="peer netdev seconds [back]": take that cable down that
      # long after this daemon connected to peer (the write under way), and
      # up again `back` seconds later.
      if [ "${PODLINK_VM_CUT:-}" != "" ] && [ "${PODLINK_VM_CUT%% *}" = "$peer" ]; then
        cut_dev=$(echo "$PODLINK_VM_CUT" | cut -d' ' -f2)
        cut_after=$(echo "$PODLINK_VM_CUT" | cut -d' ' -f3)
        cut_back=$(echo "$PODLINK_VM_CUT" | cut -d' ' -f4)
        (
          i=0
          until grep -q "event=mesh_peer_connected node=$peer" "$out/$name.podlinkd.log"; do
            i=$((i + 1))
            [ "$i" -lt 1200 ] || exit 0
            sleep 0.1
          done
          sleep "$cut_after"
          ip link set "$cut_dev" down
          log "cut $cut_dev"
          if [ -n "$cut_back" ]; then
            sleep "$cut_back"
            ip link set "$cut_dev" up
            log "$cut_dev back up"
          fi
        ) &
      fi
      if ! timeout 300 "$demo" kv-put --desc "$(cat "$out/$peer.desc-$name")" --seed "$peer_idx" --read-back \
          --idle_ms "${PODLINK_VM_IDLE_MS:-0}" \
          > "$out/$name.put-$peer.out" 2> "$out/$name.put-$peer.err"; then
        log "kv-put to $peer failed: $(tail -3 "$out/$name.put-$peer.err") $(grep error "$out/$name.put-$peer.out")"
        rc=1
      fi
      cat "$out/$name.put-$peer.out"
    done
    # Each region's writer notifies when done; kv-serve gives up after 120 s.
    for server in $servers; do wait "$server" || rc=1; done
    for peer in "$@"; do
      cat "$out/$name.serve-$peer.out"
      python3 -c 'import json,sys
v=[json.loads(l) for l in open(sys.argv[1]) if "verified" in l]
sys.exit(0 if v and v[0]["mismatches"] == 0 else 1)' "$out/$name.serve-$peer.out" ||
        { log "the region $peer wrote was not right"; rc=1; }
    done
    if [ "${PODLINK_VM_NCCL:-0}" = 1 ] && [ "$#" = 1 ]; then
      nccl_role=recv
      [ "$name" \< "$1" ] && nccl_role=send
      log "NCCL conformance with $1 ($nccl_role)"
      bash "$(dirname "$0")/nccl_pair.sh" "$build" "$nccl_role" "$1" > "$out/$name.nccl.log" 2>&1 || rc=1
      tail -1 "$out/$name.nccl.log"
    fi
    # Stay up until every peer has finished with our regions.
    echo "$rc" > "$out/$name.finished"
    for peer in "$@"; do wait_for "$out/$peer.finished" 300 || true; done
    ;;
  relay)
    rc=0
    for peer in "$@"; do wait_for "$out/$peer.finished" 600 || rc=1; done
    echo "$rc" > "$out/$name.finished"
    ;;
  *)
    log "unknown role $role"
    rc=2
    ;;
esac
PODLINK_SOCKET_DIR=/run/podlink-test "$build/client-lib/tools/kubectl-podlink" links -o json --socket /run/podlink-test \
  > "$out/$name.links.json" 2>&1 || true
curl -s --max-time 5 http://127.0.0.1:9464/metrics 2>/dev/null | grep -E '^podlink_mesh' > "$out/$name.metrics" || true
kill "$daemon" 2>/dev/null || true
wait "$daemon" 2>/dev/null || true
exit "$rc"
