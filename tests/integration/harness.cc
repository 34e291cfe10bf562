#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace podlink::testing {
namespace {

std::string ReadFile(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Binaries as built, unless the environment points elsewhere (the GPU machine runs a carried bundle). They are
// built beside the tests (the default target), not before them, so that no test's compile waits for podlinkd's
// link: one that is missing ends the run with what to build.
const char* BinPath(const char* env, const char* built) {
  const char* v = getenv(env);
  const char* path = v != nullptr && *v != '\0' ? v : built;
  if (access(path, X_OK) != 0) {
    std::fprintf(stderr, "%s: %s is not built (cmake --build <build dir> builds it) or not executable\n", env, path);
    std::exit(2);
  }
  return path;
}

// In a forked child, before exec: the child (podlinkd, or a pod's unshare, which takes its pod with it) dies with
// the test process. A test process killed by a signal (ctest's timeout, or its output pipe closed) left its podlinkd
// running otherwise, holding a port and its cgroups (three seen 2026-12-03). The signal follows the thread that
// forked, so the Daemon and Pod a test makes are made on its own thread, as every test here does.
void DieWithTheTest(pid_t test) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != test) _exit(125);  // the test was already gone
}

}  // namespace

Daemon::Daemon(const std::string& config_json, std::vector<std::string> extra_args, bool gpu,
               const std::string& netns) {
  char tmpl[] = "/tmp/podlink-it-XXXXXX";
  dir_ = ::mkdtemp(tmpl);
  std::string cfg = dir_ + "/config.json";
  // Pods made by PodCgroup are believed only under the test's kubelet root.
  nlohmann::json doc = nlohmann::json::parse(config_json, nullptr, false);
  if (doc.is_object() && !doc.contains("identity")) {
    doc["identity"] = {{"kubelet_cgroup_roots", {"/", "/kubelet.slice", TestKubeletRoot()}}};
    std::ofstream(cfg) << doc.dump();
  } else {
    std::ofstream(cfg) << config_json;
  }
  // Everything the child needs is made here: the test process has threads
  // (a test runtime's gRPC server, say), and a child of a threaded process may
  // only make async-signal-safe calls before exec — an allocation can wait
  // forever on a lock another thread held at the fork (seen once under ASan:
  // a podlinkd that never wrote a line).
  std::vector<std::string> args = {BinPath("PODLINKD_PATH", PODLINKD_PATH), "--socket-dir", dir_, "--config", cfg,
                                   "--metrics-addr", "127.0.0.1:0"};
  if (!gpu) args.push_back("--no-gpu");
  for (auto& a : extra_args) args.push_back(a);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log_path = dir_ + "/podlinkd.log";
  const std::string ns_path = netns.empty() ? std::string() : "/run/netns/" + netns;
  const pid_t test = ::getpid();
  pid_ = fork();
  if (pid_ == 0) {
    DieWithTheTest(test);
    int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(log, 2);
    if (!ns_path.empty()) {
      int ns = ::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) _exit(126);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  for (int i = 0; i < 3000; ++i) {  // GPU discovery can take seconds
    std::string log = Log();
    if (size_t at = log.find("event=ready"); at != std::string::npos) {
      size_t m = log.find("metrics=127.0.0.1:", at);
      if (m != std::string::npos) metrics_port_ = std::atoi(log.c_str() + m + 18);
      return;
    }
    if (!Alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "podlinkd did not become ready:\n" << Log();
}

Daemon::~Daemon() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int st;
    waitpid(pid_, &st, 0);
  }
  if (::testing::Test::HasFailure()) {
    std::cerr << "---- podlinkd log ----\n" << Log().substr(0, 20000) << "\n";
  }
  std::string cmd = "rm -rf '" + dir_ + "'";
  (void)!system(cmd.c_str());
}

std::optional<int> Daemon::Stop(int timeout_ms) {
  if (pid_ <= 0) return std::nullopt;
  kill(pid_, SIGTERM);
  std::optional<int> status;
  for (int waited = 0; waited <= timeout_ms; waited += 20) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      status = st;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!status.has_value()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_ = -1;
  return status;
}

bool Daemon::Alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

int Daemon::OpenFds() const {
  std::string cmd = absl::StrCat("ls /proc/", pid_, "/fd | wc -l");
  FILE* p = popen(cmd.c_str(), "r");
  int n = -1;
  if (p) {
    if (fscanf(p, "%d", &n) != 1) n = -1;
    pclose(p);
  }
  return n;
}

long Daemon::RssKb() const {
  std::string status = ReadFile(absl::StrCat("/proc/", pid_, "/status"));
  size_t at = status.find("VmRSS:");
  return at == std::string::npos ? -1 : std::atol(status.c_str() + at + 6);
}

std::string Daemon::Log() const { return ReadFile(dir_ + "/podlinkd.log"); }

bool Daemon::WaitForLog(const std::string& text, int timeout_ms) const {
  for (int waited = 0;; waited += 10) {
    if (Log().find(text) != std::string::npos) return true;
    if (waited >= timeout_ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// All pods of one test process live under one stand-in for the kubelet's
// cgroup root, which every Daemon of the process is configured with.
std::string TestKubeletRoot() { return absl::StrCat("/podlink-test-", getpid()); }

PodCgroup::PodCgroup(const std::string& pod_uid, const std::string& qos)
    : pod_uid_(pod_uid), container_id_(RandomContainerId()) {
  // The shared levels outlive single pods: removed when the test process exits.
  static const bool registered = [] { return std::atexit([] { RemoveSharedPodCgroups(0); }) == 0; }();
  (void)registered;
  absl::StatusOr<std::vector<std::string>> dirs = MakePodCgroup(TestKubeletRoot(), pod_uid, qos, container_id_);
  if (!dirs.ok()) {
    ADD_FAILURE() << dirs.status();
    return;
  }
  dirs_ = *std::move(dirs);
  path_ = dirs_.back();
}

PodCgroup::~PodCgroup() {
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) RemoveCgroupDir(*it, 1000);
}

std::string DemoPath() { return BinPath("PODLINK_DEMO_PATH", PODLINK_DEMO_PATH); }

Pod::Pod(const Daemon& d, const PodCgroup* cg, std::vector<std::string> args, const std::string& binary)
    : Pod(d, cg ? cg->path() : "", std::move(args), binary) {}

Pod::Pod(const Daemon& d, const std::string& cgroup_path, std::vector<std::string> args, const std::string& binary) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe";
    return;
  }
  // Made before the fork, as in Daemon: the child only makes async-signal-safe calls.
  const std::string procs = cgroup_path.empty() ? "" : cgroup_path + "/cgroup.procs";
  std::vector<std::string> full = PodUnshareCommand();
  full.push_back(binary.empty() ? DemoPath() : binary);
  for (auto& a : args) full.push_back(a);
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string unshare = OnPath(full.front());
  // The environment: this one, the daemon's socket directory, and under
  // ThreadSanitizer (scripts/sanitize.sh tsan) a report path of the pod's own:
  // every pod's process is pid 1 of its own PID namespace, so reports written
  // to <log_path>.<pid> would overwrite each other.
  static std::atomic<int> pods{0};
  std::vector<std::string> env = PodEnvironment(d.dir());
  for (std::string& opts : env) {
    if (!opts.starts_with("TSAN_OPTIONS=")) continue;
    if (size_t at = opts.find("log_path="); at != std::string::npos) {
      size_t end = opts.find(':', at);
      std::string path = opts.substr(at + 9, end == std::string::npos ? std::string::npos : end - at - 9);
      opts += absl::StrCat(":log_path=", path, "-pod", ::getpid(), "-", pods.fetch_add(1));
    }
  }
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t test = ::getpid();
  pid_ = fork();
  if (pid_ == 0) {
    DieWithTheTest(test);
    if (!procs.empty()) {
      int fd = ::open(procs.c_str(), O_WRONLY);
      if (fd < 0 || ::write(fd, "0", 1) != 1) _exit(126);
      ::close(fd);
    }
    dup2(in[0], 0);
    dup2(out[1], 1);
    execve(unshare.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  in_ = in[1];
  out_ = out[0];
}

Pod::~Pod() {
  if (in_ >= 0) ::close(in_);
  if (!waited_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    Wait();
  }
  if (out_ >= 0) ::close(out_);
}

std::optional<nlohmann::json> Pod::Next(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) {
        ADD_FAILURE() << "pod printed a non-JSON line: " << line;
        continue;
      }
      return j;
    }
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) return std::nullopt;
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) return std::nullopt;
    char b[4096];
    ssize_t n = ::read(out_, b, sizeof(b));
    if (n <= 0) return std::nullopt;
    buf_.append(b, n);
  }
}

