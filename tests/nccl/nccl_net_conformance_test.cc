// Conformance of libnccl-net-podlink.so, driven the way NCCL's proxy drives a
// net plugin, between two "pods" (own PID, UTS, IPC, network and mount
// namespaces, kubepods cgroups, a veth pair between them) on host memory:
//   podlink transport (same node: control region shared through podlinkd,
//   bytes through the shared mapping or, forced, podlinkd's relay) and TCP
//   (the other-node transport, over the veth). Each mode runs every scenario:
//   connect/accept retries, ordering with 32 receives in flight, a 33rd
//   receive refused, large messages, grouped receives, receives larger than
//   the send, zero bytes, truncation errors, closing with requests in flight,
//   a receive read only after its sender closed, corrupted handles, and
//   finalize + dlclose leaving no thread behind.
// The GpuModes run the same on GPU memory (cuMem allocations on GPU 0, one
// exportable and one that needs the plugin's bounce buffer, and TCP's
// staging); they skip without a GPU (tests/gpu/run_one_gpu.sh runs them).
#include <dlfcn.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/nccl_net_abi.h"
#include "common/cuda_driver.h"
#include "gtest/gtest.h"
#include "podlink/client.h"
#include "tests/common/pod_cgroup.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

using json = nlohmann::json;

// Binaries as built, unless the environment points elsewhere (the GPU
// machine runs a carried bundle), and `ip` (the GPU machine runs a bundled one).
std::string Env(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : dflt;
}
std::string PluginPath() { return Env("PODLINK_NCCL_PLUGIN_PATH", PLUGIN_PATH); }
std::string PeerPath() { return Env("PODLINK_NCCL_PEER_PATH", NCCL_NET_PEER_PATH); }
std::string Ip() { return Env("PODLINK_TEST_IP", "ip"); }

bool HaveGpu() {
  auto d = cu::LoadDriver();
  int n = 0;
  return d.ok() && (*d)->DeviceGetCount(&n) == cu::kSuccess && n > 0;
}

struct Mode {
  const char* name;
  std::vector<std::string> env;
  const char* transport;
  bool v8 = false;
  bool relay = false;
  bool gpu = false;  // buffers in GPU memory (env PODLINK_TEST_MEM), podlinkd with CUDA
};
void PrintTo(const Mode& m, std::ostream* os) { *os << m.name; }

class NcclNet : public ::testing::TestWithParam<Mode> {
 protected:
  NcclNet()
      : recv_cg_(RandomPodUid(), "burstable"),
        send_cg_(RandomPodUid(), "burstable"),
        daemon_(absl::StrCat(R"({"pods": [)", Rule(recv_cg_, "decode-0"), ",", Rule(send_cg_, "prefill-0"), "]}"),
                {}, GetParam().gpu) {}

