#include "common/status_util.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/status.h"

namespace podlink {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOENT:
    case ECONNREFUSED:
      return absl::UnavailableError(msg);
    case EAGAIN:
    case EINTR:
    case ECONNRESET:
    case EPIPE:
      return absl::UnavailableError(msg);
    case EINVAL:
    case EBADF:
      return absl::InvalidArgumentError(msg);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case ETOOMANYREFS:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// absl::StatusCode and grpc::StatusCode share the canonical numbering.
grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace podlink
