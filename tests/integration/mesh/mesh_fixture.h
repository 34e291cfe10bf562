// The fixture of the mesh's scenario tests (tests/integration/mesh/*_test.cc,
// one executable, mesh_test). The daemons' mesh between emulated nodes: one podlinkd per network
// namespace, veth pairs as cables (each cable its own /30), node
// certificates from a CA made for the run (openssl). Pods on one node write
// and read regions of pods on another through both daemons; hostile peers
// (no certificate, another CA, a daemon speaking for another node's pods,
// forged data connections) are refused; a cable cut or a killed peer daemon
// fails transfers within a bound instead of hanging.
#pragma once

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
#include "daemon/mesh/trust/origin_sign.h"
#include "podlink/mesh/v1/mesh.grpc.pb.h"
#include "tests/common/test_ca.h"
#include "tests/integration/harness.h"

namespace podlink::testing {

namespace pb = podlink::mesh::v1;
using nlohmann::json;

// Runs `cmd`; its standard output (and its exit status in `status`).
inline std::string RunCommand(const std::string& cmd, int* status = nullptr) {
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
inline uint64_t TxBytes(const std::string& ns, const std::string& dev) {
  return std::strtoull(RunCommand(absl::StrCat("ip netns exec ", ns, " cat /sys/class/net/", dev, "/statistics/tx_bytes")).c_str(),
                       nullptr, 10);
}

// How often `text` occurs in `d`'s log.
inline size_t CountInLog(const Daemon& d, const std::string& text) {
  std::string log = d.Log();
  size_t count = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++count;
  return count;
}

// True once `text` occurs at least `n` times in `d`'s log.
inline bool WaitForCount(const Daemon& d, const std::string& text, size_t n, int timeout_ms = 30000) {
  for (int waited = 0; waited <= timeout_ms; waited += 20) {
    if (CountInLog(d, text) >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// True once `d` has granted `n` regions to peers (its log says so).
inline bool WaitForGrants(const Daemon& d, size_t n, int timeout_ms = 30000) {
  return WaitForCount(d, "event=mesh_grant ", n, timeout_ms);
}

// What `kubectl podlink links -o json` says on `d`'s node (not an object: it failed).
inline json LinksOf(const Daemon& d) {
  return json::parse(RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links -o json --socket ", d.dir())), nullptr, false);
}

// Whether `d` holds an advert of `node` naming every one of `names` as its
// neighbour (the latest event=mesh_node_neighbours line for it), waiting up
// to `timeout_ms`: routes through cables between other nodes need both
// ends' adverts (daemon/mesh/routing/routes.h).
inline bool WaitForNeighbours(const Daemon& d, const std::string& node, const std::vector<std::string>& names,
                              int timeout_ms = 20000) {
  const std::string key = "event=mesh_node_neighbours node=" + node + " ";
  for (int waited = 0;; waited += 100) {
    const std::string log = d.Log();
    size_t at = log.rfind(key);
    if (at != std::string::npos) {
      const std::string line = log.substr(at, log.find('\n', at) - at);
      bool all = true;
      for (const std::string& n : names) all = all && line.find(n) != std::string::npos;
      if (all) return true;
    }
    if (waited >= timeout_ms) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// One series of `d`'s /metrics, read inside namespace `ns` (-1: absent).
inline double MetricOf(const std::string& ns, const Daemon& d, const std::string& series) {
  std::string m = RunCommand(absl::StrCat("ip netns exec ", ns,
                                          " python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:",
                                          d.metrics_port(), "/metrics\").read().decode())'"));
  size_t at = m.find("\n" + series + " ");
  return at == std::string::npos ? -1.0 : std::strtod(m.c_str() + at + series.size() + 2, nullptr);
}

// Shapes `dev` of namespace `ns` to 200 Mbit/s (tc tbf), or `rate`: the
// cable, not the CPU, is then the limit, and a large transfer lasts long
// enough to cut.
inline void Shape(const std::string& ns, const std::string& dev, const std::string& rate = "200mbit") {
  Sh(absl::StrCat("ip netns exec ", ns, " tc qdisc add dev ", dev, " root tbf rate ", rate,
                  " burst 256kb latency 50ms"));
}

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
  // Another address of the host, `host_net_.<host>`, on host cable `sub` to
  // `node` (made by HostCable), and the node's route back to it: clients
  // dialing from it look like other machines to the node.
  std::string HostAlias(const std::string& node, int sub, int host) {
    std::string dh = absl::StrCat(tag_, "h", sub), dn = absl::StrCat(tag_, "h", sub, "n");
    std::string addr = absl::StrCat(host_net_, ".", host);
    EXPECT_EQ(Sh(absl::StrCat("ip addr add ", addr, "/32 dev ", dh)), 0) << addr;
    EXPECT_EQ(Sh(absl::StrCat("ip -n ", node, " route add ", addr, "/32 dev ", dn)), 0) << addr;
    return addr;
  }
  const std::string& tag() const { return tag_; }

 private:
  std::string tag_;
  std::string host_net_;  // "10.x.y": the first three octets of this topology's host cables
  std::vector<std::string> namespaces_, host_devs_;
};

inline bool CanRunMesh() {
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
                                    bool gpu = false, const std::vector<std::string>& args = {}) {
    std::string certs = cert_dir;
    if (certs.empty()) {
      certs = dir_ + "/" + node;
      ca_->Issue(node, certs);
    }
    json ifs = interfaces;
    std::string cfg = absl::StrCat(R"({"node": {"name": ")", node, R"(", "id": ")", node, R"("}, "mesh": {"enabled": true, "cert_dir": ")",
                                   certs, R"(", "interfaces": )", ifs.dump(), R"(, "io_timeout_seconds": 2)",
                                   extra_mesh, R"(}, "pods": [)", pods, "]}");
    return std::make_unique<Daemon>(cfg, args, gpu, ns);
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
inline std::string WithFields(const std::string& desc, const std::map<size_t, std::string>& fields) {
  std::vector<std::string> f = absl::StrSplit(desc, ';');
  EXPECT_EQ(f.size(), 9u) << desc;
  if (f.size() != 9u) return "";
  for (const auto& [i, v] : fields) f[i] = v;
  return absl::StrJoin(f, ";");
}

// A pod on `from` writes a region of a pod on `to` whole (one-sided, through
// both daemons), notifies, reads it back; both sides check every byte.
inline void KvAcrossNodes(Daemon& to, const PodCgroup& server_cg, Daemon& from, const PodCgroup& client_cg,
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

// The NCCL plugin and its test peer as built, unless the environment points
// elsewhere (a carried bundle on the GPU machine, where PODLINK_TEST_MEM=cuda
// puts NCCL's buffers in GPU memory): plugin, peer, and the peer's arguments.
inline std::tuple<std::string, std::string, std::vector<std::string>> NcclPeer() {
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
inline void NcclScenario(Pod& send, Pod& recv, Daemon& na, Daemon& nb, const char* sc, int dev = 0) {
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

}  // namespace podlink::testing
