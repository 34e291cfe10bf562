#include "client-lib/nccl/net_core.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <new>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/net_socket.h"
#include "common/cuda_driver.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "podlink/client.h"
#include "podlink/transfer.h"

namespace podlink::ncclnet {
namespace {

using nccl_abi::kInternalError;
using nccl_abi::kInvalidArgument;
using nccl_abi::kInvalidUsage;
using nccl_abi::kRemoteError;
using nccl_abi::kSuccess;
using nccl_abi::kSystemError;
using nccl_abi::kUnhandledCudaError;

constexpr uint32_t kHandleMagic = 0x4b4e4c50;  // "PLNK"
constexpr uint32_t kHelloMagic = 0x4f4c4548;   // "HELO"
constexpr uint32_t kCommMagic = 0x4d4d4f43;    // "COMM"
constexpr uint32_t kListenMagic = 0x4e54534c;  // "LSTN"
constexpr uint32_t kMrMagic = 0x5247454d;      // "MEGR"
constexpr uint32_t kRegionMagic = 0x4c525443;  // "CTRL"
constexpr uint16_t kWireVersion = 1;
constexpr int kSlots = 64;  // control-region ring slots (> NCCL's 32 requests in flight)
constexpr int kMaxRequests = nccl_abi::kMaxRequests;
constexpr uint64_t kSizeError = ~0ull;  // a completion size meaning "this send failed"
constexpr size_t kMinPiece = 64 << 10;  // smallest share of one TCP data socket

enum class Transport : uint8_t { kTcp = 1, kPodlink = 2 };
const char* TransportName(Transport t) { return t == Transport::kPodlink ? "podlink" : "TCP"; }

// ---------------------------------------------------------------- wire formats

// The listen handle NCCL carries to the peer (<= 128 bytes). The last 16
// bytes are the connecting side's own bookkeeping and never trusted as a
// pointer.
struct WireHandle {
  uint32_t magic;
  uint16_t version;
  uint16_t family;
  uint8_t addr[16];
  uint16_t port;  // network order
  uint16_t dev;
  uint32_t pad;
  uint64_t nonce;
  char node_id[48];
  uint64_t connect_cookie;
  uint64_t reserved;
};
static_assert(sizeof(WireHandle) <= nccl_abi::kHandleMaxSize);

struct Hello {  // first bytes on every socket a connect opens
  uint32_t magic;
  uint16_t version;
  uint8_t kind;  // 0 control, 1 data
  uint8_t transport;
  uint64_t nonce;    // the listen handle's: proves the connector saw the handle
  uint64_t conn_id;  // groups a connection's sockets
  uint32_t nsocks;
  uint32_t index;
  uint32_t pid;
  uint32_t pad;
  char node_id[48];
};
static_assert(sizeof(Hello) == 88);

struct Welcome {  // accept's answer on the control socket
  uint32_t magic;
  int32_t status;  // 0 ok
  uint64_t ctrl_export;
  uint64_t ctrl_size;
  char message[40];
};
static_assert(sizeof(Welcome) == 64);

enum FrameType : uint32_t { kFrameCts = 1, kFrameData = 2 };

struct Frame {  // TCP control messages
  uint32_t type;
  uint32_t index;  // data: which buffer of the grouped receive
  uint64_t seq;
  uint32_t n;
  uint32_t pad;
  int32_t tags[kMaxRecvs];
  uint64_t sizes[kMaxRecvs];  // cts: room per buffer; data: sizes[0] = bytes that follow (or kSizeError)
};
static_assert(sizeof(Frame) == 120);

// The podlink transport's shared control region (receiver creates it).
struct alignas(64) CtsSlot {
  std::atomic<uint64_t> ready;  // seq + 1 once the entry is complete
  uint32_t n;
  uint32_t pad;
  int32_t tags[kMaxRecvs];
  uint64_t sizes[kMaxRecvs];
  uint64_t region[kMaxRecvs];  // export id the bytes must land in
  uint64_t offset[kMaxRecvs];
};
struct alignas(64) DoneSlot {
  std::atomic<uint64_t> state;  // (seq << 8) | mask of completed buffers
  uint64_t sizes[kMaxRecvs];
};
struct CtrlRegion {
  uint32_t magic;
  uint32_t version;
  char pad[56];
  CtsSlot cts[kSlots];
  DoneSlot done[kSlots];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

uint64_t DoneState(uint64_t seq, uint32_t mask) { return (seq << 8) | mask; }

// ---------------------------------------------------------------- objects

struct Comm;

// Registered memory. For the podlink transport it names an exported region
// that holds the bytes: NCCL's own cuMem buffer, or a bounce buffer when
// the memory cannot be exported (plain host memory, non-VMM GPU memory).
struct Mr {
  uint32_t magic = kMrMagic;
  Comm* comm = nullptr;
  char* base = nullptr;
  size_t size = 0;
  int type = 0;
  LocalRegion region;        // the export the relay reads / writes
  uint64_t region_offset = 0;  // where `base` lies in it
  uint64_t alloc_base = 0;   // key of the shared cuMem export (0: bounce or TCP)
  std::unique_ptr<HostBuffer> host_bounce;
  std::unique_ptr<GpuBuffer> gpu_bounce;
  bool bounce() const { return host_bounce || gpu_bounce; }
  uint64_t bounce_ptr() const {
    return host_bounce ? reinterpret_cast<uint64_t>(host_bounce->data()) : gpu_bounce->device_ptr();
  }
};

struct HostStage {
  char* p = nullptr;
  size_t cap = 0;
};

struct Request {
  Comm* comm = nullptr;
  bool in_use = false;
  bool send = false;
  uint64_t seq = 0;
  int n = 1;
  Result error = kSuccess;
  // send
  int index = 0;
  size_t size = 0;
  uint64_t batch = 0;  // relay batch in flight (podlink)
  // recv
  void* data[kMaxRecvs] = {};
  size_t posted[kMaxRecvs] = {};
  size_t got[kMaxRecvs] = {};
  Mr* mr[kMaxRecvs] = {};
  int frames_left = 0;  // TCP: data frames still due
  // TCP payload in flight
  int pieces_left = 0;
  // TCP with GPU memory: page-locked host copies of the GPU buffers, and the
  // event that marks the copy to them (send) or from them (receive) done.
  HostStage staging[kMaxRecvs];
  cu::Event copied = nullptr;
  bool copying = false;  // receive: copies to the GPU started
  char* src = nullptr;   // send: the bytes for the wire (the buffer itself, or staging[0])
  bool queued = false;   // send: its pieces are in the data sockets' queues
};

struct Piece {
  Request* req;
  char* p;
  size_t left;
};

struct Comm {
  uint32_t magic = kCommMagic;
  bool send = false;
  Transport transport = Transport::kTcp;
  int dev = 0;
  std::string peer;  // for messages
  UniqueFd ctrl;
  std::vector<UniqueFd> data;
  Request reqs[kMaxRequests];
  uint64_t next_seq = 0;
  Result failed = kSuccess;
  uint64_t calls = 0;
  bool warned_truncation = false;
  cu::Stream stream = nullptr;  // staging / bounce copies, in `stream_ctx` (the plugin's copy context)
  cu::Context stream_ctx = nullptr;
  // podlink transport
  std::unique_ptr<HostBuffer> region_buf;  // receiver: the control region
  uint64_t region_export = 0;
  std::unique_ptr<Mapping> region_map;     // sender: the receiver's region mapped
  CtrlRegion* region = nullptr;
  bool have_cts = false;                   // sender: `cts` is the entry being consumed
  CtsSlot cts_copy;
  uint32_t cts_consumed = 0;
  uint64_t done_seq[kSlots] = {};
  uint32_t done_mask[kSlots] = {};
  std::set<uint64_t> opened;               // sender: remote exports in use
  // TCP transport
  std::string out;       // control bytes not yet sent
  Frame in{};
  size_t in_got = 0;
  std::deque<Frame> cts_queue;  // sender: clear-to-send frames not yet consumed
  std::string peer_closed;      // receiver: why the peer's control stream ended; empty while open
  std::vector<std::deque<Piece>> pieces;  // per data socket
  std::deque<Request*> unqueued;  // sender: sends in frame order whose pieces wait for their staging copy
  std::vector<HostStage> stage_pool;   // free page-locked staging buffers
  std::vector<cu::Event> event_pool;   // free completion events
  uint32_t rr = 0;       // next data socket (advances identically on both sides)
};

struct Listener {
  uint32_t magic = kListenMagic;
  int dev = 0;
  UniqueFd fd;
  uint64_t nonce = 0;
  struct Pending {
    UniqueFd fd;
    Hello hello{};
    size_t got = 0;
  };
  std::vector<Pending> pending;
  std::map<uint64_t, std::vector<Pending>> groups;  // conn_id -> sockets with a valid hello
};

struct Connecting {
  uint64_t cookie = 0;
  Transport transport = Transport::kTcp;
  SockAddr to;
  std::vector<UniqueFd> fds;  // [0] control
  std::vector<bool> hello_sent;
  Hello hello{};
  Welcome welcome{};
  size_t welcome_got = 0;
};

uint64_t Random64() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != sizeof(v)) v = static_cast<uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ull;
  return v;
}

int EnvInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (end != v && *end == '\0' && x >= 0 && x <= INT_MAX) ? static_cast<int>(x) : dflt;
}

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// ---------------------------------------------------------------- plugin state

