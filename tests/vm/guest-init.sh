#!/bin/sh
# PID 1 of a test guest (tests/vm/lib.sh): the root is the host's / read-only;
# make the writable places, load soft-RoCE from the unpacked kernel, bring up
# the cables, run the command in /vmout/NAME.cmd and power off.
set -u
arg() { sed -n "s/.*podlink\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
NAME="$(arg name)"; IDX="$(arg idx)"; KROOT="$(arg kroot)"; RUN="$(arg run)"; REPO="$(arg repo)"
for d in /tmp /run /var/tmp /var/run /var/lib /root /etc/podlink /mnt; do mount -t tmpfs tmpfs "$d" 2>/dev/null; done
# A checkout under one of those (a clone in /root or /tmp) is hidden now: the
# root bound once more without the mounts above it (the host's tree as it is),
# and the checkout bound back at its own path.
if [ -n "$REPO" ] && [ ! -e "$REPO/tests/vm/guest-init.sh" ]; then
  mkdir -p /run/hostroot "$REPO"
  { mount --bind / /run/hostroot && mount --bind "/run/hostroot$REPO" "$REPO"; } ||
    echo "guest: the checkout $REPO cannot be shown"
fi
mkdir -p /run/podlink /var/lib/kubelet
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 vmout /mnt
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
hostname "$NAME"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
export PODLINK_VM_NAME="$NAME" PODLINK_VM_IDX="$IDX" PODLINK_VM_OUT=/mnt
ip link set lo up
for m in unix_diag crc32_generic rdma_rxe ib_uverbs rdma_ucm; do modprobe -d "$KROOT" "$m" || echo "guest: modprobe $m failed"; done
rc=0
sh -c "$(cat /mnt/$NAME.cmd)" > /mnt/$NAME.log 2>&1 || rc=$?
echo "$rc" > /mnt/$NAME.rc
sync
echo o > /proc/sysrq-trigger 2>/dev/null
poweroff -f
