// podlink-bench: GPU-to-GPU copy bandwidth and per-operation latency, for
// sizes 4 KiB .. 1 GiB, in one run:
//
//   baseline  one process sees both GPUs and copies with cuMemcpyAsync on one
//             stream (the copy-engine limit, as in shared/FACTS.md)
//   direct    TransferEngine with the peer's buffer mapped in this process
//   relay     TransferEngine through podlinkd's relay
//
// A 1 GiB (or --total) destination is written whole in operations of each
// size; the mean of --passes passes is reported. Latency is the mean wall
// time of one synchronous 4 KiB-size operation repeated --lat-iters times.
// Writes a table to stdout and CSV / JSON when asked. Bandwidth is measured,
// never asserted; the bytes are: every source holds a seeded pattern, each
// destination is cleared before a size is timed and compared with its source
// after (outside the timed loop), and any mismatch makes the exit status 1.
//
// Both directions at once (what a two-rank collective asks of the relay), in
// operations of --bidir-sizes, --window operations in flight per direction,
// one thread per direction:
//
//   baseline-bidir  one process maps both destinations; each source GPU's
//                   copy engine writes into the other GPU (one stream each)
//   relay-bidir     two sessions write into each other's GPU through podlinkd
//
//   podlink-bench [--src-gpu 0] [--dst-gpu 1] [--total BYTES] [--passes 5]
//                 [--modes baseline,direct,relay,baseline-bidir,relay-bidir]
//                 [--bidir-sizes 1048576,4194304] [--window 16] [--csv F] [--json F]
//
// The KV hand-off from a prefill pod into a decode pod's paged cache, as
// tests/gpu/kv_podlink.py does it through `import podlink` (the same blocks,
// the same scattered block ids, one Writev per pass): --kv-open names the
// decode pod's export, which this process (the prefill side, on --src-gpu)
// opens once it exists; each --kv-blocks entry SIZE:COUNT is written
// --kv-iters times after a warm-up, read back and compared block by block.
// One JSON line per entry on stdout; exit 1 on a wrong block.
//
//   podlink-bench --kv-open kv-bench [--kv-blocks 16K:4096,64K:2048] [--kv-iters 10] [--kv-relay]
//
// (podlink-bench --help lists every option.)
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/cli.h"
#include "common/cuda_driver.h"
#include "nlohmann/json.hpp"
#include "podlink/client.h"
#include "podlink/transfer.h"

ABSL_FLAG(int, src_gpu, 0, "GPU of the source buffers");
ABSL_FLAG(int, dst_gpu, 1, "GPU of the destination buffers (the source GPU when only one GPU is visible)");
ABSL_FLAG(uint64_t, total, 1ull << 30, "bytes of each buffer, written whole per pass; at least 4096");
ABSL_FLAG(int, passes, 5, "timed passes per operation size, after one warm-up; the mean is reported");
ABSL_FLAG(int, lat_iters, 2000, "synchronous 4 KiB operations timed for the latency table");
ABSL_FLAG(std::vector<std::string>, modes, (std::vector<std::string>{"baseline", "direct", "relay"}),
          "what to measure, in this order, comma-separated: baseline, direct, relay, baseline-bidir, relay-bidir");
ABSL_FLAG(std::vector<std::string>, bidir_sizes,
          (std::vector<std::string>{"1048576", "2097152", "4194304", "8388608", "16777216"}),
          "operation sizes of the -bidir modes, bytes, comma-separated");
ABSL_FLAG(int, window, 16, "relay-bidir: operations in flight per direction");
ABSL_FLAG(std::string, csv, "", "also write every row to this CSV file");
ABSL_FLAG(std::string, kv_open, "",
          "the KV hand-off: write scattered blocks into the export of this name (\"name\" or \"namespace/name\")");
ABSL_FLAG(std::string, kv_blocks, "16K:4096,64K:2048,256K:1024,1M:256,4M:64",
          "--kv-open: block size and count per run, SIZE:COUNT comma-separated (sizes may end in K, M or G)");
ABSL_FLAG(int, kv_iters, 10, "--kv-open: timed Writev calls per block size, after one warm-up");
ABSL_FLAG(bool, kv_relay, false, "--kv-open: through podlinkd's relay even where the peer's GPU could be mapped");
ABSL_FLAG(int, kv_wait, 120, "--kv-open: seconds to wait for the export to appear");
ABSL_FLAG(std::string, json, "", "also write every row and the latencies to this JSON file");
ABSL_FLAG(bool, corrupt_for_test, false,
          "test of the verification: flip one byte of each destination after timing, before it is compared; the run "
          "must then report the mismatches and exit 1");

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] = R"(usage: podlink-bench [options]

GPU-to-GPU copy bandwidth and 4 KiB latency through podlinkd ($PODLINK_SOCKET_DIR, else
/run/podlink), against one process's own cuMemcpyAsync (baseline), for operation sizes
4 KiB .. --total. Prints tables on stdout, progress on stderr. Every size of every mode
is checked byte for byte after it is timed (outside the timed loop); exits 1 on any
mismatch, after printing the tables.
)";

constexpr const char* kModes[] = {"baseline", "direct", "relay", "baseline-bidir", "relay-bidir"};

