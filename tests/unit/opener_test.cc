// The importing side's reach without an engine: the control room's connector (daemon/mesh/control/connector.h)
// and the importer's opener (daemon/mesh/importer/opener.h) against a stand-in for the owner's podlinkd (the Mesh
// service on loopback, tests/fakes/fake_mesh_daemon.h) and fake transports behind LinkMaker.
// - Connector: a Hello from another node than the one dialed is refused; a node no direct link reaches is said
//   without a dial; what the Hello says reaches the routing room and the transport gets the paths (once: live
//   links are reused); no RDMA path falls back to TCP links, counted, and RDMA is not tried again at once; without
//   the fallback the RDMA failure is the answer; one peer serves both where the links carry relayed grants; a grant
//   is carried by its keys, its staging, or the node's TCP peer; stopping makes no peer.
// - Opener: targets it cannot open are refused before any dial; no cable or relay is said; a direct open carries
//   the pod's identity and becomes a handle of its session only, and dropping it gives the grant back; the
//   owner's refusal is the answer and leaves no handle; over RDMA the open asks for keys and the links carry them;
//   dropping a session gives back every handle.
#include "daemon/mesh/importer/opener.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/fakes/fake_mesh_daemon.h"

namespace podlink::mesh {
namespace {

using podlink::testing::FakeMeshDaemon;

// One live link whose grants the test can see.
class FakeLinks final : public DataLinks {
 public:
  explicit FakeLinks(bool registers) : registers_(registers) {}
  const char* transport() const override { return "fake"; }
  uint64_t instance() const override { return 9; }
  absl::Status Submit(LinkOp) override { return absl::UnavailableError("no data path in this test"); }
  size_t live() const override { return 1; }
  LinkStats Stats() const override { return {}; }
  std::vector<std::tuple<std::string, bool, uint64_t>> Connections() const override { return {}; }
  bool RegistersRegions() const override { return registers_; }
  void AddRegion(uint64_t grant, std::vector<RegionKey> keys) override {
    absl::MutexLock l(&mu_);
    keys_[grant] = std::move(keys);
  }
  void AddStagedRegion(uint64_t grant, uint64_t slot_bytes) override {
    absl::MutexLock l(&mu_);
    staged_[grant] = slot_bytes;
  }
  std::map<uint64_t, std::vector<RegionKey>> keys() const {
    absl::MutexLock l(&mu_);
    return keys_;
  }
  std::map<uint64_t, uint64_t> staged() const {
    absl::MutexLock l(&mu_);
    return staged_;
  }

 private:
  const bool registers_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, std::vector<RegionKey>> keys_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> staged_ ABSL_GUARDED_BY(mu_);
};

// A transport: "tcp" carries relayed grants and registers nothing; "verbs" registers regions and, with
// `no_rdma_path`, fails as a node without a GID for the path would.
class FakeMaker final : public LinkMaker {
 public:
  explicit FakeMaker(bool rdma) : rdma_(rdma) {}
  absl::Status Connect(const std::shared_ptr<Peer>& peer, const RemoteTarget&, const std::vector<Path>& paths,
                       std::shared_ptr<pb::Mesh::Stub> stub, const pb::HelloResponse& hello,
                       bool* verbs_failed) override {
    ++calls;
    {
      absl::MutexLock l(&mu_);
      last_paths_ = paths;
    }
    if (no_rdma_path) {
      if (verbs_failed != nullptr) *verbs_failed = true;
      return absl::UnavailableError("no RDMA device holds 127.0.0.2");
    }
    peer->set_stub(std::move(stub));
    peer->instance.store(hello.instance());
    peer->set_links(std::make_shared<FakeLinks>(rdma_));
    return absl::OkStatus();
  }
  bool carries_relayed_grants() const override { return !rdma_; }
  bool stripes_two_hop() const override { return !rdma_; }
  std::vector<Path> last_paths() const {
    absl::MutexLock l(&mu_);
    return last_paths_;
  }

  std::atomic<int> calls{0};
  std::atomic<bool> no_rdma_path{false};

 private:
  const bool rdma_;
  mutable absl::Mutex mu_;
  std::vector<Path> last_paths_ ABSL_GUARDED_BY(mu_);
};

constexpr char kSelf[] = "node-a";
constexpr char kOwner[] = "node-b";

// node-a's importing side: its connector and opener over fakes, talking to node-b's stand-in on 127.0.0.1 from
// 127.0.0.2 (one /8: one direct path).
class Importer : public ::testing::Test {
 protected:
  ~Importer() override {
    // As MeshEngine::Stop: workers first, then the links, then the handles.
    stopping_.store(true);
    std::map<std::string, std::shared_ptr<Peer>> peers = peers_.Close();
    for (auto& [key, p] : peers) p->Stop();
    for (auto& [key, p] : peers) p->set_links(nullptr);
    handles_.Close();
  }

