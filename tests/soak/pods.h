// The soak's "pods", made by the convention of tests/common/pod_cgroup.h as
// tests/integration/harness does: a kubepods-style cgroup under a private
// stand-in for the kubelet's cgroup root (which the daemon's config names in
// identity.kubelet_cgroup_roots), and processes started there in new PID,
// UTS, IPC, network and mount namespaces (unshare).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tests/common/pod_cgroup.h"

namespace podlink::soak {

using testing::RandomPodUid;

// The stand-in for the kubelet's cgroup root of this soak process, as the
// daemon sees cgroup paths ("/podlink-soak-<pid>").
std::string SoakKubeletRoot();

// kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/
// cri-containerd-<id>.scope under SoakKubeletRoot(). Removed (with the
// shared levels, once the last pod goes) by the destructor.
class PodCgroup {
 public:
  static absl::StatusOr<PodCgroup> Create(const std::string& pod_uid);
  PodCgroup(PodCgroup&& o) noexcept;
  PodCgroup& operator=(PodCgroup&&) = delete;
  ~PodCgroup();
  const std::string& path() const { return path_; }  // absolute, in the cgroupfs
  const std::string& pod_uid() const { return pod_uid_; }

 private:
  PodCgroup() = default;
  std::vector<std::string> dirs_;  // created by this pod, outermost first
  std::string path_, pod_uid_;
};

// Removes the soak's shared cgroup levels (call after every PodCgroup is gone).
void RemoveSharedCgroups();

// `argv` run inside `cgroup` in new namespaces, with stdin/stdout as pipes to
// this process (JSON lines) and stderr appended to `stderr_path`.
class PodProcess {
 public:
  PodProcess(const std::string& cgroup, const std::string& socket_dir, const std::vector<std::string>& argv,
             const std::string& stderr_path);
  ~PodProcess();  // SIGKILL and reap if still running
  PodProcess(const PodProcess&) = delete;
  PodProcess& operator=(const PodProcess&) = delete;

  int out_fd() const { return out_; }
  // Reads what is available; complete lines are returned parsed (a line that
  // is not JSON comes back as {"ev":"garbage","line":...}). EOF sets eof().
  std::vector<nlohmann::json> ReadLines();
  bool eof() const { return eof_; }
  void Send(const nlohmann::json& j);
  // SIGKILLs the program itself (the child of unshare), else unshare.
  void Kill();
  // Reaps unshare without blocking; true once it is gone.
  bool Reap();
  bool reaped() const { return reaped_; }
  int exit_code() const { return exit_code_; }  // 128+signal when killed
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;  // unshare
  int in_ = -1, out_ = -1;
  std::string buf_;
  bool eof_ = false, reaped_ = false;
  int exit_code_ = -1;
};

}  // namespace podlink::soak
