// Routes through relays (daemon/mesh/routing/routes.h): shortest chains of known
// nodes, each sharing a subnet with the next, the widest bottleneck among
// equals, bounded length.
#include "daemon/mesh/routing/routes.h"

#include "gtest/gtest.h"

namespace podlink::mesh {
namespace {

std::vector<IpPrefix> Addrs(std::initializer_list<const char*> list) {
  std::vector<IpPrefix> out;
  for (const char* a : list) {
    absl::StatusOr<IpPrefix> p = IpPrefix::Parse(a);
    EXPECT_TRUE(p.ok()) << a;
    if (p.ok()) out.push_back(*p);
  }
  return out;
}

// The partial mesh: a triangle A-B-C, and D cabled only to C.
class PartialMesh : public ::testing::Test {
 protected:
  std::vector<IpPrefix> a_ = Addrs({"10.0.1.1/30", "10.0.3.1/30"});
  std::map<std::string, std::vector<IpPrefix>> known_ = {
      {"b", Addrs({"10.0.1.2/30", "10.0.2.1/30"})},
      {"c", Addrs({"10.0.2.2/30", "10.0.3.2/30", "10.0.4.1/30"})},
      {"d", Addrs({"10.0.4.2/30"})},
  };
  // These tests are about the graph: every claimed cable is believed.
  CableTrust all_{.believe_all = true};
};

TEST_F(PartialMesh, AdjacentNodesNeedNoRelay) {
  auto via = RelayPath("a", a_, known_, "c", all_);
  ASSERT_TRUE(via.has_value());
  EXPECT_TRUE(via->empty());
}

TEST_F(PartialMesh, ANodeCabledOnlyToCIsReachedThroughC) {
  auto via = RelayPath("a", a_, known_, "d", all_);
  ASSERT_TRUE(via.has_value());
  EXPECT_EQ(*via, std::vector<std::string>{"c"});
}

TEST_F(PartialMesh, UnknownRelaysGiveNoRoute) {
  known_.erase("c");
  EXPECT_FALSE(RelayPath("a", a_, known_, "d", all_).has_value());
  EXPECT_FALSE(RelayPath("a", a_, known_, "nobody", all_).has_value());
  EXPECT_FALSE(RelayPath("a", a_, known_, "a", all_).has_value());
}

TEST_F(PartialMesh, AChainIsFollowedUpToTheRelayBound) {
  // a - c - d - e - f - g: e needs 2 relays, g needs 4 (over the bound of 3).
  known_["e"] = Addrs({"10.0.5.2/30"});
  known_["d"] = Addrs({"10.0.4.2/30", "10.0.5.1/30"});
  known_["e"] = Addrs({"10.0.5.2/30", "10.0.6.1/30"});
  known_["f"] = Addrs({"10.0.6.2/30", "10.0.7.1/30"});
  known_["g"] = Addrs({"10.0.7.2/30"});
  auto e = RelayPath("a", a_, known_, "e", all_);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e, (std::vector<std::string>{"c", "d"}));
  auto f = RelayPath("a", a_, known_, "f", all_);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(*f, (std::vector<std::string>{"c", "d", "e"}));
  EXPECT_FALSE(RelayPath("a", a_, known_, "g", all_).has_value());
  EXPECT_TRUE(RelayPath("a", a_, known_, "g", all_, 4).has_value());
}

TEST_F(PartialMesh, AmongEquallyShortRoutesTheWidestBottleneckWins) {
  // d cabled to both b (once) and c (once); a has two cables to b and one to c.
  a_ = Addrs({"10.0.1.1/30", "10.0.8.1/30", "10.0.3.1/30"});
  known_["b"] = Addrs({"10.0.1.2/30", "10.0.8.2/30", "10.0.9.1/30", "10.0.10.1/30"});
  known_["d"] = Addrs({"10.0.4.2/30", "10.0.9.2/30", "10.0.10.2/30"});
  auto via = RelayPath("a", a_, known_, "d", all_);
  ASSERT_TRUE(via.has_value());
  EXPECT_EQ(*via, std::vector<std::string>{"b"});  // two cables on each hop through b, one through c
}

TEST_F(PartialMesh, ARouteNeverPassesThroughItsOwnOrigin) {
  // This node's own name among the known nodes is ignored.
  known_["a"] = Addrs({"10.0.4.3/30"});
  auto via = RelayPath("a", a_, known_, "d", all_);
  ASSERT_TRUE(via.has_value());
  EXPECT_EQ(*via, std::vector<std::string>{"c"});
}

// The route hijack of 2026-11-27 (issue 34), from node b's side: b is cabled
// to a and to c; a is cabled to d; c, with a valid certificate, advertises
// its own address twice and two addresses in the a-d subnet, where it has no
// cable. A claim about one's own addresses makes no cable between two other
// nodes; only the far end's word (its advert naming the near end) or the
// operator's does.
class BorrowedAddresses : public ::testing::Test {
 protected:
  std::vector<IpPrefix> b_ = Addrs({"10.1.1.2/30", "10.1.2.2/30"});
  std::map<std::string, std::vector<IpPrefix>> known_ = {
      {"a", Addrs({"10.1.1.1/30", "10.1.3.1/30"})},
      {"c", Addrs({"10.1.2.1/30", "10.1.2.1/30", "10.1.3.3/30", "10.1.3.2/30"})},
      {"d", Addrs({"10.1.3.2/30"})},
  };
};

TEST_F(BorrowedAddresses, RepeatedClaimsCountOnce) {
  // Believing every claim, c's four addresses are still one cable to b and
  // one to d: no wider than a's, so the first by name (a) is taken.
  EXPECT_EQ(SharedSubnets(b_, known_["c"]).size(), 1u);
  EXPECT_EQ(SharedSubnets(known_["c"], known_["d"]).size(), 1u) << "d's own address claimed by c is no cable";
  auto via = RelayPath("b", b_, known_, "d", CableTrust{.believe_all = true});
  ASSERT_TRUE(via.has_value());
  EXPECT_EQ(*via, std::vector<std::string>{"a"});
}

TEST_F(BorrowedAddresses, OnlyCablesTheFarEndConfirmsCarryRoutes) {
  CableTrust trust;
  // No word but the nodes' own: no route at all.
  EXPECT_FALSE(RelayPath("b", b_, known_, "d", trust).has_value());
  // d's advert names a and a's names d: the route goes through a.
  trust.confirmed.insert({"a", "d"});
  auto via = RelayPath("b", b_, known_, "d", trust);
  ASSERT_TRUE(via.has_value());
  EXPECT_EQ(*via, std::vector<std::string>{"a"});
  // Without a, c's claim alone (its advert may name d; d's does not name c)
  // draws nothing.
  known_.erase("a");
  EXPECT_FALSE(RelayPath("b", b_, known_, "d", trust).has_value());
  trust.confirmed.insert({"c", "d"});  // were d to name c, c would be believed
  EXPECT_TRUE(RelayPath("b", b_, known_, "d", trust).has_value());
}

TEST_F(BorrowedAddresses, TheOperatorsWordMakesACableToTheDestination) {
  CableTrust trust;
  trust.configured["a"] = Addrs({"10.1.1.1/30", "10.1.3.1/30"});  // mesh.peers
  auto via = RelayPath("b", b_, known_, "d", trust);
  ASSERT_TRUE(via.has_value());
  EXPECT_EQ(*via, std::vector<std::string>{"a"});
  // The operator's word about a covers a's end only: between two relays both
  // ends must be configured (or confirmed).
  known_["e"] = Addrs({"10.1.4.2/30"});
  known_["d"] = Addrs({"10.1.3.2/30", "10.1.4.1/30"});
  EXPECT_FALSE(RelayPath("b", b_, known_, "e", trust).has_value());
  trust.configured["d"] = Addrs({"10.1.3.2/30"});
  trust.confirmed.insert({"d", "e"});
  EXPECT_TRUE(RelayPath("b", b_, known_, "e", trust).has_value());
}

// Two-hop striping to a node this one is cabled to (mesh.two_hop_stripe)
// adds a relay's cables: the relay's claim to share the target's subnet is
// not enough, as for routes. Before, the first known node by name sharing a
// subnet with both ends was taken: here the attacker.
TEST(TwoHopRelay, ARelaysCableToTheTargetMustBeVouchedFor) {
  std::vector<IpPrefix> b = Addrs({"10.2.1.2/30", "10.2.2.2/30", "10.2.5.1/30"});  // to attacker, relay, d
  std::vector<IpPrefix> d = Addrs({"10.2.3.2/30", "10.2.5.2/30"});
  std::map<std::string, std::vector<IpPrefix>> known = {
      {"attacker", Addrs({"10.2.1.1/30", "10.2.3.3/30"})},  // claims an address in relay-d's subnet
      {"relay", Addrs({"10.2.2.1/30", "10.2.3.1/30"})},
      {"d", d},
  };
  EXPECT_FALSE(SharedSubnets(known["attacker"], d).empty()) << "the old criterion would take the attacker";
  CableTrust trust;
  EXPECT_FALSE(TwoHopRelay("b", b, known, "d", d, trust).has_value()) << "no word but the nodes' own";
  trust.confirmed.insert({"d", "relay"});  // both adverts name each other
  EXPECT_EQ(TwoHopRelay("b", b, known, "d", d, trust), "relay");
  // The operator's word about the relay's end, the destination's own addresses at the other.
  CableTrust configured;
  configured.configured["relay"] = Addrs({"10.2.3.1/30"});
  EXPECT_EQ(TwoHopRelay("b", b, known, "d", d, configured), "relay");
  // Were d to confirm the attacker's cable, it would be a relay like any other.
  trust.confirmed.insert({"attacker", "d"});
  EXPECT_EQ(TwoHopRelay("b", b, known, "d", d, trust), "attacker");
  // Never the target itself or a node this one has no cable to.
  known["far"] = Addrs({"10.2.9.1/30", "10.2.3.4/30"});
  trust.confirmed.insert({"d", "far"});
  trust.confirmed.erase({"attacker", "d"});
  trust.confirmed.erase({"d", "relay"});
  EXPECT_FALSE(TwoHopRelay("b", b, known, "d", d, trust).has_value());
}

}  // namespace
}  // namespace podlink::mesh
