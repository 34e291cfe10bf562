// A TCP connect that never blocks its caller longer than it says, shared by
// the mesh (a data connection dialed with a timeout) and the NCCL plugin
// (connects NCCL polls). The caller makes the socket (non-blocking) and binds
// it where it must; these start the connect and learn how it ended.
#pragma once

#include <sys/socket.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace podlink {

// connect() on a non-blocking socket: OK when it is under way (or done);
// `to_text` names the target in the error.
absl::Status BeginConnect(int fd, const sockaddr* to, socklen_t len, absl::string_view to_text);
// Waits up to `wait` (zero: just asks) for `fd`'s connect: true once
// connected, false while still in progress, the connect's error when it
// failed.
absl::StatusOr<bool> ConnectDone(int fd, absl::Duration wait = absl::ZeroDuration());

}  // namespace podlink
