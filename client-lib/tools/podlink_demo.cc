// podlink-demo: exports and imports memory through podlinkd. Used by the
// README demo and, as the program running inside namespaced "pods", by the
// integration and GPU tests. Every result is one JSON line on stdout.
// Commands and options: kUsage below, or podlink-demo --help.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/cli.h"
#include "common/cuda_driver.h"
#include "nlohmann/json.hpp"
#include "podlink/client.h"
#include "podlink/transfer.h"

using nlohmann::json;

ABSL_FLAG(uint64_t, size, 1 << 20, "bytes to allocate (export, kv-serve, cycle)");
ABSL_FLAG(int, gpu, -1, "GPU index of the memory (or of the mapping, for import); -1: host memory");
ABSL_FLAG(std::string, name, "", "export: the name to publish; import: the export to import, by name");
ABSL_FLAG(uint64_t, id, 0, "import: the export to import, by id");
ABSL_FLAG(std::vector<std::string>, allow, {},
          "export, kv-serve: pods that may import besides the peer group, comma-separated namespace/name");
ABSL_FLAG(int, seed, -1, "export, kv-put: fill the memory with the pattern of this seed; -1: leave it");
ABSL_FLAG(int, verify, -1,
          "import: check the first three quarters for the pattern of this seed; kv-serve: check all of it "
          "(required there); -1: no check");
ABSL_FLAG(int, writeback, -1, "import: write the pattern of this seed into the last quarter; -1: no write");
ABSL_FLAG(int, expect_writeback, -1,
          "export: check the last quarter for the pattern of this seed (after --await-import); -1: no check");
ABSL_FLAG(bool, await_import, false, "export: wait up to 120 s for a peer to import the export and release it");
ABSL_FLAG(bool, commands, false,
          "export: then obey stdin, one command a line: release, release-again, check, check-writeback S, exit");
ABSL_FLAG(bool, hold, false, "import: keep the import mapped until stdin says exit or closes");
ABSL_FLAG(bool, watch, false, "import: print the daemon's watch events as they come");
ABSL_FLAG(bool, relay, false, "kv-put: force podlinkd's relay instead of mapping the peer's memory");
ABSL_FLAG(std::string, desc, "", "kv-put: the peer region's descriptor, as kv-serve printed it (required)");
ABSL_FLAG(bool, read_back, false, "kv-put: read the peer region back after writing it and check every byte");
ABSL_FLAG(uint64_t, count, 100, "cycle: export/import/close rounds");
ABSL_FLAG(uint64_t, idle_ms, 0,
          "kv-put: hold the opened peer region this long before writing (an idle holder: its daemons must keep the "
          "grant alive)");
ABSL_FLAG(int, rewrite_seed, -1,
          "kv-put: after the writes, fill the region with the pattern of this seed and write it whole once more "
          "(before the read back, which then expects it); -1: no");
ABSL_FLAG(uint64_t, verify_again_ms, 0,
          "kv-serve: after the check, wait this long and check every byte again (a late write would show)");
ABSL_FLAG(uint64_t, repeat, 1,
          "kv-put: write the whole region this many times and report the last (steady state: mappings and "
          "connections warm) beside the first");

namespace {

constexpr char kUsage[] = R"(usage: podlink-demo COMMAND [options]

Exports and imports memory through podlinkd (its socket directory: $PODLINK_SOCKET_DIR,
else /run/podlink). Every result is one JSON line on stdout.