  // `links`: the configured transport's maker.
  void Make(LinkMaker* links, bool verbs_tcp_fallback = true) {
    Connector::Rooms rooms;
    rooms.local = [] { return ParsePrefixes({"127.0.0.2/8"}); };
    rooms.new_stub = [](const std::string&, const std::string& endpoint) {
      return std::shared_ptr<pb::Mesh::Stub>(
          pb::Mesh::NewStub(grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials())));
    };
    rooms.hello = [] {
      pb::HelloRequest req;
      req.set_version("test");
      return req;
    };
    rooms.heard = [this](const std::string& node, const pb::HelloResponse& hello) {
      absl::MutexLock l(&mu_);
      heard_[node] = hello;
    };
    rooms.in_use = [] { return std::vector<std::shared_ptr<Peer>>{}; };
    connector_ = std::make_unique<Connector>(
        Connector::Options{
            .fallback = false, .verbs_tcp_fallback = verbs_tcp_fallback, .connect_timeout = absl::Seconds(5)},
        std::move(rooms), &peers_, &stopping_, links, &tcp_);
    opener_ = std::make_unique<Opener>(
        Opener::Options{.node_name = kSelf,
                        .instance = 0xa11ce,
                        .fallback = false,
                        .two_hop_stripe = false,
                        .open_per_hop = absl::Seconds(5)},
        Opener::Routing{.local = [] { return ParsePrefixes({"127.0.0.2/8"}); }, .trust = [] { return CableTrust{}; }},
        connector_.get(), &handles_, &transfers_, &signer_, &known_, &stopping_);
  }

  RemoteTarget Target() const {
    RemoteTarget t;
    t.node_name = kOwner;
    t.addresses = {"127.0.0.1/8"};
    t.port = owner_.port();
    return t;
  }

  std::map<std::string, pb::HelloResponse> heard() const {
    absl::MutexLock l(&mu_);
    return heard_;
  }

  // OpenRemote, waited for (bounded).
  absl::StatusOr<RemoteRegionInfo> Open(uint64_t session, const PodInfo& pod, const RemoteTarget& target) {
    absl::Notification done;
    absl::StatusOr<RemoteRegionInfo> got = absl::InternalError("no answer within 20 s");
    opener_->OpenRemote(session, pod, target, [&](absl::StatusOr<RemoteRegionInfo> r) {
      got = std::move(r);
      done.Notify();
    });
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(20))) return absl::DeadlineExceededError("no answer");
    return got;
  }

  // `start` given the two callbacks the connector answers by, waited for (bounded): the peer, or why not.
  using Then = std::function<void(const std::shared_ptr<Peer>&)>;
  using Failed = std::function<void(absl::Status)>;
  static absl::StatusOr<std::shared_ptr<Peer>> AwaitPeer(const std::function<void(Then, Failed)>& start) {
    absl::Notification done;
    absl::StatusOr<std::shared_ptr<Peer>> got = absl::InternalError("no answer");
    start(
        [&](const std::shared_ptr<Peer>& p) {
          got = p;
          done.Notify();
        },
        [&](absl::Status st) {
          got = std::move(st);
          done.Notify();
        });
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(20))) return absl::DeadlineExceededError("no answer");
    return got;
  }
  absl::StatusOr<std::shared_ptr<Peer>> ConnectOrOverTcp(const std::shared_ptr<Peer>& peer) {
    return AwaitPeer([&](Then then, Failed failed) {
      connector_->ConnectOrOverTcp(peer, Target(), std::move(then), std::move(failed));
    });
  }

  static PodInfo Reader() {
    PodInfo pod;
    pod.key = "uid-1";
    pod.uid = "uid-1";
    pod.namespace_ = "team";
    pod.name = "reader";
    pod.annotations = {{"podlink.io/peer-group", "kv"}};
    pod.source = "standalone";
    return pod;
  }

  static pb::OpenRegionResponse Granted(uint64_t grant) {
    pb::OpenRegionResponse r;
    r.set_grant(grant);
    r.set_export_id(5);
    r.set_size(4096);
    r.set_instance(0x5eed);
    r.set_owner_namespace("team");
    r.set_owner_name("writer");
    return r;
  }

  FakeMeshDaemon owner_{kOwner};
  PeerTable peers_;
  std::atomic<bool> stopping_{false};
  FakeMaker tcp_{/*rdma=*/false};
  FakeMaker rdma_{/*rdma=*/true};
  HandleTable handles_{16};
  RemoteTransfers transfers_{RemoteTransfers::Options{}, nullptr, &handles_};
  NodeCredentials credentials_{"/nonexistent", absl::Seconds(60)};  // routes are not signed here
  RouteSigner signer_{kSelf, &credentials_};
  KnownNodes known_{kSelf};
  std::unique_ptr<Connector> connector_;
  std::unique_ptr<Opener> opener_;
  mutable absl::Mutex mu_;
  std::map<std::string, pb::HelloResponse> heard_ ABSL_GUARDED_BY(mu_);
};

