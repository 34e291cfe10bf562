#include "client-lib/nixl/wire.h"

#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace podlink::nixl {
namespace {

absl::Status Bad(absl::string_view what, absl::string_view text) {
  return absl::InvalidArgumentError(absl::StrCat("malformed ", what, " (not from podlink's NIXL plugin ",
                                                 kWireMagic, "?): '", absl::CHexEscape(text.substr(0, 120)),
                                                 text.size() > 120 ? "...'" : "'"));
}

// Takes the text up to the next ';' off `rest` (false when there is none).
bool NextField(absl::string_view& rest, absl::string_view& field) {
  size_t semi = rest.find(';');
  if (semi == absl::string_view::npos) return false;
  field = rest.substr(0, semi);
  rest.remove_prefix(semi + 1);
  return true;
}

// Plain decimal: 1 to 20 digits, no sign, space or leading zero (except "0"),
// no overflow.
bool ParseU64(absl::string_view s, uint64_t& out) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  out = v;
  return true;
}

}  // namespace

std::string EncodeConnInfo(absl::string_view agent, const RegionDescriptor& mailbox) {
  return absl::StrCat(kWireMagic, ";", agent.size(), ";", agent, ";", mailbox.Serialize());
}

absl::StatusOr<ConnInfo> ParseConnInfo(absl::string_view text) {
  if (text.size() > kMaxWireBytes) return Bad("connection info (too long)", text);
  absl::string_view rest = text, field;
  uint64_t len = 0;
  if (!NextField(rest, field) || field != kWireMagic) return Bad("connection info", text);
  if (!NextField(rest, field) || !ParseU64(field, len) || len == 0 || len > kMaxAgentName || len >= rest.size() ||
      rest[len] != ';') {
    return Bad("connection info (agent name)", text);
  }
  ConnInfo c;
  c.agent = std::string(rest.substr(0, len));
  rest.remove_prefix(len + 1);
  absl::StatusOr<RegionDescriptor> d = RegionDescriptor::Parse(rest);
  if (!d.ok()) return Bad("connection info (mailbox descriptor)", text);
  if (d->handle_type != HandleType::kHostMemfd || d->size < TransferEngine::kMaxNotifyBytes) {
    return Bad("connection info (mailbox is not a host region)", text);
  }
  c.mailbox = *std::move(d);
  return c;
}

std::string EncodePublicData(const PublicData& p) {
  return absl::StrCat(kWireMagic, ";", p.base, ";", p.offset, ";", p.length, ";", p.region.Serialize());
}

absl::StatusOr<PublicData> ParsePublicData(absl::string_view text) {
  if (text.size() > kMaxWireBytes) return Bad("memory metadata (too long)", text);
  absl::string_view rest = text, field;
  PublicData p;
  if (!NextField(rest, field) || field != kWireMagic) return Bad("memory metadata", text);
  if (!NextField(rest, field) || !ParseU64(field, p.base) || !NextField(rest, field) ||
      !ParseU64(field, p.offset) || !NextField(rest, field) || !ParseU64(field, p.length)) {
    return Bad("memory metadata (numbers)", text);
  }
  absl::StatusOr<RegionDescriptor> d = RegionDescriptor::Parse(rest);
  if (!d.ok()) return Bad("memory metadata (descriptor)", text);
  p.region = *std::move(d);
  // The range must lie inside the export and not wrap the address space.
  if (p.length == 0 || p.offset > p.region.size || p.length > p.region.size - p.offset ||
      p.base > std::numeric_limits<uint64_t>::max() - p.length) {
    return Bad("memory metadata (range outside its export)", text);
  }
  return p;
}

size_t MaxNixlMessage(absl::string_view agent) {
  size_t used = kFrameHeader + agent.size();
  return used >= TransferEngine::kMaxNotifyBytes ? 0 : TransferEngine::kMaxNotifyBytes - used;
}

absl::StatusOr<std::string> FrameNotification(absl::string_view agent, absl::string_view message) {
  if (agent.size() > kMaxAgentName || message.size() > MaxNixlMessage(agent)) {
    return absl::InvalidArgumentError(
        absl::StrCat("notification of ", message.size(), " bytes is too long: podlink carries at most ",
                     MaxNixlMessage(agent), " bytes from agent '", agent.substr(0, 64), "' (",
                     TransferEngine::kMaxNotifyBytes, " less 2 less the agent name's length); send larger "
                     "payloads as a transfer"));
  }
  std::string f;
  f.reserve(kFrameHeader + agent.size() + message.size());
  f.push_back(static_cast<char>(agent.size() & 0xff));
  f.push_back(static_cast<char>((agent.size() >> 8) & 0xff));
  f.append(agent.data(), agent.size());
  f.append(message.data(), message.size());
  return f;
}

absl::StatusOr<std::pair<std::string, std::string>> UnframeNotification(absl::string_view frame) {
  if (frame.size() < kFrameHeader) return absl::InvalidArgumentError("notification frame shorter than its header");
  size_t len = static_cast<unsigned char>(frame[0]) | (static_cast<size_t>(static_cast<unsigned char>(frame[1])) << 8);
  if (len == 0 || len > kMaxAgentName || len > frame.size() - kFrameHeader) {
    return absl::InvalidArgumentError(absl::StrCat("notification frame names an agent of ", len, " bytes in ",
                                                   frame.size(), " bytes"));
  }
  return std::make_pair(std::string(frame.substr(kFrameHeader, len)), std::string(frame.substr(kFrameHeader + len)));
}

}  // namespace podlink::nixl