class State {
 public:
  std::mutex mu;
  int refs = 0;
  nccl_abi::Logger logger = nullptr;

  // What init found.
  std::string node_id;  // podlinkd's node identity; empty without a daemon
  std::unique_ptr<Client> client;
  std::unique_ptr<TransferEngine> engine;
  const cu::Driver* cuda = nullptr;
  struct Dev {
    std::string name, pci_path;
  };
  std::vector<Dev> devs;
  SockAddr listen_addr;
  std::string ifname;
  int nsocks = 4;
  bool tcp_only = false;

  std::map<void*, std::unique_ptr<Connecting>> connecting;  // keyed by the handle buffer NCCL passes again
  struct SharedExport {
    LocalRegion region;
    int refs = 0;
  };
  std::map<uint64_t, SharedExport> exports;  // cuMem allocation base -> its export
  std::map<uint64_t, int> remote_refs;       // remote export -> comms using it
  int live_comms = 0;
  std::atomic<int> trace_left{0};  // PODLINK_NCCL_TRACE: operations still to log
  bool tcp_fallback_kept = false;  // finalize kept state without a podlinkd session
  std::map<int, cu::Context> copy_ctx;  // CUDA device -> the plugin's own context for staging copies

  void Log(int level, const char* file, int line, const char* fmt, ...) __attribute__((format(printf, 5, 6))) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    nccl_abi::Logger l = logger;
    if (l != nullptr) {
      l(level, nccl_abi::kLogSubsysNet, file, line, "%s", buf);
    } else if (level == nccl_abi::kLogWarn || std::getenv("PODLINK_NCCL_DEBUG") != nullptr) {
      std::fprintf(stderr, "NET/podlink: %s\n", buf);
    }
  }
};

State& S() {
  // Never destroyed (NCCL may call in while the process exits), and not on
  // the heap either: NCCL 2.28 dlcloses the plugin after finalize, and a heap
  // singleton would then leak with each load. Finalize frees what it holds.
  alignas(State) static unsigned char storage[sizeof(State)];
  static State* s = new (storage) State();
  return *s;
}

#define PLOG(level, ...) S().Log(nccl_abi::level, __FILE__, __LINE__, __VA_ARGS__)
#define WARN(...) PLOG(kLogWarn, __VA_ARGS__)
#define INFO(...) PLOG(kLogInfo, __VA_ARGS__)
// One line per operation while PODLINK_NCCL_TRACE lines remain (debugging).
#define TRACE_OP(...)                                                                          \
  do {                                                                                         \
    if (S().trace_left.load(std::memory_order_relaxed) > 0 && S().trace_left.fetch_sub(1) > 0) \
      INFO(__VA_ARGS__);                                                                       \
  } while (0)

Result Fail(Result r, const std::string& what) {
  WARN("%s", what.c_str());
  return r;
}

Result FailStatus(Result r, const char* what, const absl::Status& st) {
  WARN("%s: %s", what, st.ToString().c_str());
  return r;
}

Comm* AsComm(void* p, bool send) {
  auto* c = static_cast<Comm*>(p);
  if (c == nullptr || c->magic != kCommMagic || c->send != send) return nullptr;
  return c;
}

// ---------------------------------------------------------------- GPU copies

// Staging copies run in a CUDA context of the plugin's own, never in the
// application's. With lazy module loading (CUDA's default) an application
// thread that launches a kernel for the first time loads its module and
// synchronizes the context while holding it; that waits for NCCL's running
// kernel, which waits for the proxy thread, whose copy issued in the same
// context waits for the loader: a deadlock, seen on the H200 pair with the
// TCP transport (docs/nccl.md). A second context on the device does not take
// part in that synchronization. Created once per device, destroyed at the
// last finalize.
absl::StatusOr<cu::Context> CopyContext(State& s, int dev) {
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.copy_ctx.find(dev);
  if (it != s.copy_ctx.end()) return it->second;
  cu::Device device = 0;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(s.cuda->DeviceGet(&device, dev), "cuDeviceGet"));
  cu::Context ctx = nullptr;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(s.cuda->CtxCreate(&ctx, 0, device), "cuCtxCreate"));
  cu::Context popped = nullptr;
  (void)s.cuda->CtxPopCurrent(&popped);  // cuCtxCreate pushed it; the caller's context is current again
  s.copy_ctx[dev] = ctx;
  return ctx;
}

// For its lifetime: the plugin's copy context is current on this thread and
// the comm has its stream (created in that context on first use).
class CopyScope {
 public:
  explicit CopyScope(Comm& c) {
    State& s = S();
    d_ = s.cuda;
    if (d_ == nullptr) {
      status_ = absl::FailedPreconditionError("GPU memory without a CUDA driver");
      return;
    }
    if (c.stream != nullptr) {  // the usual case (every test() of a staged request): no lookup
      use_.emplace(*d_, c.stream_ctx);
      status_ = use_->status();
      return;
    }
    auto ctx = CopyContext(s, c.dev);
    if (!ctx.ok()) {
      status_ = ctx.status();
      return;
    }
    use_.emplace(*d_, *ctx);
    status_ = use_->status();
    if (status_.ok()) {
      status_ = cu::CuStatus(d_->StreamCreate(&c.stream, cu::kStreamNonBlocking), "cuStreamCreate");
      if (status_.ok()) c.stream_ctx = *ctx;
    }
  }
  const absl::Status& status() const { return status_; }
  const cu::Driver& d() const { return *d_; }

 private:
  const cu::Driver* d_ = nullptr;
  std::optional<cu::ScopedContext> use_;
  absl::Status status_;
};

// Copies on the comm's stream and waits for that stream only (the podlink
// transport's bounce buffers): NCCL's kernels keep running meanwhile.
absl::Status CopyAndWait(Comm& c, uint64_t dst, uint64_t src, size_t n) {
  CopyScope scope(c);
  PODLINK_RETURN_IF_ERROR(scope.status());
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(scope.d().MemcpyAsync(dst, src, n, c.stream), "cuMemcpyAsync"));
  return cu::CuStatus(scope.d().StreamSynchronize(c.stream), "cuStreamSynchronize");
}

// Host <-> any copy for memory NCCL registered as `type`.
absl::Status CopyFor(Comm& c, int type, void* dst, const void* src, size_t n) {
  if (n == 0) return absl::OkStatus();
  if (type == nccl_abi::kPtrHost) {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  return CopyAndWait(c, reinterpret_cast<uint64_t>(dst), reinterpret_cast<uint64_t>(src), n);
}

// The TCP transport stages GPU memory through page-locked host buffers with
// asynchronous copies on the comm's stream, so the proxy thread never waits
// for the GPU: a send's pieces go to the sockets once its event completes, a
// receive reports done once its copies to the GPU have.
constexpr size_t kStageRound = 64 << 10;
constexpr size_t kStagePoolMax = 8;  // NCCL keeps at most NCCL_STEPS (8) operations in flight per connection

absl::StatusOr<HostStage> TakeStage(Comm& c, size_t n) {
  for (size_t i = 0; i < c.stage_pool.size(); ++i) {
    if (c.stage_pool[i].cap >= n) {
      HostStage st = c.stage_pool[i];
      c.stage_pool[i] = c.stage_pool.back();
      c.stage_pool.pop_back();
      return st;
    }
  }
  CopyScope scope(c);
  PODLINK_RETURN_IF_ERROR(scope.status());
  HostStage st;
  st.cap = std::max(kStageRound, (n + kStageRound - 1) / kStageRound * kStageRound);
  void* p = nullptr;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(scope.d().MemHostAlloc(&p, st.cap, 0), "cuMemHostAlloc"));
  st.p = static_cast<char*>(p);
  return st;
}

void FreeStage(Comm& c, HostStage st) {
  CopyScope scope(c);
  if (scope.status().ok()) (void)scope.d().MemFreeHost(st.p);
}

void GiveStage(Comm& c, HostStage st) {
  if (st.p == nullptr) return;
  if (c.stage_pool.size() < kStagePoolMax) {
    c.stage_pool.push_back(st);
  } else {
    FreeStage(c, st);
  }
}

// Queues the copies, then the request's completion event, on the comm's stream.
absl::Status StartCopies(Comm& c, Request& r, const std::vector<std::array<uint64_t, 3>>& copies) {
  CopyScope scope(c);
  PODLINK_RETURN_IF_ERROR(scope.status());
  const cu::Driver& d = scope.d();
  for (const auto& [dst, src, n] : copies) {
    PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.MemcpyAsync(dst, src, n, c.stream), "cuMemcpyAsync"));
  }
  if (r.copied == nullptr) {
    if (!c.event_pool.empty()) {
      r.copied = c.event_pool.back();
      c.event_pool.pop_back();
    } else {
      PODLINK_RETURN_IF_ERROR(cu::CuStatus(d.EventCreate(&r.copied, cu::kEventDisableTiming), "cuEventCreate"));
    }
  }
  return cu::CuStatus(d.EventRecord(r.copied, c.stream), "cuEventRecord");
}

absl::StatusOr<bool> CopiesDone(Comm& c, Request& r) {
  if (r.copied == nullptr) return true;
  CopyScope scope(c);
  PODLINK_RETURN_IF_ERROR(scope.status());
  cu::Result q = scope.d().EventQuery(r.copied);
  if (q == cu::kErrorNotReady) return false;
  PODLINK_RETURN_IF_ERROR(cu::CuStatus(q, "cuEventQuery"));
  return true;
}