  info                                 the node, its GPUs and this process as podlinkd sees them
  export [--size N] [--gpu D] [--name X] [--allow ns/name,...] [--seed S]
         [--await-import] [--expect-writeback S2] [--commands]
  import (--id N | --name X) [--gpu D] [--verify S] [--writeback S2] [--hold] [--watch]
  cycle [--count N] [--size B]         export/import/close rounds on fresh sessions (leak tests)
  kv-serve [--size N] [--gpu D] --verify S [--verify-again-ms M]
                                       register a region, print its descriptor, wait for a
                                       notification, then check every byte (again after M ms)
  kv-put --desc D [--gpu D] --seed S [--relay] [--repeat N] [--rewrite-seed S2] [--read-back]
                                       write a whole peer region one-sided (N times; then once
                                       more with S2's pattern), read it back, then notify

Exit status: 0 done; 1 an operation failed (an "error" JSON line says which); 2 a bad
command line; 3 bytes did not match.
)";

constexpr const char* kCommands[] = {"info", "export", "import", "cycle", "kv-serve", "kv-put"};

struct Opts {
  std::string cmd;
  uint64_t size = 1 << 20;
  int gpu = -1;
  std::string name;
  uint64_t id = 0;
  std::vector<podlink::PodRef> allow;
  int seed = -1, writeback = -1, verify = -1, expect_writeback = -1, rewrite_seed = -1;
  uint64_t verify_again_ms = 0;
  bool await_import = false, commands = false, hold = false, watch = false, relay = false, read_back = false;
  std::string desc;
  uint64_t count = 100;
  uint64_t repeat = 1;
  uint64_t idle_ms = 0;
};

// One JSON object per line; whole lines even when the watch thread and the
// main thread emit at once.
void Emit(const json& j) {
  static std::mutex mu;
  std::string line = j.dump() + "\n";
  std::lock_guard<std::mutex> l(mu);
  std::cout << line << std::flush;
}

[[noreturn]] void Die(const std::string& what, const absl::Status& s) {
  Emit({{"event", "error"},
        {"what", what},
        {"code", absl::StatusCodeToString(s.code())},
        {"message", std::string(s.message())}});
  std::exit(1);
}

uint8_t PatternByte(int seed, uint64_t i) {
  return static_cast<uint8_t>((seed * 7919 + i * 131 + (i >> 13)) & 0xff);
}

// Where the demo writes back: the last quarter of the buffer.
uint64_t WritebackOffset(uint64_t size) { return size - size / 4; }

// Host or GPU memory behind one interface, copying in chunks via host staging.
struct Region {
  void* host = nullptr;
  uint64_t dev = 0;
  uint64_t size = 0;
  int gpu = -1;
};

constexpr uint64_t kChunk = 64 << 20;

void Fill(const Region& r, uint64_t begin, uint64_t end, int seed) {
  if (r.host != nullptr) {
    auto* p = static_cast<uint8_t*>(r.host);
    for (uint64_t i = begin; i < end; ++i) p[i] = PatternByte(seed, i);
    return;
  }
  const podlink::cu::Driver* d = *podlink::cu::LoadDriver();
  std::vector<uint8_t> buf(std::min(kChunk, end - begin));
  for (uint64_t off = begin; off < end; off += kChunk) {
    uint64_t n = std::min(kChunk, end - off);
    for (uint64_t i = 0; i < n; ++i) buf[i] = PatternByte(seed, off + i);
    podlink::cu::Result res = d->MemcpyHtoD(r.dev + off, buf.data(), n);
    if (res != 0) Die("fill", podlink::cu::CuStatus(res, "cuMemcpyHtoD"));
  }
}

// Returns the number of mismatching bytes and the first bad offset.
std::pair<uint64_t, int64_t> Check(const Region& r, uint64_t begin, uint64_t end, int seed) {
  uint64_t bad = 0;
  int64_t first = -1;
  auto cmp = [&](const uint8_t* p, uint64_t off, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      if (p[i] != PatternByte(seed, off + i)) {
        if (first < 0) first = static_cast<int64_t>(off + i);
        ++bad;
      }
    }
  };
  if (r.host != nullptr) {
    cmp(static_cast<uint8_t*>(r.host) + begin, begin, end - begin);
    return {bad, first};
  }
  const podlink::cu::Driver* d = *podlink::cu::LoadDriver();
  std::vector<uint8_t> buf(std::min(kChunk, end - begin));
  for (uint64_t off = begin; off < end; off += kChunk) {
    uint64_t n = std::min(kChunk, end - off);
    podlink::cu::Result res = d->MemcpyDtoH(buf.data(), r.dev + off, n);
    if (res != 0) Die("verify", podlink::cu::CuStatus(res, "cuMemcpyDtoH"));
    cmp(buf.data(), off, n);
  }
  return {bad, first};
}