struct Args {
  int src_gpu = 0, dst_gpu = 1;
  uint64_t total = 0;
  int passes = 0;
  int lat_iters = 0;
  std::vector<std::string> modes;
  std::vector<uint64_t> bidir_sizes;
  int window = 0;
  std::string csv, json;
  bool corrupt_for_test = false;
  std::string kv_open;
  std::vector<std::pair<uint64_t, uint64_t>> kv_blocks;  // (block bytes, blocks)
  int kv_iters = 0, kv_wait = 0;
  bool kv_relay = false;
};

// "16K" -> 16384; false when `s` is not a positive size.
bool ParseSize(absl::string_view s, uint64_t* out) {
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': mult = 1ull << 10; break;
      case 'M': mult = 1ull << 20; break;
      case 'G': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) s.remove_suffix(1);
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(s, &v) || v == 0 || v > (1ull << 40) / mult) return false;
  *out = v * mult;
  return true;
}

// Every option, checked once: the command line's meaning, or what is wrong with it.
absl::StatusOr<Args> ArgsFromFlags(const std::vector<std::string>& positional) {
  if (!positional.empty()) return absl::InvalidArgumentError("unexpected argument '" + positional[0] + "'");
  Args a;
  a.src_gpu = absl::GetFlag(FLAGS_src_gpu);
  a.dst_gpu = absl::GetFlag(FLAGS_dst_gpu);
  a.total = absl::GetFlag(FLAGS_total);
  a.passes = absl::GetFlag(FLAGS_passes);
  a.lat_iters = absl::GetFlag(FLAGS_lat_iters);
  a.modes = absl::GetFlag(FLAGS_modes);
  a.window = absl::GetFlag(FLAGS_window);
  a.csv = absl::GetFlag(FLAGS_csv);
  a.json = absl::GetFlag(FLAGS_json);
  a.corrupt_for_test = absl::GetFlag(FLAGS_corrupt_for_test);
  a.kv_open = absl::GetFlag(FLAGS_kv_open);
  a.kv_iters = absl::GetFlag(FLAGS_kv_iters);
  a.kv_wait = absl::GetFlag(FLAGS_kv_wait);
  a.kv_relay = absl::GetFlag(FLAGS_kv_relay);
  auto positive = [](const char* flag, int64_t v) {
    return absl::InvalidArgumentError(absl::StrFormat("--%s must be a positive integer (got '%d')", flag, v));
  };
  for (auto [flag, gpu] : {std::pair{"src-gpu", a.src_gpu}, {"dst-gpu", a.dst_gpu}}) {
    if (gpu < 0) return absl::InvalidArgumentError(absl::StrFormat("--%s must be a GPU index (got '%d')", flag, gpu));
  }
  if (a.total < 4096) {
    return absl::InvalidArgumentError(absl::StrFormat("--total must be at least 4096 bytes (got '%d')", a.total));
  }
  if (a.passes < 1) return positive("passes", a.passes);
  if (a.lat_iters < 1) return positive("lat-iters", a.lat_iters);
  if (a.window < 1) return positive("window", a.window);
  if (a.modes.empty()) return absl::InvalidArgumentError("--modes names nothing to measure");
  for (const std::string& m : a.modes) {
    if (std::find(std::begin(kModes), std::end(kModes), m) == std::end(kModes)) {
      return absl::InvalidArgumentError("--modes: unknown mode '" + m + "' (modes: " + absl::StrJoin(kModes, ", ") +
                                        ")");
    }
  }
  if (a.kv_iters < 1) return positive("kv-iters", a.kv_iters);
  if (a.kv_wait < 0) return positive("kv-wait", a.kv_wait);
  for (absl::string_view e : absl::StrSplit(absl::GetFlag(FLAGS_kv_blocks), ',')) {
    std::pair<absl::string_view, absl::string_view> sc = absl::StrSplit(e, absl::MaxSplits(':', 1));
    uint64_t block = 0, count = 0;
    if (!ParseSize(sc.first, &block) || !absl::SimpleAtoi(sc.second, &count) || count == 0 ||
        count > (1ull << 40) / block) {
      return absl::InvalidArgumentError("--kv-blocks entries are SIZE:COUNT, e.g. 64K:2048 (got '" + std::string(e) +
                                        "')");
    }
    a.kv_blocks.emplace_back(block, count);
  }
  for (const std::string& v : absl::GetFlag(FLAGS_bidir_sizes)) {
    uint64_t x = 0;
    if (!absl::SimpleAtoi(v, &x) || x == 0) {
      return absl::InvalidArgumentError("--bidir-sizes must be positive integers, comma-separated (got '" + v + "')");
    }
    a.bidir_sizes.push_back(x);
  }
  return a;
}

struct Row {
  std::string mode;
  uint64_t size = 0;
  double gbps = 0;
  double op_us = 0;  // mean time per operation within the bandwidth run
  double both_gbps = 0;  // bidirectional modes: both directions together
  uint64_t checked = 0;     // destination bytes compared with the source after the timed passes
  uint64_t mismatches = 0;  // of those, bytes that differed
};

[[noreturn]] void Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "podlink-bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

std::string HumanSize(uint64_t b) {
  if (b >= (1ull << 30)) return absl::StrFormat("%d GiB", b >> 30);
  if (b >= (1ull << 20)) return absl::StrFormat("%d MiB", b >> 20);
  return absl::StrFormat("%d KiB", b >> 10);
}

