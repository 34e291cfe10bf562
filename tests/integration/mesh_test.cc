// The daemons' mesh between emulated nodes: one podlinkd per network
// namespace, veth pairs as cables (each cable its own /30), node
// certificates from a CA made for the run (openssl). Pods on one node write
// and read regions of pods on another through both daemons; hostile peers
// (no certificate, another CA, a daemon speaking for another node's pods,
// forged data connections) are refused; a cable cut or a killed peer daemon
// fails transfers within a bound instead of hanging.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cuda_driver.h"
#include "gtest/gtest.h"
#include "daemon/mesh/origin_sign.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"
#include "tests/integration/harness.h"

namespace podlink::testing {
namespace {

namespace pb = podlink::mesh::v1;
using nlohmann::json;

int Sh(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `cmd`; its standard output (and its exit status in `status`).
std::string RunCommand(const std::string& cmd, int* status = nullptr) {
  std::string text;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    if (status != nullptr) *status = -1;
    return text;
  }
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) text.append(buf, n);
  int rc = pclose(p);
  if (status != nullptr) *status = rc;
  return text;
}

// Bytes `dev` in namespace `ns` has sent.
uint64_t TxBytes(const std::string& ns, const std::string& dev) {
  return std::strtoull(RunCommand(absl::StrCat("ip netns exec ", ns, " cat /sys/class/net/", dev, "/statistics/tx_bytes")).c_str(),
                       nullptr, 10);
}

// How often `text` occurs in `d`'s log.
size_t CountInLog(const Daemon& d, const std::string& text) {
  std::string log = d.Log();
  size_t count = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++count;
  return count;
}

// True once `text` occurs at least `n` times in `d`'s log.
bool WaitForCount(const Daemon& d, const std::string& text, size_t n, int timeout_ms = 30000) {
  for (int waited = 0; waited <= timeout_ms; waited += 20) {
    if (CountInLog(d, text) >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// True once `d` has granted `n` regions to peers (its log says so).
bool WaitForGrants(const Daemon& d, size_t n, int timeout_ms = 30000) {
  return WaitForCount(d, "event=mesh_grant ", n, timeout_ms);
}

// What `kubectl podlink links -o json` says on `d`'s node (not an object: it failed).
json LinksOf(const Daemon& d) {
  return json::parse(RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links -o json --socket ", d.dir())), nullptr, false);
}

// One series of `d`'s /metrics, read inside namespace `ns` (-1: absent).
double MetricOf(const std::string& ns, const Daemon& d, const std::string& series) {
  std::string m = RunCommand(absl::StrCat("ip netns exec ", ns,
                                          " python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:",
                                          d.metrics_port(), "/metrics\").read().decode())'"));
  size_t at = m.find("\n" + series + " ");
  return at == std::string::npos ? -1.0 : std::strtod(m.c_str() + at + series.size() + 2, nullptr);
}

// Shapes `dev` of namespace `ns` to 200 Mbit/s (tc tbf), or `rate`: the
// cable, not the CPU, is then the limit, and a large transfer lasts long
// enough to cut.
void Shape(const std::string& ns, const std::string& dev, const std::string& rate = "200mbit") {
  Sh(absl::StrCat("ip netns exec ", ns, " tc qdisc add dev ", dev, " root tbf rate ", rate,
                  " burst 256kb latency 50ms"));
}

// A CA and node certificates (SAN DNS:<node>), made with the openssl CLI.
class TestCa {
 public:
  explicit TestCa(const std::string& dir) : dir_(dir) {
    Sh("mkdir -p " + dir_);
    EXPECT_EQ(Sh(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 ",
                              "-subj /CN=podlink-test-mesh-ca -keyout ", dir_, "/ca.key -out ", dir_, "/ca.crt")),
              0)
        << "openssl is needed for the mesh tests";
  }
  // Writes ca.crt, tls.crt and tls.key for `node` into `out` (what a
  // daemon's mesh.cert_dir holds); `trust` is the CA bundle the node trusts.
  void Issue(const std::string& node, const std::string& out, const std::string& trust = "") const {
    Sh("mkdir -p " + out);
    std::string ext = out + "/ext.cnf";
    std::ofstream(ext) << "subjectAltName=DNS:" << node << "\nextendedKeyUsage=serverAuth,clientAuth\n";
    EXPECT_EQ(Sh(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=", node,
                              " -keyout ", out, "/tls.key -out ", out, "/tls.csr")),
              0);
    EXPECT_EQ(Sh(absl::StrCat("openssl x509 -req -in ", out, "/tls.csr -CA ", dir_, "/ca.crt -CAkey ", dir_,
                              "/ca.key -CAcreateserial -days 2 -extfile ", ext, " -out ", out, "/tls.crt")),
              0);
    Sh(absl::StrCat("cp ", trust.empty() ? dir_ + "/ca.crt" : trust, " ", out, "/ca.crt"));
  }
  std::string ca() const { return dir_ + "/ca.crt"; }

 private:
  std::string dir_;
};

// Network namespaces joined by veth cables; removed at the end.
class Topology {
 public:
  Topology() {
    std::random_device rd;
    tag_ = absl::StrCat("plm", rd() % 100000);
    // Host cables share this test's (the host's) namespace with every other
    // test ctest runs at the same time: a subnet of their own (two hostile
    // tests on one subnet reached each other's nodes).
    host_net_ = absl::StrCat("10.", 100 + rd() % 100, ".", rd() % 250);
  }
  ~Topology() {
    for (const std::string& ns : namespaces_) Sh("ip netns del " + ns);
    for (const std::string& dev : host_devs_) Sh("ip link del " + dev);
  }
  std::string Node(const std::string& name) {
    std::string ns = tag_ + name;
    EXPECT_EQ(Sh("ip netns add " + ns), 0) << "ip netns add " << ns;
    Sh("ip netns exec " + ns + " ip link set lo up");
    namespaces_.push_back(ns);
    return ns;
  }
  // A cable between two nodes on 10.<net>.<sub>.0/30: a gets .1, b .2.
  // Returns the device names (a side, b side).
  std::pair<std::string, std::string> Cable(const std::string& a, const std::string& b, int sub) {
    std::string da = absl::StrCat(tag_, "c", sub, "a"), db = absl::StrCat(tag_, "c", sub, "b");
    EXPECT_EQ(Sh(absl::StrCat("ip link add ", da, " netns ", a, " type veth peer name ", db, " netns ", b)), 0);
    Sh(absl::StrCat("ip -n ", a, " addr add 10.77.", sub, ".1/30 dev ", da));
    Sh(absl::StrCat("ip -n ", b, " addr add 10.77.", sub, ".2/30 dev ", db));
    Sh(absl::StrCat("ip -n ", a, " link set ", da, " up"));
    Sh(absl::StrCat("ip -n ", b, " link set ", db, " up"));
    return {da, db};
  }
  // A cable from this test's own namespace to `node` (the test's hostile
  // clients come through it) on a /30 of this topology's own host subnet
  // (`sub` picks which): host side .1, node side .2.
  std::string HostCable(const std::string& node, int sub) {
    std::string dh = absl::StrCat(tag_, "h", sub), dn = absl::StrCat(tag_, "h", sub, "n");
    EXPECT_EQ(Sh(absl::StrCat("ip link add ", dh, " type veth peer name ", dn, " netns ", node)), 0);
    Sh(absl::StrCat("ip addr add ", host_net_, ".", (sub % 64) * 4 + 1, "/30 dev ", dh));
    Sh(absl::StrCat("ip -n ", node, " addr add ", host_net_, ".", (sub % 64) * 4 + 2, "/30 dev ", dn));
    Sh(absl::StrCat("ip link set ", dh, " up"));
    Sh(absl::StrCat("ip -n ", node, " link set ", dn, " up"));
    host_devs_.push_back(dh);
    return absl::StrCat(host_net_, ".", (sub % 64) * 4 + 2);
  }
  const std::string& tag() const { return tag_; }

 private:
  std::string tag_;
  std::string host_net_;  // "10.x.y": the first three octets of this topology's host cables
  std::vector<std::string> namespaces_, host_devs_;
};

bool CanRunMesh() {
  return ::geteuid() == 0 && Sh("ip netns list") == 0 && Sh("openssl version") == 0;
}

class Mesh : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CanRunMesh()) GTEST_SKIP() << "needs root, ip netns and openssl";
    dir_ = absl::StrCat("/tmp/podlink-mesh-", topo_.tag());
    ca_ = std::make_unique<TestCa>(dir_ + "/ca");
  }
  void TearDown() override { Sh("rm -rf " + dir_); }

  // podlinkd for `node` in namespace `ns`, advertising the listed interfaces.
  std::unique_ptr<Daemon> StartNode(const std::string& node, const std::string& ns,
                                    const std::vector<std::string>& interfaces, const std::string& pods,
                                    const std::string& cert_dir = "", const std::string& extra_mesh = "",
                                    bool gpu = false) {
    std::string certs = cert_dir;
    if (certs.empty()) {
      certs = dir_ + "/" + node;
      ca_->Issue(node, certs);
    }
    json ifs = interfaces;
    std::string cfg = absl::StrCat(R"({"node": {"name": ")", node, R"(", "id": ")", node, R"("}, "mesh": {"enabled": true, "cert_dir": ")",
                                   certs, R"(", "interfaces": )", ifs.dump(), R"(, "io_timeout_seconds": 2)",
                                   extra_mesh, R"(}, "pods": [)", pods, "]}");
    return std::make_unique<Daemon>(cfg, std::vector<std::string>{}, gpu, ns);
  }

  static std::string Rule(const PodCgroup& cg, const std::string& ns, const std::string& name,
                          const std::string& group) {
    std::string ann = group.empty() ? "{}" : absl::StrCat(R"({"podlink.io/peer-group": ")", group, R"("})");
    return absl::StrCat(R"({"match": {"pod_uid": ")", cg.pod_uid(), R"("}, "namespace": ")", ns, R"(", "name": ")",
                        name, R"(", "annotations": )", ann, "}");
  }

  // Nodes a and b joined by one cable (node a's end shaped when asked), a
  // prefill pod for node a and a decode pod for node b in one peer group;
  // `pods` is both daemons' rules.
  struct TwoNodes {
    std::string a, b, da, db;
    PodCgroup pa{RandomPodUid(), "burstable"}, pb{RandomPodUid(), "burstable"};
    std::string pods;
  };
  void Join(TwoNodes& t, bool shaped = false) {
    t.a = topo_.Node("a");
    t.b = topo_.Node("b");
    std::tie(t.da, t.db) = topo_.Cable(t.a, t.b, 1);
    if (shaped) Shape(t.a, t.da);
    t.pods = Rule(t.pa, "ml", "prefill-0", "job-7") + "," + Rule(t.pb, "ml", "decode-0", "job-7");
  }

  // A chain a - c - d (no cable between a and d), a pod on a and one on d
  // in one peer group; `pods` is every daemon's rules.
  struct Chain {
    std::string a, c, d, ac_a, ac_c, cd_c, cd_d;
    PodCgroup pa{RandomPodUid(), "burstable"}, pd{RandomPodUid(), "burstable"};
    std::string pods;
  };
  void JoinChain(Chain& t) {
    t.a = topo_.Node("a");
    t.c = topo_.Node("c");
    t.d = topo_.Node("d");
    std::tie(t.ac_a, t.ac_c) = topo_.Cable(t.a, t.c, 3);
    std::tie(t.cd_c, t.cd_d) = topo_.Cable(t.c, t.d, 4);
    t.pods = Rule(t.pa, "ml", "a", "job-7") + "," + Rule(t.pd, "ml", "d", "job-7");
  }
  // A triangle for two-hop striping: a and b cabled to each other (cable 1),
  // c cabled to both (b - c 2, a - c 3); a pod on a and one on b in one peer
  // group. Node a stripes through c with kStripesThroughC.
  struct Triangle {
    std::string a, b, c, ab_a, ab_b, bc_b, bc_c, ac_a, ac_c;
    PodCgroup pa{RandomPodUid(), "burstable"}, pb{RandomPodUid(), "burstable"};
    std::string pods;
  };
  void JoinTriangle(Triangle& t) {
    t.a = topo_.Node("a");
    t.b = topo_.Node("b");
    t.c = topo_.Node("c");
    std::tie(t.ab_a, t.ab_b) = topo_.Cable(t.a, t.b, 1);
    std::tie(t.bc_b, t.bc_c) = topo_.Cable(t.b, t.c, 2);
    std::tie(t.ac_a, t.ac_c) = topo_.Cable(t.a, t.c, 3);
    t.pods = Rule(t.pa, "ml", "a", "job-7") + "," + Rule(t.pb, "ml", "b", "job-7");
  }
  // mesh keys for node a of a Triangle: two-hop striping, node c known from
  // mesh.peers with both its addresses.
  static constexpr const char* kStripesThroughC =
      R"(, "two_hop_stripe": true, "peers": [{"node": "node-c", "addresses": ["10.77.2.2/30", "10.77.3.2/30"], "port": 7446}])";
  // mesh.peers naming node c with both its addresses (a and d know it so).
  static constexpr const char* kKnowsC =
      R"(, "peers": [{"node": "node-c", "addresses": ["10.77.3.2/30", "10.77.4.1/30"]}])";

  Topology topo_;
  std::string dir_;
  std::unique_ptr<TestCa> ca_;
};

// `desc` (podlink2;<node id>;<export>;<size>;<type>;<gpu uuid>;<node
// name>;<mesh port>;<addresses>) with the fields at the given indices
// replaced; empty (a test failure) if it is not such a descriptor.
std::string WithFields(const std::string& desc, const std::map<size_t, std::string>& fields) {
  std::vector<std::string> f = absl::StrSplit(desc, ';');
  EXPECT_EQ(f.size(), 9u) << desc;
  if (f.size() != 9u) return "";
  for (const auto& [i, v] : fields) f[i] = v;
  return absl::StrJoin(f, ";");
}

// A pod on `from` writes a region of a pod on `to` whole (one-sided, through
// both daemons), notifies, reads it back; both sides check every byte.
void KvAcrossNodes(Daemon& to, const PodCgroup& server_cg, Daemon& from, const PodCgroup& client_cg,
                   uint64_t size, int seed, const std::vector<std::string>& server_extra = {},
                   const std::vector<std::string>& client_extra = {}) {
  std::vector<std::string> serve = {"kv-serve", "--size", std::to_string(size), "--verify", std::to_string(seed)};
  serve.insert(serve.end(), server_extra.begin(), server_extra.end());
  Pod server(to, &server_cg, serve);
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  std::string desc = s["descriptor"];
  ASSERT_EQ(desc.rfind("podlink2;", 0), 0u) << desc;
  std::vector<std::string> args = {"kv-put", "--desc", desc, "--seed", std::to_string(seed), "--read-back"};
  args.insert(args.end(), client_extra.begin(), client_extra.end());
  Pod client(from, &client_cg, args);
  json put = client.Expect("put", 60000);
  ASSERT_EQ(put["event"], "put") << put.dump() << "\n" << from.Log();
  EXPECT_EQ(put["transport"], "podlink/mesh");
  EXPECT_EQ(put["bytes"], size);
  json back = client.Expect("read_back", 60000);
  EXPECT_EQ(back["mismatches"], 0) << back.dump();
  json v = server.Expect("verified", 60000);
  EXPECT_EQ(v["mismatches"], 0) << v.dump();
  EXPECT_EQ(v["notification"], 1);
  EXPECT_EQ(server.Wait(), 0);
  EXPECT_EQ(client.Wait(), 0);
}

