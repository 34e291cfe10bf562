// How podlink's tests make a "pod" without Kubernetes. One convention for the
// integration harness (tests/integration/harness.h), the soak
// (tests/soak/pods.h) and the shell scripts (scripts/lib/pod.sh):
//
// cgroup: the first writable cgroup2 mount (Cgroup2Root(); on a host with the
// hybrid cgroup v1 layout that is /sys/fs/cgroup/unified), and in it the
// directories the kubelet's systemd cgroup driver and containerd would make,
// under a private stand-in for the kubelet's cgroup root:
//
//   <cgroup2>/<test root>/kubepods.slice/kubepods-<qos>.slice/
//       kubepods-<qos>-pod<pod uid with '-' as '_'>.slice/cri-containerd-<64 hex>.scope
//
// where <qos> is burstable or besteffort; a guaranteed pod has no QoS slice:
// kubepods.slice/kubepods-pod<uid>.slice/cri-containerd-<64 hex>.scope. The
// test root is one directory per process, named after it: podlink-test-<pid>
// (the harness), podlink-soak-<pid>, podlink-demo-<pid> (scripts/demo.sh),
// podlink-gpu-<pid> and podlink-nccl-<pid> (tests/gpu/). podlinkd believes a
// pod's cgroup path only under a configured kubelet root, so every daemon a
// test starts has "/<test root>" in identity.kubelet_cgroup_roots. The levels
// down to the QoS slice are shared by the process's pods and removed when it
// is done; the pod slice and the container scope belong to one pod.
//
// process: a pod's program joins the scope (it writes "0" to the scope's
// cgroup.procs before exec), then runs as
//
//   unshare --pid --fork --kill-child --mount-proc --uts --ipc --net --mount -- PROGRAM ARGS...
//
// (PodUnshareCommand()): own PID namespace (the program is its PID 1 and dies
// with unshare), UTS, IPC, network (only a loopback, down) and mount
// namespaces, with a /proc of its own. The scripts can add a private /dev/shm
// and /tmp, device nodes hidden behind /dev/null, a hostname, and a veth pair
// between two pods (scripts/lib/pod.sh).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace podlink::testing {

// The first writable cgroup2 mount point in /proc/self/mountinfo, "" if none.
std::string Cgroup2Root();

// A random version-4 UUID, as the kubelet gives pods.
std::string RandomPodUid();

// 64 random hex digits, as containerd names containers.
std::string RandomContainerId();

// Makes the cgroup of one pod, as above: `kubelet_root` is the test root as
// podlinkd sees it ("/podlink-test-<pid>"), `qos` is "guaranteed",
// "burstable" or "besteffort". Shared levels may exist already (those made
// here are kept for RemoveSharedPodCgroups); the pod's own must not. Returns
// the pod's own directories, absolute in the cgroupfs, outermost first: the
// last is the container scope. Nothing of the pod's own is left on an error;
// FAILED_PRECONDITION when there is no writable cgroup2 mount.
absl::StatusOr<std::vector<std::string>> MakePodCgroup(const std::string& kubelet_root, const std::string& pod_uid,
                                                       const std::string& qos, const std::string& container_id);

// Removes a cgroup directory, waiting up to `max_wait_ms` while it is busy
// (a process leaves its cgroup a moment after it is reaped).
void RemoveCgroupDir(const std::string& path, int max_wait_ms);

// Removes the shared levels MakePodCgroup made, deepest first (call once the
// pods' own directories are gone).
void RemoveSharedPodCgroups(int max_wait_ms);

// The command line before a pod's program: "unshare", the flags above, "--".
std::vector<std::string> PodUnshareCommand();
// `name` as execvp would find it on PATH (itself when not found: execve then fails). For a child of a threaded
// process, which may only exec after fork, not search and allocate.
std::string OnPath(const std::string& name);
// This process's environment for a pod's program, with PODLINK_SOCKET_DIR set to `socket_dir` (made before a
// fork, as OnPath is).
std::vector<std::string> PodEnvironment(const std::string& socket_dir);

// Joins the network namespaces of two pods (the pids of their unshare
// processes) by a veth pair: `if_a` with `addr_a` (CIDR) in a's namespace,
// `if_b` with `addr_b` in b's, both up, loopbacks up; what scripts/lib/pod.sh's
// pod_veth does. Waits up to 10 s for both namespaces to exist. `ip` is the
// command that runs iproute2 ($PODLINK_TEST_IP where the machine has no `ip`
// of its own). An error names the command that failed.
absl::Status PodVeth(int pid_a, int pid_b, const std::string& if_a, const std::string& if_b,
                     const std::string& addr_a, const std::string& addr_b, const std::string& ip = "ip");

}  // namespace podlink::testing