json IdentityJson(const podlink::Identity& id) {
  return {{"session", id.session_id}, {"pid", id.pid},         {"uid", id.uid},
          {"pod_uid", id.pod_uid},    {"container_id", id.container_id},
          {"namespace", id.namespace_}, {"pod", id.pod_name},  {"qos", id.qos_class},
          {"cgroup", id.cgroup_path}, {"annotations", id.annotations}};
}

// Every option, checked once: the command line's meaning, or what is wrong with it.
absl::StatusOr<Opts> OptsFromFlags(const std::vector<std::string>& args) {
  Opts o;
  if (args.empty()) return absl::InvalidArgumentError("no command given");
  o.cmd = args[0];
  if (std::find(std::begin(kCommands), std::end(kCommands), o.cmd) == std::end(kCommands)) {
    return absl::InvalidArgumentError("unknown command '" + o.cmd +
                                      "' (commands: info, export, import, cycle, kv-serve, kv-put)");
  }
  if (args.size() > 1) return absl::InvalidArgumentError("unexpected argument '" + args[1] + "'");
  o.size = absl::GetFlag(FLAGS_size);
  o.gpu = absl::GetFlag(FLAGS_gpu);
  o.name = absl::GetFlag(FLAGS_name);
  o.id = absl::GetFlag(FLAGS_id);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.verify = absl::GetFlag(FLAGS_verify);
  o.writeback = absl::GetFlag(FLAGS_writeback);
  o.expect_writeback = absl::GetFlag(FLAGS_expect_writeback);
  o.await_import = absl::GetFlag(FLAGS_await_import);
  o.commands = absl::GetFlag(FLAGS_commands);
  o.hold = absl::GetFlag(FLAGS_hold);
  o.watch = absl::GetFlag(FLAGS_watch);
  o.relay = absl::GetFlag(FLAGS_relay);
  o.read_back = absl::GetFlag(FLAGS_read_back);
  o.desc = absl::GetFlag(FLAGS_desc);
  o.count = absl::GetFlag(FLAGS_count);
  o.repeat = std::max<uint64_t>(1, absl::GetFlag(FLAGS_repeat));
  o.idle_ms = std::min<uint64_t>(absl::GetFlag(FLAGS_idle_ms), 600000);
  o.rewrite_seed = absl::GetFlag(FLAGS_rewrite_seed);
  o.verify_again_ms = std::min<uint64_t>(absl::GetFlag(FLAGS_verify_again_ms), 600000);
  if (o.size == 0) return absl::InvalidArgumentError("--size must be a positive integer (got '0')");
  if (o.count == 0) return absl::InvalidArgumentError("--count must be a positive integer (got '0')");
  if (o.gpu < -1) {
    return absl::InvalidArgumentError("--gpu must be a GPU index, or -1 for host memory (got '" +
                                      std::to_string(o.gpu) + "')");
  }
  for (auto [flag, seed] : {std::pair{"seed", o.seed}, {"verify", o.verify}, {"writeback", o.writeback},
                            {"expect-writeback", o.expect_writeback}}) {
    if (seed < -1) {
      return absl::InvalidArgumentError(std::string("--") + flag + " must be a non-negative integer (got '" +
                                        std::to_string(seed) + "')");
    }
  }
  for (const std::string& pod : absl::GetFlag(FLAGS_allow)) {
    std::vector<std::string> p = absl::StrSplit(pod, '/');
    if (p.size() != 2 || p[0].empty() || p[1].empty()) {
      return absl::InvalidArgumentError("--allow takes namespace/name, comma-separated (got '" + pod + "')");
    }
    o.allow.push_back({p[0], p[1]});
  }
  if (o.cmd == "import" && o.name.empty() && o.id == 0) {
    return absl::InvalidArgumentError("import needs --id N or --name X");
  }
  if (o.cmd == "kv-serve" && o.verify < 0) return absl::InvalidArgumentError("kv-serve needs --verify S");
  if (o.cmd == "kv-put" && o.desc.empty()) {
    return absl::InvalidArgumentError("kv-put needs --desc D (the descriptor kv-serve printed)");
  }
  if (o.cmd == "kv-put" && o.seed < 0) return absl::InvalidArgumentError("kv-put needs --seed S");
  return o;
}

