// The owner's grant table (daemon/mesh/owner/grant_table.h), without an engine, sockets or peers.
#include "daemon/mesh/owner/grant_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

namespace podlink {
struct ExportRecord {};  // the table only holds weak pointers to it
}

namespace podlink::mesh {
struct Forward {
  int next = 0;
};

namespace {

Grant Of(const std::string& node, const std::string& pod, const std::string& tenant) {
  Grant g;
  g.node = node;
  g.pod = pod;
  g.tenant = tenant;
  return g;
}

TEST(GrantTable, EachLimitIsMetByItsOwnHolderAndAClosedGrantGivesItsPlaceBack) {
  GrantTable t({.per_node = 4, .per_pod = 2, .per_tenant = 3});
  std::set<uint64_t> ids;
  for (int i = 0; i < 2; ++i) {
    const GrantTable::Added a = t.Add(Of("node-a", "pod-1", "ns-1"));
    ASSERT_EQ(a.over, GrantTable::Over::kNone);
    EXPECT_NE(a.grant, 0u);
    ids.insert(a.grant);
  }
  EXPECT_EQ(ids.size(), 2u) << "two grants, two numbers";
  GrantTable::Added a = t.Add(Of("node-a", "pod-1", "ns-1"));
  EXPECT_EQ(a.over, GrantTable::Over::kPod);
  EXPECT_EQ(a.held, 2u);
  EXPECT_FALSE(t.WithinLimits("node-a", "pod-1", "ns-1"));
  ASSERT_EQ(t.Add(Of("node-a", "pod-2", "ns-1")).over, GrantTable::Over::kNone);
  a = t.Add(Of("node-a", "pod-3", "ns-1"));
  EXPECT_EQ(a.over, GrantTable::Over::kTenant) << "the tenant's third grant was its last";
  ASSERT_EQ(t.Add(Of("node-a", "pod-3", "ns-2")).over, GrantTable::Over::kNone);
  a = t.Add(Of("node-a", "pod-4", "ns-3"));
  EXPECT_EQ(a.over, GrantTable::Over::kNode);
  EXPECT_EQ(a.held, 4u);
  // Another node's pods and tenants are counted apart from node-a's.
  EXPECT_TRUE(t.WithinLimits("node-b", "pod-9", "ns-9"));
  EXPECT_EQ(t.counts().grants, 4u);

  // Only its holder closes a grant.
  const uint64_t first = *ids.begin();
  EXPECT_FALSE(t.Remove("node-b", first).has_value());
  EXPECT_FALSE(t.Find("node-b", first).has_value()) << "a grant is found only for the node it was given";
  EXPECT_TRUE(t.Find("node-a", first).has_value());
  std::optional<Grant> gone = t.Remove("node-a", first);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->pod, "pod-1");
  EXPECT_FALSE(t.Remove("node-a", first).has_value()) << "closed once";
  EXPECT_TRUE(t.WithinLimits("node-a", "pod-1", "ns-1"));
  EXPECT_EQ(t.Add(Of("node-a", "pod-1", "ns-1")).over, GrantTable::Over::kNone);
}

TEST(GrantTable, ARefusedGrantLeavesNoCountBehind) {
  GrantTable t({.per_node = 1, .per_pod = 1, .per_tenant = 1});
  const GrantTable::Added a = t.Add(Of("node-a", "pod-1", "ns-1"));
  ASSERT_EQ(a.over, GrantTable::Over::kNone);
  for (int i = 0; i < 100; ++i) EXPECT_NE(t.Add(Of("node-a", "pod-" + std::to_string(i), "ns")).over,
                                          GrantTable::Over::kNone);
  ASSERT_TRUE(t.Remove("node-a", a.grant).has_value());
  EXPECT_TRUE(t.Holders().empty()) << "a node holding nothing is no holder";
  EXPECT_EQ(t.counts().grants, 0u);
  EXPECT_EQ(t.Add(Of("node-a", "pod-2", "ns-2")).over, GrantTable::Over::kNone);
}

TEST(GrantTable, AFenceClosesOnlyItsOriginsRouteAndWaitsForTheChunkLanding) {
  GrantTable t({});
  Grant routed = Of("relay-1", "mesh/node-o/pod", "mesh/node-o/ns");
  routed.origin = "node-o";
  routed.nonce = 77;
  const uint64_t g = t.Add(routed).grant;
  Grant other = routed;
  other.origin = "node-x";  // another origin's grant under the same nonce: not node-o's to fence
  const uint64_t h = t.Add(other).grant;
  const uint64_t plain = t.Add(Of("relay-1", "p", "t")).grant;
  ASSERT_TRUE(t.Find("relay-1", g)->fenceable);
  EXPECT_FALSE(t.Find("relay-1", plain)->fenceable);

  EXPECT_FALSE(t.Fence("node-o", 0).ok()) << "nonce 0 is no route's";
  ASSERT_TRUE(t.BeginLanding(g));
  auto fenced = t.Fence("node-o", 77);
  ASSERT_TRUE(fenced.ok());
  ASSERT_EQ(fenced->size(), 1u);
  EXPECT_EQ((*fenced)[0], std::make_pair(std::string("relay-1"), g));
  EXPECT_TRUE(t.Fenced("node-o", 77)) << "the claim is refused from now on";
  EXPECT_FALSE(t.Fenced("node-x", 77));
  EXPECT_EQ(t.Fence("node-o", 78).status().code(), absl::StatusCode::kResourceExhausted)
      << "one fence per origin at a time";
  ASSERT_TRUE(t.Remove("relay-1", g).has_value());  // what the engine does between the two steps
  EXPECT_FALSE(t.BeginLanding(g)) << "a fenced grant lands no further chunk";
  EXPECT_FALSE(t.AwaitLanded("node-o", *fenced, absl::Milliseconds(20))) << "a chunk is still landing";
  // The timed-out fence ended; the next one waits as long as it must.
  routed.nonce = 79;
  const uint64_t g2 = t.Add(routed).grant;
  ASSERT_TRUE(t.BeginLanding(g2));
  auto second = t.Fence("node-o", 79);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->size(), 1u);
  ASSERT_TRUE(t.Remove("relay-1", g2).has_value());
  std::atomic<bool> ended{false};
  std::thread lander([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ended = true;
    t.EndLanding(g2);
  });
  EXPECT_TRUE(t.AwaitLanded("node-o", *second, absl::Seconds(10)));
  EXPECT_TRUE(ended.load()) << "the fence returned before the chunk landed";
  lander.join();
  EXPECT_TRUE(t.Find("relay-1", h).has_value());
  EXPECT_EQ(t.counts().fenced, 2u);
}

