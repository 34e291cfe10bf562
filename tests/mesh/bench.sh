#!/usr/bin/env bash
# The mesh's TCP links against raw TCP on the same shaped cables.
#
#   tests/mesh/bench.sh [build dir] [output dir]
#
# Two emulated nodes (network namespaces) joined by two veth cables, each its
# own /30, each shaped on the writer's side with `tc tbf` (default 200mbit,
# so the cable and not this machine's CPU is the limit;
# PODLINK_MESH_BENCH_RATE=none: unshaped veth, CPU-bound). Cases, each
# repeated PODLINK_MESH_BENCH_REPS times (default 3) with
# PODLINK_MESH_BENCH_BYTES (default 128 MiB):
#   raw_tcp_1cable_1conn, raw_tcp_1cable_4conn   tests/tcp_blast over cable 1
#   raw_tcp_2cables_4conn                        tcp_blast over both cables at once
#   podlink_1cable, podlink_2cables              a process on node a writes a region of a
#                                                process on node b through both daemons
#                                                (podlink-demo kv-put --repeat, the last write
#                                                timed; bytes checked by kv-serve)
#   podlink_relay                                the same from node a to node b through node c's
#                                                daemon: a third node cabled to both (cables 3
#                                                and 4, shaped alike), a and b using only those
#   podlink_two_hop                              a to b over cable 1 and, striped with it, through
#                                                c over cables 3 and 4 (mesh.two_hop_stripe on a)
# PODLINK_MESH_BENCH_CASES: only these cases (space-separated names; default all).
# Raw results: <output dir>/raw.jsonl (one JSON object per run) and the
# daemons' logs; the table: tests/mesh/table.py <output dir>/raw.jsonl.
# Needs root, iproute2 (ip, tc), openssl and python3. Reports; asserts only
# that every transfer's bytes were right.
set -euo pipefail

