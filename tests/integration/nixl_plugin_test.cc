// libplugin_PODLINK.so, the NIXL backend plugin, driven the way NIXL 1.4's
// agent drives a backend (tests/nixl/nixl_peer.cc plays the agent; CI has no
// NIXL) between "pods" (own namespaces, kubepods cgroups) of one podlinkd:
//   * vLLM's pull: decode loads prefill's connection info and metadata, READs
//     scattered blocks with notification "req-7:1"; prefill, which never
//     loaded decode's metadata, then receives ("decode-agent", "req-7:1");
//   * the push: prefill WRITEs into decode with a binary notification; binary
//     genNotif payloads of several KiB, and one too long;
//   * reposts of one prepared handle (REPOST_ACTIVE while in flight);
//   * posts from 8 threads at once; a second agent in one process, self
//     transfers and self notifications;
//   * a peer killed mid-transfer: a NIXL error, podlinkd's exports back;
//   * a pod of another peer group: NIXL_ERR_NOT_ALLOWED with podlinkd's reason;
//   * malformed connection info, metadata and notification frames;
//   * releaseReqH of a transfer in flight;
//   * the plugin's dynamic symbols: nixl_plugin_init and nixl_plugin_fini only.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

using json = nlohmann::json;

// NIXL's status codes (client-lib/nixl/nixl_abi.h), as the peer reports them.
constexpr int kSuccess = 0, kInvalidParam = -2, kBackend = -3, kNotAllowed = -6, kRepostActive = -7,
              kRemoteDisconnect = -10;

std::string Env(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : dflt;
}
std::string PluginPath() { return Env("PODLINK_NIXL_PLUGIN_PATH", PLUGIN_PATH); }
std::string PeerPath() { return Env("PODLINK_NIXL_PEER_PATH", NIXL_PEER_PATH); }

std::string Rule(const PodCgroup& cg, const std::string& name, const std::string& group) {
  return absl::StrCat(R"({"match": {"pod_uid": ")", cg.pod_uid(), R"("}, "namespace": "ml", "name": ")", name,
                      R"(", "annotations": {"podlink.io/peer-group": ")", group, R"("}})");
}

std::string HexOf(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) o += {d[c >> 4], d[c & 15]};
  return o;
}

// One pod running nixl_peer with one agent.
struct Peer {
  std::unique_ptr<Pod> pod;
  std::string agent;
  json ready, reg;
};

class NixlPlugin : public ::testing::Test {
 protected:
  NixlPlugin()
      : prefill_cg_(RandomPodUid(), "burstable"),
        decode_cg_(RandomPodUid(), "burstable"),
        intruder_cg_(RandomPodUid(), "burstable"),
        daemon_(absl::StrCat(R"({"pods": [)", Rule(prefill_cg_, "prefill-0", "job-1"), ",",
                             Rule(decode_cg_, "decode-0", "job-1"), ",", Rule(intruder_cg_, "intruder-0", "other"),
                             "]}")) {}

  Peer Start(const PodCgroup& cg, const std::string& agent, std::vector<std::string> env = {}) {
    Peer p;
    std::vector<std::string> args = {PluginPath()};
    args.insert(args.end(), env.begin(), env.end());
    p.pod = std::make_unique<Pod>(daemon_, &cg, args, PeerPath());
    p.agent = agent;
    p.pod->Send(json({{"cmd", "init"}, {"agent", agent}}).dump());
    p.ready = p.pod->Expect("ready");
    EXPECT_EQ(p.ready["event"], "ready") << p.ready.dump();
    EXPECT_EQ(p.ready["mems"], json::array({0, 1})) << p.ready.dump();  // DRAM_SEG, VRAM_SEG
    EXPECT_EQ(p.ready["options"], 0);
    return p;
  }

  static void Alloc(Peer& p, int blocks, int block_bytes, int seed) {
    p.pod->Send(json({{"cmd", "alloc"}, {"blocks", blocks}, {"block_bytes", block_bytes}, {"seed", seed}}).dump());
    p.reg = p.pod->Expect("registered");
    ASSERT_EQ(p.reg["status"], kSuccess) << p.reg.dump();
  }

