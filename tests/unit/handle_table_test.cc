// The importer's handle table (daemon/mesh/importer/handle_table.h), without an engine, sockets or peers.
#include "daemon/mesh/importer/handle_table.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "daemon/relay/mesh_port.h"

namespace podlink::mesh {
class Peer {};  // the table only holds shared pointers to it

namespace {

Handle In(uint64_t session, std::shared_ptr<Peer> peer = std::make_shared<Peer>()) {
  Handle h;
  h.session = session;
  h.peer = std::move(peer);
  h.grant = 42;
  return h;
}

TEST(HandleTable, HandlesAreRemoteSessionsOwnAndLimitedPerSession) {
  HandleTable t(2);
  absl::StatusOr<uint64_t> a = t.Add(In(1)), b = t.Add(In(1));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_NE(*a & kRemoteHandleBit, 0u) << "the relay ring tells remote handles from export ids by this bit";
  absl::StatusOr<uint64_t> c = t.Add(In(1));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(t.Add(In(2)).ok()) << "another session's limit is its own";

  EXPECT_FALSE(t.Find(2, *a).has_value()) << "a handle is found only for the session that opened it";
  EXPECT_FALSE(t.Remove(2, *a).has_value());
  ASSERT_TRUE(t.Find(1, *a).has_value());
  EXPECT_EQ(t.Find(1, *a)->grant, 42u);
  EXPECT_EQ(t.OfSession(1).size(), 2u);
  ASSERT_TRUE(t.Remove(1, *a).has_value());
  EXPECT_FALSE(t.Remove(1, *a).has_value()) << "dropped once";
  absl::StatusOr<uint64_t> d = t.Add(In(1));
  ASSERT_TRUE(d.ok()) << "a dropped handle gives its place back";
  EXPECT_NE(*d, *a) << "handle numbers are not reused";
  EXPECT_EQ(t.size(), 3u);
}

TEST(HandleTable, ASecondRouteJoinsOnceAndOnlyItsOwnSessionsLiveHandle) {
  HandleTable t(8);
  const uint64_t h = *t.Add(In(1));
  auto relay = std::make_shared<Peer>();
  auto route = std::make_shared<TwoHop>();
  route->peer = relay;
  EXPECT_FALSE(t.AttachTwoHop(2, h, route)) << "another session's handle";
  EXPECT_TRUE(t.AttachTwoHop(1, h, route));
  EXPECT_FALSE(t.AttachTwoHop(1, h, std::make_shared<TwoHop>())) << "it has one already";
  EXPECT_EQ(t.Find(1, h)->two_hop, route);
  std::vector<std::shared_ptr<Peer>> peers = t.Peers();
  EXPECT_EQ(peers.size(), 2u);
  EXPECT_TRUE(std::find(peers.begin(), peers.end(), relay) != peers.end()) << "the relay's peer stays in use";
  ASSERT_TRUE(t.Remove(1, h).has_value());
  EXPECT_FALSE(t.AttachTwoHop(1, h, route)) << "the handle went first";
}

TEST(HandleTable, AClosedTableGivesEverythingBackAndOpensNoMore) {
  HandleTable t(8);
  const uint64_t h = *t.Add(In(1));
  std::map<uint64_t, Handle> all = t.Close();
  EXPECT_EQ(all.size(), 1u);
  EXPECT_TRUE(all.contains(h));
  EXPECT_EQ(t.Add(In(1)).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(t.AttachTwoHop(1, h, std::make_shared<TwoHop>()));
  EXPECT_EQ(t.size(), 0u);
}

TEST(HandleTable, ConcurrentOpensAndDropsKeepEachSessionsCountExact) {
  HandleTable t(1000);
  std::vector<std::thread> threads;
  for (uint64_t s = 1; s <= 4; ++s) {
    threads.emplace_back([&t, s] {
      std::vector<uint64_t> mine;
      for (int i = 0; i < 3000; ++i) {
        absl::StatusOr<uint64_t> h = t.Add(In(s));
        if (h.ok()) mine.push_back(*h);
        if (i % 3 == 0 && !mine.empty()) {
          t.Remove(s, mine.back());
          mine.pop_back();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (uint64_t s = 1; s <= 4; ++s) EXPECT_EQ(t.OfSession(s).size(), 1000u) << "session " << s;
  std::set<uint64_t> ids;
  for (uint64_t s = 1; s <= 4; ++s) {
    for (uint64_t id : t.OfSession(s)) EXPECT_TRUE(ids.insert(id).second);
  }
}

}  // namespace
}  // namespace podlink::mesh
