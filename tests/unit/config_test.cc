#include "daemon/daemon_config.h"

#include "daemon/identity/standalone_source.h"
#include "gtest/gtest.h"

namespace podlink {
namespace {

TEST(DaemonConfig, Defaults) {
  auto c = ParseDaemonConfig("{}");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->broker.max_sessions, BrokerOptions().max_sessions);
  EXPECT_TRUE(c->pods.empty());
}

TEST(DaemonConfig, LimitsAndPods) {
  auto c = ParseDaemonConfig(R"({"limits": {"max_sessions": 7, "max_exports_per_session": 9},
    "pods": [{"match": {"cgroup_prefix": "/a", "uid": 1000}, "namespace": "ml", "name": "p",
              "annotations": {"podlink.io/peer-group": "g"}}]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->broker.max_sessions, 7u);
  EXPECT_EQ(c->broker.registry.max_exports_per_session, 9u);
  ASSERT_EQ(c->pods.size(), 1u);
  EXPECT_EQ(*c->pods[0].cgroup_prefix, "/a");
  EXPECT_EQ(*c->pods[0].uid, 1000u);
}

TEST(DaemonConfig, NcclNative) {
  auto d = ParseDaemonConfig("{}");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->broker.nccl_native.enabled);
  EXPECT_EQ(d->broker.nccl_native.shm_size_bytes, uint64_t{1} << 30);
  auto c = ParseDaemonConfig(R"({"nccl_native": {"enabled": false, "shm_dir": "/run/x", "shm_size_mib": 64,
    "max_names_per_pod": 8, "max_answers_per_pod": 4, "datagrams_per_second": 100, "rescan_interval_ms": 50}})");
  ASSERT_TRUE(c.ok()) << c.status();
  const NcclNativeOptions& n = c->broker.nccl_native;
  EXPECT_FALSE(n.enabled);
  EXPECT_EQ(n.shm_dir, "/run/x");
  EXPECT_EQ(n.shm_size_bytes, uint64_t{64} << 20);
  EXPECT_EQ(n.bridge.max_names_per_pod, 8u);
  EXPECT_EQ(n.bridge.max_answers_per_pod, 4u);
  EXPECT_EQ(n.bridge.datagrams_per_second, 100u);
  EXPECT_EQ(n.bridge.rescan_interval, absl::Milliseconds(50));
  for (const char* bad : {R"({"nccl_native": {"enabled": 1}})", R"({"nccl_native": {"shm_dir": "relative"}})",
                          R"({"nccl_native": {"shm_size_mib": 8}})", R"({"nccl_native": {"max_names_per_pod": 0}})",
                          R"({"nccl_native": {"datagrams_per_second": -1}})", R"({"nccl_native": {"rescan_interval_ms": 1}})",
                          R"({"nccl_native": {"bridge": {}}})", R"({"nccl_native": []})"}) {
    EXPECT_FALSE(ParseDaemonConfig(bad).ok()) << bad;
  }
}

TEST(DaemonConfig, MeshTransport) {
  auto c = ParseDaemonConfig(R"({"mesh": {"transport": "verbs", "verbs_gid_index": 3, "verbs_timeout": 16,
                                           "verbs_retry_count": 5}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->broker.mesh.transport, "verbs");
  EXPECT_EQ(c->broker.mesh.verbs.gid_index, 3);
  EXPECT_EQ(c->broker.mesh.verbs.timeout, 16);
  EXPECT_EQ(c->broker.mesh.verbs.retry_count, 5);
  EXPECT_EQ(ParseDaemonConfig("{}")->broker.mesh.transport, "tcp");
}

TEST(DaemonConfig, MeshPeersAndRelayStaging) {
  auto c = ParseDaemonConfig(R"({"mesh": {"peers": [{"node": "node-c", "addresses": ["10.0.3.2/30", "10.0.4.1/30"],
      "port": 7500}, {"node": "node-d", "addresses": ["fd00::4/64"]}], "relay_staging_mib": 32}})");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->broker.mesh.peers.size(), 2u);
  EXPECT_EQ(c->broker.mesh.peers[0].node, "node-c");
  EXPECT_EQ(c->broker.mesh.peers[0].addresses, (std::vector<std::string>{"10.0.3.2/30", "10.0.4.1/30"}));
  EXPECT_EQ(c->broker.mesh.peers[0].port, 7500u);
  EXPECT_EQ(c->broker.mesh.peers[1].port, 7446u);
  EXPECT_EQ(c->broker.mesh.relay_staging_bytes, 32ull << 20);
  EXPECT_EQ(ParseDaemonConfig("{}")->broker.mesh.relay_staging_bytes, 64ull << 20);
}

