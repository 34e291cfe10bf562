#include "daemon/mesh/links/wire.h"

#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
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

absl::Status SendAll(int fd, const void* buf, size_t len, int flags) {
  const auto* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | flags);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return SocketError("write", errno);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
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

absl::Status WriteFull(int fd, const void* buf, size_t len) { return SendAll(fd, buf, len, 0); }

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

bool ZeroCopySends::Enable(int fd) {
  int one = 1;
  bool ok = counters_ != nullptr && ::setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)) == 0;
  on_.store(ok, std::memory_order_relaxed);
  return ok;
}

absl::Status ZeroCopySends::WriteFrame(int fd, const FrameHeader& h, const void* payload, size_t len) {
  if (!on() || payload == nullptr || len < kMinPayload) return mesh::WriteFrame(fd, h, payload, len);
  // The header is copied and held back (MSG_MORE) to leave with the
  // payload's first segment.
  if (absl::Status st = SendAll(fd, &h, sizeof(h), MSG_MORE); !st.ok()) return st;
  const auto* p = static_cast<const char*>(payload);
  absl::Status st;
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_ZEROCOPY);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == ENOBUFS || errno == EFAULT)) {
      // Pinning refused (the locked-memory limit, no room for the
      // completion, pages that cannot be pinned): the rest is copied.
      counters_->fell_back.fetch_add(1, std::memory_order_relaxed);
      st = SendAll(fd, p, len, 0);
      break;
    }
    if (n <= 0) return SocketError("write", errno);
    counters_->bytes.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    p += n;
    len -= static_cast<size_t>(n);
  }
  Reap(fd);
  return st;
}

int ZeroCopySends::Reap(int fd) {
  int taken = 0;
  for (;;) {
    alignas(cmsghdr) char control[256];
    msghdr m{};
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    ssize_t r = ::recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return taken;  // EAGAIN: nothing (more) queued
    ++taken;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (!((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
            (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)) ||
          c->cmsg_len < CMSG_LEN(sizeof(sock_extended_err))) {
        continue;
      }
      sock_extended_err ee;
      std::memcpy(&ee, CMSG_DATA(c), sizeof(ee));
      if (ee.ee_errno != 0 || ee.ee_origin != SO_EE_ORIGIN_ZEROCOPY) continue;
      // Sends [ee_info, ee_data], counted by the kernel per socket (wraps).
      const uint64_t sends = static_cast<uint32_t>(ee.ee_data - ee.ee_info) + uint64_t{1};
      counters_->completed.fetch_add(sends, std::memory_order_relaxed);
      if ((ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED) != 0) {
        counters_->copied.fetch_add(sends, std::memory_order_relaxed);
        on_.store(false, std::memory_order_relaxed);
      }
    }
  }
}

}  // namespace podlink::mesh