  static std::string Rule(const PodCgroup& cg, const std::string& name) {
    return absl::StrCat(R"({"match": {"pod_uid": ")", cg.pod_uid(), R"("}, "namespace": "ml", "name": ")", name,
                        R"(", "annotations": {"podlink.io/peer-group": "job-1"}})");
  }

  void SetUp() override {
    if (GetParam().gpu && !HaveGpu()) GTEST_SKIP() << "no GPU";
    std::vector<std::string> args = GetParam().env;
    if (GetParam().v8) args.insert(args.begin(), "v8");
    args.insert(args.begin(), PluginPath());
    recv_ = std::make_unique<Pod>(daemon_, &recv_cg_, args, PeerPath());
    send_ = std::make_unique<Pod>(daemon_, &send_cg_, args, PeerPath());
    // Joined by a veth pair (tests/common/pod_cgroup.h), as the shell scripts' pod_veth does.
    absl::Status veth = PodVeth(recv_->pid(), send_->pid(), absl::StrCat("pln", getpid() % 100000, "a"),
                                absl::StrCat("pln", getpid() % 100000, "b"), "10.77.0.1/24", "10.77.0.2/24", Ip());
    ASSERT_TRUE(veth.ok()) << veth;
    for (Pod* p : {recv_.get(), send_.get()}) {
      json init = {{"cmd", "init"}};
      if (!step_trace_.empty()) init["step_trace"] = step_trace_;
      p->Send(init.dump());
      json r = p->Expect("ready");
      ASSERT_EQ(r["result"], 0) << r.dump();
      ASSERT_EQ(r["gpu"], GetParam().gpu) << r.dump();
      ASSERT_GE(r["ndev"], 1);
      // With podlinkd the plugin defaults NCCL_MIN_NCHANNELS, NCCL_BUFFSIZE,
      // the point-to-point settings for the relay and Simple for send/recv
      // (NCCL_P2P_LL_THRESHOLD=0; never NCCL_PROTO, which would bind NCCL's
      // own transport too: the tuner keeps collectives that span pods on
      // Simple), keeps a user's choice (PODLINK_NCCL_KEEP_P2P=1: NCCL's own
      // point-to-point; a user's NCCL_PROTO), and leaves them alone without
      // podlinkd.
      bool daemon = GetParam().transport != std::string("TCP");
      bool p2p = daemon;
      for (const std::string& e : GetParam().env) p2p &= e != "PODLINK_NCCL_KEEP_P2P=1";
      bool user_proto = false;
      for (const std::string& e : GetParam().env) user_proto |= e.rfind("NCCL_PROTO=", 0) == 0;
      std::map<std::string, std::string> want = {{"NCCL_PROTO", ""},
                                                 {"NCCL_P2P_LL_THRESHOLD", daemon && !user_proto ? "0" : ""},
                                                 {"NCCL_MIN_NCHANNELS", daemon ? "16" : ""},
                                                 {"NCCL_BUFFSIZE", daemon ? "16777216" : ""},
                                                 {"NCCL_NCHANNELS_PER_NET_PEER", p2p ? "16" : ""},
                                                 {"NCCL_MIN_P2P_NCHANNELS", ""},  // they bind NCCL's own P2P too
                                                 {"NCCL_MAX_P2P_NCHANNELS", ""},
                                                 {"NCCL_P2P_NET_CHUNKSIZE", p2p ? "2097152" : ""}};
      for (const std::string& e : GetParam().env) {
        size_t eq = e.find('=');
        if (want.count(e.substr(0, eq))) want[e.substr(0, eq)] = e.substr(eq + 1);
      }
      EXPECT_EQ(r["nccl_proto"], want["NCCL_PROTO"]) << r.dump();
      EXPECT_EQ(r["nccl_p2p_ll_threshold"], want["NCCL_P2P_LL_THRESHOLD"]) << r.dump();
      EXPECT_EQ(r["nccl_min_nchannels"], want["NCCL_MIN_NCHANNELS"]) << r.dump();
      EXPECT_EQ(r["nccl_buffsize"], want["NCCL_BUFFSIZE"]) << r.dump();
      EXPECT_EQ(r["nccl_nchannels_per_net_peer"], want["NCCL_NCHANNELS_PER_NET_PEER"]) << r.dump();
      EXPECT_EQ(r["nccl_min_p2p_nchannels"], want["NCCL_MIN_P2P_NCHANNELS"]) << r.dump();
      EXPECT_EQ(r["nccl_max_p2p_nchannels"], want["NCCL_MAX_P2P_NCHANNELS"]) << r.dump();
      EXPECT_EQ(r["nccl_p2p_net_chunksize"], want["NCCL_P2P_NET_CHUNKSIZE"]) << r.dump();
    }
  }

  // listen in the receiver pod, connect from the sender pod; returns the handle.
  std::string Connect(bool delay_accept = false) {
    recv_->Send(R"({"cmd": "listen"})");
    json h = recv_->Expect("handle");
    EXPECT_EQ(h["result"], 0);
    send_->Send(json{{"cmd", "connect"}, {"hex", h["hex"]}}.dump());
    // Accepting late makes the connector come back with NULL comms first.
    if (delay_accept) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    recv_->Send(R"({"cmd": "accept"})");
    json acc = recv_->Expect("accepted");
    json con = send_->Expect("connected");
    EXPECT_TRUE(acc["ok"]) << acc.dump();
    EXPECT_TRUE(con["ok"]) << con.dump();
    EXPECT_EQ(con["transport"], GetParam().transport) << con.dump();
    if (delay_accept) {
      EXPECT_GT(con["tries"].get<int>(), 1) << "connect should have returned a NULL comm while accept had not run";
    }
    return h["hex"];
  }

  void Scenario(const std::string& name) {
    SCOPED_TRACE(name);
    Connect(name == "ordering");
    send_->Send(json{{"cmd", "send"}, {"scenario", name}}.dump());
    recv_->Send(json{{"cmd", "recv"}, {"scenario", name}}.dump());
    json s = send_->Expect("done", 60000);
    json r = recv_->Expect("done", 60000);
    EXPECT_TRUE(s["ok"]) << s.dump();
    EXPECT_TRUE(r["ok"]) << r.dump();
    if (name == "ordering") {
      EXPECT_EQ(r["33rd_result"], 0) << r.dump();
      EXPECT_TRUE(r["33rd_null"]) << "a 33rd receive with 32 in flight must get a NULL request";
    }
    send_->Send(R"({"cmd": "close", "listen": true})");
    recv_->Send(R"({"cmd": "close", "listen": true})");
    EXPECT_EQ(send_->Expect("closed")["result"], 0);
    EXPECT_EQ(recv_->Expect("closed")["result"], 0);
  }

  std::string step_trace_;  // set before SetUp: PODLINK_NCCL_STEP_TRACE for both pods
  PodCgroup recv_cg_, send_cg_;
  Daemon daemon_;
  std::unique_ptr<Pod> recv_, send_;
};

