#include "tests/soak/daemon_process.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/unique_fd.h"

namespace podlink::soak {
namespace {

// A port the kernel considers free now (the daemon binds it right after).
int FreePort() {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (!s || ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return 0;
  }
  return ntohs(a.sin_port);
}

int CountDirEntries(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

int CountLines(const std::string& path) {
  std::ifstream f(path);
  if (!f) return -1;
  int n = 0;
  std::string line;
  while (std::getline(f, line)) ++n;
  return n;
}

long StatusField(const std::string& status, const char* key) {
  size_t at = status.find(key);
  return at == std::string::npos ? -1 : std::atol(status.c_str() + at + std::strlen(key));
}

std::string DescribeWait(int st) {
  if (WIFEXITED(st)) return absl::StrCat("exited ", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return absl::StrCat("killed by signal ", WTERMSIG(st));
  return "ended";
}

}  // namespace

std::pair<int, std::string> HttpGet(int port, const std::string& path, int timeout_ms) {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!s || ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return {-1, ""};
  std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (::send(s.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return {-1, ""};
  std::string resp;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    pollfd p{s.get(), POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, left) <= 0) return {-1, ""};
    char buf[16384];
    ssize_t n = ::recv(s.get(), buf, sizeof(buf), 0);
    if (n < 0) return {-1, ""};
    if (n == 0) break;
    resp.append(buf, n);
  }
  int code = -1;
  if (resp.rfind("HTTP/1.", 0) == 0 && resp.size() > 12) code = std::atoi(resp.c_str() + 9);
  size_t body = resp.find("\r\n\r\n");
  return {code, body == std::string::npos ? "" : resp.substr(body + 4)};
}

DaemonProcess::~DaemonProcess() { Stop(); }

absl::Status DaemonProcess::Start(const std::string& binary, const std::string& dir, const std::string& config_json,
                                  const std::vector<std::string>& extra_args) {
  std::string cfg = dir + "/config.json";
  std::ofstream(cfg) << config_json;
  log_ = dir + "/podlinkd.log";
  port_ = FreePort();
  if (port_ == 0) return absl::InternalError("no free TCP port on 127.0.0.1 for podlinkd's metrics");
  std::vector<std::string> args = {
      binary, "--socket-dir", dir, "--config", cfg, "--no-gpu", "--metrics-addr", absl::StrCat("127.0.0.1:", port_)};
  for (const auto& a : extra_args) args.push_back(a);
  pid_ = ::fork();
  if (pid_ < 0) return absl::InternalError("fork");
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive the soak
    int log = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ::dup2(log, 2);
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(null, 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  for (int i = 0; i < 3000; ++i) {
    if (!Alive()) {
      return absl::FailedPreconditionError(absl::StrCat("podlinkd ", end_, " before it was ready; see ", log_));
    }
    if (HttpGet(port_, "/readyz", 500).first == 200) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat("podlinkd not ready after 30 s; see ", log_));
}

bool DaemonProcess::Alive() {
  if (pid_ <= 0) return false;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == 0) return true;
  if (r == pid_) end_ = DescribeWait(st);
  pid_ = -1;
  return false;
}

int DaemonProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int st = 0;
  for (int i = 0; i < 1000 && ::waitpid(pid_, &st, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (i == 999) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &st, 0);
    }
  }
  end_ = DescribeWait(st);
  pid_ = -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

DaemonSample DaemonProcess::Sample() const {
  DaemonSample s;
  if (pid_ <= 0) return s;
  std::string proc = absl::StrCat("/proc/", pid_);
  s.fds = CountDirEntries(proc + "/fd");
  s.maps = CountLines(proc + "/maps");
  std::ifstream f(proc + "/status");
  std::stringstream ss;
  ss << f.rdbuf();
  s.rss_kib = StatusField(ss.str(), "VmRSS:");
  s.threads = static_cast<int>(StatusField(ss.str(), "Threads:"));
  auto [code, body] = HttpGet(port_, "/metrics");
  if (code == 200) {
    s.metrics_ok = true;
    for (absl::string_view line : absl::StrSplit(body, '\n')) {
      if (line.empty() || line[0] == '#' || line.find('{') != absl::string_view::npos) continue;
      std::vector<absl::string_view> f2 = absl::StrSplit(line, ' ', absl::SkipEmpty());
      double v = 0;
      if (f2.size() >= 2 && absl::SimpleAtod(f2[1], &v)) s.metrics[std::string(f2[0])] = v;
    }
  }
  return s;
}

std::vector<std::string> DaemonProcess::FdTargets() const {
  std::vector<std::string> out;
  if (pid_ <= 0) return out;
  std::string dir = absl::StrCat("/proc/", pid_, "/fd");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char buf[512];
    ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), buf, sizeof(buf) - 1);
    if (n <= 0) continue;
    std::string t(buf, n);
    // socket:[12345] -> socket: the inode says nothing across moments.
    if (size_t b = t.find(":["); b != std::string::npos) t = t.substr(0, b + 1);
    out.push_back(t);
  }
  ::closedir(d);
  return out;
}

std::vector<std::string> DaemonProcess::MapKinds() const {
  std::vector<std::string> out;
  if (pid_ <= 0) return out;
  std::ifstream f(absl::StrCat("/proc/", pid_, "/maps"));
  std::string line;
  while (std::getline(f, line)) {
    // start-end perms offset dev inode [path]
    std::vector<std::string> p = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (p.size() < 5) continue;
    size_t dash = p[0].find('-');
    uint64_t lo = std::strtoull(p[0].substr(0, dash).c_str(), nullptr, 16);
    uint64_t hi = std::strtoull(p[0].substr(dash + 1).c_str(), nullptr, 16);
    std::string path = p.size() > 5 ? p[5] : "[anon]";
    for (size_t k = 6; k < p.size(); ++k) path += " " + p[k];
    out.push_back(absl::StrCat(p[1], " ", (hi - lo) / 1024, "K ", path));
  }
  return out;
}

std::vector<std::string> DaemonProcess::ThreadNames() const {
  std::vector<std::string> out;
  if (pid_ <= 0) return out;
  std::string dir = absl::StrCat("/proc/", pid_, "/task");
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(dir + "/" + e->d_name + "/comm");
    std::string name;
    if (std::getline(f, name)) out.push_back(name);
  }
  ::closedir(d);
  return out;
}

std::string DiffKinds(std::vector<std::string> before, std::vector<std::string> after, size_t max_entries) {
  std::map<std::string, long> count;
  for (const auto& k : after) ++count[k];
  for (const auto& k : before) --count[k];
  std::vector<std::string> parts;
  for (const auto& [k, v] : count) {
    if (v != 0) parts.push_back(absl::StrCat(v > 0 ? "+" : "", v, " ", k));
  }
  if (parts.empty()) return "none";
  size_t n = parts.size();
  if (n > max_entries) parts.resize(max_entries);
  std::string s = absl::StrJoin(parts, ", ");
  if (n > max_entries) absl::StrAppend(&s, ", ... (", n - max_entries, " more kinds)");
  return s;
}

}  // namespace podlink::soak