std::vector<uint64_t> Sizes(uint64_t total) {
  std::vector<uint64_t> s;
  for (uint64_t x = 4096; x <= total; x *= 2) s.push_back(x);
  if (s.back() != total) s.push_back(total);
  return s;
}

// Times `pass` (which moves `total` bytes) `passes` times; returns mean seconds.
template <typename F>
double TimePasses(int passes, F pass) {
  pass();  // warm-up
  double sum = 0;
  for (int i = 0; i < passes; ++i) {
    auto t0 = Clock::now();
    pass();
    sum += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return sum / passes;
}

// Verification, kept out of every timed loop: a source is filled with the
// pattern of a seed; before a size is timed its destination is cleared, and
// after it the destination is read back and compared with the pattern.
class Checker {
 public:
  Checker(const podlink::cu::Driver* d, uint64_t total) : d_(d), total_(total) {}
  ~Checker() {
    if (pinned_) d_->MemFreeHost(readback_);
    for (auto& [gpu, ctx] : ctx_) d_->DevicePrimaryCtxRelease(gpu);
  }
  Checker(const Checker&) = delete;
  Checker& operator=(const Checker&) = delete;

  void Fill(const podlink::GpuBuffer& buf, int gpu, uint64_t seed) {
    Use(gpu);
    Check(d_->MemcpyHtoD(buf.device_ptr(), Pattern(seed).data(), std::min<uint64_t>(buf.size(), total_)),
          "cuMemcpyHtoD");
  }
  void Clear(const podlink::GpuBuffer& buf, int gpu) {
    Use(gpu);
    Check(d_->MemsetD8(buf.device_ptr(), 0, buf.size()), "cuMemsetD8");
    // The memset may still run when the timed copies start on other streams
    // (or in podlinkd): finish it first.
    Check(d_->CtxSynchronize(), "cuCtxSynchronize");
  }
  // Flips the first byte of `buf` (for --corrupt-for-test).
  void Corrupt(const podlink::GpuBuffer& buf, int gpu) {
    uint8_t b = 0;
    Use(gpu);
    Check(d_->MemcpyDtoH(&b, buf.device_ptr(), 1), "cuMemcpyDtoH");
    b = static_cast<uint8_t>(~b);
    Check(d_->MemcpyHtoD(buf.device_ptr(), &b, 1), "cuMemcpyHtoD");
  }
  // Bytes among the first `bytes` of `buf` that differ from the pattern of `seed`.
  uint64_t Mismatches(const podlink::GpuBuffer& buf, int gpu, uint64_t seed, uint64_t bytes) {
    Use(gpu);
    bytes = std::min(bytes, total_);
    const auto* want = reinterpret_cast<const uint8_t*>(Pattern(seed).data());
    uint8_t* got = Readback();
    Check(d_->MemcpyDtoH(got, buf.device_ptr(), bytes), "cuMemcpyDtoH");
    if (std::memcmp(got, want, bytes) == 0) return 0;
    uint64_t bad = 0;
    for (uint64_t i = 0; i < bytes; ++i) bad += got[i] != want[i];
    return bad;
  }

  // Blocks of `block` bytes among the first `bytes` of `buf` that differ from the pattern of `seed`.
  uint64_t WrongBlocks(const podlink::GpuBuffer& buf, int gpu, uint64_t seed, uint64_t bytes, uint64_t block) {
    Use(gpu);
    bytes = std::min(bytes, total_);
    const auto* want = reinterpret_cast<const uint8_t*>(Pattern(seed).data());
    uint8_t* got = Readback();
    Check(d_->MemcpyDtoH(got, buf.device_ptr(), bytes), "cuMemcpyDtoH");
    uint64_t bad = 0;
    for (uint64_t off = 0; off < bytes; off += block) {
      bad += std::memcmp(got + off, want + off, std::min(block, bytes - off)) != 0;
    }
    return bad;
  }

 private:
  // The pattern of `seed` (splitmix64 words), made once per seed.
  const std::vector<uint64_t>& Pattern(uint64_t seed) {
    std::vector<uint64_t>& p = patterns_[seed];
    if (p.empty()) {
      p.resize((total_ + 7) / 8);
      for (size_t i = 0; i < p.size(); ++i) {
        uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        p[i] = z ^ (z >> 31);
      }
    }
    return p;
  }
  // Page-locked when the driver grants it (read back at copy-engine speed),
  // else ordinary memory.
  uint8_t* Readback() {
    if (readback_ != nullptr) return static_cast<uint8_t*>(readback_);
    constexpr unsigned kPortable = 1;  // CU_MEMHOSTALLOC_PORTABLE: usable from every context
    if (d_->MemHostAlloc(&readback_, total_, kPortable) == 0) {
      pinned_ = true;
    } else {
      readback_ = nullptr;
      fallback_.resize(total_);
      readback_ = fallback_.data();
    }
    return static_cast<uint8_t*>(readback_);
  }
  void Use(int gpu) {
    auto it = ctx_.find(gpu);
    if (it == ctx_.end()) {
      podlink::cu::Context c = nullptr;
      Check(d_->DevicePrimaryCtxRetain(&c, gpu), "cuDevicePrimaryCtxRetain");
      it = ctx_.emplace(gpu, c).first;
    }
    Check(d_->CtxSetCurrent(it->second), "cuCtxSetCurrent");
  }
  static void Check(podlink::cu::Result r, const char* what) {
    if (r != 0) Fail("verify", podlink::cu::CuStatus(r, what));
  }

  const podlink::cu::Driver* d_;
  const uint64_t total_;
  std::map<uint64_t, std::vector<uint64_t>> patterns_;
  void* readback_ = nullptr;
  bool pinned_ = false;
  std::vector<uint8_t> fallback_;
  std::map<int, podlink::cu::Context> ctx_;
};

}  // namespace


