// The routing room's book of other nodes' endpoints (daemon/mesh/routing/known_nodes.h): what configuration, Hellos
// and adverts may teach it (a peer's advert is hostile input), and its bound.
#include "daemon/mesh/routing/known_nodes.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace podlink::mesh {
namespace {

TEST(KnownNodes, LearnsWellFormedEndpointsOfOtherNodesOnly) {
  KnownNodes k("self");
  ASSERT_TRUE(k.Learn("node-b", {"10.0.0.2/24", "fd00::2/64"}, 7446));
  std::optional<RemoteTarget> b = k.Find("node-b");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->node_name, "node-b");
  EXPECT_EQ(b->addresses, (std::vector<std::string>{"10.0.0.2/24", "fd00::2/64"}));
  EXPECT_EQ(b->port, 7446u);
  // Learnt again: the new word replaces the old.
  ASSERT_TRUE(k.Learn("node-b", {"10.0.1.2/24"}, 7500));
  EXPECT_EQ(k.Find("node-b")->port, 7500u);
  EXPECT_EQ(k.Find("node-b")->addresses.size(), 1u);

  EXPECT_FALSE(k.Learn("self", {"10.0.0.1/24"}, 7446));            // this node
  EXPECT_FALSE(k.Learn("Node_B", {"10.0.0.2/24"}, 7446));          // not a node name
  EXPECT_FALSE(k.Learn(std::string(300, 'a'), {"10.0.0.2/24"}, 7446));
  EXPECT_FALSE(k.Learn("node-c", {"10.0.0.3/24"}, 0));             // no port
  EXPECT_FALSE(k.Learn("node-c", {"10.0.0.3/24"}, 65536));
  EXPECT_FALSE(k.Learn("node-c", {}, 7446));                       // no address
  EXPECT_FALSE(k.Learn("node-c", {"10.0.0.3/24", "not-an-address"}, 7446));
  std::vector<std::string> many;
  for (int i = 0; i < 65; ++i) many.push_back(absl::StrCat("10.1.", i, ".1/24"));
  EXPECT_FALSE(k.Learn("node-c", many, 7446));
  many.pop_back();
  EXPECT_TRUE(k.Learn("node-c", many, 7446));  // 64 is the most
  EXPECT_FALSE(k.Find("self").has_value());
  EXPECT_EQ(k.Snapshot().size(), 2u);
}

TEST(KnownNodes, AFullBookTakesNoNewNodeButStillUpdatesKnownOnes) {
  KnownNodes k("self");
  for (size_t i = 0; i < KnownNodes::kMaxKnown; ++i) {
    ASSERT_TRUE(k.Learn(absl::StrCat("n", i), {"10.0.0.2/24"}, 7446));
  }
  EXPECT_FALSE(k.Learn("one-more", {"10.0.0.2/24"}, 7446));
  EXPECT_FALSE(k.Find("one-more").has_value());
  EXPECT_TRUE(k.Learn("n7", {"10.9.9.9/24"}, 7447));
  EXPECT_EQ(k.Find("n7")->port, 7447u);
  EXPECT_EQ(k.Snapshot().size(), KnownNodes::kMaxKnown);
}

}  // namespace
}  // namespace podlink::mesh