// Counters from podlinkd's /metrics (node-wide stats over gRPC need root
// outside any container, which the GPU machine's test process is not).
TEST_P(NcclNet, EveryScenario) {
  std::optional<double> before = daemon_.Metric("podlink_relay_ops_total");
  ASSERT_TRUE(before.has_value());
  for (const char* sc : {"ordering", "large", "grouped", "smaller", "truncate", "inflight-close"}) Scenario(sc);
  std::optional<double> after = daemon_.Metric("podlink_relay_ops_total");
  ASSERT_TRUE(after.has_value());
  if (GetParam().relay) {
    EXPECT_GT(*after, *before + 32) << "podlinkd's relay should have moved the bytes";
  } else {
    EXPECT_EQ(*after, *before);
  }
}

// One small message at a time (NCCL's sendrecv of a small size), every
// message checked; the time per message is reported, not asserted.
TEST_P(NcclNet, SmallMessagesOneAtATime) {
  Connect();
  send_->Send(R"({"cmd": "send", "scenario": "latency"})");
  recv_->Send(R"({"cmd": "recv", "scenario": "latency"})");
  json s = send_->Expect("done", 120000);
  json r = recv_->Expect("done", 120000);
  ASSERT_TRUE(s["ok"]) << s.dump();
  ASSERT_TRUE(r["ok"]) << r.dump();
  std::printf("%s: us per message %s\n", GetParam().name, r["us_per_message"].dump().c_str());
  for (auto& [size, us] : r["us_per_message"].items()) {
    RecordProperty(absl::StrCat("us_per_message_", size), absl::StrCat(us.get<double>()));
  }
}

TEST_P(NcclNet, CorruptedHandlesFailCleanly) {
  recv_->Send(R"({"cmd": "listen"})");
  json h = recv_->Expect("handle");
  for (const char* how : {"garbage", "magic"}) {
    send_->Send(json{{"cmd", "connect"}, {"hex", h["hex"]}, {"corrupt", how}, {"timeout_ms", 5000}}.dump());
    json con = send_->Expect("connected");
    EXPECT_FALSE(con["ok"]) << how;
    EXPECT_EQ(con["result"], nccl_abi::kInvalidArgument) << how << ": " << con.dump();
  }
  // A handle whose nonce was altered reaches the listener, which drops it:
  // the connector gets an error, the listener no comm.
  send_->Send(json{{"cmd", "connect"}, {"hex", h["hex"]}, {"corrupt", "nonce"}, {"timeout_ms", 5000}}.dump());
  recv_->Send(R"({"cmd": "accept", "timeout_ms": 1500})");
  json acc = recv_->Expect("accepted");
  json con = send_->Expect("connected");
  EXPECT_FALSE(acc["ok"]) << acc.dump();
  EXPECT_FALSE(con["ok"]) << con.dump();
  EXPECT_NE(con["result"], 0) << con.dump();
  // The same listen comm still accepts the genuine peer.
  send_->Send(json{{"cmd", "connect"}, {"hex", h["hex"]}}.dump());
  recv_->Send(R"({"cmd": "accept"})");
  EXPECT_TRUE(recv_->Expect("accepted")["ok"]);
  EXPECT_TRUE(send_->Expect("connected")["ok"]);
  send_->Send(json{{"cmd", "send"}, {"scenario", "smaller"}}.dump());
  recv_->Send(json{{"cmd", "recv"}, {"scenario", "smaller"}}.dump());
  EXPECT_TRUE(send_->Expect("done")["ok"]);
  EXPECT_TRUE(recv_->Expect("done")["ok"]);
}

// NCCL's last send of a job completes, the sender's process destroys its
// communicator and exits at once; the receiver is still due those bytes.
TEST_P(NcclNet, ReceiveCompletesAfterTheSenderClosed) {
  Connect();
  recv_->Send(json{{"cmd", "recv"}, {"scenario", "close-after-send"}}.dump());
  recv_->Expect("posted");
  send_->Send(json{{"cmd", "send"}, {"scenario", "close-after-send"}}.dump());
  json s = send_->Expect("done");
  EXPECT_TRUE(s["ok"]) << s.dump();
  recv_->Send("go");
  json r = recv_->Expect("done");
  EXPECT_TRUE(r["ok"]) << r.dump();
  recv_->Send(R"({"cmd": "close", "listen": true})");
  send_->Send(R"({"cmd": "close", "listen": true})");
  EXPECT_EQ(recv_->Expect("closed")["result"], 0);
  EXPECT_EQ(send_->Expect("closed")["result"], 0);
}