// The baseline's view of a destination: another session's export imported
// and mapped here with access from `gpu`, plus a stream on `gpu` to copy with.
struct CopyTarget {
  const podlink::cu::Driver* d = nullptr;
  int gpu = 0;
  std::unique_ptr<podlink::Imported> imported;
  std::unique_ptr<podlink::Mapping> mapped;
  podlink::cu::Context ctx = nullptr;  // retained primary context of `gpu`
  podlink::cu::Stream stream = nullptr;
  CopyTarget() = default;
  CopyTarget(const CopyTarget&) = delete;
  CopyTarget& operator=(const CopyTarget&) = delete;
  ~CopyTarget() {
    if (stream != nullptr) d->StreamDestroy(stream);
    if (ctx != nullptr) d->DevicePrimaryCtxRelease(gpu);
  }
  uint64_t va() const { return mapped->device_ptr(); }
};

std::unique_ptr<CopyTarget> OpenCopyTarget(const podlink::cu::Driver* d, podlink::Client& client, uint64_t export_id,
                                           int gpu) {
  auto t = std::make_unique<CopyTarget>();
  t->d = d;
  t->gpu = gpu;
  auto imp = client.Import(export_id);
  if (!imp.ok()) Fail("baseline import", imp.status());
  t->imported = std::make_unique<podlink::Imported>(*std::move(imp));
  auto m = client.Map(*t->imported, gpu);
  if (!m.ok()) Fail("baseline map (the process must see both GPUs)", m.status());
  t->mapped = *std::move(m);
  d->DevicePrimaryCtxRetain(&t->ctx, gpu);
  d->CtxSetCurrent(t->ctx);
  d->StreamCreate(&t->stream, podlink::cu::kStreamNonBlocking);
  return t;
}

// A TransferEngine on `client` with `src` registered and `dst` opened.
struct Writer {
  std::unique_ptr<podlink::TransferEngine> engine;
  podlink::LocalRegion local;
  podlink::RemoteRegion remote;
};

Writer OpenWriter(podlink::Client& client, const podlink::GpuBuffer& src, const podlink::RegionDescriptor& dst,
                  int gpu, bool relay) {
  podlink::TransferEngine::Options eo;
  eo.device = gpu;
  eo.force_relay = relay;
  eo.allow_direct = !relay;
  eo.log_transport = false;
  eo.timeout = absl::Minutes(5);
  Writer w;
  auto e = podlink::TransferEngine::Create(client, eo);
  if (!e.ok()) Fail("engine", e.status());
  w.engine = *std::move(e);
  auto l = w.engine->Register(src);
  if (!l.ok()) Fail("register", l.status());
  w.local = *l;
  auto r = w.engine->Open(dst);
  if (!r.ok()) Fail("open", r.status());
  w.remote = *r;
  return w;
}

// One direction of a bidirectional run: `src` on one GPU is written into
// `dst`, a buffer on the other GPU that `owner` exported.
struct Direction {
  int src_gpu = 0, dst_gpu = 0;
  std::unique_ptr<podlink::Client> client;  // the writer's session
  std::unique_ptr<podlink::GpuBuffer> src;
  std::unique_ptr<podlink::GpuBuffer> dst;  // allocated by the owner session
  podlink::RegionDescriptor dst_desc;
  std::unique_ptr<CopyTarget> target;  // baseline-bidir
  Writer writer;                       // relay-bidir
  uint64_t seed = 0;                   // pattern of `src`
};

