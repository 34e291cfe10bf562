// The routing room's trade of node adverts (daemon/mesh/routing/advert_trader.h) without an engine, gRPC or a
// peer daemon: an advert signed by the node it names under the mesh CA is learnt (its endpoint reaches the known
// nodes); one signed under another CA, or carrying another node's certificate, is refused and teaches nothing; a
// neighbour is only a node on one of this node's subnets, and a cable between two other nodes is believed when
// both ends' adverts name each other; the operator's mesh.peers are part of that trust.
#include "daemon/mesh/routing/advert_trader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/common/test_ca.h"

namespace podlink::mesh {
namespace {

namespace pb = podlink::mesh::v1;
using podlink::testing::Sh;
using podlink::testing::TestCa;

// One node's side: its certificate files, known nodes and trader.
struct Node {
  Node(const std::string& name, const std::string& dir, const std::string& address,
       std::map<std::string, std::vector<IpPrefix>> configured = {})
      : name(name), address(address), credentials(dir, absl::ZeroDuration()), known(name) {
    EXPECT_TRUE(credentials.Load().ok()) << dir;
    AdvertTrader::Options o{.node_name = name,
                            .interval = absl::Seconds(60),
                            .connect_timeout = absl::Seconds(1),
                            .configured = std::move(configured)};
    AdvertTrader::Rooms rooms{.local = [address] { return ParsePrefixes({address}); },
                              .new_stub = nullptr,  // these tests never trade over the network
                              .hello = [] { return pb::HelloRequest(); }};
    trader = std::make_unique<AdvertTrader>(std::move(o), std::move(rooms), &credentials, &known);
  }
  // This node's advert as its next Hello would carry it (signed now).
  google::protobuf::RepeatedPtrField<pb::NodeAdvert> Adverts() {
    trader->RefreshOwn({address}, 7446);
    google::protobuf::RepeatedPtrField<pb::NodeAdvert> out;
    trader->AddTo(&out);
    return out;
  }

  std::string name, address;
  NodeCredentials credentials;
  KnownNodes known;
  std::unique_ptr<AdvertTrader> trader;
};

class Adverts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Sh("openssl version") != 0) GTEST_SKIP() << "needs the openssl CLI";
    dir_ = absl::StrCat("/tmp/podlink-advert-trader-", ::getpid());
    ASSERT_EQ(Sh("rm -rf " + dir_), 0);
    TestCa ca(dir_ + "/ca");
    for (const char* n : {"node-a", "node-b", "node-c"}) ca.Issue(n, dir_ + "/" + n);
    TestCa other(dir_ + "/other-ca");
    other.Issue("node-x", dir_ + "/node-x", ca.ca());  // trusts the mesh CA, signed by another
  }
  void TearDown() override { Sh("rm -rf " + dir_); }
  std::string Dir(const std::string& node) const { return dir_ + "/" + node; }
  std::string dir_;
};

TEST_F(Adverts, AnAdvertSignedByTheNodeItNamesIsLearnt) {
  Node a("node-a", Dir("node-a"), "10.1.0.1/24"), b("node-b", Dir("node-b"), "10.1.0.2/24");
  b.trader->Accept("node-a", a.Adverts());
  std::optional<RemoteTarget> learnt = b.known.Find("node-a");
  ASSERT_TRUE(learnt.has_value());
  EXPECT_EQ(learnt->addresses, std::vector<std::string>{"10.1.0.1/24"});
  EXPECT_EQ(learnt->port, 7446u);
  EXPECT_GE(b.trader->book().IssuedOf("node-a"), 0);
  EXPECT_EQ(b.trader->book().refused(), 0u);
}

TEST_F(Adverts, AnAdvertUnderAnotherCaOrWithAnotherNodesCertificateIsRefused) {
  Node b("node-b", Dir("node-b"), "10.1.0.2/24"), c("node-c", Dir("node-c"), "10.1.0.3/24");
  Node x("node-x", Dir("node-x"), "10.1.0.9/24");
  b.trader->Accept("node-x", x.Adverts());
  EXPECT_FALSE(b.known.Find("node-x").has_value());
  EXPECT_EQ(b.trader->book().refused(), 1u);
  // node-c's advert carrying node-x's name: the certificate names node-c, not the node the entry names.
  google::protobuf::RepeatedPtrField<pb::NodeAdvert> forged = c.Adverts();
  ASSERT_EQ(forged.size(), 1);
  pb::AdvertEntry entry;
  ASSERT_TRUE(entry.ParseFromString(forged[0].entry()));
  entry.mutable_node()->set_node("node-x");
  entry.SerializeToString(forged[0].mutable_entry());
  b.trader->Accept("node-c", forged);
  EXPECT_FALSE(b.known.Find("node-x").has_value());
  EXPECT_FALSE(b.known.Find("node-c").has_value());
  EXPECT_EQ(b.trader->book().refused(), 2u);
}

TEST_F(Adverts, ACableIsBelievedWhenBothEndsNameEachOtherAndOnlyOnTheirSubnet) {
  Node a("node-a", Dir("node-a"), "10.1.0.1/24"), b("node-b", Dir("node-b"), "10.1.0.2/24");
  Node c("node-c", Dir("node-c"), "10.2.0.3/24");
  // a and b share 10.1.0.0/24; each saw the other there. b also claims to have seen c at an address off its
  // subnets: not a neighbour.
  a.trader->SawNeighbour("node-b", "10.1.0.2");
  b.trader->SawNeighbour("node-a", "10.1.0.1");
  b.trader->SawNeighbour("node-c", "10.2.0.3");
  c.trader->SawNeighbour("node-b", "10.1.0.2");  // off c's subnet too
  c.trader->Accept("node-a", a.Adverts());
  c.trader->Accept("node-b", b.Adverts());
  c.trader->Accept("node-c", c.Adverts());
  const CableTrust t = c.trader->Trust();
  EXPECT_TRUE(t.Confirmed("node-a", "node-b"));
  EXPECT_TRUE(t.Confirmed("node-b", "node-a"));
  EXPECT_FALSE(t.Confirmed("node-b", "node-c"));
  EXPECT_TRUE(t.configured.empty());
}

TEST_F(Adverts, TheOperatorsPeersArePartOfTheTrust) {
  Node a("node-a", Dir("node-a"), "10.1.0.1/24", {{"node-b", ParsePrefixes({"10.1.0.2/24"})}});
  const CableTrust t = a.trader->Trust();
  ASSERT_EQ(t.configured.count("node-b"), 1u);
  EXPECT_EQ(t.configured.at("node-b").front().ToString(), "10.1.0.2/24");
  EXPECT_TRUE(t.confirmed.empty());
}

}  // namespace
}  // namespace podlink::mesh
