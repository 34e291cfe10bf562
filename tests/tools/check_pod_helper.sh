#!/usr/bin/env bash
# scripts/lib/pod.sh as the demo and the GPU scripts use it: two pods, one burstable and one guaranteed, each
# with a private /dev/shm and /tmp and a hostname, pod a with /dev/full hidden, joined by a veth pair. Checks
# the cgroup layout, that each pod's program is PID 1 of its own PID namespace and has network, IPC, UTS and
# mount namespaces other than the host's and the other pod's, that /proc/self/cgroup inside names the scope
# made for it, that the pods talk TCP over the veth, that /dev/shm and /tmp are private and usable, the
# hidden device node, the helper's errors, and that cleanup removes the cgroups. Needs root; exits 77
# (skipped) without a writable cgroup2 mount.
#
#   check_pod_helper.sh
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/lib/pod.sh
source "$REPO/scripts/lib/pod.sh"

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: pods need root (cgroups, unshare)"
  exit 77
fi
CG=$(pod_cgroup_root)
if [ -z "$CG" ]; then
  echo "SKIP: no writable cgroup2 mount in /proc/self/mountinfo"
  exit 77
fi
for tool in unshare nsenter ip python3; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed"; exit 1; }
done

TEST_ROOT=podlink-podcheck-$$
WORK=$(mktemp -d /var/tmp/podlink-podcheck.XXXXXX)  # not under /tmp: the pods get a private /tmp
IF_A=pc$$a IF_B=pc$$b                                # host-wide names for a moment: unique to this run
PORT=7780
PIDS=()
HOST_NAME=$(hostname)
cleanup() {
  local p
  # A pod without its own UTS namespace would have renamed the host.
  [ "$(hostname)" = "$HOST_NAME" ] || hostname "$HOST_NAME"
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  ip link del "$IF_A" 2>/dev/null
  pod_cleanup_cgroups "$TEST_ROOT" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
failures=0

# check DESCRIPTION CMD...: CMD succeeds.
check() {
  local what=$1
  shift
  if "$@"; then
    echo "ok:   $what"
  else
    echo "FAIL: $what"
    failures=$((failures + 1))
  fi
}
# same DESCRIPTION GOT WANT
same() {
  if [ "$2" = "$3" ]; then
    echo "ok:   $1"
  else
    echo "FAIL: $1: got '$2', want '$3'"
    failures=$((failures + 1))
  fi
}
# differ DESCRIPTION A B: two non-empty values that differ.
differ() {
  if [ -n "$2" ] && [ -n "$3" ] && [ "$2" != "$3" ]; then
    echo "ok:   $1"
  else
    echo "FAIL: $1: '$2' vs '$3'"
    failures=$((failures + 1))
  fi
}
# matches DESCRIPTION STRING REGEX
matches() {
  if [[ $2 =~ $3 ]]; then
    echo "ok:   $1"
  else
    echo "FAIL: $1: '$2' does not match $3"
    failures=$((failures + 1))
  fi
}
# field POD KEY: the value a pod reported as "KEY=value".
field() { sed -n "s/^$2=//p" "$WORK/$1.out" | head -1; }
# wait_pid PID SECONDS: the exit status of a background PID, killed (137) if it runs longer.
wait_pid() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.05
  done
  kill -9 "$1" 2>/dev/null
  wait "$1"
}

# --- cgroups ------------------------------------------------------------------
UID_A=$(cat /proc/sys/kernel/random/uuid) UID_B=$(cat /proc/sys/kernel/random/uuid)
CG_A=$(pod_make_cgroup "$TEST_ROOT" "$UID_A" burstable)
CG_B=$(pod_make_cgroup "$TEST_ROOT" "$UID_B" guaranteed)
scope='cri-containerd-[0-9a-f]{64}\.scope$'
matches "burstable layout" "$CG_A" \
  "^$CG/$TEST_ROOT/kubepods\.slice/kubepods-burstable\.slice/kubepods-burstable-pod${UID_A//-/_}\.slice/$scope"
