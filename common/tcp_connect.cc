#include "common/tcp_connect.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"

namespace podlink {

absl::Status BeginConnect(int fd, const sockaddr* to, socklen_t len, absl::string_view to_text) {
  if (::connect(fd, to, len) != 0 && errno != EINPROGRESS) {
    return ErrnoStatus(errno, absl::StrCat("connect to ", to_text));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ConnectDone(int fd, absl::Duration wait) {
  pollfd p{fd, POLLOUT, 0};
  const absl::Time until = absl::Now() + wait;
  int r = 0;
  for (;;) {
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(until - absl::Now()));
    r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (r >= 0 || errno != EINTR) break;
  }
  if (r < 0) return ErrnoStatus(errno, "poll");
  if (r == 0) return false;
  int err = 0;
  socklen_t elen = sizeof(err);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) return ErrnoStatus(errno, "getsockopt");
  if (err != 0) return ErrnoStatus(err, "connect");
  return true;
}

}  // namespace podlink
