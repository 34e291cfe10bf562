// The soak driver: one podlinkd, N pods each running a worker (worker.h),
// and cycles between pairs of pods with seeded random faults. Prints a header,
// a progress line every few seconds, every fault, and a summary; returns 0
// only when the daemon survived, every byte checked, no clean cycle failed,
// and the daemon's descriptors, mappings and RSS came back to where they
// were after the warm-up.
#pragma once

#include <cstdint>
#include <string>

namespace podlink::soak {

struct SoakOptions {
  std::string podlinkd;      // the daemon binary
  std::string self;          // this program (run as the worker in each pod)
  std::string command_line;  // printed in the header
  int pods = 8;
  int parallel = 0;  // cycles in flight; 0: pods / 2
  uint64_t cycles = 100000;
  uint64_t warmup = 2000;  // cycles before the baseline is taken
  uint64_t seed = 0;
  double fault_rate = 0.03;  // cycles with a kill, a mid-call close or an exit with offers
  double drop_rate = 0.05;   // cycles whose importer also drops an import without releasing it
  int slots = 16;            // region sizes (and pool buffers per pod)
  uint64_t min_region = 4096, max_region = 8 << 20, max_op = 4 << 20;
  int max_ops = 6;  // relay transfers per cycle (plus read-backs)
  int max_fault_delay_us = 4000;
  int progress_s = 5;
  int settle_s = 30;
  int relay_timeout_s = 30;
  int stuck_s = 120;  // a cycle older than this stops the soak
  std::string daemon_log_level = "warn";
  bool verbose = false;        // also print every error a fault explains
  int64_t corrupt_cycle = -1;  // tell this cycle's importer a wrong pattern: checks the checker
  // Pass/fail: after the run, against the baseline after the warm-up.
  int fd_tolerance = 0;
  int maps_tolerance = 16;   // beyond the baseline and two per thread added (stack, guard)
  int thread_tolerance = 8;  // threads beyond the baseline (gRPC sizes its pools on demand)
  long rss_tolerance_kib = 16 << 10;
};

int RunSoak(const SoakOptions& options);

}  // namespace podlink::soak