// The tuner in the plugin library: with podlinkd, collectives below 64 MiB get
// bytes / 4 MiB channels (at least 4); from 64 MiB, without podlinkd (TCP
// mode), for a communicator within one pod, or for send/recv, NCCL decides
// (0). It never touches NCCL's cost table and refuses a foreign context.
TEST_P(NcclNet, TunerPicksChannelsBySize) {
  const std::vector<size_t> sizes = {0, 1 << 20, 16 << 20, 32 << 20, 48 << 20, 64 << 20, size_t{1} << 30};
  bool daemon = GetParam().transport != std::string("TCP");
  std::vector<int> want = daemon ? std::vector<int>{4, 4, 4, 8, 12, 0, 0} : std::vector<int>(sizes.size(), 0);
  send_->Send(json{{"cmd", "tune"}, {"ranks", 2}, {"nodes", 2}, {"sizes", sizes}}.dump());
  json t = send_->Expect("tuned");
  EXPECT_EQ(t["name"], "podlink") << t.dump();
  EXPECT_EQ(t["init"], 0);
  EXPECT_EQ(t["channels"], json(want)) << t.dump();
  // Over the relay (two nodes, podlinkd) LL and LL128 are taken out of
  // NCCL's choices, Simple and the algorithms stay; without podlinkd, or
  // where the user chose NCCL_PROTO, nothing changes.
  bool user_proto = false;
  for (const std::string& e : GetParam().env) user_proto |= e.rfind("NCCL_PROTO=", 0) == 0;
  if (daemon && !user_proto) {
    json simple = json::array();
    for (int a = 0; a < 7; ++a) {
      simple.push_back(a == 1 ? json::array({-1.0, -1.0, 30.0}) : json::array({-1.0, -1.0, -1.0}));
    }
    EXPECT_EQ(t["table"], simple) << t.dump();
  } else {
    EXPECT_TRUE(t["table_unchanged"]) << t.dump();
  }
  EXPECT_EQ(t["foreign_context"], nccl_abi::kInvalidArgument);
  EXPECT_EQ(t["destroy"], 0);
  // One node (ranks of one pod talk over NCCL's own transports) and send/recv (5): untouched.
  send_->Send(json{{"cmd", "tune"}, {"ranks", 2}, {"nodes", 1}, {"sizes", {1 << 20}}}.dump());
  json one = send_->Expect("tuned");
  EXPECT_EQ(one["channels"], json::array({0}));
  EXPECT_TRUE(one["table_unchanged"]) << "within one pod NCCL keeps LL and LL128: " << one.dump();
  send_->Send(json{{"cmd", "tune"}, {"ranks", 2}, {"nodes", 2}, {"coll", 5}, {"sizes", {1 << 20}}}.dump());
  EXPECT_EQ(send_->Expect("tuned")["channels"], json::array({0}));
}

TEST_P(NcclNet, FinalizeReleasesEverything) {
  if (GetParam().v8) GTEST_SKIP() << "ncclNet_v8 has no finalize: NCCL before 2.28 keeps the plugin for the process";
  Connect();
  send_->Send(json{{"cmd", "send"}, {"scenario", "grouped"}}.dump());
  recv_->Send(json{{"cmd", "recv"}, {"scenario", "grouped"}}.dump());
  json sd = send_->Expect("done"), rd = recv_->Expect("done");
  EXPECT_TRUE(sd["ok"]) << sd.dump();
  EXPECT_TRUE(rd["ok"]) << rd.dump();
  for (Pod* p : {send_.get(), recv_.get()}) {
    p->Send(R"({"cmd": "close", "listen": true})");
    EXPECT_EQ(p->Expect("closed")["result"], 0);
    p->Send(R"({"cmd": "finalize"})");
    json f = p->Expect("finalized");
    EXPECT_EQ(f["result"], 0) << f.dump();
    EXPECT_EQ(f["dlclose"], 0) << f.dump();
    EXPECT_TRUE(f["reopen"]) << f.dump();
    EXPECT_EQ(f["dlclose2"], 0) << f.dump();
    // No thread of the plugin (or of the gRPC client inside it) outlives finalize.
    EXPECT_EQ(f["threads_after"], f["threads_before"]) << f.dump();
  }
  // Both plugins closed their podlinkd sessions: nothing left registered.
  EXPECT_EQ(daemon_.Metric("podlink_exports"), 0.0);
  EXPECT_EQ(daemon_.Metric("podlink_sessions"), 0.0);
}

// The per-step trace (PODLINK_NCCL_STEP_TRACE): after finalize each pod has
// written its steps; every send has the receive it filled (same connection,
// sequence and buffer) and each side's stages are in time order.
class NcclNetTrace : public NcclNet {
 protected:
  void SetUp() override {
    char tmpl[] = "/var/tmp/podlink-steptrace.XXXXXX";  // pods get a private /tmp
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    step_trace_ = tmpl;
    NcclNet::SetUp();
  }
  void TearDown() override { std::filesystem::remove_all(step_trace_); }
};

