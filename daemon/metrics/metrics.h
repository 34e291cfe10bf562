// Counters and a latency histogram, rendered in the Prometheus text format.
// Lock-free to update (relaxed atomics); rendering reads a consistent-enough
// snapshot.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace podlink {

class LatencyHistogram {
 public:
  // Upper bounds in seconds; the last bucket is +Inf.
  static constexpr std::array<double, 14> kBounds = {5e-6,   10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
                                                     1e-3,   2.5e-3, 5e-3, 10e-3, 25e-3,  50e-3,  100e-3};
  void Observe(double seconds);
  // Appends "name_bucket{le=...}", "name_sum", "name_count" lines.
  void Render(const std::string& name, std::string* out) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

// Denials by reason label.
class LabeledCounter {
 public:
  void Inc(const std::string& label) ABSL_LOCKS_EXCLUDED(mu_);
  std::map<std::string, uint64_t> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t> counts_ ABSL_GUARDED_BY(mu_);
};

// Appends one metric family (HELP, TYPE, value lines).
void RenderFamily(std::string* out, const std::string& name, const char* type, const std::string& help,
                  const std::map<std::string, double>& labeled_values, const std::string& label_name = "");
// The same with two labels per sample.
void RenderFamily2(std::string* out, const std::string& name, const char* type, const std::string& help,
                   const std::map<std::pair<std::string, std::string>, double>& values, const std::string& label1,
                   const std::string& label2);

}  // namespace podlink
