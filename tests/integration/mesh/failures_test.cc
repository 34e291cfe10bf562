// Failures: cut cables, killed and restarted peers, dead importers, stopping with opens waiting, and
// repair that holds nothing back.
#include "tests/integration/mesh/mesh_fixture.h"

namespace podlink::testing {
namespace {

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
