#include "common/fd_channel.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/scm_rights.h"
#include "common/status_util.h"

namespace podlink {

absl::Status SendFdMessage(int sock, const FdMessage& msg, int fd, bool dontwait) {
  iovec iov{const_cast<FdMessage*>(&msg), sizeof(msg)};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) AttachFd(mh, ctrl, sizeof(ctrl), fd);
  int flags = MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0);
  for (;;) {
    ssize_t n = ::sendmsg(sock, &mh, flags);
    if (n == static_cast<ssize_t>(sizeof(msg))) return absl::OkStatus();
    if (n >= 0) return absl::InternalError("descriptor channel: short send");
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      return absl::UnavailableError(
          "descriptor channel full: the peer is not reading its descriptor channel");
    }
    return ErrnoStatus(errno, "descriptor channel sendmsg");
  }
}

absl::StatusOr<std::optional<ReceivedMessage>> RecvFdMessage(int sock, bool dontwait) {
  ReceivedMessage out;
  // One byte more than a message so an oversized datagram is detected, and
  // room for several descriptors so extra ones are received and closed rather
  // than left in flight.
  char buf[sizeof(FdMessage) + 1];
  iovec iov{buf, sizeof(buf)};
  constexpr int kMaxFds = 16;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctrl;
  mh.msg_controllen = sizeof(ctrl);
  int flags = MSG_CMSG_CLOEXEC | (dontwait ? MSG_DONTWAIT : 0);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &mh, flags);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN) return std::nullopt;
    return ErrnoStatus(errno, "descriptor channel recvmsg");
  }
  std::vector<UniqueFd> fds = TakeFds(mh);
  if (n == 0 && fds.empty()) return absl::NotFoundError("descriptor channel closed by peer");
  if (mh.msg_flags & MSG_CTRUNC) {
    return absl::InvalidArgumentError("descriptor channel: control data truncated (too many descriptors)");
  }
  if (n != static_cast<ssize_t>(sizeof(FdMessage))) {
    return absl::InvalidArgumentError(
        absl::StrCat("descriptor channel: message of ", n, " bytes, expected ", sizeof(FdMessage)));
  }
  std::memcpy(&out.msg, buf, sizeof(FdMessage));
  if (out.msg.magic != kFdMagic || out.msg.version != kFdVersion) {
    return absl::InvalidArgumentError("descriptor channel: bad magic or version");
  }
  if (fds.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("descriptor channel: ", fds.size(), " descriptors attached, at most 1 allowed"));
  }
  if (!fds.empty()) out.fd = std::move(fds[0]);
  return std::optional<ReceivedMessage>(std::move(out));
}

}  // namespace podlink
