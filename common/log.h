// spdlog with absl types: lets fmt print absl::string_view (Debian's Abseil
// does not alias it to std::string_view). Include instead of spdlog.h.
#pragma once

#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view s, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

#include <memory>
#include <mutex>
#include <string>

namespace podlink {

// The logger of one daemon component ("broker", "relay", ...): the one podlinkd
// registers for it at start, or spdlog's default where none is (tests, tools).
// Looked up once, at the first call. Each file defines its own, under a name
// unique among the files compiled with it in one unity unit (daemon/CMakeLists.txt):
//   namespace { const ComponentLog RelayLog("relay"); }
// and logs with RelayLog()->info(...). The mesh engine's files share one, Log (engine_util.h).
class ComponentLog {
 public:
  explicit ComponentLog(const char* component) : component_(component) {}
  const std::shared_ptr<spdlog::logger>& operator()() const {
    std::call_once(once_, [this] {
      logger_ = spdlog::get(component_);
      if (!logger_) logger_ = spdlog::default_logger();
    });
    return logger_;
  }

 private:
  const char* const component_;
  mutable std::once_flag once_;
  mutable std::shared_ptr<spdlog::logger> logger_;
};

// A value for a key=value log field: in double quotes, with backslashes,
// quotes and control characters escaped, so text a client controls (a status
// message, a cgroup path, a pod annotation) cannot end the field or forge
// another line.
inline std::string LogQuoted(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace podlink