TEST_F(Mesh, PodsOnTwoNodesWriteAndReadEachOtherByteForByte) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  KvAcrossNodes(*nb, pb, *na, pa, 24 << 20, 41);  // a -> b
  KvAcrossNodes(*na, pa, *nb, pb, 24 << 20, 42);  // b -> a
  // Sizes that are not multiples of the slice, and a single small op.
  KvAcrossNodes(*nb, pb, *na, pa, (3 << 20) + 4096, 43);
  EXPECT_TRUE(nb->WaitForLog("event=mesh_grant peer=node-a pod=ml/prefill-0"));
}

// The NCCL plugin and its test peer as built, unless the environment points
// elsewhere (a carried bundle on the GPU machine, where PODLINK_TEST_MEM=cuda
// puts NCCL's buffers in GPU memory): plugin, peer, and the peer's arguments.
std::tuple<std::string, std::string, std::vector<std::string>> NcclPeer() {
  auto env = [](const char* name, const char* dflt) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr && *v != '\0' ? v : dflt);
  };
  std::string plugin = env("PODLINK_NCCL_PLUGIN_PATH", PLUGIN_PATH), peer = env("PODLINK_NCCL_PEER_PATH", NCCL_NET_PEER_PATH);
  std::vector<std::string> args = {plugin};
  if (const char* mem = std::getenv("PODLINK_TEST_MEM"); mem != nullptr) args.push_back(std::string("PODLINK_TEST_MEM=") + mem);
  return {plugin, peer, args};
}

// One conformance scenario of the NCCL test peers between two nodes: the
// receiver listens, the sender connects on its device `dev` (over the mesh),
// both run `sc` and check every byte, both close.
void NcclScenario(Pod& send, Pod& recv, Daemon& na, Daemon& nb, const char* sc, int dev = 0) {
  recv.Send(R"({"cmd": "listen"})");
  json h = recv.Expect("handle");
  ASSERT_EQ(h["result"], 0);
  send.Send(json{{"cmd", "connect"}, {"hex", h["hex"]}, {"dev", dev}}.dump());
  recv.Send(R"({"cmd": "accept"})");
  json acc = recv.Expect("accepted", 30000);
  json con = send.Expect("connected", 30000);
  ASSERT_TRUE(acc["ok"]) << acc.dump();
  ASSERT_TRUE(con["ok"]) << con.dump();
  EXPECT_EQ(con["transport"], "mesh") << con.dump();
  send.Send(json{{"cmd", "send"}, {"scenario", sc}}.dump());
  recv.Send(json{{"cmd", "recv"}, {"scenario", sc}}.dump());
  json sd = send.Expect("done", 120000);
  json rd = recv.Expect("done", 120000);
  EXPECT_TRUE(sd["ok"]) << sd.dump() << "\n" << na.Log();
  EXPECT_TRUE(rd["ok"]) << rd.dump() << "\n" << nb.Log();
  send.Send(R"({"cmd": "close", "listen": true})");
  recv.Send(R"({"cmd": "close", "listen": true})");
  EXPECT_EQ(send.Expect("closed")["result"], 0);
  EXPECT_EQ(recv.Expect("closed")["result"], 0);
}

// The NCCL plugin between pods on two nodes: clear-to-send and completions on
// the pods' own connection (a veth between them, as NCCL's bootstrap needs),
// the bytes written by both podlinkd over their mesh cable. The conformance
// scenarios of tests/nccl (ordering with 32 receives in flight, large and
// odd sizes, grouped receives, a receive larger than the send, truncation, a
// close with requests in flight), every byte checked by the peers.
TEST_F(Mesh, NcclPluginBetweenPodsOnTwoNodesGoesThroughTheMesh) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  [[maybe_unused]] auto [plugin, peer, args] = NcclPeer();
  Pod send(*na, &pa, args, peer);
  Pod recv(*nb, &pb, args, peer);
  absl::Status veth = PodVeth(recv.pid(), send.pid(), absl::StrCat(topo_.tag(), "pr"), absl::StrCat(topo_.tag(), "ps"),
                              "10.78.9.1/24", "10.78.9.2/24");
  ASSERT_TRUE(veth.ok()) << veth;
  // With the step trace on (PODLINK_NCCL_STEP_TRACE): checked at the end.
  char trace_dir[] = "/var/tmp/podlink-mesh-steps.XXXXXX";
  ASSERT_NE(::mkdtemp(trace_dir), nullptr);
  ::chmod(trace_dir, 0777);  // the pods' processes may run as another uid
  for (Pod* p : {&recv, &send}) {
    p->Send(json{{"cmd", "init"}, {"step_trace", trace_dir}}.dump());
    json r = p->Expect("ready");
    ASSERT_EQ(r["result"], 0) << r.dump();
    EXPECT_EQ(r["gpu"], std::getenv("PODLINK_TEST_MEM") != nullptr) << r.dump();
  }
  uint64_t cable_before = TxBytes(a, da);
  for (const char* sc : {"ordering", "large", "grouped", "smaller", "truncate", "inflight-close"}) {
    SCOPED_TRACE(sc);
    NcclScenario(send, recv, *na, *nb, sc);
    if (HasFatalFailure()) return;
  }
  // The bytes went over the daemons' mesh cable, not the pods' veth.
  EXPECT_GT(TxBytes(a, da) - cable_before, uint64_t{48} << 20) << "the large scenario alone writes 51 MiB";
  EXPECT_TRUE(nb->WaitForLog("event=mesh_grant peer=node-a pod=ml/prefill-0"));
  // The step trace: both pods write their steps as they exit, and the sends
  // join their receives across the pods (both ends name each connection alike).
  for (Pod* p : {&send, &recv}) p->Send(R"({"cmd": "exit"})");
  for (Pod* p : {&send, &recv}) EXPECT_EQ(p->WaitFor(30000), std::optional<int>(0)) << "a pod did not exit cleanly";
  size_t files = 0;
  for ([[maybe_unused]] const auto& f : std::filesystem::directory_iterator(trace_dir)) ++files;
  ASSERT_EQ(files, 2u) << "one step file per pod";
  std::map<std::tuple<uint64_t, uint64_t, int>, std::pair<uint64_t, uint64_t>> sends, recvs;  // size, t_post
  for (const auto& f : std::filesystem::directory_iterator(trace_dir)) {
    std::ifstream in(f.path());
    std::string header;
    std::getline(in, header);
    char kind;
    uint64_t conn, seq, size, t_try, t_post, t_submit, t_done;
    int index;
    while (in >> kind >> conn >> seq >> index >> size >> t_try >> t_post >> t_submit >> t_done) {
      (kind == 's' ? sends : recvs)[{conn, seq, index}] = {size, t_post};
    }
  }
  std::filesystem::remove_all(trace_dir);
  size_t joined = 0;
  for (const auto& [key, s] : sends) {
    auto r = recvs.find(key);
    if (r == recvs.end()) continue;
    ++joined;
    EXPECT_LE(s.first, r->second.first) << "a send larger than the receive it filled";
    EXPECT_LE(r->second.second, s.second) << "a send accepted before its receive was posted";
  }
  EXPECT_GE(sends.size(), 32u);
  // Sends of the close-in-flight scenario may never find their receive.
  EXPECT_GE(joined * 10, sends.size() * 9) << joined << " of " << sends.size() << " sends joined a receive";
}

// A pod on another node writes and reads a GPU export (the owner's daemon
// copies each slice between the wire and the GPU by the copy engine), from
// host memory and from GPU memory of its own (its daemon stages that).
// Needs a GPU: tests/gpu/run_one_gpu.sh runs it on the device machine.
TEST_F(Mesh, APodWritesAndReadsAGpuExportOfAnotherNode) {
  auto d = cu::LoadDriver();
  int n = 0;
  if (!d.ok() || (*d)->DeviceGetCount(&n) != cu::kSuccess || n == 0) GTEST_SKIP() << "no GPU";
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods, "", "", /*gpu=*/true);
  auto nb = StartNode("node-b", b, {db}, pods, "", "", /*gpu=*/true);
  KvAcrossNodes(*nb, pb, *na, pa, 24 << 20, 51, {"--gpu", "0"});              // host on a -> GPU on b
  KvAcrossNodes(*nb, pb, *na, pa, 24 << 20, 52, {"--gpu", "0"}, {"--gpu", "0"});  // GPU on a -> GPU on b
  KvAcrossNodes(*na, pa, *nb, pb, 24 << 20, 53, {}, {"--gpu", "0"});          // GPU on b -> host on a
  EXPECT_TRUE(nb->WaitForLog("event=mesh_grant peer=node-a pod=ml/prefill-0"));
}

TEST_F(Mesh, TwoCablesBothCarryATransfer) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [a1, b1] = topo_.Cable(a, b, 1);
  auto [a2, b2] = topo_.Cable(a, b, 2);
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "prefill-0", "job-7") + "," + Rule(pb, "ml", "decode-0", "job-7");
  auto na = StartNode("node-a", a, {a1, a2}, pods);
  auto nb = StartNode("node-b", b, {b1, b2}, pods);
  auto tx = [&](const std::string& dev) { return TxBytes(a, dev); };
  uint64_t before1 = tx(a1), before2 = tx(a2);
  const uint64_t size = 64 << 20;
  KvAcrossNodes(*nb, pb, *na, pa, size, 51);
  uint64_t sent1 = tx(a1) - before1, sent2 = tx(a2) - before2;
  EXPECT_TRUE(na->WaitForLog("paths=2"));
  // Both cables carried a real share of the write (and the control plane
  // adds little): the slices were striped over both. (How evenly depends on
  // which connections' threads the CPU runs first here, the cables being
  // unshaped: at least 4 slices each. tests/mesh/bench.sh measures the
  // balance on shaped cables.)
  const uint64_t share = uint64_t{4} * (512 << 10);
  std::cerr << "striped: cable 1 " << sent1 << " bytes, cable 2 " << sent2 << "\n";
  EXPECT_GT(sent1, share) << "cable 1 carried " << sent1 << " bytes, cable 2 " << sent2;
  EXPECT_GT(sent2, share) << "cable 1 carried " << sent1 << " bytes, cable 2 " << sent2;
  EXPECT_GE(sent1 + sent2, size);

  // What an operator sees on node a: kubectl podlink links.
  int rc = -1;
  std::string text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links -o json --socket ", na->dir()), &rc);
  EXPECT_EQ(rc, 0) << text;
  json links = json::parse(text, nullptr, false);
  ASSERT_TRUE(links.is_object()) << text;
  EXPECT_EQ(links["node"], "node-a");
  EXPECT_EQ(links["enabled"], true);
  ASSERT_EQ(links["peers"].size(), 1u) << text;
  const json& peer = links["peers"][0];
  EXPECT_EQ(peer["node"], "node-b");
  EXPECT_EQ(peer["transport"], "tcp") << text;
  EXPECT_EQ(peer["connections_up"], 8) << text;  // 4 per cable
  EXPECT_GE(peer["bytes_sent"].get<uint64_t>(), size);
  EXPECT_GE(peer["bytes_received"].get<uint64_t>(), size);  // the read-back
  int paths_with_bytes = 0;
  for (const json& c : peer["connections"]) paths_with_bytes += c["bytes_sent"].get<uint64_t>() > 0;
  EXPECT_GE(paths_with_bytes, 2) << text;
  // The table, for people.
  text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links --socket ", na->dir()), &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("node-b"), std::string::npos) << text;
  EXPECT_NE(text.find("8/8"), std::string::npos) << text;
  EXPECT_NE(text.find("10.77.2.1->10.77.2.2"), std::string::npos) << text;
  std::cerr << text;
  // The same per path on /metrics (read inside node a's namespace).
  std::string metrics = RunCommand(absl::StrCat(
      "ip netns exec ", a, " python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:",
      na->metrics_port(), "/metrics\").read().decode())'"));
  for (const char* path : {"10.77.1.1->10.77.1.2", "10.77.2.1->10.77.2.2"}) {
    EXPECT_NE(metrics.find(absl::StrCat("podlink_mesh_path_connections_up{peer=\"node-b\",path=\"", path, "\"} 4")),
              std::string::npos)
        << metrics;
    size_t at = metrics.find(absl::StrCat("podlink_mesh_path_sent_bytes_total{peer=\"node-b\",path=\"", path, "\"} "));
    ASSERT_NE(at, std::string::npos) << metrics;
    EXPECT_GT(std::strtod(metrics.c_str() + metrics.find("} ", at) + 2, nullptr), 0.0) << metrics;
  }
  // The pod's slices left its host export without a copy into the kernel
  // (MSG_ZEROCOPY) until the kernel said a veth makes it copy anyway; each
  // connection then stopped asking.
  auto value = [&](const std::string& m, const std::string& series) {
    size_t at = m.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::strtod(m.c_str() + at + series.size() + 2, nullptr);
  };
  EXPECT_GT(value(metrics, "podlink_mesh_tcp_zero_copy_bytes_total{peer=\"node-b\"}"), 0.0) << metrics;
  EXPECT_GE(value(metrics, "podlink_mesh_tcp_zero_copy_copied_total{peer=\"node-b\"}"), 1.0) << metrics;
  EXPECT_TRUE(na->WaitForLog("event=mesh_tcp_zero_copy_off node=node-b"));
}