int Info(podlink::Client& c) {
  auto n = c.GetNodeInfo();
  if (!n.ok()) Die("node-info", n.status());
  auto id = c.WhoAmI();
  if (!id.ok()) Die("whoami", id.status());
  json gpus = json::array();
  for (const auto& g : n->gpus) {
    json peers = json::array();
    for (const auto& p : g.peers) peers.push_back({{"uuid", p.uuid}, {"nvlinks", p.link_count}, {"p2p", p.p2p_supported}});
    gpus.push_back({{"index", g.index}, {"uuid", g.uuid}, {"pci", g.pci_bus_id}, {"node", g.device_node},
                    {"name", g.name}, {"posix_fd", g.posix_fd_supported}, {"fabric", g.fabric_supported},
                    {"peers", peers}});
  }
  json types = json::array();
  for (auto t : n->handle_types) types.push_back(podlink::HandleTypeName(t));
  Emit({{"event", "info"},
        {"node", n->node_id},
        {"cuda", n->cuda_available},
        {"cuda_status", n->cuda_status},
        {"handle_types", types},
        {"gpus", gpus},
        {"identity", IdentityJson(*id)}});
  return 0;
}

int Export(podlink::Client& c, const Opts& o) {
  std::unique_ptr<podlink::HostBuffer> host;
  std::unique_ptr<podlink::GpuBuffer> gpu;
  Region r;
  absl::StatusOr<uint64_t> id;
  podlink::ExportOptions eo{o.name, o.allow, ""};
  if (o.gpu < 0) {
    auto b = c.AllocateHost(o.size);
    if (!b.ok()) Die("allocate", b.status());
    host = *std::move(b);
    r = {host->data(), 0, host->size(), -1};
  } else {
    auto b = c.AllocateGpu(o.size, o.gpu);
    if (!b.ok()) Die("allocate", b.status());
    gpu = *std::move(b);
    r = {nullptr, gpu->device_ptr(), gpu->size(), o.gpu};
  }
  if (o.seed >= 0) Fill(r, 0, r.size, o.seed);
  id = host ? c.Export(*host, eo) : c.Export(*gpu, eo);
  if (!id.ok()) Die("export", id.status());
  Emit({{"event", "exported"},
        {"export_id", *id},
        {"name", o.name},
        {"size", r.size},
        {"memory", host ? "host" : "gpu"},
        {"handle_type", host ? "host-memfd" : podlink::HandleTypeName(gpu->handle_type())},
        {"gpu_uuid", gpu ? gpu->gpu_uuid() : ""}});
  if (o.await_import) {
    // Wait for an importer to come and go (it drops its import when done).
    bool seen = false;
    for (int i = 0; i < 6000; ++i) {
      auto l = c.List();
      if (!l.ok()) Die("list", l.status());
      uint32_t n = 0;
      uint64_t total = 0;
      for (const auto& e : *l) {
        if (e.export_id == *id) {
          n = e.import_count;
          total = e.imports_total;
        }
      }
      if (total > 0 && !seen) {
        seen = true;
        Emit({{"event", "imported_by_peer"}, {"export_id", *id}});
      }
      if (seen && n == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!seen) Die("await-import", absl::DeadlineExceededError("no importer within 120 s"));
  }
  if (o.expect_writeback >= 0) {
    auto [bad, first] = Check(r, WritebackOffset(r.size), r.size, o.expect_writeback);
    Emit({{"event", "writeback_checked"}, {"bytes", r.size - WritebackOffset(r.size)}, {"mismatches", bad},
          {"first_bad", first}});
    if (bad != 0) return 3;
  }
  if (!o.commands) return 0;
  // Commands on stdin let a test drive the exporter's lifetime.
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "release") {
      absl::Status s = c.Release(*id);
      Emit({{"event", "released"}, {"ok", s.ok()}, {"message", std::string(s.message())}});
    } else if (line == "release-again") {
      absl::Status s = c.Release(*id);
      Emit({{"event", "released"}, {"ok", s.ok()}, {"code", absl::StatusCodeToString(s.code())},
            {"message", std::string(s.message())}});
    } else if (line == "exit") {
      std::_Exit(0);  // no cleanup at all: the daemon must notice by itself
    } else if (line.rfind("check-writeback ", 0) == 0) {
      int s2 = std::atoi(line.c_str() + 16);
      auto [bad, first] = Check(r, WritebackOffset(r.size), r.size, s2);
      Emit({{"event", "writeback_checked"}, {"bytes", r.size - WritebackOffset(r.size)}, {"mismatches", bad},
            {"first_bad", first}});
    } else if (line == "check") {
      auto [bad, first] = Check(r, 0, WritebackOffset(r.size), o.seed);
      Emit({{"event", "checked"}, {"mismatches", bad}});
    }
  }
  return 0;
}

