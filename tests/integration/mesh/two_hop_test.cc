// Two-hop striping: a relay's cables added to the direct ones, GPU memory, and a stalled relay's
// chunks fenced.
#include "tests/integration/mesh/mesh_fixture.h"

namespace podlink::testing {
namespace {

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
  auto metric = [&, &a = a](const std::string& series) { return MetricOf(a, *na, series); };
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

}  // namespace
}  // namespace podlink::testing