// ---------------------------------------------------------------- requests

Request* TakeRequest(Comm& c, int slot = -1) {
  if (slot >= 0) {
    Request& r = c.reqs[slot];
    if (r.in_use) return nullptr;
    r = Request();
    r.comm = &c;
    r.in_use = true;
    return &r;
  }
  for (Request& r : c.reqs) {
    if (!r.in_use) {
      r = Request();
      r.comm = &c;
      r.in_use = true;
      return &r;
    }
  }
  return nullptr;
}

// Returns the request's staging buffers and event to its comm's pools. A copy
// still running into or out of them stays ordered before any later use: the
// comm has one stream.
void DropRequest(Request& r) {
  for (HostStage& st : r.staging) {
    GiveStage(*r.comm, st);
    st = HostStage();
  }
  if (r.copied != nullptr) r.comm->event_pool.push_back(r.copied);
  r.copied = nullptr;
  r.in_use = false;
}

// Splits `size` bytes over the comm's data sockets on 128-byte boundaries.
// Both sides call it in the same message order, so they agree.
template <typename F>
void ForEachPiece(Comm& c, size_t size, F&& f) {
  size_t ns = c.data.size();
  size_t share = (size + ns - 1) / ns;
  share = std::max(kMinPiece, (share + 127) & ~size_t{127});
  for (size_t off = 0; off < size; off += share) {
    f(c.rr % ns, off, std::min(share, size - off));
    c.rr++;
  }
}

// ---------------------------------------------------------------- TCP transport

Result TcpProgress(Comm& c) {
  if (c.failed != kSuccess) return c.failed;
  auto fail = [&](Result r, const std::string& why) {
    c.failed = r;
    return Fail(r, absl::StrCat("connection with ", c.peer, ": ", why));
  };
  // Sends whose staging copy has finished go to the sockets, in frame order.
  while (!c.unqueued.empty()) {
    Request& r = *c.unqueued.front();
    auto copied = CopiesDone(c, r);
    if (!copied.ok()) return fail(kUnhandledCudaError, absl::StrCat("staging a send: ", copied.status().ToString()));
    if (!*copied) break;
    c.unqueued.pop_front();
    ForEachPiece(c, r.size, [&](size_t sock, size_t off, size_t len) {
      c.pieces[sock].push_back(Piece{&r, r.src + off, len});
      r.pieces_left++;
    });
    r.queued = true;
  }
  while (!c.out.empty()) {
    auto n = SendSome(c.ctrl.get(), c.out.data(), c.out.size());
    if (!n.ok()) return fail(kRemoteError, n.status().ToString());
    if (*n == 0) break;
    c.out.erase(0, *n);
  }
  // Control frames in.
  while (c.peer_closed.empty()) {
    auto n = RecvSome(c.ctrl.get(), reinterpret_cast<char*>(&c.in) + c.in_got, sizeof(Frame) - c.in_got);
    if (!n.ok()) {
      if (c.send) {
        bool busy = false;
        for (const Request& r : c.reqs) busy |= r.in_use;
        if (busy) return fail(kRemoteError, n.status().ToString());
        break;  // an idle sender notices a closed peer on its next send
      }
      // What the peer sent before closing still counts: a receive whose data
      // frames all arrived completes from the data sockets; one still
      // waiting for frames fails when tested (Test), as does a new receive.
      c.peer_closed = n.status().ToString();
      break;
    }
    if (*n == 0) break;
    c.in_got += *n;
    if (c.in_got < sizeof(Frame)) continue;
    c.in_got = 0;
    Frame f = c.in;
    if (c.send) {
      if (f.type != kFrameCts || f.n < 1 || f.n > kMaxRecvs) return fail(kRemoteError, "malformed clear-to-send");
      c.cts_queue.push_back(f);
      continue;
    }
    if (f.type != kFrameData) return fail(kRemoteError, "unexpected frame type");
    Request& r = c.reqs[f.seq % kMaxRequests];
    if (!r.in_use || r.seq != f.seq || f.index >= static_cast<uint32_t>(r.n) || r.frames_left <= 0) {
      return fail(kRemoteError, absl::StrCat("data for unknown receive ", f.seq, "/", f.index));
    }
    r.frames_left--;
    uint64_t size = f.sizes[0];
    if (size == kSizeError) {
      r.error = kInvalidUsage;
      r.got[f.index] = 0;
      continue;
    }
    if (size > r.posted[f.index]) return fail(kRemoteError, "peer sent more than the receive holds");
    r.got[f.index] = size;
    char* dst = static_cast<char*>(r.data[f.index]);
    if (r.mr[f.index]->type != nccl_abi::kPtrHost && size > 0) {
      auto st = TakeStage(c, size);
      if (!st.ok()) {
        c.failed = kUnhandledCudaError;
        return FailStatus(kUnhandledCudaError, "staging a receive", st.status());
      }
      r.staging[f.index] = *st;
      dst = st->p;
    }
    ForEachPiece(c, size, [&](size_t sock, size_t off, size_t len) {
      c.pieces[sock].push_back(Piece{&r, dst + off, len});
      r.pieces_left++;
    });
  }
  // Payload.
  for (size_t s = 0; s < c.data.size(); ++s) {
    auto& q = c.pieces[s];
    while (!q.empty()) {
      Piece& p = q.front();
      auto n = c.send ? SendSome(c.data[s].get(), p.p, p.left) : RecvSome(c.data[s].get(), p.p, p.left);
      if (!n.ok()) return fail(kRemoteError, n.status().ToString());
      if (*n == 0) break;
      p.p += *n;
      p.left -= *n;
      if (p.left == 0) {
        p.req->pieces_left--;
        q.pop_front();
      }
    }
  }
  return kSuccess;
}

void TcpQueueFrame(Comm& c, const Frame& f) { c.out.append(reinterpret_cast<const char*>(&f), sizeof(f)); }

// ---------------------------------------------------------------- podlink transport

bool PodlinkPeerGone(Comm& c) {
  // Cheap enough every 4096 calls; a dead peer otherwise leaves NCCL waiting forever.
  return (++c.calls & 4095) == 0 && PeerClosed(c.ctrl.get());
}

void PublishDone(Comm& c, uint64_t seq, int index, uint64_t size) {
  DoneSlot& d = c.region->done[seq % kSlots];
  int slot = static_cast<int>(seq % kSlots);
  if (c.done_seq[slot] != seq || c.done_mask[slot] == 0) {
    c.done_seq[slot] = seq;
    c.done_mask[slot] = 0;
  }
  d.sizes[index] = size;
  c.done_mask[slot] |= 1u << index;
  d.state.store(DoneState(seq, c.done_mask[slot]), std::memory_order_release);
}

absl::StatusOr<RemoteRegion> OpenRemote(Comm& c, uint64_t export_id) {
  State& s = S();
  RegionDescriptor d;
  d.node_id = s.node_id;
  d.export_id = export_id;
  PODLINK_ASSIGN_OR_RETURN(RemoteRegion r, s.engine->Open(d));
  if (c.opened.insert(export_id).second) {
    std::lock_guard<std::mutex> l(s.mu);
    s.remote_refs[export_id]++;
  }
  return r;
}

void CloseRemotes(Comm& c) {
  State& s = S();
  for (uint64_t id : c.opened) {
    bool last = false;
    {
      std::lock_guard<std::mutex> l(s.mu);
      last = --s.remote_refs[id] == 0;
      if (last) s.remote_refs.erase(id);
    }
    if (last) {
      RemoteRegion r;
      r.export_id = id;
      (void)s.engine->Close(r);
    }
  }
  c.opened.clear();
}

// The buffer of a clear-to-send entry a send with `tag` goes to: the first
// one not yet consumed with that tag (NCCL matches grouped receives by tag).
Result MatchTag(const int32_t* tags, uint32_t n, uint32_t consumed, int tag, const std::string& peer, int* index) {
  for (uint32_t i = 0; i < n; ++i) {
    if ((consumed & (1u << i)) == 0 && tags[i] == tag) {
      *index = static_cast<int>(i);
      return kSuccess;
    }
  }
  return Fail(kInvalidUsage, absl::StrCat("send with tag ", tag, " to ", peer, " does not match the posted receive"));
}

// [p, p + size) lies inside the registration.
bool Covers(const Mr& mr, const void* p, size_t size) {
  const char* q = static_cast<const char*>(p);
  return size == 0 || (q >= mr.base && size <= mr.size && static_cast<size_t>(q - mr.base) <= mr.size - size);
}

// A send larger than the posted receive delivers what fits, as NCCL's own
// IB transport does (NCCL 2.28 posts such sends: a receive sized for one
// protocol's step may meet a larger send). Logged once per comm.
size_t Truncate(Comm& c, size_t size, size_t room) {
  if (!c.warned_truncation) {
    c.warned_truncation = true;
    INFO("send of %zu bytes to %s truncated to the posted receive of %zu bytes (further truncations not logged)",
         size, c.peer.c_str(), room);
  }
  return room;
}

