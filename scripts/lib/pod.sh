# shellcheck shell=bash
# "Pods" for podlink's shell scripts (scripts/demo.sh, tests/gpu/, tests/tools/check_pod_helper.sh), made by the
# convention the C++ tests follow too, documented once in tests/common/pod_cgroup.h: the kubepods-style cgroup
# layout under a per-run test root (here ROOT, named after the script and its pid, e.g. podlink-demo-$$; podlinkd
# must have "/ROOT" in identity.kubelet_cgroup_roots) and the unshare flags of POD_UNSHARE below.
#
# Sourced (bash), from the repository root or next to a script:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/pod.sh"
#
#   pod_cgroup_root                        prints the first writable cgroup2 mount point (nothing if none)
#   pod_make_cgroup ROOT UID QOS           makes a pod's cgroup under ROOT (QOS: guaranteed, burstable,
#                                          besteffort) and prints the container scope's directory
#   pod_run CGROUP [OPTIONS] -- CMD...     runs CMD in a new pod in CGROUP ("": the caller's cgroup, namespaces
#                                          still new) and returns its exit status
#   pod_exec CGROUP [OPTIONS] -- CMD...    the same, replacing the shell: `pod_exec ... &` makes $! the pod's
#                                          unshare process, whose network namespace is the pod's (for pod_veth)
#   pod_veth PID_A PID_B [IF_A IF_B [ADDR_A ADDR_B]]
#                                          joins two pods' network namespaces by a veth pair (default pla and plb,
#                                          10.78.0.1/24 and 10.78.0.2/24), loopbacks up; POD_IP, an array, is the
#                                          ip command to use (default: ip)
#   pod_cleanup_cgroups ROOT               removes ROOT's cgroups (once the pods' processes are gone)
#
# OPTIONS, set up inside the pod's namespaces before CMD starts (a failure exits 99):
#   --private-tmp     a tmpfs of its own on /dev/shm and on /tmp; CMD starts in / (the caller's directory may
#                     lie under the hidden /tmp)
#   --hide PATHS      /dev/null bind-mounted over each of PATHS (space-separated device nodes; may be empty)
#   --hostname NAME   the pod's hostname (UTS namespace)
#   --wait-for FILE   start CMD once FILE exists, 120 s at most (outside /tmp with --private-tmp)
# A pod that cannot join its cgroup is not started (exit 126).

# The namespaces of every pod (tests/common/pod_cgroup.h: PodUnshareCommand()).
POD_UNSHARE=(unshare --pid --fork --kill-child --mount-proc --uts --ipc --net --mount --)

pod_cgroup_root() {
  local mounts mnt
  # mountinfo: id parent major:minor root mount-point options [optional fields] - fstype source super-options
  mounts=$(awk '{ for (i = 7; i < NF && $i != "-"; i++); if ($(i + 1) == "cgroup2") print $5 }' /proc/self/mountinfo)
  while read -r mnt; do
    if [ -n "$mnt" ] && [ -w "$mnt" ]; then
      echo "$mnt"
      return 0
    fi
  done <<<"$mounts"
}

pod_make_cgroup() {
  if [ $# -ne 3 ]; then
    echo "usage: pod_make_cgroup ROOT UID QOS" >&2
    return 2
  fi
  local root=$1 uid=${2//-/_} qos=$3 cg id pod
  cg=$(pod_cgroup_root)
  if [ -z "$cg" ]; then
    echo "pod_make_cgroup: no writable cgroup2 mount (run as root)" >&2
    return 1
  fi
  case $qos in
    guaranteed) pod=kubepods.slice/kubepods-pod$uid.slice ;;
    burstable | besteffort) pod=kubepods.slice/kubepods-$qos.slice/kubepods-$qos-pod$uid.slice ;;
    *)
      echo "pod_make_cgroup: QoS class '$qos' is none of guaranteed, burstable, besteffort" >&2
      return 2
      ;;
  esac
  id=$(head -c 32 /dev/urandom | sha256sum | cut -c1-64)
  mkdir -p "$cg/$root/$pod/cri-containerd-$id.scope" && echo "$cg/$root/$pod/cri-containerd-$id.scope"
}

# Run by sh inside the pod's namespaces: SHM HIDE HOSTNAME WAIT_FILE CMD...
# shellcheck disable=SC2016  # expanded by that sh
POD_SETUP='shm=$1 hide=$2 host=$3 wait=$4
shift 4
if [ -n "$shm" ]; then mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs /tmp && cd / || exit 99; fi
for n in $hide; do mount --bind /dev/null "$n" || exit 99; done
if [ -n "$host" ]; then hostname "$host" || exit 99; fi
if [ -n "$wait" ]; then
  i=0
  while [ ! -e "$wait" ]; do
    i=$((i + 1))
    if [ $i -gt 2400 ]; then echo "pod: $wait did not appear in 120 s" >&2; exit 99; fi
    sleep 0.05
  done