  // `self` loads `other`'s connection info and metadata (add_remote_agent).
  static json Load(Peer& self, const Peer& other) {
    self.pod->Send(json({{"cmd", "load_remote"},
                         {"agent", other.agent},
                         {"conn", other.ready["conn"]},
                         {"md", other.reg["md"]},
                         {"addr", other.reg["addr"]},
                         {"len", other.reg["len"]},
                         {"block_bytes", other.reg["block_bytes"]}})
                       .dump());
    return self.pod->Expect("loaded");
  }

  static json Notifs(Peer& p, int want, int timeout_ms = 10000) {
    p.pod->Send(json({{"cmd", "notifs"}, {"want", want}, {"timeout_ms", timeout_ms}}).dump());
    json n = p.pod->Expect("notifs", timeout_ms + 20000);
    EXPECT_EQ(n["status"], kSuccess) << n.dump();  // getNotifs never fails
    return n;
  }

  PodCgroup prefill_cg_, decode_cg_, intruder_cg_;
  Daemon daemon_;
};

// vLLM's pull: decode READs scattered prefill blocks; prefill learns of it
// by notification, under decode's agent name, after the data is in place.
TEST_F(NixlPlugin, DecodeReadsScatteredBlocksAndNotifiesPrefill) {
  Peer prefill = Start(prefill_cg_, "prefill-agent"), decode = Start(decode_cg_, "decode-agent");
  Alloc(prefill, 64, 4096, 1);
  Alloc(decode, 32, 4096, 2);
  json l = Load(decode, prefill);
  ASSERT_EQ(l["conn_status"], kSuccess) << l.dump();
  ASSERT_EQ(l["md_status"], kSuccess) << l.dump();
  EXPECT_EQ(Notifs(prefill, 1, 100)["list"].size(), 0u);  // nothing before the transfer

  decode.pod->Send(json({{"cmd", "xfer"},
                         {"op", "READ"},
                         {"remote", "prefill-agent"},
                         {"blocks", {0, 3, 4, 5, 9, 20, 31}},
                         {"remote_blocks", {7, 1, 2, 3, 40, 63, 0}},
                         {"notif", "req-7:1"},
                         {"check_seed", 1}})
                       .dump());
  json x = decode.pod->Expect("xfer");
  // The data first: checkXfer said SUCCESS and decode's blocks hold prefill's.
  ASSERT_EQ(x["status"], kSuccess) << x.dump();
  EXPECT_TRUE(x["data_ok"].get<bool>()) << x.dump();
  json n = Notifs(prefill, 1);
  EXPECT_EQ(n["text"], json::array({json::array({"decode-agent", "req-7:1"})})) << n.dump();
  // Exactly once.
  EXPECT_EQ(Notifs(prefill, 1, 200)["list"].size(), 0u);
}

