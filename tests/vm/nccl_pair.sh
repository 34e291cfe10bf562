#!/usr/bin/env bash
# Runs inside a test guest after node.sh started its podlinkd: one side of the
# NCCL plugin's conformance scenarios (tests/nccl/nccl_net_peer.cc) between
# pods on two guests, so through the two podlinkd and their mesh links (the
# verbs backend on soft-RoCE). The receiver listens and leaves each listen
# handle in /mnt; the sender connects to it. Results are the peer's JSON lines
# in /mnt/NAME.nccl.out; the last line of this script says PASS or FAIL.
#
#   nccl_pair.sh BUILD recv|send PEER
set -uo pipefail
build=$1 role=$2 peer=$3
name=$PODLINK_VM_NAME
out=/mnt
scenarios=${PODLINK_VM_NCCL_SCENARIOS:-ordering grouped smaller truncate large}
log() { echo "[$name $(date +%T)] nccl: $*"; }

coproc PEER { exec "$build/tests/nccl_net_peer" "$build/client-lib/libnccl-net-podlink.so" 2> "$out/$name.nccl.err"; }
send() { echo "$1" >&"${PEER[1]}"; }
# expect EVENT SECONDS: the peer's next line with that event (every line is kept in NAME.nccl.out).
expect() {
  local line
  while IFS= read -r -t "$2" -u "${PEER[0]}" line; do
    echo "$line" >> "$out/$name.nccl.out"
    case $line in *"\"event\":\"$1\""*) echo "$line"; return 0 ;; esac
  done
  log "no '$1' from the peer within $2 s"
  return 1
}
ok() { case $1 in *'"ok":true'*) return 0 ;; *) return 1 ;; esac; }

: > "$out/$name.nccl.out"
rc=0
send '{"cmd":"init"}'
r=$(expect ready 60) && case $r in *'"result":0'*) ;; *) rc=1 ;; esac || rc=1
k=0
for sc in $scenarios; do
  [ "$rc" = 0 ] || break
  k=$((k + 1))
  if [ "$role" = recv ]; then
    send '{"cmd":"listen"}'
    h=$(expect handle 30) || { rc=1; break; }
    hex=$(echo "$h" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["hex"])')
    echo "$hex" > "$out/$name.handle.$k.tmp" && mv "$out/$name.handle.$k.tmp" "$out/$name.handle.$k"
    send '{"cmd":"accept","timeout_ms":120000}'
    a=$(expect accepted 130) && ok "$a" || { log "$sc: accept failed: $a"; rc=1; break; }
    send "{\"cmd\":\"recv\",\"scenario\":\"$sc\"}"
  else
    i=0
    until [ -s "$out/$peer.handle.$k" ]; do
      i=$((i + 1))
      [ "$i" -lt 1800 ] || { log "no handle $k from $peer in 180 s"; rc=1; break 2; }
      sleep 0.1
    done
    send "{\"cmd\":\"connect\",\"hex\":\"$(cat "$out/$peer.handle.$k")\",\"timeout_ms\":120000}"
    c=$(expect connected 130) && ok "$c" || { log "$sc: connect failed: $c"; rc=1; break; }
    case $c in *'"transport":"mesh"'*) ;; *) log "$sc: not over the mesh: $c"; rc=1; break ;; esac
    send "{\"cmd\":\"send\",\"scenario\":\"$sc\"}"
  fi
  d=$(expect done 300) && ok "$d" || { log "$sc: $role failed: $d"; rc=1; break; }
  send '{"cmd":"close","listen":true}'
  expect closed 30 > /dev/null || rc=1
  log "$sc: $role passed"
done
send '{"cmd":"exit"}' 2>/dev/null
exec {PEER[1]}>&- 2>/dev/null
wait "$PEER_PID" 2>/dev/null
[ "$rc" = 0 ] && log "PASS ($scenarios)" || log "FAIL"
exit "$rc"