Result PodlinkIsend(Comm& c, void* data, size_t size, int tag, Mr* mr, void** request) {
  const size_t asked = size;
  if (!c.have_cts) {
    CtsSlot& slot = c.region->cts[c.next_seq % kSlots];
    if (slot.ready.load(std::memory_order_acquire) != c.next_seq + 1) {
      if (PodlinkPeerGone(c)) {
        c.failed = kRemoteError;
        return Fail(kRemoteError, absl::StrCat("connection with ", c.peer, ": the receiver went away"));
      }
      return kSuccess;  // *request stays NULL: not now
    }
    // Copy once: the peer could change the entry under us.
    c.cts_copy.n = slot.n;
    std::memcpy(c.cts_copy.tags, slot.tags, sizeof(slot.tags));
    std::memcpy(c.cts_copy.sizes, slot.sizes, sizeof(slot.sizes));
    std::memcpy(c.cts_copy.region, slot.region, sizeof(slot.region));
    std::memcpy(c.cts_copy.offset, slot.offset, sizeof(slot.offset));
    if (c.cts_copy.n < 1 || c.cts_copy.n > kMaxRecvs) {
      c.failed = kRemoteError;
      return Fail(kRemoteError, absl::StrCat("connection with ", c.peer, ": malformed clear-to-send entry"));
    }
    c.have_cts = true;
    c.cts_consumed = 0;
  }
  const CtsSlot& cts = c.cts_copy;
  int index = -1;
  if (Result m = MatchTag(cts.tags, cts.n, c.cts_consumed, tag, c.peer, &index); m != kSuccess) return m;
  Request* r = TakeRequest(c);
  if (r == nullptr) return kSuccess;  // all 32 in use: not now
  uint64_t seq = c.next_seq;
  c.cts_consumed |= 1u << index;
  if (c.cts_consumed == (1u << cts.n) - 1) {
    c.have_cts = false;
    c.next_seq++;
  }
  r->send = true;
  r->seq = seq;
  r->index = index;
  r->size = size;
  if (size > cts.sizes[index]) size = r->size = Truncate(c, size, cts.sizes[index]);
  if (size > 0) {
    uint64_t off = static_cast<char*>(data) - mr->base;
    if (mr->bounce()) {
      absl::Status st = CopyFor(c, mr->type, reinterpret_cast<void*>(mr->bounce_ptr() + off), data, size);
      if (!st.ok()) {
        DropRequest(*r);
        return FailStatus(kUnhandledCudaError, "staging a send", st);
      }
    }
    auto remote = OpenRemote(c, cts.region[index]);
    if (!remote.ok()) {
      DropRequest(*r);
      return FailStatus(kSystemError, "opening the receiver's buffer", remote.status());
    }
    TransferOp op{&mr->region, mr->region_offset + off, &*remote, cts.offset[index], size};
    auto batch = S().engine->WriteAsync({op});
    if (!batch.ok()) {
      DropRequest(*r);
      return FailStatus(kSystemError, "submitting a relay copy", batch.status());
    }
    r->batch = *batch;
  }
  TRACE_OP("trace isend comm=%p peer=%s seq=%lu index=%d tag=%d size=%zu room=%lu type=%d", static_cast<void*>(&c),
           c.peer.c_str(), static_cast<unsigned long>(seq), index, tag, asked,
           static_cast<unsigned long>(cts.sizes[index]), mr != nullptr ? mr->type : -1);
  *request = r;
  return kSuccess;
}

Result PodlinkIrecv(Comm& c, int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request) {
  Request* r = TakeRequest(c, static_cast<int>(c.next_seq % kMaxRequests));
  if (r == nullptr) return kSuccess;
  CtsSlot& slot = c.region->cts[c.next_seq % kSlots];
  slot.n = static_cast<uint32_t>(n);
  for (int i = 0; i < n; ++i) {
    uint64_t off = static_cast<char*>(data[i]) - mrs[i]->base;
    slot.tags[i] = tags[i];
    slot.sizes[i] = sizes[i];
    slot.region[i] = mrs[i]->region.export_id;
    slot.offset[i] = mrs[i]->region_offset + off;
  }
  r->seq = c.next_seq;
  r->n = n;
  TRACE_OP("trace irecv comm=%p peer=%s seq=%lu n=%d tag0=%d size0=%zu type0=%d", static_cast<void*>(&c),
           c.peer.c_str(), static_cast<unsigned long>(c.next_seq), n, tags[0], sizes[0], mrs[0]->type);
  slot.ready.store(c.next_seq + 1, std::memory_order_release);
  c.next_seq++;
  *request = r;
  return kSuccess;
}

Result PodlinkTest(Request& r, int* done, int* sizes) {
  Comm& c = *r.comm;
  if (r.send) {
    if (r.batch != 0) {
      auto polled = S().engine->Poll(r.batch);
      if (polled.ok() && !*polled) return kSuccess;
      absl::Status st = polled.ok() ? S().engine->Wait(r.batch) : polled.status();
      r.batch = 0;
      if (!st.ok()) {
        PublishDone(c, r.seq, r.index, kSizeError);
        DropRequest(r);
        return FailStatus(kSystemError, "relay copy", st);
      }
    }
    PublishDone(c, r.seq, r.index, r.size);
    if (sizes != nullptr) sizes[0] = static_cast<int>(r.size);
    *done = 1;
    DropRequest(r);
    return kSuccess;
  }
  DoneSlot& d = c.region->done[r.seq % kSlots];
  uint32_t full = (1u << r.n) - 1;
  if (d.state.load(std::memory_order_acquire) != DoneState(r.seq, full)) {
    if (PodlinkPeerGone(c)) {
      c.failed = kRemoteError;
      return Fail(kRemoteError, absl::StrCat("connection with ", c.peer, ": the sender went away"));
    }
    return kSuccess;
  }
  Result result = kSuccess;
  for (int i = 0; i < r.n; ++i) {
    uint64_t got = d.sizes[i];
    if (got == kSizeError) {
      result = Fail(kInvalidUsage, absl::StrCat("receive from ", c.peer, ": the matching send failed (see the "
                                                "sender's log; a send larger than the receive is an error)"));
      continue;
    }
    if (got > r.posted[i]) {
      result = Fail(kRemoteError, absl::StrCat("receive from ", c.peer, ": peer reports ", got, " bytes for a ",
                                               r.posted[i], "-byte buffer"));
      continue;
    }
    Mr* mr = r.mr[i];
    if (mr->bounce() && got > 0) {
      uint64_t off = static_cast<char*>(r.data[i]) - mr->base;
      absl::Status st = CopyFor(c, mr->type, r.data[i], reinterpret_cast<void*>(mr->bounce_ptr() + off), got);
      if (!st.ok()) result = FailStatus(kUnhandledCudaError, "copying a receive out of its bounce buffer", st);
    }
    if (sizes != nullptr) sizes[i] = static_cast<int>(got);
  }
  *done = 1;
  DropRequest(r);
  return result;
}

// ---------------------------------------------------------------- connection setup

Result SetupPodlinkReceiver(Comm& c, Welcome& w) {
  State& s = S();
  auto buf = s.client->AllocateHost(sizeof(CtrlRegion));
  if (!buf.ok()) return FailStatus(kSystemError, "allocating the control region", buf.status());
  auto id = s.client->Export(**buf);
  if (!id.ok()) return FailStatus(kSystemError, "exporting the control region", id.status());
  c.region_buf = *std::move(buf);
  c.region_export = *id;
  c.region = static_cast<CtrlRegion*>(c.region_buf->data());  // zero-filled memfd
  c.region->magic = kRegionMagic;
  c.region->version = kWireVersion;
  w.ctrl_export = *id;
  w.ctrl_size = sizeof(CtrlRegion);
  return kSuccess;
}

Result SetupPodlinkSender(Comm& c, const Welcome& w) {
  State& s = S();
  auto imp = s.client->Import(w.ctrl_export);
  if (!imp.ok()) return FailStatus(kSystemError, "importing the receiver's control region", imp.status());
  if (imp->info().handle_type != HandleType::kHostMemfd || imp->info().size < sizeof(CtrlRegion)) {
    return Fail(kRemoteError, "the receiver's control region is not a host region of the expected size");
  }
  auto map = s.client->Map(*imp);
  if (!map.ok()) return FailStatus(kSystemError, "mapping the receiver's control region", map.status());
  c.region_map = *std::move(map);
  c.region = static_cast<CtrlRegion*>(c.region_map->host_ptr());
  if (c.region->magic != kRegionMagic || c.region->version != kWireVersion) {
    return Fail(kRemoteError, "the receiver's control region has an unknown format");
  }
  // The import record can go; the mapping keeps the memory.
  (void)s.client->Release(w.ctrl_export);
  return kSuccess;
}

bool WriteAll(int fd, const void* p, size_t n) {
  const char* q = static_cast<const char*>(p);
  for (int spins = 0; n > 0 && spins < 100000; ++spins) {
    auto r = SendSome(fd, q, n);
    if (!r.ok()) return false;
    q += *r;
    n -= *r;
  }
  return n == 0;
}

// Ends a TCP connection without a reset. Linux answers a close() with
// unread bytes in the receive queue by RST, and a reset makes the peer drop
// what it has received but not yet read: the tail of the last message.
// Unconsumed input (clear-to-send frames for receives we will never match)
// is read and dropped, then FIN follows everything we sent.
void ShutdownQuietly(int fd) {
  char buf[16384];
  for (int i = 0; i < 4096 && ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; ++i) {
  }
  ::shutdown(fd, SHUT_WR);
}