// Each daemon reads the NICs under its addresses from sysfs and advertises
// them; a transfer of one slice goes on the fastest cable, a larger one is
// striped over every cable of the best class (host memory: all of them).
// Node a reads a fake sysfs (mesh.sysfs) in which its first cable is a
// 1 Gb/s NIC and its second a 100 Gb/s one; node b its real one.
TEST_F(Mesh, NicsAreAdvertisedAndOneSliceTakesTheFastestCable) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [a1, b1] = topo_.Cable(a, b, 1);
  auto [a2, b2] = topo_.Cable(a, b, 2);
  const std::string sys = dir_ + "/sysfs-a";
  auto nic = [&](const std::string& dev, const std::string& pci, const char* speed) {
    Sh(absl::StrCat("mkdir -p ", sys, "/devices/", pci, " ", sys, "/class/net/", dev));
    std::ofstream(absl::StrCat(sys, "/devices/", pci, "/numa_node")) << "0\n";
    std::ofstream(absl::StrCat(sys, "/class/net/", dev, "/speed")) << speed << "\n";
    Sh(absl::StrCat("ln -s ", sys, "/devices/", pci, " ", sys, "/class/net/", dev, "/device"));
  };
  nic(a1, "pci0000:00/0000:00:01.0/0000:01:00.0", "1000");
  nic(a2, "pci0000:00/0000:00:02.0/0000:02:00.0", "100000");
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "prefill-0", "job-7") + "," + Rule(pb, "ml", "decode-0", "job-7");
  auto na = StartNode("node-a", a, {a1, a2}, pods, "", absl::StrCat(R"(, "sysfs": ")", sys, R"(")"));
  auto nb = StartNode("node-b", b, {b1, b2}, pods);

  // 20 writes and a read of 256 KiB (one slice each): the fast cable.
  uint64_t before1 = TxBytes(a, a1), before2 = TxBytes(a, a2);
  const uint64_t small = 256 << 10;
  KvAcrossNodes(*nb, pb, *na, pa, small, 61, {}, {"--repeat", "20"});
  uint64_t sent1 = TxBytes(a, a1) - before1, sent2 = TxBytes(a, a2) - before2;
  std::cerr << "one slice at a time: slow cable " << sent1 << " bytes, fast cable " << sent2 << "\n";
  EXPECT_GE(sent2, 20 * small) << "fast cable " << sent2 << " bytes, slow cable " << sent1 << "\n" << na->Log();
  EXPECT_LT(sent1, small) << "the slow cable carried data: " << sent1 << " bytes (fast: " << sent2 << ")\n"
                          << na->Log();

  // 32 MiB (64 slices): both cables, the slices being pulled.
  before1 = TxBytes(a, a1);
  before2 = TxBytes(a, a2);
  const uint64_t large = 32 << 20;
  KvAcrossNodes(*nb, pb, *na, pa, large, 62);
  sent1 = TxBytes(a, a1) - before1;
  sent2 = TxBytes(a, a2) - before2;
  // (At least 4 slices each: the balance depends on the CPU here, as above.)
  const uint64_t share = uint64_t{4} * (512 << 10);
  std::cerr << "striped: cable 1 " << sent1 << " bytes, cable 2 " << sent2 << "\n";
  EXPECT_GT(sent1, share) << "cable 1 carried " << sent1 << " bytes, cable 2 " << sent2 << "\n" << na->Log();
  EXPECT_GT(sent2, share) << "cable 1 carried " << sent1 << " bytes, cable 2 " << sent2 << "\n" << na->Log();

  // What each side says of its NICs (kubectl podlink links).
  json links = LinksOf(*na);
  ASSERT_TRUE(links.is_object());
  std::map<std::string, json> own;
  for (const json& l : links["links"]) own[l["netdev"]] = l;
  ASSERT_EQ(own.size(), 2u) << links.dump();
  EXPECT_EQ(own[a1]["address"], "10.77.1.1/30");
  EXPECT_EQ(own[a1]["speed_mbps"], 1000);
  EXPECT_EQ(own[a2]["speed_mbps"], 100000);
  EXPECT_NE(own[a2]["pci_path"].get<std::string>().find("0000:02:00.0"), std::string::npos) << links.dump();
  EXPECT_EQ(own[a2]["numa_node"], 0);
  EXPECT_EQ(own[a2]["rdma_device"], "");
  ASSERT_EQ(links["peers"].size(), 1u);
  std::map<std::string, json> theirs;
  for (const json& l : links["peers"][0]["links"]) theirs[l["address"]] = l;
  ASSERT_EQ(theirs.size(), 2u) << links.dump();
  EXPECT_EQ(theirs["10.77.1.2/30"]["netdev"], b1);
  EXPECT_EQ(theirs["10.77.2.2/30"]["netdev"], b2);
  // (podlinkd sees the host's /sys, as in a DaemonSet with the host's
  // network; the harness only moves it into the node's network namespace,
  // so node b cannot read its veths there: it says it does not know.)
  EXPECT_EQ(theirs["10.77.2.2/30"]["speed_mbps"], 0);
  EXPECT_EQ(theirs["10.77.2.2/30"]["pci_path"], "");
  int rc = -1;
  std::string text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links --socket ", na->dir()), &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find(absl::StrCat("link 10.77.2.1/30 ", a2, " 100 Gb/s 0000:02:00.0 NUMA 0")), std::string::npos)
      << text;
  EXPECT_NE(text.find(absl::StrCat("its link 10.77.1.2/30 ", b1, " speed ?")), std::string::npos) << text;
}

// NCCL sees one device per rail group of the daemon's mesh NICs (the NICs
// under one PCIe bridge), with the group's speed, the fastest first; a pod
// can ask for one device per GPU instead. Node a's fake sysfs puts its first
// cable's NIC on a real PCI function of this machine (so the plugin can hand
// NCCL its path) and the other two, 100 Gb/s each, under one made-up switch
// port. Each rail device carries the conformance scenarios to node b over its
// own group's cables (its bounce buffers are exported with the group's PCI
// place as their mesh affinity).
TEST_F(Mesh, RailGroupsAreTheNcclDevicesWithTheirSpeed) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [a1, b1] = topo_.Cable(a, b, 1);
  auto [a2, b2] = topo_.Cable(a, b, 2);
  auto [a3, b3] = topo_.Cable(a, b, 3);
  const std::string sys = dir_ + "/sysfs-a";
  auto nic = [&](const std::string& dev, const std::string& pci, const char* speed) {
    Sh(absl::StrCat("mkdir -p ", sys, "/devices/", pci, " ", sys, "/class/net/", dev));
    std::ofstream(absl::StrCat(sys, "/devices/", pci, "/numa_node")) << "0\n";
    std::ofstream(absl::StrCat(sys, "/class/net/", dev, "/speed")) << speed << "\n";
    Sh(absl::StrCat("ln -s ", sys, "/devices/", pci, " ", sys, "/class/net/", dev, "/device"));
    Sh(absl::StrCat("mkdir -p ", sys, "/bus/pci/devices && ln -s ", sys, "/devices/", pci, " ", sys,
                    "/bus/pci/devices/", pci.substr(pci.rfind('/') + 1)));
  };
  // A real PCI function here, if the machine has one ("" in a container without PCI).
  std::string real;
  if (DIR* d = ::opendir("/sys/bus/pci/devices"); d != nullptr) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char* r = ::realpath(absl::StrCat("/sys/bus/pci/devices/", e->d_name).c_str(), nullptr);
      if (r != nullptr && std::string(r).rfind("/sys/devices/pci", 0) == 0) real = r;
      std::free(r);
      if (!real.empty()) break;
    }
    ::closedir(d);
  }
  nic(a1, real.empty() ? "pci0000:00/0000:00:01.0/0000:01:00.0" : real.substr(strlen("/sys/devices/")), "1000");
  nic(a2, "pci0000:00/0000:00:1c.7/0000:7e:00.0", "100000");
  nic(a3, "pci0000:00/0000:00:1c.7/0000:7e:00.1", "100000");
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "prefill-0", "job-7") + "," + Rule(pb, "ml", "decode-0", "job-7");
  auto na = StartNode("node-a", a, {a1, a2, a3}, pods, "", absl::StrCat(R"(, "sysfs": ")", sys, R"(")"));
  auto nb = StartNode("node-b", b, {b1, b2, b3}, pods);
  [[maybe_unused]] auto [plugin, peer, args] = NcclPeer();

  Pod send(*na, &pa, args, peer);
  Pod recv(*nb, &pb, args, peer);
  absl::Status veth = PodVeth(recv.pid(), send.pid(), absl::StrCat(topo_.tag(), "pr"), absl::StrCat(topo_.tag(), "ps"),
                              "10.78.9.1/24", "10.78.9.2/24");
  ASSERT_TRUE(veth.ok()) << veth;
  {
    // A pod that asks for one device per GPU (a veth of its own: the plugin needs an address to listen on).
    std::vector<std::string> gpu_args = args;
    gpu_args.push_back("PODLINK_NCCL_DEVICES=gpus");
    Pod gpus(*na, &pa, gpu_args, peer);
    veth = PodVeth(recv.pid(), gpus.pid(), absl::StrCat(topo_.tag(), "gr"), absl::StrCat(topo_.tag(), "gs"),
                   "10.78.8.1/24", "10.78.8.2/24");
    ASSERT_TRUE(veth.ok()) << veth;
    gpus.Send(R"({"cmd": "init"})");
    json g = gpus.Expect("ready");
    ASSERT_EQ(g["result"], 0) << g.dump();
    ASSERT_EQ(g["devices"].size(), 1u) << g.dump();
    EXPECT_EQ(g["devices"][0]["name"], "podlink0");
    EXPECT_EQ(g["devices"][0]["speed"], 3200000) << "one device per GPU: the relay's speed";
    gpus.Send(R"({"cmd": "exit"})");
    EXPECT_EQ(gpus.WaitFor(30000), std::optional<int>(0));
  }
  send.Send(R"({"cmd": "init"})");
  json r = send.Expect("ready");
  ASSERT_EQ(r["result"], 0) << r.dump();
  const json& devs = r["devices"];
  ASSERT_EQ(devs.size(), 2u) << r.dump();
  EXPECT_EQ(devs[0]["name"], absl::StrCat("podlink-", a2, "+", a3)) << r.dump();
  EXPECT_EQ(devs[0]["speed"], 200000) << r.dump();
  // A made-up PCI function is not handed to NCCL: the GPU's parent instead (none without a GPU).
  EXPECT_EQ(devs[0]["pci_path"].get<std::string>().find("0000:7e:00"), std::string::npos) << r.dump();
  if (!r["gpu"].get<bool>()) {
    EXPECT_EQ(devs[0]["pci_path"], "") << r.dump();
  }
  EXPECT_EQ(devs[1]["name"], absl::StrCat("podlink-", a1)) << r.dump();
  EXPECT_EQ(devs[1]["speed"], 1000) << r.dump();
  EXPECT_EQ(devs[1]["pci_path"], real) << r.dump();
  for (const json& d : devs) EXPECT_EQ(d["result"], 0) << r.dump();
  // Node b's daemon cannot read its veths' sysfs from the harness (as in
  // NicsAreAdvertised...): no PCI place, so one device per GPU.
  recv.Send(R"({"cmd": "init"})");
  json rb = recv.Expect("ready");
  ASSERT_EQ(rb["result"], 0) << rb.dump();
  ASSERT_EQ(rb["devices"].size(), 1u) << rb.dump();
  EXPECT_EQ(rb["devices"][0]["name"], "podlink0");

  // One connection on the sender's device `dev` running `sc`; the bytes each
  // of node a's cables carried meanwhile.
  auto run = [&](int dev, const char* sc) -> std::array<uint64_t, 3> {
    SCOPED_TRACE(absl::StrCat(sc, " on device ", dev));
    const std::array<uint64_t, 3> before = {TxBytes(a, a1), TxBytes(a, a2), TxBytes(a, a3)};
    NcclScenario(send, recv, *na, *nb, sc, dev);
    return {TxBytes(a, a1) - before[0], TxBytes(a, a2) - before[1], TxBytes(a, a3) - before[2]};
  };
  const uint64_t large = uint64_t{48} << 20;  // the large scenario writes 51 MiB
  std::array<uint64_t, 3> rail0 = run(0, "large");
  EXPECT_GT(rail0[1] + rail0[2], large) << "device 0 is " << a2 << "+" << a3;
  // (At least 4 slices each: how evenly depends on the CPU here, the cables being unshaped.)
  EXPECT_GT(rail0[1], uint64_t{2} << 20) << "striped over both of the group's cables: " << rail0[1] << ", " << rail0[2];
  EXPECT_GT(rail0[2], uint64_t{2} << 20) << "striped over both of the group's cables: " << rail0[1] << ", " << rail0[2];
  EXPECT_LT(rail0[0], uint64_t{4} << 20) << "the other rail's cable carried " << rail0[0] << " bytes";
  std::array<uint64_t, 3> rail1 = run(1, "large");
  EXPECT_GT(rail1[0], large) << "device 1 is " << a1;
  EXPECT_LT(rail1[1] + rail1[2], uint64_t{4} << 20) << "the other rail's cables carried " << rail1[1] + rail1[2];
  (void)run(1, "grouped");
  for (Pod* p : {&send, &recv}) p->Send(R"({"cmd": "exit"})");
  for (Pod* p : {&send, &recv}) EXPECT_EQ(p->WaitFor(30000), std::optional<int>(0));
}

