#!/usr/bin/env bash
# Builds the podlinkd OCI image from a build directory, with umoci, from
# Debian's packages only: the project's binaries, the shared libraries they
# load (copied from this machine's Debian packages, glibc included) and
# busybox-static for the shell the init container and probes use.
#
#   scripts/build-image.sh [BUILD_DIR] [OUT_DIR]      (defaults: build, build/image)
#
# Writes OUT_DIR/podlinkd-VERSION.oci.tar (an OCI image layout as a tar, image
# podlink/podlinkd:VERSION) and OUT_DIR/pause.oci.tar (podlink/pause:VERSION:
# busybox sleeping, the sandbox image the runtime test gives containerd, which
# cannot pull one). Load with `ctr -n k8s.io images import FILE` or `skopeo
# copy oci-archive:FILE docker://REGISTRY/podlink/podlinkd:VERSION`.
#
# Layout of the podlinkd image:
#   /usr/local/bin/podlinkd, kubectl-podlink      entrypoint: podlinkd
#   /usr/local/lib/podlink/                       what the init container installs on the host:
#                                                 libpodlink.so.0, libnccl-net-podlink.so, podlink-demo
#   /usr/lib/x86_64-linux-gnu, /lib64             their shared libraries
#   /bin/busybox and its applets (sh, cp, mv, ...)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath "${1:-$ROOT/build}")
OUT=$(realpath -m "${2:-$BUILD/image}")
VERSION=$(sed -n 's/^project(podlink VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
for tool in umoci busybox; do
  command -v "$tool" > /dev/null || { echo "build-image: $tool missing (apt-get install umoci busybox-static)" >&2; exit 1; }
done
{ ldd /bin/busybox 2>&1 || true; } | grep -q "not a dynamic executable" ||
  { echo "build-image: /bin/busybox is not busybox-static (apt-get install busybox-static)" >&2; exit 1; }

bins=("$BUILD/daemon/podlinkd" "$BUILD/client-lib/tools/kubectl-podlink")
client=("$BUILD/client-lib/libpodlink.so.0" "$BUILD/client-lib/libnccl-net-podlink.so"
        "$BUILD/client-lib/tools/podlink-demo")
for f in "${bins[@]}" "${client[@]}"; do
  [ -e "$f" ] || { echo "build-image: $f not built (scripts/build.sh)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT"

# make_image NAME ROOTFS OUT_FILE CONFIG-ARGS...: OUT_DIR/OUT_FILE, an OCI archive of ROOTFS as image
# docker.io/podlink/NAME:VERSION, configured with umoci's CONFIG-ARGS.
make_image() {
  local name=$1 rootfs=$2 file=$3; shift 3
  local layout=$work/$name-layout
  umoci init --layout "$layout"
  umoci new --image "$layout:$VERSION"
  umoci unpack --image "$layout:$VERSION" "$work/$name-bundle" > /dev/null
  cp -a "$rootfs/." "$work/$name-bundle/rootfs/"
  umoci repack --image "$layout:$VERSION" "$work/$name-bundle"
  umoci config --image "$layout:$VERSION" --os linux --architecture amd64 \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin --config.workingdir / \
    --config.label org.opencontainers.image.version="$VERSION" \
    --config.label org.opencontainers.image.title="$name" "$@"
  umoci gc --layout "$layout"
  # The layout's index names the image by tag only; runtimes want the full reference.
  python3 - "$layout/index.json" "docker.io/podlink/$name:$VERSION" <<'PY'
import json, sys
path, ref = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["org.opencontainers.image.ref.name"] = ref
json.dump(index, open(path, "w"))
PY
  tar -C "$layout" -cf "$OUT/$file.tmp" .
  mv "$OUT/$file.tmp" "$OUT/$file"
}

busybox_into() {  # busybox_into ROOTFS
  mkdir -p "$1/bin"
  cp /bin/busybox "$1/bin/busybox"
  for applet in sh cp mv rm ls cat mkdir sleep echo test env; do ln -sf busybox "$1/bin/$applet"; done
}

# --- podlinkd ---------------------------------------------------------------
rootfs=$work/podlinkd-rootfs
mkdir -p "$rootfs/usr/local/bin" "$rootfs/usr/local/lib/podlink" "$rootfs/usr/lib/x86_64-linux-gnu" "$rootfs/lib64" \
         "$rootfs/tmp" "$rootfs/run" "$rootfs/etc"
chmod 1777 "$rootfs/tmp"
cp "${bins[@]}" "$rootfs/usr/local/bin/"
cp -L "${client[@]}" "$rootfs/usr/local/lib/podlink/"
busybox_into "$rootfs"
# Every shared library the binaries load (resolved here, so from Debian's packages), and the loader.
ldd "${bins[@]}" "${client[@]}" 2>/dev/null | awk '/=> \// {print $3} /^\t\/lib64\// {print $1}' | sort -u |
  while read -r lib; do
    case "$lib" in
      /lib64/*) cp -L "$lib" "$rootfs/lib64/" ;;
      *) cp -L "$lib" "$rootfs/usr/lib/x86_64-linux-gnu/" ;;
    esac
  done
echo "root:x:0:0:root:/:/bin/sh" > "$rootfs/etc/passwd"
echo "root:x:0:" > "$rootfs/etc/group"
strip --strip-debug "$rootfs"/usr/local/bin/* "$rootfs"/usr/local/lib/podlink/* 2>/dev/null || true
# The image must run on its own: every binary's libraries resolve inside the rootfs.
for b in "$rootfs"/usr/local/bin/* "$rootfs/usr/local/lib/podlink/podlink-demo"; do
  missing=$(chroot "$rootfs" /lib64/ld-linux-x86-64.so.2 --list "${b#"$rootfs"}" 2>&1 | grep "not found" || true)
  [ -z "$missing" ] || { echo "build-image: ${b#"$rootfs"} misses: $missing" >&2; exit 1; }
done
chroot "$rootfs" /usr/local/bin/podlinkd --version > /dev/null ||
  { echo "build-image: podlinkd does not run inside its rootfs" >&2; exit 1; }

PODLINKD_TAR=podlinkd-$VERSION.oci.tar
make_image podlinkd "$rootfs" "$PODLINKD_TAR" --config.entrypoint /usr/local/bin/podlinkd

# --- pause ------------------------------------------------------------------
pause=$work/pause-rootfs
busybox_into "$pause"
make_image pause "$pause" pause.oci.tar --config.entrypoint /bin/sleep --config.cmd 2147483647

for f in "$PODLINKD_TAR" pause.oci.tar; do
  echo "image: $OUT/$f ($(du -h "$OUT/$f" | cut -f1))"
done
