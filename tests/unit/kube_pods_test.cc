// The pod directory (daemon/identity/kube_pods.h) against a fake API server
// (tests/fakes/kube_apiserver.h): paged lists, watches with bookmarks, 410
// Gone, pods fetched by name, and every way a forwarded identity can differ
// from what the API server states.
#include "daemon/identity/kube_pods.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/fakes/kube_apiserver.h"

namespace podlink {
namespace {

using testing::FakeKubeApiServer;
using testing::FakePod;

TEST(KubePodsParse, APodKeepsOnlyWhatTheCheckNeeds) {
  absl::StatusOr<KubePod> p = ParsePod(FakeKubeApiServer::PodJson(
      FakePod{"u-1", "ml", "decode-0", "node-a", {{"podlink.io/peer-group", "job-7"}, {"other.io/x", "y"}}}, 7).dump());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->uid, "u-1");
  EXPECT_EQ(p->namespace_, "ml");
  EXPECT_EQ(p->name, "decode-0");
  EXPECT_EQ(p->node, "node-a");
  EXPECT_EQ(p->annotations, (std::map<std::string, std::string>{{"podlink.io/peer-group", "job-7"}}));
  EXPECT_FALSE(p->finished);
  FakePod done{"u-2", "ml", "x", "", {}, "Succeeded"};
  p = ParsePod(FakeKubeApiServer::PodJson(done, 1).dump());
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->finished);
  EXPECT_EQ(p->node, "");  // not scheduled
}

TEST(KubePodsParse, MalformedInputIsRefused) {
  for (const char* bad : {"", "{", "[]", "null", R"({"metadata":{}})", R"({"metadata":{"uid":"u","name":"n"}})",
                          R"({"metadata":{"uid":"u","name":"n","namespace":"s","annotations":[]}})",
                          R"({"metadata":{"uid":"u","name":"n","namespace":"s","annotations":{"podlink.io/a":1}}})"}) {
    EXPECT_FALSE(ParsePod(bad).ok()) << bad;
  }
  std::string many = R"({"metadata":{"uid":"u","name":"n","namespace":"s","annotations":{)";
  for (int i = 0; i < 300; ++i) absl::StrAppend(&many, i ? "," : "", "\"podlink.io/k", i, "\":\"v\"");
  absl::StatusOr<KubePod> big = ParsePod(many + "}}}");  // kept, so one pod cannot stop the watch
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_TRUE(big->oversized);
  EXPECT_TRUE(big->annotations.empty());
  EXPECT_FALSE(ParsePodList(R"({"kind":"PodList","metadata":{},"items":[]})").ok());  // no resourceVersion
  EXPECT_FALSE(ParsePodList(R"({"kind":"Pod","metadata":{"resourceVersion":"1"}})").ok());
  EXPECT_FALSE(ParsePodList(R"({"kind":"PodList","metadata":{"resourceVersion":"1"},"items":{}})").ok());
  EXPECT_FALSE(ParseWatchEvent(R"({"type":"ADDED"})").ok());
  EXPECT_FALSE(ParseWatchEvent(R"({"type":"WHATEVER","object":{"metadata":{"resourceVersion":"1"}}})").ok());
  EXPECT_FALSE(ParseWatchEvent(R"({"type":"ADDED","object":{"metadata":{}}})").ok());
}

TEST(KubePodsParse, WatchEvents) {
  absl::StatusOr<PodWatchEvent> e = ParseWatchEvent(
      R"({"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"12345"}}})");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->type, PodWatchEvent::Type::kBookmark);
  EXPECT_EQ(e->resource_version, "12345");
  e = ParseWatchEvent(
      R"js({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}})js");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->type, PodWatchEvent::Type::kError);
  EXPECT_EQ(e->code, 410);
  e = ParseWatchEvent(
      R"({"type":"DELETED","object":)" + FakeKubeApiServer::PodJson(FakePod{"u", "ml", "p", "n"}, 9).dump() + "}");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->type, PodWatchEvent::Type::kDeleted);
  EXPECT_EQ(e->resource_version, "9");
  EXPECT_EQ(e->pod.uid, "u");
}

