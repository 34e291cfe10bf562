// Translation of errno and gRPC status to absl::Status, one place each.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace grpc {
class Status;
}

namespace podlink {

// "what: strerror(err)" with a code chosen from errno.
absl::Status ErrnoStatus(int err, absl::string_view what);

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace podlink

#define PODLINK_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::absl::Status _pl_status = (expr);        \
    if (!_pl_status.ok()) return _pl_status;   \
  } while (0)

#define PODLINK_CONCAT_INNER(a, b) a##b
#define PODLINK_CONCAT(a, b) PODLINK_CONCAT_INNER(a, b)
#define PODLINK_ASSIGN_OR_RETURN(lhs, expr) \
  PODLINK_ASSIGN_OR_RETURN_IMPL(PODLINK_CONCAT(_pl_sor_, __LINE__), lhs, expr)
#define PODLINK_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