// The push: prefill WRITEs into decode; binary notifications of several KiB.
TEST_F(NixlPlugin, PrefillWritesWithBinaryNotifications) {
  Peer prefill = Start(prefill_cg_, "prefill-agent"), decode = Start(decode_cg_, "decode-agent");
  Alloc(prefill, 16, 8192, 3);
  Alloc(decode, 16, 8192, 4);
  ASSERT_EQ(Load(prefill, decode)["md_status"], kSuccess);
  ASSERT_EQ(Load(decode, prefill)["conn_status"], kSuccess);
  std::string bin("PUSH_REG:\0\x01\x02\xff", 13);
  bin += std::string(3000, '\x7f');
  prefill.pod->Send(json({{"cmd", "xfer"},
                          {"op", "WRITE"},
                          {"remote", "decode-agent"},
                          {"blocks", {1, 2, 3, 10}},  // 1-3 -> 5-7: contiguous on both sides, merged
                          {"remote_blocks", {5, 6, 7, 0}},
                          {"notif_hex", HexOf(bin)}})
                        .dump());
  json x = prefill.pod->Expect("xfer");
  ASSERT_EQ(x["status"], kSuccess) << x.dump();
  decode.pod->Send(R"({"cmd": "check", "seed": 3, "blocks": [5, 6, 7, 0], "src_blocks": [1, 2, 3, 10]})");
  EXPECT_TRUE(decode.pod->Expect("checked")["ok"].get<bool>());
  json n = Notifs(decode, 1);
  ASSERT_EQ(n["list"].size(), 1u) << n.dump();
  EXPECT_EQ(n["list"][0][0], "prefill-agent");
  EXPECT_EQ(n["list"][0][1], HexOf(bin));

  // genNotif with bytes: the longest "decode-agent" may send (4096 - 2 - 12), then one byte more.
  decode.pod->Send(R"({"cmd": "gen_notif", "agent": "prefill-agent", "msg_bytes": 4082})");
  EXPECT_EQ(decode.pod->Expect("notified")["status"], kSuccess);
  decode.pod->Send(R"({"cmd": "gen_notif", "agent": "prefill-agent", "msg_bytes": 4083})");
  EXPECT_EQ(decode.pod->Expect("notified")["status"], kInvalidParam);
  n = Notifs(prefill, 1);
  ASSERT_EQ(n["text"].size(), 1u);
  EXPECT_EQ(n["text"][0][0], "decode-agent");
  EXPECT_EQ(n["text"][0][1].get<std::string>(), std::string(4082, 'm'));
  decode.pod->Send(R"({"cmd": "log"})");
  EXPECT_NE(decode.pod->Expect("log")["text"].get<std::string>().find("too long"), std::string::npos);
}

TEST_F(NixlPlugin, RepostsOfOnePreparedHandle) {
  Peer prefill = Start(prefill_cg_, "prefill-agent"), decode = Start(decode_cg_, "decode-agent");
  Alloc(prefill, 8, 65536, 5);
  Alloc(decode, 8, 65536, 6);
  ASSERT_EQ(Load(decode, prefill)["md_status"], kSuccess);
  decode.pod->Send(json({{"cmd", "xfer"},
                         {"op", "READ"},
                         {"remote", "prefill-agent"},
                         {"blocks", {0, 1, 2, 3, 4, 5, 6, 7}},
                         {"remote_blocks", {7, 6, 5, 4, 3, 2, 1, 0}},
                         {"notif", "req-8:0"},
                         {"reposts", 5},
                         {"probe_repost", true},
                         {"check_seed", 5}})
                       .dump());
  json x = decode.pod->Expect("xfer");
  EXPECT_EQ(x["status"], kSuccess) << x.dump();
  EXPECT_EQ(x["posts"], 5);
  EXPECT_EQ(x["repost_active"], kRepostActive) << x.dump();  // a post while the first was in flight
  EXPECT_TRUE(x["data_ok"].get<bool>());
  json n = Notifs(prefill, 5);
  ASSERT_EQ(n["text"].size(), 5u) << n.dump();
  for (auto& e : n["text"]) EXPECT_EQ(e, json::array({"decode-agent", "req-8:0"}));
}

TEST_F(NixlPlugin, PostsFromEightThreads) {
  Peer prefill = Start(prefill_cg_, "prefill-agent"), decode = Start(decode_cg_, "decode-agent");
  Alloc(prefill, 16, 16384, 7);
  Alloc(decode, 16, 16384, 8);
  ASSERT_EQ(Load(decode, prefill)["md_status"], kSuccess);
  decode.pod->Send(R"({"cmd": "threads", "n": 8, "iters": 4, "op": "WRITE", "blocks_per_thread": 2, )"
                   R"("remote": "prefill-agent"})");
  json t = decode.pod->Expect("threads", 60000);
  EXPECT_TRUE(t["ok"].get<bool>()) << t.dump();
  json n = Notifs(prefill, 32, 20000);
  std::set<std::string> got, want;
  for (auto& e : n["text"]) {
    EXPECT_EQ(e[0], "decode-agent");
    got.insert(e[1].get<std::string>());
  }
  for (int th = 0; th < 8; ++th) {
    for (int k = 0; k < 4; ++k) want.insert(absl::StrCat("t", th, ":", k));
  }
  EXPECT_EQ(n["text"].size(), 32u);
  EXPECT_EQ(got, want);
  std::vector<int> blocks;
  for (int b = 0; b < 16; ++b) blocks.push_back(b);
  prefill.pod->Send(json({{"cmd", "check"}, {"seed", 8}, {"blocks", blocks}}).dump());
  EXPECT_TRUE(prefill.pod->Expect("checked")["ok"].get<bool>());
}