int Import(podlink::Client& c, const Opts& o) {
  absl::Mutex mu;
  std::vector<podlink::WatchEvent> events;
  std::unique_ptr<podlink::Watcher> watcher;
  if (o.watch) {
    auto w = c.Watch([&](const podlink::WatchEvent& e) {
      Emit({{"event", "watch"}, {"type", static_cast<int>(e.type)}, {"export_id", e.export_id},
            {"reason", e.reason}});
    });
    if (!w.ok()) Die("watch", w.status());
    watcher = *std::move(w);
  }
  auto imp = o.name.empty() ? c.Import(o.id) : c.Import(o.name);
  if (!imp.ok()) Die("import", imp.status());
  const podlink::ExportInfo& info = imp->info();
  Emit({{"event", "imported"},
        {"export_id", info.export_id},
        {"owner", info.owner.namespace_ + "/" + info.owner.name},
        {"size", info.size},
        {"handle_type", podlink::HandleTypeName(info.handle_type)},
        {"gpu_device_node", imp->gpu_device_node()}});
  auto m = c.Map(*imp, o.gpu);
  if (!m.ok()) Die("map", m.status());
  Region r{(*m)->host_ptr(), (*m)->device_ptr(), (*m)->size(), (*m)->device()};
  if (o.verify >= 0) {
    auto [bad, first] = Check(r, 0, WritebackOffset(r.size), o.verify);
    Emit({{"event", "verified"}, {"bytes", WritebackOffset(r.size)}, {"mismatches", bad}, {"first_bad", first}});
    if (bad != 0) return 3;
  }
  if (o.writeback >= 0) {
    Fill(r, WritebackOffset(r.size), r.size, o.writeback);
    Emit({{"event", "wrote_back"}, {"bytes", r.size - WritebackOffset(r.size)}});
  }
  if (o.hold) {
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line == "exit") std::_Exit(0);
    }
  }
  m->reset();
  absl::Status s = c.Release(info.export_id);
  if (!s.ok()) Die("release-import", s);
  Emit({{"event", "done"}});
  return 0;
}

// Host or GPU memory (o.gpu < 0: host) registered with a transfer engine.
struct KvRegion {
  std::unique_ptr<podlink::HostBuffer> host;
  std::unique_ptr<podlink::GpuBuffer> gpu;
  // Declared after the buffers so it is destroyed first: its destructor waits
  // for copies still in flight into them.
  std::unique_ptr<podlink::TransferEngine> engine;
  Region region;
  podlink::LocalRegion local;
};

