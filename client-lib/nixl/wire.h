// The NIXL plugin's wire formats: what getConnInfo and getPublicData hand
// NIXL (which ships them to peers through its own metadata channel), and
// the framing of a notification's bytes. Peers' bytes are hostile input:
// every parser is strict (exact field counts, plain decimal digits, no
// overflow, bounded sizes) and refuses with INVALID_ARGUMENT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "podlink/transfer.h"

namespace podlink::nixl {

inline constexpr absl::string_view kWireMagic = "podlink-nixl1";
// Longest conn info / public data accepted (a descriptor is ~100 bytes, more
// with mesh addresses).
inline constexpr size_t kMaxWireBytes = 16 * 1024;
// Longest agent name: it travels in every notification's frame.
inline constexpr size_t kMaxAgentName = 1024;

// getConnInfo: "podlink-nixl1;<agent name length>;<agent name>;<mailbox descriptor>".
// The length makes any byte (';' too) legal in an agent name.
struct ConnInfo {
  std::string agent;
  RegionDescriptor mailbox;
};
std::string EncodeConnInfo(absl::string_view agent, const RegionDescriptor& mailbox);
absl::StatusOr<ConnInfo> ParseConnInfo(absl::string_view text);

// getPublicData: "podlink-nixl1;<base addr>;<offset in export>;<length>;<descriptor>"
// (decimal). [offset, offset + length) lies inside the export.
struct PublicData {
  uint64_t base = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  RegionDescriptor region;
};
std::string EncodePublicData(const PublicData& p);
absl::StatusOr<PublicData> ParsePublicData(absl::string_view text);

// A notification's bytes on the wire (to the peer's mailbox region):
// [u16 little-endian agent-name length][agent name][NIXL message bytes],
// at most TransferEngine::kMaxNotifyBytes in all.
inline constexpr size_t kFrameHeader = 2;
// The longest NIXL message `agent` can send (0 if its name alone is too long).
size_t MaxNixlMessage(absl::string_view agent);
// INVALID_ARGUMENT when the frame would exceed kMaxNotifyBytes.
absl::StatusOr<std::string> FrameNotification(absl::string_view agent, absl::string_view message);
// (sender agent, message); INVALID_ARGUMENT for a malformed frame.
absl::StatusOr<std::pair<std::string, std::string>> UnframeNotification(absl::string_view frame);

}  // namespace podlink::nixl