matches "guaranteed layout (no QoS slice)" "$CG_B" "^$CG/$TEST_ROOT/kubepods\.slice/kubepods-pod${UID_B//-/_}\.slice/$scope"
check "both scopes exist" test -d "$CG_A" -a -d "$CG_B"
if [ ! -d "$CG_A" ] || [ ! -d "$CG_B" ]; then
  echo "FAIL: cannot go on without the pods' cgroups"
  exit 1
fi

# --- two pods -----------------------------------------------------------------
# What each pod runs: reports its view as KEY=value lines, writes into its /dev/shm and /tmp, then pod a
# serves one TCP exchange on the veth and pod b makes it. Every wait is bounded.
cat > "$WORK/pod.sh" <<'EOF'
name=$1 work=$2 port=$3 run=$4
echo "pid=$$"
for ns in pid net ipc uts mnt; do echo "ns_$ns=$(readlink /proc/self/ns/$ns)"; done
echo "cgroup=$(sed -n 's/^0:://p' /proc/self/cgroup)"
echo "hostname=$(hostname)"
echo "procs=$(ls -d /proc/[0-9]* | wc -l)"
echo "interfaces=$(awk -F: 'NR > 2 {gsub(/ /, "", $1); print $1}' /proc/net/dev | sort | tr '\n' ' ')"
echo "full=$(stat -L -c %t:%T /dev/full)"
echo "$name $run" > "/dev/shm/podcheck-$run-$name" && echo "$name $run" > "/tmp/podcheck-$run-$name" || exit 1
echo "shm_readback=$(cat "/dev/shm/podcheck-$run-$name")"
if [ "$name" = a ]; then
  python3 - "$port" "$work/a-listening" <<'PY' || exit 1
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.78.0.1", int(sys.argv[1])))
s.listen(1)
s.settimeout(20)
open(sys.argv[2], "w").close()
c, peer = s.accept()
c.settimeout(20)
line = c.makefile().readline().strip()
c.sendall(f"a heard '{line}'\n".encode())
print(f"tcp_heard={line} from {peer[0]}")
PY
else
  for _ in $(seq 200); do [ -e "$work/a-listening" ] && break; sleep 0.05; done
  exec 3<>"/dev/tcp/10.78.0.1/$port" || exit 1
  echo "hello from b" >&3
  read -r -t 20 reply <&3
  echo "tcp_reply=$reply"
fi
# Both pods have written their files by now (b before it connected, a before it listened).
echo "shm_files=$(ls /dev/shm | grep "^podcheck-$run-" | tr '\n' ' ')"
echo "tmp_files=$(ls /tmp | grep "^podcheck-$run-" | tr '\n' ' ')"
EOF

pod_exec "$CG_A" --private-tmp --hostname pod-a --hide /dev/full --wait-for "$WORK/net-ready" -- \
  bash "$WORK/pod.sh" a "$WORK" "$PORT" "$$" > "$WORK/a.out" 2> "$WORK/a.err" &
PID_A=$!
PIDS+=("$PID_A")
pod_exec "$CG_B" --private-tmp --hostname pod-b --wait-for "$WORK/net-ready" -- \
  bash "$WORK/pod.sh" b "$WORK" "$PORT" "$$" > "$WORK/b.out" 2> "$WORK/b.err" &
PID_B=$!
PIDS+=("$PID_B")
check "pod_veth joins the two pods" pod_veth "$PID_A" "$PID_B" "$IF_A" "$IF_B"
# $! is each pod's unshare, already in the pod's cgroup.
check "pod a's unshare is in its scope" grep -qx "$PID_A" "$CG_A/cgroup.procs"
check "pod b's unshare is in its scope" grep -qx "$PID_B" "$CG_B/cgroup.procs"
touch "$WORK/net-ready"
RC_A=0 RC_B=0
wait_pid "$PID_A" 30 || RC_A=$?
wait_pid "$PID_B" 30 || RC_B=$?
same "pod a exits 0" "$RC_A" 0
same "pod b exits 0" "$RC_B" 0
for p in a b; do
  echo "---- pod $p said:"
  cat "$WORK/$p.out" "$WORK/$p.err"