// Creates the engine, allocates `size` bytes, lets `init` fill them, registers.
KvRegion MakeKvRegion(podlink::Client& c, const Opts& o, uint64_t size, bool relay,
                      const std::function<void(const Region&)>& init) {
  KvRegion k;
  podlink::TransferEngine::Options eo;
  eo.device = std::max(o.gpu, 0);
  eo.force_relay = relay;
  auto eng = podlink::TransferEngine::Create(c, eo);
  if (!eng.ok()) Die("engine", eng.status());
  k.engine = *std::move(eng);
  absl::StatusOr<podlink::LocalRegion> reg;
  if (o.gpu < 0) {
    auto b = c.AllocateHost(size);
    if (!b.ok()) Die("allocate", b.status());
    k.host = *std::move(b);
    k.region = {k.host->data(), 0, k.host->size(), -1};
    init(k.region);
    reg = k.engine->Register(*k.host, {o.name, o.allow, ""});
  } else {
    auto b = c.AllocateGpu(size, o.gpu);
    if (!b.ok()) Die("allocate", b.status());
    k.gpu = *std::move(b);
    k.region = {nullptr, k.gpu->device_ptr(), k.gpu->size(), o.gpu};
    init(k.region);
    reg = k.engine->Register(*k.gpu, {o.name, o.allow, ""});
  }
  if (!reg.ok()) Die("register", reg.status());
  k.local = *reg;
  return k;
}

// Registers a region, prints its descriptor, waits for the peer's
// notification, then checks every byte.
int KvServe(podlink::Client& c, const Opts& o) {
  KvRegion k = MakeKvRegion(c, o, o.size, /*relay=*/false, [](const Region& r) {
    if (r.host != nullptr) {
      std::memset(r.host, 0xA5, r.size);
    } else {
      podlink::cu::LoadDriver().value()->MemsetD8(r.dev, 0xA5, r.size);
    }
  });
  auto desc = k.engine->Describe(k.local);
  if (!desc.ok()) Die("describe", desc.status());
  Emit({{"event", "serving"}, {"descriptor", desc->Serialize()}, {"size", k.region.size}});
  std::vector<podlink::Notification> n;
  for (int i = 0; i < 120000 && n.empty(); ++i) {
    n = k.engine->PollNotifications();
    if (n.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (n.empty()) Die("kv-serve", absl::DeadlineExceededError("no notification within 120 s"));
  auto [bad, first] = Check(k.region, 0, k.region.size, o.verify);
  Emit({{"event", "verified"}, {"notification", n[0].value}, {"bytes", k.region.size}, {"mismatches", bad},
        {"first_bad", first}});
  if (o.verify_again_ms > 0 && bad == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.verify_again_ms));
    std::tie(bad, first) = Check(k.region, 0, k.region.size, o.verify);
    Emit({{"event", "verified_again"}, {"after_ms", o.verify_again_ms}, {"mismatches", bad}, {"first_bad", first}});
  }
  return bad == 0 ? 0 : 3;
}