TEST(DaemonConfig, MeshSealedWindows) {
  EXPECT_EQ(ParseDaemonConfig("{}")->broker.mesh.sealed_window_bytes, 512ull << 20);
  auto c = ParseDaemonConfig(R"({"mesh": {"sealed_window_mib": 128}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->broker.mesh.sealed_window_bytes, 128ull << 20);
  for (const char* bad : {R"({"mesh": {"sealed_window_mib": 8}})", R"({"mesh": {"sealed_window_mib": "lots"}})"}) {
    EXPECT_EQ(ParseDaemonConfig(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(DaemonConfig, MeshGrantIdleAndKeepalive) {
  auto c = ParseDaemonConfig(
      R"({"mesh": {"grant_idle_seconds": 900, "keepalive_seconds": 30, "cert_refresh_seconds": 5, "advert_seconds": 7,
                   "open_timeout_seconds": 25, "answer_timeout_seconds": 4}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->broker.mesh.cert_refresh, absl::Seconds(5));
  EXPECT_EQ(c->broker.mesh.grant_idle_timeout, absl::Seconds(900));
  EXPECT_EQ(c->broker.mesh.keepalive, absl::Seconds(30));
  EXPECT_EQ(c->broker.mesh.advert_interval, absl::Seconds(7));
  EXPECT_EQ(c->broker.mesh.open_per_hop, absl::Seconds(25));
  EXPECT_EQ(c->broker.mesh.answer_timeout, absl::Seconds(4));
  auto d = ParseDaemonConfig("{}");
  EXPECT_EQ(d->broker.mesh.open_per_hop, absl::Seconds(10));
  EXPECT_EQ(d->broker.mesh.answer_timeout, absl::Seconds(30));
  EXPECT_EQ(d->broker.mesh.advert_interval, absl::Seconds(60));
  EXPECT_EQ(d->broker.mesh.grant_idle_timeout, absl::Minutes(10));
  EXPECT_EQ(d->broker.mesh.keepalive, absl::Seconds(60));
}

TEST(DaemonConfig, MeshTcpZeroCopy) {
  EXPECT_TRUE(ParseDaemonConfig("{}")->broker.mesh.tcp_zero_copy);
  auto c = ParseDaemonConfig(R"({"mesh": {"tcp_zero_copy": false}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->broker.mesh.tcp_zero_copy);
}

TEST(DaemonConfig, MeshTwoHopStripeIsOffUnlessAskedFor) {
  EXPECT_FALSE(ParseDaemonConfig("{}")->broker.mesh.two_hop_stripe);
  auto c = ParseDaemonConfig(R"({"mesh": {"two_hop_stripe": true}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->broker.mesh.two_hop_stripe);
}

TEST(DaemonConfig, MeshSysfsRoot) {
  auto c = ParseDaemonConfig(R"({"mesh": {"sysfs": "/host/sys"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->broker.mesh.sysfs, "/host/sys");
  EXPECT_EQ(c->broker.mesh.verbs.sysfs, "/host/sys/class/infiniband");
  EXPECT_EQ(ParseDaemonConfig("{}")->broker.mesh.sysfs, "/sys");
}

TEST(DaemonConfig, RejectsBadInputWithReason) {
  struct Case {
    const char* json;
    const char* mentions;
  };
  for (const Case& c : std::initializer_list<Case>{
           {"not json", "JSON"},
           {"[]", "object"},
           {R"({"limitz": {}})", "limitz"},
           {R"({"limits": {"max_sessions": 0}})", "positive"},
           {R"({"limits": {"max_sessions": -3}})", "positive"},
           {R"({"limits": {"bogus": 3}})", "bogus"},
           {R"({"pods": {}})", "array"},
           {R"({"pods": [{"namespace": "a", "name": "b"}]})", "match"},
           {R"({"pods": [{"match": {"uid": "x"}, "namespace": "a", "name": "b"}]})", "uid"},
           {R"({"pods": [{"match": {"uid": 1}, "name": "b"}]})", "namespace"},
           {R"({"pods": [{"match": {"uid": 1}, "namespace": "a", "name": "b", "annotations": {"k": 1}}]})",
            "annotations"},
           {R"({"pods": [{"match": {"uid": 1}, "namespace": "a", "name": "b", "annotationz": {}}]})",
            "annotationz"},
           {R"({"identity": {"kubelet_cgroup_rootz": ["/"]}})", "kubelet_cgroup_rootz"},
           {R"({"mesh": {"transport": "udp"}})", "transport"},
           {R"({"mesh": {"peers": {"node": "c"}}})", "peers"},
           {R"({"mesh": {"peers": [{"node": "c"}]}})", "peers"},
           {R"({"mesh": {"peers": [{"node": "c", "addresses": ["10.0.0.300/30"]}]}})", "peers[] of c"},
           {R"({"mesh": {"peers": [{"node": "c", "addresses": ["10.0.0.1/30"], "port": 0}]}})", "peers[].port"},
           {R"({"mesh": {"peers": [{"node": "c", "addresses": ["10.0.0.1/30"], "via": "b"}]}})", "peers[].via"},
           {R"({"mesh": {"relay_staging_mib": 1}})", "relay_staging_mib"},
           {R"({"mesh": {"sysfs": "host/sys"}})", "sysfs"},
           {R"({"mesh": {"grant_idle_seconds": 0}})", "grant_idle_seconds"},
           {R"({"mesh": {"keepalive_seconds": 7200}})", "keepalive_seconds"},
           {R"({"mesh": {"advert_seconds": 0}})", "advert_seconds"},
           {R"({"mesh": {"open_timeout_seconds": 0}})", "open_timeout_seconds"},
           {R"({"mesh": {"answer_timeout_seconds": 0}})", "answer_timeout_seconds"},
           {R"({"mesh": {"cert_refresh_seconds": 0}})", "cert_refresh_seconds"},
           {R"({"mesh": {"sysfs": ""}})", "sysfs"},
           {R"({"mesh": {"tcp_zero_copy": 1}})", "tcp_zero_copy"},
           {R"({"mesh": {"two_hop_stripe": "yes"}})", "two_hop_stripe"},
           {R"({"mesh": {"verbs_timeout": 40}})", "verbs_timeout"},
           {R"({"mesh": {"verbs_retry_count": 8}})", "verbs_retry_count"},
           {R"({"mesh": {"verbs_gid_index": -2}})", "verbs_gid_index"},
       }) {
    auto r = ParseDaemonConfig(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(r.status().message().find(c.mentions), absl::string_view::npos) << r.status();
  }
}

PeerIdentity Peer(uint32_t uid, std::string cgroup_path) {
  PeerIdentity p;
  p.uid = uid;
  p.cgroup = *ParseCgroupPath(cgroup_path);
  return p;
}

TEST(StandaloneSource, MatchesRulesInOrder) {
  auto rules = StandalonePodSource::ParseRules(R"({"pods": [
    {"match": {"cgroup_prefix": "/pods/a"}, "namespace": "ml", "name": "a",
     "annotations": {"podlink.io/peer-group": "g"}},
    {"match": {"uid": 1000}, "namespace": "ml", "name": "user"}]})");
  ASSERT_TRUE(rules.ok());
  StandalonePodSource src(*rules);
  auto a = src.Resolve(Peer(0, "/pods/a/x"));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->Ref(), "ml/a");
  EXPECT_EQ(a->PeerGroup(), "g");
  // Prefix matches whole path segments only.
  auto ab = src.Resolve(Peer(0, "/pods/ab"));
  EXPECT_EQ(ab->namespace_, "standalone");
  auto u = src.Resolve(Peer(1000, "/elsewhere"));
  EXPECT_EQ(u->Ref(), "ml/user");
}

TEST(StandaloneSource, UnmatchedClientsAreDistinctAndUnannotated) {
  StandalonePodSource src({});
  auto a = src.Resolve(Peer(0, "/x"));
  auto b = src.Resolve(Peer(0, "/y"));
  auto c = src.Resolve(Peer(1, "/x"));
  EXPECT_NE(a->key, b->key);
  EXPECT_NE(a->key, c->key);
  EXPECT_NE(a->name, b->name);
  EXPECT_TRUE(a->annotations.empty());
  EXPECT_EQ(a->namespace_, "standalone");
}

}  // namespace
}  // namespace podlink
