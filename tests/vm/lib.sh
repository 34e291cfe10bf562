# tests/vm/lib.sh — boots Debian's own kernel in QEMU guests whose root is this
# machine's / (9p, read-only), so the guests run the build tree as it is, with
# soft-RoCE (rdma_rxe) that this machine's kernel lacks. Sourced by the scripts
# in tests/vm/. Everything comes from Debian packages (qemu-system-x86, kmod,
# busybox-static, cpio, linux-image-amd64 unpacked with dpkg -x, not installed).
#
#   vm_prepare            fetch + unpack the kernel, build the initramfs (cached)
#   vm_start NAME IDX CMD start guest NAME (IDX: 1..) running CMD as root; its
#                         cables are given by VM_CABLES_<NAME> (see vm_start)
#   vm_wait NAME SECONDS  wait for guest NAME to power off; non-zero on timeout
#   vm_begin OUT          prepare, make OUT this run's directory (its stale results gone), stop
#                         every guest on exit
#   vm_show NAME...       each guest's log (its console's tail without one)
#
# Guests see /vmout (read-write, this run's $VM_RUN directory) and power off
# when CMD ends; CMD's exit status is left in $VM_RUN/NAME.rc and its console
# in $VM_RUN/NAME.console.
set -euo pipefail

VM_CACHE="${PODLINK_VM_CACHE:-/var/cache/podlink-vm}"
VM_MEM_MB="${PODLINK_VM_MEM_MB:-1024}"

vm_log() { printf '[vm %s] %s\n' "$(date +%T)" "$*" >&2; }