build=$(cd "${1:-build}" && pwd)
out=${2:-docs/results/mesh-$(date -u +%Y-%m-%d)-local}
rate=${PODLINK_MESH_BENCH_RATE:-200mbit}
bytes=${PODLINK_MESH_BENCH_BYTES:-134217728}
reps=${PODLINK_MESH_BENCH_REPS:-3}
# kv-put writes the region this many times per run and reports the last write:
# the steady state of a registered region (the daemons' mappings faulted in,
# connections warm), as raw TCP's one reused buffer is.
repeat=${PODLINK_MESH_BENCH_REPEAT:-3}
cases=${PODLINK_MESH_BENCH_CASES:-}
want() { [ -z "$cases" ] || [[ " $cases " == *" $1 "* ]]; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
: > "$out/raw.jsonl"

tag=plmb$$
a=${tag}a
b=${tag}b
c=${tag}c
tmp=$(mktemp -d /tmp/podlink-mesh-bench-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  ip netns del "$c" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

log() { echo "== mesh bench: $*" >&2; }

for ns in "$a" "$b" "$c"; do
  ip netns add "$ns"
  ip -n "$ns" link set lo up
done
# cable <number> <node x> <node y>: 10.78.<number>.1 on x, .2 on y, shaped on x's side (the writer's).
cable() {
  local k=$1 x=$2 y=$3
  ip link add "${tag}c${k}x" netns "$x" type veth peer name "${tag}c${k}y" netns "$y"
  ip -n "$x" addr add "10.78.$k.1/30" dev "${tag}c${k}x"
  ip -n "$y" addr add "10.78.$k.2/30" dev "${tag}c${k}y"
  ip -n "$x" link set "${tag}c${k}x" up
  ip -n "$y" link set "${tag}c${k}y" up
  if [ "$rate" != none ]; then
    ip netns exec "$x" tc qdisc add dev "${tag}c${k}x" root tbf rate "$rate" burst 256kb latency 50ms
  fi
}
cable 1 "$a" "$b"
cable 2 "$a" "$b"
cable 3 "$a" "$c"
cable 4 "$c" "$b"
log "two cables of $rate between $a and $b, one each from both to $c; $bytes bytes per run, $reps runs per case"

# A CA for this run and a certificate per node.
source "$(dirname "$0")/../common/mesh_certs.sh"
mesh_certs "$tmp/certs" node-a node-b node-c
for n in node-a node-b node-c; do mkdir -p "$tmp/$n"; ln -s "$tmp/certs/$n" "$tmp/$n/certs"; done

record() {  # case rep json-from-a-tool
  python3 -c 'import json,sys; d=json.loads(sys.argv[3]); d["case"]=sys.argv[1]; d["rep"]=int(sys.argv[2]); print(json.dumps(d))' \
    "$1" "$2" "$3" >> "$out/raw.jsonl"
}

raw_tcp() {  # case conns addresses...
  local name=$1 conns=$2
  shift 2
  for rep in $(seq 1 "$reps"); do
    local port=9100 servers=() outs=()
    for addr in "$@"; do
      ip netns exec "$b" "$build/tests/tcp_blast" serve "$port" "$conns" > "$tmp/serve.$port" &
      servers+=($!)
      port=$((port + 1))
    done
    sleep 0.3
    port=9100
    local senders=()
    local share=$((bytes / $#))
    for addr in "$@"; do
      ip netns exec "$a" "$build/tests/tcp_blast" send "$addr" "$port" "$share" "$conns" > "$tmp/send.$port" &
      senders+=($!)
      port=$((port + 1))
    done
    local t0 t1
    t0=$(date +%s.%N)
    wait "${senders[@]}"
    t1=$(date +%s.%N)
    wait "${servers[@]}"
    local secs
    secs=$(python3 -c "print($t1 - $t0)")
    record "$name" "$rep" "{\"bytes\": $bytes, \"seconds\": $secs, \"gbit_per_s\": $(python3 -c "print($bytes * 8 / ($t1 - $t0) / 1e9)")}"
    log "$name run $rep: $(tail -1 "$out/raw.jsonl")"
  done
}

start_node() {  # a|b|c interfaces (JSON list) [more mesh keys]
  local n=$1 ifs=$2 extra=${3:-}
  local ns=${tag}$n
  mkdir -p "$tmp/node-$n/run"
  cat > "$tmp/node-$n/config.json" <<EOF
{"node": {"name": "node-$n", "id": "node-$n"},
 "mesh": {"enabled": true, "cert_dir": "$tmp/node-$n/certs", "interfaces": $ifs $extra},
 "pods": [{"match": {"uid": 0}, "namespace": "bench", "name": "writer",
           "annotations": {"podlink.io/peer-group": "bench"}}]}
EOF
  ip netns exec "$ns" "$build/daemon/podlinkd" --socket-dir "$tmp/node-$n/run" --config "$tmp/node-$n/config.json" \
    --no-gpu --metrics-addr 127.0.0.1:0 2>> "$out/podlinkd-node-$n.log" &
  pids+=($!)
  for _ in $(seq 1 500); do [ -S "$tmp/node-$n/run/podlink.fd.sock" ] && break; sleep 0.01; done
}

start_daemons() {  # interfaces-of-a (JSON list) interfaces-of-b
  start_node a "$1"
  start_node b "$2"
}

stop_daemons() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
}

podlink_case() {  # case
  local name=$1
  for rep in $(seq 1 "$reps"); do
    PODLINK_SOCKET_DIR=$tmp/node-b/run "$build/client-lib/tools/podlink-demo" kv-serve --size "$bytes" --verify 9 \
      > "$tmp/serve.out" 2> "$tmp/serve.err" &
    local server=$!
    for _ in $(seq 1 500); do grep -q '"serving"' "$tmp/serve.out" 2>/dev/null && break; sleep 0.01; done
    local desc
    desc=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["descriptor"])' "$tmp/serve.out")
    PODLINK_SOCKET_DIR=$tmp/node-a/run "$build/client-lib/tools/podlink-demo" kv-put --desc "$desc" --seed 9 \
      --repeat "$repeat" \
      > "$tmp/put.out" 2> "$tmp/put.err"
    wait "$server"
    local put verified
    put=$(grep '"put"' "$tmp/put.out")
    verified=$(grep '"verified"' "$tmp/serve.out")
    python3 - "$verified" <<'EOF'
import json, sys
v = json.loads(sys.argv[1])
if v["mismatches"] != 0:
    sys.exit("mesh bench: %d bytes differed" % v["mismatches"])
EOF
    record "$name" "$rep" "$(python3 -c 'import json,sys; p=json.loads(sys.argv[1]); print(json.dumps({"bytes": p["bytes"], "seconds": p["seconds"], "gbit_per_s": p["bytes"]*8/p["seconds"]/1e9, "first_seconds": p["first_seconds"], "repeat": p["repeat"], "transport": p["transport"], "checked": True}))' "$put")"
    log "$name run $rep: $(tail -1 "$out/raw.jsonl")"
  done
}

want raw_tcp_1cable_1conn && raw_tcp raw_tcp_1cable_1conn 1 10.78.1.2
want raw_tcp_1cable_4conn && raw_tcp raw_tcp_1cable_4conn 4 10.78.1.2
want raw_tcp_2cables_4conn && raw_tcp raw_tcp_2cables_4conn 4 10.78.1.2 10.78.2.2

if want podlink_1cable; then
  start_daemons "[\"${tag}c1x\"]" "[\"${tag}c1y\"]"
  podlink_case podlink_1cable
  stop_daemons
fi
if want podlink_2cables; then
  start_daemons "[\"${tag}c1x\", \"${tag}c2x\"]" "[\"${tag}c1y\", \"${tag}c2y\"]"
  podlink_case podlink_2cables
  stop_daemons
fi
# Through a relay: a knows c from configuration (every address of c, so its
# cable to b shows); b is reached only through c.
if want podlink_relay; then
  start_node a "[\"${tag}c3x\"]" ', "peers": [{"node": "node-c", "addresses": ["10.78.3.2/30", "10.78.4.1/30"]}]'
  start_node c "[\"${tag}c3y\", \"${tag}c4x\"]"
  start_node b "[\"${tag}c4y\"]"
  podlink_case podlink_relay
  grep -q "event=mesh_relay_grant" "$out/podlinkd-node-c.log" || { echo "mesh bench: node c relayed nothing" >&2; exit 1; }
  stop_daemons
fi
# Two-hop striping: a reaches b over cable 1, and also through c (cables 3
# and 4); a stripes its transfers to b over both routes.
if want podlink_two_hop; then
  start_node a "[\"${tag}c1x\", \"${tag}c3x\"]" \
    ', "two_hop_stripe": true, "peers": [{"node": "node-c", "addresses": ["10.78.3.2/30", "10.78.4.1/30"]}]'
  start_node c "[\"${tag}c3y\", \"${tag}c4x\"]"
  start_node b "[\"${tag}c1y\", \"${tag}c4y\"]"
  podlink_case podlink_two_hop
  grep -q "event=mesh_two_hop destination=node-b relay=node-c" "$out/podlinkd-node-a.log" ||
    { echo "mesh bench: node a opened no route through node c" >&2; exit 1; }
  stop_daemons
fi

{
  echo "machine: $(nproc) cores, $(uname -r); cable: veth + tc tbf $rate; $bytes bytes per run"
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ); commit: $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$out/machine.txt"
python3 "$(dirname "$0")/table.py" "$out/raw.jsonl" | tee "$out/table.md"
