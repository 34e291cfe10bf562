#include "daemon/ncclipc/unix_names.h"

#include <fcntl.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace podlink::ncclipc {
namespace {

constexpr char kNcclPrefix[] = "tmp/nccl-socket-";
constexpr size_t kMaxName = sizeof(sockaddr_un::sun_path);

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f'); }

}  // namespace

bool IsNcclIpcName(const UnixName& name) {
  const size_t plen = sizeof(kNcclPrefix) - 1;
  if (name.size() < 1 + plen + 3 || name.size() > kMaxName || name[0] != '\0') return false;
  if (name.compare(1, plen, kNcclPrefix) != 0) return false;
  size_t i = 1 + plen, digits = 0, hex = 0;
  while (i < name.size() && IsDigit(name[i])) ++i, ++digits;
  if (digits == 0 || digits > 10 || i >= name.size() || name[i] != '-') return false;
  ++i;
  while (i < name.size() && IsHex(name[i])) ++i, ++hex;
  if (hex == 0 || hex > 16) return false;
  for (; i < name.size(); ++i) {
    if (name[i] != '\0') return false;
  }
  return true;
}

std::string Printable(const UnixName& name) {
  std::string out = "@";
  for (size_t i = 1; i < name.size() && name[i] != '\0'; ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  return out;
}

absl::StatusOr<std::vector<BoundName>> ListAbstractDgramNames(int diag_fd) {
  struct {
    nlmsghdr nlh;
    unix_diag_req req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof(msg);
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  static uint32_t seq = 0;
  msg.nlh.nlmsg_seq = ++seq;
  msg.req.sdiag_family = AF_UNIX;
  msg.req.udiag_states = ~0u;
  msg.req.udiag_show = UDIAG_SHOW_NAME;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(diag_fd, &msg, sizeof(msg), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) < 0) {
    return ErrnoStatus(errno, "sock_diag request");
  }
  std::vector<BoundName> out;
  alignas(nlmsghdr) char buf[32768];
  for (;;) {
    ssize_t n = ::recv(diag_fd, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "sock_diag answer");
    }
    if (n == 0) return absl::InternalError("sock_diag answer: connection closed");
    int left = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_seq != msg.nlh.nlmsg_seq) continue;  // an earlier dump's tail
      if (h->nlmsg_type == NLMSG_DONE) return out;
      if (h->nlmsg_type == NLMSG_ERROR) {
        auto* e = static_cast<nlmsgerr*>(NLMSG_DATA(h));
        return ErrnoStatus(-e->error, "sock_diag dump");
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(unix_diag_msg))) continue;
      auto* d = static_cast<unix_diag_msg*>(NLMSG_DATA(h));
      if (d->udiag_type != SOCK_DGRAM) continue;
      int alen = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(*d)));
      for (auto* a = reinterpret_cast<rtattr*>(d + 1); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
        if (a->rta_type != UNIX_DIAG_NAME) continue;
        size_t len = RTA_PAYLOAD(a);
        const char* p = static_cast<const char*>(RTA_DATA(a));
        if (len == 0 || len > kMaxName || p[0] != '\0') continue;  // a path name, not abstract
        out.push_back(BoundName{d->udiag_ino, UnixName(p, len)});
      }
    }
  }
}

absl::StatusOr<NetnsSockets> NetnsSockets::Create() {
  int fd = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "open /proc/thread-self/ns/net");
  return NetnsSockets(UniqueFd(fd));
}

absl::StatusOr<UniqueFd> NetnsSockets::Socket(int netns_fd, int domain, int type, int protocol) const {
  if (::setns(netns_fd, CLONE_NEWNET) != 0) return ErrnoStatus(errno, "setns into the pod's network namespace");
  int fd = ::socket(domain, type | SOCK_CLOEXEC, protocol);
  int err = errno;
  if (::setns(home_.get(), CLONE_NEWNET) != 0) {
    // A thread left in a pod's namespace would make every later socket
    // there: never go on.
    std::abort();
  }
  if (fd < 0) return ErrnoStatus(err, "socket in the pod's network namespace");
  return UniqueFd(fd);
}

absl::StatusOr<uint64_t> NamespaceInode(int ns_fd) {
  struct stat st {};
  if (::fstat(ns_fd, &st) != 0) return ErrnoStatus(errno, "fstat namespace");
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace podlink::ncclipc
