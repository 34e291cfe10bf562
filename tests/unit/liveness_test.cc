// Which importing nodes are alive (daemon/mesh/control/liveness.h), without an engine: what keeps a node alive,
// and this daemon's own pauses credited to every node.
#include "daemon/mesh/control/liveness.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace podlink::mesh {
namespace {

constexpr absl::Duration kIdle = absl::Milliseconds(300), kPeriod = absl::Milliseconds(50),
                         kSlack = absl::Milliseconds(400);

std::vector<std::string> SweepOf(Liveness& l, const std::vector<std::string>& holders,
                                 const std::set<std::string>& connected = {}) {
  std::vector<std::string> collected;
  Liveness::Swept s = l.Sweep(
      holders, [&](const std::string& n) { return connected.contains(n); },
      [&](const std::string& n) { collected.push_back(n); });
  EXPECT_EQ(s.idle, collected) << "what is collected is what is said idle";
  return s.idle;
}

void Nap(absl::Duration d) { std::this_thread::sleep_for(absl::ToChronoNanoseconds(d)); }

TEST(Liveness, AQuietNodeIsIdleAndACallAConnectionOrASignOfLifeKeepsItAlive) {
  Liveness l(kIdle, absl::Seconds(10), absl::Seconds(10));  // no pause credit in this test
  for (const char* n : {"quiet", "calling", "connected", "seen"}) l.Seen(n);
  l.BeginCall("calling");
  EXPECT_TRUE(SweepOf(l, {"quiet", "calling", "connected", "seen"}, {"connected"}).empty()) << "all seen just now";
  Nap(kIdle + absl::Milliseconds(50));
  l.Seen("seen");
  EXPECT_EQ(SweepOf(l, {"quiet", "calling", "connected", "seen"}, {"connected"}), std::vector<std::string>{"quiet"});
  l.Seen("quiet");  // forgotten with its grants; back, it is a live node again
  EXPECT_TRUE(SweepOf(l, {"quiet"}).empty());
  l.EndCall("calling");  // its end is a sign of life too
  EXPECT_TRUE(SweepOf(l, {"calling"}).empty());
  // A node never seen at all that holds grants is idle at once.
  EXPECT_EQ(SweepOf(l, {"stranger"}), std::vector<std::string>{"stranger"});
}

TEST(Liveness, ThisDaemonsOwnPauseIsCreditedToEveryNode) {
  Liveness l(kIdle, kPeriod, kSlack);
  l.Seen("node-a");
  EXPECT_TRUE(SweepOf(l, {"node-a"}).empty());
  // The daemon does not run for longer than the node's idle time (a stopped VM): the sweep after it must not
  // take that for the node's silence.
  Nap(kIdle + kSlack + absl::Milliseconds(100));
  Liveness::Swept s = l.Sweep({"node-a"}, [](const std::string&) { return false; }, [](const std::string&) {});
  EXPECT_TRUE(s.idle.empty()) << "the daemon's own pause was counted as the node's silence";
  EXPECT_GT(s.paused, kIdle);
  EXPECT_EQ(l.own_pauses(), 1u);
  // Sweeps on time credit nothing, and a node that stays quiet goes after all.
  std::vector<std::string> idle;
  for (int i = 0; i < 200 && idle.empty(); ++i) {  // a stalled test machine only credits more
    Nap(kPeriod);
    idle = SweepOf(l, {"node-a"});
  }
  EXPECT_EQ(idle, std::vector<std::string>{"node-a"});
}

TEST(Liveness, TheNodesRememberedAreBounded) {
  Liveness l(absl::Seconds(60), absl::Seconds(10), absl::Seconds(10));
  for (size_t i = 0; i < Liveness::kMaxNodes + 100; ++i) l.Seen("node-" + std::to_string(i));
  // Past the bound a new node is not remembered: it holds nothing here yet, and is idle at its first sweep.
  EXPECT_EQ(SweepOf(l, {"node-0", "node-" + std::to_string(Liveness::kMaxNodes + 50)}),
            std::vector<std::string>{"node-" + std::to_string(Liveness::kMaxNodes + 50)});
}

}  // namespace
}  // namespace podlink::mesh
