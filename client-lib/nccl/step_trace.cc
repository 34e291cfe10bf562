#include "client-lib/nccl/step_trace.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "client-lib/nccl/plugin.h"

namespace podlink::ncclnet::trace {
namespace {

struct Buffer {
  std::mutex mu;  // Configure / Flush
  std::string dir;
  std::string path;
  std::unique_ptr<Step[]> steps;
  size_t cap = 0;
  std::atomic<size_t> next{0};
  std::atomic<size_t> written{0};
  std::atomic<bool> on{false};
  bool at_exit = false;
};

Buffer& B() {
  // Never destroyed: steps may be recorded while the process exits.
  alignas(Buffer) static unsigned char storage[sizeof(Buffer)];
  static Buffer* b = new (storage) Buffer();
  return *b;
}

struct FlushAtUnload {
  ~FlushAtUnload() { Flush(); }
};

}  // namespace

void Configure() {
  Buffer& b = B();
  std::lock_guard<std::mutex> l(b.mu);
  const char* dir = std::getenv("PODLINK_NCCL_STEP_TRACE");
  if (dir == nullptr || *dir == '\0' || b.steps != nullptr) return;
  b.dir = dir;
  b.cap = static_cast<size_t>(EnvInt("PODLINK_NCCL_STEP_TRACE_MAX", 1 << 18));
  if (b.cap == 0) return;
  b.steps.reset(new Step[b.cap]);
  b.on.store(true, std::memory_order_release);
  if (!b.at_exit) {
    b.at_exit = true;
    // Written at exit, or when the plugin is unloaded before: a static's
    // destructor is tied to this library (std::atexit is not, under
    // ThreadSanitizer's interceptor, which then calls into unloaded code).
    static FlushAtUnload flush_at_unload;
    (void)flush_at_unload;
  }
}

bool On() { return B().on.load(std::memory_order_relaxed); }

uint64_t Now() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void Record(const Step& s) {
  Buffer& b = B();
  size_t i = b.next.fetch_add(1, std::memory_order_relaxed);
  if (i < b.cap) b.steps[i] = s;
}

void Flush() {
  Buffer& b = B();
  std::lock_guard<std::mutex> l(b.mu);
  if (b.steps == nullptr) return;
  size_t end = std::min(b.next.load(), b.cap);
  size_t from = b.written.load();
  if (end <= from) return;
  if (b.path.empty()) {
    // Pods have PID namespaces (pid 1 in each): the host name and a random
    // suffix keep their files apart in a shared directory.
    char host[64] = {};
    ::gethostname(host, sizeof(host) - 1);
    char tail[32];
    std::snprintf(tail, sizeof(tail), ".%d.%08llx.tsv", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(Random64() & 0xffffffffu));
    b.path = b.dir + "/podlink-steps." + host + tail;
  }
  const std::string& path = b.path;
  FILE* f = std::fopen(path.c_str(), from == 0 ? "w" : "a");
  if (f == nullptr) {
    WARN("step trace: cannot write %s", path.c_str());
    return;
  }
  if (from == 0) std::fprintf(f, "kind\tconn\tseq\tindex\tsize\tt_try\tt_post\tt_submit\tt_done\n");
  for (size_t i = from; i < end; ++i) {
    const Step& s = b.steps[i];
    std::fprintf(f, "%c\t%llu\t%llu\t%d\t%llu\t%llu\t%llu\t%llu\t%llu\n", s.kind,
                 static_cast<unsigned long long>(s.conn), static_cast<unsigned long long>(s.seq), s.index,
                 static_cast<unsigned long long>(s.size), static_cast<unsigned long long>(s.t_try),
                 static_cast<unsigned long long>(s.t_post), static_cast<unsigned long long>(s.t_submit),
                 static_cast<unsigned long long>(s.t_done));
  }
  std::fclose(f);
  b.written.store(end);
  if (b.next.load() > b.cap) INFO("step trace: kept the first %zu steps (PODLINK_NCCL_STEP_TRACE_MAX)", b.cap);
}

}  // namespace podlink::ncclnet::trace