TEST_F(NixlPlugin, SecondAgentInOneProcess) {
  Peer decode = Start(decode_cg_, "decode-agent");
  Alloc(decode, 16, 4096, 9);
  decode.pod->Send(R"({"cmd": "second_agent", "agent": "decode-agent-2"})");
  json s = decode.pod->Expect("second_agent", 60000);
  EXPECT_TRUE(s.value("ok", false)) << s.dump();
  // The first agent still works afterwards (its own session and engine).
  decode.pod->Send(R"({"cmd": "xfer", "op": "WRITE", "remote": "decode-agent", "blocks": [0], "remote_blocks": [15], )"
                   R"("notif": "self-after"})");
  EXPECT_EQ(decode.pod->Expect("xfer")["status"], kSuccess);
  EXPECT_EQ(Notifs(decode, 1)["text"], json::array({json::array({"decode-agent", "self-after"})}));
}

// A peer that dies mid-transfer: the transfer fails with a NIXL error, and
// podlinkd drops what the dead pod exported.
TEST_F(NixlPlugin, PeerKilledMidTransfer) {
  std::optional<double> baseline = daemon_.Metric("podlink_exports");
  ASSERT_TRUE(baseline.has_value()) << daemon_.Log();
  // Through podlinkd's relay: a mapping of the dead peer's memory would stay readable.
  Peer prefill = Start(prefill_cg_, "prefill-agent", {"PODLINK_NIXL_FORCE_RELAY=1"});
  Peer decode = Start(decode_cg_, "decode-agent", {"PODLINK_NIXL_FORCE_RELAY=1"});
  Alloc(prefill, 64, 65536, 10);
  Alloc(decode, 64, 65536, 11);
  ASSERT_EQ(Load(decode, prefill)["md_status"], kSuccess);
  std::vector<int> blocks;
  for (int b = 0; b < 64; ++b) blocks.push_back(b);
  decode.pod->Send(json({{"cmd", "xfer"},
                         {"op", "READ"},
                         {"remote", "prefill-agent"},
                         {"blocks", blocks},
                         {"remote_blocks", blocks},
                         {"until_error", true}})
                       .dump());
  ASSERT_EQ(decode.pod->Expect("progress")["event"], "progress");
  prefill.pod->Kill(SIGKILL);
  prefill.pod->Wait();
  json x = decode.pod->Expect("xfer", 120000);
  EXPECT_TRUE(x["status"] == kRemoteDisconnect || x["status"] == kBackend) << x.dump();
  EXPECT_GE(x["posts"].get<int>(), 1);
  // getNotifs still succeeds.
  Notifs(decode, 1, 100);
  // The dead pod's exports (mailbox, region) go; decode's two stay; then decode's too.
  auto wait_exports = [&](double want) {
    for (int i = 0; i < 1000 && daemon_.Metric("podlink_exports") != std::optional<double>(want); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return daemon_.Metric("podlink_exports");
  };
  EXPECT_EQ(wait_exports(*baseline + 2), std::optional<double>(*baseline + 2));
  decode.pod->Send(R"({"cmd": "quit"})");
  EXPECT_EQ(decode.pod->Expect("bye")["event"], "bye");
  EXPECT_EQ(decode.pod->Wait(), 0);
  EXPECT_EQ(wait_exports(*baseline), std::optional<double>(*baseline));
}

TEST_F(NixlPlugin, OtherPeerGroupIsNotAllowed) {
  Peer prefill = Start(prefill_cg_, "prefill-agent"), intruder = Start(intruder_cg_, "intruder-agent");
  Alloc(prefill, 4, 4096, 12);
  Alloc(intruder, 4, 4096, 13);
  json l = Load(intruder, prefill);
  EXPECT_EQ(l["conn_status"], kNotAllowed) << l.dump();
  intruder.pod->Send(R"({"cmd": "log"})");
  std::string log = intruder.pod->Expect("log")["text"];
  // podlinkd's reason, as the plugin logged it.
  EXPECT_NE(log.find("podlink-nixl: "), std::string::npos) << log;
  EXPECT_NE(log.find("PERMISSION_DENIED"), std::string::npos) << log;
  EXPECT_NE(log.find("peer group 'other'"), std::string::npos) << log;
}

TEST_F(NixlPlugin, GarbageIsRefused) {
  Peer prefill = Start(prefill_cg_, "prefill-agent");
  Alloc(prefill, 4, 4096, 14);
  prefill.pod->Send(R"({"cmd": "garbage"})");
  json g = prefill.pod->Expect("garbage", 120000);
  ASSERT_EQ(g["event"], "garbage") << g.dump();
  EXPECT_EQ(g["unexpected"], json::array()) << g.dump();
  EXPECT_GT(g["invalid"].get<int>(), 1000) << g.dump();
  // Malformed frames dropped, the good one delivered, getNotifs succeeded.
  EXPECT_EQ(g["frames"]["status"], kSuccess) << g.dump();
  EXPECT_TRUE(g["frames"]["good_sent"].get<bool>()) << g.dump();
  EXPECT_EQ(g["frames"]["got"], json::array({json::array({"evil", "hello"})})) << g.dump();
  // Still serving.
  prefill.pod->Send(
      R"({"cmd": "xfer", "op": "WRITE", "remote": "prefill-agent", "blocks": [0], "remote_blocks": [1]})");
  EXPECT_EQ(prefill.pod->Expect("xfer")["status"], kSuccess);
}

TEST_F(NixlPlugin, ReleaseInFlightReturnsAtOnce) {
  Peer prefill = Start(prefill_cg_, "prefill-agent"), decode = Start(decode_cg_, "decode-agent");
  Alloc(prefill, 64, 65536, 15);
  Alloc(decode, 64, 65536, 16);
  ASSERT_EQ(Load(decode, prefill)["md_status"], kSuccess);
  decode.pod->Send(R"({"cmd": "release_in_flight", "remote": "prefill-agent", "notif": "released-1"})");
  json r = decode.pod->Expect("released");
  EXPECT_EQ(r["prep"], kSuccess) << r.dump();
  EXPECT_EQ(r["post"], 1) << r.dump();  // NIXL_IN_PROG
  EXPECT_EQ(r["status"], kSuccess) << r.dump();
  std::printf("releaseReqH of a 4 MiB transfer in flight took %.3f ms\n", r["ms"].get<double>());
  decode.pod->Send(R"({"cmd": "xfer", "op": "WRITE", "remote": "prefill-agent", "blocks": [2], "remote_blocks": [3], )"
                   R"("notif": "after-1"})");
  EXPECT_EQ(decode.pod->Expect("xfer")["status"], kSuccess);
  // The released transfer's notification is never sent; the next one arrives.
  json n = Notifs(prefill, 2, 1000);
  EXPECT_EQ(n["text"], json::array({json::array({"decode-agent", "after-1"})})) << n.dump();
  decode.pod->Send(R"({"cmd": "quit"})");
  EXPECT_EQ(decode.pod->Expect("bye")["event"], "bye");
  EXPECT_EQ(decode.pod->Wait(), 0);
}

// Only NIXL's two entry points are exported (the version script hides the
// rest: podlink's, Abseil's and the ABI copies).
TEST(NixlPluginExports, OnlyTheEntryPoints) {
  std::string cmd = "nm -D --defined-only '" + PluginPath() + "'";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), f)) out.append(buf, n);
  ASSERT_EQ(pclose(f), 0) << cmd;
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f3 = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (!f3.empty()) names.insert(f3.back());
  }
  EXPECT_EQ(names, (std::set<std::string>{"nixl_plugin_fini", "nixl_plugin_init"})) << out;
}

}  // namespace
}  // namespace podlink::testing
