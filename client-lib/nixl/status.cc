#include "client-lib/nixl/status.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace podlink::nixl {

void LogLine(absl::string_view text) {
  // One fprintf per line: lines of concurrent threads do not interleave.
  std::string line = absl::StrCat("podlink-nixl: ", text, "\n");
  std::fputs(line.c_str(), stderr);
}

nixl_status_t Refuse(nixl_status_t code, absl::string_view what, absl::string_view why) {
  LogLine(absl::StrCat(what, ": ", why));
  return code;
}

nixl_status_t ToNixl(const absl::Status& status, absl::string_view what, Scope scope) {
  if (status.ok()) return NIXL_SUCCESS;
  LogLine(absl::StrCat(what, ": ", status.ToString()));
  switch (status.code()) {
    case absl::StatusCode::kPermissionDenied:
      return NIXL_ERR_NOT_ALLOWED;
    case absl::StatusCode::kUnavailable:
      return scope == Scope::kPeer ? NIXL_ERR_REMOTE_DISCONNECT : NIXL_ERR_BACKEND;
    case absl::StatusCode::kNotFound:
      return scope == Scope::kPeer ? NIXL_ERR_REMOTE_DISCONNECT : NIXL_ERR_BACKEND;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return NIXL_ERR_INVALID_PARAM;
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kFailedPrecondition:
      return NIXL_ERR_NOT_SUPPORTED;
    case absl::StatusCode::kCancelled:
      return NIXL_ERR_CANCELED;
    default:
      return NIXL_ERR_BACKEND;
  }
}

}  // namespace podlink::nixl
