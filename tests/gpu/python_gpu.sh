#!/usr/bin/env bash
# `import podlink` on the GPU machine (tests/gpu/python_gpu.py), from the repository root with the bundle of
# scripts/device-bundle.sh in .devcarry/: builds the pybind11 module there against that machine's python
# (its torch's; .devcarry/include carries the Abseil and pybind11 headers), starts a podlinkd, runs the checks (DT_RPATH: libpodlink.so.0 finds its own libraries in the bundle too)
# and the benchmark.
#
#   bash tests/gpu/python_gpu.sh [OUT_DIR]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
ROOT=$(pwd)
OUT=${1:-/tmp/podlink-python-gpu}
LIB=$ROOT/.devcarry/lib
PY=${PODLINK_PYTHON:-python3}
mkdir -p "$OUT/site/podlink"
cp client-lib/python/podlink/__init__.py client-lib/python/podlink/__init__.pyi "$OUT/site/podlink/"
INC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SUFFIX=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [ ! -f "$INC/Python.h" ]; then
  echo "no Python.h for $("$PY" -V) in $INC: the module cannot be built here"
  exit 2
fi
absl=()
for f in "$LIB"/libabsl_*.so*; do absl+=("-l:$(basename "$f")"); done
g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden -I"$INC" -I"$ROOT/.devcarry/include" -I"$ROOT/client-lib/include" \
  client-lib/python/_podlink.cc -o "$OUT/site/podlink/_podlink$SUFFIX" -L"$LIB" -l:libpodlink.so.0 \
  -Wl,--as-needed "${absl[@]}" -Wl,--disable-new-dtags -Wl,-rpath,"$LIB" || { echo "building the module failed"; exit 1; }
SOCK=$(mktemp -d /tmp/podlink-py-gpu.XXXXXX)
LD_LIBRARY_PATH=$LIB "$ROOT/.devcarry/bin/podlinkd" --socket-dir "$SOCK" 2> "$OUT/podlinkd.log" &
DPID=$!
for _ in $(seq 300); do grep -q event=ready "$OUT/podlinkd.log" && break; sleep 0.1; done
PYTHONPATH=$OUT/site PODLINK_SOCKET_DIR=$SOCK timeout 600 "$PY" tests/gpu/python_gpu.py 2>&1 | tee "$OUT/python_gpu.log"
rc=${PIPESTATUS[0]}
kill "$DPID" 2>/dev/null
wait "$DPID" 2>/dev/null
exit "$rc"