TEST_F(Importer, ConnectorRefusesAHelloFromAnotherNodeThanTheOneDialed) {
  Make(&tcp_);
  pb::HelloResponse impostor;
  impostor.set_node_name("node-x");
  owner_.AnswerHello(impostor);
  std::shared_ptr<Peer> peer = connector_->PeerFor(Target());
  ASSERT_NE(peer, nullptr);
  absl::Status st = connector_->Connect(peer, Target());
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "is node 'node-x', not 'node-b'")) << st;
  EXPECT_EQ(owner_.hellos(), 1);
  EXPECT_EQ(tcp_.calls.load(), 0);  // no links to an impostor
  EXPECT_EQ(peer->links(), nullptr);
  EXPECT_EQ(peer->stub(), nullptr);
  EXPECT_TRUE(heard().empty());  // nothing it said is learnt
}

TEST_F(Importer, ConnectorSaysWhyNoDirectLinkReachesANodeWithoutDialing) {
  Make(&tcp_);
  RemoteTarget far = Target();
  far.addresses = {"10.9.0.1/24"};
  std::shared_ptr<Peer> peer = connector_->PeerFor(far);
  ASSERT_NE(peer, nullptr);
  absl::Status st = connector_->Connect(peer, far);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "no direct link reaches node node-b")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "10.9.0.1/24")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "mesh.fallback")) << st;
  EXPECT_EQ(owner_.hellos(), 0);
}

TEST_F(Importer, ConnectorTeachesTheRoutingRoomAndHandsThePathsToTheTransportOnce) {
  Make(&tcp_);
  pb::HelloResponse hello = owner_.hello();
  hello.add_addresses("127.0.0.1/8");
  hello.add_addresses("10.1.0.2/24");
  hello.set_control_port(7446);
  pb::LinkInfo* hostile = hello.add_links();
  hostile->set_netdev(std::string(300, '\x01'));
  owner_.AnswerHello(hello);
  std::shared_ptr<Peer> peer = connector_->PeerFor(Target());
  ASSERT_NE(peer, nullptr);
  ASSERT_TRUE(connector_->Connect(peer, Target()).ok());
  std::map<std::string, pb::HelloResponse> h = heard();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h.begin()->first, kOwner);
  EXPECT_EQ(h.begin()->second.addresses_size(), 2);
  EXPECT_EQ(tcp_.calls.load(), 1);
  std::vector<Path> paths = tcp_.last_paths();
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0].remote.AddressText(), "127.0.0.1");
  EXPECT_EQ(paths[0].local.AddressText(), "127.0.0.2");
  // What the node says of its NICs is kept bounded and printable.
  std::vector<pb::LinkInfo> nics = peer->advertised();
  ASSERT_EQ(nics.size(), 1u);
  EXPECT_EQ(nics[0].netdev(), std::string(256, '?'));
  EXPECT_EQ(peer->instance.load(), 0x5eedu);
  // Live links are used as they are: no second Hello, no second connect.
  ASSERT_TRUE(connector_->Connect(peer, Target()).ok());
  EXPECT_EQ(owner_.hellos(), 1);
  EXPECT_EQ(tcp_.calls.load(), 1);
}

TEST_F(Importer, ConnectorFallsBackToTcpLinksWhereNoRdmaPathComesUpAndCountsIt) {
  Make(&rdma_);
  rdma_.no_rdma_path = true;
  std::shared_ptr<Peer> peer = connector_->PeerFor(Target());
  ASSERT_NE(peer, nullptr);
  ASSERT_FALSE(peer->tcp());
  absl::StatusOr<std::shared_ptr<Peer>> got = ConnectOrOverTcp(peer);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)->tcp());  // the node's TCP peer, not the verbs one
  EXPECT_NE(*got, peer);
  EXPECT_NE((*got)->links(), nullptr);
  EXPECT_EQ(rdma_.calls.load(), 1);
  EXPECT_EQ(tcp_.calls.load(), 1);
  EXPECT_EQ(connector_->verbs_fallbacks(), 1u);
  // Within the next 30 s RDMA is not tried again: straight to the TCP peer, whose links are up.
  got = ConnectOrOverTcp(peer);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE((*got)->tcp());
  EXPECT_EQ(rdma_.calls.load(), 1);
  EXPECT_EQ(tcp_.calls.load(), 1);
  EXPECT_EQ(connector_->verbs_fallbacks(), 2u);
}