TEST(GrantTable, ARestartedHolderLosesWhatItsOldInstanceHeld) {
  GrantTable t({});
  Grant old = Of("node-a", "p", "t");
  old.caller_instance = 5;
  const uint64_t g5 = t.Add(old).grant;
  Grant unsaid = Of("node-a", "p", "t");  // an older daemon said no instance
  const uint64_t g0 = t.Add(unsaid).grant;
  EXPECT_FALSE(t.NewInstance("node-a", 5).has_value()) << "first seen";
  EXPECT_FALSE(t.NewInstance("node-a", 5).has_value()) << "the same";
  EXPECT_FALSE(t.NewInstance("node-a", 0).has_value()) << "not said";
  std::optional<std::vector<uint64_t>> stale = t.NewInstance("node-a", 6);
  ASSERT_TRUE(stale.has_value());
  EXPECT_EQ(*stale, std::vector<uint64_t>{g5});
  EXPECT_NE(g0, g5);
  EXPECT_EQ(t.counts().restarted_dropped, 1u);
}

TEST(GrantTable, AClosedTableGivesEverythingBackAndGrantsNoMore) {
  GrantTable t({});
  Grant relayed = Of("node-a", "p", "t");
  relayed.forward = std::make_shared<const Forward>();
  t.Add(relayed);
  t.Add(Of("node-b", "q", "u"));
  EXPECT_EQ(t.Forwards().size(), 1u);
  EXPECT_EQ(t.counts().relayed, 1u);
  std::map<uint64_t, Grant> all = t.Close();
  EXPECT_EQ(all.size(), 2u);
  EXPECT_EQ(t.Add(Of("node-a", "p", "t")).over, GrantTable::Over::kClosed);
  EXPECT_FALSE(t.WithinLimits("node-c", "r", "v"));
  EXPECT_EQ(t.counts().grants, 0u);
  EXPECT_EQ(t.counts().relayed, 0u);
}

TEST(GrantTable, ConcurrentAddsAndRemovesKeepTheCountsExact) {
  GrantTable t({.per_node = 1000000, .per_pod = 1000000, .per_tenant = 1000000});
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      const std::string node = "node-" + std::to_string(w % 2);
      for (int i = 0; i < 2000; ++i) {
        const GrantTable::Added a = t.Add(Of(node, "pod", "ns"));
        if (a.over != GrantTable::Over::kNone) ++refused;
        if (i % 2 == 0) t.Remove(node, a.grant);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(refused.load(), 0);
  EXPECT_EQ(t.counts().grants, 4u * 1000u);
  EXPECT_EQ(t.GrantsOf("node-0").size() + t.GrantsOf("node-1").size(), 4000u);
}

}  // namespace
}  // namespace podlink::mesh
