// One side of the NCCL net plugin conformance test. It dlopens
// libnccl-net-podlink.so and drives it the way NCCL's proxy thread does:
// non-blocking listen/connect/accept retried until they yield a comm,
// isend/irecv retried while they return a NULL request, test() polled.
// Commands arrive as JSON lines on stdin, results leave as JSON lines.
//
//   nccl_net_peer <plugin.so> [v8|v11] [KEY=VALUE ...]   (environment for the plugin)
//
// PODLINK_TEST_MEM picks the memory the buffers live in: host (default),
// cuda (cuMemCreate with a POSIX-FD handle type on GPU 0: the plugin exports
// it as is) or cuda-noexport (cuMemCreate without a shareable handle type:
// the podlink transport needs a bounce buffer for it). Patterns are written
// and checked on the host and copied to and from the GPU around each call.
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client-lib/nccl/nccl_net_abi.h"
#include "common/cuda_driver.h"
#include "nlohmann/json.hpp"
#include "tests/ncclipc/nccl_ipc_standin.h"

namespace nabi = podlink::nccl_abi;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::string> g_log;
std::vector<std::string> g_warnings;  // what the plugin logged at NCCL's WARN level

void Logger(int level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  g_log.emplace_back(buf);
  if (level == nabi::kLogWarn) g_warnings.emplace_back(buf);
  std::fprintf(stderr, "[plugin %d] %s\n", level, buf);
}

void Emit(const json& j) {
  std::cout << j.dump() << std::endl;
}

int Threads() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// The plugin through one table version.
struct Api {
  void* lib = nullptr;
  bool v8 = false;
  nabi::NetV8* t8 = nullptr;
  nabi::NetV11* t11 = nullptr;
  void* ctx = nullptr;

  bool Open(const std::string& path, bool use_v8) {
    v8 = use_v8;
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return false;
    t8 = static_cast<nabi::NetV8*>(dlsym(lib, "ncclNetPlugin_v8"));
    t11 = static_cast<nabi::NetV11*>(dlsym(lib, "ncclNetPlugin_v11"));
    return t8 != nullptr && t11 != nullptr;
  }
  int Init() { return v8 ? t8->init(Logger) : t11->init(&ctx, 42, nullptr, Logger, nullptr); }
  int Finalize() { return v8 ? 0 : t11->finalize(ctx); }
  int Devices(int* n) { return v8 ? t8->devices(n) : t11->devices(n); }
  // What NCCL would learn of device `dev`.
  json Properties(int dev) {
    auto out = [](int r, const char* name, const char* pci, int speed, int ptr) {
      return json{{"result", r}, {"name", name != nullptr ? name : ""}, {"pci_path", pci != nullptr ? pci : ""},
                  {"speed", speed}, {"ptr_support", ptr}};
    };
    if (v8) {
      nabi::PropertiesV8 p{};
      int r = t8->getProperties(dev, &p);
      return out(r, p.name, p.pciPath, p.speed, p.ptrSupport);
    }
    nabi::PropertiesV11 p{};
    int r = t11->getProperties(dev, &p);
    return out(r, p.name, p.pciPath, p.speed, p.ptrSupport);
  }
  int Listen(void* h, void** l, int dev = 0) { return v8 ? t8->listen(dev, h, l) : t11->listen(ctx, dev, h, l); }
  int Connect(void* h, void** s, int dev = 0) {
    return v8 ? t8->connect(dev, h, s, nullptr) : t11->connect(ctx, dev, h, s, nullptr);
  }
  int Accept(void* l, void** r) { return v8 ? t8->accept(l, r, nullptr) : t11->accept(l, r, nullptr); }
  int RegMr(void* c, void* p, size_t n, int type, void** mh) {
    return v8 ? t8->regMr(c, p, n, type, mh) : t11->regMr(c, p, n, type, mh);
  }
  int DeregMr(void* c, void* mh) { return v8 ? t8->deregMr(c, mh) : t11->deregMr(c, mh); }
  int Isend(void* c, void* p, size_t n, int tag, void* mh, void** req) {
    return v8 ? t8->isend(c, p, static_cast<int>(n), tag, mh, req) : t11->isend(c, p, n, tag, mh, nullptr, req);
  }
  int Irecv(void* c, int n, void** p, size_t* sizes, int* tags, void** mh, void** req) {
    if (!v8) return t11->irecv(c, n, p, sizes, tags, mh, nullptr, req);
    int s[8];
    for (int i = 0; i < n; ++i) s[i] = static_cast<int>(sizes[i]);
    return t8->irecv(c, n, p, s, tags, mh, req);
  }
  int Test(void* req, int* done, int* sizes) { return v8 ? t8->test(req, done, sizes) : t11->test(req, done, sizes); }
  int CloseSend(void* c) { return v8 ? t8->closeSend(c) : t11->closeSend(c); }
  int CloseRecv(void* c) { return v8 ? t8->closeRecv(c) : t11->closeRecv(c); }
  int CloseListen(void* c) { return v8 ? t8->closeListen(c) : t11->closeListen(c); }
};