TEST_F(Importer, ConnectorWithoutTheFallbackAnswersWithTheRdmaFailure) {
  Make(&rdma_, /*verbs_tcp_fallback=*/false);
  rdma_.no_rdma_path = true;
  absl::StatusOr<std::shared_ptr<Peer>> got = ConnectOrOverTcp(connector_->PeerFor(Target()));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "no RDMA device holds")) << got.status();
  EXPECT_EQ(tcp_.calls.load(), 0);
  EXPECT_EQ(connector_->verbs_fallbacks(), 0u);
}

TEST_F(Importer, ConnectorKeepsATcpPeerApartOnlyWhereTheLinksCannotCarryRelayedGrants) {
  Make(&tcp_);
  EXPECT_EQ(connector_->PeerFor(Target(), /*tcp=*/true), connector_->PeerFor(Target()));
  Make(&rdma_);
  EXPECT_NE(connector_->PeerFor(Target(), /*tcp=*/true), connector_->PeerFor(Target()));
  stopping_.store(true);
  EXPECT_EQ(connector_->PeerFor(Target()), nullptr);
  EXPECT_EQ(connector_->NoPeer().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(connector_->NoPeer().message(), "stopping"));
}

TEST_F(Importer, ConnectorCarriesAGrantByItsKeysItsStagingOrTheNodesTcpPeer) {
  Make(&rdma_);
  std::shared_ptr<Peer> peer = connector_->PeerFor(Target());
  ASSERT_TRUE(connector_->Connect(peer, Target()).ok());
  auto links = std::dynamic_pointer_cast<FakeLinks>(peer->links());
  ASSERT_NE(links, nullptr);
  auto carry = [&](const pb::OpenRegionResponse& resp) {
    return AwaitPeer([&](Then then, Failed failed) {
      connector_->CarryGrant(peer, Target(), resp, std::move(then), std::move(failed));
    });
  };
  pb::OpenRegionResponse keyed = Granted(1);
  pb::VerbsKey* k = keyed.add_verbs_keys();
  k->set_device("mlx5_0");
  k->set_rkey(0x1234);
  k->set_base(0x7f0000);
  absl::StatusOr<std::shared_ptr<Peer>> c = carry(keyed);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, peer);
  ASSERT_EQ(links->keys().count(1), 1u);
  EXPECT_EQ(links->keys()[1][0].rkey, 0x1234u);

  pb::OpenRegionResponse staged = Granted(2);
  staged.set_staged_reason("mesh.verbs_staged_only");
  staged.set_staged_slice_bytes(65536);
  c = carry(staged);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, peer);
  EXPECT_EQ(links->staged()[2], 65536u);

  pb::OpenRegionResponse over_tcp = Granted(3);
  over_tcp.set_over_tcp_reason("the export is GPU memory no NIC of node-b reaches");
  c = carry(over_tcp);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->tcp());
  EXPECT_EQ(links->keys().count(3), 0u);
  EXPECT_EQ(links->staged().count(3), 0u);
  EXPECT_EQ(tcp_.calls.load(), 1);
}

TEST_F(Importer, OpenerRefusesTargetsItCannotOpenBeforeAnyDial) {
  Make(&tcp_);
  RemoteTarget self = Target();
  self.node_name = kSelf;
  RemoteTarget no_port = Target();
  no_port.port = 0;
  RemoteTarget big_port = Target();
  big_port.port = 70000;
  RemoteTarget bad_name = Target();
  bad_name.node_name = "Node_B!";
  for (const RemoteTarget& t : {self, no_port, big_port, bad_name}) {
    absl::StatusOr<RemoteRegionInfo> r = Open(1, Reader(), t);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << t.node_name << " " << t.port;
  }
  EXPECT_EQ(owner_.hellos(), 0);
  EXPECT_EQ(handles_.size(), 0u);
}

TEST_F(Importer, OpenerSaysSoWhenNoCableOrRelayReachesTheOwner) {
  Make(&tcp_);
  RemoteTarget far = Target();
  far.addresses = {"10.9.0.1/24"};
  absl::StatusOr<RemoteRegionInfo> r = Open(1, Reader(), far);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "no node this one knows")) << r.status();
  EXPECT_EQ(owner_.hellos(), 0);
  EXPECT_EQ(opener_->routed_opens(), 0u);
}

