#!/usr/bin/env bash
# Packs the built binaries and the shared libraries they need (except glibc
# and the C++ runtime, which the GPU machine has in newer versions) into
# .devcarry/, which the device tool carries to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PODLINK_BUILD_DIR:-build}
OUT=.devcarry
rm -rf "$OUT" && mkdir -p "$OUT/bin" "$OUT/lib"
bins=("$BUILD/daemon/podlinkd" "$BUILD/client-lib/tools/podlink-demo" "$BUILD/client-lib/tools/podlink-bench"
      "$BUILD/tests/gpu_broker_test" "$BUILD/tests/gpu_dmabuf_test" "$BUILD/tests/nccl_net_conformance_test" "$BUILD/tests/nccl_net_peer" "$BUILD/tests/mesh_test"
      "$BUILD/client-lib/tools/kubectl-podlink" "$BUILD/tests/tcp_blast")
cp "${bins[@]}" "$OUT/bin/"
ldd "${bins[@]}" "$BUILD/client-lib/libpodlink.so.0" "$BUILD/client-lib/libnccl-net-podlink.so" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    *) cp -L "$lib" "$OUT/lib/" ;;
  esac
done
# The NCCL net plugin next to the libpodlink.so.0 it loads ($ORIGIN).
cp "$BUILD/client-lib/libnccl-net-podlink.so" "$OUT/lib/"
cp -L "$BUILD/client-lib/libpodlink.so.0" "$OUT/lib/"
# iproute2 for veth pairs (the GPU machine has no `ip`): Debian packages
# unpacked into $OUT/iproute, run there through the dynamic loader.
if [ ! -d "${IPROUTE_CACHE:=/var/tmp/podlink-iproute}/bin" ]; then
  rm -rf "$IPROUTE_CACHE" && mkdir -p "$IPROUTE_CACHE/debs"
  (cd "$IPROUTE_CACHE/debs" && apt-get download iproute2 libbpf1 libelf1 libmnl0 libcap2 libxtables12 libbsd0 libmd0 \
     libtirpc3 libdb5.3 2>/dev/null || apt-get download iproute2 libbpf1 libelf1 libmnl0 libcap2 libxtables12 libbsd0 libmd0)
  for d in "$IPROUTE_CACHE"/debs/*.deb; do dpkg -x "$d" "$IPROUTE_CACHE/root"; done
  mkdir -p "$IPROUTE_CACHE/bin" "$IPROUTE_CACHE/lib"
  cp "$IPROUTE_CACHE/root/bin/ip" "$IPROUTE_CACHE/bin/"
  find "$IPROUTE_CACHE/root" -name "*.so*" -exec cp -P {} "$IPROUTE_CACHE/lib/" \;
fi
mkdir -p "$OUT/iproute" && cp -r "$IPROUTE_CACHE/bin" "$IPROUTE_CACHE/lib" "$OUT/iproute/"
# NVIDIA's nccl-tests built for two pods without MPI (tests/gpu/nccl_tests.sh), when the shared tools are here.
NT_SRC=${NCCL_TESTS_SRC:-../shared/tools/nccl-tests/bin}
if [ -d "$NT_SRC" ]; then mkdir -p "$OUT/nccl-tests" && cp "$NT_SRC"/*_perf "$OUT/nccl-tests/" && chmod u+w "$OUT"/nccl-tests/*; fi
# Headers to build `import podlink` against the GPU machine's python there (tests/gpu/python_gpu.sh).
mkdir -p "$OUT/include" && cp -r /usr/include/absl /usr/include/pybind11 "$OUT/include/"
strip --strip-debug "$OUT"/bin/* "$OUT"/lib/* 2>/dev/null || true
# Which code the bundle holds (a trailing + when the tree had changes).
{ git rev-parse --short HEAD; git diff --quiet HEAD -- . ':!docs' || echo +; } 2>/dev/null | tr -d '\n' > "$OUT/COMMIT"
du -sh "$OUT"
