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