Api g;
void* g_listen = nullptr;
void* g_send = nullptr;
void* g_recv = nullptr;
char g_handle[nabi::kHandleMaxSize];

uint8_t Pattern(int msg, size_t i) { return static_cast<uint8_t>(msg * 131 + i * 7 + (i >> 12)); }

// GPU memory for the buffers (PODLINK_TEST_MEM=cuda|cuda-noexport), on GPU 0.
struct Gpu {
  const podlink::cu::Driver* d = nullptr;
  podlink::cu::Context ctx = nullptr;
  bool exportable = true;
  std::string error;
};
Gpu g_gpu;

bool UseGpu() { return g_gpu.d != nullptr; }

// Sets up GPU memory when PODLINK_TEST_MEM asks for it; false with g_gpu.error.
bool InitGpu() {
  const char* mem = std::getenv("PODLINK_TEST_MEM");
  std::string m = mem != nullptr ? mem : "host";
  if (m == "host") return true;
  if (m != "cuda" && m != "cuda-noexport") {
    g_gpu.error = "PODLINK_TEST_MEM must be host, cuda or cuda-noexport";
    return false;
  }
  auto d = podlink::cu::LoadDriver();
  if (!d.ok()) {
    g_gpu.error = std::string(d.status().message());
    return false;
  }
  if ((*d)->DevicePrimaryCtxRetain(&g_gpu.ctx, 0) != podlink::cu::kSuccess ||
      (*d)->CtxSetCurrent(g_gpu.ctx) != podlink::cu::kSuccess) {
    g_gpu.error = "no context on GPU 0";
    return false;
  }
  g_gpu.d = *d;
  g_gpu.exportable = m == "cuda";
  return true;
}

struct Buf {
  std::vector<uint8_t> mem;  // the host view: patterns are written and checked here
  void* mh = nullptr;
  void* comm = nullptr;
  // GPU memory (UseGpu()): its own cuMem allocation, mapped on GPU 0.
  podlink::cu::DevicePtr dptr = 0;
  size_t dsize = 0;
  podlink::cu::MemHandle handle = 0;
  bool ok = true;

  Buf(void* c, size_t n, uint8_t fill) : mem(n, fill), comm(c) {
    if (UseGpu()) ok = AllocGpu(n) && Upload();
    if (ok && g.RegMr(c, p(), n, UseGpu() ? nabi::kPtrCuda : nabi::kPtrHost, &mh) != 0) mh = nullptr;
  }
  ~Buf() {
    if (mh) g.DeregMr(comm, mh);
    if (dptr != 0) {
      g_gpu.d->MemUnmap(dptr, dsize);
      g_gpu.d->MemAddressFree(dptr, dsize);
    }
    if (handle != 0) g_gpu.d->MemRelease(handle);
  }
  // The buffer the plugin sees.
  void* p() { return UseGpu() ? reinterpret_cast<void*>(dptr) : mem.data(); }
  // Host view -> GPU (after writing a pattern), GPU -> host view (before checking one).
  // cuMemcpyHtoD from pageable memory may return before the DMA lands, and
  // the plugin reads the buffer from its own context and stream: wait, as
  // NCCL's kernel has finished writing a buffer before the proxy sends it.
  bool Upload() {
    return !UseGpu() || mem.empty() ||
           (Check(g_gpu.d->MemcpyHtoD(dptr, mem.data(), mem.size()), "HtoD") &&
            Check(g_gpu.d->CtxSynchronize(), "cuCtxSynchronize"));
  }
  bool Download() {
    return !UseGpu() || mem.empty() || Check(g_gpu.d->MemcpyDtoH(mem.data(), dptr, mem.size()), "DtoH");
  }
  // Keeps the first CUDA error for the scenario's result line.
  static bool Check(podlink::cu::Result r, const char* what) {
    if (r != podlink::cu::kSuccess && g_gpu.error.empty()) {
      g_gpu.error = std::string(what) + ": " + podlink::cu::CuStatus(r, "").ToString();
    }
    return r == podlink::cu::kSuccess;
  }