void DestroyComm(Comm* c) {
  State& s = S();
  if (c->transport == Transport::kTcp) {
    if (c->ctrl) ShutdownQuietly(c->ctrl.get());
    for (UniqueFd& fd : c->data) {
      if (fd) ShutdownQuietly(fd.get());
    }
  }
  if (c->transport == Transport::kPodlink && s.engine) {
    for (Request& r : c->reqs) {
      if (r.in_use && r.batch != 0) (void)s.engine->Wait(r.batch);  // the relay may still read our memory
    }
    CloseRemotes(*c);
  }
  if (c->region_export != 0 && s.client) (void)s.client->Release(c->region_export);
  if (c->stream != nullptr && s.cuda != nullptr) {
    {
      cu::ScopedContext use(*s.cuda, c->stream_ctx);
      (void)s.cuda->StreamSynchronize(c->stream);  // copies in flight end before their buffers go
    }
    for (Request& r : c->reqs) {
      if (r.in_use) DropRequest(r);
    }
    for (HostStage& st : c->stage_pool) FreeStage(*c, st);
    cu::ScopedContext use(*s.cuda, c->stream_ctx);
    for (cu::Event e : c->event_pool) s.cuda->EventDestroy(e);
    s.cuda->StreamDestroy(c->stream);
  }
  c->magic = 0;
  delete c;
  std::lock_guard<std::mutex> l(s.mu);
  s.live_comms--;
}

// One net device per GPU this process sees, each reporting that GPU's PCI
// path so NCCL keeps its buffers in GPU memory; one host device without GPUs.
void EnumerateDevices(State& s) {
  auto drv = cu::LoadDriver();
  s.cuda = drv.ok() ? *drv : nullptr;
  int ngpu = 0;
  if (s.cuda != nullptr && s.cuda->DeviceGetCount(&ngpu) != cu::kSuccess) ngpu = 0;
  for (int i = 0; i < std::max(ngpu, 1); ++i) {
    State::Dev d;
    d.name = absl::StrCat("podlink", i);
    char bus[32] = {};
    cu::Device dev = 0;
    if (i < ngpu && s.cuda->DeviceGet(&dev, i) == cu::kSuccess &&
        s.cuda->DeviceGetPCIBusId(bus, sizeof(bus), dev) == cu::kSuccess) {
      std::string id = bus;
      for (char& ch : id) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      char* real = ::realpath(absl::StrCat("/sys/bus/pci/devices/", id).c_str(), nullptr);
      if (real != nullptr) {
        // The GPU's parent (its PCIe switch port, or the root complex):
        // NCCL places the NIC beside the GPU. With the GPU's own PCI function
        // as the NIC's path, NCCL 2.28.9 died right after adding the NIC to
        // its topology on the test machine (docs/nccl.md).
        d.pci_path = real;
        std::free(real);
        if (!EnvIs("PODLINK_NCCL_PCI_PATH", "gpu")) d.pci_path = d.pci_path.substr(0, d.pci_path.rfind('/'));
      }
    }
    s.devs.push_back(d);
  }
}

}  // namespace

// ================================================================ entry points

Result Init(nccl_abi::Logger logger) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (logger != nullptr) s.logger = logger;
  if (s.refs++ > 0) return kSuccess;
  if (s.client != nullptr || s.tcp_fallback_kept) return kSuccess;  // kept by a finalize that found comms open
  s.nsocks = std::clamp(EnvInt("PODLINK_NCCL_NSOCKS", 4), 1, 16);
  s.trace_left = std::max(0, EnvInt("PODLINK_NCCL_TRACE", 0));
  s.tcp_only = EnvIs("PODLINK_NCCL_TRANSPORT", "tcp");
  auto addr = ChooseListenAddress(&s.ifname);
  if (!addr.ok()) {
    s.refs--;
    return FailStatus(kSystemError, "no interface to listen on", addr.status());
  }
  s.listen_addr = *addr;

  if (s.devs.empty()) EnumerateDevices(s);  // once: names handed to NCCL stay valid

  if (!s.tcp_only) {
    ConnectOptions opt;
    opt.timeout = absl::Seconds(10);
    auto client = Client::Connect(opt);
    absl::Status st = client.status();
    if (client.ok()) {
      TransferEngine::Options eo;
      eo.log_transport = false;
      eo.allow_direct = EnvIs("PODLINK_NCCL_DIRECT", "1");
      eo.force_relay = EnvIs("PODLINK_NCCL_FORCE_RELAY", "1");
      auto engine = TransferEngine::Create(**client, eo);
      auto node = (*client)->GetNodeInfo();
      st = engine.ok() ? node.status() : engine.status();
      if (st.ok()) {
        s.client = *std::move(client);
        s.engine = *std::move(engine);
        s.node_id = node->node_id;
      }
    }
    if (!st.ok()) {
      s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
            "podlinkd not usable (%s): peers on this node use TCP like other nodes", st.ToString().c_str());
    }
  }
  // Defaults for the relay, set only when podlinkd is reachable and the user
  // chose nothing (aws-ofi-nccl does the same on its platforms); NCCL reads
  // them when it builds the communicator, after this init (docs/nccl.md):
  //  - NCCL_PROTO=Simple: NCCL's LL/LL128 mix is slower over the relay at
  //    every size measured.
  //  - NCCL_MIN_NCHANNELS=16, NCCL_BUFFSIZE=16 MiB: NCCL sizes channels from
  //    the topology, where the plugin's NIC sits behind the GPU's PCIe link,
  //    and opens 4; the relay needs more requests in flight (80 -> 255 GB/s).
  if (!s.node_id.empty()) {
    auto set_default = [&](const char* name, const char* value, const char* keep) {
      if (std::getenv(name) != nullptr || EnvIs(keep, "1")) return;
      ::setenv(name, value, 0);
      s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
            "%s was not set: setting %s=%s for the podlink relay (%s=1 keeps NCCL's)", name, name, value, keep);
    };
    set_default("NCCL_PROTO", "Simple", "PODLINK_NCCL_KEEP_PROTO");
    set_default("NCCL_MIN_NCHANNELS", "16", "PODLINK_NCCL_KEEP_CHANNELS");
    set_default("NCCL_BUFFSIZE", "16777216", "PODLINK_NCCL_KEEP_CHANNELS");
  }
  s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
        "NET/podlink %s: %zu device(s), listening on %s (%s), %d data sockets per TCP connection, node %s",
        "v1", s.devs.size(), s.listen_addr.ToString().c_str(), s.ifname.c_str(), s.nsocks,
        s.node_id.empty() ? "(no podlinkd)" : s.node_id.c_str());
  return kSuccess;
}

Result Finalize() {
  State& s = S();
  std::unique_ptr<TransferEngine> engine;
  std::unique_ptr<Client> client;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.refs <= 0) return kSuccess;
    if (--s.refs > 0) return kSuccess;
    if (s.live_comms > 0 || !s.exports.empty()) {
      WARN("finalize with %d comm(s) and %zu registration(s) still open: keeping the podlinkd session", s.live_comms,
           s.exports.size());
      s.refs = 0;
      s.tcp_fallback_kept = s.client == nullptr;
      return kSuccess;
    }
    engine = std::move(s.engine);
    client = std::move(s.client);
    s.connecting.clear();
    s.remote_refs.clear();
    std::string().swap(s.node_id);
    std::vector<State::Dev>().swap(s.devs);  // NCCL asks for names again after the next init
  }
  engine.reset();  // waits for relay copies it still has in flight
  client.reset();  // closes the session; gRPC stops its threads with the last channel
  std::map<int, cu::Context> contexts;
  {
    std::lock_guard<std::mutex> l(s.mu);
    contexts.swap(s.copy_ctx);
  }
  for (auto& [dev, ctx] : contexts) s.cuda->CtxDestroy(ctx);  // every comm, and its stream, is gone
  return kSuccess;
}

Result Devices(int* ndev) {
  if (ndev == nullptr) return kInvalidArgument;
  std::lock_guard<std::mutex> l(S().mu);
  *ndev = static_cast<int>(S().devs.size());
  return kSuccess;
}

