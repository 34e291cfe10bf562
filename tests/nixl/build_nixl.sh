#!/usr/bin/env bash
# Builds NIXL 1.4.0 (its core, the POSIX plugin, its gtest binary and its Python API) offline, for the tests that
# run libplugin_PODLINK.so under the real NIXL (tests/nixl/run.sh). NIXL is in neither Debian nor npm: its source
# and the sources it needs come from git repositories already on this machine, and nothing of them is committed.
#
#   tests/nixl/build_nixl.sh SRC PREFIX
#
# SRC holds bare or normal git repositories of NIXL, Abseil, Taskflow and toml++ as SRC/nixl, SRC/abseil-cpp,
# SRC/taskflow and SRC/tomlplusplus (or set NIXL_GIT, ABSEIL_GIT, TASKFLOW_GIT, TOMLPP_GIT to their git
# directories). PREFIX receives the build: PREFIX/nixl (NIXL installed), PREFIX/deps (Abseil 20250814.1 and the
# header-only dependencies), PREFIX/build (NIXL's build tree, with test/gtest/gtest), PREFIX/env.sh (what to source
# to use it). About 5 minutes on 2 cores. Debian packages: meson, ninja-build, libasio-dev, liburing-dev,
# libaio-dev, libgtest-dev, libgmock-dev, pybind11-dev, python3-dev, python3-numpy (installed if missing).
#
# With PODLINK_PLUGIN set to libplugin_PODLINK.so, NIXL's own transfer test gets one more instantiation,
# TestTransfer for "PODLINK" (its file gains one line in PREFIX's copy of the source).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 SRC PREFIX" >&2; exit 2; }
src=$(cd "$1" && pwd)
mkdir -p "$2"
prefix=$(cd "$2" && pwd)
jobs=$(nproc)
# The versions NIXL 1.4.0 was released with (its subprojects' wraps name the same).
nixl_rev=c0a1102b94d173049a5478c23e765ba37681e2ca         # v1.4.0
abseil_rev=d38452e1ee03523a208362186fd42248ff2609f6       # 20250814.1
taskflow_rev=2dfa50a567d48b8439807f5da8a041ba64d4fb63     # v3.10.0
tomlpp_rev=30172438cee64926dc41fdd9c11fb3ba5b2ba9de       # v3.4.0

gitdir() {  # a repository's git directory: bare (SRC/name) or not (SRC/name/.git)
  local d=$1
  if [ -d "$d/.git" ]; then echo "$d/.git"; elif [ -d "$d/repo" ]; then echo "$d/repo"; else echo "$d"; fi
}
NIXL_GIT=${NIXL_GIT:-$(gitdir "$src/nixl")}
ABSEIL_GIT=${ABSEIL_GIT:-$(gitdir "$src/abseil-cpp")}
TASKFLOW_GIT=${TASKFLOW_GIT:-$(gitdir "$src/taskflow")}
TOMLPP_GIT=${TOMLPP_GIT:-$(gitdir "$src/tomlplusplus")}

step() { echo "== build_nixl: $* ($(date +%T))"; }

pkgs=(meson ninja-build libasio-dev liburing-dev libaio-dev libgtest-dev libgmock-dev pybind11-dev python3-dev
      python3-numpy pkg-config cmake)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

unpack() {  # git dir, revision, destination
  rm -rf "$3" && mkdir -p "$3"
  git --git-dir="$1" archive "$2" | tar -x -C "$3"
}

deps=$prefix/deps
if [ ! -f "$deps/.abseil-$abseil_rev" ]; then
  step "Abseil $abseil_rev (shared, PIC, C++20)"
  unpack "$ABSEIL_GIT" "$abseil_rev" "$prefix/src/abseil-cpp"
  cmake -S "$prefix/src/abseil-cpp" -B "$prefix/build-abseil" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g0" -DBUILD_SHARED_LIBS=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_CXX_STANDARD=20 -DABSL_PROPAGATE_CXX_STD=ON -DABSL_BUILD_TESTING=OFF -DCMAKE_INSTALL_PREFIX="$deps" \
    -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
  cmake --build "$prefix/build-abseil" -j "$jobs" >/dev/null
  cmake --install "$prefix/build-abseil" >/dev/null
  touch "$deps/.abseil-$abseil_rev"
fi

