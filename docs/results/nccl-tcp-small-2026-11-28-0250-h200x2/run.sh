#!/usr/bin/env bash
# Small all_reduce and sendrecv through the plugin's TCP transport against NET/Socket, with NCCL's tuning log
# (which algorithm, protocol and channels NCCL chose per size), and the plugin with PODLINK_NCCL_LATENCY_US=0
# (NET/Socket reports no latency; the plugin 5 us by default). Two alternating rounds, then a tuning run.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
R=/root/tcpsmall/out
rm -rf "$R" && mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
date -u +%Y-%m-%dT%H:%M:%SZ > "$R/started.txt"
A="-b 8 -e 64K -f 2 -g 1 -c 1 -n 400 -w 40"
EXTRA="plugin-tcp||PODLINK_NCCL_TRANSPORT=tcp;plugin-tcp-lat0||PODLINK_NCCL_TRANSPORT=tcp PODLINK_NCCL_LATENCY_US=0"
round() {
  NCCL_TESTS_KV=0 NCCL_TESTS_TIMEOUT=40 NCCL_TESTS_COLLS="sendrecv all_reduce" NCCL_TESTS_SETUPS="$2" \
    NCCL_TESTS_BASE=socket NCCL_TESTS_EXTRA="$EXTRA" NCCL_TESTS_ARGS="$A" NCCL_TESTS_SOCKET_ARGS="$A" \
    timeout -k 5 170 bash tests/gpu/nccl_tests.sh "$R/$1" > "$R/$1.out" 2>&1
  echo "$1: exit $?" | tee -a "$R/exits.txt"
}
round r1 "socket plugin-tcp plugin-tcp-lat0"
round r2 "plugin-tcp-lat0 plugin-tcp socket"
T="-b 8 -e 64K -f 4 -g 1 -c 1 -n 10 -w 2"
NCCL_TESTS_KV=0 NCCL_TESTS_TIMEOUT=40 NCCL_TESTS_COLLS="all_reduce sendrecv" NCCL_TESTS_SETUPS="socket plugin-tcp plugin-tcp-lat0" \
  NCCL_TESTS_BASE=socket NCCL_TESTS_EXTRA="$EXTRA" NCCL_TESTS_DEBUG_SUBSYS=INIT,NET,ENV,TUNING \
  NCCL_TESTS_ARGS="$T" NCCL_TESTS_SOCKET_ARGS="$T" timeout -k 5 150 bash tests/gpu/nccl_tests.sh "$R/tuning" > "$R/tuning.out" 2>&1
echo "tuning: exit $?" | tee -a "$R/exits.txt"
P=tests/gpu/nccl_rounds_table.py
python3 $P --base socket --setup plugin-tcp "$R/r1" "$R/r2" > "$R/rounds-tcp.md" 2>&1
python3 $P --base socket --setup plugin-tcp-lat0 "$R/r1" "$R/r2" > "$R/rounds-tcp-lat0.md" 2>&1
for s in socket plugin-tcp plugin-tcp-lat0; do
  for c in all_reduce sendrecv; do
    grep -h -E 'AllReduce: .*Bytes ->|SendRecv|Send: |Recv: ' "$R/tuning/$s/$c.rank0.nccl.log" 2>/dev/null | sed 's/^.*NCCL INFO //' |
      sed -E 's/(opCount|[0-9a-fx]{10,})[^ ]*//g' | sort | uniq -c | sort -k1,1nr | head -20 > "$R/tuning/$s/$c.algo.txt"
  done
  grep -h -E "channels|Channel [0-9]+/|p2p channels" "$R/tuning/$s/all_reduce.rank0.nccl.log" | sed 's/^.*NCCL INFO //' | sort -u | head -12 > "$R/tuning/$s/channels.txt"
done
date -u +%Y-%m-%dT%H:%M:%SZ > "$R/ended.txt"
cat "$R/exits.txt" "$R/rounds-tcp.md" "$R/rounds-tcp-lat0.md"
for s in socket plugin-tcp plugin-tcp-lat0; do echo "== $s"; cat "$R/tuning/$s/all_reduce.algo.txt" "$R/tuning/$s/channels.txt"; done
tail -3 "$R/tuning.out"
(cd /root/tcpsmall && tar czf "$OUT/tcpsmall.tar.gz" out)
