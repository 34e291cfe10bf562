// Identity of a connected client, read from the kernel only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "daemon/identity/cgroup_parser.h"

namespace podlink {

struct PeerIdentity {
  pid_t pid = 0;  // in the daemon's (host) PID namespace
  uid_t uid = 0;
  gid_t gid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22, clock ticks since boot
  CgroupInfo cgroup;
  UniqueFd pidfd;  // refers to exactly this process; invalid if unsupported
};

enum class PidfdSource {
  kAuto,       // SO_PEERPIDFD where the kernel has it (6.5+), else kPidfdOpen
  kPidfdOpen,  // pidfd_open(SO_PEERCRED pid) + check that it holds the socket (tests force this)
};

// Reads SO_PEERCRED of a connected Unix socket, pins the process with a
// pidfd (SO_PEERPIDFD where the kernel has it; otherwise pidfd_open of the
// pid, accepted only if that process holds the client's end of the socket,
// found with sock_diag and /proc/<pid>/fd), reads
// /proc/<pid>/cgroup and /proc/<pid>/stat, then checks through the pidfd that
// the process is still alive, so a pid reused between connect and lookup is
// never attributed to the wrong pod. The cgroup is parsed against `layout`
// (PERMISSION_DENIED for a cgroup that only pretends to be a pod's). `proc_root` is "/proc" except in tests.
absl::StatusOr<PeerIdentity> IdentifyPeer(int sock, const CgroupLayout& layout = {},
                                          const std::string& proc_root = "/proc",
                                          PidfdSource source = PidfdSource::kAuto);

// Inode of the socket at the other end of the connected Unix socket `sock`
// (sock_diag UNIX_DIAG_PEER).
absl::StatusOr<uint64_t> UnixPeerInode(int sock);

// True if process `pid` has a descriptor open on socket inode `inode`.
absl::StatusOr<bool> ProcessHoldsSocket(const std::string& proc_root, pid_t pid, uint64_t inode);

// True while the process behind `pidfd` has not exited.
bool PidfdAlive(int pidfd);

}  // namespace podlink