nlohmann::json Pod::Expect(const std::string& event, int timeout_ms) {
  for (;;) {
    auto j = Next(timeout_ms);
    if (!j) {
      ADD_FAILURE() << "timed out waiting for event " << event;
      return nlohmann::json::object();
    }
    if ((*j)["event"] == event || (*j)["event"] == "error") return *j;
  }
}

void Pod::Send(const std::string& line) {
  std::string l = line + "\n";
  (void)!::write(in_, l.data(), l.size());
}

void Pod::Kill(int sig) { kill(pid_, sig); }

std::optional<int> Pod::WaitFor(int timeout_ms) {
  for (int waited = 0; !waited_; waited += 20) {
    pid_t r = waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      waited_ = true;
      break;
    }
    if (r < 0 || waited >= timeout_ms) return std::nullopt;
    usleep(20000);
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

int Pod::Wait() {
  if (!waited_) {
    waitpid(pid_, &status_, 0);
    waited_ = true;
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

Http HttpRequest(int port, const std::string& raw) {
  Http h;
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(s);
    return h;
  }
  (void)!::send(s, raw.data(), raw.size(), MSG_NOSIGNAL);
  std::string resp;
  char buf[4096];
  for (;;) {
    pollfd p{s, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) break;
    ssize_t n = ::recv(s, buf, sizeof(buf), 0);
    if (n <= 0) break;
    resp.append(buf, n);
  }
  ::close(s);
  if (resp.rfind("HTTP/1.0 ", 0) == 0) h.status = std::atoi(resp.c_str() + 9);
  size_t b = resp.find("\r\n\r\n");
  if (b != std::string::npos) h.body = resp.substr(b + 4);
  return h;
}

Http HttpGet(int port, const std::string& path) { return HttpRequest(port, "GET " + path + " HTTP/1.0\r\n\r\n"); }

std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> m;
  std::istringstream in(text);
  std::string line;
  std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?) (-?[0-9.eE+-]+|\+Inf|NaN)$)");
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch mt;
    EXPECT_TRUE(std::regex_match(line, mt, sample)) << "not a Prometheus sample: " << line;
    if (!mt.empty()) m[mt[1]] = std::stod(mt[3]);
  }
  return m;
}

std::optional<double> Daemon::Metric(const std::string& name) const {
  if (metrics_port_ <= 0) return std::nullopt;
  Http h = HttpGet(metrics_port_, "/metrics");
  if (h.status != 200) return std::nullopt;
  auto m = ParseMetrics(h.body);
  auto it = m.find(name);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

}  // namespace podlink::testing