// The seed's triangle (every pair of nodes its own cable and subnet) plus a
// node D cabled only to C: each daemon reaches each neighbour over the cable
// to it and no other, and a node with no common subnet is refused clearly
// (there is no relay through C yet), never reached over some other network.
TEST_F(Mesh, TriangleUsesEachPairsOwnCableAndRefusesANodeWithoutOne) {
  std::string a = topo_.Node("a"), b = topo_.Node("b"), c = topo_.Node("c"), d = topo_.Node("d");
  auto [ab_a, ab_b] = topo_.Cable(a, b, 1);
  auto [bc_b, bc_c] = topo_.Cable(b, c, 2);
  auto [ac_a, ac_c] = topo_.Cable(a, c, 3);
  auto [cd_c, cd_d] = topo_.Cable(c, d, 4);
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable"), pc(RandomPodUid(), "burstable"),
      pd(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "a", "job-7") + "," + Rule(pb, "ml", "b", "job-7") + "," +
                     Rule(pc, "ml", "c", "job-7") + "," + Rule(pd, "ml", "d", "job-7");
  auto na = StartNode("node-a", a, {ab_a, ac_a}, pods);
  auto nb = StartNode("node-b", b, {ab_b, bc_b}, pods);
  auto nc = StartNode("node-c", c, {bc_c, ac_c, cd_c}, pods);
  auto nd = StartNode("node-d", d, {cd_d}, pods);
  const uint64_t size = 8 << 20;
  {
    // A to D before A knows any node that reaches D: no common subnet, no
    // relay; refused with both sides' addresses, not routed elsewhere.
    Pod server(*nd, &pd, {"kv-serve", "--size", "65536", "--verify", "1"});
    json s = server.Expect("serving");
    ASSERT_EQ(s["event"], "serving") << s.dump();
    Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "1"});
    json e = client.Expect("put");
    EXPECT_EQ(e["code"], "FAILED_PRECONDITION") << e.dump();
    EXPECT_NE(e["message"].get<std::string>().find("no direct link reaches node node-d"), std::string::npos) << e.dump();
    EXPECT_NE(e["message"].get<std::string>().find("10.77.4.2/30"), std::string::npos) << e.dump();
    server.Kill(SIGKILL);
  }
  // Every ordered pair of the triangle, each over its own cable only.
  struct Hop {
    Daemon* from;
    const PodCgroup* from_pod;
    std::string ns, on, off;  // the sender's namespace, the cable it must use, the one it must not
    Daemon* to;
    const PodCgroup* to_pod;
  };
  std::vector<Hop> hops = {{na.get(), &pa, a, ab_a, ac_a, nb.get(), &pb}, {na.get(), &pa, a, ac_a, ab_a, nc.get(), &pc},
                           {nb.get(), &pb, b, ab_b, bc_b, na.get(), &pa}, {nb.get(), &pb, b, bc_b, ab_b, nc.get(), &pc},
                           {nc.get(), &pc, c, ac_c, bc_c, na.get(), &pa}, {nc.get(), &pc, c, bc_c, ac_c, nb.get(), &pb}};
  int seed = 70;
  for (const Hop& h : hops) {
    uint64_t on0 = TxBytes(h.ns, h.on), off0 = TxBytes(h.ns, h.off);
    KvAcrossNodes(*h.to, *h.to_pod, *h.from, *h.from_pod, size, ++seed);
    uint64_t on = TxBytes(h.ns, h.on) - on0, off = TxBytes(h.ns, h.off) - off0;
    EXPECT_GE(on, size) << h.on << " carried " << on << " bytes";
    EXPECT_LT(off, size / 16) << h.off << " carried " << off << " bytes of a transfer not meant for it";
  }
  // A has talked to C now (C's Hello said its addresses, D's cable among
  // them): A to D goes through C, over A's cable to C and C's to D, byte
  // for byte, and D's daemon grants it to node-a's pod as relayed by C.
  uint64_t ac0 = TxBytes(a, ac_a), ab0 = TxBytes(a, ab_a), cd0 = TxBytes(c, cd_c);
  KvAcrossNodes(*nd, pd, *na, pa, size, ++seed);
  EXPECT_GE(TxBytes(a, ac_a) - ac0, size);
  EXPECT_LT(TxBytes(a, ab_a) - ab0, size / 16) << "the route through C does not touch B's cable";
  EXPECT_GE(TxBytes(c, cd_c) - cd0, size);
  EXPECT_NE(na->Log().find("event=mesh_route destination=node-d via=node-c"), std::string::npos) << na->Log();
  EXPECT_NE(nc->Log().find("event=mesh_relay_grant peer=node-a origin=node-a next=node-d"), std::string::npos)
      << nc->Log();
  EXPECT_NE(nd->Log().find("event=mesh_grant peer=node-c pod=ml/a "), std::string::npos) << nd->Log();
  EXPECT_NE(nd->Log().find(" origin=node-a"), std::string::npos) << nd->Log();
}

// A chain A - B - C - D in which each node is told only of its cable
// neighbours (mesh.peers): signed node adverts, traded hop by hop every
// second here, teach A of C and D, and A reaches D's pods through B and C
// (and D A's), byte for byte.
TEST_F(Mesh, NodeAdvertsTeachRoutesBeyondTheNeighbours) {
  std::string a = topo_.Node("a"), b = topo_.Node("b"), c = topo_.Node("c"), d = topo_.Node("d");
  auto [ab_a, ab_b] = topo_.Cable(a, b, 1);
  auto [bc_b, bc_c] = topo_.Cable(b, c, 2);
  auto [cd_c, cd_d] = topo_.Cable(c, d, 3);
  PodCgroup pa(RandomPodUid(), "burstable"), pd(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "a", "job-7") + "," + Rule(pd, "ml", "d", "job-7");
  auto peer = [](const std::string& node, const std::string& address) {
    return absl::StrCat(R"({"node": ")", node, R"(", "addresses": [")", address, R"("], "port": 7446})");
  };
  auto mesh = [](const std::vector<std::string>& peers) {
    return absl::StrCat(R"(, "advert_seconds": 1, "peers": [)", absl::StrJoin(peers, ", "), "]");
  };
  auto na = StartNode("node-a", a, {ab_a}, pods, "", mesh({peer("node-b", "10.77.1.2/30")}));
  auto nb = StartNode("node-b", b, {ab_b, bc_b}, pods, "",
                      mesh({peer("node-a", "10.77.1.1/30"), peer("node-c", "10.77.2.2/30")}));
  auto nc = StartNode("node-c", c, {bc_c, cd_c}, pods, "",
                      mesh({peer("node-b", "10.77.2.1/30"), peer("node-d", "10.77.3.2/30")}));
  auto nd = StartNode("node-d", d, {cd_d}, pods, "", mesh({peer("node-c", "10.77.3.1/30")}));
  ASSERT_TRUE(na->WaitForLog("event=mesh_node_learned node=node-d from=node-b", 20000)) << na->Log();
  ASSERT_TRUE(nd->WaitForLog("event=mesh_node_learned node=node-a from=node-c", 20000)) << nd->Log();
  EXPECT_NE(na->Log().find("event=mesh_node_learned node=node-c from=node-b"), std::string::npos) << na->Log();
  KvAcrossNodes(*nd, pd, *na, pa, 8 << 20, 91);  // A to D
  KvAcrossNodes(*na, pa, *nd, pd, 8 << 20, 92);  // D to A
  EXPECT_NE(na->Log().find("event=mesh_route destination=node-d via=node-b,node-c"), std::string::npos) << na->Log();
  EXPECT_NE(nd->Log().find("event=mesh_route destination=node-a via=node-c,node-b"), std::string::npos) << nd->Log();
  EXPECT_EQ(nb->Log().find("event=mesh_advert_refused"), std::string::npos) << nb->Log();
  // What operators see on A: every other node, C and D known from their adverts only.
  json links = LinksOf(*na);
  ASSERT_TRUE(links.is_object()) << links.dump();
  std::map<std::string, json> known;
  for (const json& k : links["known_nodes"]) known[k["node"]] = k;
  ASSERT_EQ(known.size(), 3u) << links.dump();
  for (const char* n : {"node-b", "node-c", "node-d"}) {
    EXPECT_GE(known[n]["advert_age_seconds"].get<int64_t>(), 0) << n << ": " << links.dump();
    EXPECT_LE(known[n]["advert_age_seconds"].get<int64_t>(), 10) << n << ": " << links.dump();
  }
  EXPECT_EQ(known["node-d"]["addresses"], json::array({"10.77.3.2/30"})) << links.dump();
  int rc = -1;
  std::string text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links --socket ", na->dir()), &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("KNOWN NODE"), std::string::npos) << text;
  EXPECT_NE(text.find("10.77.2.2/30,10.77.3.1/30"), std::string::npos) << text;  // node c, both cables
}

// A chain A - C - D: C relays for A and D, which have no cable to each
// other and know C from configuration (mesh.peers). Both directions byte for
// byte; the relayed rate beside the direct one on the same shaped cables
// (reported, not asserted); then C killed mid-transfer fails the transfer
// with UNAVAILABLE within the bound.
TEST_F(Mesh, ARelayCarriesNodesWithoutACableAndItsDeathFailsCleanly) {
  std::string a = topo_.Node("a"), c = topo_.Node("c"), d = topo_.Node("d");
  auto [ac_a, ac_c] = topo_.Cable(a, c, 3);
  auto [cd_c, cd_d] = topo_.Cable(c, d, 4);
  for (const auto& [ns, dev] : std::vector<std::pair<std::string, std::string>>{
           {a, ac_a}, {c, ac_c}, {c, cd_c}, {d, cd_d}}) {
    Shape(ns, dev);
  }
  PodCgroup pa(RandomPodUid(), "burstable"), pc(RandomPodUid(), "burstable"), pd(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "a", "job-7") + "," + Rule(pc, "ml", "c", "job-7") + "," + Rule(pd, "ml", "d", "job-7");
  const std::string knows_c = R"(, "peers": [{"node": "node-c", "addresses": ["10.77.3.2/30", "10.77.4.1/30"], "port": 7446}])";
  auto na = StartNode("node-a", a, {ac_a}, pods, "", knows_c);
  auto nc = StartNode("node-c", c, {ac_c, cd_c}, pods);
  auto nd = StartNode("node-d", d, {cd_d}, pods, "", knows_c);
  const uint64_t size = 32 << 20;
  KvAcrossNodes(*nd, pd, *na, pa, size, 81);  // A to D
  KvAcrossNodes(*na, pa, *nd, pd, size, 82);  // D to A
  EXPECT_NE(nd->Log().find("event=mesh_route destination=node-a via=node-c"), std::string::npos) << nd->Log();
  // The rates, one shaped cable direct (A to C) and through the relay (A to D).
  auto rate = [&](Daemon& to, const PodCgroup& owner, int seed) -> double {
    Pod server(to, &owner, {"kv-serve", "--size", std::to_string(size), "--verify", std::to_string(seed)});
    json s = server.Expect("serving");
    Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", std::to_string(seed), "--repeat", "3"});
    json put = client.Expect("put", 60000);
    EXPECT_EQ(put["event"], "put") << put.dump();
    json v = server.Expect("verified", 60000);
    EXPECT_EQ(v["mismatches"], 0) << v.dump();
    return put.value("gbps", 0.0);
  };
  double direct = rate(*nc, pc, 83), relayed = rate(*nd, pd, 84);
  std::printf("RESULT mesh_relay cable=200mbit bytes=%llu direct_gbps=%.4f relayed_gbps=%.4f ratio=%.3f\n",
              static_cast<unsigned long long>(size), direct, relayed, direct > 0 ? relayed / direct : 0.0);
  EXPECT_GT(relayed, 0.0);
  // The relay dies while a 256 MiB write goes through it (about 10 s at the shaped rate).
  Pod server(*nd, &pd, {"kv-serve", "--size", std::to_string(256 << 20), "--verify", "5"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  const size_t grants_before = CountInLog(*nc, "event=mesh_relay_grant ");
  Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "5"});
  ASSERT_TRUE(WaitForCount(*nc, "event=mesh_relay_grant ", grants_before + 1)) << nc->Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  {
    // What operators see meanwhile: on A the route to D through C, on C the
    // region it relays.
    json links = LinksOf(*na);
    ASSERT_TRUE(links.is_object()) << links.dump();
    bool via_c = false;
    for (const json& r : links["routes"]) {
      if (r["destination"] == "node-d" && r["via"] == json::array({"node-c"}) && r["remote_handles"] == 1) via_c = true;
    }
    EXPECT_TRUE(via_c) << links.dump();
    links = LinksOf(*nc);
    ASSERT_TRUE(links.is_object()) << links.dump();
    EXPECT_EQ(links["relayed_grants"], 1) << links.dump();
    EXPECT_GT(links["relay_forwarded_bytes"].get<uint64_t>(), 2ull * size) << links.dump();
    int rc = 0;
    std::string text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links --socket ", na->dir()), &rc);
    EXPECT_NE(text.find("via node-c"), std::string::npos) << text;
  }
  auto t0 = std::chrono::steady_clock::now();
  ::kill(nc->pid(), SIGKILL);
  json e = client.Expect("put", 30000);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(e["event"], "error") << e.dump();
  EXPECT_EQ(e["code"], "UNAVAILABLE") << e.dump();
  EXPECT_LT(took, std::chrono::seconds(15)) << "the failure took too long to surface";
  EXPECT_EQ(client.Wait(), 1);
  EXPECT_TRUE(na->Alive());
  EXPECT_TRUE(nd->Alive());
}

// Two-hop striping (mesh.two_hop_stripe): A and B are cabled to each other,
// C to both, every cable shaped alike. A's transfers to B's pod also go
// through C: byte for byte, writes and reads, each route carrying a real
// share (the rates: tests/mesh/bench.sh). Then C is killed mid-write: its chunks go again
// over A's cable to B once B has fenced the route through C, and the write
// completes byte for byte.
TEST_F(Mesh, TwoHopStripingAddsARelaysCablesAndOutlivesTheRelay) {
  Triangle t;
  JoinTriangle(t);
  [[maybe_unused]] auto& [a, b, c, ab_a, ab_b, bc_b, bc_c, ac_a, ac_c, pa, pb, pods] = t;
  for (const auto& [ns, dev] : std::vector<std::pair<std::string, std::string>>{
           {a, ab_a}, {a, ac_a}, {b, ab_b}, {b, bc_b}, {c, bc_c}, {c, ac_c}}) {
    Shape(ns, dev);
  }
  auto na = StartNode("node-a", a, {ab_a, ac_a}, pods, "", kStripesThroughC);
  auto nb = StartNode("node-b", b, {ab_b, bc_b}, pods);
  auto nc = StartNode("node-c", c, {bc_c, ac_c}, pods);
  auto metric = [&](const std::string& series) { return MetricOf(a, *na, series); };
  const uint64_t size = 32 << 20;
  // A to B: the route through C opens beside the direct one (the pod waits a
  // second before writing, so every transfer finds it), three whole writes,
  // then a read back; both sides check every byte.
  uint64_t ab0 = TxBytes(a, ab_a), ac0 = TxBytes(a, ac_a);
  KvAcrossNodes(*nb, pb, *na, pa, size, 101, {}, {"--idle-ms", "1000", "--repeat", "3"});
  uint64_t direct_bytes = TxBytes(a, ab_a) - ab0, relay_bytes = TxBytes(a, ac_a) - ac0;
  EXPECT_TRUE(na->WaitForLog("event=mesh_two_hop destination=node-b relay=node-c")) << na->Log();
  EXPECT_NE(nc->Log().find("event=mesh_relay_grant peer=node-a origin=node-a next=node-b"), std::string::npos)
      << nc->Log();
  EXPECT_NE(nb->Log().find("event=mesh_grant peer=node-c pod=ml/a "), std::string::npos) << nb->Log();
  // Each route carried a real share of the 3 writes (96 MiB).
  EXPECT_GT(relay_bytes, 3 * size / 5) << "direct " << direct_bytes << ", through C " << relay_bytes;
  EXPECT_GT(direct_bytes, 3 * size / 5) << "direct " << direct_bytes << ", through C " << relay_bytes;
  EXPECT_GE(metric("podlink_mesh_two_hop_transfers_total"), 4.0);  // 3 writes and a read, at least one op each
  EXPECT_GT(metric("podlink_mesh_two_hop_bytes_total"), static_cast<double>(size));
  EXPECT_GT(TxBytes(c, bc_c), 3 * size / 5) << "C passed on to B what A sent it for B";
  EXPECT_EQ(metric("podlink_mesh_two_hop_failovers_total"), 0.0);
  std::printf("RESULT mesh_two_hop cable=200mbit bytes=%llu direct_share=%.3f\n",
              static_cast<unsigned long long>(3 * size),
              static_cast<double>(direct_bytes) / static_cast<double>(direct_bytes + relay_bytes));

  // C dies while a 128 MiB write to B is striped through it (about 3 s over
  // both routes).
  Pod server(*nb, &pb, {"kv-serve", "--size", std::to_string(128 << 20), "--verify", "103"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  const size_t routes = CountInLog(*na, "event=mesh_two_hop destination=node-b");
  const double striped_before = metric("podlink_mesh_two_hop_transfers_total");
  Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "103", "--idle-ms", "1500"});
  // Timed from the pod's own word (it writes 1.5 s after saying "idle"), not
  // from metrics polled through python, which lag on a slow (TSan) run.
  ASSERT_EQ(client.Expect("idle")["event"], "idle");
  const auto idle = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitForCount(*na, "event=mesh_two_hop destination=node-b", routes + 1)) << na->Log();
  std::this_thread::sleep_until(idle + std::chrono::milliseconds(2300));  // 0.8 s into the write
  ::kill(nc->pid(), SIGKILL);
  const auto killed_after = std::chrono::steady_clock::now() - idle;
  json put = client.Expect("put", 60000);
  ASSERT_EQ(put["event"], "put") << put.dump() << "\n" << na->Log();
  json v = server.Expect("verified", 60000);
  EXPECT_EQ(v["mismatches"], 0) << v.dump();
  EXPECT_EQ(v["notification"], 1);
  EXPECT_EQ(server.Wait(), 0);
  EXPECT_EQ(client.Wait(), 0);
  EXPECT_NE(na->Log().find("event=mesh_two_hop_down relay=node-c"), std::string::npos) << na->Log();
  EXPECT_NE(nb->Log().find("event=mesh_fence origin=node-a grants=1"), std::string::npos) << nb->Log();
  EXPECT_GT(metric("podlink_mesh_two_hop_transfers_total"), striped_before);
  EXPECT_GE(metric("podlink_mesh_two_hop_failovers_total"), 1.0);
  EXPECT_GE(metric("podlink_mesh_two_hop_fences_total"), 1.0);
  // The failover as the logs tell it (for people reading the test's output).
  for (const auto& [d, what] : std::vector<std::pair<Daemon*, std::string>>{
           {na.get(), "event=mesh_two_hop"}, {nb.get(), "event=mesh_fence"}}) {
    for (absl::string_view line : absl::StrSplit(d->Log(), '\n')) {
      if (absl::StrContains(line, what)) std::cerr << line << "\n";
    }
  }
  std::cerr << "killed node c " << std::chrono::duration<double>(killed_after).count()
            << " s after the pod went idle (it writes 1.5 s after that); the write took " << put["seconds"] << " s\n";
  EXPECT_TRUE(na->Alive());
  EXPECT_TRUE(nb->Alive());
}

