// podlink-soak: export/import/relay cycles between namespaced pods against
// one podlinkd, with seeded random faults; checks every byte and that the
// daemon's descriptors, mappings and memory come back flat. Not part of
// ctest: run tests/soak/run.sh (docs/soak.md). Needs root (cgroups, unshare).
#include <unistd.h>

#include <chrono>
#include <climits>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "tests/soak/driver.h"
#include "tests/soak/worker.h"

ABSL_FLAG(int, pods, 8, "pods (each its own cgroup and namespaces, one worker process)");
ABSL_FLAG(uint64_t, cycles, 100000, "export/import/relay cycles measured");
ABSL_FLAG(uint64_t, warmup, 2000, "cycles run (and their pods stopped) before the baseline is taken");
ABSL_FLAG(int, parallel, 0, "cycles in flight at once; 0: pods / 2");
ABSL_FLAG(uint64_t, seed, 0, "seed of every random choice; 0: from the clock (printed)");
ABSL_FLAG(double, fault_rate, 0.03, "fraction of cycles with a fault (kill, close mid-call, exit with offers)");
ABSL_FLAG(double, drop_rate, 0.05, "fraction of cycles whose importer drops an extra import without releasing it");
ABSL_FLAG(int, slots, 16, "distinct region sizes (buffers pooled per pod)");
ABSL_FLAG(uint64_t, min_region, 4096, "smallest exported region, bytes");
ABSL_FLAG(uint64_t, max_region, 8 << 20, "largest exported region, bytes");
ABSL_FLAG(uint64_t, max_op, 4 << 20, "largest relay transfer, bytes");
ABSL_FLAG(int, max_ops, 6, "relay transfers per cycle, at most (writes may add a read-back)");
ABSL_FLAG(int, max_fault_delay_us, 4000, "faults strike 0..this many microseconds into their step");
ABSL_FLAG(int, progress_s, 5, "seconds between progress lines");
ABSL_FLAG(int, settle_s, 30, "longest wait for the daemon to become quiet after the pods exit");
ABSL_FLAG(int, relay_timeout_s, 30, "a relay transfer not complete by then is an error");
ABSL_FLAG(int, stuck_s, 120, "a cycle older than this stops the soak");
ABSL_FLAG(int, fd_tolerance, 0, "descriptors the daemon may hold beyond the baseline at the end");
ABSL_FLAG(int, maps_tolerance, 16,
          "mappings the daemon may hold at the end beyond the baseline and two per thread added (stack, guard)");
ABSL_FLAG(int, thread_tolerance, 8, "threads the daemon may have beyond the baseline at the end");
ABSL_FLAG(int64_t, rss_tolerance_kib, 16 << 10, "RSS growth over the baseline allowed at the end, KiB");
ABSL_FLAG(std::string, podlinkd, PODLINKD_PATH, "podlinkd binary");
ABSL_FLAG(std::string, daemon_log_level, "warn", "podlinkd --log-level (info logs every export)");
ABSL_FLAG(bool, verbose, false, "also print every error that a cycle's fault explains");
ABSL_FLAG(int64_t, corrupt_cycle, -1,
          "tell this cycle's importer a wrong pattern seed, to see the soak report the mismatch and fail");
// Internal: how the driver starts the program inside each pod.
ABSL_FLAG(bool, worker, false, "run as a pod's worker (internal)");
ABSL_FLAG(int, pod, 0, "the worker's pod index (internal)");

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  absl::SetProgramUsageMessage(
      "podlink-soak [--cycles N] [--pods N] [--seed S] [--fault_rate F] ...: soak podlinkd with "
      "export/import/relay cycles and random faults between namespaced pods (root; docs/soak.md)");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) { return absl::StrContains(file, "tests/soak/"); };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_worker)) {
    podlink::soak::WorkerOptions w;
    w.pod = absl::GetFlag(FLAGS_pod);
    w.max_op = absl::GetFlag(FLAGS_max_op);
    w.relay_timeout_s = absl::GetFlag(FLAGS_relay_timeout_s);
    return podlink::soak::RunWorker(w);
  }
  podlink::soak::SoakOptions o;
  char self[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    std::cerr << "cannot find this program's path\n";
    return 2;
  }
  o.self.assign(self, n);
  o.podlinkd = absl::GetFlag(FLAGS_podlinkd);
  o.command_line = absl::StrJoin(args, " ");
  o.pods = absl::GetFlag(FLAGS_pods);
  o.cycles = absl::GetFlag(FLAGS_cycles);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.parallel = absl::GetFlag(FLAGS_parallel);
  o.seed = absl::GetFlag(FLAGS_seed);
  if (o.seed == 0) {
    o.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^ getpid();
  }
  o.fault_rate = absl::GetFlag(FLAGS_fault_rate);
  o.drop_rate = absl::GetFlag(FLAGS_drop_rate);
  o.slots = absl::GetFlag(FLAGS_slots);
  o.min_region = absl::GetFlag(FLAGS_min_region);
  o.max_region = absl::GetFlag(FLAGS_max_region);
  o.max_op = absl::GetFlag(FLAGS_max_op);
  o.max_ops = absl::GetFlag(FLAGS_max_ops);
  o.max_fault_delay_us = absl::GetFlag(FLAGS_max_fault_delay_us);
  o.progress_s = absl::GetFlag(FLAGS_progress_s);
  o.settle_s = absl::GetFlag(FLAGS_settle_s);
  o.relay_timeout_s = absl::GetFlag(FLAGS_relay_timeout_s);
  o.stuck_s = absl::GetFlag(FLAGS_stuck_s);
  o.fd_tolerance = absl::GetFlag(FLAGS_fd_tolerance);
  o.maps_tolerance = absl::GetFlag(FLAGS_maps_tolerance);
  o.thread_tolerance = absl::GetFlag(FLAGS_thread_tolerance);
  o.corrupt_cycle = absl::GetFlag(FLAGS_corrupt_cycle);
  o.rss_tolerance_kib = absl::GetFlag(FLAGS_rss_tolerance_kib);
  o.daemon_log_level = absl::GetFlag(FLAGS_daemon_log_level);
  o.verbose = absl::GetFlag(FLAGS_verbose);
  if (o.pods < 2 || o.slots < 1 || o.min_region < 1 || o.max_region < o.min_region || o.max_op < 1 || o.max_ops < 1) {
    std::cerr << "need --pods >= 2, --slots >= 1, 1 <= --min_region <= --max_region, --max_op >= 1, --max_ops >= 1\n";
    return 2;
  }
  if (::geteuid() != 0) {
    std::cerr << "podlink-soak needs root: it makes cgroups and namespaces (unshare)\n";
    return 2;
  }
  return podlink::soak::RunSoak(o);
}
