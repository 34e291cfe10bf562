#!/usr/bin/env bash
# Where the TCP transport's small all_reduce spends its time against NET/Socket: all_reduce and sendrecv 8 B-1 KiB
# with the plugin's per-operation trace (PODLINK_NCCL_TRACE) and NCCL's tuning log, microsecond stamps.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
R=/root/tcptrace/out
rm -rf "$R" && mkdir -p "$R"
nvidia-smi -L > "$R/gpus.txt"
date -u +%Y-%m-%dT%H:%M:%SZ > "$R/started.txt"
T="-b 8 -e 1K -f 2 -g 1 -c 1 -n 100 -w 10"
EXTRA="plugin-tcp||PODLINK_NCCL_TRANSPORT=tcp PODLINK_NCCL_TRACE=2000000"
for c in all_reduce sendrecv; do
  NCCL_DEBUG_TIMESTAMP_LEVELS=INFO,WARN NCCL_DEBUG_TIMESTAMP_FORMAT='%T.%6f_' \
    NCCL_TESTS_KV=0 NCCL_TESTS_TIMEOUT=60 NCCL_TESTS_COLLS="$c" NCCL_TESTS_SETUPS="socket plugin-tcp" \
    NCCL_TESTS_BASE=socket NCCL_TESTS_EXTRA="$EXTRA" NCCL_TESTS_DEBUG_SUBSYS=INIT,NET,ENV,TUNING \
    NCCL_TESTS_ARGS="$T" NCCL_TESTS_SOCKET_ARGS="$T" timeout -k 5 200 bash tests/gpu/nccl_tests.sh "$R/$c" > "$R/$c.out" 2>&1
  echo "$c: exit $?" | tee -a "$R/exits.txt"
done
python3 .devcarry/tcp_trace_summary.py "$R/all_reduce/plugin-tcp" > "$R/trace-all_reduce.md" 2>&1
tail -40 "$R/trace-all_reduce.md"
grep -h "AllReduce: 8 Bytes" "$R/all_reduce/plugin-tcp/all_reduce.rank0.nccl.log" | head -2
for c in all_reduce sendrecv; do tail -25 "$R/$c.out" | grep -E "^\| $c \|" | head -12; done
(cd /root/tcptrace && tar czf "$OUT/tcptrace.tar.gz" out)
