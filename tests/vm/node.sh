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
#   node.sh BUILD withdraw SIZE PEER serve a region for PEER and kill its pod
#                                    (the export goes, and with it the RDMA
#                                    registration) 1 s after PEER says its
#                                    write is under way; then serve a second
#                                    region and check what PEER writes there
#   node.sh BUILD write-withdrawn SIZE PEER
#                                    write PEER's first region (expected to
#                                    fail: withdrawn mid-write, the queue
#                                    pairs hit a remote access error), then
#                                    write, read back and notify its second
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

# serve SIZE WHICH: a region of SIZE bytes served by kv-serve (its pid in
# $server), its descriptor published as $out/$name.desc-WHICH once it serves.
serve() {
  "$demo" kv-serve --size "$1" --verify "$PODLINK_VM_IDX" > "$out/$name.serve-$2.out" 2> "$out/$name.serve-$2.err" &
  server=$!
  i=0
  until grep -q '"serving"' "$out/$name.serve-$2.out" 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -lt 600 ] || { log "kv-serve did not start"; exit 1; }
    kill -0 "$server" 2>/dev/null || { log "kv-serve failed: $(cat "$out/$name.serve-$2.err")"; exit 1; }
    sleep 0.1
  done
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["descriptor"])' \
    "$out/$name.serve-$2.out" > "$out/$name.desc-$2.tmp"
  mv "$out/$name.desc-$2.tmp" "$out/$name.desc-$2"
}

case "$role" in
  pair)
    # One region per peer (each writer notifies its own owner), so a region
    # is withdrawn only after its one writer finished with it.
    size=$1
    shift
    servers=""
    for peer in "$@"; do
      serve "$size" "$peer"
      servers="$servers $server"
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
  withdraw)
    size=$1
    peer=$2
    rc=0
    serve "$size" first
    wait_for "$out/$peer.writing" 240 || rc=1
    sleep 1
    kill -9 "$server"
    wait "$server" 2>/dev/null || true
    log "withdrew the first region (its pod killed) while $peer writes"
    serve "$size" second
    wait "$server" || rc=1
    cat "$out/$name.serve-second.out"
    python3 -c 'import json,sys
v=[json.loads(l) for l in open(sys.argv[1]) if "verified" in l]
sys.exit(0 if v and v[0]["mismatches"] == 0 else 1)' "$out/$name.serve-second.out" ||
      { log "the second region was not right"; rc=1; }
    echo "$rc" > "$out/$name.finished"
    wait_for "$out/$peer.finished" 300 || true
    ;;
  write-withdrawn)
    size=$1
    peer=$2
    rc=0
    wait_for "$out/$peer.desc-first" 240 || rc=1
    # The peer's index once it serves (its guest may boot later than this one).
    peer_idx=$(cat "$out/$peer.idx" 2>/dev/null || echo 0)
    # Under way once this daemon's queue pairs to the peer are up (the open
    # done, the write starting).
    (
      i=0
      until grep -q "event=verbs_path_up node=$peer" "$out/$name.podlinkd.log"; do
        i=$((i + 1))
        [ "$i" -lt 1200 ] || exit 0
        sleep 0.1
      done
      echo 1 > "$out/$name.writing"
    ) &
    log "writing $size bytes to $peer's first region (it will be withdrawn mid-write)"
    start=$(date +%s)
    if timeout 120 "$demo" kv-put --desc "$(cat "$out/$peer.desc-first")" --seed "$peer_idx" \
        > "$out/$name.put-first.out" 2> "$out/$name.put-first.err"; then
      log "the write to the withdrawn region succeeded: it was not under way when the region went"
      rc=1
    else
      log "the write to the withdrawn region failed after $(( $(date +%s) - start )) s: $(grep '"error"' "$out/$name.put-first.out")"
    fi
    wait_for "$out/$peer.desc-second" 120 || rc=1
    log "writing $size bytes to $peer's second region, reading them back, notifying"
    if ! timeout 300 "$demo" kv-put --desc "$(cat "$out/$peer.desc-second")" --seed "$peer_idx" --read-back \
        > "$out/$name.put-second.out" 2> "$out/$name.put-second.err"; then
      log "kv-put to $peer's second region failed: $(tail -3 "$out/$name.put-second.err")"
      rc=1
    fi
    cat "$out/$name.put-second.out"
    echo "$rc" > "$out/$name.finished"
    wait_for "$out/$peer.finished" 300 || true
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