step "header-only dependencies and their pkg-config files"
unpack "$TASKFLOW_GIT" "$taskflow_rev" "$prefix/src/taskflow"
unpack "$TOMLPP_GIT" "$tomlpp_rev" "$prefix/src/tomlplusplus"
mkdir -p "$deps/include" "$deps/pc"
rm -rf "$deps/include/taskflow" "$deps/include/toml++"
cp -a "$prefix/src/taskflow/taskflow" "$deps/include/taskflow"
cp -a "$prefix/src/tomlplusplus/include/toml++" "$deps/include/toml++"
# Debian's asio has no .pc file; NIXL wants standalone asio.
cat > "$deps/pc/asio.pc" <<EOF
Name: asio
Description: standalone asio (Debian's libasio-dev)
Version: $(dpkg-query -W -f='${Version}' libasio-dev | sed 's/^[0-9]*://; s/[-+].*//')
Cflags: -DASIO_STANDALONE
EOF
cat > "$deps/pc/taskflow.pc" <<EOF
Name: taskflow
Description: Taskflow (headers)
Version: 3.10.0
Cflags: -I$deps/include
EOF
cat > "$deps/pc/tomlplusplus.pc" <<EOF
Name: tomlplusplus
Description: toml++ (headers)
Version: 3.4.0
Cflags: -I$deps/include
EOF
# pkg-config sees this Abseil, the stand-ins and Debian's other .pc files, never Debian's older Abseil.
sysdir=$deps/pc-debian
rm -rf "$sysdir" && mkdir -p "$sysdir"
for d in /usr/lib/x86_64-linux-gnu/pkgconfig /usr/lib/pkgconfig /usr/share/pkgconfig; do
  [ -d "$d" ] || continue
  for f in "$d"/*.pc; do
    case $(basename "$f") in absl_*) ;; *) ln -sf "$f" "$sysdir/";; esac
  done
done
export PKG_CONFIG_LIBDIR="$deps/lib/pkgconfig:$deps/pc:$sysdir"

step "NIXL v1.4.0 ($nixl_rev): configure"
unpack "$NIXL_GIT" "$nixl_rev" "$prefix/src/nixl"
if [ -n "${PODLINK_PLUGIN:-}" ]; then
  # NIXL's transfer test, parametrized by backend name: one more instantiation for PODLINK (no progress
  # thread, one worker, no extra parameters), as its other backends are added.
  printf '\nnamespace gtest {\nNIXL_INSTANTIATE_TEST(podlink, TestTransfer, "PODLINK", false, 1, 0, "");\n}\n' \
    >> "$prefix/src/nixl/test/gtest/test_transfer.cpp"
fi
# A CUDA toolkit on the machine would be found regardless of the options: hide it (a CPU build).
export CUDA_PATH=$prefix/no-cuda CUDA_HOME=$prefix/no-cuda
rm -rf "$prefix/build"
(cd "$prefix/src/nixl" && meson setup "$prefix/build" --prefix="$prefix/nixl" --buildtype=debugoptimized \
  --wrap-mode=nodownload -Dwerror=false -Denable_plugins=POSIX -Ddisable_gds_backend=true -Dbuild_tests=true \
  -Dbuild_examples=false -Drust=false -Dbuild_docs=false \
  >"$prefix/meson-setup.log" 2>&1) || { tail -40 "$prefix/meson-setup.log"; exit 1; }
step "NIXL: build"
ninja -C "$prefix/build" -j "$jobs" >"$prefix/ninja.log" 2>&1 || { tail -60 "$prefix/ninja.log"; exit 1; }
ninja -C "$prefix/build" install >/dev/null
libdir=$(dirname "$(find "$prefix/nixl" -name 'libnixl.so' | head -1)")
# The Python API: the compiled module NIXL installed, and its pure-Python package (normally built with uv).
pyext=$(find "$prefix/nixl" -name '_bindings*.so' | head -1)
[ -n "$pyext" ] || { echo "build_nixl: NIXL installed no Python module" >&2; exit 1; }
pydir=$prefix/python
rm -rf "$pydir" && mkdir -p "$pydir"
cp -a "$(dirname "$pyext")" "$pydir/"                      # nixl_cu12 (or _cu13): _bindings, _utils, _api, logging
cp -a "$prefix/src/nixl/src/bindings/python/nixl-meta/nixl" "$pydir/nixl"   # the meta package that picks it
cp "$prefix/src/nixl/src/bindings/python/nixl-meta/nixl_meta_utils.py" "$pydir/"
cat > "$prefix/env.sh" <<EOF
# Source this to use the NIXL that tests/nixl/build_nixl.sh built.
export LD_LIBRARY_PATH="$libdir:$deps/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PYTHONPATH="$pydir\${PYTHONPATH:+:\$PYTHONPATH}"
export NIXL_LIBDIR="$libdir"
export NIXL_BUILD="$prefix/build"
EOF
step "done: $libdir/libnixl.so, $prefix/build/test/gtest/gtest, Python in $pydir (source $prefix/env.sh)"
