// One pod of the NIXL plugin test (tests/integration/nixl_plugin_test.cc).
// It plays NIXL 1.4's agent: dlopens libplugin_PODLINK.so as NIXL's plugin
// manager does, creates engines as nixlAgent::createBackend does and calls
// the engine in the agent's order (create -> getInitErr -> getConnInfo ->
// connect(self); registerMem -> loadLocalMD -> getPublicData;
// loadRemoteConnInfo -> loadRemoteMD; prepXfer -> postXfer -> checkXfer ...
// -> releaseReqH; unloadMD -> disconnect; deregisterMem). Commands arrive as
// JSON lines on stdin, one event per line leaves on stdout.
//
//   nixl_peer <libplugin_PODLINK.so> [KEY=VALUE ...]   (environment for the plugin)
//
// Host memory comes from podlink::Client::AllocateHost of this program's own
// Client (a session apart from the engines'), filled with a pattern of
// (seed, block, offset). The plugin's stderr is captured (a memfd behind fd 2,
// copied through to the real stderr after each command) so that {"cmd":"log"}
// can show the test what the plugin said.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client-lib/nixl/nixl_abi.h"
#include "nlohmann/json.hpp"
#include "podlink/client.h"
#include "podlink/transfer.h"

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// The plugin's notification value (client-lib/nixl/engine.h: kNotifyValue).
constexpr uint64_t kNotifyValue = 0x4e49584c;

// Bytes that are not UTF-8 (binary notifications in "text") become U+FFFD; "list" carries them in hex.
void Emit(const json& j) { std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl; }

// ---- stderr capture ----------------------------------------------------------

int g_real_stderr = -1;
int g_log_fd = -1;
off_t g_log_passed = 0;

void CaptureStderr() {
  g_log_fd = memfd_create("nixl_peer_stderr", MFD_CLOEXEC);
  if (g_log_fd < 0) return;
  g_real_stderr = dup(2);
  dup2(g_log_fd, 2);
}

std::string ReadLog() {
  if (g_log_fd < 0) return "";
  std::fflush(stderr);
  std::string out;
  char buf[4096];
  for (off_t at = 0;;) {
    ssize_t n = pread(g_log_fd, buf, sizeof(buf), at);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    at += n;
  }
  return out;
}

// Skips what the plugin wrote since the last PassLog (the garbage command's
// thousands of refusals), leaving a line that says so.
void SkipLog(const char* what) {
  if (g_log_fd < 0 || g_real_stderr < 0) return;
  std::fflush(stderr);
  off_t end = lseek(g_log_fd, 0, SEEK_END);
  std::string line = "nixl_peer: " + std::to_string(end - g_log_passed) + " bytes of plugin log from " + what +
                     " not shown\n";
  (void)!write(g_real_stderr, line.data(), line.size());
  g_log_passed = end;
}

// Copies what the plugin wrote since the last call to the real stderr.
void PassLog() {
  if (g_log_fd < 0 || g_real_stderr < 0) return;
  std::fflush(stderr);
  char buf[4096];
  for (;;) {
    ssize_t n = pread(g_log_fd, buf, sizeof(buf), g_log_passed);
    if (n <= 0) break;
    (void)!write(g_real_stderr, buf, static_cast<size_t>(n));
    g_log_passed += n;
  }
}

// ---- helpers -------------------------------------------------------------------

std::string Hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  o.reserve(s.size() * 2);
  for (unsigned char c : s) {
    o.push_back(d[c >> 4]);
    o.push_back(d[c & 15]);
  }
  return o;
}

std::string Unhex(const std::string& h) {
  auto v = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return 0;
  };
  std::string o;
  for (size_t i = 0; i + 1 < h.size(); i += 2) o.push_back(static_cast<char>(v(h[i]) << 4 | v(h[i + 1])));
  return o;
}

uint8_t Pat(uint64_t seed, uint64_t block, uint64_t off) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (block + 1) * 0xC2B2AE3D27D4EB4Full ^ (off / 8) * 0x165667B19E3779F9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> (8 * (off % 8)));
}

// ---- the plugin ------------------------------------------------------------------

nixlBackendPlugin* g_plugin = nullptr;
podlink::Client* g_client = nullptr;  // for AllocateHost only

struct Region {
  std::unique_ptr<podlink::HostBuffer> buf;
  nixlBackendMD* md = nullptr;       // registerMem
  nixlBackendMD* self_md = nullptr;  // loadLocalMD
  uint64_t blocks = 0, block_bytes = 0, seed = 0;
  std::string pub;
  uint8_t* Block(uint64_t b) const { return static_cast<uint8_t*>(buf->data()) + b * block_bytes; }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(buf->data()); }
  uint64_t len() const { return blocks * block_bytes; }
};

struct Remote {
  nixlBackendMD* md = nullptr;
  uint64_t addr = 0, len = 0, block_bytes = 0;
};

struct Agent {
  std::string name;
  nixlBackendEngine* eng = nullptr;
  std::string conn;
  Region region;
  std::map<std::string, Remote> remotes;
};