// Writes a whole peer region one-sided, in 64 MiB operations, then notifies.
int KvPut(podlink::Client& c, const Opts& o) {
  auto desc = podlink::RegionDescriptor::Parse(o.desc);
  if (!desc.ok()) Die("descriptor", desc.status());
  KvRegion k = MakeKvRegion(c, o, desc->size, o.relay, [&](const Region& r) { Fill(r, 0, r.size, o.seed); });
  auto remote = k.engine->Open(*desc);
  if (!remote.ok()) Die("open", remote.status());
  if (o.idle_ms > 0) {
    Emit({{"event", "idle"}, {"ms", o.idle_ms}});
    std::this_thread::sleep_for(std::chrono::milliseconds(o.idle_ms));
  }
  std::vector<podlink::TransferOp> ops;
  for (uint64_t off = 0; off < desc->size; off += kChunk) {
    ops.push_back({&k.local, off, &*remote, off, std::min(kChunk, desc->size - off)});
  }
  absl::Status st;
  double first = 0, secs = 0;
  for (uint64_t i = 0; i < o.repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    st = k.engine->Writev(ops);
    auto t1 = std::chrono::steady_clock::now();
    if (!st.ok()) Die("write", st);
    secs = std::chrono::duration<double>(t1 - t0).count();
    if (i == 0) first = secs;
  }
  Emit({{"event", "put"}, {"transport", podlink::TransportName(remote->transport)}, {"bytes", desc->size},
        {"seconds", secs}, {"gbps", desc->size / secs / 1e9}, {"repeat", o.repeat}, {"first_seconds", first}});
  int expect = o.seed;
  if (o.rewrite_seed >= 0) {
    Fill(k.region, 0, k.region.size, o.rewrite_seed);
    auto t0 = std::chrono::steady_clock::now();
    st = k.engine->Writev(ops);
    if (!st.ok()) Die("rewrite", st);
    Emit({{"event", "rewrote"}, {"bytes", desc->size},
          {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}});
    expect = o.rewrite_seed;
  }
  if (o.read_back) {
    // One-sided read of the whole peer region into a second local region
    // (zeroed first), then every byte compared with what was written; before
    // the notification, which lets the owner go.
    auto back = c.AllocateHost(desc->size);
    if (!back.ok()) Die("allocate", back.status());
    auto reg = k.engine->Register(**back);
    if (!reg.ok()) Die("register", reg.status());
    std::vector<podlink::TransferOp> rops;
    for (uint64_t off = 0; off < desc->size; off += kChunk) {
      rops.push_back({&*reg, off, &*remote, off, std::min(kChunk, desc->size - off)});
    }
    auto r0 = std::chrono::steady_clock::now();
    st = k.engine->Readv(rops);
    auto r1 = std::chrono::steady_clock::now();
    if (!st.ok()) Die("read", st);
    Region got{(*back)->data(), 0, (*back)->size(), -1};
    auto [bad, first] = Check(got, 0, desc->size, expect);
    double rs = std::chrono::duration<double>(r1 - r0).count();
    Emit({{"event", "read_back"}, {"bytes", desc->size}, {"mismatches", bad}, {"first_bad", first},
          {"seconds", rs}, {"gbps", desc->size / rs / 1e9}});
    if (bad != 0) return 3;
  }
  // Last: the owner checks its region and may exit once told.
  st = k.engine->Notify(*remote, 1);
  if (!st.ok()) Die("notify", st);
  return 0;
}

// Export -> import -> map -> close, `count` times, each on fresh sessions.
int Cycle(const Opts& o) {
  for (uint64_t i = 0; i < o.count; ++i) {
    auto exporter = podlink::Client::Connect();
    if (!exporter.ok()) Die("connect", exporter.status());
    auto importer = podlink::Client::Connect();
    if (!importer.ok()) Die("connect", importer.status());
    auto b = (*exporter)->AllocateHost(o.size);
    if (!b.ok()) Die("allocate", b.status());
    static_cast<uint8_t*>((*b)->data())[0] = static_cast<uint8_t>(i);
    auto id = (*exporter)->Export(**b);
    if (!id.ok()) Die("export", id.status());
    auto imp = (*importer)->Import(*id);
    if (!imp.ok()) Die("import", imp.status());
    auto m = (*importer)->Map(*imp);
    if (!m.ok()) Die("map", m.status());
    if (static_cast<uint8_t*>((*m)->host_ptr())[0] != static_cast<uint8_t>(i)) {
      Die("cycle", absl::DataLossError("imported memory does not show the exporter's byte"));
    }
    // Exporter goes away without releasing: the daemon must clean up.
    exporter->reset();
  }
  Emit({{"event", "cycled"}, {"count", o.count}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const podlink::cli::Program program{"podlink-demo", PODLINK_VERSION, kUsage, __FILE__};
  std::vector<std::string> args = podlink::cli::Parse(argc, argv, program);
  if (args.empty()) {
    std::cerr << "podlink-demo: no command given\n\n" << kUsage;
    return 2;
  }
  absl::StatusOr<Opts> opts = OptsFromFlags(args);
  if (!opts.ok()) {
    std::cerr << "podlink-demo: " << opts.status().message() << " (--help lists the options)\n";
    return 2;
  }
  const Opts& o = *opts;
  if (o.cmd == "cycle") return Cycle(o);
  auto c = podlink::Client::Connect();
  if (!c.ok()) Die("connect", c.status());
  if (o.cmd == "info") return Info(**c);
  if (o.cmd == "export") return Export(**c, o);
  if (o.cmd == "import") return Import(**c, o);
  if (o.cmd == "kv-serve") return KvServe(**c, o);
  return KvPut(**c, o);
}
