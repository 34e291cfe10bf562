#include "daemon/metrics/metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace podlink {

void LatencyHistogram::Observe(double seconds) {
  size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}

void LatencyHistogram::Render(const std::string& name, std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    std::string le = i < kBounds.size() ? absl::StrFormat("%g", kBounds[i]) : "+Inf";
    absl::StrAppend(out, name, "_bucket{le=\"", le, "\"} ", cumulative, "\n");
  }
  absl::StrAppend(out, name, "_sum ", absl::StrFormat("%.9f", sum_ns_.load(std::memory_order_relaxed) / 1e9), "\n");
  absl::StrAppend(out, name, "_count ", count_.load(std::memory_order_relaxed), "\n");
}

void LabeledCounter::Inc(const std::string& label) {
  absl::MutexLock l(&mu_);
  ++counts_[label];
}

std::map<std::string, uint64_t> LabeledCounter::Snapshot() const {
  absl::MutexLock l(&mu_);
  return counts_;
}

namespace {
// A label value as the text format wants it: backslash, quote and newline escaped.
std::string LabelValue(const std::string& v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\' || ch == '"') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else {
      out += ch;
    }
  }
  return out;
}
}  // namespace

void RenderFamily(std::string* out, const std::string& name, const char* type, const std::string& help,
                  const std::map<std::string, double>& values, const std::string& label_name) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  for (const auto& [label, v] : values) {
    if (label_name.empty()) {
      absl::StrAppend(out, name, " ", absl::StrFormat("%.17g", v), "\n");
    } else {
      absl::StrAppend(out, name, "{", label_name, "=\"", LabelValue(label), "\"} ", absl::StrFormat("%.17g", v), "\n");
    }
  }
}

void RenderFamily2(std::string* out, const std::string& name, const char* type, const std::string& help,
                   const std::map<std::pair<std::string, std::string>, double>& values, const std::string& label1,
                   const std::string& label2) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  for (const auto& [labels, v] : values) {
    absl::StrAppend(out, name, "{", label1, "=\"", LabelValue(labels.first), "\",", label2, "=\"",
                    LabelValue(labels.second), "\"} ", absl::StrFormat("%.17g", v), "\n");
  }
}

}  // namespace podlink
