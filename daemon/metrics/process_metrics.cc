#include "daemon/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "daemon/metrics/metrics.h"

namespace podlink {
namespace {

std::string Slurp(const char* path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int OpenFds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n - 1;  // the directory being read
}

}  // namespace

std::string RenderProcessMetrics() {
  std::string out;
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    RenderFamily(&out, name, type, help, {{"", v}});
  };
  // /proc/self/stat after the command name: field 3 (state) is index 0.
  std::string stat = Slurp("/proc/self/stat");
  size_t close = stat.rfind(')');
  std::vector<std::string> f;
  if (close != std::string::npos) {
    std::istringstream in(stat.substr(close + 2));
    for (std::string x; in >> x;) f.push_back(x);
  }
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (f.size() > 21) {
    one("process_cpu_seconds_total", "counter", "user and system CPU time, in seconds",
        (std::stod(f[11]) + std::stod(f[12])) / tick);  // utime, stime (fields 14, 15)
    one("process_virtual_memory_bytes", "gauge", "virtual memory size", std::stod(f[20]));  // field 23
    one("process_resident_memory_bytes", "gauge", "resident memory size", std::stod(f[21]) * page);  // field 24
    // Field 22: start time in ticks since boot; the boot time is /proc/stat's btime.
    std::istringstream st(Slurp("/proc/stat"));
    for (std::string line; std::getline(st, line);) {
      if (line.rfind("btime ", 0) == 0) {
        one("process_start_time_seconds", "gauge", "start time since the Unix epoch, in seconds",
            std::stod(line.substr(6)) + std::stod(f[19]) / tick);
      }
    }
  }
  if (int fds = OpenFds(); fds >= 0) one("process_open_fds", "gauge", "open file descriptors", fds);
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    one("process_max_fds", "gauge", "the descriptor limit", static_cast<double>(nofile.rlim_cur));
  }
  return out;
}

}  // namespace podlink
