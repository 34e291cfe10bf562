// The control room's table of peers (daemon/mesh/control/peer_table.h) without an engine or a peer daemon: one
// peer per node (and one kept for TCP links), and a full table: peers that are idle, have no link up and back
// nothing are forgotten for a new node; one in use, one with a link up, or one busy on its worker is kept, and
// when all are kept the new node gets none. A closed table gives its peers back and makes none.
#include "daemon/mesh/control/peer_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"

namespace podlink::mesh {
namespace {

class UpLinks final : public DataLinks {
 public:
  const char* transport() const override { return "fake"; }
  uint64_t instance() const override { return 1; }
  absl::Status Submit(LinkOp) override { return absl::UnavailableError("not here"); }
  size_t live() const override { return 1; }
  LinkStats Stats() const override { return {}; }
  std::vector<std::tuple<std::string, bool, uint64_t>> Connections() const override { return {}; }
};

PeerTable::InUse Nothing() {
  return [] { return std::vector<std::shared_ptr<Peer>>{}; };
}

TEST(PeerTable, OnePeerPerNodeAndOneKeptForTcp) {
  PeerTable t;
  std::shared_ptr<Peer> a = t.Get("node-a", false, Nothing());
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(t.Get("node-a", false, Nothing()), a);
  std::shared_ptr<Peer> a_tcp = t.Get("node-a", true, Nothing());
  ASSERT_NE(a_tcp, nullptr);
  EXPECT_NE(a_tcp, a);
  EXPECT_TRUE(a_tcp->tcp());
  EXPECT_EQ(a_tcp->node(), "node-a");
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.Snapshot().count("node-a/tcp"), 1u);
}

TEST(PeerTable, AFullTableForgetsOnlyPeersThatBackNothing) {
  PeerTable t(4);
  std::shared_ptr<Peer> held = t.Get("held", false, Nothing());    // backs a handle
  std::shared_ptr<Peer> linked = t.Get("linked", false, Nothing());  // has a link up
  std::shared_ptr<Peer> busy = t.Get("busy", false, Nothing());      // a task on its worker
  std::shared_ptr<Peer> idle = t.Get("idle", false, Nothing());
  ASSERT_TRUE(held && linked && busy && idle);
  linked->set_links(std::make_shared<UpLinks>());
  absl::Notification release, running;
  ASSERT_TRUE(busy->Post([&] {
    running.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(10));
  }));
  ASSERT_TRUE(running.WaitForNotificationWithTimeout(absl::Seconds(10)));
  std::weak_ptr<Peer> idle_weak = idle;
  idle.reset();
  int asked = 0;
  auto in_use = [&] {
    ++asked;
    return std::vector<std::shared_ptr<Peer>>{held};
  };
  std::shared_ptr<Peer> fresh = t.Get("fresh", false, in_use);
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(idle_weak.lock(), nullptr) << "the idle peer was forgotten (and destroyed)";
  std::set<std::string> nodes;
  for (const auto& p : t.All()) nodes.insert(p->node());
  EXPECT_EQ(nodes, (std::set<std::string>{"busy", "fresh", "held", "linked"}));
  // Now the fresh one is idle and backs nothing too: it goes for the next, and the others stay.
  std::shared_ptr<Peer> next = t.Get("next", false, in_use);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(t.size(), 4u);
  // Every peer kept: the next node gets none (PeerFor says RESOURCE_EXHAUSTED).
  const std::vector<std::shared_ptr<Peer>> everyone = t.All();
  auto all_held = [&] { return everyone; };
  EXPECT_EQ(t.Get("one-more", false, all_held), nullptr);
  EXPECT_EQ(t.size(), 4u);
  // The peer busy on its worker is idle again once its task ended, and may go.
  release.Notify();
  for (int i = 0; i < 1000 && !busy->idle(); ++i) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(busy->idle());
  std::shared_ptr<Peer> last = t.Get("last", false, [&] { return std::vector<std::shared_ptr<Peer>>{held, next}; });
  ASSERT_NE(last, nullptr);
  nodes.clear();
  for (const auto& p : t.All()) nodes.insert(p->node());
  EXPECT_EQ(nodes, (std::set<std::string>{"held", "last", "linked", "next"}));
  busy->Stop();
}

TEST(PeerTable, AClosedTableGivesItsPeersBackAndMakesNone) {
  PeerTable t;
  ASSERT_NE(t.Get("node-a", false, Nothing()), nullptr);
  std::map<std::string, std::shared_ptr<Peer>> back = t.Close();
  EXPECT_EQ(back.size(), 1u);
  EXPECT_EQ(t.Get("node-b", false, Nothing()), nullptr);
  EXPECT_EQ(t.size(), 0u);
  for (auto& [k, p] : back) p->Stop();
}

}  // namespace
}  // namespace podlink::mesh
