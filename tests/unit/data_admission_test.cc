// The TCP data server's gate (daemon/mesh/tcp/admission.h), without sockets or an engine: cookies, the slots
// before AUTH, strangers' half, each peer's share after it.
#include "daemon/mesh/tcp/admission.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace podlink::mesh {
namespace {

using Pending = DataAdmission::Pending;

TEST(DataAdmission, ACookieAuthenticatesOnceAsTheNodeItWasIssuedTo) {
  DataAdmission gate({.max_connections = 8, .max_per_peer = 4});
  absl::StatusOr<std::vector<std::string>> cookies = gate.IssueCookies("node-a", 2, "10.0.0.2", {});
  ASSERT_TRUE(cookies.ok()) << cookies.status();
  ASSERT_EQ(cookies->size(), 2u);
  EXPECT_NE((*cookies)[0], (*cookies)[1]);
  std::optional<Pending> p = gate.Admit(10, "10.0.0.2");
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->stranger) << "the address called OpenLink";
  absl::StatusOr<std::string> node = gate.Authenticate(*p, &(*cookies)[0]);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(*node, "node-a");
  EXPECT_TRUE(gate.Connected("node-a"));
  // The same cookie again, a made-up one, and none at all.
  const std::vector<const std::string*> tries = {&(*cookies)[0], nullptr};
  for (const std::string* c : tries) {
    std::optional<Pending> q = gate.Admit(11, "10.0.0.2");
    ASSERT_TRUE(q.has_value());
    EXPECT_FALSE(gate.Authenticate(*q, c).ok());
  }
  const std::string forged(32, 'x');
  std::optional<Pending> q = gate.Admit(12, "10.0.0.2");
  EXPECT_EQ(gate.Authenticate(*q, &forged).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(gate.counts().refused, 3u);
  EXPECT_EQ(gate.counts().unauthenticated, 0u) << "every slot before AUTH was given back";
  gate.Disconnected("node-a");
  EXPECT_FALSE(gate.Connected("node-a"));
}

TEST(DataAdmission, OpenLinkIsBoundedAndItsSourcesMustBeAddresses) {
  DataAdmission gate({});
  EXPECT_FALSE(gate.IssueCookies("node-a", 0, "", {}).ok());
  EXPECT_FALSE(gate.IssueCookies("node-a", 65, "", {}).ok());
  EXPECT_FALSE(gate.IssueCookies("node-a", 1, "", {"10.0.0.0/24"}).ok()) << "a subnet is no source";
  EXPECT_FALSE(gate.IssueCookies("node-a", 1, "", {"not-an-address"}).ok());
  std::vector<std::string> many(DataAdmission::kMaxClaimedSources + 1, "10.0.0.9");
  EXPECT_FALSE(gate.IssueCookies("node-a", 1, "", many).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(gate.IssueCookies("node-a", 64, "", {}).ok());
  EXPECT_EQ(gate.IssueCookies("node-a", 1, "", {}).status().code(), absl::StatusCode::kResourceExhausted)
      << "a node holds at most " << DataAdmission::kMaxCookiesPerNode << " unused cookies";
  EXPECT_TRUE(gate.IssueCookies("node-b", 1, "", {}).ok()) << "another node's are its own";
}

TEST(DataAdmission, StrangersTakeAtMostHalfTheSlotsBeforeAuthAndOneSourceAFew) {
  DataAdmission gate({});
  ASSERT_TRUE(gate.IssueCookies("node-a", 1, "10.0.0.2", {"10.0.1.2"}).ok());
  std::vector<Pending> held;
  int fd = 100;
  for (int i = 0; i < 200; ++i) {
    std::optional<Pending> p = gate.Admit(fd++, "192.168.0." + std::to_string(i));
    if (p.has_value()) held.push_back(*p);
  }
  EXPECT_EQ(held.size(), DataAdmission::kStrangerShare);
  // A peer's addresses (its control call's and those it named) still get slots.
  for (const char* a : {"10.0.0.2", "10.0.1.2"}) {
    std::optional<Pending> p = gate.Admit(fd++, a);
    ASSERT_TRUE(p.has_value()) << a;
    EXPECT_FALSE(p->stranger);
    held.push_back(*p);
  }
  // One source at most a few.
  size_t from_one = 0;
  for (int i = 0; i < 20; ++i) {
    std::optional<Pending> p = gate.Admit(fd++, "10.0.0.2");
    if (p.has_value()) {
      ++from_one;
      held.push_back(*p);
    }
  }
  EXPECT_EQ(from_one + 1, DataAdmission::kMaxUnauthenticatedPerSource);
  for (const Pending& p : held) EXPECT_FALSE(gate.Authenticate(p, nullptr).ok());
  EXPECT_EQ(gate.counts().unauthenticated, 0u);
  EXPECT_TRUE(gate.Admit(fd++, "192.168.1.1").has_value()) << "slots given back are taken again";
}

TEST(DataAdmission, EachPeerHoldsItsShareAndTheTotalTurnsAwayOnlyThosePastTheGuarantee) {
  DataAdmission gate({.max_connections = 20, .max_per_peer = 18});
  auto connect = [&gate](const std::string& node, int fd) {
    absl::StatusOr<std::vector<std::string>> c = gate.IssueCookies(node, 1, "10.0.0.2", {});
    std::optional<Pending> p = gate.Admit(fd, "10.0.0.2");
    if (!c.ok() || !p.has_value()) return false;
    return gate.Authenticate(*p, &(*c)[0]).ok();
  };
  int fd = 1;
  int a = 0;
  while (connect("node-a", fd++) && a < 100) ++a;
  EXPECT_EQ(a, 18) << "the peer's own share";
  int b = 0;
  while (connect("node-b", fd++) && b < 100) ++b;
  EXPECT_EQ(b, static_cast<int>(DataAdmission::kGuaranteedConnections))
      << "past the total, a peer still gets its guaranteed connections";
}

TEST(DataAdmission, StoppingShutsEverySocketAndWaitsForItsThread) {
  DataAdmission gate({});
  ASSERT_TRUE(gate.Admit(-1, "10.0.0.2").has_value());  // -1: shutdown fails harmlessly
  std::atomic<bool> closed{false};
  std::thread serving([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.Closed(-1, [&] { closed = true; });
  });
  gate.ShutdownAndWait();
  EXPECT_TRUE(closed.load()) << "returned before the connection's thread was done";
  serving.join();
  EXPECT_EQ(gate.counts().serving, 0u);
}

}  // namespace
}  // namespace podlink::mesh