// Runs `pass(direction)` on one thread per direction, `passes` times after a
// warm-up, both directions released together; returns the mean seconds per
// pass of each direction.
template <typename F>
std::vector<double> TimeBothDirections(std::vector<Direction>& dirs, int passes, F pass) {
  std::vector<double> sum(dirs.size(), 0);
  std::barrier sync(static_cast<std::ptrdiff_t>(dirs.size()));
  std::vector<std::thread> threads;
  for (size_t d = 0; d < dirs.size(); ++d) {
    threads.emplace_back([&, d] {
      for (int p = -1; p < passes; ++p) {
        sync.arrive_and_wait();
        auto t0 = Clock::now();
        pass(dirs[d]);
        if (p >= 0) sum[d] += std::chrono::duration<double>(Clock::now() - t0).count();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (double& s : sum) s /= passes;
  return sum;
}

// The decode pod's block ids for a run of `n` blocks of `block` bytes: the
// first n of a Fisher-Yates shuffle of 0..2n-1 driven by splitmix64 seeded
// with `block` (tests/gpu/kv_podlink.py computes the same list).
std::vector<uint64_t> KvBlockIds(uint64_t block, uint64_t n) {
  std::vector<uint64_t> ids(2 * n);
  for (uint64_t i = 0; i < ids.size(); ++i) ids[i] = i;
  uint64_t x = block;
  auto next = [&x] {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (uint64_t i = ids.size() - 1; i > 0; --i) std::swap(ids[i], ids[next() % (i + 1)]);
  ids.resize(n);
  return ids;
}

// --kv-open: the prefill side of the KV hand-off (see the top of this file).
int RunKv(const Args& a, const podlink::cu::Driver* d) {
  auto c = podlink::Client::Connect();
  if (!c.ok()) Fail("connect", c.status());
  podlink::TransferEngine::Options eo;
  eo.device = a.src_gpu;
  eo.log_transport = false;
  eo.timeout = absl::Minutes(5);
  eo.force_relay = a.kv_relay;
  eo.allow_direct = !a.kv_relay;
  auto eng = podlink::TransferEngine::Create(**c, eo);
  if (!eng.ok()) Fail("engine", eng.status());
  // The decode pod exports its cache by name; wait until it may be imported.
  std::unique_ptr<podlink::Imported> imp;
  for (auto deadline = Clock::now() + std::chrono::seconds(a.kv_wait); imp == nullptr;) {
    auto r = (*c)->Import(a.kv_open);
    if (r.ok()) {
      imp = std::make_unique<podlink::Imported>(*std::move(r));
    } else if (!absl::IsNotFound(r.status()) || Clock::now() >= deadline) {
      Fail("import " + a.kv_open, r.status());
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  podlink::RegionDescriptor desc;
  auto node = (*c)->GetNodeInfo();
  if (node.ok()) desc.node_id = node->node_id;
  desc.export_id = imp->info().export_id;
  desc.size = imp->info().size;
  desc.handle_type = imp->info().handle_type;
  desc.gpu_uuid = imp->info().gpu_uuid;
  auto remote = (*eng)->Open(desc);
  if (!remote.ok()) Fail("open " + a.kv_open, remote.status());

  uint64_t largest = 0;
  for (auto [block, n] : a.kv_blocks) largest = std::max(largest, block * n);
  Checker checker(d, largest);
  int wrong_total = 0;
  for (const auto& shape : a.kv_blocks) {
    // Named copies, not a structured binding: the lambdas below capture them (clang before 16 cannot).
    const uint64_t block = shape.first, n = shape.second;
    if (2 * n * block > remote->size) {
      Fail("kv", absl::InvalidArgumentError(absl::StrFormat("%d blocks of %d bytes need a cache of %d bytes; the "
                                                            "export holds %d", 2 * n, block, 2 * n * block,
                                                            remote->size)));
    }
    auto src = (*c)->AllocateGpu(n * block, a.src_gpu);
    auto zero = (*c)->AllocateGpu(n * block, a.src_gpu);
    auto back = (*c)->AllocateGpu(n * block, a.src_gpu);
    if (!src.ok() || !zero.ok() || !back.ok()) Fail("allocate", !src.ok() ? src.status() : !zero.ok() ? zero.status() : back.status());
    checker.Fill(**src, a.src_gpu, block);
    checker.Clear(**zero, a.src_gpu);
    checker.Clear(**back, a.src_gpu);
    auto ls = (*eng)->Register(**src);
    auto lz = (*eng)->Register(**zero);
    auto lb = (*eng)->Register(**back);
    if (!ls.ok() || !lz.ok() || !lb.ok()) Fail("register", !ls.ok() ? ls.status() : !lz.ok() ? lz.status() : lb.status());
    std::vector<uint64_t> ids = KvBlockIds(block, n);
    auto ops = [&](const podlink::LocalRegion& l) {
      std::vector<podlink::TransferOp> v;
      v.reserve(n);
      for (uint64_t i = 0; i < n; ++i) v.push_back({&l, i * block, &*remote, ids[i] * block, block});
      return v;
    };
    auto check = [&](absl::Status st) {
      if (!st.ok()) Fail("kv", st);
    };
    check((*eng)->Writev(ops(*lz)));  // the cache's blocks cleared: what is read back must be this run's
    std::vector<podlink::TransferOp> w = ops(*ls);
    check((*eng)->Writev(w));  // warm-up
    auto t0 = Clock::now();
    for (int i = 0; i < a.kv_iters; ++i) check((*eng)->Writev(w));
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    check((*eng)->Readv(ops(*lb)));
    uint64_t wrong = checker.WrongBlocks(**back, a.src_gpu, block, n * block, block);
    wrong_total += wrong != 0;
    nlohmann::json j{{"impl", "c++"},
                     {"block", block},
                     {"blocks", n},
                     {"iters", a.kv_iters},
                     {"gbps", static_cast<double>(n * block) * a.kv_iters / secs / 1e9},
                     {"checked", n},
                     {"wrong", wrong},
                     {"transport", podlink::TransportName(remote->transport)}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    for (auto* r : {&*ls, &*lz, &*lb}) (void)(*eng)->Unregister(*r);
  }
  return wrong_total != 0 ? 1 : 0;
}

int main(int argc, char** argv) {
  const podlink::cli::Program program{"podlink-bench", PODLINK_VERSION, kUsage, __FILE__};
  absl::StatusOr<Args> args = ArgsFromFlags(podlink::cli::Parse(argc, argv, program));
  if (!args.ok()) {
    std::fprintf(stderr, "podlink-bench: %s (--help lists the options)\n",
                 std::string(args.status().message()).c_str());
    return 2;
  }
  Args a = *std::move(args);
  auto drv = podlink::cu::LoadDriver();
  if (!drv.ok()) Fail("CUDA", drv.status());
  const podlink::cu::Driver* d = *drv;
  int ngpu = 0;
  d->DeviceGetCount(&ngpu);
  if (ngpu < 2) a.dst_gpu = a.src_gpu;  // one GPU: same-GPU copies
  if (!a.kv_open.empty()) return RunKv(a, d);

  // Destination owner (session A) and source (session B), both in this process.
  auto owner = podlink::Client::Connect();
  if (!owner.ok()) Fail("connect", owner.status());
  auto dst = (*owner)->AllocateGpu(a.total, a.dst_gpu);
  if (!dst.ok()) Fail("allocate destination", dst.status());
  podlink::TransferEngine::Options oo;
  oo.device = a.dst_gpu;
  oo.log_transport = false;
  auto owner_eng = podlink::TransferEngine::Create(**owner, oo);
  if (!owner_eng.ok()) Fail("engine", owner_eng.status());
  auto dst_region = (*owner_eng)->Register(**dst);
  if (!dst_region.ok()) Fail("register", dst_region.status());
  auto desc = (*owner_eng)->Describe(*dst_region);

  auto src_client = podlink::Client::Connect();
  if (!src_client.ok()) Fail("connect", src_client.status());
  auto src = (*src_client)->AllocateGpu(a.total, a.src_gpu);
  if (!src.ok()) Fail("allocate source", src.status());

  std::fprintf(stderr, "podlink-bench: GPU%d -> GPU%d, %s destination, %d passes\n", a.src_gpu, a.dst_gpu,
               HumanSize(a.total).c_str(), a.passes);
  Checker checker(d, a.total);
  constexpr uint64_t kSeed = 1;
  checker.Fill(**src, a.src_gpu, kSeed);
  // Clears `buf` before a size is timed, and after it counts what differs
  // from the source's pattern; progress lines say so when something does.
  auto verify = [&](Row& row, const podlink::GpuBuffer& buf, int gpu, uint64_t seed, uint64_t bytes) {
    row.checked += bytes;
    if (a.corrupt_for_test) checker.Corrupt(buf, gpu);
    uint64_t bad = checker.Mismatches(buf, gpu, seed, bytes);
    row.mismatches += bad;
    if (bad != 0) {
      std::fprintf(stderr, "  %s %s: %llu of %llu bytes differ from the source\n", row.mode.c_str(),
                   HumanSize(row.size).c_str(), static_cast<unsigned long long>(bad),
                   static_cast<unsigned long long>(bytes));
    }
  };
  std::vector<Row> rows;
  std::map<std::string, double> latency_us;

  // Bidirectional runs: set up on first use.
  std::vector<Direction> dirs;
  auto setup_directions = [&] {
    if (!dirs.empty()) return;
    for (auto [s_gpu, d_gpu] : {std::pair{a.src_gpu, a.dst_gpu}, std::pair{a.dst_gpu, a.src_gpu}}) {
      Direction dir;
      dir.src_gpu = s_gpu;
      dir.dst_gpu = d_gpu;
      auto dst_buf = (*owner)->AllocateGpu(a.total, d_gpu);
      if (!dst_buf.ok()) Fail("allocate bidirectional destination", dst_buf.status());
      dir.dst = *std::move(dst_buf);
      auto reg = (*owner_eng)->Register(*dir.dst);
      if (!reg.ok()) Fail("register bidirectional destination", reg.status());
      auto dd = (*owner_eng)->Describe(*reg);
      if (!dd.ok()) Fail("describe", dd.status());
      dir.dst_desc = *dd;
      auto c = podlink::Client::Connect();
      if (!c.ok()) Fail("connect", c.status());
      dir.client = *std::move(c);
      auto sb = dir.client->AllocateGpu(a.total, s_gpu);
      if (!sb.ok()) Fail("allocate bidirectional source", sb.status());
      dir.src = *std::move(sb);
      dir.seed = 2 + dirs.size();
      checker.Fill(*dir.src, s_gpu, dir.seed);
      dirs.push_back(std::move(dir));
    }
  };

  for (const std::string& mode : a.modes) {
    if (mode == "baseline-bidir" || mode == "relay-bidir") {
      setup_directions();
      bool relay = mode == "relay-bidir";
      for (Direction& dir : dirs) {
        if (relay && dir.writer.engine == nullptr) {
          dir.writer = OpenWriter(*dir.client, *dir.src, dir.dst_desc, dir.src_gpu, /*relay=*/true);
        }
        if (!relay && dir.target == nullptr) dir.target = OpenCopyTarget(d, *dir.client, dir.dst_desc.export_id, dir.src_gpu);
      }
      for (uint64_t size : a.bidir_sizes) {
        if (size > a.total) continue;
        const uint64_t n = a.total / size;
        for (Direction& dir : dirs) checker.Clear(*dir.dst, dir.dst_gpu);
        std::vector<double> secs;
        if (relay) {
          secs = TimeBothDirections(dirs, a.passes, [&](Direction& dir) {
            // Like NCCL's proxy: up to --window single-operation batches in flight.
            std::vector<uint64_t> window;
            size_t oldest = 0;
            uint64_t issued = 0, done = 0;
            window.reserve(n);
            while (done < n) {
              while (issued < n && issued - done < static_cast<uint64_t>(a.window)) {
                Writer& w = dir.writer;
                auto id = w.engine->WriteAsync({{&w.local, issued * size, &w.remote, issued * size, size}});
                if (!id.ok()) Fail(mode, id.status());
                window.push_back(*id);
                ++issued;
              }
              auto ready = dir.writer.engine->Poll(window[oldest]);
              if (!ready.ok()) Fail(mode, ready.status());
              if (!*ready) continue;
              absl::Status st = dir.writer.engine->Wait(window[oldest++]);
              if (!st.ok()) Fail(mode, st);
              ++done;
            }
          });
        } else {
          secs = TimeBothDirections(dirs, a.passes, [&](Direction& dir) {
            const CopyTarget& t = *dir.target;
            d->CtxSetCurrent(t.ctx);
            for (uint64_t i = 0; i < n; ++i) {
              auto r = d->MemcpyAsync(t.va() + i * size, dir.src->device_ptr() + i * size, size, t.stream);
              if (r != 0) Fail(mode, podlink::cu::CuStatus(r, "cuMemcpyAsync"));
            }
            auto r = d->StreamSynchronize(t.stream);
            if (r != 0) Fail(mode, podlink::cu::CuStatus(r, "cuStreamSynchronize"));
          });
        }
        double per_dir = 0;
        double slowest = 0;
        for (double x : secs) {
          per_dir += n * size / x / 1e9 / secs.size();
          slowest = std::max(slowest, x);
        }
        Row row{mode, size, per_dir, slowest / n * 1e6, 2.0 * n * size / slowest / 1e9};
        for (Direction& dir : dirs) verify(row, *dir.dst, dir.dst_gpu, dir.seed, n * size);
        rows.push_back(row);
        std::fprintf(stderr, "  %-14s %8s %8.1f GB/s per direction, %8.1f both\n", mode.c_str(),
                     HumanSize(size).c_str(), row.gbps, row.both_gbps);
      }
      continue;
    }
    if (mode == "baseline") {
      // The destination mapped into this process with access from the source
      // GPU, copied with the source GPU's copy engine on one stream.
      auto target = OpenCopyTarget(d, **src_client, desc->export_id, a.src_gpu);
      const uint64_t dst_va = target->va();
      podlink::cu::Stream s = target->stream;
      auto check = [](podlink::cu::Result r, const char* what) {
        if (r != 0) Fail("baseline", podlink::cu::CuStatus(r, what));
      };
      for (uint64_t size : Sizes(a.total)) {
        uint64_t n = a.total / size;
        checker.Clear(**dst, a.dst_gpu);
        // The checker makes the destination GPU's context current; the copy
        // stream belongs to the source GPU's (a stream of another context than
        // the current one is CUDA_ERROR_INVALID_VALUE on two GPUs).
        check(d->CtxSetCurrent(target->ctx), "cuCtxSetCurrent");
        double secs = TimePasses(a.passes, [&] {
          for (uint64_t i = 0; i < n; ++i) {
            check(d->MemcpyAsync(dst_va + i * size, (*src)->device_ptr() + i * size, size, s), "cuMemcpyAsync");
          }
          check(d->StreamSynchronize(s), "cuStreamSynchronize");
        });
        rows.push_back({mode, size, n * size / secs / 1e9, secs / n * 1e6});
        verify(rows.back(), **dst, a.dst_gpu, kSeed, n * size);
        std::fprintf(stderr, "  %-8s %8s %8.1f GB/s\n", mode.c_str(), HumanSize(size).c_str(), rows.back().gbps);
      }
      check(d->CtxSetCurrent(target->ctx), "cuCtxSetCurrent");
      auto t0 = Clock::now();
      for (int i = 0; i < a.lat_iters; ++i) {
        check(d->MemcpyAsync(dst_va, (*src)->device_ptr(), 4096, s), "cuMemcpyAsync");
        check(d->StreamSynchronize(s), "cuStreamSynchronize");
      }
      latency_us[mode] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / a.lat_iters;
      continue;
    }
    // A fresh session per mode: one relay ring per session.
    auto c = podlink::Client::Connect();
    if (!c.ok()) Fail("connect", c.status());
    auto buf = (*c)->AllocateGpu(a.total, a.src_gpu);
    if (!buf.ok()) Fail("allocate", buf.status());
    checker.Fill(**buf, a.src_gpu, kSeed);
    Writer w = OpenWriter(**c, **buf, *desc, a.src_gpu, mode == "relay");
    podlink::TransferEngine* eng = w.engine.get();
    const podlink::LocalRegion* local = &w.local;
    const podlink::RemoteRegion* remote = &w.remote;
    if ((mode == "direct") != (remote->transport == podlink::Transport::kDirect)) {
      std::fprintf(stderr, "  %s: transport is %s, skipping\n", mode.c_str(), podlink::TransportName(remote->transport));
      continue;
    }
    for (uint64_t size : Sizes(a.total)) {
      uint64_t n = a.total / size;
      std::vector<podlink::TransferOp> ops;
      ops.reserve(n);
      for (uint64_t i = 0; i < n; ++i) ops.push_back({local, i * size, remote, i * size, size});
      checker.Clear(**dst, a.dst_gpu);
      double secs = TimePasses(a.passes, [&] {
        absl::Status st = eng->Writev(ops);
        if (!st.ok()) Fail(mode, st);
      });
      rows.push_back({mode, size, n * size / secs / 1e9, secs / n * 1e6});
      verify(rows.back(), **dst, a.dst_gpu, kSeed, n * size);
      std::fprintf(stderr, "  %-8s %8s %8.1f GB/s\n", mode.c_str(), HumanSize(size).c_str(), rows.back().gbps);
    }
    auto t0 = Clock::now();
    for (int i = 0; i < a.lat_iters; ++i) {
      absl::Status st = eng->Write({local, 0, remote, 0, 4096});
      if (!st.ok()) Fail(mode, st);
    }
    latency_us[mode] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / a.lat_iters;
  }

  // Table: one row per size, one column per mode, plus ratios to baseline.
  std::map<uint64_t, std::map<std::string, Row>> by_size, by_size_bidir;
  for (const Row& r : rows) (absl::EndsWith(r.mode, "-bidir") ? by_size_bidir : by_size)[r.size][r.mode] = r;
  if (!by_size.empty()) {
    std::printf("| size | baseline GB/s | direct GB/s | relay GB/s | direct/base | relay/base |\n"
                "|---|---|---|---|---|---|\n");
  }
  for (auto& [size, m] : by_size) {
    auto get = [&m = m](const char* k) { return m.count(k) ? m[k].gbps : 0.0; };  // a binding cannot be captured (clang 14)
    double b = get("baseline");
    auto ratio = [&](double x) { return b > 0 && x > 0 ? absl::StrFormat("%.3f", x / b) : std::string("-"); };
    std::printf("| %s | %.1f | %.1f | %.1f | %s | %s |\n", HumanSize(size).c_str(), b, get("direct"), get("relay"),
                ratio(get("direct")).c_str(), ratio(get("relay")).c_str());
  }
  if (!latency_us.empty()) {
    std::printf("\n| 4 KiB synchronous op | mean latency us | added vs baseline us |\n|---|---|---|\n");
  }
  for (auto& [mode, us] : latency_us) {
    double added = latency_us.count("baseline") ? us - latency_us["baseline"] : 0;
    std::printf("| %s | %.2f | %+.2f |\n", mode.c_str(), us, added);
  }
  if (!by_size_bidir.empty()) {
    std::printf("\nBoth directions at once (GPU%d <-> GPU%d, %d operations in flight per direction for the relay):\n\n"
                "| size | baseline-bidir GB/s per direction | relay-bidir GB/s per direction | relay/base |\n"
                "|---|---|---|---|\n",
                a.src_gpu, a.dst_gpu, a.window);
  }
  for (auto& [size, m] : by_size_bidir) {
    auto get = [&m = m](const char* k) { return m.count(k) ? m[k].gbps : 0.0; };  // a binding cannot be captured (clang 14)
    double b = get("baseline-bidir"), r = get("relay-bidir");
    auto cell = [](double x) { return x > 0 ? absl::StrFormat("%.1f", x) : std::string("-"); };
    std::printf("| %s | %s | %s | %s |\n", HumanSize(size).c_str(), cell(b).c_str(), cell(r).c_str(),
                b > 0 && r > 0 ? absl::StrFormat("%.3f", r / b).c_str() : "-");
  }
  uint64_t checked = 0, mismatches = 0, bad_rows = 0;
  for (const Row& r : rows) {
    checked += r.checked;
    mismatches += r.mismatches;
    bad_rows += r.mismatches != 0;
  }
  std::printf("\nverified after timing, every size of every mode: %llu bytes compared, %llu differed (%llu of %zu "
              "rows)\n",
              static_cast<unsigned long long>(checked), static_cast<unsigned long long>(mismatches),
              static_cast<unsigned long long>(bad_rows), rows.size());
  if (!a.csv.empty()) {
    std::ofstream f(a.csv);
    f << "mode,size_bytes,gbps,op_us,both_directions_gbps,checked_bytes,mismatched_bytes\n";
    for (const Row& r : rows) {
      f << r.mode << "," << r.size << "," << r.gbps << "," << r.op_us << "," << r.both_gbps << "," << r.checked << ","
        << r.mismatches << "\n";
    }
  }
  if (!a.json.empty()) {
    nlohmann::json j;
    j["src_gpu"] = a.src_gpu;
    j["dst_gpu"] = a.dst_gpu;
    j["total_bytes"] = a.total;
    j["passes"] = a.passes;
    j["window"] = a.window;
    for (const Row& r : rows) {
      j["rows"].push_back({{"mode", r.mode},
                           {"size", r.size},
                           {"gbps", r.gbps},
                           {"op_us", r.op_us},
                           {"both_gbps", r.both_gbps},
                           {"checked_bytes", r.checked},
                           {"mismatched_bytes", r.mismatches}});
    }
    for (auto& [mode, us] : latency_us) j["latency_4k_us"][mode] = us;
    std::ofstream(a.json) << j.dump(2) << "\n";
  }
  if (mismatches != 0) {
    std::fprintf(stderr, "podlink-bench: FAILED: %llu bytes differed from their source\n",
                 static_cast<unsigned long long>(mismatches));
    return 1;
  }
  return 0;
}