TEST(KubePodsParse, NamesAndUrls) {
  for (const char* ok : {"ml", "decode-0", "a.b-c", "0"}) EXPECT_TRUE(ValidKubeName(ok)) << ok;
  for (const char* bad : {"", "../x", "a/b", "A", "-a", "a-", "a?b", "a%2f", "a b", "..", "a..b", "a.-b", "a-.b", ".a"}) {
    EXPECT_FALSE(ValidKubeName(bad)) << bad;
  }
  EXPECT_FALSE(ValidKubeName(std::string(254, 'a')));
  EXPECT_FALSE(ValidKubeName(std::string(64, 'a')));  // a label of 64
  EXPECT_TRUE(ValidKubeName(std::string(63, 'a') + "." + std::string(63, 'b')));
  absl::StatusOr<KubeApiConfig> c = ParseApiServerUrl("https://10.96.0.1:6443/");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "10.96.0.1");
  EXPECT_EQ(c->port, 6443);
  c = ParseApiServerUrl("https://[fd00::1]");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "fd00::1");
  EXPECT_EQ(c->port, 443);
  for (const char* bad : {"http://x", "https://", "https://x:0", "https://x:99999", "https://x/api", "https://[::1"}) {
    EXPECT_FALSE(ParseApiServerUrl(bad).ok()) << bad;
  }
}

// A CA and a certificate for 127.0.0.1, made with the openssl CLI.
class KubePods : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs openssl";
    char tmpl[] = "/tmp/podlink-kube-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const std::string q = " >/dev/null 2>&1";
    ASSERT_EQ(std::system(("cd " + dir_ + " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                           "-nodes -days 1 -subj /CN=test-kube-ca -keyout ca.key -out ca.crt" + q).c_str()), 0);
    std::ofstream(dir_ + "/ext.cnf") << "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n";
    ASSERT_EQ(std::system(("cd " + dir_ + " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                           "-subj /CN=kube-apiserver -keyout tls.key -out tls.csr" + q + " && openssl x509 -req -in "
                           "tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile ext.cnf -out tls.crt" + q)
                              .c_str()),
              0);
    WriteToken("token-1");
    api_ = std::make_unique<FakeKubeApiServer>(dir_ + "/tls.crt", dir_ + "/tls.key", "127.0.0.1", "token-1");
    ASSERT_GT(api_->port(), 0) << "the fake API server cannot listen";
  }
  void TearDown() override {
    directory_.reset();
    api_.reset();
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }
  void WriteToken(const std::string& t) { std::ofstream(dir_ + "/token") << t << "\n"; }
  PodDirectoryOptions Options() const {
    PodDirectoryOptions o;
    o.api.host = "127.0.0.1";
    o.api.port = api_->port();
    o.api.token_file = dir_ + "/token";
    o.api.ca_file = dir_ + "/ca.crt";
    o.request_timeout = absl::Seconds(3);
    o.retry_min = absl::Milliseconds(50);
    o.retry_max = absl::Milliseconds(200);
    return o;
  }
  PodDirectory& StartDirectory(PodDirectoryOptions o) {
    directory_ = std::make_unique<PodDirectory>(std::move(o));
    directory_->Start();
    return *directory_;
  }
  static bool WaitFor(const std::function<bool()>& f, absl::Duration limit = absl::Seconds(10)) {
    absl::Time end = absl::Now() + limit;
    while (!f()) {
      if (absl::Now() > end) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }
  bool Requested(const std::string& part) const {
    for (const std::string& r : api_->Requests()) {
      if (absl::StrContains(r, part)) return true;
    }
    return false;
  }

  std::string dir_;
  std::unique_ptr<FakeKubeApiServer> api_;
  std::unique_ptr<PodDirectory> directory_;
  const std::map<std::string, std::string> group_ = {{"podlink.io/peer-group", "job-7"}};
};

TEST_F(KubePods, ListsInPagesThenConfirmsWhatTheApiServerStates) {
  api_->SetPageSize(2);
  for (int i = 0; i < 5; ++i) api_->Put(FakePod{absl::StrCat("u-", i), "ml", absl::StrCat("p-", i), "node-a", group_});
  PodDirectory& d = StartDirectory(Options());
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); })) << d.Ready();
  EXPECT_EQ(d.GetStats().pods, 5u);
  EXPECT_EQ(d.GetStats().lists, 1u);
  EXPECT_TRUE(Requested("continue=")) << "the list was not paged";
  // Annotations of other prefixes are neither compared nor needed.
  std::map<std::string, std::string> claimed = group_;
  claimed["kubectl.kubernetes.io/last-applied-configuration"] = "{}";
  absl::StatusOr<KubePod> p = d.Confirm("u-3", "ml", "p-3", "node-a", claimed);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->annotations, group_);
  EXPECT_EQ(d.GetStats().fetches, 0u);
  EXPECT_EQ(d.GetStats().confirmed, 1u);
}

