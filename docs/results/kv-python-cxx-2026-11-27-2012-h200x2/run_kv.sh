#!/usr/bin/env bash
# Issue 33: `import podlink` KV hand-off against podlink-bench --kv-open, 10 rounds x 100 iterations.
# Run from the repository root on the device machine; everything ends up in $OUT/all.tgz (+ $OUT/kv_rounds.md).
set -uo pipefail
: "${OUT:?OUT not set}"
ROOT=$(pwd)
{
  echo "start: $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi -L
  nvidia-smi topo -m
  echo "bundle: $(cat .devcarry/COMMIT)"
} > "$OUT/machine-extra.txt" 2>&1
rm -rf kv
export NCCL_NVLS_ENABLE=0
NCCL_TESTS_COLLS="" NCCL_TESTS_SETUPS="plugin native" NCCL_TESTS_KV_PODLINK=1 NCCL_TESTS_TENSOR=0 KV_ROUNDS=10 KV_ITERS=100 \
  bash tests/gpu/nccl_tests.sh kv > "$OUT/kv.out" 2>&1
echo "nccl_tests.sh exit: $?" >> "$OUT/kv.out"
echo "end nccl_tests: $(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$OUT/machine-extra.txt"
[ -d kv ] && cp -r kv "$OUT/kv"
python3 tests/gpu/kv_rounds.py "$OUT/kv/plugin/kvpl.rank1.log" > "$OUT/kv_rounds.md" 2> "$OUT/kv_rounds.err"
echo "kv_rounds.py exit: $?" >> "$OUT/kv_rounds.err"
cp "$ROOT/.devcarry/run_kv.sh" "$OUT/run_kv.sh"
cd "$OUT" && tar czf all.tgz --exclude=all.tgz machine-extra.txt kv.out kv_rounds.md kv_rounds.err run_kv.sh $( [ -d kv ] && echo kv )
tail -40 "$OUT/kv.out"; cat "$OUT/kv_rounds.err"; cat "$OUT/kv_rounds.md"; cat "$OUT/machine-extra.txt"
for f in "$OUT"/* ; do
  case "$(basename "$f")" in all.tgz|kv_rounds.md) ;; *) rm -rf "$f" ;; esac
done
ls -la "$OUT"
