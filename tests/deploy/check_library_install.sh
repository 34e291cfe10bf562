#!/usr/bin/env bash
# Runs a rendered DaemonSet's install-client-library init container command,
# exactly as rendered, in a root made for it: the image's library directory
# /usr/local/lib/podlink holds new libraries, and the init container's volume
# (the node's --host-lib-dir) holds the old ones. While it runs, a process
# outside has every old library mapped as ld.so maps one (private, read-only,
# descriptor closed) and keeps reading it. The reader must survive and see
# the old bytes throughout and after; the node's directory must then hold
# exactly the new files. A first install into an empty directory is run too.
#
#   check_library_install.sh RENDERED.yaml LABEL
set -euo pipefail
rendered=$1 label=$2
fail() { echo "FAIL ($label): $*"; exit 1; }
work=$(mktemp -d)
reader=""
cleanup() {
  if [ -n "$reader" ]; then kill "$reader" 2> /dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
python3 - "$rendered" "$work" <<'PY' || fail "cannot read the install-client-library init container from $rendered"
import shlex, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
ds = next(d for d in docs if d["kind"] == "DaemonSet")
pod = ds["spec"]["template"]["spec"]
init = next(c for c in pod.get("initContainers", []) if c["name"] == "install-client-library")
cmd = init.get("command", []) + init.get("args", [])
assert cmd, "the init container has no command"
mounts = init.get("volumeMounts", [])
assert len(mounts) == 1, f"expected the one host library volume, got {mounts}"
vol = next(v for v in pod["volumes"] if v["name"] == mounts[0]["name"])
assert "hostPath" in vol, vol
# The directory the init container fills is the one podlinkd's device plugin hands to pods.
podlinkd = next(c for c in pod["containers"] if c["name"] == "podlinkd")
host_lib = [a.split("=", 1)[1] for a in podlinkd.get("args", []) if a.startswith("--host-lib-dir=")]
assert host_lib == [vol["hostPath"]["path"]], (host_lib, vol)
open(sys.argv[2] + "/cmd", "w").write(shlex.join(cmd))
open(sys.argv[2] + "/mount", "w").write(mounts[0]["mountPath"])
PY
echo "$label: install-client-library runs: $(cat "$work/cmd")"

# The image's libraries (new) and what an older image installed (old): other
# sizes, other bytes on every page.
libs="libpodlink.so.0 libnccl-net-podlink.so"
mkdir -p "$work/image" "$work/node-lib"
for lib in $libs; do
  head -c 3145728 /dev/urandom > "$work/image/$lib"
done

# Runs the command once, in a new root: the node's /usr and /etc read-only,
# the image's library directory, and the node's library directory at the
# init container's mount path.
install() {
  WORK=$work IMAGE_LIB=/usr/local/lib/podlink unshare --mount --fork bash -c '
    set -eu
    mount --make-rprivate /
    root=$WORK/root
    mkdir -p "$root"
    mount -t tmpfs podlink-test "$root"
    for d in bin sbin lib lib32 lib64 libx32 usr etc; do
      if [ -L "/$d" ]; then
        cp -P "/$d" "$root/$d"
      elif [ -d "/$d" ]; then
        mkdir "$root/$d"
        mount --bind "/$d" "$root/$d"
        mount -o remount,bind,ro "$root/$d"
      fi
    done
    mount -t tmpfs podlink-test "$root/usr/local"  # the image'"'"'s, not the node'"'"'s
    mkdir -p "$root$IMAGE_LIB"
    cp "$WORK"/image/* "$root$IMAGE_LIB/"
    mount_path=$(cat "$WORK/mount")
    mkdir -p "$root$mount_path"
    mount --bind "$WORK/node-lib" "$root$mount_path"
    eval "cmd=($(cat "$WORK/cmd"))"
    env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin chroot "$root" "${cmd[@]}"
  '
}

installed_as_image() {  # $1: which install
  [ "$(cd "$work/node-lib" && ls -A | sort | tr '\n' ' ')" = "$(cd "$work/image" && ls -A | sort | tr '\n' ' ')" ] \
    || fail "$1: the node's library directory holds $(ls -A "$work/node-lib" | tr '\n' ' ')(expected $libs)"
  for lib in $libs; do
    cmp -s "$work/image/$lib" "$work/node-lib/$lib" || fail "$1: $lib on the node is not the image's"
  done
}

# A node without the library yet.
install || fail "the init container's command failed on an empty library directory"
installed_as_image "first install"

# An upgrade while a process has the old libraries loaded.
for lib in $libs; do
  rm -f "$work/node-lib/$lib"
  head -c 8388608 /dev/urandom > "$work/node-lib/$lib"
done
cat > "$work/reader.py" <<'PY'
import hashlib, mmap, os, sys
ready, stop, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
maps = []
for p in paths:
    fd = os.open(p, os.O_RDONLY)
    m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)  # as ld.so maps a library
    os.close(fd)
    maps.append((p, m, hashlib.sha256(m).digest()))
open(ready, "w").close()
rounds = 0
while True:
    last = os.path.exists(stop)  # one more whole pass after the install finished
    for p, m, digest in maps:
        if hashlib.sha256(m).digest() != digest:
            print(f"{p}: the mapped library's bytes changed under the process")
            sys.exit(3)
    rounds += 1
    if last:
        break
print(f"the reader read every mapped library {rounds} times and always saw the old bytes")
PY
mapped=()
for lib in $libs; do mapped+=("$work/node-lib/$lib"); done
python3 "$work/reader.py" "$work/ready" "$work/stop" "${mapped[@]}" &
reader=$!
for _ in $(seq 100); do [ -e "$work/ready" ] && break; sleep 0.1; done
[ -e "$work/ready" ] || fail "the reader did not map the old libraries"
install || fail "the init container's command failed over an installed library"
touch "$work/stop"
set +e
wait "$reader"
rc=$?
set -e
reader=""
if [ $rc -gt 128 ]; then
  fail "the process with the old library mapped was killed by signal $(kill -l $((rc - 128))) during the install"
fi
[ $rc = 0 ] || fail "the process with the old library mapped saw it change during the install"
installed_as_image "upgrade"
echo "$label: the init container installs the library by rename: a process with the old one mapped kept it"