// nixlAgent::createBackend's sequence.
std::unique_ptr<Agent> CreateAgent(const std::string& name, std::string* error) {
  nixl_b_params_t params;  // empty, as vLLM and nixl_agent pass non-UCX backends
  nixlBackendInitParams ip;
  ip.localAgent = name;
  ip.type = "PODLINK";
  ip.customParams = &params;
  ip.enableProgTh = false;
  ip.pthrDelay = 0;
  ip.syncMode = nixl_thread_sync_t::NIXL_THREAD_SYNC_RW;
  ip.enableTelemetry_ = false;
  nixlBackendEngine* e = g_plugin->create_engine(&ip);
  if (e == nullptr) return *error = "create_engine returned null", nullptr;
  if (e->getInitErr()) {
    g_plugin->destroy_engine(e);
    return *error = "getInitErr", nullptr;
  }
  if (e->getType() != "PODLINK") *error = "getType is not PODLINK";
  if (e->supportsRemote() && !e->supportsNotif()) *error = "supportsRemote without supportsNotif";
  auto a = std::make_unique<Agent>();
  a->name = name;
  a->eng = e;
  if (e->supportsRemote()) {
    nixl_status_t st = e->getConnInfo(a->conn);
    if (st != NIXL_SUCCESS || a->conn.empty()) *error = "getConnInfo: " + std::to_string(st);
  }
  if (e->supportsLocal()) {
    nixl_status_t st = e->connect(name);
    if (st != NIXL_SUCCESS) *error = "connect(self): " + std::to_string(st);
  }
  nixl_mem_list_t mems = e->getSupportedMems();
  if (mems != nixl_mem_list_t{DRAM_SEG, VRAM_SEG}) *error = "getSupportedMems";
  if (!error->empty()) {
    g_plugin->destroy_engine(e);
    return nullptr;
  }
  return a;
}

// register_memory's sequence for one region (rolled back on failure).
nixl_status_t Register(Agent& a, uint64_t blocks, uint64_t block_bytes, uint64_t seed, std::string* error) {
  auto buf = g_client->AllocateHost(blocks * block_bytes);
  if (!buf.ok()) return *error = buf.status().ToString(), NIXL_ERR_BACKEND;
  Region r;
  r.buf = *std::move(buf);
  r.blocks = blocks;
  r.block_bytes = block_bytes;
  r.seed = seed;
  for (uint64_t b = 0; b < blocks; ++b) {
    for (uint64_t o = 0; o < block_bytes; ++o) r.Block(b)[o] = Pat(seed, b, o);
  }
  nixlBlobDesc d(r.addr(), r.len(), 0, "");
  nixl_status_t st = a.eng->registerMem(d, DRAM_SEG, r.md);
  if (st != NIXL_SUCCESS) return *error = "registerMem", st;
  st = a.eng->loadLocalMD(r.md, r.self_md);
  if (st != NIXL_SUCCESS) {
    a.eng->deregisterMem(r.md);
    return *error = "loadLocalMD", st;
  }
  st = a.eng->getPublicData(r.md, r.pub);
  if (st != NIXL_SUCCESS || r.pub.empty()) {
    a.eng->unloadMD(r.self_md);
    a.eng->deregisterMem(r.md);
    return *error = "getPublicData", st != NIXL_SUCCESS ? st : NIXL_ERR_BACKEND;
  }
  a.region = std::move(r);
  return NIXL_SUCCESS;
}

// add_remote_agent's sequence.
json LoadRemote(Agent& a, const std::string& agent, const std::string& conn, const std::string& pub, uint64_t addr,
                uint64_t len, uint64_t block_bytes) {
  json out = {{"event", "loaded"}};
  nixl_status_t st = a.eng->loadRemoteConnInfo(agent, conn);
  out["conn_status"] = st;
  if (st != NIXL_SUCCESS) return out;
  Remote r;
  r.addr = addr;
  r.len = len;
  r.block_bytes = block_bytes;
  st = a.eng->loadRemoteMD(nixlBlobDesc(addr, len, 0, pub), DRAM_SEG, agent, r.md);
  out["md_status"] = st;
  if (st == NIXL_SUCCESS) a.remotes[agent] = r;
  return out;
}

// remove_remote_agent's sequence.
void UnloadRemote(Agent& a, const std::string& agent) {
  auto it = a.remotes.find(agent);
  if (it != a.remotes.end()) {
    a.eng->unloadMD(it->second.md);
    a.remotes.erase(it);
  }
  a.eng->disconnect(agent);
}

void Shutdown(Agent& a, bool agent_destructor_order) {
  std::vector<std::string> names;
  for (auto& [n, r] : a.remotes) names.push_back(n);
  for (auto& n : names) UnloadRemote(a, n);
  if (a.region.md != nullptr) {
    if (agent_destructor_order) {
      // ~nixlAgent: deregisterMem before unloadMD of the self MD.
      a.eng->deregisterMem(a.region.md);
      a.eng->unloadMD(a.region.self_md);
    } else {
      a.eng->unloadMD(a.region.self_md);
      a.eng->deregisterMem(a.region.md);
    }
    a.region.md = a.region.self_md = nullptr;
  }
  g_plugin->destroy_engine(a.eng);
  a.eng = nullptr;
}

