#!/usr/bin/env bash
# Builds `import podlink` on the GPU machine against its python (its torch's): SITE/podlink/ holds the package
# and the module, whose run path reaches the bundle's libraries (.devcarry/lib, DT_RPATH so that
# libpodlink.so.0 finds its own there too). .devcarry/include carries the Abseil and pybind11 headers.
#
#   bash tests/gpu/build_python.sh SITE          (from the repository root; PODLINK_PYTHON: the interpreter)
set -uo pipefail
ROOT=$(pwd)
SITE=$1
LIB=$ROOT/.devcarry/lib
PY=${PODLINK_PYTHON:-python3}
mkdir -p "$SITE/podlink"
cp client-lib/python/podlink/__init__.py client-lib/python/podlink/__init__.pyi "$SITE/podlink/"
INC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SUFFIX=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [ ! -f "$INC/Python.h" ]; then
  echo "no Python.h for $("$PY" -V) in $INC: the module cannot be built here"
  exit 2
fi
absl=()
for f in "$LIB"/libabsl_*.so*; do absl+=("-l:$(basename "$f")"); done
g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden -I"$INC" -I"$ROOT/.devcarry/include" -I"$ROOT/client-lib/include" \
  client-lib/python/_podlink.cc -o "$SITE/podlink/_podlink$SUFFIX" -L"$LIB" -l:libpodlink.so.0 \
  -Wl,--as-needed "${absl[@]}" -Wl,--disable-new-dtags -Wl,-rpath,"$LIB" || { echo "building the module failed"; exit 1; }