// Two-hop striping with GPU memory at both ends (skipped without a GPU): the
// importer's staging and the owner's GPU frames, over both routes.
TEST_F(Mesh, TwoHopStripingCarriesGpuMemory) {
  auto d = cu::LoadDriver();
  int n = 0;
  if (!d.ok() || (*d)->DeviceGetCount(&n) != cu::kSuccess || n == 0) GTEST_SKIP() << "no GPU";
  Triangle t;
  JoinTriangle(t);
  [[maybe_unused]] auto& [a, b, c, ab_a, ab_b, bc_b, bc_c, ac_a, ac_c, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {ab_a, ac_a}, pods, "", kStripesThroughC, /*gpu=*/true);
  auto nb = StartNode("node-b", b, {ab_b, bc_b}, pods, "", "", /*gpu=*/true);
  auto nc = StartNode("node-c", c, {bc_c, ac_c}, pods);
  const std::vector<std::string> striped = {"--idle-ms", "1000", "--repeat", "2"};
  auto with = [&](std::vector<std::string> v) {
    v.insert(v.end(), striped.begin(), striped.end());
    return v;
  };
  const uint64_t size = 48 << 20;
  KvAcrossNodes(*nb, pb, *na, pa, size, 121, {"--gpu", "0"}, with({}));               // host on a -> GPU on b
  KvAcrossNodes(*nb, pb, *na, pa, size, 122, {"--gpu", "0"}, with({"--gpu", "0"}));  // GPU on a -> GPU on b
  EXPECT_TRUE(na->WaitForLog("event=mesh_two_hop destination=node-b relay=node-c")) << na->Log();
  EXPECT_GE(MetricOf(a, *na, "podlink_mesh_two_hop_transfers_total"), 4.0);
  EXPECT_GT(MetricOf(a, *na, "podlink_mesh_two_hop_bytes_total"), static_cast<double>(size));
  EXPECT_EQ(MetricOf(a, *na, "podlink_mesh_two_hop_failovers_total"), 0.0);
  EXPECT_NE(nb->Log().find("event=mesh_grant peer=node-c pod=ml/a "), std::string::npos) << nb->Log();
}

// Why the fence: a relay that stalls (SIGSTOP: its kernel keeps the
// connections up) holds chunks it may still deliver later. A's chunks on it
// go unanswered for mesh.answer_timeout_seconds (3 here), then go direct once
// B fenced the route; A then writes the region again with other bytes; C
// resumes. C's cable to B is slower than A's to C, so C holds slices it read
// but has not sent yet when it stops. Without the fence they land over the
// new bytes when C resumes (checked: B's second check, 4 s later, found
// them); with it, none.
TEST_F(Mesh, AStalledRelaysChunksCannotLandAfterTheDirectCopy) {
  Triangle t;
  JoinTriangle(t);
  [[maybe_unused]] auto& [a, b, c, ab_a, ab_b, bc_b, bc_c, ac_a, ac_c, pa, pb, pods] = t;
  Shape(a, ab_a);
  Shape(a, ac_a);
  Shape(c, bc_c, "50mbit");
  auto na = StartNode("node-a", a, {ab_a, ac_a}, pods, "",
                      absl::StrCat(kStripesThroughC, R"(, "answer_timeout_seconds": 3)"));
  auto nb = StartNode("node-b", b, {ab_b, bc_b}, pods);
  auto nc = StartNode("node-c", c, {bc_c, ac_c}, pods);
  const uint64_t size = 64 << 20;
  Pod server(*nb, &pb, {"kv-serve", "--size", std::to_string(size), "--verify", "112", "--verify-again-ms", "4000"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "111", "--rewrite-seed", "112", "--idle-ms",
                        "1500"});
  ASSERT_TRUE(na->WaitForLog("event=mesh_two_hop destination=node-b relay=node-c", 20000)) << na->Log();
  ASSERT_EQ(client.Expect("idle")["event"], "idle");
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));  // 0.7 s into the striped write
  ASSERT_EQ(::kill(nc->pid(), SIGSTOP), 0);
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{nc->pid()};
  json put = client.Expect("put", 60000);
  ASSERT_EQ(put["event"], "put") << put.dump() << "\n" << na->Log();
  json again = client.Expect("rewrote", 60000);
  ASSERT_EQ(again["event"], "rewrote") << again.dump();
  json v = server.Expect("verified", 60000);
  EXPECT_EQ(v["mismatches"], 0) << v.dump();
  ::kill(nc->pid(), SIGCONT);  // whatever C still holds may go now
  json late = server.Expect("verified_again", 20000);
  EXPECT_EQ(late["mismatches"], 0) << late.dump() << " (a stalled relay's chunks landed after the direct copy)";
  EXPECT_EQ(server.Wait(), 0);
  EXPECT_EQ(client.Wait(), 0);
  EXPECT_NE(na->Log().find("event=mesh_two_hop_down relay=node-c"), std::string::npos) << na->Log();
  EXPECT_NE(nb->Log().find("event=mesh_fence origin=node-a grants=1"), std::string::npos) << nb->Log();
  std::cerr << "first write " << put["seconds"] << " s (C stopped 0.7 s in), second " << again["seconds"] << " s\n";
  EXPECT_TRUE(nc->Alive());
}