 private:
  bool AllocGpu(size_t n) {
    namespace cu = podlink::cu;
    const cu::Driver& d = *g_gpu.d;
    cu::MemAllocationProp prop{};
    prop.type = cu::kAllocationTypePinned;
    prop.location = {cu::kLocationTypeDevice, 0};
    prop.requestedHandleTypes = g_gpu.exportable ? cu::kHandleTypePosixFd : 0;
    size_t gran = 0;
    if (d.MemGetAllocationGranularity(&gran, &prop, cu::kGranularityRecommended) != 0 || gran == 0) return false;
    dsize = std::max<size_t>(gran, (n + gran - 1) / gran * gran);
    if (d.MemCreate(&handle, dsize, &prop, 0) != 0) return false;
    if (d.MemAddressReserve(&dptr, dsize, 0, 0, 0) != 0) return false;
    if (d.MemMap(dptr, dsize, 0, handle, 0) != 0) {
      d.MemAddressFree(dptr, dsize);
      dptr = 0;
      return false;
    }
    cu::MemAccessDesc access{{cu::kLocationTypeDevice, 0}, cu::kAccessProtReadWrite};
    return d.MemSetAccess(dptr, dsize, &access, 1) == 0;
  }
};

// Retries a call that returns a NULL request for "not now".
int PostUntil(const std::function<int(void**)>& post, void** req, int timeout_ms = 20000) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    *req = nullptr;
    int r = post(req);
    if (r != 0 || *req != nullptr) return r;
    if (Clock::now() > deadline) return -1;
  }
}

// Polls test() until done; returns the ncclResult (-1 on timeout).
int WaitReq(void* req, int* sizes, int timeout_ms = 30000) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int done = 0;
    int r = g.Test(req, &done, sizes);
    if (r != 0) return r;
    if (done) return 0;
    if (Clock::now() > deadline) return -1;
  }
}

// Small enough to sit in the sockets' buffers unread (TCP), so the sender
// finishes and closes before the receiver reads anything.
constexpr size_t kCloseAfterSendSize = 200 * 1000;

// The "latency" scenario: messages of these sizes, this many each.
constexpr size_t kLatencySizes[] = {8, 512, 4096, 65536};
constexpr int kLatencyCount = 200;

size_t OrderSize(int i) { return 1 + static_cast<size_t>(i) * 4099; }

