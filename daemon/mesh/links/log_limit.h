// One rate limit for log lines a peer or a pod can cause: at most one per
// period (the counters beside them count every case). Lock-free, so any
// thread may ask it holding any lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace podlink::mesh {

class LogLimit {
 public:
  explicit LogLimit(absl::Duration period = absl::Seconds(10)) : period_ns_(absl::ToInt64Nanoseconds(period)) {}
  // True at most once per period (the first call's).
  bool Due() {
    const int64_t now = absl::GetCurrentTimeNanos();
    int64_t prev = last_.load(std::memory_order_relaxed);
    return (prev == kNever || now - prev >= period_ns_) &&
           last_.compare_exchange_strong(prev, now, std::memory_order_relaxed);
  }

 private:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::min();
  const int64_t period_ns_;
  std::atomic<int64_t> last_{kNever};
};

}  // namespace podlink::mesh
