// The routing room's advert book (daemon/mesh/routing/advert_book.h), without an engine, sockets or a CA: the
// signature check is the test's own `verify`, so every other rule is attacked with adverts that would verify.
#include "daemon/mesh/routing/advert_book.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"

namespace podlink::mesh {
namespace {

namespace pb = podlink::mesh::v1;
using Batch = google::protobuf::RepeatedPtrField<pb::NodeAdvert>;

int64_t Now() { return absl::ToUnixSeconds(absl::Now()); }

pb::NodeAdvert AdvertOf(const std::string& node, int64_t issued, const std::vector<std::string>& neighbours = {}) {
  pb::AdvertEntry e;
  e.mutable_node()->set_node(node);
  e.mutable_node()->add_addresses("10.0.0.1/24");
  e.mutable_node()->set_port(7446);
  e.set_issued_unix_seconds(issued);
  for (const std::string& n : neighbours) e.add_neighbours(n);
  pb::NodeAdvert a;
  e.SerializeToString(a.mutable_entry());
  a.set_signature("sig");
  return a;
}

struct Checker {
  int calls = 0;
  std::set<std::string> forged;  // adverts of these nodes fail the check
  AdvertBook::Verify fn() {
    return [this](const pb::NodeAdvert&, const std::string& node) {
      ++calls;
      return forged.contains(node) ? absl::PermissionDeniedError("forged") : absl::OkStatus();
    };
  }
};

TEST(AdvertBook, OnlyWellFormedFreshVerifiedAdvertsOfOtherNodesAreKept) {
  AdvertBook book("self", absl::Seconds(60));
  Checker check;
  check.forged.insert("forger");
  Batch batch;
  *batch.Add() = AdvertOf("node-a", Now());
  *batch.Add() = AdvertOf("self", Now());               // this node's word about itself is its own
  *batch.Add() = AdvertOf("Bad_Name", Now());           // no node's name
  *batch.Add() = AdvertOf("node-stale", Now() - 601);   // older than ten intervals
  *batch.Add() = AdvertOf("node-early", Now() + 3600);  // from the future
  *batch.Add() = AdvertOf("forger", Now());             // fails the signature check
  pb::NodeAdvert big = AdvertOf("node-big", Now());
  big.mutable_entry()->append(AdvertBook::kMaxAdvertEntry, 'x');
  *batch.Add() = big;
  pb::NodeAdvert junk;
  junk.set_entry("\xff\xff\xff");
  *batch.Add() = junk;
  std::vector<AdvertBook::Learned> learned = book.Accept("node-a", batch, check.fn());
  ASSERT_EQ(learned.size(), 1u);
  EXPECT_EQ(learned[0].node, "node-a");
  EXPECT_TRUE(learned[0].first);
  EXPECT_EQ(learned[0].port, 7446u);
  EXPECT_EQ(book.size(), 1u);
  EXPECT_EQ(check.calls, 2) << "only what passed every other rule costs a signature check";
  EXPECT_EQ(book.refused(), 4u) << "bad name, forged, oversized, unparsable (stale and early are simply not new)";
  EXPECT_EQ(book.IssuedOf("forger"), -1);
}

TEST(AdvertBook, ANewerAdvertReplacesAnOlderOneWhichIsNeverCheckedAgain) {
  AdvertBook book("self", absl::Seconds(60));
  Checker check;
  const int64_t t = Now();
  Batch first;
  *first.Add() = AdvertOf("node-a", t - 10);
  ASSERT_EQ(book.Accept("relay-1", first, check.fn()).size(), 1u);
  Batch again;
  *again.Add() = AdvertOf("node-a", t - 10);  // the same one, passed on by another sender
  *again.Add() = AdvertOf("node-a", t - 20);  // an older one
  EXPECT_TRUE(book.Accept("relay-2", again, check.fn()).empty());
  EXPECT_EQ(check.calls, 1) << "known adverts are not verified again";
  Batch newer;
  *newer.Add() = AdvertOf("node-a", t);
  std::vector<AdvertBook::Learned> learned = book.Accept("relay-3", newer, check.fn());
  ASSERT_EQ(learned.size(), 1u);
  EXPECT_FALSE(learned[0].first);
  EXPECT_EQ(book.IssuedOf("node-a"), t);
}

TEST(AdvertBook, ASenderGetsOneBatchASecondAndAtMostFortyEightAdvertsLookedAt) {
  AdvertBook book("self", absl::Seconds(60));
  Checker check;
  Batch flood;
  for (int i = 0; i < 100; ++i) *flood.Add() = AdvertOf("node-" + std::to_string(i), Now());
  EXPECT_EQ(book.Accept("node-x", flood, check.fn()).size(), AdvertBook::kMaxAdvertsPerMessage);
  EXPECT_TRUE(book.Accept("node-x", flood, check.fn()).empty()) << "the same sender within a second";
  EXPECT_EQ(check.calls, static_cast<int>(AdvertBook::kMaxAdvertsPerMessage));
  // Another sender's batch is its own: what the first one's left unread is looked at now.
  Batch rest;
  for (int i = 99; i >= 0; --i) *rest.Add() = AdvertOf("node-" + std::to_string(i), Now());
  EXPECT_EQ(book.Accept("node-y", rest, check.fn()).size(), AdvertBook::kMaxAdvertsPerMessage);
  EXPECT_EQ(book.size(), 2 * AdvertBook::kMaxAdvertsPerMessage);
}

TEST(AdvertBook, TheBookIsBoundedWhateverNodesCallThemselves) {
  AdvertBook book("self", absl::Seconds(60));
  Checker check;
  for (size_t sender = 0; book.size() < AdvertBook::kMaxAdverts + 10 && sender < 100; ++sender) {
    Batch b;
    for (size_t i = 0; i < AdvertBook::kMaxAdvertsPerMessage; ++i) {
      *b.Add() = AdvertOf(absl::StrCat("n", sender, "-", i), Now());
    }
    book.Accept(absl::StrCat("sender-", sender), b, check.fn());
  }
  EXPECT_EQ(book.size(), AdvertBook::kMaxAdverts);
  // A neighbour list is cut too.
  std::vector<std::string> many;
  for (int i = 0; i < 500; ++i) many.push_back("nb-" + std::to_string(i));
  AdvertBook small("self", absl::Seconds(60));
  Batch b;
  *b.Add() = AdvertOf("node-a", Now(), many);
  small.Accept("node-a", b, check.fn());
  for (int i = 0; i < 500; ++i) small.SawNeighbour("seen-" + std::to_string(i), "10.0.0.2");
  EXPECT_EQ(small.OwnEntry().neighbours_size(), static_cast<int>(AdvertBook::kMaxNeighbours));
}

TEST(AdvertBook, ACableIsConfirmedOnlyWhenBothEndsNameEachOther) {
  AdvertBook book("self", absl::Seconds(60));
  Checker check;
  Batch b;
  *b.Add() = AdvertOf("node-a", Now(), {"node-b", "node-c"});
  *b.Add() = AdvertOf("node-b", Now(), {"node-a"});
  *b.Add() = AdvertOf("node-c", Now(), {"node-d"});  // node-a claims node-c; node-c does not say so
  book.Accept("node-a", b, check.fn());
  const std::set<std::pair<std::string, std::string>> want = {{"node-a", "node-b"}};
  EXPECT_EQ(book.Confirmed(), want);
}

TEST(AdvertBook, ThisNodesOwnAdvertGoesFirstAndANewNeighbourMakesItDueAtOnce) {
  AdvertBook book("self", absl::Seconds(60));
  Checker check;
  EXPECT_TRUE(book.OwnDue());
  EXPECT_FALSE(book.OwnDue()) << "once per interval";
  EXPECT_TRUE(book.TradeDue());
  EXPECT_FALSE(book.TradeDue());
  book.SawNeighbour("node-a", "10.0.0.2");
  EXPECT_TRUE(book.OwnDue()) << "a new neighbour is said at the next housekeeping";
  EXPECT_TRUE(book.TradeDue());
  book.SawNeighbour("node-a", "10.0.0.2");
  EXPECT_FALSE(book.OwnDue()) << "a neighbour seen again is not new";
  pb::AdvertEntry entry = book.OwnEntry();
  ASSERT_EQ(entry.neighbours_size(), 1);
  EXPECT_EQ(entry.neighbours(0), "node-a");
  entry.mutable_node()->set_node("self");
  pb::NodeAdvert own;
  entry.SerializeToString(own.mutable_entry());
  book.SetOwn(own, entry);
  Batch others;
  *others.Add() = AdvertOf("node-old", Now() - 100);
  *others.Add() = AdvertOf("node-new", Now() - 1);
  book.Accept("node-a", others, check.fn());
  Batch out;
  book.AddTo(&out);
  ASSERT_EQ(out.size(), 3);
  pb::AdvertEntry e;
  ASSERT_TRUE(e.ParseFromString(out[0].entry()));
  EXPECT_EQ(e.node().node(), "self");
  ASSERT_TRUE(e.ParseFromString(out[1].entry()));
  EXPECT_EQ(e.node().node(), "node-new") << "the freshest others next";
}

}  // namespace
}  // namespace podlink::mesh
