#include "tests/common/pod_cgroup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

namespace podlink::testing {
namespace {

// Protects the random generator and the list of shared levels.
absl::Mutex& Mu() {
  static auto* mu = new absl::Mutex();
  return *mu;
}

std::mt19937_64& Rng() ABSL_EXCLUSIVE_LOCKS_REQUIRED(Mu()) {
  static auto* rng = new std::mt19937_64(std::random_device{}());
  return *rng;
}

uint64_t Random() {
  absl::MutexLock lock(&Mu());
  return Rng()();
}

// Shared levels (the test root, kubepods.slice, a QoS slice) this process
// made, outermost first.
std::vector<std::string>& SharedDirs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(Mu()) {
  static auto* dirs = new std::vector<std::string>();
  return *dirs;
}

}  // namespace

std::string Cgroup2Root() {
  std::ifstream f("/proc/self/mountinfo");
  std::string line;
  while (std::getline(f, line)) {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    std::vector<std::string> halves = absl::StrSplit(line, " - ");
    if (halves.size() != 2) continue;
    std::vector<std::string> left = absl::StrSplit(halves[0], ' ');
    std::vector<std::string> right = absl::StrSplit(halves[1], ' ');
    if (right.empty() || right[0] != "cgroup2" || left.size() < 5) continue;
    if (::access(left[4].c_str(), W_OK) == 0) return left[4];
  }
  return "";
}

std::string RandomPodUid() {
  uint64_t a = Random(), b = Random();
  return absl::StrFormat("%08x-%04x-4%03x-a%03x-%012x", a >> 32, (a >> 16) & 0xffff, a & 0xfff, b >> 52,
                         b & 0xffffffffffffULL);
}

std::string RandomContainerId() {
  uint64_t r = Random();
  return absl::StrFormat("%016x%016x%016x%016x", r, r ^ 0x5555, r ^ 0xaaaa, r ^ 0xffff);
}

absl::StatusOr<std::vector<std::string>> MakePodCgroup(const std::string& kubelet_root, const std::string& pod_uid,
                                                       const std::string& qos, const std::string& container_id) {
  std::string root = Cgroup2Root();
  if (root.empty()) {
    return absl::FailedPreconditionError(
        "no writable cgroup2 mount in /proc/self/mountinfo: making test pods needs one (run as root)");
  }
  std::string u = absl::StrReplaceAll(pod_uid, {{"-", "_"}});
  std::vector<std::string> shared = absl::StrSplit(kubelet_root, '/', absl::SkipEmpty());
  shared.push_back("kubepods.slice");
  std::vector<std::string> own;
  if (qos == "guaranteed") {
    own.push_back(absl::StrCat("kubepods-pod", u, ".slice"));
  } else {
    shared.push_back(absl::StrCat("kubepods-", qos, ".slice"));
    own.push_back(absl::StrCat("kubepods-", qos, "-pod", u, ".slice"));
  }
  own.push_back(absl::StrCat("cri-containerd-", container_id, ".scope"));

  std::string p = root;
  for (const auto& part : shared) {
    p += "/" + part;
    if (::mkdir(p.c_str(), 0755) == 0) {
      absl::MutexLock lock(&Mu());
      SharedDirs().push_back(p);
    } else if (errno != EEXIST) {
      return absl::InternalError(absl::StrCat("mkdir ", p, ": ", std::strerror(errno)));
    }
  }
  std::vector<std::string> made;
  for (const auto& part : own) {
    p += "/" + part;
    if (::mkdir(p.c_str(), 0755) != 0) {
      absl::Status error = absl::InternalError(absl::StrCat("mkdir ", p, ": ", std::strerror(errno)));
      for (auto it = made.rbegin(); it != made.rend(); ++it) ::rmdir(it->c_str());
      return error;
    }
    made.push_back(p);
  }
  return made;
}

void RemoveCgroupDir(const std::string& path, int max_wait_ms) {
  for (int waited = 0; ::rmdir(path.c_str()) != 0 && errno == EBUSY && waited < max_wait_ms; waited += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void RemoveSharedPodCgroups(int max_wait_ms) {
  std::vector<std::string> dirs;
  {
    absl::MutexLock lock(&Mu());
    dirs.swap(SharedDirs());
  }
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) RemoveCgroupDir(*it, max_wait_ms);
}

std::string OnPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = ::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string full = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(full.c_str(), X_OK) == 0) return full;
  }
  return name;
}

std::vector<std::string> PodEnvironment(const std::string& socket_dir) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).starts_with("PODLINK_SOCKET_DIR=")) continue;
    env.emplace_back(*e);
  }
  env.push_back("PODLINK_SOCKET_DIR=" + socket_dir);
  return env;
}

std::vector<std::string> PodUnshareCommand() {
  return {"unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--ipc", "--net", "--mount", "--"};
}

absl::Status PodVeth(int pid_a, int pid_b, const std::string& if_a, const std::string& if_b,
                     const std::string& addr_a, const std::string& addr_b, const std::string& ip) {
  auto netns = [](long pid) {
    char buf[64] = {};
    ssize_t n = ::readlink(absl::StrCat("/proc/", pid, "/ns/net").c_str(), buf, sizeof(buf) - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  };
  const std::string host = netns(::getpid());
  for (int i = 0; i < 1000 && (netns(pid_a) == host || netns(pid_b) == host); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (netns(pid_a) == host || netns(pid_b) == host) {
    return absl::DeadlineExceededError(
        absl::StrCat("pods ", pid_a, " and ", pid_b, " have no network namespace of their own after 10 s"));
  }
  auto inside = [&](int pid, const std::string& dev, const std::string& addr) {
    return absl::StrCat("nsenter -t ", pid, " -n sh -c '", ip, " link set lo up && ", ip, " addr add ", addr,
                        " dev ", dev, " && ", ip, " link set ", dev, " up'");
  };
  for (const std::string& cmd : {absl::StrCat(ip, " link add ", if_a, " type veth peer name ", if_b),
                                 absl::StrCat(ip, " link set ", if_a, " netns ", pid_a),
                                 absl::StrCat(ip, " link set ", if_b, " netns ", pid_b), inside(pid_a, if_a, addr_a),
                                 inside(pid_b, if_b, addr_b)}) {
    int rc = std::system(cmd.c_str());
    if (rc != 0) return absl::InternalError(absl::StrCat("'", cmd, "' exited with ", rc));
  }
  return absl::OkStatus();
}

}  // namespace podlink::testing