Result GetProperties(int dev, DeviceProps* p) {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  if (p == nullptr || dev < 0 || dev >= static_cast<int>(s.devs.size())) {
    return Fail(kInvalidArgument, absl::StrCat("getProperties: no device ", dev));
  }
  const State::Dev& d = s.devs[dev];
  *p = DeviceProps();
  p->name = d.name.c_str();
  p->pci_path = d.pci_path.empty() ? nullptr : d.pci_path.c_str();
  uint64_t h = 1469598103934665603ull;
  for (char ch : s.node_id + d.name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  p->guid = h;
  p->ptr_support = nccl_abi::kPtrHost | (s.cuda != nullptr ? nccl_abi::kPtrCuda : 0);
  // What NVLink carries through the relay when a podlinkd is there. NCCL
  // still sizes channels by the NIC's PCIe path; Init's defaults and the
  // tuner take care of the channel count (docs/nccl.md).
  p->speed_mbps = EnvInt("PODLINK_NCCL_SPEED_MBPS", s.node_id.empty() ? 100000 : 3200000);
  p->port = 1;
  p->latency_us = static_cast<float>(EnvInt("PODLINK_NCCL_LATENCY_US", 5));
  p->max_comms = 1 << 20;
  p->max_recvs = kMaxRecvs;
  p->max_p2p_bytes = INT_MAX;
  p->max_coll_bytes = INT_MAX;
  return kSuccess;
}

Result Listen(int dev, void* handle, void** listen_comm) {
  State& s = S();
  if (handle == nullptr || listen_comm == nullptr) return kInvalidArgument;
  SockAddr addr;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.refs == 0) return Fail(kInvalidUsage, "listen before init");
    addr = s.listen_addr;
  }
  auto fd = ListenOn(addr);
  if (!fd.ok()) return FailStatus(kSystemError, "listen", fd.status());
  auto* lc = new Listener();
  lc->dev = dev;
  lc->fd = *std::move(fd);
  lc->nonce = Random64();
  WireHandle h{};
  h.magic = kHandleMagic;
  h.version = kWireVersion;
  h.family = AF_INET;
  auto* in = reinterpret_cast<sockaddr_in*>(&addr.ss);
  std::memcpy(h.addr, &in->sin_addr, 4);
  h.port = in->sin_port;
  h.dev = static_cast<uint16_t>(dev);
  h.nonce = lc->nonce;
  {
    std::lock_guard<std::mutex> l(s.mu);
    std::snprintf(h.node_id, sizeof(h.node_id), "%s", s.node_id.c_str());
  }
  std::memset(handle, 0, nccl_abi::kHandleMaxSize);
  std::memcpy(handle, &h, sizeof(h));
  *listen_comm = lc;
  return kSuccess;
}

Result Connect(int dev, void* handle, void** send_comm) {
  State& s = S();
  if (handle == nullptr || send_comm == nullptr) return kInvalidArgument;
  *send_comm = nullptr;
  auto* h = static_cast<WireHandle*>(handle);
  if (h->magic != kHandleMagic || h->version != kWireVersion || h->family != AF_INET || h->port == 0) {
    return Fail(kInvalidArgument, "connect: the handle is not a podlink listen handle (corrupted, or from another "
                                  "plugin or version)");
  }
  Connecting* st = nullptr;
  {
    std::lock_guard<std::mutex> l(s.mu);
    auto it = s.connecting.find(handle);
    if (it != s.connecting.end() && it->second->cookie == h->connect_cookie) st = it->second.get();
  }
  if (st == nullptr) {
    auto fresh = std::make_unique<Connecting>();
    fresh->cookie = Random64() | 1;
    h->connect_cookie = fresh->cookie;
    auto* in = reinterpret_cast<sockaddr_in*>(&fresh->to.ss);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, h->addr, 4);
    in->sin_port = h->port;
    fresh->to.len = sizeof(sockaddr_in);
    char peer_node[sizeof(h->node_id) + 1] = {};
    std::memcpy(peer_node, h->node_id, sizeof(h->node_id));
    int nsocks;
    {
      std::lock_guard<std::mutex> l(s.mu);
      bool same_node = !s.node_id.empty() && s.engine != nullptr && s.node_id == peer_node;
      fresh->transport = same_node ? Transport::kPodlink : Transport::kTcp;
      nsocks = fresh->transport == Transport::kTcp ? s.nsocks : 0;
      fresh->hello.nonce = h->nonce;
      std::snprintf(fresh->hello.node_id, sizeof(fresh->hello.node_id), "%s", s.node_id.c_str());
    }
    fresh->hello.magic = kHelloMagic;
    fresh->hello.version = kWireVersion;
    fresh->hello.transport = static_cast<uint8_t>(fresh->transport);
    fresh->hello.conn_id = Random64();
    fresh->hello.nsocks = static_cast<uint32_t>(nsocks);
    fresh->hello.pid = static_cast<uint32_t>(::getpid());
    for (int i = 0; i <= nsocks; ++i) {
      auto fd = StartConnect(fresh->to);
      if (!fd.ok()) return FailStatus(kSystemError, "connect", fd.status());
      fresh->fds.push_back(*std::move(fd));
      fresh->hello_sent.push_back(false);
    }
    st = fresh.get();
    std::lock_guard<std::mutex> l(s.mu);
    s.connecting[handle] = std::move(fresh);
  }
  auto abandon = [&](Result r, const std::string& why) {
    std::lock_guard<std::mutex> l(s.mu);
    std::string peer = st->to.ToString();
    s.connecting.erase(handle);
    return Fail(r, absl::StrCat("connect to ", peer, ": ", why));
  };
  // Hellos, once each socket is connected.
  for (size_t i = 0; i < st->fds.size(); ++i) {
    if (st->hello_sent[i]) continue;
    auto up = ConnectDone(st->fds[i].get());
    if (!up.ok()) return abandon(kSystemError, up.status().ToString());
    if (!*up) return kSuccess;
    Hello hello = st->hello;
    hello.kind = i == 0 ? 0 : 1;
    hello.index = static_cast<uint32_t>(i == 0 ? 0 : i - 1);
    if (!WriteAll(st->fds[i].get(), &hello, sizeof(hello))) return abandon(kSystemError, "sending hello failed");
    st->hello_sent[i] = true;
  }
  // The receiver's welcome.
  while (st->welcome_got < sizeof(Welcome)) {
    auto n = RecvSome(st->fds[0].get(), reinterpret_cast<char*>(&st->welcome) + st->welcome_got,
                      sizeof(Welcome) - st->welcome_got);
    if (!n.ok()) return abandon(kRemoteError, absl::StrCat("no welcome: ", n.status().ToString()));
    if (*n == 0) return kSuccess;
    st->welcome_got += *n;
  }
  if (st->welcome.magic != kHelloMagic || st->welcome.status != 0) {
    std::string msg(st->welcome.message, strnlen(st->welcome.message, sizeof(st->welcome.message)));
    return abandon(kRemoteError, absl::StrCat("the receiver refused the connection: ", msg));
  }
  auto* c = new Comm();
  c->send = true;
  c->dev = dev;
  c->transport = st->transport;
  c->peer = st->to.ToString();
  c->ctrl = std::move(st->fds[0]);
  for (size_t i = 1; i < st->fds.size(); ++i) c->data.push_back(std::move(st->fds[i]));
  c->pieces.resize(c->data.size());
  Welcome w = st->welcome;
  {
    std::lock_guard<std::mutex> l(s.mu);
    s.connecting.erase(handle);
    s.live_comms++;
  }
  if (c->transport == Transport::kPodlink) {
    Result r = SetupPodlinkSender(*c, w);
    if (r != kSuccess) {
      DestroyComm(c);
      return r;
    }
  }
  INFO("connection to %s via %s%s", c->peer.c_str(),
       c->transport == Transport::kPodlink ? "podlink (same node: podlinkd relay over NVLink)" : "TCP",
       c->transport == Transport::kTcp ? absl::StrCat(", ", c->data.size(), " data sockets").c_str() : "");
  *send_comm = c;
  return kSuccess;
}

