// Test harness: starts podlinkd on a temporary socket directory and runs
// podlink-demo inside "pods" made by the test itself: own PID, UTS, IPC,
// network and mount namespaces (unshare), placed in a kubepods-style cgroup
// so the daemon resolves a pod UID, container id and QoS class. The pod
// convention, and Cgroup2Root() and RandomPodUid(), are in
// tests/common/pod_cgroup.h.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/common/pod_cgroup.h"

namespace podlink::testing {

class Daemon {
 public:
  // Starts podlinkd with `config_json` (and --no-gpu unless `gpu`); waits
  // until it serves.
  explicit Daemon(const std::string& config_json, std::vector<std::string> extra_args = {}, bool gpu = false,
                  const std::string& netns = "");  // netns: run inside /run/netns/<netns> (an emulated node)
  ~Daemon();
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }
  int OpenFds() const;     // entries in /proc/<pid>/fd
  long RssKb() const;      // VmRSS
  std::string Log() const;
  // True once the log holds `text` (the daemon logs a refusal just after the
  // client sees it); false after `timeout_ms`.
  bool WaitForLog(const std::string& text, int timeout_ms = 5000) const;
  bool Alive() const;
  // SIGTERM, then waits up to `timeout_ms` for podlinkd to exit: its wait
  // status, or nullopt if it had not exited by then (it is killed).
  std::optional<int> Stop(int timeout_ms);
  int metrics_port() const { return metrics_port_; }
  // The value of the unlabeled sample `name` on /metrics (needs
  // --metrics-addr); nullopt when it is missing or unreachable.
  std::optional<double> Metric(const std::string& name) const;

 private:
  std::string dir_;
  pid_t pid_ = -1;
  int metrics_port_ = 0;
};

// A kubepods.slice/.../cri-containerd-<id>.scope cgroup under
// TestKubeletRoot() in the cgroup2 hierarchy; `qos` is "guaranteed" (no QoS
// slice), "burstable" or "besteffort". Failures are test failures.
class PodCgroup {
 public:
  PodCgroup(const std::string& pod_uid, const std::string& qos);
  ~PodCgroup();
  const std::string& path() const { return path_; }  // absolute, in the cgroupfs
  const std::string& pod_uid() const { return pod_uid_; }
  const std::string& container_id() const { return container_id_; }

 private:
  std::vector<std::string> dirs_;  // created, outermost first
  std::string path_, pod_uid_, container_id_;
};

class Pod {
 public:
  // Runs podlink-demo (or `binary`) with `args` in new namespaces inside `cg`
  // (nullptr: the test's own cgroup, namespaces still new).
  Pod(const Daemon& d, const PodCgroup* cg, std::vector<std::string> args, const std::string& binary = "");
  // The same in the cgroup at `cgroup_path` (absolute, in the cgroupfs; ""
  // for the test's own), running `binary` (default podlink-demo) as `argv`.
  Pod(const Daemon& d, const std::string& cgroup_path, std::vector<std::string> args, const std::string& binary);
  ~Pod();
  // Next JSON line from stdout, or nullopt after `timeout_ms` / EOF.
  std::optional<nlohmann::json> Next(int timeout_ms = 20000);
  // Reads lines until one has "event" == `event` (or "error"); returns it.
  nlohmann::json Expect(const std::string& event, int timeout_ms = 20000);
  void Send(const std::string& line);
  void Kill(int sig);
  int Wait();  // exit status (128+sig when killed)
  // The exit status once the pod ended within `timeout_ms`; nullopt if it is still running.
  std::optional<int> WaitFor(int timeout_ms);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string buf_;
  bool waited_ = false;
  int status_ = 0;
};

// An HTTP/1.0 exchange with 127.0.0.1:`port` (status 0 when none).
struct Http {
  int status = 0;
  std::string body;
};
Http HttpRequest(int port, const std::string& raw);
Http HttpGet(int port, const std::string& path);
// Prometheus text: "name{labels}" -> value; every sample line must parse.
std::map<std::string, double> ParseMetrics(const std::string& text);

// The stand-in for the kubelet's cgroup root that PodCgroup uses and every
// Daemon is configured with (identity.kubelet_cgroup_roots).
std::string TestKubeletRoot();

// podlink-demo's path (as built, or $PODLINK_DEMO_PATH).
std::string DemoPath();

}  // namespace podlink::testing
