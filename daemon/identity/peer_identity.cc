#include "daemon/identity/peer_identity.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_util.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace podlink {
namespace {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return ErrnoStatus(errno ? errno : ENOENT, absl::StrCat("open ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  if (s.size() > (1 << 20)) return absl::InvalidArgumentError(absl::StrCat(path, " too large"));
  return s;
}

// Field 22 of /proc/<pid>/stat. The comm field (2) may contain spaces and
// parentheses, so parse after the last ')'.
absl::StatusOr<uint64_t> ParseStartTime(const std::string& stat) {
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return absl::InvalidArgumentError("malformed stat");
  std::vector<absl::string_view> f = absl::StrSplit(
      absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
  // f[0] is field 3 (state); field 22 is f[19].
  uint64_t v;
  if (f.size() < 20 || !absl::SimpleAtoi(f[19], &v)) {
    return absl::InvalidArgumentError("malformed stat: no start time");
  }
  return v;
}

}  // namespace

bool PidfdAlive(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  int r = ::poll(&p, 1, 0);
  return r == 0;  // readable (POLLIN) once the process exited
}

absl::StatusOr<PeerIdentity> IdentifyPeer(int sock, const CgroupLayout& layout, const std::string& proc_root) {
  PeerIdentity id;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(errno, "getsockopt(SO_PEERCRED)");
  }
  if (cred.pid <= 0) {
    return absl::FailedPreconditionError(
        "client pid not visible (SO_PEERCRED pid 0): podlinkd must run in the host PID "
        "namespace (hostPID: true) to identify clients");
  }
  id.pid = cred.pid;
  id.uid = cred.uid;
  id.gid = cred.gid;

  int pidfd = -1;
  len = sizeof(pidfd);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) != 0) {
    pidfd = static_cast<int>(::syscall(SYS_pidfd_open, cred.pid, 0));
  }
  if (pidfd < 0) return ErrnoStatus(errno, "pidfd for client process");
  id.pidfd.Reset(pidfd);

  std::string base = absl::StrCat(proc_root, "/", cred.pid);
  PODLINK_ASSIGN_OR_RETURN(std::string cgroup_text, ReadSmallFile(base + "/cgroup"));
  PODLINK_ASSIGN_OR_RETURN(std::string stat_text, ReadSmallFile(base + "/stat"));
  PODLINK_ASSIGN_OR_RETURN(id.start_time, ParseStartTime(stat_text));
  PODLINK_ASSIGN_OR_RETURN(id.cgroup, ParseProcCgroup(cgroup_text, layout));

  // The pidfd pins the identity of the process: if it is still alive now, the
  // /proc entries read above were its own and not those of a reused pid.
  if (!PidfdAlive(id.pidfd.get())) {
    return absl::UnavailableError("client process exited while being identified");
  }
  return id;
}

}  // namespace podlink
