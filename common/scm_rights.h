// Descriptors on Unix sockets (SCM_RIGHTS): attaching one to a message about
// to be sent, and taking every one a received message carries as owned fds.
#pragma once

#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "common/unique_fd.h"

namespace podlink {

// Attaches `fd` to `m` using `ctrl` (at least CMSG_SPACE(sizeof(int)) bytes,
// aligned for cmsghdr) as its control buffer.
inline void AttachFd(msghdr& m, char* ctrl, size_t ctrl_size, int fd) {
  std::memset(ctrl, 0, ctrl_size);
  m.msg_control = ctrl;
  m.msg_controllen = CMSG_SPACE(sizeof(int));
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
}

// Every descriptor `m` (as recvmsg filled it) carries, owned: none stays open
// unseen, however many the sender attached.
inline std::vector<UniqueFd> TakeFds(msghdr& m) {
  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  return fds;
}

}  // namespace podlink