TEST_F(KubePods, EveryPartOfAForwardedIdentityMustMatch) {
  api_->Put(FakePod{"u-a", "ml", "prefill-0", "node-a", group_});
  api_->Put(FakePod{"u-t", "ml", "worker-t", "node-t", {{"podlink.io/peer-group", "job-8"}}});
  api_->Put(FakePod{"u-d", "ml", "done-0", "node-t", group_, "Succeeded"});
  PodDirectory& d = StartDirectory(Options());
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); })) << d.Ready();
  auto refused = [&](const std::string& uid, const std::string& ns, const std::string& name, const std::string& node,
                     const std::map<std::string, std::string>& ann, const std::string& why) {
    absl::StatusOr<KubePod> p = d.Confirm(uid, ns, name, node, ann);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
    EXPECT_TRUE(absl::StrContains(p.status().message(), why)) << p.status();
  };
  refused("u-x", "ml", "attacker-0", "node-t", group_, "the API server has no pod ml/attacker-0");  // invented
  refused("u-a", "ml", "prefill-0", "node-t", group_, "on node 'node-a', not on node node-t");     // another node's
  refused("u-a", "ml", "decode-0", "node-a", group_, "is pod ml/prefill-0, not ml/decode-0");     // renamed
  refused("u-x", "ml", "prefill-0", "node-a", group_, "has another UID");                       // another UID
  refused("u-t", "ml", "worker-t", "node-t", group_, "annotation podlink.io/peer-group");       // another group
  refused("u-t", "ml", "worker-t", "node-t", {}, "annotation podlink.io/peer-group");           // one left out
  std::map<std::string, std::string> more = {{"podlink.io/peer-group", "job-8"}, {"podlink.io/extra", "1"}};
  refused("u-t", "ml", "worker-t", "node-t", more, "annotation podlink.io/extra");              // one added
  refused("u-d", "ml", "done-0", "node-t", group_, "has finished");
  refused("", "ml", "prefill-0", "node-a", group_, "no UID");
  const size_t before = api_->Requests().size();
  refused("u-a", "ml", "../../api/v1/pods", "node-a", group_, "not a Kubernetes name");
  refused("u-a", "ml?x=1", "prefill-0", "node-a", group_, "not a Kubernetes name");
  EXPECT_EQ(api_->Requests().size(), before) << "a peer's text reached a request path";
  EXPECT_TRUE(d.Confirm("u-a", "ml", "prefill-0", "node-a", group_).ok());
  EXPECT_GE(d.GetStats().refused, 11u);
}

// Any user who can create a pod can give it thousands of podlink.io/
// annotations: that pod is never confirmed, and the watch and the list go on.
TEST_F(KubePods, APodWithTooManyAnnotationsStopsNeitherTheWatchNorTheList) {
  std::map<std::string, std::string> many;
  for (int i = 0; i < 300; ++i) many[absl::StrCat("podlink.io/k", i)] = "v";
  api_->Put(FakePod{"u-big0", "ml", "big-0", "node-a", many});
  PodDirectory& d = StartDirectory(Options());
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok() && Requested("watch=true"); })) << d.Ready();
  api_->Put(FakePod{"u-big1", "ml", "big-1", "node-a", many});  // through the watch
  api_->Put(FakePod{"u-1", "ml", "p-1", "node-a", group_});
  ASSERT_TRUE(WaitFor([&] { return d.GetStats().pods == 3; })) << "the watch stopped at the big pod";
  EXPECT_TRUE(d.Confirm("u-1", "ml", "p-1", "node-a", group_).ok());
  absl::StatusOr<KubePod> p = d.Confirm("u-big1", "ml", "big-1", "node-a", many);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
  EXPECT_EQ(d.GetStats().lists, 1u);
}

