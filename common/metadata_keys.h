// gRPC metadata keys shared by podlinkd's broker service and libpodlink.
#pragma once

namespace podlink {

// The session credential every call of a client carries (request metadata).
inline constexpr char kSessionMetadataKey[] = "x-podlink-session";
// Trailing metadata podlinkd sets on every answer of its broker service: a
// failed call without it never reached podlinkd's handlers (podlinkd
// unreachable, gone or not yet serving); one with it is podlinkd's own word.
inline constexpr char kAnswerMetadataKey[] = "x-podlink-answer";

}  // namespace podlink
