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
      "$BUILD/tests/gpu_broker_test")
cp "${bins[@]}" "$OUT/bin/"
ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    *) cp -L "$lib" "$OUT/lib/" ;;
  esac
done
strip --strip-debug "$OUT"/bin/* "$OUT"/lib/* 2>/dev/null || true
du -sh "$OUT"