TEST_F(KubePods, TheWatchKeepsTheViewCurrent) {
  api_->Put(FakePod{"u-1", "ml", "p-1", "node-a", group_});
  PodDirectory& d = StartDirectory(Options());
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); })) << d.Ready();
  ASSERT_TRUE(WaitFor([&] { return Requested("watch=true"); }));
  api_->Put(FakePod{"u-2", "ml", "p-2", "node-b", group_});
  ASSERT_TRUE(WaitFor([&] { return d.GetStats().pods == 2; })) << "ADDED not applied";
  EXPECT_TRUE(d.Confirm("u-2", "ml", "p-2", "node-b", group_).ok());
  api_->Put(FakePod{"u-2", "ml", "p-2", "node-b", {}});  // the group annotation removed
  ASSERT_TRUE(WaitFor([&] { return !d.Confirm("u-2", "ml", "p-2", "node-b", group_).ok(); })) << "MODIFIED not applied";
  api_->Delete("u-1");
  ASSERT_TRUE(WaitFor([&] { return d.GetStats().pods == 1; })) << "DELETED not applied";
  EXPECT_EQ(d.Confirm("u-1", "ml", "p-1", "node-a", group_).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(d.GetStats().fetches, 0u);  // the deleted pod: refused without a lookup (the watch said so)
  EXPECT_EQ(d.GetStats().lists, 1u);
  EXPECT_TRUE(Requested("allowWatchBookmarks=true"));
  EXPECT_TRUE(Requested("resourceVersion=101"));  // from the list's version
}

TEST_F(KubePods, AnExpiredVersionListsAgain) {
  api_->Put(FakePod{"u-1", "ml", "p-1", "node-a", group_});
  PodDirectory& d = StartDirectory(Options());
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok() && Requested("watch=true"); }));
  // History is compacted while the watch is down: the new watch's version is
  // gone (an ERROR event with 410), so the directory lists again.
  api_->Compact();
  api_->PutQuietly(FakePod{"u-2", "ml", "p-2", "node-a", group_});
  api_->Compact();
  api_->EndWatches();
  ASSERT_TRUE(WaitFor([&] { return d.GetStats().lists == 2; })) << "no second list after 410 Gone";
  EXPECT_EQ(d.GetStats().pods, 2u);
  EXPECT_TRUE(d.Confirm("u-2", "ml", "p-2", "node-a", group_).ok());
  EXPECT_EQ(d.GetStats().fetches, 0u);
}

TEST_F(KubePods, BookmarksMoveTheVersionOn) {
  api_->SetBookmarkEvery(std::chrono::milliseconds(100));
  PodDirectory& d = StartDirectory(Options());
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); }));
  api_->PutQuietly(FakePod{"u-9", "ml", "p-9", "node-a", group_});  // a version without an event for us
  const std::string want = std::to_string(api_->resource_version());
  ASSERT_TRUE(WaitFor([&] { return d.GetStats().resource_version == want; }))
      << d.GetStats().resource_version << " != " << want;
}

TEST_F(KubePods, APodTheWatchHasNotDeliveredIsFetchedByNameWithinARate) {
  PodDirectoryOptions o = Options();
  o.max_fetches_per_second = 8;  // 2 for one node's daemon
  PodDirectory& d = StartDirectory(o);
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); }));
  api_->PutQuietly(FakePod{"u-late", "ml", "late-0", "node-a", group_});
  absl::StatusOr<KubePod> p = d.Confirm("u-late", "ml", "late-0", "node-a", group_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(Requested("/api/v1/namespaces/ml/pods/late-0"));
  EXPECT_EQ(d.Confirm("u-n", "ml", "nobody", "node-a", group_).status().code(), absl::StatusCode::kPermissionDenied);
  p = d.Confirm("u-m", "ml", "nobody-else", "node-a", group_);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "at most 8 pods a second (2 for one node's daemon)"))
      << p.status();
}

// One node's daemon forwarding invented pods spends only its own share of
// the lookups by name: another node's new pod is still confirmed.
TEST_F(KubePods, ANodeFloodingInventedPodsTakesOnlyItsShareOfLookups) {
  PodDirectoryOptions o = Options();
  o.max_fetches_per_second = 4;  // a node's share: a quarter
  PodDirectory& d = StartDirectory(o);
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); }));
  api_->PutQuietly(FakePod{"u-new", "ml", "new-0", "node-a", group_});
  int unavailable = 0;
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<KubePod> p = d.Confirm(absl::StrCat("u-x", i), "ml", absl::StrCat("invented-", i), "node-evil", group_);
    ASSERT_FALSE(p.ok());
    unavailable += p.status().code() == absl::StatusCode::kUnavailable;
  }
  EXPECT_EQ(unavailable, 5) << "node-evil was looked up more than its share";
  absl::StatusOr<KubePod> p = d.Confirm("u-new", "ml", "new-0", "node-a", group_);
  EXPECT_TRUE(p.ok()) << p.status();
}