TEST_P(NcclNetTrace, StepTraceJoinsEverySendToItsReceive) {
  Connect();
  for (const char* scenario : {"grouped", "large"}) {
    send_->Send(json{{"cmd", "send"}, {"scenario", scenario}}.dump());
    recv_->Send(json{{"cmd", "recv"}, {"scenario", scenario}}.dump());
    EXPECT_TRUE(send_->Expect("done", 60000)["ok"]);
    EXPECT_TRUE(recv_->Expect("done", 60000)["ok"]);
  }
  for (Pod* p : {send_.get(), recv_.get()}) {
    p->Send(R"({"cmd": "close", "listen": true})");
    EXPECT_EQ(p->Expect("closed")["result"], 0);
    p->Send(R"({"cmd": "finalize"})");
    EXPECT_EQ(p->Expect("finalized")["result"], 0);
  }
  struct Row {
    uint64_t size, t_try, t_post, t_submit, t_done;
  };
  std::map<std::tuple<uint64_t, uint64_t, int>, Row> sends, recvs;
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(step_trace_)) {
    ++files;
    std::ifstream in(f.path());
    std::string header;
    std::getline(in, header);
    EXPECT_EQ(header, "kind\tconn\tseq\tindex\tsize\tt_try\tt_post\tt_submit\tt_done") << f.path();
    char kind;
    uint64_t conn, seq;
    int index;
    Row r;
    while (in >> kind >> conn >> seq >> index >> r.size >> r.t_try >> r.t_post >> r.t_submit >> r.t_done) {
      (kind == 's' ? sends : recvs)[{conn, seq, index}] = r;
    }
  }
  EXPECT_EQ(files, 2) << "one file per pod";
  ASSERT_GE(sends.size(), 4u);
  EXPECT_EQ(sends.size(), recvs.size());
  for (const auto& [key, s] : sends) {
    EXPECT_LE(s.t_try, s.t_post);
    EXPECT_LE(s.t_post, s.t_submit);
    EXPECT_LE(s.t_submit, s.t_done);
    auto r = recvs.find(key);
    ASSERT_NE(r, recvs.end()) << "a send without its receive: seq " << std::get<1>(key);
    EXPECT_LE(r->second.t_post, s.t_post) << "a send was accepted before its receive was posted";
    EXPECT_LE(r->second.t_post, r->second.t_done);
    EXPECT_LE(s.size, r->second.size);
  }
}

INSTANTIATE_TEST_SUITE_P(Relay, NcclNetTrace,
                         ::testing::Values(Mode{"podlink_relay", {"PODLINK_NCCL_FORCE_RELAY=1"}, "podlink", false,
                                                true}),
                         [](const ::testing::TestParamInfo<Mode>& i) { return std::string(i.param.name); });

INSTANTIATE_TEST_SUITE_P(
    Modes, NcclNet,
    ::testing::Values(Mode{"podlink", {}, "podlink"},
                      Mode{"podlink_relay", {"PODLINK_NCCL_FORCE_RELAY=1"}, "podlink", false, true},
                      Mode{"tcp", {"PODLINK_NCCL_TRANSPORT=tcp"}, "TCP"},
                      Mode{"podlink_v8_table",
                           {"NCCL_PROTO=LL,Simple", "NCCL_MIN_NCHANNELS=4", "PODLINK_NCCL_KEEP_P2P=1"}, "podlink", true}),
    [](const ::testing::TestParamInfo<Mode>& i) { return std::string(i.param.name); });

// GPU memory: NCCL's own buffers exported as they are (relay between GPU
// exports), buffers the plugin cannot export (its GPU bounce buffers), and
// the TCP transport's page-locked staging.
INSTANTIATE_TEST_SUITE_P(
    GpuModes, NcclNet,
    ::testing::Values(Mode{"podlink_gpu", {"PODLINK_TEST_MEM=cuda"}, "podlink", false, true, true},
                      Mode{"podlink_gpu_bounce", {"PODLINK_TEST_MEM=cuda-noexport"}, "podlink", false, true, true},
                      Mode{"tcp_gpu", {"PODLINK_TEST_MEM=cuda", "PODLINK_NCCL_TRANSPORT=tcp"}, "TCP", false, false,
                           true},
                      Mode{"tcp_gpu_noexport", {"PODLINK_TEST_MEM=cuda-noexport", "PODLINK_NCCL_TRANSPORT=tcp"}, "TCP",
                           false, false, true}),
    [](const ::testing::TestParamInfo<Mode>& i) { return std::string(i.param.name); });

