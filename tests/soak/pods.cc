#include "tests/soak/pods.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace podlink::soak {
namespace {

// How long a pod's cgroup directory may stay busy after its processes are reaped.
constexpr int kRemoveWaitMs = 2000;

}  // namespace

std::string SoakKubeletRoot() { return absl::StrCat("/podlink-soak-", getpid()); }

absl::StatusOr<PodCgroup> PodCgroup::Create(const std::string& pod_uid) {
  absl::StatusOr<std::vector<std::string>> dirs =
      testing::MakePodCgroup(SoakKubeletRoot(), pod_uid, "besteffort", testing::RandomContainerId());
  if (!dirs.ok()) return dirs.status();
  PodCgroup cg;
  cg.pod_uid_ = pod_uid;
  cg.dirs_ = *std::move(dirs);
  cg.path_ = cg.dirs_.back();
  return cg;
}

PodCgroup::PodCgroup(PodCgroup&& o) noexcept
    : dirs_(std::move(o.dirs_)), path_(std::move(o.path_)), pod_uid_(std::move(o.pod_uid_)) {
  o.dirs_.clear();
}

PodCgroup::~PodCgroup() {
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) testing::RemoveCgroupDir(*it, kRemoveWaitMs);
}

void RemoveSharedCgroups() { testing::RemoveSharedPodCgroups(kRemoveWaitMs); }

PodProcess::PodProcess(const std::string& cgroup, const std::string& socket_dir, const std::vector<std::string>& argv,
                       const std::string& stderr_path) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    eof_ = reaped_ = true;
    return;
  }
  // Everything the child needs is made before the fork: the soak's threads may hold the allocator's locks at
  // it, so the child only opens, dups and execs.
  const std::string procs = cgroup + "/cgroup.procs";
  std::vector<std::string> full = testing::PodUnshareCommand();
  for (const auto& a : argv) full.push_back(a);
  std::vector<char*> args;
  for (auto& s : full) args.push_back(s.data());
  args.push_back(nullptr);
  const std::string unshare = testing::OnPath(full.front());
  std::vector<std::string> env = testing::PodEnvironment(socket_dir);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
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
    ::execve(unshare.c_str(), args.data(), envp.data());
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