json RunSend(const std::string& sc) {
  json out = {{"event", "done"}, {"ok", false}};
  void* c = g_send;
  if (sc == "ordering" || sc == "large") {
    int count = sc == "ordering" ? 32 : 2;
    std::vector<std::unique_ptr<Buf>> bufs;
    std::vector<void*> reqs(count);
    for (int i = 0; i < count; ++i) {
      size_t n = sc == "ordering" ? OrderSize(i) : (i == 0 ? (48u << 20) : (3u << 20) + 5);
      bufs.push_back(std::make_unique<Buf>(c, n, 0));
      for (size_t k = 0; k < n; ++k) bufs.back()->mem[k] = Pattern(i, k);
      if (!bufs.back()->ok || !bufs.back()->Upload()) return out.update({{"error", "gpu buffer"}}), out;
      int r = PostUntil([&](void** q) { return g.Isend(c, bufs[i]->p(), n, 7, bufs[i]->mh, q); }, &reqs[i]);
      if (r != 0) return out.update({{"error", "isend"}, {"result", r}, {"msg", i}}), out;
    }
    for (int i = 0; i < count; ++i) {
      int size = -1;
      int r = WaitReq(reqs[i], &size);
      if (r != 0) return out.update({{"error", "test"}, {"result", r}, {"msg", i}}), out;
    }
    out["ok"] = true;
  } else if (sc == "latency") {
    // One message at a time, each waited for, as NCCL's sendrecv of a small
    // size: the time per message is the transport's round trip.
    for (size_t n : kLatencySizes) {
      Buf b(c, n, 0);
      for (size_t k = 0; k < n; ++k) b.mem[k] = Pattern(static_cast<int>(n & 0xff), k);
      if (!b.ok || !b.Upload()) return out.update({{"error", "gpu buffer"}}), out;
      for (int i = 0; i < kLatencyCount; ++i) {
        void* q = nullptr;
        int r = PostUntil([&](void** x) { return g.Isend(c, b.p(), n, 7, b.mh, x); }, &q);
        if (r == 0) r = WaitReq(q, nullptr);
        if (r != 0) return out.update({{"error", "latency send"}, {"result", r}, {"size", n}}), out;
      }
    }
    out["ok"] = true;
  } else if (sc == "grouped") {
    const int tags[4] = {103, 101, 100, 102};
    const size_t sizes[4] = {1000, 2000, 3000, 0};
    std::vector<std::unique_ptr<Buf>> bufs;
    void* reqs[4];
    for (int i = 0; i < 4; ++i) {
      bufs.push_back(std::make_unique<Buf>(c, 4096, static_cast<uint8_t>(tags[i])));
      int r = PostUntil([&](void** q) { return g.Isend(c, bufs[i]->p(), sizes[i], tags[i], bufs[i]->mh, q); },
                        &reqs[i]);
      if (r != 0) return out.update({{"error", "isend"}, {"result", r}}), out;
    }
    for (void* q : reqs) {
      if (WaitReq(q, nullptr) != 0) return out.update({{"error", "test"}}), out;
    }
    out["ok"] = true;
  } else if (sc == "smaller") {
    Buf b(c, 100, 0x5a);
    void* q;
    if (PostUntil([&](void** r) { return g.Isend(c, b.p(), 100, 7, b.mh, r); }, &q) != 0 ||
        WaitReq(q, nullptr) != 0) {
      return out.update({{"error", "send 100"}}), out;
    }
    if (PostUntil([&](void** r) { return g.Isend(c, b.p(), 0, 7, b.mh, r); }, &q) != 0 ||
        WaitReq(q, nullptr) != 0) {
      return out.update({{"error", "send 0"}}), out;
    }
    out["ok"] = true;
  } else if (sc == "truncate") {
    Buf b(c, 4096, 1);
    void* q = nullptr;
    int r = PostUntil([&](void** x) { return g.Isend(c, b.p(), 4096, 7, b.mh, x); }, &q);
    int size = -1;
    if (r == 0 && q != nullptr) r = WaitReq(q, &size);
    out["result"] = r;
    out["size"] = size;
    out["ok"] = r == 0 && size == 1024;  // what fitted was sent, as NCCL's IB transport does
  } else if (sc == "close-after-send") {
    // One message, then the comm is closed as soon as the send reports done;
    // the receiver reads the message only afterwards.
    Buf b(c, kCloseAfterSendSize, 0);
    for (size_t k = 0; k < b.mem.size(); ++k) b.mem[k] = Pattern(5, k);
    if (!b.ok || !b.Upload()) return out.update({{"error", "gpu buffer"}}), out;
    void* q = nullptr;
    int r = PostUntil([&](void** x) { return g.Isend(c, b.p(), b.mem.size(), 7, b.mh, x); }, &q);
    if (r == 0) r = WaitReq(q, nullptr);
    out["result"] = r;
    out["ok"] = r == 0 && g.CloseSend(c) == 0;
    g_send = nullptr;
  } else if (sc == "inflight-close") {
    std::vector<std::unique_ptr<Buf>> bufs;
    for (int i = 0; i < 4; ++i) {
      bufs.push_back(std::make_unique<Buf>(c, 1 << 20, 9));
      void* q;
      int r = PostUntil([&](void** x) { return g.Isend(c, bufs[i]->p(), 1 << 20, 7, bufs[i]->mh, x); }, &q);
      if (r != 0) return out.update({{"error", "isend"}, {"result", r}}), out;
    }
    out["ok"] = g.CloseSend(c) == 0;  // four sends never tested
    g_send = nullptr;
  } else {
    out["error"] = "unknown scenario";
  }
  return out;
}