done
echo "----"

# --- what the pods saw ----------------------------------------------------------
for p in a b; do
  same "pod $p's program is PID 1" "$(field $p pid)" 1
  check "pod $p sees only its own processes ($(field $p procs))" test "$(field $p procs)" -le 5
  for ns in pid net ipc uts mnt; do
    differ "pod $p has its own $ns namespace" "$(field $p ns_$ns)" "$(readlink /proc/$$/ns/$ns)"
  done
done
for ns in pid net ipc uts mnt; do
  differ "the pods' $ns namespaces differ" "$(field a ns_$ns)" "$(field b ns_$ns)"
done
same "pod a's /proc/self/cgroup names its scope" "$(field a cgroup)" "${CG_A#"$CG"}"
same "pod b's /proc/self/cgroup names its scope" "$(field b cgroup)" "${CG_B#"$CG"}"
same "pod a's hostname" "$(field a hostname)" pod-a
same "pod b's hostname" "$(field b hostname)" pod-b
check "the host's hostname is not a pod's" test "$(hostname)" != pod-a -a "$(hostname)" != pod-b
same "pod a's interfaces: loopback and its veth end" "$(field a interfaces)" "lo $IF_A "
same "pod b's interfaces: loopback and its veth end" "$(field b interfaces)" "lo $IF_B "
same "pod a heard pod b over the veth" "$(field a tcp_heard)" "hello from b from 10.78.0.2"
same "pod b got pod a's reply" "$(field b tcp_reply)" "a heard 'hello from b'"
same "pod a's /dev/full is /dev/null (hidden)" "$(field a full)" "$(stat -L -c %t:%T /dev/null)"
same "pod b's /dev/full is itself" "$(field b full)" "$(stat -L -c %t:%T /dev/full)"
for p in a b; do
  same "pod $p reads back its /dev/shm file" "$(field $p shm_readback)" "$p $$"
  same "pod $p's /dev/shm holds only its own file" "$(field $p shm_files)" "podcheck-$$-$p "
  same "pod $p's /tmp holds only its own file" "$(field $p tmp_files)" "podcheck-$$-$p "
done
left=$(compgen -G "/dev/shm/podcheck-$$-*"; compgen -G "/tmp/podcheck-$$-*")
same "the host's /dev/shm and /tmp hold no pod's file" "$left" ""

# --- pod_run and errors -----------------------------------------------------------
pod_run "$CG_A" -- sh -c 'exit 3'
same "pod_run returns the program's status" "$?" 3
same "pod_run with no cgroup still has its own network" \
  "$(pod_run "" -- readlink /proc/self/ns/net | grep -cxF "$(readlink /proc/$$/ns/net)")" 0
pod_run "$CG/$TEST_ROOT/no-such-scope" -- true 2>/dev/null
same "a pod that cannot join its cgroup is not started" "$?" 126
pod_run "" --hide /no-such-device -- true 2>/dev/null
same "a failed setup exits 99" "$?" 99
pod_run "" --hostname 2>/dev/null
same "an option without a value is refused" "$?" 2
pod_make_cgroup "$TEST_ROOT" "$UID_A" premium 2>/dev/null
same "an unknown QoS class is refused" "$?" 2
pod_cleanup_cgroups "" 2>/dev/null
same "pod_cleanup_cgroups refuses an empty root" "$?" 2
pod_cleanup_cgroups ../x 2>/dev/null
same "pod_cleanup_cgroups refuses a path" "$?" 2

# --- cleanup ------------------------------------------------------------------------
check "pod_cleanup_cgroups succeeds" pod_cleanup_cgroups "$TEST_ROOT"
check "the test root's cgroups are gone" test ! -e "$CG/$TEST_ROOT"
check "no veth end is left in the host" test ! -e "/sys/class/net/$IF_A" -a ! -e "/sys/class/net/$IF_B"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