vm_deps() {
  local missing=()
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  command -v depmod >/dev/null || missing+=(kmod)
  command -v busybox >/dev/null || missing+=(busybox-static)
  command -v cpio >/dev/null || missing+=(cpio)
  command -v rdma >/dev/null || missing+=(iproute2)
  [ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || missing+=(ibverbs-providers)
  command -v ibv_devices >/dev/null || missing+=(ibverbs-utils)
  if [ ${#missing[@]} -gt 0 ]; then
    vm_log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# The kernel: whatever linux-image-amd64 depends on now (6.1 on bookworm).
vm_prepare() {
  vm_deps
  mkdir -p "$VM_CACHE"
  local pkg
  pkg="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')"
  [ -n "$pkg" ] || { apt-get update -qq; pkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')"; }
  [ -n "$pkg" ] || { vm_log "no linux-image-amd64 in apt"; return 1; }
  VM_KVER="${pkg#linux-image-}"
  VM_ROOT="$VM_CACHE/$VM_KVER"
  if [ ! -f "$VM_ROOT/.ready" ]; then
    vm_log "unpacking $pkg into $VM_ROOT"
    rm -rf "$VM_ROOT" "$VM_CACHE/deb"; mkdir -p "$VM_ROOT" "$VM_CACHE/deb"
    (cd "$VM_CACHE/deb" && apt-get download "$pkg" >/dev/null 2>&1)
    dpkg -x "$VM_CACHE"/deb/"$pkg"_*.deb "$VM_ROOT"
    depmod -b "$VM_ROOT" "$VM_KVER"
    touch "$VM_ROOT/.ready"
  fi
  vm_initramfs
  VM_KERNEL="$VM_ROOT/boot/vmlinuz-$VM_KVER"
  VM_INITRD="$VM_ROOT/initrd.cpio"
  export VM_KVER VM_ROOT VM_KERNEL VM_INITRD
}

# A busybox initramfs that loads virtio, 9p and virtio-net, mounts this
# machine's / read-only and hands over to tests/vm/guest-init.sh.
vm_initramfs() {
  local dir="$VM_ROOT/initrd" m
  rm -rf "$dir"; mkdir -p "$dir"/{bin,dev,proc,sys,newroot,modules}
  cp "$(command -v busybox)" "$dir/bin/busybox"
  for m in sh mount insmod switch_root mkdir sleep cat sed poweroff; do ln -s busybox "$dir/bin/$m"; done
  : > "$dir/modules/order"
  for m in virtio_pci 9pnet_virtio 9p virtio_net; do
    modprobe -d "$VM_ROOT" -S "$VM_KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    cp "$ko" "$dir/modules/"; basename "$ko" >> "$dir/modules/order"
  done
  cat > "$dir/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod /modules/$m || echo "initramfs: insmod $m failed"; done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /newroot; then
  echo "initramfs: cannot mount the host root"; poweroff -f
fi
mount --move /proc /newroot/proc; mount --move /sys /newroot/sys; mount --move /dev /newroot/dev
exec switch_root /newroot /bin/sh "$(sed -n 's/.*podlink.init=\([^ ]*\).*/\1/p' /newroot/proc/cmdline)"
INIT
  chmod +x "$dir/init"
  (cd "$dir" && find . | cpio -o -H newc --quiet) > "$VM_ROOT/initrd.cpio"
}

# vm_start NAME IDX CMD... : guest IDX (1-based) gets VM_NICS_<NAME> cables, a
# space-separated list of "listen:PORT" or "connect:PORT" (QEMU socket netdevs:
# a point-to-point Ethernet cable between two guests) or "tap:IFNAME" (a tap
# device the caller made, e.g. on a bridge; QEMU passes the virtio-net header,
# so the guest's NIC offers checksum offload and scatter-gather, which a
# socket netdev cannot). NIC k of the guest is ethk, MAC 52:54:00:00:IDX:k.
vm_start() {
  local name="$1" idx="$2"; shift 2
  local nics_var="VM_NICS_${name}" k=0 args=() cable waited
  for cable in ${!nics_var:-}; do
    # QEMU does not fail a connect to a port nobody listens on yet: it runs
    # with a dead cable. Wait (bounded) for the guest that listens; looking
    # with ss, as a probe connection would take the listener's one accept.
    if [ "${cable%%:*}" = connect ]; then
      waited=0
      until [ -n "$(ss -Hltn "sport = :${cable#*:}" 2>/dev/null)" ]; do
        if [ "$waited" -ge 200 ]; then
          vm_log "$name: nothing listens on cable port ${cable#*:} after 20 s"
          break
        fi
        sleep 0.1; waited=$((waited + 1))
      done
    fi
    if [ "${cable%%:*}" = tap ]; then
      args+=(-netdev "tap,id=n$k,ifname=${cable#*:},script=no,downscript=no")
    else
      args+=(-netdev "socket,id=n$k,${cable%%:*}=127.0.0.1:${cable#*:}")
    fi
    args+=(-device "virtio-net-pci,netdev=n$k,mac=52:54:00:00:$(printf %02x "$idx"):$(printf %02x "$k")")
    k=$((k + 1))
  done
  printf '%s\n' "$@" > "$VM_RUN/$name.cmd"
  qemu-system-x86_64 -machine q35 -accel tcg -cpu max -smp 1 -m "$VM_MEM_MB" \
    -nographic -no-reboot -nodefaults -serial "file:$VM_RUN/$name.console" \
    -kernel "$VM_KERNEL" -initrd "$VM_INITRD" \
    -append "console=ttyS0 panic=-1 quiet loglevel=3 podlink.init=$VM_GUEST_INIT podlink.name=$name podlink.idx=$idx podlink.run=$VM_RUN podlink.kroot=$VM_ROOT podlink.repo=$VM_REPO" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$VM_RUN,mount_tag=vmout,security_model=none,multidevs=remap" \
    "${args[@]}" >"$VM_RUN/$name.qemu.log" 2>&1 &
  echo $! > "$VM_RUN/$name.pid"
}

vm_wait() {
  local name="$1" limit="$2" pid waited=0
  pid="$(cat "$VM_RUN/$name.pid")"
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge "$limit" ]; then
      vm_log "$name still running after ${limit}s; stopping it"
      kill "$pid" 2>/dev/null || true; sleep 1; kill -9 "$pid" 2>/dev/null || true
      return 1
    fi
    sleep 1; waited=$((waited + 1))
  done
  [ -f "$VM_RUN/$name.rc" ] || { vm_log "$name powered off without a result"; return 1; }
  return "$(cat "$VM_RUN/$name.rc")"
}

vm_stop_all() {
  local p
  for p in "$VM_RUN"/*.pid; do [ -f "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null || true; done
}

VM_GUEST_INIT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/guest-init.sh"
# The checkout, which the guests show at its own path even where they mount a
# tmpfs over a directory above it (a clone in /root or /tmp).
VM_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

vm_begin() {
  vm_prepare
  VM_RUN=$1
  export VM_RUN
  # A run's own files only: OUT may hold other things.
  rm -f "$VM_RUN"/*.rc "$VM_RUN"/*.desc-* "$VM_RUN"/*.finished "$VM_RUN"/*.idx "$VM_RUN"/*.handle.*
  trap vm_stop_all EXIT
}

# vm_dirs DEFAULT_OUT [BUILD [OUT]] : sets the caller's build (BUILD, else
# ./build) and out (OUT, else DEFAULT_OUT; "tmp": a new /tmp directory), both
# absolute, out made.
vm_dirs() {
  local default=$1
  shift
  build=$(cd "${1:-build}" && pwd)
  out=${2:-$default}
  [ "$out" = tmp ] && out=$(mktemp -d /tmp/podlink-vm-XXXXXX)
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
}

# vm_wait_all T0 FIRST_LIMIT LIMIT NAME... : waits for the guests in order
# (the first FIRST_LIMIT seconds at most, each after it LIMIT), says how long
# they took since T0 (date +%s) and shows their logs; 1 when one did not end
# well.
vm_wait_all() {
  local t0=$1 limit=$2 rest=$3 rc=0 n
  shift 3
  for n in "$@"; do
    vm_wait "$n" "$limit" || rc=1
    limit=$rest
  done
  vm_log "guests done in $(( $(date +%s) - t0 )) s"
  vm_show "$@"
  return $rc
}

# vm_check WHAT CMD... : runs CMD; prints "ok: WHAT" or "FAILED: WHAT" and
# then sets the caller's rc to 1.
vm_check() {
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; rc=1; fi
}

# vm_machine OUT WHAT : writes OUT/machine.txt (this machine, the guests, the
# date, the commit) with WHAT (the command and its settings) as its last line.
vm_machine() {
  {
    echo "machine: $(nproc) cores, host kernel $(uname -r), guests: Debian $VM_KVER under QEMU TCG, 1 vCPU, ${VM_MEM_MB} MiB each"
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ); commit: $(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "command: $2"
  } > "$1/machine.txt"
}

vm_show() {
  local n
  for n in "$@"; do
    echo "---- $n"
    cat "$VM_RUN/$n.log" 2>/dev/null || { echo "(no log; console tail:)"; tail -n 20 "$VM_RUN/$n.console"; }
  done
}