json RunRecv(const std::string& sc) {
  json out = {{"event", "done"}, {"ok", false}};
  void* c = g_recv;
  int tag7 = 7;
  if (sc == "ordering" || sc == "large") {
    int count = sc == "ordering" ? 32 : 2;
    size_t cap = sc == "ordering" ? 256 << 10 : 64 << 20;
    std::vector<std::unique_ptr<Buf>> bufs;
    std::vector<void*> reqs(count);
    for (int i = 0; i < count; ++i) {
      bufs.push_back(std::make_unique<Buf>(c, cap, 0xEE));
      void* p = bufs[i]->p();
      int r = PostUntil([&](void** q) { return g.Irecv(c, 1, &p, &cap, &tag7, &bufs[i]->mh, q); }, &reqs[i]);
      if (r != 0) return out.update({{"error", "irecv"}, {"result", r}}), out;
    }
    if (count == 32) {
      // A 33rd receive while 32 are in flight: "not now", nothing consumed.
      Buf extra(c, 64, 0);
      void* p = extra.p();
      size_t n = 64;
      void* q = reinterpret_cast<void*>(nabi::kOptionalRecvCompletion);
      int r = g.Irecv(c, 1, &p, &n, &tag7, &extra.mh, &q);
      out["33rd_result"] = r;
      out["33rd_null"] = q == nullptr;
    }
    for (int i = 0; i < count; ++i) {
      int size = -1;
      int r = WaitReq(reqs[i], &size);
      if (r != 0) return out.update({{"error", "test"}, {"result", r}, {"msg", i}}), out;
      if (!bufs[i]->Download()) return out.update({{"error", "gpu download"}}), out;
      size_t want = sc == "ordering" ? OrderSize(i) : (i == 0 ? (48u << 20) : (3u << 20) + 5);
      if (static_cast<size_t>(size) != want) {
        return out.update({{"error", "size"}, {"msg", i}, {"got", size}, {"want", want}}), out;
      }
      for (size_t k = 0; k < want; ++k) {
        if (bufs[i]->mem[k] != Pattern(i, k)) return out.update({{"error", "content"}, {"msg", i}, {"at", k}}), out;
      }
      if (cap > want && bufs[i]->mem[want] != 0xEE) return out.update({{"error", "wrote past size"}}), out;
    }
    out["ok"] = true;
  } else if (sc == "latency") {
    json us = json::object();
    for (size_t n : kLatencySizes) {
      Buf b(c, n, 0);
      void* p = b.p();
      size_t cap = n;
      auto t0 = Clock::now();
      for (int i = 0; i < kLatencyCount; ++i) {
        void* q = nullptr;
        int size = -1;
        int r = PostUntil([&](void** x) { return g.Irecv(c, 1, &p, &cap, &tag7, &b.mh, x); }, &q);
        if (r == 0) r = WaitReq(q, &size);
        if (r != 0 || static_cast<size_t>(size) != n) {
          return out.update({{"error", "latency recv"}, {"result", r}, {"size", n}, {"got", size}}), out;
        }
      }
      double per = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kLatencyCount;
      if (!b.Download()) return out.update({{"error", "gpu download"}}), out;
      for (size_t k = 0; k < n; ++k) {
        if (b.mem[k] != Pattern(static_cast<int>(n & 0xff), k)) {
          return out.update({{"error", "content"}, {"size", n}, {"at", k}}), out;
        }
      }
      us[std::to_string(n)] = per;
    }
    out["us_per_message"] = us;
    out["ok"] = true;
  } else if (sc == "grouped") {
    std::vector<std::unique_ptr<Buf>> bufs;
    void* ptrs[4];
    void* mhs[4];
    size_t caps[4] = {4096, 4096, 4096, 4096};
    int tags[4] = {100, 101, 102, 103};
    for (int i = 0; i < 4; ++i) {
      bufs.push_back(std::make_unique<Buf>(c, 4096, 0));
      ptrs[i] = bufs[i]->p();
      mhs[i] = bufs[i]->mh;
    }
    void* q;
    if (PostUntil([&](void** x) { return g.Irecv(c, 4, ptrs, caps, tags, mhs, x); }, &q) != 0) {
      return out.update({{"error", "irecv"}}), out;
    }
    int sizes[4] = {-1, -1, -1, -1};
    if (WaitReq(q, sizes) != 0) return out.update({{"error", "test"}}), out;
    for (auto& b : bufs) {
      if (!b->Download()) return out.update({{"error", "gpu download"}}), out;
    }
    out["sizes"] = {sizes[0], sizes[1], sizes[2], sizes[3]};
    bool ok = sizes[0] == 3000 && sizes[1] == 2000 && sizes[2] == 0 && sizes[3] == 1000;
    for (int i = 0; i < 4 && ok; ++i) {
      for (int k = 0; k < sizes[i]; ++k) ok &= bufs[i]->mem[k] == static_cast<uint8_t>(tags[i]);
    }
    out["ok"] = ok;
  } else if (sc == "smaller") {
    Buf b(c, 1 << 20, 0);
    void* p = b.p();
    size_t cap = 1 << 20;
    void* q;
    int s1 = -1, s2 = -1;
    if (PostUntil([&](void** x) { return g.Irecv(c, 1, &p, &cap, &tag7, &b.mh, x); }, &q) != 0 ||
        WaitReq(q, &s1) != 0) {
      return out.update({{"error", "recv 1"}}), out;
    }
    b.Download();
    bool content = b.mem[0] == 0x5a && b.mem[99] == 0x5a && b.mem[100] == 0;
    if (PostUntil([&](void** x) { return g.Irecv(c, 1, &p, &cap, &tag7, &b.mh, x); }, &q) != 0 ||
        WaitReq(q, &s2) != 0) {
      return out.update({{"error", "recv 2"}}), out;
    }
    out["sizes"] = {s1, s2};
    out["ok"] = s1 == 100 && s2 == 0 && content;
  } else if (sc == "truncate") {
    Buf b(c, 1024, 0);
    void* p = b.p();
    size_t cap = 1024;
    void* q;
    int r = PostUntil([&](void** x) { return g.Irecv(c, 1, &p, &cap, &tag7, &b.mh, x); }, &q);
    int size = -1;
    if (r == 0) r = WaitReq(q, &size);
    b.Download();
    out["result"] = r;
    out["size"] = size;
    out["ok"] = r == 0 && size == 1024 && b.mem[0] == 1 && b.mem[1023] == 1;
  } else if (sc == "close-after-send") {
    // Two receives; the sender matches the first and closes. Only after the
    // harness says "go" (the sender has closed) is the first one tested: it
    // must complete with every byte, the sender's close notwithstanding. The
    // second stays unmatched and is closed in flight.
    Buf first(c, kCloseAfterSendSize, 0), second(c, 4096, 0);
    void* p1 = first.p();
    void* p2 = second.p();
    size_t cap1 = first.mem.size(), cap2 = second.mem.size();
    void *q1 = nullptr, *q2 = nullptr;
    if (PostUntil([&](void** x) { return g.Irecv(c, 1, &p1, &cap1, &tag7, &first.mh, x); }, &q1) != 0 ||
        PostUntil([&](void** x) { return g.Irecv(c, 1, &p2, &cap2, &tag7, &second.mh, x); }, &q2) != 0) {
      return out.update({{"error", "irecv"}}), out;
    }
    Emit({{"event", "posted"}});
    std::string go;
    if (!std::getline(std::cin, go)) return out.update({{"error", "no go"}}), out;
    int size = -1;
    int r = WaitReq(q1, &size);
    first.Download();
    out["result"] = r;
    out["size"] = size;
    bool content = r == 0 && size == static_cast<int>(kCloseAfterSendSize);
    for (size_t k = 0; content && k < first.mem.size(); ++k) content = first.mem[k] == Pattern(5, k);
    out["ok"] = content && g.CloseRecv(c) == 0;
    g_recv = nullptr;
  } else if (sc == "inflight-close") {
    std::vector<std::unique_ptr<Buf>> bufs;
    for (int i = 0; i < 4; ++i) {
      bufs.push_back(std::make_unique<Buf>(c, 1 << 20, 0));
      void* p = bufs[i]->p();
      size_t cap = 1 << 20;
      void* q;
      if (PostUntil([&](void** x) { return g.Irecv(c, 1, &p, &cap, &tag7, &bufs[i]->mh, x); }, &q) != 0) {
        return out.update({{"error", "irecv"}}), out;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    out["ok"] = g.CloseRecv(c) == 0;  // four receives never tested
    g_recv = nullptr;
  } else {
    out["error"] = "unknown scenario";
  }
  return out;
}

}  // namespace

// st_dev of /dev/shm, as NCCL compares it between ranks.
uint64_t ShmDev() {
  struct stat st {};
  return ::stat("/dev/shm", &st) == 0 ? static_cast<uint64_t>(st.st_dev) : 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: nccl_net_peer <plugin.so> [v8|v11] [KEY=VALUE ...]\n");
    return 2;
  }
  bool use_v8 = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "v8") use_v8 = true;
    else if (a.find('=') != std::string::npos) putenv(argv[i]);
  }
  std::string line;
  int threads_before = Threads();
  while (std::getline(std::cin, line)) {
    json cmd = json::parse(line, nullptr, false);
    if (cmd.is_discarded()) continue;
    std::string what = cmd.value("cmd", "");
    if (what == "init") {
      // The plugin reads its step-trace setting at init.
      if (cmd.contains("step_trace")) ::setenv("PODLINK_NCCL_STEP_TRACE", cmd["step_trace"].get<std::string>().c_str(), 1);
      if (!InitGpu()) {
        Emit({{"event", "error"}, {"error", g_gpu.error}});
        continue;
      }
      // The baseline for finalize's thread check: CUDA's own threads (started
      // by the application's cuInit above) are not the plugin's.
      threads_before = Threads();
      if (!g.Open(argv[1], use_v8)) {
        Emit({{"event", "error"}, {"error", dlerror() ? dlerror() : "dlsym"}});
        continue;
      }
      int r = g.Init();
      int n = 0;
      g.Devices(&n);
      json devices = json::array();
      for (int i = 0; i < n && r == 0; ++i) devices.push_back(g.Properties(i));
      auto env = [](const char* name) {
        const char* v = std::getenv(name);
        return std::string(v != nullptr ? v : "");
      };
      Emit({{"event", "ready"}, {"result", r}, {"ndev", n}, {"nccl_proto", env("NCCL_PROTO")},
            {"nccl_min_nchannels", env("NCCL_MIN_NCHANNELS")}, {"nccl_buffsize", env("NCCL_BUFFSIZE")},
            {"nccl_nchannels_per_net_peer", env("NCCL_NCHANNELS_PER_NET_PEER")},
            {"nccl_min_p2p_nchannels", env("NCCL_MIN_P2P_NCHANNELS")},
            {"nccl_max_p2p_nchannels", env("NCCL_MAX_P2P_NCHANNELS")},
            {"nccl_p2p_net_chunksize", env("NCCL_P2P_NET_CHUNKSIZE")},
            {"nccl_p2p_ll_threshold", env("NCCL_P2P_LL_THRESHOLD")}, {"nccl_hostid", env("NCCL_HOSTID")},
            {"nccl_tuner_plugin", env("NCCL_TUNER_PLUGIN")},
            {"shm_dev", ShmDev()}, {"warnings", g_warnings}, {"gpu", UseGpu()},
            {"devices", devices}});
    } else if (what == "ipc_bind") {
      // NCCL's order: the proxy binds its IPC socket (end of bootstrap), then
      // the topology asks the net plugin for its devices' properties; then
      // the socket serves requests (one thread, as NCCL's UDS proxy thread).
      int rank = cmd.value("rank", 0);
      uint64_t hash = cmd.value("hash", uint64_t{0});
      int sock = nccl_standin::Bind(rank, hash);
      json props = g.Properties(0);
      if (sock >= 0) {
        std::thread([sock, rank, hash] {
          while (!nccl_standin::ServeOne(sock, rank, "podlink-" + std::to_string(hash), 30000).empty()) {
          }
          ::close(sock);
        }).detach();
      }
      Emit({{"event", "ipc_bound"}, {"ok", sock >= 0}, {"properties", props}});
    } else if (what == "ipc_request") {
      Emit({{"event", "ipc_answer"},
            {"answer", nccl_standin::Request(cmd.value("rank", 0), cmd.value("peer_rank", 1),
                                             cmd.value("peer_hash", uint64_t{0}), cmd.value("fd", "socket"))}});
    } else if (what == "listen") {
      int r = g.Listen(g_handle, &g_listen, cmd.value("dev", 0));
      std::string hex;
      char b[3];
      for (unsigned char ch : g_handle) std::snprintf(b, 3, "%02x", ch), hex += b;
      Emit({{"event", "handle"}, {"result", r}, {"hex", hex}});
    } else if (what == "accept") {
      auto deadline = Clock::now() + std::chrono::milliseconds(cmd.value("timeout_ms", 20000));
      int tries = 0, r = 0;
      g_recv = nullptr;
      while (g_recv == nullptr && Clock::now() < deadline) {
        ++tries;
        r = g.Accept(g_listen, &g_recv);
        if (r != 0) break;
      }
      Emit({{"event", "accepted"}, {"result", r}, {"tries", tries}, {"ok", g_recv != nullptr}});
    } else if (what == "connect") {
      std::string hex = cmd["hex"];
      char h[nabi::kHandleMaxSize] = {};
      for (size_t i = 0; i < sizeof(h) && 2 * i + 1 < hex.size(); ++i) {
        h[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
      }
      if (cmd.value("corrupt", "") == "magic") h[0] ^= 0x55;
      if (cmd.value("corrupt", "") == "nonce") h[32] ^= 0x55;  // WireHandle::nonce
      if (cmd.value("corrupt", "") == "garbage") {
        for (char& ch : h) ch = static_cast<char>(std::rand());
      }
      auto deadline = Clock::now() + std::chrono::milliseconds(cmd.value("timeout_ms", 20000));
      int tries = 0, r = 0;
      g_send = nullptr;
      size_t log_mark = g_log.size();
      while (g_send == nullptr && Clock::now() < deadline) {
        ++tries;
        r = g.Connect(h, &g_send, cmd.value("dev", 0));
        if (r != 0) break;
      }
      std::string transport;
      for (size_t i = log_mark; i < g_log.size(); ++i) {
        if (g_log[i].find("via podlink") != std::string::npos) transport = "podlink";
        if (g_log[i].find("via TCP") != std::string::npos) transport = "TCP";
        if (g_log[i].find("via mesh") != std::string::npos) transport = "mesh";
      }
      Emit({{"event", "connected"}, {"result", r}, {"tries", tries}, {"ok", g_send != nullptr},
            {"transport", transport}});
    } else if (what == "send" || what == "recv") {
      json o = what == "send" ? RunSend(cmd["scenario"]) : RunRecv(cmd["scenario"]);
      if (!g_gpu.error.empty()) o["cuda_error"] = g_gpu.error;
      Emit(o);
    } else if (what == "close") {
      int r = 0;
      if (g_send) r |= g.CloseSend(g_send);
      if (g_recv) r |= g.CloseRecv(g_recv);
      if (g_listen && cmd.value("listen", false)) r |= g.CloseListen(g_listen), g_listen = nullptr;
      g_send = g_recv = nullptr;
      Emit({{"event", "closed"}, {"result", r}});
    } else if (what == "finalize") {
      int r = g.Finalize();
      int rc = dlclose(g.lib);
      g.lib = nullptr;
      // NCCL 2.28 may load the plugin again for the next communicator.
      bool reopen = g.Open(argv[1], use_v8) && g.Init() == 0;
      int r2 = g.Finalize();
      int rc2 = dlclose(g.lib);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      Emit({{"event", "finalized"}, {"result", r}, {"dlclose", rc}, {"reopen", reopen}, {"result2", r2},
            {"dlclose2", rc2}, {"threads_before", threads_before}, {"threads_after", Threads()}});
    } else if (what == "tune") {
      // The tuner the way NCCL 2.28 drives it: init per communicator, then
      // getCollInfo per collective with NCCL's cost table, then destroy.
      auto* tuner = static_cast<nabi::TunerV4*>(dlsym(g.lib, "ncclTunerPlugin_v4"));
      if (tuner == nullptr) {
        Emit({{"event", "tuned"}, {"error", "no ncclTunerPlugin_v4"}});
        continue;
      }
      void* tctx = nullptr;
      int r = tuner->init(cmd.value("ranks", 2), cmd.value("nodes", 2), Logger, &tctx);
      constexpr int kAlgos = 7, kProtos = 3;
      float table[kAlgos][kProtos];
      for (int a = 0; a < kAlgos; ++a) {
        for (int p = 0; p < kProtos; ++p) table[a][p] = (a == 1) ? 10.0f * (p + 1) : -1.0f;
      }
      float before[kAlgos][kProtos];
      std::memcpy(before, table, sizeof(table));
      json channels = json::array();
      for (size_t bytes : cmd.value("sizes", std::vector<size_t>{})) {
        int nc = 0;
        int rr = tuner->getCollInfo(tctx, cmd.value("coll", 4), bytes, 1, reinterpret_cast<float**>(table), kAlgos,
                                    kProtos, 0, &nc);
        channels.push_back(rr == 0 ? nc : -1);
      }
      int bad_ctx_nc = 0;
      int bad_ctx = tuner->getCollInfo(&bad_ctx_nc, 4, 1 << 20, 1, reinterpret_cast<float**>(table), kAlgos, kProtos, 0,
                                       &bad_ctx_nc);
      int d = tuner->destroy(tctx);
      json after = json::array();
      for (int a = 0; a < kAlgos; ++a) after.push_back(std::vector<float>(table[a], table[a] + kProtos));
      Emit({{"event", "tuned"}, {"name", tuner->name}, {"init", r}, {"channels", channels},
            {"table_unchanged", std::memcmp(before, table, sizeof(table)) == 0}, {"table", after},
            {"foreign_context", bad_ctx}, {"destroy", d}});
    } else if (what == "exit") {
      break;
    }
  }
  return 0;
}