// In one process, without a daemon, the way NCCL probes GPUDirect support:
// connect and accept interleaved in one thread on one handle.
TEST(NcclNetAbi, TablesAndSelfConnectWithoutDaemon) {
  setenv("PODLINK_SOCKET_DIR", "/nonexistent-podlink-dir", 1);
  void* lib = dlopen(PluginPath().c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  for (const char* sym : {"ncclNetPlugin_v8", "ncclNetPlugin_v9", "ncclNetPlugin_v10", "ncclNetPlugin_v11"}) {
    auto* name = static_cast<const char* const*>(dlsym(lib, sym));
    ASSERT_NE(name, nullptr) << sym;
    EXPECT_STREQ(*name, "podlink") << sym;
  }
  auto* v8 = static_cast<nccl_abi::NetV8*>(dlsym(lib, "ncclNetPlugin_v8"));
  auto* v11 = static_cast<nccl_abi::NetV11*>(dlsym(lib, "ncclNetPlugin_v11"));
  ASSERT_NE(v11->finalize, nullptr);
  void* ctx = nullptr;
  ASSERT_EQ(v11->init(&ctx, 1, nullptr, nullptr, nullptr), 0);
  int n = 0;
  ASSERT_EQ(v11->devices(&n), 0);
  ASSERT_GE(n, 1);
  nccl_abi::PropertiesV11 p11{};
  nccl_abi::PropertiesV8 p8{};
  ASSERT_EQ(v11->getProperties(0, &p11), 0);
  ASSERT_EQ(v8->getProperties(0, &p8), 0);
  EXPECT_STREQ(p11.name, "podlink0");
  EXPECT_STREQ(p8.name, p11.name);
  EXPECT_EQ(p8.speed, p11.speed);
  EXPECT_GT(p11.speed, 0);
  EXPECT_TRUE(p11.ptrSupport & nccl_abi::kPtrHost);
  EXPECT_EQ(p11.maxRecvs, 8);
  EXPECT_EQ(p11.netDeviceType, nccl_abi::kDeviceHost);
  EXPECT_EQ(p11.vProps.ndevs, 1);
  EXPECT_EQ(v11->getProperties(n, &p11), nccl_abi::kInvalidArgument);

  char handle[nccl_abi::kHandleMaxSize];
  void *lc = nullptr, *sc = nullptr, *rc = nullptr;
  ASSERT_EQ(v11->listen(ctx, 0, handle, &lc), 0);
  ASSERT_NE(lc, nullptr);
  for (int i = 0; i < 100000 && (sc == nullptr || rc == nullptr); ++i) {
    if (sc == nullptr) {
      ASSERT_EQ(v11->connect(ctx, 0, handle, &sc, nullptr), 0);
    }
    if (rc == nullptr) {
      ASSERT_EQ(v11->accept(lc, &rc, nullptr), 0);
    }
  }
  ASSERT_NE(sc, nullptr);
  ASSERT_NE(rc, nullptr);
  std::vector<char> src(1 << 20), dst(1 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 13);
  void *smh = nullptr, *rmh = nullptr;
  ASSERT_EQ(v11->regMr(sc, src.data(), src.size(), nccl_abi::kPtrHost, &smh), 0);
  ASSERT_EQ(v11->regMr(rc, dst.data(), dst.size(), nccl_abi::kPtrHost, &rmh), 0);
  // Registered memory used on the wrong comm is refused.
  void* req = nullptr;
  EXPECT_EQ(v11->isend(sc, src.data(), 16, 0, rmh, nullptr, &req), nccl_abi::kInvalidArgument);
  EXPECT_EQ(req, nullptr);
  void* rreq = nullptr;
  void* sreq = nullptr;
  void* data = dst.data();
  size_t size = dst.size();
  int tag = 0;
  for (int i = 0; i < 100000 && rreq == nullptr; ++i) {
    ASSERT_EQ(v11->irecv(rc, 1, &data, &size, &tag, &rmh, nullptr, &rreq), 0);
  }
  for (int i = 0; i < 100000 && sreq == nullptr; ++i) {
    ASSERT_EQ(v11->isend(sc, src.data(), src.size(), 0, smh, nullptr, &sreq), 0);
  }
  ASSERT_NE(sreq, nullptr);
  int sdone = 0, rdone = 0, got = -1;
  for (int i = 0; i < 1000000 && !(sdone && rdone); ++i) {
    if (!sdone) {
      ASSERT_EQ(v11->test(sreq, &sdone, nullptr), 0);
    }
    if (!rdone) {
      ASSERT_EQ(v11->test(rreq, &rdone, &got), 0);
    }
  }
  ASSERT_TRUE(sdone && rdone);
  EXPECT_EQ(got, static_cast<int>(src.size()));
  EXPECT_EQ(src, dst);
  EXPECT_EQ(v11->deregMr(sc, smh), 0);
  EXPECT_EQ(v11->deregMr(rc, rmh), 0);
  EXPECT_EQ(v11->closeSend(sc), 0);
  EXPECT_EQ(v11->closeRecv(rc), 0);
  EXPECT_EQ(v11->closeListen(lc), 0);
  // Objects of the wrong kind are refused, not dereferenced as another kind.
  EXPECT_EQ(v11->closeListen(ctx), nccl_abi::kInvalidArgument);
  EXPECT_EQ(v11->finalize(ctx), 0);
  EXPECT_EQ(dlclose(lib), 0);
}

// NCCL native mode (issue 32): pods of one peer group annotated
// podlink.io/nccl-native=true get the same NCCL_HOSTID and one /dev/shm, keep
// NCCL's own settings (no relay defaults), and a socket bound the way NCCL's
// proxy binds it is mirrored when the plugin is asked for its properties, so a
// peer's request is answered at once (podlinkd's own rescan is set to an hour
// here: only the plugin's sync can explain it). A pod that did not ask, and a
// native pod of another group, cannot reach it.
TEST(NcclNative, APeerGroupSharesShmAndNcclsIpcSockets) {
  PodCgroup a_cg(RandomPodUid(), "burstable"), b_cg(RandomPodUid(), "burstable"), c_cg(RandomPodUid(), "burstable"),
      d_cg(RandomPodUid(), "burstable");
  auto rule = [](const PodCgroup& cg, const std::string& name, const std::string& group, bool native) {
    json annotations = {{"podlink.io/peer-group", group}};
    if (native) annotations["podlink.io/nccl-native"] = "true";
    return json{{"match", {{"pod_uid", cg.pod_uid()}}}, {"namespace", "ml"}, {"name", name},
                {"annotations", annotations}};
  };
  char shm_tmpl[] = "/tmp/podlink-nccl-shm-XXXXXX";
  ASSERT_NE(::mkdtemp(shm_tmpl), nullptr);
  json config = {{"pods", {rule(a_cg, "rank0", "job-1", true), rule(b_cg, "rank1", "job-1", true),
                           rule(c_cg, "relay", "job-1", false), rule(d_cg, "other", "job-2", true)}},
                 {"nccl_native", {{"shm_dir", std::string(shm_tmpl) + "/groups"}, {"rescan_interval_ms", 3600000}}}};
  {
    Daemon daemon(config.dump());
    Pod a(daemon, &a_cg, {PluginPath()}, PeerPath()), b(daemon, &b_cg, {PluginPath()}, PeerPath()),
        c(daemon, &c_cg, {PluginPath()}, PeerPath()), d(daemon, &d_cg, {PluginPath()}, PeerPath());
    const std::string tag = absl::StrCat("pln", getpid() % 100000);
    ASSERT_TRUE(PodVeth(a.pid(), b.pid(), tag + "a", tag + "b", "10.78.0.1/24", "10.78.0.2/24", Ip()).ok());
    ASSERT_TRUE(PodVeth(c.pid(), d.pid(), tag + "c", tag + "d", "10.78.1.1/24", "10.78.1.2/24", Ip()).ok());
    std::map<std::string, json> ready;
    for (auto [name, pod] : {std::pair{"a", &a}, {"b", &b}, {"c", &c}, {"d", &d}}) {
      pod->Send(R"({"cmd": "init"})");
      ready[name] = pod->Expect("ready");
      ASSERT_EQ(ready[name]["result"], 0) << ready[name].dump();
    }
    struct stat host_shm {};
    ASSERT_EQ(::stat("/dev/shm", &host_shm), 0);
    EXPECT_NE(ready["a"]["nccl_hostid"], "");
    EXPECT_EQ(ready["a"]["nccl_hostid"], ready["b"]["nccl_hostid"]);
    EXPECT_EQ(ready["a"]["shm_dev"], ready["b"]["shm_dev"]);
    EXPECT_NE(ready["a"]["shm_dev"], static_cast<uint64_t>(host_shm.st_dev));
    EXPECT_EQ(ready["a"]["nccl_proto"], "") << "native mode keeps NCCL's protocols";
    EXPECT_EQ(ready["a"]["nccl_min_p2p_nchannels"], "");
    EXPECT_EQ(ready["a"]["nccl_tuner_plugin"], "none") << "NCCL would call the relay's tuner for every collective";
    EXPECT_EQ(ready["c"]["nccl_tuner_plugin"], "");
    EXPECT_EQ(ready["c"]["nccl_hostid"], "");
    EXPECT_EQ(ready["c"]["nccl_p2p_ll_threshold"], "0") << "a pod that did not ask stays on the relay";
    EXPECT_EQ(ready["a"]["nccl_p2p_ll_threshold"], "") << "native mode keeps NCCL's protocols";
    EXPECT_NE(ready["d"]["nccl_hostid"], ready["a"]["nccl_hostid"]);
    EXPECT_NE(ready["d"]["shm_dev"], ready["a"]["shm_dev"]);

    // b binds its proxy socket, then NCCL builds its topology.
    b.Send(R"({"cmd": "ipc_bind", "rank": 1, "hash": 2989})");
    ASSERT_TRUE(b.Expect("ipc_bound")["ok"]);
    a.Send(R"({"cmd": "ipc_request", "rank": 0, "peer_rank": 1, "peer_hash": 2989})");
    EXPECT_EQ(a.Expect("ipc_answer")["answer"], "answer podlink-2989");
    c.Send(R"({"cmd": "ipc_request", "rank": 0, "peer_rank": 1, "peer_hash": 2989})");
    EXPECT_EQ(c.Expect("ipc_answer")["answer"], absl::StrCat("error ", ECONNREFUSED));
    d.Send(R"({"cmd": "ipc_request", "rank": 0, "peer_rank": 1, "peer_hash": 2989})");
    EXPECT_EQ(d.Expect("ipc_answer")["answer"], absl::StrCat("error ", ECONNREFUSED));
    // A descriptor that is no memory handle never reaches b.
    a.Send(R"({"cmd": "ipc_request", "rank": 0, "peer_rank": 1, "peer_hash": 2989, "fd": "pipe"})");
    EXPECT_EQ(a.Expect("ipc_answer", 10000)["answer"], absl::StrCat("error ", ETIMEDOUT));
    EXPECT_EQ(daemon.Metric("podlink_nccl_ipc_refused_descriptor_total"), 1);
    EXPECT_EQ(daemon.Metric("podlink_nccl_ipc_descriptors_replaced_total"), 1);
    EXPECT_EQ(daemon.Metric("podlink_nccl_ipc_members"), 3);
    for (Pod* p : {&a, &b, &c, &d}) {
      p->Send(R"({"cmd": "finalize"})");
      p->Expect("finalized");
    }
    // The sessions closed: no member, no mirror, and the groups' tmpfs unmounted.
    for (int i = 0; i < 50 && daemon.Metric("podlink_nccl_ipc_members") != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(daemon.Metric("podlink_nccl_ipc_members"), 0);
    EXPECT_EQ(daemon.Metric("podlink_nccl_ipc_mirrors"), 0);
    std::error_code ec;
    EXPECT_TRUE(std::filesystem::is_empty(std::string(shm_tmpl) + "/groups", ec)) << ec.message();
  }
  std::filesystem::remove_all(shm_tmpl);
}

// A pod the device plugin pointed at podlinkd (PODLINK_SOCKET_DIR) that
// cannot reach it: a WARN line says so (NCCL shows WARN by default), and the
// plugin asks NCCL for host buffers, so its TCP transport needs no copies of
// its own (they waited for a GPU time slice: 2.4 ms per small message).
TEST(NcclNetFallback, UnreachablePodlinkdWarnsAndTakesHostBuffers) {
  PodCgroup a_cg(RandomPodUid(), "burstable"), b_cg(RandomPodUid(), "burstable");
  Daemon daemon(R"({"pods": []})");
  const std::vector<std::string> args = {PluginPath(), "PODLINK_SOCKET_DIR=/nonexistent/podlink"};
  Pod a(daemon, &a_cg, args, PeerPath()), b(daemon, &b_cg, args, PeerPath());
  const std::string tag = absl::StrCat("plf", getpid() % 100000);
  ASSERT_TRUE(PodVeth(a.pid(), b.pid(), tag + "a", tag + "b", "10.78.2.1/24", "10.78.2.2/24", Ip()).ok());
  for (Pod* p : {&a, &b}) {
    p->Send(R"({"cmd": "init"})");
    json r = p->Expect("ready");
    ASSERT_EQ(r["result"], 0) << r.dump();
    bool warned = false;
    for (const auto& w : r["warnings"]) warned |= w.get<std::string>().find("podlinkd not usable") != std::string::npos;
    EXPECT_TRUE(warned) << r.dump();
    ASSERT_GE(r["devices"].size(), 1u);
    EXPECT_EQ(r["devices"][0]["ptr_support"], nccl_abi::kPtrHost) << r.dump();
    EXPECT_EQ(r["nccl_proto"], "") << "no relay defaults without podlinkd";
  }
  a.Send(R"({"cmd": "listen"})");
  json h = a.Expect("handle");
  b.Send(json{{"cmd", "connect"}, {"hex", h["hex"]}}.dump());
  a.Send(R"({"cmd": "accept"})");
  EXPECT_TRUE(a.Expect("accepted")["ok"]);
  json con = b.Expect("connected");
  EXPECT_EQ(con["transport"], "TCP") << con.dump();
}

}  // namespace
}  // namespace podlink::testing
