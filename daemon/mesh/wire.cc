#include "daemon/mesh/wire.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace podlink::mesh {
namespace {

absl::Status SocketError(const char* what, int err) {
  return absl::UnavailableError(absl::StrCat("mesh link ", what, ": ", err == 0 ? "peer closed" : std::strerror(err)));
}

}  // namespace

absl::Status ReadFull(int fd, void* buf, size_t len) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return SocketError("read", n == 0 ? 0 : errno);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, const void* buf, size_t len) {
  const auto* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return SocketError("write", errno);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteFrame(int fd, const FrameHeader& h, const void* payload, size_t len) {
  iovec iov[2] = {{const_cast<FrameHeader*>(&h), sizeof(h)}, {const_cast<void*>(payload), len}};
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = len > 0 ? 2 : 1;
  ssize_t n;
  do {
    n = ::sendmsg(fd, &m, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return SocketError("write", errno);
  size_t sent = static_cast<size_t>(n);
  if (sent < sizeof(h)) {
    if (absl::Status st = WriteFull(fd, reinterpret_cast<const char*>(&h) + sent, sizeof(h) - sent); !st.ok()) return st;
    sent = sizeof(h);
  }
  size_t done = sent - sizeof(h);
  return done < len ? WriteFull(fd, static_cast<const char*>(payload) + done, len - done) : absl::OkStatus();
}

absl::Status Discard(int fd, size_t len) {
  char scratch[64 << 10];
  while (len > 0) {
    size_t n = std::min(len, sizeof(scratch));
    if (absl::Status st = ReadFull(fd, scratch, n); !st.ok()) return st;
    len -= n;
  }
  return absl::OkStatus();
}

}  // namespace podlink::mesh