struct XferSpec {
  nixl_xfer_op_t op = NIXL_WRITE;
  std::string agent;               // remote agent (may be the agent itself)
  nixlBackendMD* remote_md = nullptr;
  uint64_t remote_addr = 0, remote_block_bytes = 0;
  std::vector<uint64_t> blocks, remote_blocks;
  std::optional<std::string> notif;
  int posts = 1;
  bool probe_repost = false;       // a second postXfer before the first checkXfer
  bool until_error = false;        // keep posting until an error (a peer killed meanwhile)
  std::optional<uint64_t> check_seed;  // READ: local blocks must then hold Pat(seed, remote block)
  int timeout_ms = 30000;
};

struct XferResult {
  nixl_status_t prep = NIXL_SUCCESS, status = NIXL_SUCCESS, repost_active = NIXL_SUCCESS;
  int posts = 0;
  bool data_ok = true;
  std::string error;
};

bool CheckBlocks(const Region& r, uint64_t seed, const std::vector<uint64_t>& blocks,
                 const std::vector<uint64_t>& src_blocks, std::string* where) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const uint8_t* p = r.Block(blocks[i]);
    for (uint64_t o = 0; o < r.block_bytes; ++o) {
      if (p[o] != Pat(seed, src_blocks[i], o)) {
        *where = "block " + std::to_string(blocks[i]) + " offset " + std::to_string(o);
        return false;
      }
    }
  }
  return true;
}

