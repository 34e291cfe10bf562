// absl::Status -> nixl_status_t, in one place for the NIXL plugin. Every
// error that leaves the plugin is logged here, once, to stderr as
// "podlink-nixl: <what>: <status>" (the status carries podlinkd's reason).
// NIXL's own logger is Abseil's inside libnixl and is not reachable from a
// plugin that must not link libnixl, so stderr it is.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client-lib/nixl/nixl_abi.h"

namespace podlink::nixl {

// Whether the failed call involved a peer's export or session (opening its
// region, moving bytes to or from it, notifying it): NOT_FOUND and
// UNAVAILABLE then mean the peer is gone (NIXL_ERR_REMOTE_DISCONNECT, on
// which the agent drops the peer); for local calls they do not.
enum class Scope { kLocal, kPeer };

// NIXL_SUCCESS for OK (nothing logged); otherwise logs and maps:
//   PERMISSION_DENIED                      -> NIXL_ERR_NOT_ALLOWED
//   UNAVAILABLE, NOT_FOUND (kPeer)         -> NIXL_ERR_REMOTE_DISCONNECT
//   INVALID_ARGUMENT, OUT_OF_RANGE         -> NIXL_ERR_INVALID_PARAM
//   UNIMPLEMENTED, FAILED_PRECONDITION     -> NIXL_ERR_NOT_SUPPORTED
//   CANCELLED                              -> NIXL_ERR_CANCELED
//   anything else                          -> NIXL_ERR_BACKEND
nixl_status_t ToNixl(const absl::Status& status, absl::string_view what, Scope scope = Scope::kLocal);

// The plugin's own refusals (bad arguments, unknown peers): logs
// "podlink-nixl: <what>: <why>" and returns `code`.
nixl_status_t Refuse(nixl_status_t code, absl::string_view what, absl::string_view why);

// One informational line ("podlink-nixl: <text>").
void LogLine(absl::string_view text);

}  // namespace podlink::nixl