Result Accept(void* listen_comm, void** recv_comm) {
  State& s = S();
  auto* lc = static_cast<Listener*>(listen_comm);
  if (lc == nullptr || lc->magic != kListenMagic || recv_comm == nullptr) {
    return Fail(kInvalidArgument, "accept: not a podlink listen comm");
  }
  *recv_comm = nullptr;
  for (;;) {
    int fd = ::accept4(lc->fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    if (lc->pending.size() >= 64) {  // someone is flooding the port; NCCL's peer opens at most 17
      ::close(fd);
      continue;
    }
    Listener::Pending p;
    p.fd.Reset(fd);
    lc->pending.push_back(std::move(p));
  }
  for (size_t i = 0; i < lc->pending.size();) {
    Listener::Pending& p = lc->pending[i];
    auto n = RecvSome(p.fd.get(), reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got);
    bool drop = !n.ok();
    if (n.ok()) p.got += *n;
    if (!drop && p.got == sizeof(Hello)) {
      const Hello& h = p.hello;
      drop = h.magic != kHelloMagic || h.version != kWireVersion || h.nonce != lc->nonce || h.kind > 1 ||
             h.nsocks > 16 || (h.kind == 1 && h.index >= h.nsocks) ||
             (h.transport != static_cast<uint8_t>(Transport::kTcp) &&
              h.transport != static_cast<uint8_t>(Transport::kPodlink));
      if (drop) {
        WARN("accept: dropped a connection with a bad hello (not from the NCCL peer this handle went to)");
      } else {
        lc->groups[h.conn_id].push_back(std::move(p));
        lc->pending.erase(lc->pending.begin() + i);
        continue;
      }
    }
    if (drop) {
      lc->pending.erase(lc->pending.begin() + i);
      continue;
    }
    ++i;
  }
  for (auto it = lc->groups.begin(); it != lc->groups.end(); ++it) {
    auto& socks = it->second;
    const Listener::Pending* ctrl = nullptr;
    for (const auto& p : socks) {
      if (p.hello.kind == 0) ctrl = &p;
    }
    if (ctrl == nullptr || socks.size() != ctrl->hello.nsocks + 1) continue;
    auto* c = new Comm();
    c->send = false;
    c->dev = lc->dev;
    c->transport = static_cast<Transport>(ctrl->hello.transport);
    std::vector<UniqueFd> data(ctrl->hello.nsocks);
    bool ok = true;
    for (auto& p : socks) {
      if (p.hello.kind == 0) {
        c->ctrl = std::move(p.fd);
      } else if (!data[p.hello.index]) {
        data[p.hello.index] = std::move(p.fd);
      } else {
        ok = false;
      }
    }
    c->data = std::move(data);
    c->pieces.resize(c->data.size());
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    SockAddr pa;
    if (::getpeername(c->ctrl.get(), reinterpret_cast<sockaddr*>(&pa.ss), &len) == 0) pa.len = len;
    c->peer = pa.ToString();
    lc->groups.erase(it);
    {
      std::lock_guard<std::mutex> l(s.mu);
      s.live_comms++;
      if (c->transport == Transport::kPodlink && s.engine == nullptr) ok = false;
    }
    Welcome w{};
    w.magic = kHelloMagic;
    Result r = kSuccess;
    if (!ok) {
      r = Fail(kRemoteError, absl::StrCat("accept from ", c->peer, ": inconsistent connection (duplicate socket, or "
                                          "same-node transport without podlinkd here)"));
    } else if (c->transport == Transport::kPodlink) {
      r = SetupPodlinkReceiver(*c, w);
    }
    if (r != kSuccess) {
      w.status = 1;
      std::snprintf(w.message, sizeof(w.message), "receiver setup failed, see its log");
      (void)WriteAll(c->ctrl.get(), &w, sizeof(w));
      DestroyComm(c);
      return r;
    }
    if (!WriteAll(c->ctrl.get(), &w, sizeof(w))) {
      DestroyComm(c);
      return Fail(kRemoteError, "accept: the connector went away");
    }
    INFO("connection from %s via %s", c->peer.c_str(), TransportName(c->transport));
    *recv_comm = c;
    return kSuccess;
  }
  return kSuccess;
}

Result RegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr || c->magic != kCommMagic || mhandle == nullptr) return Fail(kInvalidArgument, "regMr: bad comm");
  if (type != nccl_abi::kPtrHost && type != nccl_abi::kPtrCuda) {
    return Fail(kInvalidArgument, absl::StrCat("regMr: unsupported memory type ", type));
  }
  if (data == nullptr && size > 0) return Fail(kInvalidArgument, "regMr: NULL buffer");
  State& s = S();
  auto mr = std::make_unique<Mr>();
  mr->comm = c;
  mr->base = static_cast<char*>(data);
  mr->size = size;
  mr->type = type;
  if (c->transport == Transport::kPodlink && size > 0) {
    absl::Status why = absl::OkStatus();
    if (type == nccl_abi::kPtrCuda && s.cuda == nullptr) {
      return Fail(kInvalidArgument, "regMr: GPU memory but no CUDA driver in this process");
    }
    if (type == nccl_abi::kPtrCuda) {
      cu::DevicePtr base = 0;
      size_t alloc = 0;
      if (s.cuda->MemGetAddressRange(&base, &alloc, reinterpret_cast<cu::DevicePtr>(data)) == cu::kSuccess) {
        std::lock_guard<std::mutex> l(s.mu);
        auto it = s.exports.find(base);
        if (it != s.exports.end()) {
          it->second.refs++;
          mr->region = it->second.region;
          mr->alloc_base = base;
        }
      }
      if (mr->alloc_base == 0 && base != 0) {
        auto region = s.engine->RegisterExisting(base, alloc);
        if (region.ok()) {
          bool raced = false;
          {
            std::lock_guard<std::mutex> l(s.mu);
            auto& e = s.exports[base];
            raced = e.refs > 0;  // another proxy thread exported the same allocation meanwhile
            if (!raced) e.region = *region;
            e.refs++;
            mr->region = e.region;
            mr->alloc_base = base;
          }
          if (raced) (void)s.engine->Unregister(*region);
        } else {
          why = region.status();
        }
      }
      if (mr->alloc_base != 0) mr->region_offset = reinterpret_cast<cu::DevicePtr>(data) - base;
    }
    if (mr->alloc_base == 0) {
      // Not exportable as is: a bounce buffer of the same size that is.
      absl::StatusOr<LocalRegion> region;
      if (type == nccl_abi::kPtrHost) {
        auto buf = s.client->AllocateHost(size);
        if (!buf.ok()) return FailStatus(kSystemError, "regMr: host bounce buffer", buf.status());
        mr->host_bounce = *std::move(buf);
        region = s.engine->Register(*mr->host_bounce);
      } else {
        INFO("regMr: GPU buffer %p is not an exportable cuMem allocation (%s); using a bounce buffer", data,
             why.ToString().c_str());
        auto buf = s.client->AllocateGpu(size, c->dev);
        if (!buf.ok()) return FailStatus(kUnhandledCudaError, "regMr: GPU bounce buffer", buf.status());
        mr->gpu_bounce = *std::move(buf);
        region = s.engine->Register(*mr->gpu_bounce);
      }
      if (!region.ok()) return FailStatus(kSystemError, "regMr: exporting the bounce buffer", region.status());
      mr->region = *region;
    }
  }
  *mhandle = mr.release();
  return kSuccess;
}

Result DeregMr(void* comm, void* mhandle) {
  auto* mr = static_cast<Mr*>(mhandle);
  if (mr == nullptr || mr->magic != kMrMagic) return Fail(kInvalidArgument, "deregMr: not a podlink registration");
  State& s = S();
  std::unique_ptr<Mr> owned(mr);
  owned->magic = 0;
  if (owned->alloc_base != 0) {
    bool last = false;
    LocalRegion region;
    {
      std::lock_guard<std::mutex> l(s.mu);
      auto it = s.exports.find(owned->alloc_base);
      if (it != s.exports.end() && --it->second.refs == 0) {
        last = true;
        region = it->second.region;
        s.exports.erase(it);
      }
    }
    if (last) (void)s.engine->Unregister(region);
  } else if (owned->bounce() && s.engine) {
    (void)s.engine->Unregister(owned->region);
  }
  return kSuccess;
}

Result Isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request) {
  if (request == nullptr) return kInvalidArgument;
  *request = nullptr;
  Comm* c = AsComm(send_comm, true);
  auto* mr = static_cast<Mr*>(mhandle);
  if (c == nullptr) return Fail(kInvalidArgument, "isend: not a podlink send comm");
  if (c->failed != kSuccess) return c->failed;
  if (mr == nullptr || mr->magic != kMrMagic || mr->comm != c) {
    return Fail(kInvalidArgument, "isend: memory handle not registered on this comm");
  }
  char* p = static_cast<char*>(data);
  if (!Covers(*mr, p, size)) {
    return Fail(kInvalidArgument, "isend: buffer outside its registration");
  }
  if (c->transport == Transport::kPodlink) return PodlinkIsend(*c, data, size, tag, mr, request);

  Result pr = TcpProgress(*c);
  if (pr != kSuccess) return pr;
  if (c->cts_queue.empty()) return kSuccess;
  const Frame cts = c->cts_queue.front();  // by value: consuming it may pop it
  int index = -1;
  if (Result m = MatchTag(cts.tags, cts.n, c->cts_consumed, tag, c->peer, &index); m != kSuccess) return m;
  Request* r = TakeRequest(*c);
  if (r == nullptr) return kSuccess;
  r->send = true;
  r->seq = cts.seq;
  r->index = index;
  r->size = size;
  Frame f{};
  f.type = kFrameData;
  f.seq = cts.seq;
  f.index = static_cast<uint32_t>(index);
  if (size > cts.sizes[index]) size = r->size = Truncate(*c, size, cts.sizes[index]);
  f.sizes[0] = size;
  c->cts_consumed |= 1u << index;
  if (c->cts_consumed == (1u << cts.n) - 1) {
    c->cts_queue.pop_front();
    c->cts_consumed = 0;
  }
  TcpQueueFrame(*c, f);
  TRACE_OP("trace tcp isend comm=%p peer=%s seq=%lu index=%d tag=%d size=%zu type=%d", static_cast<void*>(c),
           c->peer.c_str(), static_cast<unsigned long>(cts.seq), index, tag, size, mr->type);
  r->src = p;
  if (mr->type != nccl_abi::kPtrHost && size > 0) {
    auto st = TakeStage(*c, size);
    absl::Status cs = st.ok() ? absl::OkStatus() : st.status();
    if (cs.ok()) {
      r->staging[0] = *st;
      r->src = st->p;
      cs = StartCopies(*c, *r, {{reinterpret_cast<uint64_t>(st->p), reinterpret_cast<uint64_t>(p), size}});
    }
    if (!cs.ok()) {
      c->failed = kUnhandledCudaError;
      DropRequest(*r);
      return FailStatus(kUnhandledCudaError, "isend: staging GPU memory", cs);
    }
  }
  c->unqueued.push_back(r);
  *request = r;
  return TcpProgress(*c);
}

