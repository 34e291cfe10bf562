// Verbs nodes that fall back to TCP: to a relay, with no RDMA path, and onward from a relay.
#include "tests/integration/mesh/mesh_fixture.h"

namespace podlink::testing {
namespace {

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

}  // namespace
}  // namespace podlink::testing