TEST_F(Mesh, PolicyOfTheOwnersNodeDecides) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [da, db] = topo_.Cable(a, b, 1);
  PodCgroup owner(RandomPodUid(), "burstable"), intruder(RandomPodUid(), "burstable"),
      foreign(RandomPodUid(), "burstable");
  std::string pods = Rule(owner, "ml", "decode-0", "job-7") + "," + Rule(intruder, "ml", "intruder", "job-8") +
                     "," + Rule(foreign, "other", "prefill-0", "job-7");
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  Pod server(*nb, &owner, {"kv-serve", "--size", "65536", "--verify", "1"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  {
    Pod c(*na, &intruder, {"kv-put", "--desc", s["descriptor"], "--seed", "1"});
    json e = c.Expect("put");
    EXPECT_EQ(e["code"], "PERMISSION_DENIED") << e.dump();
  }
  {
    Pod c(*na, &foreign, {"kv-put", "--desc", s["descriptor"], "--seed", "1"});
    json e = c.Expect("put");
    EXPECT_EQ(e["code"], "NOT_FOUND") << e.dump();  // another namespace learns nothing
  }
  EXPECT_TRUE(nb->WaitForLog("event=deny remote=mesh:node-a pod=ml/intruder"));
}

// The test process is a hostile peer of node b, with a cable of its own.
class MeshHostile : public Mesh {
 protected:
  void SetUp() override {
    Mesh::SetUp();
    if (IsSkipped()) return;
    std::string a = topo_.Node("a"), b = topo_.Node("b");
    auto [da, db] = topo_.Cable(a, b, 1);
    b_addr_ = topo_.HostCable(b, 9);
    std::string pods = Rule(owner_, "ml", "decode-0", "job-7") + "," + Rule(other_, "ml", "prefill-0", "job-7");
    na_ = StartNode("node-a", a, {da}, pods);
    nb_ = StartNode("node-b", b, {db}, pods);
    server_ = std::make_unique<Pod>(*nb_, &owner_,
                                    std::vector<std::string>{"kv-serve", "--size", "65536", "--verify", "1"});
    json s = server_->Expect("serving");
    ASSERT_EQ(s["event"], "serving") << s.dump();
    // podlink2;<node id>;<export id>;...
    std::vector<std::string> f = absl::StrSplit(s["descriptor"].get<std::string>(), ';');
    ASSERT_GE(f.size(), 3u);
    export_id_ = std::stoull(f[2]);
  }
  void TearDown() override {
    server_.reset();
    Mesh::TearDown();
  }
  std::unique_ptr<pb::Mesh::Stub> Stub(const std::string& cert_dir, const std::string& target_name = "node-b") {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ReadFile(ca_->ca());
    if (!cert_dir.empty()) {
      tls.pem_private_key = ReadFile(cert_dir + "/tls.key");
      tls.pem_cert_chain = ReadFile(cert_dir + "/tls.crt");
    }
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride(target_name);
    return pb::Mesh::NewStub(grpc::CreateCustomChannel(b_addr_ + ":7446", grpc::SslCredentials(tls), args));
  }
  grpc::Status Open(pb::Mesh::Stub& stub, const std::string& claimed_node, pb::OpenRegionResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::OpenRegionRequest req;
    req.mutable_importer()->set_node(claimed_node);
    req.mutable_importer()->set_key("pod-key");
    req.mutable_importer()->set_namespace_("ml");
    req.mutable_importer()->set_pod_name("prefill-0");
    (*req.mutable_importer()->mutable_annotations())["podlink.io/peer-group"] = "job-7";
    req.set_export_id(export_id_);
    return stub.OpenRegion(&ctx, req, resp);
  }

  // A routed open as a relay passes it on: the origin's signed claim.
  struct Claim {
    std::string origin = "node-a", importer_node = "node-a", signer = "claim-a", cert = "claim-a";
    std::string destination = "node-b";
    std::vector<std::string> via = {"node-t"};
    int64_t age_seconds = 0;
    uint64_t nonce = 0;
    bool fenceable = false;
  };
  // Opens the fixture's export through `stub` under `c`, signed with the key
  // in dir_/<c.signer>.
  grpc::Status OpenRouted(pb::Mesh::Stub& stub, const Claim& c, pb::OpenRegionResponse* resp) {
    pb::OriginClaim claim;
    claim.set_origin(c.origin);
    pb::ForwardedIdentity* who = claim.mutable_importer();
    who->set_node(c.importer_node);
    who->set_key("pod-key");
    who->set_namespace_("ml");
    who->set_pod_name("prefill-0");
    (*who->mutable_annotations())["podlink.io/peer-group"] = "job-7";
    claim.mutable_destination()->set_node(c.destination);
    claim.mutable_destination()->add_addresses("10.77.1.2/30");
    claim.mutable_destination()->set_port(7446);
    for (const std::string& v : c.via) claim.add_via(v);
    claim.set_export_id(export_id_);
    claim.set_issued_unix_seconds(absl::ToUnixSeconds(absl::Now()) - c.age_seconds);
    claim.set_nonce(c.nonce);
    claim.set_fenceable(c.fenceable);
    pb::OpenRegionRequest req;
    *req.mutable_importer() = *who;  // ignored for routed requests: the claim decides
    req.set_export_id(export_id_);
    claim.SerializeToString(req.mutable_route()->mutable_claim());
    absl::StatusOr<std::string> sig =
        mesh::SignWithKey(ReadFile(dir_ + "/" + c.signer + "/tls.key"), req.route().claim());
    EXPECT_TRUE(sig.ok()) << sig.status();
    req.mutable_route()->set_signature(sig.value_or(""));
    req.mutable_route()->set_origin_cert(ReadFile(dir_ + "/" + c.cert + "/tls.crt"));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return stub.OpenRegion(&ctx, req, resp);
  }

  PodCgroup owner_{RandomPodUid(), "burstable"}, other_{RandomPodUid(), "burstable"};
  std::unique_ptr<Daemon> na_, nb_;
  std::unique_ptr<Pod> server_;
  std::string b_addr_;
  uint64_t export_id_ = 0;
};

TEST_F(MeshHostile, APeerWithoutAValidCertificateGetsNothing) {
  pb::OpenRegionResponse resp;
  // No client certificate at all.
  grpc::Status st = Open(*Stub(""), "node-x", &resp);
  EXPECT_FALSE(st.ok());
  // A certificate from another CA, naming a real node.
  TestCa evil(dir_ + "/evil-ca");
  evil.Issue("node-a", dir_ + "/evil-a", ca_->ca());
  st = Open(*Stub(dir_ + "/evil-a"), "node-a", &resp);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(resp.grant(), 0u);
  // The importer checks the exporter too: node b's certificate does not name node-c.
  ca_->Issue("node-t", dir_ + "/node-t");
  st = Open(*Stub(dir_ + "/node-t", "node-c"), "node-t", &resp);
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(nb_->Log().find("event=mesh_grant") != std::string::npos) << nb_->Log();
}

TEST_F(MeshHostile, ADaemonSpeaksOnlyForItsOwnNodesPods) {
  ca_->Issue("node-t", dir_ + "/node-t");
  auto stub = Stub(dir_ + "/node-t");
  pb::OpenRegionResponse resp;
  grpc::Status st = Open(*stub, "node-a", &resp);  // node-t claims a pod of node-a
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  st = Open(*stub, "node-b", &resp);  // or one of node b itself
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  // Its own pod, in the group: granted.
  st = Open(*stub, "node-t", &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_NE(resp.grant(), 0u);
  // A certificate naming node b itself cannot open anything on node b.
  ca_->Issue("node-b", dir_ + "/fake-b");
  st = Open(*Stub(dir_ + "/fake-b"), "node-b", &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
}

// Requests through relays carry the origin's signed claim; a relay (or any
// node with a certificate) cannot use it to speak for pods of another node,
// reuse it from elsewhere on the route, or make one up.
TEST_F(MeshHostile, ARelayCannotSpeakForAnotherNodesPods) {
  ca_->Issue("node-t", dir_ + "/node-t");
  ca_->Issue("node-u", dir_ + "/node-u");
  ca_->Issue("node-a", dir_ + "/claim-a");  // node a's key, to sign as node a would
  ca_->Issue("node-b", dir_ + "/claim-b");
  auto t = Stub(dir_ + "/node-t"), u = Stub(dir_ + "/node-u");
  pb::OpenRegionResponse resp;
  // The honest case: node a's pod through relay t, which B serves as node-a's pod.
  grpc::Status st = OpenRouted(*t, Claim{}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_NE(resp.grant(), 0u);
  EXPECT_NE(nb_->Log().find("event=mesh_grant peer=node-t pod=ml/prefill-0"), std::string::npos) << nb_->Log();
  EXPECT_NE(nb_->Log().find(" origin=node-a"), std::string::npos) << nb_->Log();
  struct Case {
    const char* what;
    pb::Mesh::Stub* from;
    Claim claim;
  };
  std::vector<Case> cases;
  cases.push_back({"the claim presented by a node not on its route", u.get(), Claim{}});
  {
    Claim c;
    c.signer = "node-t";  // t signs a claim for node a's pod with its own key
    cases.push_back({"signed by the relay, not the origin", t.get(), c});
  }
  {
    Claim c;
    c.signer = c.cert = "node-t";  // t's certificate, origin still node a
    cases.push_back({"the relay's own certificate for another origin", t.get(), c});
  }
  {
    Claim c;
    c.age_seconds = 600;
    cases.push_back({"a stale claim", t.get(), c});
  }
  {
    Claim c;
    c.importer_node = "node-c";
    cases.push_back({"an origin speaking for another node's pod", t.get(), c});
  }
  {
    Claim c;
    c.origin = c.importer_node = "node-b";
    c.signer = c.cert = "claim-b";
    cases.push_back({"a claim for the owner's own node's pods", t.get(), c});
  }
  {
    Claim c;
    c.via = {"node-t", "node-t"};
    cases.push_back({"a route through one node twice", t.get(), c});
  }
  {
    Claim c;
    c.via = {"node-x", "node-y", "node-z", "node-t"};
    cases.push_back({"a route over the relay bound", t.get(), c});
  }
  {
    Claim c;
    c.via = {};
    cases.push_back({"a route without relays", t.get(), c});
  }
  for (const Case& c : cases) {
    pb::OpenRegionResponse r;
    st = OpenRouted(*c.from, c.claim, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << c.what << ": " << st.error_message();
    EXPECT_EQ(r.grant(), 0u) << c.what;
    std::printf("refused: %s: %s\n", c.what, st.error_message().c_str());
  }
  {
    // Garbage in the route.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::OpenRegionRequest req;
    req.set_export_id(export_id_);
    req.mutable_route()->set_claim(std::string(100, '\xff'));
    req.mutable_route()->set_signature("x");
    pb::OpenRegionResponse r;
    st = t->OpenRegion(&ctx, req, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  }
  {
    // B asked to relay on (t is the origin, B the relay) toward a node it has
    // no cable to: refused with a reason, in bounded time, nothing granted.
    Claim c;
    c.origin = c.importer_node = "node-t";
    c.signer = c.cert = "node-t";
    c.destination = "node-z";
    c.via = {"node-b"};
    auto t0 = std::chrono::steady_clock::now();
    pb::OpenRegionResponse r;
    st = OpenRouted(*t, c, &r);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  }
  EXPECT_TRUE(nb_->Alive());
}

// FenceRoute closes a route's grants only for the node that signed the
// route, and only a route it signed fenceable: not for the relay that carried
// the claim (it saw the nonce), not for any other node, never with nonce 0;
// and the relay cannot get a new grant by presenting the claim again.
TEST_F(MeshHostile, OnlyARoutesOriginCanFenceIt) {
  ca_->Issue("node-t", dir_ + "/node-t");
  ca_->Issue("node-u", dir_ + "/node-u");
  ca_->Issue("node-a", dir_ + "/claim-a");
  auto t = Stub(dir_ + "/node-t"), u = Stub(dir_ + "/node-u"), origin = Stub(dir_ + "/claim-a");
  Claim c;
  c.nonce = 0x5eed5eed5eedull;
  c.fenceable = true;
  pb::OpenRegionResponse resp;
  grpc::Status st = OpenRouted(*t, c, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  Claim plain;  // a route the origin did not sign fenceable: no fence reaches it
  plain.nonce = 0x0bad0bad0badull;
  pb::OpenRegionResponse plain_resp;
  ASSERT_TRUE(OpenRouted(*t, plain, &plain_resp).ok());
  pb::OpenRegionResponse direct;
  ASSERT_TRUE(Open(*u, "node-u", &direct).ok());  // a direct grant (nonce 0) of another node
  auto fence = [](pb::Mesh::Stub& stub, uint64_t nonce, uint32_t* closed) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::FenceRouteRequest req;
    req.set_nonce(nonce);
    pb::FenceRouteResponse r;
    grpc::Status st = stub.FenceRoute(&ctx, req, &r);
    *closed = r.grants_closed();
    return st;
  };
  uint32_t closed = 99;
  EXPECT_TRUE(fence(*t, c.nonce, &closed).ok());
  EXPECT_EQ(closed, 0u) << "the relay fenced the origin's route";
  EXPECT_TRUE(fence(*u, c.nonce, &closed).ok());
  EXPECT_EQ(closed, 0u) << "a stranger fenced the origin's route";
  st = fence(*u, 0, &closed);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_EQ(CountInLog(*nb_, "event=mesh_fence origin=node-a"), 0u) << nb_->Log();
  EXPECT_NE(nb_->Log().find("event=mesh_fence origin=node-t grants=0"), std::string::npos) << nb_->Log();
  // The origin fences it: the relay's grant is gone (its frames are refused
  // from now on), the stranger's direct grant stays.
  EXPECT_TRUE(fence(*origin, c.nonce, &closed).ok());
  EXPECT_EQ(closed, 1u);
  EXPECT_TRUE(nb_->WaitForLog("event=mesh_fence origin=node-a grants=1"));
  EXPECT_TRUE(fence(*origin, c.nonce, &closed).ok());
  EXPECT_EQ(closed, 0u) << "fenced twice";
  EXPECT_TRUE(fence(*origin, plain.nonce, &closed).ok());
  EXPECT_EQ(closed, 0u) << "a route not signed fenceable was fenced";
  // The relay presents the fenced claim again: refused.
  pb::OpenRegionResponse again;
  st = OpenRouted(*t, c, &again);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_NE(st.error_message().find("fenced this route"), std::string::npos) << st.error_message();
  EXPECT_EQ(again.grant(), 0u);
  json links = LinksOf(*nb_);
  ASSERT_TRUE(links.is_object()) << links.dump();
  EXPECT_EQ(links["grants"], 2) << links.dump();  // the stranger's direct grant and the plain route's
}

// The verbs control messages are hostile input too: a peer daemon chooses
// the address, GID, MTU and QP list of OpenVerbs and asks for registrations.
// Adverts a peer passes on are believed only when signed by the node they
// name under the mesh CA: a node cannot advertise another, change another's
// advert, or use a key from another CA; its own advert is taken and passed on.
TEST_F(MeshHostile, NodeAdvertsMustBeSignedByTheNodeTheyName) {
  ca_->Issue("node-t", dir_ + "/node-t");
  ca_->Issue("node-u", dir_ + "/node-u");
  TestCa evil(dir_ + "/evil-ca");
  evil.Issue("node-v", dir_ + "/evil-v", ca_->ca());
  auto advert = [&](const std::string& node, const std::string& signer_dir, const std::string& address) {
    pb::AdvertEntry e;
    e.mutable_node()->set_node(node);
    e.mutable_node()->add_addresses(address);
    e.mutable_node()->set_port(7446);
    e.set_issued_unix_seconds(absl::ToUnixSeconds(absl::Now()));
    pb::NodeAdvert a;
    e.SerializeToString(a.mutable_entry());
    absl::StatusOr<std::string> sig = mesh::SignWithKey(ReadFile(signer_dir + "/tls.key"), a.entry());
    EXPECT_TRUE(sig.ok()) << sig.status();
    a.set_signature(sig.value_or(""));
    a.set_cert(ReadFile(signer_dir + "/tls.crt"));
    return a;
  };
  auto hello = [&](const std::vector<pb::NodeAdvert>& adverts, pb::HelloResponse* resp) {
    auto stub = Stub(dir_ + "/node-t");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::HelloRequest req;
    req.set_version("test");
    req.set_instance(77);
    for (const pb::NodeAdvert& a : adverts) *req.add_adverts() = a;
    return stub->Hello(&ctx, req, resp);
  };
  pb::NodeAdvert tampered = advert("node-t", dir_ + "/node-t", "10.98.0.1/24");
  pb::AdvertEntry e;
  ASSERT_TRUE(e.ParseFromString(tampered.entry()));
  e.mutable_node()->set_addresses(0, "10.98.7.1/24");  // changed after signing
  e.SerializeToString(tampered.mutable_entry());
  pb::NodeAdvert garbage;
  garbage.set_entry(std::string(8 << 10, 'x'));
  pb::HelloResponse resp;
  grpc::Status st = hello({advert("node-y", dir_ + "/node-t", "10.99.0.1/24"),  // node t speaking for node y
                           tampered, advert("node-v", dir_ + "/evil-v", "10.97.0.1/24"), garbage,
                           advert("node-u", dir_ + "/node-u", "10.96.0.1/24")},  // genuine, passed on by t
                          &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_GE(resp.adverts_size(), 1);
  EXPECT_TRUE(nb_->WaitForLog("event=mesh_advert_refused from=node-t node=node-y")) << nb_->Log();
  EXPECT_TRUE(nb_->WaitForLog("event=mesh_advert_refused from=node-t node=node-t")) << nb_->Log();
  EXPECT_TRUE(nb_->WaitForLog("event=mesh_advert_refused from=node-t node=node-v")) << nb_->Log();
  // What node b passes on now: its own advert first, node u's, none of the others.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // one batch per sender a second
  pb::HelloResponse again;
  ASSERT_TRUE(hello({}, &again).ok());
  std::set<std::string> passed;
  for (const pb::NodeAdvert& a : again.adverts()) {
    pb::AdvertEntry entry;
    ASSERT_TRUE(entry.ParseFromString(a.entry()));
    passed.insert(entry.node().node());
  }
  pb::AdvertEntry first;
  ASSERT_TRUE(first.ParseFromString(again.adverts(0).entry()));
  EXPECT_EQ(first.node().node(), "node-b");
  EXPECT_TRUE(passed.contains("node-u"));
  for (const char* n : {"node-y", "node-t", "node-v"}) EXPECT_FALSE(passed.contains(n)) << n;
  EXPECT_TRUE(nb_->WaitForLog("event=mesh_node_learned node=node-u from=node-t")) << nb_->Log();
}

TEST_F(MeshHostile, HostileVerbsRequestsAreRefusedAndLeakNothing) {
  ca_->Issue("node-t", dir_ + "/node-t");
  auto stub = Stub(dir_ + "/node-t");
  // Node b's advertised address on its cable, from its log.
  std::string log = nb_->Log();
  size_t at = log.find("addresses=");
  ASSERT_NE(at, std::string::npos) << log;
  std::string mine = log.substr(at + 10, log.find_first_of("/ ,", at + 10) - at - 10);
  auto open_verbs = [&](const std::string& address, size_t gid_bytes, int qps) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::OpenVerbsRequest req;
    req.set_address(address);
    req.set_gid(std::string(gid_bytes, '\x01'));
    req.set_mtu(3);
    req.set_link_instance(7);
    for (int i = 0; i < qps; ++i) {
      pb::VerbsQp* q = req.add_qps();
      q->set_qpn(0xffffffff);  // wider than a QPN: masked
      q->set_psn(i);
    }
    pb::OpenVerbsResponse resp;
    return stub->OpenVerbs(&ctx, req, &resp);
  };
  EXPECT_EQ(open_verbs("10.9.9.9", 16, 2).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // not b's
  EXPECT_EQ(open_verbs("not-an-address", 16, 2).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(open_verbs(mine, 3, 2).error_code(), grpc::StatusCode::INVALID_ARGUMENT);    // short GID
  EXPECT_EQ(open_verbs(mine, 16, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);   // no QP
  EXPECT_EQ(open_verbs(mine, 16, 17).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // too many
  // Well formed: refused here for want of an RDMA device on that address
  // (this machine has none), never a crash.
  grpc::Status st = open_verbs(mine, 16, 2);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(st.error_code() == grpc::StatusCode::NOT_FOUND ||
              st.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
      << st.error_message();
  // An open asking for RDMA from a node with no verbs links here: granted
  // over TCP with the reason (nothing registered, no keys), and bounded as
  // every grant is (the pod's limit, 1024); given back, a plain open works.
  std::vector<uint64_t> grants;
  for (int i = 0; i < 1100; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::OpenRegionRequest req;
    req.mutable_importer()->set_node("node-t");
    req.mutable_importer()->set_key("pod-key");
    req.mutable_importer()->set_namespace_("ml");
    req.mutable_importer()->set_pod_name("prefill-0");
    (*req.mutable_importer()->mutable_annotations())["podlink.io/peer-group"] = "job-7";
    req.set_export_id(export_id_);
    req.set_verbs(true);
    req.set_accepts_over_tcp(i > 0);  // the first as an older daemon asks: refused
    pb::OpenRegionResponse resp;
    st = stub->OpenRegion(&ctx, req, &resp);
    if (i == 0) {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
      continue;
    }
    if (!st.ok()) {
      ASSERT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << i << ": " << st.error_message();
      break;
    }
    EXPECT_FALSE(resp.over_tcp_reason().empty()) << i;
    EXPECT_EQ(resp.verbs_keys_size(), 0);
    grants.push_back(resp.grant());
  }
  EXPECT_EQ(grants.size(), 1024u) << "the pod's grant limit";
  for (uint64_t g : grants) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::CloseRegionRequest req;
    req.set_grant(g);
    pb::CloseRegionResponse ignored;
    ASSERT_TRUE(stub->CloseRegion(&ctx, req, &ignored).ok());
  }
  pb::OpenRegionResponse resp;
  st = Open(*stub, "node-t", &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_NE(resp.grant(), 0u);
}

// Raw data connections to node b's data port.
int DialData(const std::string& addr) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(7447);
  ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  // A cable just brought up may not pass packets yet (seen under TSan on a
  // loaded machine): a few tries, 5 s at most.
  int fd = -1;
  for (int tries = 0; fd < 0 && tries < 50; ++tries) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      ::close(fd);
      fd = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (fd < 0) return -1;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// 0: the daemon closed the connection without answering; 1: it answered.
int Answer(int fd) {
  char buf[64];
  ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  return n > 0 ? 1 : 0;
}

struct Frame {
  uint32_t magic = 0x314d4c50;
  uint16_t type = 0, flags = 0;
  uint32_t length = 0;
  int32_t status = 0;
  uint64_t tag = 0, grant = 0, offset = 0;
};
static_assert(sizeof(Frame) == 40);

TEST_F(MeshHostile, ForgedDataConnectionsAreClosedUnanswered) {
  // A guessed cookie.
  int fd = DialData(b_addr_);
  ASSERT_GE(fd, 0);
  Frame auth;
  auth.type = 1;
  auth.length = 32;
  std::string cookie(32, 'x');
  ASSERT_EQ(::send(fd, &auth, sizeof(auth), MSG_NOSIGNAL), 40);
  ASSERT_EQ(::send(fd, cookie.data(), cookie.size(), MSG_NOSIGNAL), 32);
  EXPECT_EQ(Answer(fd), 0);
  ::close(fd);
  // A WRITE without AUTH, aimed at the grant a real peer would hold.
  fd = DialData(b_addr_);
  ASSERT_GE(fd, 0);
  Frame w;
  w.type = 2;
  w.length = 16;
  w.grant = 1;
  ASSERT_EQ(::send(fd, &w, sizeof(w), MSG_NOSIGNAL), 40);
  EXPECT_EQ(Answer(fd), 0);
  ::close(fd);
  // Silence: closed after the AUTH deadline, not held forever.
  fd = DialData(b_addr_);
  ASSERT_GE(fd, 0);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Answer(fd), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ::close(fd);
  // A slow drip (a byte a second) does not hold a slot: AUTH must arrive
  // whole within 2 s, not merely some byte every 2 s.
  fd = DialData(b_addr_);
  ASSERT_GE(fd, 0);
  t0 = std::chrono::steady_clock::now();
  bool closed = false;
  for (int i = 0; i < 5 && !closed; ++i) {
    closed = ::send(fd, "P", 1, MSG_NOSIGNAL) != 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    char c;
    ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
    closed = closed || n == 0 || (n < 0 && errno != EAGAIN);
  }
  EXPECT_TRUE(closed) << "a connection dripping a byte every 0.9 s was kept open";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(3500));
  ::close(fd);
  // A real cookie for node-t, then frames with someone else's grant, then
  // out-of-bounds and oversized ones.
  ca_->Issue("node-t", dir_ + "/node-t");
  auto stub = Stub(dir_ + "/node-t");
  pb::OpenLinkResponse link;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::OpenLinkRequest req;
    req.set_connections(2);
    ASSERT_TRUE(stub->OpenLink(&ctx, req, &link).ok());
  }
  pb::OpenRegionResponse grant;
  ASSERT_TRUE(Open(*stub, "node-t", &grant).ok());
  fd = DialData(b_addr_);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::send(fd, &auth, sizeof(auth), MSG_NOSIGNAL), 40);
  ASSERT_EQ(::send(fd, link.cookies(0).data(), 32, MSG_NOSIGNAL), 32);
  auto ack = [&](const Frame& f, const std::string& payload) {
    EXPECT_EQ(::send(fd, &f, sizeof(f), MSG_NOSIGNAL), 40);
    if (!payload.empty()) {
      EXPECT_EQ(::send(fd, payload.data(), payload.size(), MSG_NOSIGNAL), (ssize_t)payload.size());
    }
    Frame r;
    if (::recv(fd, &r, sizeof(r), MSG_WAITALL) != 40) return -1;
    std::string text(r.length, '\0');
    if (r.length > 0 && ::recv(fd, text.data(), r.length, MSG_WAITALL) != (ssize_t)r.length) return -1;
    return r.status;
  };
  Frame f;
  f.type = 2;
  f.length = 8;
  f.tag = 1;
  f.grant = grant.grant() + 1000;  // not ours
  EXPECT_EQ(ack(f, std::string(8, 'z')), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  f.grant = grant.grant();
  f.offset = 65536 - 4;  // crosses the end
  EXPECT_EQ(ack(f, std::string(8, 'z')), static_cast<int>(grpc::StatusCode::OUT_OF_RANGE));
  f.offset = ~uint64_t{0} - 2;  // wraps
  EXPECT_EQ(ack(f, std::string(8, 'z')), static_cast<int>(grpc::StatusCode::OUT_OF_RANGE));
  f.offset = 0;
  EXPECT_EQ(ack(f, std::string(8, 'z')), 0);  // in bounds: written
  f.type = 3;  // READ past the end
  f.offset = 65536;
  EXPECT_EQ(ack(f, ""), static_cast<int>(grpc::StatusCode::OUT_OF_RANGE));
  // A late copy of a slice of a finished transfer is dropped: transfer 7
  // writes "AAAAAAAA", finishes (DONE), then a copy with "BBBBBBBB" arrives.
  auto read8 = [&](uint64_t tag) {
    Frame r;
    r.type = 3;
    r.length = 8;
    r.tag = tag;
    r.grant = grant.grant();
    r.offset = 4096;
    EXPECT_EQ(::send(fd, &r, sizeof(r), MSG_NOSIGNAL), 40);
    Frame d;
    std::string data(8, '\0');
    if (::recv(fd, &d, sizeof(d), MSG_WAITALL) != 40 || d.type != 4 || d.length != 8) return std::string("?");
    if (::recv(fd, data.data(), 8, MSG_WAITALL) != 8) return std::string("?");
    return data;
  };
  f.type = 2;
  f.offset = 4096;
  f.tag = (uint64_t{7} << 32) | 0;
  EXPECT_EQ(ack(f, "AAAAAAAA"), 0);
  Frame done;
  done.type = 7;
  done.tag = uint64_t{7} << 32;
  EXPECT_EQ(ack(done, ""), 0);
  f.tag = (uint64_t{7} << 32) | 0;
  EXPECT_EQ(ack(f, "BBBBBBBB"), 0);  // answered, and dropped
  EXPECT_EQ(read8(uint64_t{8} << 32), "AAAAAAAA");
  f.tag = (uint64_t{9} << 32) | 0;  // another transfer writes as usual
  EXPECT_EQ(ack(f, "CCCCCCCC"), 0);
  EXPECT_EQ(read8(uint64_t{10} << 32), "CCCCCCCC");
  // A cookie is single-use.
  int again = DialData(b_addr_);
  ASSERT_GE(again, 0);
  ASSERT_EQ(::send(again, &auth, sizeof(auth), MSG_NOSIGNAL), 40);
  ASSERT_EQ(::send(again, link.cookies(0).data(), 32, MSG_NOSIGNAL), 32);
  EXPECT_EQ(Answer(again), 0);
  ::close(again);
  // An oversized frame closes the connection.
  f.type = 2;
  f.length = 64u << 20;
  ASSERT_EQ(::send(fd, &f, sizeof(f), MSG_NOSIGNAL), 40);
  EXPECT_EQ(Answer(fd), 0);
  ::close(fd);
  EXPECT_TRUE(nb_->Alive());
}

TEST_F(Mesh, ACutCableOrAKilledPeerFailsTransfersWithinTheBound) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [da, db] = topo_.Cable(a, b, 1);
  // Shape the cable so a 256 MiB write takes long enough to cut it midway.
  Shape(a, da);
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "prefill-0", "job-7") + "," + Rule(pb, "ml", "decode-0", "job-7");
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  for (int round = 0; round < 2; ++round) {
    Pod server(*nb, &pb, {"kv-serve", "--size", std::to_string(256 << 20), "--verify", "5"});
    json s = server.Expect("serving");
    ASSERT_EQ(s["event"], "serving") << s.dump();
    Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "5"});
    // Cut only once the write is under way: the owner's daemon granted it.
    ASSERT_TRUE(WaitForGrants(*nb, round + 1)) << nb->Log();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto t0 = std::chrono::steady_clock::now();
    if (round == 0) {
      Sh(absl::StrCat("ip -n ", a, " link set ", da, " down"));  // the cable is cut
    } else {
      ::kill(nb->pid(), SIGKILL);  // the peer daemon dies
    }
    json e = client.Expect("put", 30000);
    auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(e["event"], "error") << e.dump();
    EXPECT_EQ(e["code"], "UNAVAILABLE") << e.dump();
    EXPECT_LT(took, std::chrono::seconds(15)) << "the failure took too long to surface";
    EXPECT_EQ(client.Wait(), 1);
    if (round == 0) {
      // Back up: a new open reconnects and moves bytes again.
      Sh(absl::StrCat("ip -n ", a, " link set ", da, " up"));
      Sh(absl::StrCat("ip -n ", a, " addr add 10.77.1.1/30 dev ", da));
      server.Kill(SIGKILL);
      server.Wait();
    }
  }
  EXPECT_TRUE(na->Alive());
}

// A node whose links are RDMA (mesh.transport verbs) reaches a relay over
// TCP: a relay's grant has no memory for RDMA to land in. Node a here has no
// RDMA device at all, so anything but TCP to c would fail.
TEST_F(Mesh, AVerbsNodeReachesItsRelayOverTcp) {
  Chain t;
  JoinChain(t);
  [[maybe_unused]] auto& [a, c, d, ac_a, ac_c, cd_c, cd_d, pa, pd, pods] = t;
  auto na = StartNode("node-a", a, {ac_a}, pods, "", absl::StrCat(R"(, "transport": "verbs")", kKnowsC));
  if (!na->WaitForLog("event=mesh_ready", 5000)) GTEST_SKIP() << "no libibverbs here: " << na->Log();
  auto nc = StartNode("node-c", c, {ac_c, cd_c}, pods);
  auto nd = StartNode("node-d", d, {cd_d}, pods);
  KvAcrossNodes(*nd, pd, *na, pa, 8 << 20, 91);
  EXPECT_NE(na->Log().find("event=mesh_peer_connected node=node-c control=10.77.3.2:7446 paths=1 connections="),
            std::string::npos)
      << na->Log();
}

// A node whose links are RDMA (mesh.transport verbs) and a peer that no RDMA
// path reaches (this machine has no RDMA device): the node answers, the
// queue pairs never come up, and the open goes over the TCP links instead,
// said and counted. With mesh.verbs_tcp_fallback false it fails, naming why.
TEST_F(Mesh, AVerbsNodeThatNoRdmaPathLeavesGoesOverTcp) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods, "", R"(, "transport": "verbs")");
  if (!na->WaitForLog("event=mesh_ready", 5000)) GTEST_SKIP() << "no libibverbs here: " << na->Log();
  auto nb = StartNode("node-b", b, {db}, pods);
  KvAcrossNodes(*nb, pb, *na, pa, 4 << 20, 23);
  EXPECT_TRUE(na->WaitForLog("event=mesh_verbs_fallback node=node-b")) << na->Log();
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const size_t dials = count(na->Log(), "event=verbs_path_failed");
  EXPECT_GE(dials, 1u) << na->Log();
  // The next open within 30 s goes straight to TCP: no RDMA dial again.
  KvAcrossNodes(*nb, pb, *na, pa, 65536, 24);
  EXPECT_EQ(count(na->Log(), "event=verbs_path_failed"), dials) << na->Log();
  std::string metrics = RunCommand(absl::StrCat(
      "ip netns exec ", a, " python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:",
      na->metrics_port(), "/metrics\").read().decode())'"));
  EXPECT_NE(metrics.find("podlink_mesh_verbs_fallbacks_total 2\n"), std::string::npos) << metrics;
  json links = LinksOf(*na);
  bool over_tcp = false;
  for (const json& p : links["peers"]) over_tcp |= p["node"] == "node-b" && p["transport"] == "tcp";
  EXPECT_TRUE(over_tcp) << links.dump();
  na.reset();
  na = StartNode("node-a", a, {da}, pods, "", R"(, "transport": "verbs", "verbs_tcp_fallback": false)");
  Pod server(*nb, &pb, {"kv-serve", "--size", "65536", "--verify", "3"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "3"});
  json r = client.Next(30000).value_or(json());
  EXPECT_EQ(r["event"], "error") << r.dump();
  EXPECT_NE(r.dump().find("verbs"), std::string::npos) << "the reason names RDMA: " << r.dump();
  EXPECT_NE(client.Wait(), 0);
  server.Kill(SIGKILL);
  server.Wait();
}

// A relay whose links are RDMA (mesh.transport verbs) and no RDMA path to the
// next node (this machine has no RDMA device): it opens onward over TCP.
TEST_F(Mesh, AVerbsRelayWithNoRdmaPathOnwardGoesOverTcp) {
  Chain t;
  JoinChain(t);
  [[maybe_unused]] auto& [a, c, d, ac_a, ac_c, cd_c, cd_d, pa, pd, pods] = t;
  auto nc = StartNode("node-c", c, {ac_c, cd_c}, pods, "", R"(, "transport": "verbs")");
  if (!nc->WaitForLog("event=mesh_ready", 5000)) GTEST_SKIP() << "no libibverbs here: " << nc->Log();
  auto na = StartNode("node-a", a, {ac_a}, pods, "", kKnowsC);
  auto nd = StartNode("node-d", d, {cd_d}, pods);
  KvAcrossNodes(*nd, pd, *na, pa, 4 << 20, 92);
  EXPECT_TRUE(nc->WaitForLog("event=mesh_verbs_fallback node=node-d")) << nc->Log();
  EXPECT_TRUE(nc->WaitForLog("event=mesh_relay_grant peer=node-a origin=node-a next=node-d")) << nc->Log();
}

// An importing daemon that dies leaves its grants on the owner (nothing
// tells the owner); when it comes back, its new instance says so and the owner
// drops what the old one held instead of keeping it until the export goes.
TEST_F(Mesh, ARestartedImportersOldGrantsAreDropped) {
  TwoNodes t;
  Join(t, /*shaped=*/true);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  auto grants = [&]() -> int {
    json j = LinksOf(*nb);
    return j.is_object() ? j["grants"].get<int>() : -1;
  };
  Pod big(*nb, &pb, {"kv-serve", "--size", std::to_string(256 << 20), "--verify", "5"});
  json s = big.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  {
    Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "5"});
    ASSERT_TRUE(WaitForGrants(*nb, 1)) << nb->Log();
    ::kill(na->pid(), SIGKILL);  // mid-transfer: node a's podlinkd dies holding the grant
    client.Kill(SIGKILL);
    client.Wait();
  }
  na.reset();
  EXPECT_EQ(grants(), 1) << "the dead importer's grant is still there (nothing told node b)";
  // Node a's daemon comes back (a new instance) and its pod opens another region of b.
  na = StartNode("node-a", a, {da}, pods);
  KvAcrossNodes(*nb, pb, *na, pa, 65536, 6);
  EXPECT_TRUE(nb->WaitForLog("event=mesh_peer_restarted node=node-a dropped_grants=1")) << nb->Log();
  // The new pod's grant closed when it was done; the old one went at the restart.
  for (int waited = 0; waited < 5000 && grants() != 0; waited += 50) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(grants(), 0);
  big.Kill(SIGKILL);
}

// The importing daemon checks that the owner's certificate names the node a
// descriptor names, in the TLS handshake (before any call): a descriptor
// that names node-c at node b's address is refused there.
TEST_F(Mesh, AnImporterRefusesAnOwnerWhoseCertificateNamesAnotherNode) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  Pod server(*nb, &pb, {"kv-serve", "--size", "65536", "--verify", "3"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  ASSERT_EQ(WithFields(s["descriptor"], {{6, "node-b"}}), s["descriptor"]) << "the owner's node name is node-b";
  const std::string desc = WithFields(s["descriptor"], {{6, "node-c"}});  // the node name
  ASSERT_FALSE(desc.empty());
  Pod client(*na, &pa, {"kv-put", "--desc", desc, "--seed", "3"});
  json r = client.Next(30000).value_or(json());
  EXPECT_EQ(r["event"], "error") << r.dump();
  EXPECT_NE(client.Wait(), 0);
  std::cerr << "refused with: " << r.dump() << "\n";
  // Refused in the handshake: no Hello answer was ever compared.
  EXPECT_EQ(na->Log().find("not 'node-c'"), std::string::npos) << na->Log();
  EXPECT_EQ(nb->Log().find("event=mesh_grant"), std::string::npos) << nb->Log();
  server.Kill(SIGKILL);
}

// podlinkd told to stop while its pods' opens of another node wait (node b's
// address takes connections and never answers, so the first open waits out
// the connect timeout on b's worker and the second queues behind it): each
// open is answered, saying why, and podlinkd exits 0 — the mesh stops before
// the daemon's RPC server does, so no answer finishes a call of a server
// already gone.
TEST_F(Mesh, StoppingWithOpensWaitingAnswersThemAndExitsCleanly) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  const std::string pidfile = dir_ + "/silent.pid";
  ASSERT_EQ(Sh(absl::StrCat("ip netns exec ", b, " timeout 60 python3 -c 'import socket, time; s = socket.socket(); "
                            "s.bind((\"10.77.1.2\", 7446)); s.listen(64); time.sleep(60)' </dev/null >/dev/null 2>&1 & "
                            "echo $! > ", pidfile, "; :")),
            0);
  bool listening = false;
  for (int waited = 0; waited < 10000 && !listening; waited += 100) {
    listening = Sh(absl::StrCat("ip netns exec ", b, " ss -Hltn 'sport = :7446' | grep -q 10.77.1.2")) == 0;
    if (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(listening) << "node b's silent listener did not come up";
  auto na = StartNode("node-a", a, {da}, pods);
  Pod server(*na, &pa, {"kv-serve", "--size", "65536", "--verify", "3"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  // Another node's region: its node id and name, mesh port and address.
  const std::string desc = WithFields(s["descriptor"], {{1, "node-b"}, {6, "node-b"}, {7, "7446"}, {8, "10.77.1.2/30"}});
  ASSERT_FALSE(desc.empty());
  std::vector<std::unique_ptr<Pod>> clients;
  for (int i = 0; i < 2; ++i) clients.push_back(std::make_unique<Pod>(*na, &pa, std::vector<std::string>{
                                                    "kv-put", "--desc", desc, "--seed", "3"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // both opens reach node b's worker
  std::optional<int> status = na->Stop(20000);
  ASSERT_TRUE(status.has_value()) << "podlinkd did not exit within 20 s of SIGTERM";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "podlinkd's wait status " << *status << "\n" << na->Log();
  int said_stopping = 0;
  for (auto& c : clients) {
    json r = c->Next(10000).value_or(json());
    EXPECT_EQ(r["event"], "error") << r.dump();
    said_stopping += r.dump().find("stopping") != std::string::npos;
    // This node's podlinkd answered: the reason is not that it was unreachable.
    EXPECT_EQ(r.dump().find("podlinkd unreachable"), std::string::npos) << r.dump();
    std::cerr << "answered: " << r.dump() << "\n";
    EXPECT_NE(c->Wait(), 0);
  }
  EXPECT_GE(said_stopping, 1) << "the queued open was not answered by the mesh";
  server.Kill(SIGKILL);
  server.Wait();
  // Sh's own redirection goes to the last command (":"), so the listener
  // holds none of this test's output open and its pid is in the file.
  EXPECT_EQ(Sh(absl::StrCat("kill $(cat ", pidfile, ")")), 0) << "node b's silent listener was not stopped";
}

// Certificates rotated in place (as cert-manager does to a secret volume)
// take effect without a restart: node b starts with a certificate of
// another CA, which node a refuses; once its files hold one of the mesh's
// CA, node a reaches it, and b reloads its node key for claims too.
TEST_F(Mesh, RotatedCertificatesTakeEffectWithoutARestart) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  TestCa other(dir_ + "/other-ca");
  const std::string bdir = dir_ + "/node-b-certs";
  other.Issue("node-b", bdir, ca_->ca());  // trusts the mesh's CA, presents another's certificate
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods, bdir, R"(, "cert_refresh_seconds": 1)");
  Pod server(*nb, &pb, {"kv-serve", "--size", "65536", "--verify", "4"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  auto put = [&]() {
    Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "4"});
    json r = client.Next(30000).value_or(json());
    client.Wait();
    return r;
  };
  json refused = put();
  EXPECT_EQ(refused["event"], "error") << refused.dump();
  // The rotation: new files renamed into place.
  ca_->Issue("node-b", dir_ + "/node-b-new");
  for (const char* f : {"tls.key", "tls.crt"}) {
    Sh(absl::StrCat("cp ", dir_, "/node-b-new/", f, " ", bdir, "/", f, ".tmp && mv ", bdir, "/", f, ".tmp ", bdir, "/", f));
  }
  EXPECT_TRUE(nb->WaitForLog("event=mesh_certificates_reloaded", 10000)) << nb->Log();
  json ok;
  for (int i = 0; i < 20 && ok["event"] != "put"; ++i) {
    ok = put();
    if (ok["event"] != "put") std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_EQ(ok["event"], "put") << ok.dump() << "\n" << na->Log();
  json v = server.Expect("verified", 30000);
  EXPECT_EQ(v["mismatches"], 0) << v.dump();
  EXPECT_EQ(server.Wait(), 0);
}

// An importing daemon that dies and never comes back: the owner drops its
// grants once the node has had no data connection and no control call for
// mesh.grant_idle_seconds (2 here); a live importer's transfer that lasts
// longer than that keeps its grant.
TEST_F(Mesh, ADeadImportersGrantsGoWhenItNeverReturns) {
  TwoNodes t;
  Join(t, /*shaped=*/true);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods, "", R"(, "grant_idle_seconds": 2)");
  auto grants = [&]() -> int {
    json j = LinksOf(*nb);
    return j.is_object() ? j["grants"].get<int>() : -1;
  };
  // 96 MiB over the shaped cable: about 4 s, twice the idle limit.
  KvAcrossNodes(*nb, pb, *na, pa, 96 << 20, 7);
  EXPECT_EQ(nb->Log().find("event=mesh_importer_gone"), std::string::npos) << nb->Log();

  Pod big(*nb, &pb, {"kv-serve", "--size", std::to_string(256 << 20), "--verify", "8"});
  json s = big.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  std::chrono::steady_clock::time_point killed;
  {
    Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "8"});
    ASSERT_TRUE(WaitForGrants(*nb, 2)) << nb->Log();  // the first transfer's, and this one's
    killed = std::chrono::steady_clock::now();
    ::kill(na->pid(), SIGKILL);  // node a's podlinkd dies holding the grant, for good
    client.Kill(SIGKILL);
    client.Wait();
  }
  na.reset();
  EXPECT_TRUE(nb->WaitForLog("event=mesh_importer_gone node=node-a dropped_grants=1", 15000)) << nb->Log();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_EQ(grants(), 0);
  EXPECT_GE(waited, 1.9) << "dropped before the idle limit";
  big.Kill(SIGKILL);
}

TEST_F(Mesh, ACutCableCostsNoDataWhenAnotherRemains) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [a1, b1] = topo_.Cable(a, b, 1);
  auto [a2, b2] = topo_.Cable(a, b, 2);
  for (const std::string& dev : {a1, a2}) {
    Shape(a, dev);
  }
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "prefill-0", "job-7") + "," + Rule(pb, "ml", "decode-0", "job-7");
  auto na = StartNode("node-a", a, {a1, a2}, pods);
  auto nb = StartNode("node-b", b, {b1, b2}, pods);
  const uint64_t size = 192 << 20;  // about 4 s over both cables
  Pod server(*nb, &pb, {"kv-serve", "--size", std::to_string(size), "--verify", "61"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "61"});
  ASSERT_TRUE(WaitForGrants(*nb, 1)) << nb->Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  Sh(absl::StrCat("ip -n ", a, " link set ", a1, " down"));  // cable 1 cut mid-transfer
  json put = client.Expect("put", 60000);
  ASSERT_EQ(put["event"], "put") << put.dump() << "\n" << na->Log();
  json v = server.Expect("verified", 30000);
  EXPECT_EQ(v["mismatches"], 0) << v.dump();
  EXPECT_EQ(v["notification"], 1);
  EXPECT_EQ(server.Wait(), 0);
  EXPECT_EQ(client.Wait(), 0);
  // Slices in flight on cable 1 went over cable 2.
  std::string log = na->Log();
  uint64_t resent = 0, failed = 0, downs = 0;
  for (size_t at = log.find("event=mesh_connection_down"); at != std::string::npos;
       at = log.find("event=mesh_connection_down", at + 1)) {
    ++downs;
    resent += std::strtoull(log.c_str() + log.find("resent_slices=", at) + 14, nullptr, 10);
    failed += std::strtoull(log.c_str() + log.find("failed_slices=", at) + 14, nullptr, 10);
  }
  EXPECT_EQ(downs, 4u) << log;  // cable 1's four connections
  EXPECT_GT(resent, 0u) << "no slice was in flight on the cut cable:\n" << log;
  EXPECT_EQ(failed, 0u) << log;
  std::cerr << "cut cable: " << downs << " connections down, " << resent << " slices resent\n";

  // The cable comes back: its path is dialed again in the background, and the
  // next transfer uses both cables.
  Sh(absl::StrCat("ip -n ", a, " link set ", a1, " up"));
  int up = 0;
  for (int i = 0; i < 100 && up != 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    json links = LinksOf(*na);
    if (links.is_object() && links["peers"].size() == 1) up = links["peers"][0]["connections_up"].get<int>();
  }
  ASSERT_EQ(up, 8) << na->Log();
  EXPECT_TRUE(na->WaitForLog("event=mesh_connection_repaired"));
  uint64_t before1 = TxBytes(a, a1), before2 = TxBytes(a, a2);
  KvAcrossNodes(*nb, pb, *na, pa, 64 << 20, 62);
  uint64_t sent1 = TxBytes(a, a1) - before1, sent2 = TxBytes(a, a2) - before2;
  EXPECT_GT(sent1, (64u << 20) / 5) << "the repaired cable carried " << sent1 << " bytes, the other " << sent2;
  EXPECT_GT(sent2, (64u << 20) / 5);
}

// A path that cannot be dialed again (node b's address on cable 2 gone,
// so dials to it wait out their timeout) keeps node a's repairs busy for
// seconds on end. Node a's housekeeping (its own advert re-signed and traded,
// keepalives, the idle and registration sweeps) must not wait behind them:
// node b keeps seeing a fresh advert of node a the whole time.
TEST_F(Mesh, ACutCableBeingRepairedDelaysNoHousekeeping) {
  std::string a = topo_.Node("a"), b = topo_.Node("b");
  auto [a1, b1] = topo_.Cable(a, b, 1);
  auto [a2, b2] = topo_.Cable(a, b, 2);
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "prefill-0", "job-7") + "," + Rule(pb, "ml", "decode-0", "job-7");
  const std::string adverts = R"(, "advert_seconds": 1)";
  auto na = StartNode("node-a", a, {a1, a2}, pods, "", adverts);
  auto nb = StartNode("node-b", b, {b1, b2}, pods, "", adverts);
  KvAcrossNodes(*nb, pb, *na, pa, 16 << 20, 71);  // connections up on both cables
  ASSERT_NE(na->Log().find("event=mesh_peer_connected node=node-b control=10.77.1.2:"), std::string::npos)
      << "the control channel must stay on cable 1 for this test:\n" << na->Log();
  // Cable 2 stops answering: node b's end loses its address (SYNs and data to
  // it are dropped unanswered). A write brings down cable 2's connections
  // (io_timeout); each repair then waits out its dial.
  Sh(absl::StrCat("ip -n ", b, " addr flush dev ", b2));
  KvAcrossNodes(*nb, pb, *na, pa, 16 << 20, 72);
  ASSERT_TRUE(na->WaitForLog("event=mesh_connection_down node=node-b path=10.77.2.1->10.77.2.2", 10000)) << na->Log();
  int64_t worst = -1;
  for (int i = 0; i < 24; ++i) {  // 12 s of repairs failing one after another
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    json links = LinksOf(*nb);
    ASSERT_TRUE(links.is_object());
    for (const json& k : links["known_nodes"]) {
      if (k["node"] == "node-a") worst = std::max(worst, k["advert_age_seconds"].get<int64_t>());
    }
  }
  std::cerr << "node a's advert as node b held it while a's repairs failed: at most " << worst << " s old\n";
  EXPECT_GE(worst, 0) << "node b never held an advert of node a";
  EXPECT_LE(worst, 4) << "node a's housekeeping stalled behind its repairs:\n" << na->Log();
  EXPECT_EQ(na->Log().find("event=mesh_connection_repaired"), std::string::npos) << "cable 2 cannot be repaired";
}

}  // namespace
}  // namespace podlink::testing