TEST_F(KubePods, APodIsGoneOnlyWhenTheViewCanTell) {
  api_->Put(FakePod{"u-1", "ml", "p-1", "node-a", group_});
  api_->Put(FakePod{"u-2", "ml", "p-2", "node-a", group_});
  PodDirectory& d = StartDirectory(Options());
  EXPECT_FALSE(d.Gone("u-9")) << "nothing is known before the first list";
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok() && Requested("watch=true"); }));
  EXPECT_FALSE(d.Gone("u-1"));
  EXPECT_TRUE(d.Gone("u-9")) << "never listed";
  api_->Delete("u-1");
  ASSERT_TRUE(WaitFor([&] { return d.Gone("u-1"); })) << "a deleted pod";
  api_->Put(FakePod{"u-2", "ml", "p-2", "node-a", group_, "Succeeded"});
  ASSERT_TRUE(WaitFor([&] { return d.Gone("u-2"); })) << "a finished pod";
  // Confirmed by name before the watch delivers it: not gone meanwhile.
  api_->PutQuietly(FakePod{"u-3", "ml", "p-3", "node-a", group_});
  ASSERT_TRUE(d.Confirm("u-3", "ml", "p-3", "node-a", group_).ok());
  EXPECT_FALSE(d.Gone("u-3"));
}

TEST_F(KubePods, AStaleViewLooksPodsUpAgainAndCallsNoneGone) {
  api_->Put(FakePod{"u-1", "ml", "p-1", "node-a", group_});
  PodDirectoryOptions o = Options();
  o.stale_after = absl::Milliseconds(400);
  PodDirectory& d = StartDirectory(o);
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok() && Requested("watch=true"); }));
  EXPECT_TRUE(d.Gone("u-9"));
  absl::SleepFor(absl::Milliseconds(600));  // no event, no bookmark: the view may be frozen
  EXPECT_FALSE(d.Gone("u-9")) << "a stale view calls nothing gone";
  EXPECT_FALSE(d.Ready().ok());
  const uint64_t before = d.GetStats().fetches;
  EXPECT_TRUE(d.Confirm("u-1", "ml", "p-1", "node-a", group_).ok());
  EXPECT_EQ(d.GetStats().fetches, before + 1) << "a stale view's pod is looked up again";
  api_->Put(FakePod{"u-2", "ml", "p-2", "node-a", group_});  // the watch moves on
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); })) << d.Ready();
}

TEST_F(KubePods, APodConfirmedByNameIsGoneOnlyOnceTheViewMovedOnPastIt) {
  api_->SetBookmarkEvery(std::chrono::milliseconds(50));
  PodDirectoryOptions o = Options();
  o.fetched_grace = absl::Milliseconds(300);
  PodDirectory& d = StartDirectory(o);
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); }));
  api_->PutQuietly(FakePod{"u-3", "ml", "p-3", "node-a", group_});  // never delivered by this watch
  ASSERT_TRUE(d.Confirm("u-3", "ml", "p-3", "node-a", group_).ok());
  EXPECT_FALSE(d.Gone("u-3"));
  EXPECT_TRUE(WaitFor([&] { return d.Gone("u-3"); }, absl::Seconds(5)))
      << "the view moved on past the lookup and never showed the pod";
}

// Issue 54: a pod confirmed by name and then deleted kept its grant until
// the view moved on past the lookup's grace (101.6 s measured). The watch's
// DELETED makes it gone at once, and it is never confirmed again.
TEST_F(KubePods, APodConfirmedByNameAndThenDeletedIsGoneAtOnce) {
  PodDirectory& d = StartDirectory(Options());  // the default grace: a minute
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok() && Requested("watch=true"); }));
  api_->PutQuietly(FakePod{"u-3", "ml", "p-3", "node-a", group_});
  ASSERT_TRUE(d.Confirm("u-3", "ml", "p-3", "node-a", group_).ok());
  EXPECT_FALSE(d.Gone("u-3"));
  const absl::Time deleted = absl::Now();
  api_->Delete("u-3");
  ASSERT_TRUE(WaitFor([&] { return d.Gone("u-3"); }, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - deleted, absl::Seconds(5));
  absl::StatusOr<KubePod> again = d.Confirm("u-3", "ml", "p-3", "node-a", group_);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied) << again.status();
  // Still gone once the watch was ended and made again.
  const uint64_t watches = d.GetStats().watches;
  api_->EndWatches();
  ASSERT_TRUE(WaitFor([&] { return d.GetStats().watches > watches; }));
  EXPECT_TRUE(d.Gone("u-3"));
}

