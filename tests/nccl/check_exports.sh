#!/usr/bin/env bash
# libnccl-net-podlink.so must export NCCL's four net plugin tables and its
# tuner table as data objects, and nothing else.
set -euo pipefail
lib=$1
got=$(nm -D --defined-only "$lib" | awk '{print $2, $3}' | sort)
want=$(printf 'D ncclNetPlugin_v10\nD ncclNetPlugin_v11\nD ncclNetPlugin_v8\nD ncclNetPlugin_v9\nD ncclTunerPlugin_v4\n' | sort)
if [[ "$got" != "$want" ]]; then
  echo "exported symbols of $lib differ from the four ncclNetPlugin tables and ncclTunerPlugin_v4:" >&2
  diff <(echo "$want") <(echo "$got") >&2 || true
  exit 1
fi
echo "ok: $lib exports exactly ncclNetPlugin_v8..v11 and ncclTunerPlugin_v4"