fi
exec "$@"'

pod_exec() {
  if [ $# -lt 1 ]; then
    echo "usage: pod_exec CGROUP [OPTIONS] -- CMD..." >&2
    return 2
  fi
  local cg=$1 shm="" hide="" host="" wait=""
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case $1 in
      --private-tmp) shm=1 ;;
      --hide | --hostname | --wait-for)
        if [ $# -lt 2 ]; then
          echo "pod_exec: $1 needs a value" >&2
          return 2
        fi
        case $1 in
          --hide) hide="$hide $2" ;;
          --hostname) host=$2 ;;
          --wait-for) wait=$2 ;;
        esac
        shift
        ;;
      *)
        echo "pod_exec: unknown option '$1'" >&2
        return 2
        ;;
    esac
    shift
  done
  if [ $# -lt 2 ]; then
    echo "pod_exec: no command after --" >&2
    return 2
  fi
  shift
  if [ -n "$cg" ] && ! echo 0 > "$cg/cgroup.procs"; then
    echo "pod_exec: cannot join cgroup $cg" >&2
    return 126
  fi
  if [ -z "$shm$host$wait" ] && [ -z "${hide// /}" ]; then
    exec "${POD_UNSHARE[@]}" "$@"
  fi
  exec "${POD_UNSHARE[@]}" sh -c "$POD_SETUP" pod "$shm" "$hide" "$host" "$wait" "$@"
}

pod_run() {
  (pod_exec "$@")
}

pod_veth() {
  if [ $# -ne 2 ] && [ $# -ne 4 ] && [ $# -ne 6 ]; then
    echo "usage: pod_veth PID_A PID_B [IF_A IF_B [ADDR_A ADDR_B]]" >&2
    return 2
  fi
  local a=$1 b=$2 if_a=${3:-pla} if_b=${4:-plb} addr_a=${5:-10.78.0.1/24} addr_b=${6:-10.78.0.2/24}
  local ip=(ip) host
  if [ -n "${POD_IP+x}" ]; then ip=("${POD_IP[@]}"); fi
  # Both pods' unshare must have made their network namespace (10 s at most).
  host=$(readlink /proc/$$/ns/net)
  for _ in $(seq 200); do
    [ "$(readlink "/proc/$a/ns/net")" != "$host" ] && [ "$(readlink "/proc/$b/ns/net")" != "$host" ] && break
    sleep 0.05
  done
  if [ "$(readlink "/proc/$a/ns/net")" = "$host" ] || [ "$(readlink "/proc/$b/ns/net")" = "$host" ]; then
    echo "pod_veth: process $a or $b is still in this network namespace after 10 s" >&2
    return 1
  fi
  "${ip[@]}" link del "$if_a" 2>/dev/null || true  # left over from an interrupted run
  "${ip[@]}" link add "$if_a" type veth peer name "$if_b" &&
    "${ip[@]}" link set "$if_a" netns "$a" && "${ip[@]}" link set "$if_b" netns "$b" &&
    nsenter -t "$a" -n "${ip[@]}" link set lo up && nsenter -t "$a" -n "${ip[@]}" addr add "$addr_a" dev "$if_a" &&
    nsenter -t "$a" -n "${ip[@]}" link set "$if_a" up &&
    nsenter -t "$b" -n "${ip[@]}" link set lo up && nsenter -t "$b" -n "${ip[@]}" addr add "$addr_b" dev "$if_b" &&
    nsenter -t "$b" -n "${ip[@]}" link set "$if_b" up
}

pod_cleanup_cgroups() {
  if [ $# -ne 1 ] || [[ ! $1 =~ ^[A-Za-z0-9_.-]+$ ]] || [ "$1" = . ] || [ "$1" = .. ]; then
    echo "usage: pod_cleanup_cgroups ROOT (one directory name)" >&2
    return 2
  fi
  local cg dir
  cg=$(pod_cgroup_root)
  [ -n "$cg" ] || return 0
  dir=$cg/$1
  # A process leaves its cgroup a moment after it is reaped: 2 s at most.
  for _ in $(seq 100); do
    [ -d "$dir" ] || return 0
    find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ -d "$dir" ] || return 0
    sleep 0.02
  done
  echo "pod_cleanup_cgroups: $dir is still there after 2 s (processes left in it?)" >&2
  return 1
}
