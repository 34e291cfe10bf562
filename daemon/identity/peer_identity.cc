#include "daemon/identity/peer_identity.h"

#include <dirent.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
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

absl::StatusOr<uint64_t> UnixPeerInode(int sock) {
  struct stat st {};
  if (::fstat(sock, &st) != 0) return ErrnoStatus(errno, "fstat(client socket)");
  UniqueFd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl.valid()) return ErrnoStatus(errno, "socket(NETLINK_SOCK_DIAG)");
  struct {
    nlmsghdr nlh;
    unix_diag_req req;
  } q{};
  q.nlh.nlmsg_len = sizeof(q);
  q.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  q.nlh.nlmsg_flags = NLM_F_REQUEST;
  q.nlh.nlmsg_seq = 1;
  q.req.sdiag_family = AF_UNIX;
  q.req.udiag_states = ~0u;
  q.req.udiag_ino = static_cast<uint32_t>(st.st_ino);
  q.req.udiag_show = UDIAG_SHOW_PEER;
  q.req.udiag_cookie[0] = q.req.udiag_cookie[1] = ~0u;  // INET_DIAG_NOCOOKIE: match by inode alone
  if (::send(nl.get(), &q, sizeof(q), 0) != static_cast<ssize_t>(sizeof(q))) {
    return ErrnoStatus(errno, "sock_diag request");
  }
  alignas(nlmsghdr) char buf[1024];
  ssize_t n = ::recv(nl.get(), buf, sizeof(buf), 0);
  if (n < 0) return ErrnoStatus(errno, "sock_diag reply");
  auto* h = reinterpret_cast<nlmsghdr*>(buf);
  if (!NLMSG_OK(h, static_cast<size_t>(n))) return absl::InternalError("sock_diag: short reply");
  if (h->nlmsg_type == NLMSG_ERROR) {
    auto* e = static_cast<nlmsgerr*>(NLMSG_DATA(h));
    return ErrnoStatus(-e->error, "sock_diag (is the unix_diag module available?)");
  }
  if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(unix_diag_msg))) {
    return absl::InternalError("sock_diag: unexpected reply");
  }
  int left = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(unix_diag_msg)));
  auto* a = reinterpret_cast<rtattr*>(static_cast<char*>(NLMSG_DATA(h)) + NLMSG_ALIGN(sizeof(unix_diag_msg)));
  for (; RTA_OK(a, left); a = RTA_NEXT(a, left)) {
    if (a->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(a) >= sizeof(uint32_t)) {
      uint32_t peer;
      memcpy(&peer, RTA_DATA(a), sizeof(peer));
      return peer;
    }
  }
  return absl::FailedPreconditionError("client socket has no peer (the client closed it)");
}

absl::StatusOr<bool> ProcessHoldsSocket(const std::string& proc_root, pid_t pid, uint64_t inode) {
  std::string dir = absl::StrCat(proc_root, "/", pid, "/fd");
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return ErrnoStatus(errno, absl::StrCat("open ", dir));
  const std::string want = absl::StrCat("socket:[", inode, "]");
  char target[64];
  while (dirent* e = ::readdir(d.get())) {
    if (e->d_name[0] == '.') continue;
    ssize_t n = ::readlinkat(::dirfd(d.get()), e->d_name, target, sizeof(target));
    if (n > 0 && absl::string_view(target, n) == want) return true;
  }
  return false;
}

bool PidfdAlive(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  int r = ::poll(&p, 1, 0);
  return r == 0;  // readable (POLLIN) once the process exited
}

absl::StatusOr<PeerIdentity> IdentifyPeer(int sock, const CgroupLayout& layout, const std::string& proc_root,
                                          PidfdSource source) {
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
  if (source == PidfdSource::kPidfdOpen || ::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) != 0) {
    // Before Linux 6.5 the kernel cannot name the connecting process, only
    // its pid, which may already belong to another process. Pin whatever
    // holds the pid now and accept it only if it holds this connection: then
    // it is the client (or a process the client handed the socket to, which
    // can use the connection anyway).
    pidfd = static_cast<int>(::syscall(SYS_pidfd_open, cred.pid, 0));
    if (pidfd < 0) return ErrnoStatus(errno, "pidfd for client process");
    id.pidfd.Reset(pidfd);
    PODLINK_ASSIGN_OR_RETURN(uint64_t peer_inode, UnixPeerInode(sock));
    PODLINK_ASSIGN_OR_RETURN(bool holds, ProcessHoldsSocket(proc_root, cred.pid, peer_inode));
    if (!holds) {
      return absl::PermissionDeniedError(absl::StrCat(
          "process ", cred.pid, " (the pid the kernel reports for the connection) does not hold the client's "
          "socket: the client exited or passed the socket on, and the pid may belong to another process"));
    }
  } else {
    id.pidfd.Reset(pidfd);
  }

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