TEST_F(Importer, OpenerMakesADirectOpenAHandleOfItsSessionAloneAndDroppingItGivesTheGrantBack) {
  Make(&tcp_);
  owner_.AnswerOpen(Granted(77));
  RemoteTarget t = Target();
  t.name = "kv-cache";
  absl::StatusOr<RemoteRegionInfo> r = Open(3, Reader(), t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->handle & (uint64_t{1} << 63), 0u);
  EXPECT_EQ(r->export_id, 5u);
  EXPECT_EQ(r->size, 4096u);
  EXPECT_EQ(r->owner_name, "writer");
  // The pod's identity as this node's kernel gave it, this daemon's instance, and what the links can take.
  std::vector<pb::OpenRegionRequest> asked = owner_.opens();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].importer().node(), kSelf);
  EXPECT_EQ(asked[0].importer().key(), "uid-1");
  EXPECT_EQ(asked[0].importer().namespace_(), "team");
  EXPECT_EQ(asked[0].importer().pod_name(), "reader");
  EXPECT_EQ(asked[0].importer().annotations().at("podlink.io/peer-group"), "kv");
  EXPECT_EQ(asked[0].name(), "kv-cache");
  EXPECT_EQ(asked[0].caller_instance(), 0xa11ceu);
  EXPECT_FALSE(asked[0].verbs());
  EXPECT_FALSE(asked[0].accepts_staged());
  EXPECT_TRUE(asked[0].accepts_over_tcp());
  EXPECT_FALSE(asked[0].has_route());
  // The session's alone.
  std::optional<Handle> h = handles_.Find(3, r->handle);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->grant, 77u);
  EXPECT_EQ(h->destination, kOwner);
  EXPECT_FALSE(handles_.Find(4, r->handle).has_value());
  EXPECT_EQ(opener_->DropHandle(4, r->handle).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(owner_.closed().empty());
  ASSERT_TRUE(opener_->DropHandle(3, r->handle).ok());
  EXPECT_TRUE(owner_.WaitClosed(77));
  EXPECT_EQ(opener_->DropHandle(3, r->handle).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(handles_.size(), 0u);
}

TEST_F(Importer, OpenerAnswersWithTheOwnersRefusalAndLeavesNoHandle) {
  Make(&tcp_);
  owner_.AnswerOpen({}, grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "reader is not in the peer group"));
  absl::StatusOr<RemoteRegionInfo> r = Open(3, Reader(), Target());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "node node-b: reader is not in the peer group")) << r.status();
  EXPECT_EQ(handles_.size(), 0u);
  EXPECT_TRUE(owner_.closed().empty());  // nothing was granted
}

TEST_F(Importer, OpenerOverRdmaAsksForKeysAndTheLinksCarryThem) {
  Make(&rdma_);
  pb::OpenRegionResponse keyed = Granted(41);
  pb::VerbsKey* k = keyed.add_verbs_keys();
  k->set_device("mlx5_1");
  k->set_rkey(0xbeef);
  owner_.AnswerOpen(keyed);
  absl::StatusOr<RemoteRegionInfo> r = Open(2, Reader(), Target());
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<pb::OpenRegionRequest> asked = owner_.opens();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_TRUE(asked[0].verbs());
  EXPECT_TRUE(asked[0].accepts_staged());
  std::optional<Handle> h = handles_.Find(2, r->handle);
  ASSERT_TRUE(h.has_value());
  auto links = std::dynamic_pointer_cast<FakeLinks>(h->peer->links());
  ASSERT_NE(links, nullptr);
  ASSERT_EQ(links->keys().count(41), 1u);
  EXPECT_EQ(links->keys()[41][0].device, "mlx5_1");
}

TEST_F(Importer, OpenerDroppingASessionGivesBackEveryHandle) {
  Make(&tcp_);
  owner_.AnswerOpen(Granted(10));
  ASSERT_TRUE(Open(5, Reader(), Target()).ok());
  owner_.AnswerOpen(Granted(11));
  ASSERT_TRUE(Open(5, Reader(), Target()).ok());
  owner_.AnswerOpen(Granted(12));
  ASSERT_TRUE(Open(6, Reader(), Target()).ok());
  opener_->DropSession(5);
  EXPECT_TRUE(owner_.WaitClosed(10));
  EXPECT_TRUE(owner_.WaitClosed(11));
  EXPECT_EQ(handles_.OfSession(5).size(), 0u);
  EXPECT_EQ(handles_.OfSession(6).size(), 1u);
}

}  // namespace
}  // namespace podlink::mesh