XferResult DoXfer(Agent& a, const XferSpec& s, const std::function<void(int)>& on_done = nullptr) {
  XferResult res;
  if (s.blocks.size() != s.remote_blocks.size()) return res.error = "block lists differ", res;
  nixl_meta_dlist_t local(DRAM_SEG), remote(DRAM_SEG);
  for (size_t i = 0; i < s.blocks.size(); ++i) {
    local.addDesc(nixlMetaDesc(reinterpret_cast<uintptr_t>(a.region.Block(s.blocks[i])), a.region.block_bytes, 0,
                               a.region.md));
    remote.addDesc(nixlMetaDesc(s.remote_addr + s.remote_blocks[i] * s.remote_block_bytes, a.region.block_bytes, 0,
                                s.remote_md));
  }
  nixlBackendOptionalArgs opt;
  opt.hasNotif = s.notif.has_value();
  if (s.notif) opt.notifMsg = *s.notif;
  nixlBackendReqH* h = nullptr;
  res.prep = a.eng->prepXfer(s.op, local, remote, s.agent, h, &opt);
  if (res.prep != NIXL_SUCCESS) return res.status = res.prep, res;
  const int max_posts = s.until_error ? 1000000 : s.posts;
  for (int k = 0; k < max_posts; ++k) {
    nixl_status_t st = a.eng->postXfer(s.op, local, remote, s.agent, h, &opt);
    ++res.posts;
    if (k == 0 && s.probe_repost && st == NIXL_IN_PROG) {
      res.repost_active = a.eng->postXfer(s.op, local, remote, s.agent, h, &opt);
    }
    const auto deadline = Clock::now() + std::chrono::milliseconds(s.timeout_ms);
    while (st == NIXL_IN_PROG) {
      st = a.eng->checkXfer(h);
      if (st == NIXL_IN_PROG) {
        if (Clock::now() > deadline) {
          res.error = "checkXfer stayed IN_PROG";
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    res.status = st;
    if (st != NIXL_SUCCESS) break;
    if (s.check_seed && s.op == NIXL_READ) {
      std::string where;
      if (!CheckBlocks(a.region, *s.check_seed, s.blocks, s.remote_blocks, &where)) {
        res.data_ok = false;
        res.error = "data differs at " + where;
        break;
      }
    }
    if (on_done) on_done(k);
  }
  a.eng->releaseReqH(h);
  return res;
}

json ResultJson(const XferResult& r) {
  json j = {{"event", "xfer"}, {"prep", r.prep},   {"status", r.status}, {"posts", r.posts},
            {"repost_active", r.repost_active}, {"data_ok", r.data_ok}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

// Collects notifications until `want` arrived or `timeout_ms` passed.
std::vector<std::pair<std::string, std::string>> CollectNotifs(Agent& a, size_t want, int timeout_ms,
                                                               nixl_status_t* status) {
  std::vector<std::pair<std::string, std::string>> all;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  *status = NIXL_SUCCESS;
  do {
    notif_list_t l;
    nixl_status_t st = a.eng->getNotifs(l);
    if (st != NIXL_SUCCESS) *status = st;
    for (auto& n : l) all.push_back(std::move(n));
    if (all.size() >= want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (Clock::now() < deadline);
  return all;
}

json NotifsJson(const std::vector<std::pair<std::string, std::string>>& l) {
  json list = json::array(), text = json::array();
  for (auto& [agent, msg] : l) {
    list.push_back({agent, Hex(msg)});
    text.push_back({agent, msg});
  }
  return {{"list", list}, {"text", text}};
}

std::vector<uint64_t> Ids(const json& j) {
  std::vector<uint64_t> v;
  if (j.is_array()) {
    for (auto& x : j) v.push_back(x.get<uint64_t>());
  }
  return v;
}

std::vector<uint64_t> Range(uint64_t from, uint64_t n) {
  std::vector<uint64_t> v;
  for (uint64_t i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

XferSpec SpecTo(Agent& a, const std::string& agent) {
  XferSpec s;
  s.agent = agent;
  if (agent == a.name) {
    s.remote_md = a.region.self_md;
    s.remote_addr = a.region.addr();
    s.remote_block_bytes = a.region.block_bytes;
  } else if (auto it = a.remotes.find(agent); it != a.remotes.end()) {
    s.remote_md = it->second.md;
    s.remote_addr = it->second.addr;
    s.remote_block_bytes = it->second.block_bytes;
  }
  return s;
}

// ---- scenarios --------------------------------------------------------------------

// Another engine (agent) in this process: data both ways and notifications
// between the two, then a self transfer and a self notification.
json SecondAgent(Agent& a, const std::string& name) {
  json out = {{"event", "second_agent"}};
  std::string error;
  std::unique_ptr<Agent> b = CreateAgent(name, &error);
  if (!b) return out["error"] = "create " + name + ": " + error, out;
  const uint64_t n = 4;
  if (a.region.md == nullptr || a.region.blocks < 2 * n) return out["error"] = "alloc >= 8 blocks first", out;
  nixl_status_t st = Register(*b, n, a.region.block_bytes, 77, &error);
  if (st != NIXL_SUCCESS) return out["error"] = "register: " + error + " " + std::to_string(st), out;
  json la = LoadRemote(a, b->name, b->conn, b->region.pub, b->region.addr(), b->region.len(), b->region.block_bytes);
  json lb = LoadRemote(*b, a.name, a.conn, a.region.pub, a.region.addr(), a.region.len(), a.region.block_bytes);
  out["load"] = {la, lb};
  bool ok = la.value("md_status", -99) == 0 && lb.value("md_status", -99) == 0;
  std::string where;
  if (ok) {
    // a WRITEs its blocks 0..3 into b.
    XferSpec w = SpecTo(a, b->name);
    w.op = NIXL_WRITE;
    w.blocks = Range(0, n);
    w.remote_blocks = Range(0, n);
    w.notif = "second:w";
    XferResult r = DoXfer(a, w);
    out["write"] = ResultJson(r);
    nixl_status_t ns;
    auto got = CollectNotifs(*b, 1, 10000, &ns);
    out["b_notifs"] = NotifsJson(got);
    ok &= r.status == NIXL_SUCCESS && got.size() == 1 && got[0] == std::make_pair(a.name, std::string("second:w"));
    bool data = CheckBlocks(b->region, a.region.seed, Range(0, n), Range(0, n), &where);
    out["write_data_ok"] = data;
    ok &= data;
    // b READs a's blocks 4..7.
    XferSpec rd = SpecTo(*b, a.name);
    rd.op = NIXL_READ;
    rd.blocks = Range(0, n);
    rd.remote_blocks = Range(n, n);
    rd.notif = "second:r";
    rd.check_seed = a.region.seed;
    r = DoXfer(*b, rd);
    out["read"] = ResultJson(r);
    got = CollectNotifs(a, 1, 10000, &ns);
    out["a_notifs"] = NotifsJson(got);
    ok &= r.status == NIXL_SUCCESS && r.data_ok && got.size() == 1 &&
          got[0] == std::make_pair(b->name, std::string("second:r"));
    // b to itself: block 0 -> block 1 through its loadLocalMD metadata, then genNotif to itself.
    XferSpec self = SpecTo(*b, b->name);
    self.op = NIXL_WRITE;
    self.blocks = {0};
    self.remote_blocks = {1};
    self.notif = "self:x";
    r = DoXfer(*b, self);
    out["self"] = ResultJson(r);
    nixl_status_t g = b->eng->genNotif(b->name, std::string("self:\0g", 7));
    got = CollectNotifs(*b, 2, 10000, &ns);
    out["self_notifs"] = NotifsJson(got);
    ok &= r.status == NIXL_SUCCESS && g == NIXL_SUCCESS && got.size() == 2 &&
          got[0] == std::make_pair(b->name, std::string("self:x")) &&
          got[1] == std::make_pair(b->name, std::string("self:\0g", 7));
    // Block 1 of b now holds what block 0 held: a's block 4 (the READ above).
    bool self_data = CheckBlocks(b->region, a.region.seed, {1}, {n}, &where);
    out["self_data_ok"] = self_data;
    ok &= self_data;
  }
  UnloadRemote(a, b->name);
  Shutdown(*b, /*agent_destructor_order=*/false);
  out["ok"] = ok;
  if (!where.empty()) out["where"] = where;
  return out;
}

// Malformed connection info, metadata and notification frames: every one
// refused (or, for mutations that still parse, handled), none a crash.
json Garbage(Agent& a) {
  json out = {{"event", "garbage"}};
  std::mt19937_64 rng(12345);
  auto rnd = [&](size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    return s;
  };
  const std::string conn = a.conn, pub = a.region.pub;
  const std::string desc = pub.substr(pub.find(";podlink") + 1);  // the region descriptor in the public data
  // Structurally invalid: must be NIXL_ERR_INVALID_PARAM.
  std::vector<std::string> bad_conn = {
      "", "podlink-nixl1", "podlink-nixl1;", "podlink-nixl1;;;", "podlink-nixl2;7;garbage;" + desc,
      "podlink-nixl1;0;;" + desc, "podlink-nixl1;7;garbage" + desc, "podlink-nixl1;99;garbage;" + desc,
      "podlink-nixl1;18446744073709551616;garbage;" + desc, "podlink-nixl1;-7;garbage;" + desc,
      "podlink-nixl1;+7;garbage;" + desc, "podlink-nixl1;07;garbage;" + desc, "podlink-nixl1; 7;garbage;" + desc,
      "podlink-nixl1;7;garbage;", "podlink-nixl1;7;garbage;podlink1;x;1;2;3", "podlink-nixl1;7;garbage;" + desc + ";",
      "podlink-nixl1;7;otheragt;" + desc,  // names another agent
      "podlink-nixl1;7;garbage;" + std::string(20000, 'x'),
  };
  std::vector<std::string> bad_md = {
      "", "podlink-nixl1", "podlink-nixl1;1;2;3", "podlink-nixl1;1;2;3;", "x;1;2;3;" + desc,
      "podlink-nixl1;1;0;0;" + desc,                                       // zero length
      "podlink-nixl1;1;18446744073709551615;2;" + desc,                    // offset past the export
      "podlink-nixl1;1;0;18446744073709551615;" + desc,                    // longer than the export
      "podlink-nixl1;18446744073709551615;0;16;" + desc,                   // wraps the address space
      "podlink-nixl1;1;0;99999999999999999999;" + desc,                    // overflows u64
      "podlink-nixl1;1;-1;16;" + desc, "podlink-nixl1;0x10;0;16;" + desc, "podlink-nixl1;1;0;16;podlink1;n;x;1;3;",
      "podlink-nixl1;1;0;16;" + desc + ";extra", "podlink-nixl1;1;0;16;" + std::string(20000, '9'),
  };
  // Truncations of the real ones.
  for (size_t n = 0; n + 1 < conn.size(); n += 3) bad_conn.push_back(conn.substr(0, n));
  int cases = 0, invalid = 0, other = 0, accepted = 0;
  json unexpected = json::array();
  const std::string peer = "garbage";
  auto try_conn = [&](const std::string& agent, const std::string& s, bool must_be_invalid) {
    ++cases;
    nixl_status_t st = a.eng->loadRemoteConnInfo(agent, s);
    if (st == NIXL_SUCCESS) {
      ++accepted;
      a.eng->disconnect(agent);
    } else if (st == NIXL_ERR_INVALID_PARAM) {
      ++invalid;
    } else {
      ++other;
    }
    if (must_be_invalid && st != NIXL_ERR_INVALID_PARAM) unexpected.push_back({"conn", Hex(s.substr(0, 80)), st});
  };
  auto try_md = [&](const std::string& s, uint64_t addr, uint64_t len, nixl_mem_t mem, bool must_be_invalid) {
    ++cases;
    nixlBackendMD* md = nullptr;
    nixl_status_t st = a.eng->loadRemoteMD(nixlBlobDesc(addr, len, 0, s), mem, a.name, md);
    if (st == NIXL_SUCCESS) {
      ++accepted;
      a.eng->unloadMD(md);
    } else if (st == NIXL_ERR_INVALID_PARAM) {
      ++invalid;
    } else {
      ++other;
    }
    if (must_be_invalid && st != NIXL_ERR_INVALID_PARAM) unexpected.push_back({"md", Hex(s.substr(0, 80)), st});
  };
  for (const std::string& s : bad_conn) try_conn(peer, s, true);
  for (size_t n = 0; n + 1 < pub.size(); n += 3) try_md(pub.substr(0, n), 1, 16, DRAM_SEG, true);
  for (const std::string& s : bad_md) try_md(s, 1, 16, DRAM_SEG, true);
  // Real metadata for another range, or as the wrong memory type.
  try_md(pub, a.region.addr() + 1, a.region.len(), DRAM_SEG, true);
  try_md(pub, a.region.addr(), a.region.len() + 1, DRAM_SEG, true);
  try_md(pub, a.region.addr(), a.region.len(), VRAM_SEG, true);
  try_md(pub, a.region.addr(), a.region.len(), FILE_SEG, true);
  // Random bytes, and random bytes after the magic.
  for (int i = 0; i < 300; ++i) {
    std::string r = rnd(rng() % 200);
    try_conn(peer, r, true);
    try_md(r, 1, 16, DRAM_SEG, true);
    try_conn(peer, "podlink-nixl1;" + r, true);
    try_md("podlink-nixl1;" + r, 1, 16, DRAM_SEG, true);
  }
  // One byte changed: may still parse (another export id, say): any outcome
  // but a crash; a success is undone.
  for (int i = 0; i < 300; ++i) {
    std::string c = conn, m = pub;
    c[rng() % c.size()] = static_cast<char>(rng());
    m[rng() % m.size()] = static_cast<char>(rng());
    try_conn(a.name + "x", c, false);
    try_md(m, a.region.addr(), a.region.len(), DRAM_SEG, false);
  }
  // Malformed notification frames sent straight to this agent's mailbox with
  // podlink's own API: getNotifs must drop them, succeed, and still deliver a
  // good one.
  json frames = {{"sent", 0}};
  {
    size_t semi1 = conn.find(';'), semi2 = conn.find(';', semi1 + 1);
    size_t len = std::stoul(conn.substr(semi1 + 1, semi2 - semi1 - 1));
    auto d = podlink::RegionDescriptor::Parse(conn.substr(semi2 + 1 + len + 1));
    absl::StatusOr<std::unique_ptr<podlink::TransferEngine>> eng =
        d.ok() ? podlink::TransferEngine::Create(*g_client)
               : absl::StatusOr<std::unique_ptr<podlink::TransferEngine>>(d.status());
    if (eng.ok()) {
      auto mb = (*eng)->Open(*d);
      if (mb.ok()) {
        int sent = 0;
        for (std::string f : {std::string(), std::string(1, '\x05'), std::string("\x00\x00msg", 5),
                              std::string("\xff\xff" "ab", 4), std::string("\x09\x00short", 7)}) {
          sent += (*eng)->Notify(*mb, kNotifyValue, f).ok();
        }
        sent += (*eng)->Notify(*mb, 1234, std::string("\x02\x00" "zzbad-value", 13)).ok();  // another value
        sent += (*eng)->Notify(*mb, kNotifyValue).ok();                                   // no bytes
        bool good = (*eng)->Notify(*mb, kNotifyValue, std::string("\x04\x00" "evilhello", 11)).ok();
        nixl_status_t ns;
        auto got = CollectNotifs(a, 1, 5000, &ns);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        auto more = CollectNotifs(a, 1, 100, &ns);
        got.insert(got.end(), more.begin(), more.end());
        frames = {{"sent", sent}, {"good_sent", good}, {"status", ns}, {"got", NotifsJson(got)["text"]}};
        (void)(*eng)->Close(*mb);
      } else {
        frames["error"] = mb.status().ToString();
      }
    } else {
      frames["error"] = eng.status().ToString();
    }
  }
  out.update({{"cases", cases}, {"invalid", invalid}, {"other", other}, {"accepted", accepted},
              {"unexpected", unexpected}, {"frames", frames}});
  return out;
}

// Posts from `n` threads at once, each its own prepared handle posted
// `iters` times with a notification per post ("t<thread>:<iter>").
json Threads(Agent& a, const json& cmd) {
  const int n = cmd.value("n", 8), iters = cmd.value("iters", 4);
  const uint64_t per = cmd.value("blocks_per_thread", 1);
  const std::string agent = cmd.value("remote", std::string());
  std::vector<XferResult> res(static_cast<size_t>(n));
  std::atomic<int> go{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t) {
    ts.emplace_back([&, t] {
      XferSpec s = SpecTo(a, agent);
      s.op = cmd.value("op", "WRITE") == std::string("READ") ? NIXL_READ : NIXL_WRITE;
      s.blocks = Range(static_cast<uint64_t>(t) * per, per);
      s.remote_blocks = s.blocks;
      go.fetch_add(1, std::memory_order_acq_rel);
      while (go.load(std::memory_order_acquire) < n) std::this_thread::yield();
      // One prepared handle per thread, a new notification on every post.
      nixl_meta_dlist_t local(DRAM_SEG), remote(DRAM_SEG);
      for (uint64_t b : s.blocks) {
        local.addDesc(nixlMetaDesc(reinterpret_cast<uintptr_t>(a.region.Block(b)), a.region.block_bytes, 0,
                                   a.region.md));
        remote.addDesc(nixlMetaDesc(s.remote_addr + b * s.remote_block_bytes, a.region.block_bytes, 0, s.remote_md));
      }
      XferResult& r = res[static_cast<size_t>(t)];
      nixlBackendReqH* h = nullptr;
      r.prep = a.eng->prepXfer(s.op, local, remote, s.agent, h, nullptr);
      if (r.prep != NIXL_SUCCESS) return void(r.status = r.prep);
      for (int k = 0; k < iters && r.status == NIXL_SUCCESS; ++k) {
        nixlBackendOptionalArgs opt;
        opt.hasNotif = true;
        opt.notifMsg = "t" + std::to_string(t) + ":" + std::to_string(k);
        nixl_status_t st = a.eng->postXfer(s.op, local, remote, s.agent, h, &opt);
        ++r.posts;
        const auto deadline = Clock::now() + std::chrono::seconds(30);
        while (st == NIXL_IN_PROG && Clock::now() < deadline) {
          st = a.eng->checkXfer(h);
          if (st == NIXL_IN_PROG) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        r.status = st;
      }
      a.eng->releaseReqH(h);
    });
  }
  for (auto& t : ts) t.join();
  json st = json::array();
  bool ok = true;
  for (auto& r : res) {
    st.push_back(r.status);
    ok &= r.status == NIXL_SUCCESS && r.posts == iters;
  }
  return {{"event", "threads"}, {"statuses", st}, {"ok", ok}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: nixl_peer <libplugin_PODLINK.so> [KEY=VALUE ...]\n");
    return 2;
  }
  for (int i = 2; i < argc; ++i) putenv(argv[i]);
  CaptureStderr();
  std::unique_ptr<Agent> agent;
  std::unique_ptr<podlink::Client> client;
  std::string line;
  while (std::getline(std::cin, line)) {
    json cmd = json::parse(line, nullptr, false);
    if (cmd.is_discarded() || !cmd.contains("cmd")) {
      Emit({{"event", "error"}, {"error", "not a command: " + line}});
      continue;
    }
    const std::string c = cmd["cmd"];
    try {
      if (c == "init") {
        // NIXL's plugin manager: dlopen, dlsym, api_version, then the name.
        void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (lib == nullptr) {
          Emit({{"event", "error"}, {"error", dlerror()}});
          continue;
        }
        auto init = reinterpret_cast<nixlBackendPlugin* (*)()>(dlsym(lib, "nixl_plugin_init"));
        auto fini = reinterpret_cast<void (*)()>(dlsym(lib, "nixl_plugin_fini"));
        if (init == nullptr || fini == nullptr) {
          Emit({{"event", "error"}, {"error", "nixl_plugin_init/fini missing"}});
          continue;
        }
        // NIXL may call init again after fini on the same image.
        fini();
        g_plugin = init();
        if (g_plugin == nullptr || g_plugin->api_version != 1 || g_plugin->get_plugin_name == nullptr ||
            std::string(g_plugin->get_plugin_name()) != "PODLINK" || g_plugin->create_engine == nullptr ||
            g_plugin->destroy_engine == nullptr) {
          Emit({{"event", "error"}, {"error", "bad plugin struct"}});
          continue;
        }
        json mems = json::array();
        if (g_plugin->get_backend_mems != nullptr) {
          for (nixl_mem_t m : g_plugin->get_backend_mems()) mems.push_back(m);
        }
        auto cl = podlink::Client::Connect();
        if (!cl.ok()) {
          Emit({{"event", "error"}, {"error", cl.status().ToString()}});
          continue;
        }
        client = *std::move(cl);
        g_client = client.get();
        std::string error;
        agent = CreateAgent(cmd.value("agent", std::string("agent")), &error);
        if (!agent) {
          Emit({{"event", "error"}, {"error", error}});
          continue;
        }
        Emit({{"event", "ready"}, {"conn", Hex(agent->conn)}, {"agent", agent->name},
              {"version", g_plugin->get_plugin_version ? g_plugin->get_plugin_version() : ""},
              {"options", g_plugin->get_backend_options ? g_plugin->get_backend_options().size() : 0},
              {"mems", mems}});
      } else if (agent == nullptr) {
        Emit({{"event", "error"}, {"error", "init first"}});
      } else if (c == "alloc") {
        std::string error;
        nixl_status_t st = Register(*agent, cmd.value("blocks", 16), cmd.value("block_bytes", 4096),
                                    cmd.value("seed", 1), &error);
        if (st != NIXL_SUCCESS) {
          Emit({{"event", "registered"}, {"status", st}, {"error", error}});
        } else {
          Emit({{"event", "registered"}, {"status", st}, {"md", Hex(agent->region.pub)},
                {"addr", agent->region.addr()}, {"len", agent->region.len()},
                {"block_bytes", agent->region.block_bytes}, {"blocks", agent->region.blocks}});
        }
      } else if (c == "load_remote") {
        Emit(LoadRemote(*agent, cmd["agent"], Unhex(cmd["conn"]), Unhex(cmd.value("md", std::string())),
                        cmd.value("addr", uint64_t{0}), cmd.value("len", uint64_t{0}),
                        cmd.value("block_bytes", uint64_t{0})));
      } else if (c == "unload_remote") {
        UnloadRemote(*agent, cmd["agent"]);
        Emit({{"event", "unloaded"}});
      } else if (c == "xfer") {
        XferSpec s = SpecTo(*agent, cmd.value("remote", std::string()));
        if (s.remote_md == nullptr) {
          Emit({{"event", "xfer"}, {"error", "no metadata of that agent loaded"}, {"status", NIXL_ERR_NOT_FOUND}});
          continue;
        }
        s.op = cmd.value("op", "WRITE") == std::string("READ") ? NIXL_READ : NIXL_WRITE;
        s.blocks = Ids(cmd["blocks"]);
        s.remote_blocks = Ids(cmd["remote_blocks"]);
        if (cmd.contains("notif")) s.notif = cmd["notif"].get<std::string>();
        if (cmd.contains("notif_hex")) s.notif = Unhex(cmd["notif_hex"]);
        s.posts = cmd.value("reposts", 1);
        s.probe_repost = cmd.value("probe_repost", false);
        s.until_error = cmd.value("until_error", false);
        if (cmd.contains("check_seed")) s.check_seed = cmd["check_seed"].get<uint64_t>();
        bool progress = false;
        XferResult r = DoXfer(*agent, s, [&](int) {
          if (s.until_error && !progress) {
            progress = true;
            Emit({{"event", "progress"}});
          }
        });
        Emit(ResultJson(r));
      } else if (c == "release_in_flight") {
        // A post, then releaseReqH before any checkXfer: returns at once; its
        // notification is never sent.
        XferSpec s = SpecTo(*agent, cmd.value("remote", std::string()));
        nixl_meta_dlist_t local(DRAM_SEG), remote(DRAM_SEG);
        for (uint64_t b = 0; b < agent->region.blocks; ++b) {
          local.addDesc(nixlMetaDesc(reinterpret_cast<uintptr_t>(agent->region.Block(b)), agent->region.block_bytes,
                                     0, agent->region.md));
          remote.addDesc(nixlMetaDesc(s.remote_addr + b * s.remote_block_bytes, agent->region.block_bytes, 0,
                                      s.remote_md));
        }
        nixlBackendOptionalArgs opt;
        opt.hasNotif = true;
        opt.notifMsg = cmd.value("notif", std::string("released"));
        nixlBackendReqH* h = nullptr;
        nixl_status_t prep = agent->eng->prepXfer(NIXL_WRITE, local, remote, s.agent, h, &opt);
        nixl_status_t post = prep == NIXL_SUCCESS ? agent->eng->postXfer(NIXL_WRITE, local, remote, s.agent, h, &opt)
                                                  : prep;
        auto t0 = Clock::now();
        nixl_status_t rel = h != nullptr ? agent->eng->releaseReqH(h) : NIXL_ERR_INVALID_PARAM;
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        Emit({{"event", "released"}, {"prep", prep}, {"post", post}, {"status", rel}, {"ms", ms}});
      } else if (c == "notifs") {
        nixl_status_t st;
        auto got = CollectNotifs(*agent, cmd.value("want", 1), cmd.value("timeout_ms", 10000), &st);
        json j = NotifsJson(got);
        j["event"] = "notifs";
        j["status"] = st;
        Emit(j);
      } else if (c == "gen_notif") {
        std::string msg = cmd.contains("msg_hex") ? Unhex(cmd["msg_hex"]) : cmd.value("msg", std::string());
        if (cmd.contains("msg_bytes")) msg.assign(cmd["msg_bytes"].get<size_t>(), 'm');
        Emit({{"event", "notified"}, {"status", agent->eng->genNotif(cmd["agent"], msg)}});
      } else if (c == "check") {
        std::vector<uint64_t> blocks = Ids(cmd["blocks"]);
        std::vector<uint64_t> src = cmd.contains("src_blocks") ? Ids(cmd["src_blocks"]) : blocks;
        std::string where;
        bool ok = blocks.size() == src.size() && CheckBlocks(agent->region, cmd.value("seed", 0), blocks, src, &where);
        Emit({{"event", "checked"}, {"ok", ok}, {"where", where}});
      } else if (c == "threads") {
        Emit(Threads(*agent, cmd));
      } else if (c == "second_agent") {
        Emit(SecondAgent(*agent, cmd.value("agent", agent->name + "-2")));
      } else if (c == "garbage") {
        Emit(Garbage(*agent));
        SkipLog("garbage");
      } else if (c == "log") {
        Emit({{"event", "log"}, {"text", ReadLog()}});
      } else if (c == "quit") {
        Shutdown(*agent, /*agent_destructor_order=*/true);
        agent.reset();
        g_plugin = nullptr;
        Emit({{"event", "bye"}});
        PassLog();
        return 0;
      } else {
        Emit({{"event", "error"}, {"error", "unknown command " + c}});
      }
    } catch (const std::exception& e) {
      Emit({{"event", "error"}, {"error", std::string("exception: ") + e.what()}});
    }
    PassLog();
  }
  return 0;
}