Result Irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
             void** request) {
  if (request == nullptr) return kInvalidArgument;
  *request = nullptr;  // also overwrites NCCL's optional-completion hint
  Comm* c = AsComm(recv_comm, false);
  if (c == nullptr) return Fail(kInvalidArgument, "irecv: not a podlink receive comm");
  if (c->failed != kSuccess) return c->failed;
  if (n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || tags == nullptr || mhandles == nullptr) {
    return Fail(kInvalidArgument, absl::StrCat("irecv: bad arguments (n=", n, ", at most ", kMaxRecvs, ")"));
  }
  Mr* mrs[kMaxRecvs];
  for (int i = 0; i < n; ++i) {
    mrs[i] = static_cast<Mr*>(mhandles[i]);
    if (mrs[i] == nullptr || mrs[i]->magic != kMrMagic || mrs[i]->comm != c) {
      return Fail(kInvalidArgument, "irecv: memory handle not registered on this comm");
    }
    if (!Covers(*mrs[i], data[i], sizes[i])) {
      return Fail(kInvalidArgument, "irecv: buffer outside its registration");
    }
  }
  Result pr = c->transport == Transport::kTcp ? TcpProgress(*c) : kSuccess;
  if (pr != kSuccess) return pr;
  if (c->transport == Transport::kPodlink) {
    Result r = PodlinkIrecv(*c, n, data, sizes, tags, mrs, request);
    if (*request != nullptr) {
      auto* req = static_cast<Request*>(*request);
      for (int i = 0; i < n; ++i) {
        req->data[i] = data[i];
        req->posted[i] = sizes[i];
        req->mr[i] = mrs[i];
      }
    }
    return r;
  }
  if (!c->peer_closed.empty()) {
    c->failed = kRemoteError;
    return Fail(kRemoteError, absl::StrCat("irecv: connection with ", c->peer, ": ", c->peer_closed));
  }
  Request* r = TakeRequest(*c, static_cast<int>(c->next_seq % kMaxRequests));
  if (r == nullptr) return kSuccess;
  r->seq = c->next_seq++;
  r->n = n;
  r->frames_left = n;
  Frame f{};
  f.type = kFrameCts;
  f.seq = r->seq;
  f.n = static_cast<uint32_t>(n);
  for (int i = 0; i < n; ++i) {
    r->data[i] = data[i];
    r->posted[i] = sizes[i];
    r->mr[i] = mrs[i];
    f.tags[i] = tags[i];
    f.sizes[i] = sizes[i];
  }
  TcpQueueFrame(*c, f);
  TRACE_OP("trace tcp irecv comm=%p peer=%s seq=%lu n=%d tag0=%d size0=%zu type0=%d", static_cast<void*>(c),
           c->peer.c_str(), static_cast<unsigned long>(r->seq), n, tags[0], sizes[0], mrs[0]->type);
  *request = r;
  return TcpProgress(*c);
}

Result Iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles, void** request) {
  // test() reports a receive done only once the bytes are in place (relay
  // completion, or our own copy waited for), so there is nothing to flush.
  if (request != nullptr) *request = nullptr;
  return AsComm(recv_comm, false) != nullptr ? kSuccess : Fail(kInvalidArgument, "iflush: not a receive comm");
}

Result Test(void* request, int* done, int* sizes) {
  auto* r = static_cast<Request*>(request);
  if (r == nullptr || done == nullptr || !r->in_use || r->comm == nullptr || r->comm->magic != kCommMagic) {
    return Fail(kInvalidArgument, "test: not a podlink request in flight");
  }
  *done = 0;
  Comm& c = *r->comm;
  if (c.transport == Transport::kPodlink) return PodlinkTest(*r, done, sizes);
  Result pr = TcpProgress(c);
  if (pr != kSuccess) return pr;
  if (r->send) {
    if (!r->queued || r->pieces_left > 0) return kSuccess;
    TRACE_OP("trace tcp send done comm=%p seq=%lu", static_cast<void*>(&c), static_cast<unsigned long>(r->seq));
    if (sizes != nullptr) sizes[0] = static_cast<int>(r->size);
    *done = 1;
    DropRequest(*r);
    return kSuccess;
  }
  if (r->frames_left > 0 && !c.peer_closed.empty()) {
    c.failed = kRemoteError;
    return Fail(kRemoteError, absl::StrCat("connection with ", c.peer, ": ", c.peer_closed,
                                           " before sending what a receive was due"));
  }
  if (r->frames_left > 0 || r->pieces_left > 0) return kSuccess;
  Result result = r->error;
  if (!r->copying && result == kSuccess) {
    // Page-locked staging -> GPU, asynchronously; done once they have landed.
    std::vector<std::array<uint64_t, 3>> copies;
    for (int i = 0; i < r->n; ++i) {
      if (r->mr[i]->type != nccl_abi::kPtrHost && r->got[i] > 0) {
        copies.push_back(
            {reinterpret_cast<uint64_t>(r->data[i]), reinterpret_cast<uint64_t>(r->staging[i].p), r->got[i]});
      }
    }
    TRACE_OP("trace tcp recv arrived comm=%p seq=%lu copies=%zu", static_cast<void*>(&c),
             static_cast<unsigned long>(r->seq), copies.size());
    r->copying = true;
    if (!copies.empty()) {
      absl::Status st = StartCopies(c, *r, copies);
      if (!st.ok()) result = FailStatus(kUnhandledCudaError, "irecv: copying into GPU memory", st);
    }
  }
  if (result == kSuccess) {
    auto copied = CopiesDone(c, *r);
    if (!copied.ok()) {
      result = FailStatus(kUnhandledCudaError, "irecv: copying into GPU memory", copied.status());
    } else if (!*copied) {
      return kSuccess;
    }
  } else if (r->error != kSuccess) {
    WARN("receive from %s: the matching send was larger than the receive", c.peer.c_str());
  }
  if (result != kSuccess && result != r->error) c.failed = result;
  for (int i = 0; i < r->n; ++i) {
    if (sizes != nullptr) sizes[i] = static_cast<int>(r->got[i]);
  }
  *done = 1;
  DropRequest(*r);
  return result;
}

Result CloseSend(void* send_comm) {
  Comm* c = AsComm(send_comm, true);
  if (c == nullptr) return Fail(kInvalidArgument, "closeSend: not a podlink send comm");
  DestroyComm(c);
  return kSuccess;
}

Result CloseRecv(void* recv_comm) {
  Comm* c = AsComm(recv_comm, false);
  if (c == nullptr) return Fail(kInvalidArgument, "closeRecv: not a podlink receive comm");
  DestroyComm(c);
  return kSuccess;
}

// ---------------------------------------------------------------- tuner

namespace {

struct TunerContext {
  uint32_t magic = 0x74756e65;  // "tune"
  size_t n_ranks = 0;
  size_t n_nodes = 0;
};

constexpr size_t kTunerBytesPerChannel = 4 << 20;
constexpr int kTunerMinChannels = 4;
constexpr int kTunerMaxChannels = 16;

}  // namespace

int TunerChannels(size_t n_ranks, size_t n_nodes, int coll_type, size_t bytes) {
  State& s = S();
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.node_id.empty()) return 0;  // no podlinkd: TCP only, NCCL's own tuning
  }
  if (n_ranks < 2 || n_nodes < 2 || EnvIs("PODLINK_NCCL_TUNER", "0")) return 0;
  if (coll_type < nccl_abi::kFuncBroadcast || coll_type > nccl_abi::kFuncAllReduce) return 0;
  size_t want = bytes / kTunerBytesPerChannel;
  if (want >= kTunerMaxChannels) return 0;  // large: NCCL's own choice (it measured better at 64 MiB)
  return static_cast<int>(std::max<size_t>(want, kTunerMinChannels));
}

Result TunerInit(size_t n_ranks, size_t n_nodes, nccl_abi::Logger logger, void** context) {
  if (context == nullptr) return kInvalidArgument;
  auto* t = new TunerContext();
  t->n_ranks = n_ranks;
  t->n_nodes = n_nodes;
  *context = t;
  State& s = S();
  if (logger != nullptr) {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.logger == nullptr) s.logger = logger;
  }
  s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
        "tuner: %zu ranks on %zu nodes; below 64 MiB channels = bytes / 4 MiB, at least 4, when podlinkd relays (%s)",
        n_ranks, n_nodes, TunerChannels(n_ranks, n_nodes, nccl_abi::kFuncAllReduce, 0) > 0 ? "active" : "inactive");
  return kSuccess;
}

Result TunerGetCollInfo(void* context, int coll_type, size_t bytes, int /*num_pipe_ops*/, float** /*cost_table*/,
                        int /*num_algo*/, int /*num_proto*/, int /*reg_buff*/, int* n_channels) {
  auto* t = static_cast<TunerContext*>(context);
  if (t == nullptr || t->magic != 0x74756e65 || n_channels == nullptr) {
    return Fail(kInvalidArgument, "tuner: getCollInfo without a podlink tuner context");
  }
  int nc = TunerChannels(t->n_ranks, t->n_nodes, coll_type, bytes);
  if (nc > 0) *n_channels = nc;  // algorithm and protocol stay NCCL's
  return kSuccess;
}

Result TunerDestroy(void* context) {
  auto* t = static_cast<TunerContext*>(context);
  if (t == nullptr || t->magic != 0x74756e65) return Fail(kInvalidArgument, "tuner: destroy of a foreign context");
  t->magic = 0;
  delete t;
  return kSuccess;
}

Result CloseListen(void* listen_comm) {
  auto* lc = static_cast<Listener*>(listen_comm);
  if (lc == nullptr || lc->magic != kListenMagic) return Fail(kInvalidArgument, "closeListen: not a listen comm");
  lc->magic = 0;
  delete lc;
  return kSuccess;
}

}  // namespace podlink::ncclnet
