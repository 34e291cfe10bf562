// Routes through relays (daemon/mesh/routes.h): shortest chains of known
// nodes, each sharing a subnet with the next, the widest bottleneck among
// equals, bounded length.
#include "daemon/mesh/routes.h"

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
};

TEST_F(PartialMesh, AdjacentNodesNeedNoRelay) {
  auto via = RelayPath("a", a_, known_, "c");
  ASSERT_TRUE(via.has_value());
  EXPECT_TRUE(via->empty());
}

TEST_F(PartialMesh, ANodeCabledOnlyToCIsReachedThroughC) {
  auto via = RelayPath("a", a_, known_, "d");
  ASSERT_TRUE(via.has_value());
  EXPECT_EQ(*via, std::vector<std::string>{"c"});
}

TEST_F(PartialMesh, UnknownRelaysGiveNoRoute) {
  known_.erase("c");
  EXPECT_FALSE(RelayPath("a", a_, known_, "d").has_value());
  EXPECT_FALSE(RelayPath("a", a_, known_, "nobody").has_value());
  EXPECT_FALSE(RelayPath("a", a_, known_, "a").has_value());
}

TEST_F(PartialMesh, AChainIsFollowedUpToTheRelayBound) {
  // a - c - d - e - f - g: e needs 2 relays, g needs 4 (over the bound of 3).
  known_["e"] = Addrs({"10.0.5.2/30"});
  known_["d"] = Addrs({"10.0.4.2/30", "10.0.5.1/30"});
  known_["e"] = Addrs({"10.0.5.2/30", "10.0.6.1/30"});
  known_["f"] = Addrs({"10.0.6.2/30", "10.0.7.1/30"});
  known_["g"] = Addrs({"10.0.7.2/30"});
  auto e = RelayPath("a", a_, known_, "e");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e, (std::vector<std::string>{"c", "d"}));
  auto f = RelayPath("a", a_, known_, "f");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(*f, (std::vector<std::string>{"c", "d", "e"}));
  EXPECT_FALSE(RelayPath("a", a_, known_, "g").has_value());
  EXPECT_TRUE(RelayPath("a", a_, known_, "g", 4).has_value());
}

TEST_F(PartialMesh, AmongEquallyShortRoutesTheWidestBottleneckWins) {
  // d cabled to both b (once) and c (once); a has two cables to b and one to c.
  a_ = Addrs({"10.0.1.1/30", "10.0.8.1/30", "10.0.3.1/30"});
  known_["b"] = Addrs({"10.0.1.2/30", "10.0.8.2/30", "10.0.9.1/30", "10.0.10.1/30"});
  known_["d"] = Addrs({"10.0.4.2/30", "10.0.9.2/30", "10.0.10.2/30"});
  auto via = RelayPath("a", a_, known_, "d");
  ASSERT_TRUE(via.has_value());
  EXPECT_EQ(*via, std::vector<std::string>{"b"});  // two cables on each hop through b, one through c
}

TEST_F(PartialMesh, ARouteNeverPassesThroughItsOwnOrigin) {
  // This node's own name among the known nodes is ignored.
  known_["a"] = Addrs({"10.0.4.3/30"});
  auto via = RelayPath("a", a_, known_, "d");
  ASSERT_TRUE(via.has_value());
  EXPECT_EQ(*via, std::vector<std::string>{"c"});
}

}  // namespace
}  // namespace podlink::mesh