// Issue 54: during an outage a pod confirmed before it stayed confirmed for
// up to 10 minutes (deletions missed). Now the view is stale failing_grace
// after the first failed request: nothing is confirmed from memory, and
// Ready() says why.
TEST_F(KubePods, DuringAnOutageNothingIsConfirmedFromMemoryPastTheGrace) {
  api_->Put(FakePod{"u-1", "ml", "p-1", "node-a", group_});
  api_->SetBookmarkEvery(std::chrono::milliseconds(100));  // after the outage, the view moves on with these
  PodDirectoryOptions o = Options();
  o.failing_grace = absl::Milliseconds(500);
  PodDirectory& d = StartDirectory(o);
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok() && Requested("watch=true"); }));
  ASSERT_TRUE(d.Confirm("u-1", "ml", "p-1", "node-a", group_).ok());
  const uint64_t errors = d.GetStats().errors;
  api_->SetFailing(true);  // every request answers 500
  api_->EndWatches();
  ASSERT_TRUE(WaitFor([&] { return d.GetStats().errors > errors; }));
  const absl::Time failed = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return !d.Ready().ok(); }, absl::Seconds(3)));
  EXPECT_LT(absl::Now() - failed, absl::Seconds(2));
  EXPECT_TRUE(absl::StrContains(d.Ready().message(), "the API server has failed for")) << d.Ready();
  absl::StatusOr<KubePod> p = d.Confirm("u-1", "ml", "p-1", "node-a", group_);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << "confirmed from a failing view: " << p.status();
  EXPECT_FALSE(d.Gone("u-9")) << "a failing view calls nothing gone";
  api_->SetFailing(false);
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); })) << d.Ready();
  EXPECT_TRUE(d.Confirm("u-1", "ml", "p-1", "node-a", group_).ok());
}

TEST_F(KubePods, AViewThatDroppedPodsCallsNoneGone) {
  for (int i = 0; i < 3; ++i) api_->Put(FakePod{absl::StrCat("u-", i), "ml", absl::StrCat("p-", i), "node-a", group_});
  PodDirectoryOptions o = Options();
  o.max_pods = 2;
  PodDirectory& d = StartDirectory(o);
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); }));
  EXPECT_EQ(d.GetStats().pods, 2u);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(d.Gone(absl::StrCat("u-", i))) << i;
  EXPECT_FALSE(d.Gone("u-9"));
}

TEST_F(KubePods, AWrongTokenIsRefusedUntilTheFileChanges) {
  WriteToken("stale");
  api_->Put(FakePod{"u-1", "ml", "p-1", "node-a", group_});
  PodDirectory& d = StartDirectory(Options());
  ASSERT_TRUE(WaitFor([&] { return d.GetStats().errors >= 2; }));
  EXPECT_FALSE(d.Ready().ok());
  EXPECT_TRUE(absl::StrContains(d.Ready().message(), "HTTP 401")) << d.Ready();
  absl::StatusOr<KubePod> p = d.Confirm("u-1", "ml", "p-1", "node-a", group_);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  WriteToken("token-1");  // kubelet rotated it
  ASSERT_TRUE(WaitFor([&] { return d.Ready().ok(); })) << d.Ready();
  EXPECT_TRUE(d.Confirm("u-1", "ml", "p-1", "node-a", group_).ok());
}

TEST_F(KubePods, AnUnreachableOrUntrustedServerConfirmsNothing) {
  PodDirectoryOptions o = Options();
  o.api.ca_file = dir_ + "/tls.crt";  // not the CA that signed the server's certificate
  PodDirectory& d = StartDirectory(o);
  ASSERT_TRUE(WaitFor([&] { return d.GetStats().errors >= 1; }));
  EXPECT_FALSE(d.Ready().ok());
  EXPECT_EQ(d.Confirm("u-1", "ml", "p-1", "node-a", group_).status().code(), absl::StatusCode::kUnavailable);
  directory_.reset();
  o = Options();
  o.api.port = 1;  // nothing listens
  PodDirectory& gone = StartDirectory(o);
  absl::StatusOr<KubePod> p = gone.Confirm("u-1", "ml", "p-1", "node-a", group_);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
  EXPECT_TRUE(absl::StrContains(p.status().message(), "not loaded yet")) << p.status();
}

}  // namespace
}  // namespace podlink
