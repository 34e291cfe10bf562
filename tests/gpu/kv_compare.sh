#!/usr/bin/env bash
# The KV hand-off through `import podlink` and the same hand-off in C++ (podlink-bench --kv-open), in alternating
# rounds against one owner, so the binding's cost shows as the ratio of the two (issue 33). Run in each of two
# pods by tests/gpu/nccl_tests.sh (the kvpl run), from the repository root with the bundle in .devcarry/:
#   PMI_RANK=0  the decode pod: tests/gpu/kv_podlink.py exports the cache by name and waits for the notify
#   PMI_RANK=1  the prefill pod: KV_ROUNDS (default 3) rounds of podlink-bench and kv_podlink.py (which goes
#               first alternates), the same blocks and block ids; then the owner is told it is done. One JSON
#               line per size and run ("impl").
# KV_BLOCKS, KV_ITERS, KV_DEVICE and KV_NAME pass through. Exits non-zero when any run fails or a block is wrong.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PODLINK_PYTHON:-python3}
if [ "${PMI_RANK:-0}" = 0 ]; then
  exec "$PY" "$ROOT/tests/gpu/kv_podlink.py"
fi
rounds=${KV_ROUNDS:-3}
blocks=${KV_BLOCKS:-16K:4096,64K:2048,256K:1024,1M:256,4M:64}
rc=0
cxx() {
  LD_LIBRARY_PATH="$ROOT/.devcarry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$ROOT/.devcarry/bin/podlink-bench" \
    --kv-open "${KV_NAME:-kv-bench}" --kv-blocks "$blocks" --kv-iters "${KV_ITERS:-10}" --src-gpu "${KV_DEVICE:-0}"
}
py() { KV_NOTIFY=0 KV_BLOCKS=$blocks "$PY" "$ROOT/tests/gpu/kv_podlink.py"; }
for r in $(seq "$rounds"); do  # which goes first alternates between rounds
  if [ $((r % 2)) = 1 ]; then cxx || rc=1; py || rc=1; else py || rc=1; cxx || rc=1; fi
done
KV_BLOCKS="" "$PY" "$ROOT/tests/gpu/kv_podlink.py" || rc=1  # tells the owner it is done
exit $rc
