// The podlinkd a soak runs against: started on a private socket directory
// with --no-gpu and the standalone pod source, and sampled from outside
// (/proc/<pid>: descriptors, mappings, RSS, threads; /metrics).
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace podlink::soak {

struct DaemonSample {
  int fds = -1;       // entries in /proc/<pid>/fd
  int maps = -1;      // lines of /proc/<pid>/maps
  long rss_kib = -1;  // VmRSS
  int threads = -1;
  bool metrics_ok = false;
  std::map<std::string, double> metrics;  // unlabelled samples of /metrics, by name
  double Metric(const std::string& name) const {
    auto it = metrics.find(name);
    return it == metrics.end() ? -1 : it->second;
  }
};

class DaemonProcess {
 public:
  DaemonProcess() = default;
  ~DaemonProcess();  // SIGTERM, reaped
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Writes `config_json` into `dir`, starts `binary` serving `dir` and waits
  // until /readyz answers 200.
  absl::Status Start(const std::string& binary, const std::string& dir, const std::string& config_json,
                     const std::vector<std::string>& extra_args);
  // Stops it with SIGTERM; the exit status, or -1 if it was already gone.
  int Stop();
  bool Alive();
  pid_t pid() const { return pid_; }
  int metrics_port() const { return port_; }
  const std::string& log_path() const { return log_; }
  // How it ended, once it did ("exited 0", "killed by signal 11").
  const std::string& end() const { return end_; }

  DaemonSample Sample() const;
  // What its descriptors point at and what it has mapped, one entry each,
  // reduced to what identifies a kind ("memfd:podlink-host (deleted)",
  // "rw-p 8192 [anon]"), to diff two moments.
  std::vector<std::string> FdTargets() const;
  std::vector<std::string> MapKinds() const;
  std::vector<std::string> ThreadNames() const;  // /proc/<pid>/task/*/comm

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_;
  std::string end_;
};

// "+3 memfd:x, -1 rw-p 8192 [anon]": what `after` has more or less of than `before`.
std::string DiffKinds(std::vector<std::string> before, std::vector<std::string> after, size_t max_entries = 20);

// GET `path` from 127.0.0.1:`port`: the status code and the body (code -1
// when nothing answered within `timeout_ms`).
std::pair<int, std::string> HttpGet(int port, const std::string& path, int timeout_ms = 3000);

}  // namespace podlink::soak
