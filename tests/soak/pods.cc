#include "tests/soak/pods.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace podlink::soak {
namespace {

std::mt19937_64& Rng() {
  static std::mt19937_64 rng(std::random_device{}());
  return rng;
}

// Shared levels (the root, kubepods.slice, the QoS slice), outermost first.
std::vector<std::string>& SharedDirs() {
  static auto* d = new std::vector<std::string>();
  return *d;
}

void RemoveDir(const std::string& p) {
  // Processes may take a moment to leave after being reaped.
  for (int i = 0; i < 200 && ::rmdir(p.c_str()) != 0 && errno == EBUSY; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::string Cgroup2Root() {
  std::ifstream f("/proc/self/mountinfo");
  std::string line;
  while (std::getline(f, line)) {
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
  uint64_t a = Rng()(), b = Rng()();
  return absl::StrFormat("%08x-%04x-4%03x-a%03x-%012x", a >> 32, (a >> 16) & 0xffff, a & 0xfff, b >> 52,
                         b & 0xffffffffffffULL);
}

std::string SoakKubeletRoot() { return absl::StrCat("/podlink-soak-", getpid()); }

absl::StatusOr<PodCgroup> PodCgroup::Create(const std::string& pod_uid) {
  std::string root = Cgroup2Root();
  if (root.empty()) return absl::FailedPreconditionError("the soak needs a writable cgroup2 mount (run as root)");
  PodCgroup cg;
  cg.pod_uid_ = pod_uid;
  uint64_t r = Rng()();
  std::string container = absl::StrFormat("%016x%016x%016x%016x", r, r ^ 0x5555, r ^ 0xaaaa, r ^ 0xffff);
  std::string u = absl::StrReplaceAll(pod_uid, {{"-", "_"}});
  std::vector<std::string> shared = {SoakKubeletRoot().substr(1), "kubepods.slice", "kubepods-besteffort.slice"};
  std::vector<std::string> own = {absl::StrCat("kubepods-besteffort-pod", u, ".slice"),
                                  absl::StrCat("cri-containerd-", container, ".scope")};
  std::string p = root;
  for (const auto& part : shared) {
    p += "/" + part;
    if (::mkdir(p.c_str(), 0755) == 0) {
      SharedDirs().push_back(p);
    } else if (errno != EEXIST) {
      return absl::InternalError(absl::StrCat("mkdir ", p, ": ", std::strerror(errno)));
    }
  }
  for (const auto& part : own) {
    p += "/" + part;
    if (::mkdir(p.c_str(), 0755) != 0)
      return absl::InternalError(absl::StrCat("mkdir ", p, ": ", std::strerror(errno)));
    cg.dirs_.push_back(p);
  }
  cg.path_ = p;
  return cg;
}

PodCgroup::PodCgroup(PodCgroup&& o) noexcept
    : dirs_(std::move(o.dirs_)), path_(std::move(o.path_)), pod_uid_(std::move(o.pod_uid_)) {
  o.dirs_.clear();
}

PodCgroup::~PodCgroup() {
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) RemoveDir(*it);
}

void RemoveSharedCgroups() {
  for (auto it = SharedDirs().rbegin(); it != SharedDirs().rend(); ++it) RemoveDir(*it);
  SharedDirs().clear();
}

PodProcess::PodProcess(const std::string& cgroup, const std::string& socket_dir, const std::vector<std::string>& argv,
                       const std::string& stderr_path) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    eof_ = reaped_ = true;
    return;
  }
  std::string procs = cgroup + "/cgroup.procs";
  std::vector<std::string> full = {"unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                                   "--uts",   "--ipc", "--net",  "--mount",      "--"};
  for (const auto& a : argv) full.push_back(a);
  pid_ = ::fork();
  if (pid_ < 0) {
    ::close(in[0]);
    ::close(in[1]);
    ::close(out[0]);
    ::close(out[1]);
    eof_ = reaped_ = true;  // reported as an unexpected exit, restarted
    return;
  }
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // unshare --kill-child takes the program with it
    int fd = ::open(procs.c_str(), O_WRONLY);
    if (fd < 0 || ::write(fd, "0", 1) != 1) ::_exit(126);
    ::close(fd);
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (err >= 0) ::dup2(err, 2);
    ::setenv("PODLINK_SOCKET_DIR", socket_dir.c_str(), 1);
    std::vector<char*> a;
    for (auto& s : full) a.push_back(s.data());
    a.push_back(nullptr);
    ::execvp("unshare", a.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  in_ = in[1];
  out_ = out[0];
  ::fcntl(out_, F_SETFL, O_NONBLOCK);
}

PodProcess::~PodProcess() {
  if (in_ >= 0) ::close(in_);
  if (!reaped_ && pid_ > 0) {
    Kill();
    int st;
    ::waitpid(pid_, &st, 0);
  }
  if (out_ >= 0) ::close(out_);
}

std::vector<nlohmann::json> PodProcess::ReadLines() {
  std::vector<nlohmann::json> lines;
  char b[65536];
  for (;;) {
    ssize_t n = ::read(out_, b, sizeof(b));
    if (n > 0) {
      buf_.append(b, n);
      continue;
    }
    if (n == 0) eof_ = true;
    break;  // EOF, EAGAIN or an error
  }
  size_t nl;
  while ((nl = buf_.find('\n')) != std::string::npos) {
    std::string line = buf_.substr(0, nl);
    buf_.erase(0, nl + 1);
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) j = {{"ev", "garbage"}, {"line", line.substr(0, 300)}};
    lines.push_back(std::move(j));
  }
  return lines;
}

void PodProcess::Send(const nlohmann::json& j) {
  std::string l = j.dump() + "\n";
  // Commands are small; a pipe takes them whole. A dead reader: EPIPE, ignored
  // (SIGPIPE is ignored by the driver).
  (void)!::write(in_, l.data(), l.size());
}

void PodProcess::Kill() {
  if (reaped_ || pid_ <= 0) return;
  std::ifstream f(absl::StrCat("/proc/", pid_, "/task/", pid_, "/children"));
  pid_t child = 0;
  if (f >> child && child > 0) {
    ::kill(child, SIGKILL);
  } else {
    ::kill(pid_, SIGKILL);
  }
}

bool PodProcess::Reap() {
  if (reaped_) return true;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == 0) return false;
  reaped_ = true;
  exit_code_ = r < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return true;
}

}  // namespace podlink::soak
