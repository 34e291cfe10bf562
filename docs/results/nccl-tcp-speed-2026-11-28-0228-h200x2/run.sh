#!/usr/bin/env bash
# The plugin's TCP transport, reporting its interface's speed (NET/Socket's way), against NET/Socket and against
# the 100 Gb/s it reported before (PODLINK_NCCL_SPEED_MBPS=100000), then one short all_reduce run with NCCL's tuning log
# (which algorithm and protocol NCCL chose at each size).
# Run from the repository root on a two-GPU machine; everything ends up in $OUT/tcpspeed.tar.gz.
set -uo pipefail
export NCCL_NVLS_ENABLE=0  # the harness exports it too
R=/root/tcpspeed/out  # not $OUT (which is /root/out on the device machine)
rm -rf "$R" && mkdir -p "$R"; echo "OUT=$OUT"
nvidia-smi -L > "$R/gpus.txt"
date -u +%Y-%m-%dT%H:%M:%SZ > "$R/started.txt"

# Rounds. -f 2 (not 4): 8*4^k skips 256 KiB, the size of the 0.57 in nccl-tcp-inline-2026-11-27-1602.
A="-b 8 -e 1M -f 2 -g 1 -c 1 -n 200 -w 20"
EXTRA="plugin-tcp||PODLINK_NCCL_TRANSPORT=tcp;plugin-tcp100g||PODLINK_NCCL_TRANSPORT=tcp PODLINK_NCCL_SPEED_MBPS=100000"
round() {  # round NAME SETUPS
  NCCL_TESTS_KV=0 NCCL_TESTS_TIMEOUT=40 NCCL_TESTS_COLLS="sendrecv all_reduce" NCCL_TESTS_SETUPS="$2" \
    NCCL_TESTS_BASE=socket NCCL_TESTS_EXTRA="$EXTRA" NCCL_TESTS_ARGS="$A" NCCL_TESTS_SOCKET_ARGS="$A" \
    timeout -k 5 170 bash tests/gpu/nccl_tests.sh "$R/$1" > "$R/$1.out" 2>&1
  echo "$1: exit $?" | tee -a "$R/exits.txt"
}
round tcp-r1 "socket plugin-tcp plugin-tcp100g"
round tcp-r2 "plugin-tcp100g plugin-tcp socket"

# What NCCL chose and what the plugin was asked to carry: all_reduce only, 64 KiB-1 MiB, few iterations.
T="-b 64K -e 1M -f 2 -g 1 -c 1 -n 20 -w 5"
TEXTRA="plugin-tcp||PODLINK_NCCL_TRANSPORT=tcp;plugin-tcp100g||PODLINK_NCCL_TRANSPORT=tcp PODLINK_NCCL_SPEED_MBPS=100000"
NCCL_DEBUG_TIMESTAMP_LEVELS=INFO,WARN NCCL_DEBUG_TIMESTAMP_FORMAT='%T.%6f_' \
  NCCL_TESTS_KV=0 NCCL_TESTS_TIMEOUT=40 NCCL_TESTS_COLLS="all_reduce" NCCL_TESTS_SETUPS="socket plugin-tcp plugin-tcp100g" \
  NCCL_TESTS_BASE=socket NCCL_TESTS_EXTRA="$TEXTRA" \
  NCCL_TESTS_DEBUG_SUBSYS=INIT,NET,ENV,P2P,TUNING NCCL_TESTS_ARGS="$T" NCCL_TESTS_SOCKET_ARGS="$T" \
  timeout -k 5 150 bash tests/gpu/nccl_tests.sh "$R/tuning" > "$R/tuning.out" 2>&1
echo "tuning: exit $?" | tee -a "$R/exits.txt"

# Tables, from the raw output.
P=tests/gpu/nccl_rounds_table.py
python3 $P --base socket --setup plugin-tcp "$R/tcp-r1" "$R/tcp-r2" > "$R/rounds-tcp.md" 2>&1
python3 $P --base socket --setup plugin-tcp100g "$R/tcp-r1" "$R/tcp-r2" > "$R/rounds-tcp100g.md" 2>&1
python3 $P --base plugin-tcp100g --setup plugin-tcp "$R/tcp-r1" "$R/tcp-r2" > "$R/rounds-tcp-vs-tcp100g.md" 2>&1
for s in socket plugin-tcp plugin-tcp100g; do
  grep -h 'AllReduce: .*Bytes ->' "$R/tuning/$s/all_reduce.rank0.nccl.log" 2>/dev/null | sed 's/^.*NCCL INFO //' |
    sort | uniq -c | sort -k3,3n > "$R/tuning/$s/all_reduce.algo.txt"
done
date -u +%Y-%m-%dT%H:%M:%SZ > "$R/ended.txt"
cat "$R/exits.txt" "$R/rounds-tcp.md" "$R/rounds-tcp100g.md" "$R/rounds-tcp-vs-tcp100g.md"
for s in socket plugin-tcp plugin-tcp100g; do echo "== $s"; cat "$R/tuning/$s/all_reduce.algo.txt"; done
grep -h "NET/podlink v1" "$R"/tuning/plugin-tcp*/all_reduce.rank0.nccl.log | sed "s/^.*NCCL INFO //"
tail -5 "$R/tuning.out"
(cd /root/tcpspeed && tar czf "$OUT/tcpspeed.tar.gz" out)
ls -la "$OUT"
