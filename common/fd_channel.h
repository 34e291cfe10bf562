// Wire format and helpers of the descriptor channel: a SOCK_SEQPACKET Unix
// socket on which every message is one fixed-size FdMessage, optionally with
// exactly one descriptor attached (SCM_RIGHTS).
//
//   daemon -> client  HELLO      seq = session id, a/b = 128-bit session token
//   client -> daemon  OFFER+fd   seq = client-chosen slot
//   daemon -> client  OFFER_ACK  seq = slot, a = 0 or an errno value
//   daemon -> client  DELIVER+fd seq = delivery slot named in ImportResponse
//   daemon -> client  GOODBYE    a = reason code (session refused or closing)
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace podlink {

inline constexpr uint32_t kFdMagic = 0x4b4c4450;  // "PDLK"
inline constexpr uint16_t kFdVersion = 1;
// GOODBYE (the daemon refuses a client): a = the absl::StatusCode, b = the
// length of the reason, which follows as one packet of UTF-8 text of at most
// this many bytes (b = 0: none).
inline constexpr size_t kGoodbyeTextMax = 1024;

enum class FdMsgType : uint16_t {
  kHello = 1,
  kOffer = 2,
  kOfferAck = 3,
  kDeliver = 4,
  kGoodbye = 5,
};

struct FdMessage {
  uint32_t magic = kFdMagic;
  uint16_t version = kFdVersion;
  uint16_t type = 0;
  uint64_t seq = 0;
  uint64_t a = 0;
  uint64_t b = 0;
};
static_assert(sizeof(FdMessage) == 32, "descriptor-channel message is 32 bytes");

struct ReceivedMessage {
  FdMessage msg;
  UniqueFd fd;  // invalid when none was attached
};

// Sends one message and, when fd >= 0, one descriptor. MSG_NOSIGNAL always;
// nonblocking when `dontwait` (EAGAIN becomes UNAVAILABLE).
absl::Status SendFdMessage(int sock, const FdMessage& msg, int fd, bool dontwait);

// Receives one message. Returns nullopt when `dontwait` and nothing is
// queued, NOT_FOUND on orderly EOF (peer closed), INVALID_ARGUMENT for anything malformed: wrong size,
// bad magic or version, more than one descriptor, truncated control data.
// Every descriptor received with a malformed message is closed.
absl::StatusOr<std::optional<ReceivedMessage>> RecvFdMessage(int sock, bool dontwait);

}  // namespace podlink
