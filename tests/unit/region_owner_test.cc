// The owner's room (daemon/mesh/owner/region_owner.h) without an engine, gRPC or a peer daemon: opens of this
// node's exports for pods of other nodes, the identities and claims it refuses, the limits, restarts and withdrawn
// exports, the frames it serves on a grant (and on nobody else's), a relay's open through the importer's hook, a
// sealed grant whose frames never reach the export, and nothing granted once stopping. The other rooms are fakes
// behind RegionOwner::Rooms; a data connection is a socketpair.
#include "daemon/mesh/owner/region_owner.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/unique_fd.h"
#include "daemon/mesh/trust/origin_sign.h"
#include "daemon/mesh/seal/seal_crypto.h"
#include "daemon/mesh/tcp/conn_writer.h"
#include "tests/common/memfd_export.h"
#include "tests/common/test_ca.h"

namespace podlink::mesh {
namespace {

namespace pb = podlink::mesh::v1;
using podlink::testing::ReadFile;
using podlink::testing::Sh;
using podlink::testing::TestCa;

constexpr uint64_t kSize = 64 << 10;

std::unique_ptr<podlink::testing::MemfdExport> MakeExport(uint64_t id) {
  return podlink::testing::MakeMemfdExport(id, kSize, 0x11);
}

// Policy as the broker would answer it: pods named "denied-*" are refused; withdrawn exports are not live.
class FakeHost final : public MeshHost {
 public:
  std::shared_ptr<const ExportRecord> record;
  std::set<uint64_t> withdrawn;
  std::vector<std::string> asked;  // PodInfo::source of each question
  absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(const PodInfo& pod,
                                                                      const pb::OpenRegionRequest&) override {
    asked.push_back(pod.source);
    if (absl::StartsWith(pod.name, "denied-")) return absl::PermissionDeniedError("not in the export's peer group");
    return record;
  }
  bool ExportLive(const ExportRecord& rec) const override { return !withdrawn.contains(rec.id); }
  absl::Status NotifyOwner(const ExportRecord&, uint64_t value) override {
    notified.push_back(value);
    return absl::OkStatus();
  }
  std::vector<uint64_t> notified;
  // What the API server would say of other nodes' pods.
  bool tracks = false;
  std::set<std::string> gone_uids;
  bool TracksRemotePods() const override { return tracks; }
  bool RemotePodGone(const std::string& pod_uid) const override { return gone_uids.contains(pod_uid); }
};

pb::OpenRegionRequest RequestOf(const std::string& node, const std::string& pod, uint64_t instance = 0) {
  pb::OpenRegionRequest req;
  pb::ForwardedIdentity* who = req.mutable_importer();
  who->set_node(node);
  who->set_key(absl::StrCat("key-", pod));
  who->set_namespace_("team");
  who->set_pod_name(pod);
  req.set_export_id(1);
  req.set_caller_instance(instance);
  return req;
}

class RegionOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Sh("openssl version") != 0) GTEST_SKIP() << "needs the openssl CLI";
    dir_ = absl::StrCat("/tmp/podlink-region-owner-", ::getpid());
    ASSERT_EQ(Sh("rm -rf " + dir_), 0);
    TestCa ca(dir_ + "/ca");
    for (const char* n : {"node-a", "relay", "self"}) ca.Issue(n, dir_ + "/" + n);
    export_ = MakeExport(1);
    host_.record = export_->record;
  }
  void TearDown() override { Sh("rm -rf " + dir_); }

  // An owner named `name` with its own certificates and the fakes of the other rooms.
  std::unique_ptr<RegionOwner> MakeOwner(const std::string& name, GrantTable::Limits limits = {}) {
    creds_ = std::make_unique<NodeCredentials>(dir_ + "/" + name, absl::Hours(1));
    EXPECT_TRUE(creds_->Load().ok());
    RegionOwner::Rooms rooms;
    rooms.unregister_verbs = [this](const std::string& node, uint64_t grant) {
      absl::MutexLock l(&mu_);
      unregistered_.push_back(absl::StrCat(node, "/", grant));
    };
    rooms.known = [](const std::string&) { return std::nullopt; };
    rooms.open_through = [this](const RemoteTarget& hop, pb::OpenRegionRequest req, const std::string& destination,
                                size_t relays, std::function<void(absl::StatusOr<RegionOwner::Carried>)> got) {
      {
        absl::MutexLock l(&mu_);
        hops_.push_back(absl::StrCat(hop.node_name, " ", hop.addresses.empty() ? "" : hop.addresses[0], ":",
                                     hop.port, " to ", destination, " relays ", relays,
                                     req.has_route() ? " routed" : ""));
      }
      pb::OpenRegionResponse resp;
      resp.set_grant(777);
      resp.set_size(kSize);
      resp.set_instance(9);
      got(RegionOwner::Carried{next_peer_, resp});
    };
    return std::make_unique<RegionOwner>(
        RegionOwner::Options{.node_name = name, .instance = 4242, .limits = limits}, &host_, creds_.get(), &liveness_,
        &late_, std::move(rooms));
  }
  static absl::StatusOr<pb::OpenRegionResponse> Open(RegionOwner& o, const std::string& caller,
                                                    const pb::OpenRegionRequest& req) {
    absl::StatusOr<pb::OpenRegionResponse> out = absl::UnknownError("never answered");
    o.OpenRegionFor(caller, req, [&](absl::StatusOr<pb::OpenRegionResponse> r) { out = std::move(r); });
    return out;
  }
  // `req` routed: the claim of origin `origin` (signed with its key unless `signer` says whose), through `via`
  // to `destination`.
  void Route(pb::OpenRegionRequest* req, const std::string& origin, const std::vector<std::string>& via,
             const std::string& destination, int64_t issued_ago_s = 0, const std::string& signer = "") {
    pb::OriginClaim claim;
    claim.set_origin(origin);
    *claim.mutable_importer() = req->importer();
    claim.mutable_destination()->set_node(destination);
    claim.mutable_destination()->add_addresses("10.9.0.4/24");
    claim.mutable_destination()->set_port(7446);
    for (const std::string& v : via) claim.add_via(v);
    claim.set_export_id(1);
    claim.set_issued_unix_seconds(absl::ToUnixSeconds(absl::Now()) - issued_ago_s);
    claim.set_nonce(0x5eed);
    absl::StatusOr<seal::EphemeralKey> key = seal::EphemeralKey::Generate();
    ASSERT_TRUE(key.ok());
    claim.set_seal_key(key->public_key());
    pb::Route* route = req->mutable_route();
    claim.SerializeToString(route->mutable_claim());
    const std::string who = signer.empty() ? origin : signer;
    absl::StatusOr<std::string> sig = SignWithKey(ReadFile(dir_ + "/" + who + "/tls.key"), route->claim());
    ASSERT_TRUE(sig.ok()) << sig.status();
    route->set_signature(*sig);
    route->set_origin_cert(ReadFile(dir_ + "/" + origin + "/tls.crt"));
  }

  std::string dir_;
  std::unique_ptr<podlink::testing::MemfdExport> export_;
  FakeHost host_;
  std::unique_ptr<NodeCredentials> creds_;
  Liveness liveness_{absl::Minutes(10), absl::Seconds(1), absl::Seconds(5)};
  LateCopies late_;
  std::shared_ptr<Peer> next_peer_ = std::make_shared<Peer>("dest", /*tcp=*/true);
  absl::Mutex mu_;
  std::vector<std::string> unregistered_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> hops_ ABSL_GUARDED_BY(mu_);
};

TEST_F(RegionOwnerTest, OpensAnExportForAPodOfTheCallingNode) {
  auto owner = MakeOwner("self");
  absl::StatusOr<pb::OpenRegionResponse> r = Open(*owner, "node-a", RequestOf("node-a", "reader"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->grant(), 0u);
  EXPECT_EQ(r->export_id(), 1u);
  EXPECT_EQ(r->size(), kSize);
  EXPECT_EQ(r->instance(), 4242u);
  EXPECT_EQ(r->owner_namespace(), "team");
  EXPECT_EQ(owner->grants().counts().grants, 1u);
  ASSERT_EQ(host_.asked.size(), 1u);
  EXPECT_EQ(host_.asked[0], "mesh:node-a");
  absl::StatusOr<std::shared_ptr<const ExportRecord>> rec = owner->GrantedExport("node-a", r->grant());
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(*rec, export_->record);
  // The grant is node-a's alone.
  EXPECT_EQ(owner->GrantedExport("node-b", r->grant()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RegionOwnerTest, RefusesWhatTheCallerCannotSpeakFor) {
  auto owner = MakeOwner("self");
  absl::StatusOr<pb::OpenRegionResponse> r = Open(*owner, "self", RequestOf("self", "reader"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();  // this node's own name
  r = Open(*owner, "node-a", RequestOf("node-b", "reader"));  // a pod of another node
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "cannot open regions for pods of node 'node-b'"));
  pb::OpenRegionRequest nameless = RequestOf("node-a", "reader");
  nameless.mutable_importer()->clear_pod_name();
  EXPECT_EQ(Open(*owner, "node-a", nameless).status().code(), absl::StatusCode::kInvalidArgument);
  r = Open(*owner, "node-a", RequestOf("node-a", "denied-pod"));  // the host's policy
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  // A route's field without a claim that checks is no open at all.
  pb::OpenRegionRequest forged = RequestOf("node-a", "reader");
  forged.mutable_route()->set_claim("not a claim");
  EXPECT_EQ(Open(*owner, "node-a", forged).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(owner->counters().denials.load(), 3u);  // the other node's pod, the policy, the claim
  EXPECT_EQ(owner->grants().counts().grants, 0u);
}

TEST_F(RegionOwnerTest, HoldsEachPodAndNodeToItsLimit) {
  auto owner = MakeOwner("self", GrantTable::Limits{.per_node = 3, .per_pod = 2, .per_tenant = 10});
  ASSERT_TRUE(Open(*owner, "node-a", RequestOf("node-a", "p1")).ok());
  ASSERT_TRUE(Open(*owner, "node-a", RequestOf("node-a", "p1")).ok());
  absl::StatusOr<pb::OpenRegionResponse> r = Open(*owner, "node-a", RequestOf("node-a", "p1"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "pod team/p1 holds 2 regions")) << r.status();
  ASSERT_TRUE(Open(*owner, "node-a", RequestOf("node-a", "p2")).ok());
  r = Open(*owner, "node-a", RequestOf("node-a", "p3"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "node node-a holds 3 grants")) << r.status();
}

TEST_F(RegionOwnerTest, ARestartedNodeAndAWithdrawnExportLoseTheirGrants) {
  auto owner = MakeOwner("self");
  absl::StatusOr<pb::OpenRegionResponse> old = Open(*owner, "node-a", RequestOf("node-a", "p1", /*instance=*/1));
  ASSERT_TRUE(old.ok());
  owner->SeenInstance("node-a", 1);  // the same daemon: nothing happens
  EXPECT_EQ(owner->grants().counts().grants, 1u);
  owner->SeenInstance("node-a", 2);  // restarted
  EXPECT_EQ(owner->grants().counts().grants, 0u);
  EXPECT_EQ(owner->GrantedExport("node-a", old->grant()).status().code(), absl::StatusCode::kNotFound);
  {
    absl::MutexLock l(&mu_);
    ASSERT_EQ(unregistered_.size(), 1u);  // its RDMA registration went too
    EXPECT_EQ(unregistered_[0], absl::StrCat("node-a/", old->grant()));
  }
  absl::StatusOr<pb::OpenRegionResponse> r = Open(*owner, "node-a", RequestOf("node-a", "p1", 2));
  ASSERT_TRUE(r.ok());
  host_.withdrawn.insert(1);
  absl::StatusOr<std::shared_ptr<const ExportRecord>> rec = owner->GrantedExport("node-a", r->grant());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(rec.status().message(), "withdrawn")) << rec.status();
  EXPECT_EQ(owner->grants().counts().grants, 0u);
}

// One frame of a data connection served as TcpDataServer would hand it over: the header read, a WRITE's payload
// still in the socket. Returns the answer's header (and a DATA frame's payload in *data).
FrameHeader Serve(RegionOwner& owner, LateCopies& late, const std::string& node, FrameType type, uint64_t grant,
                  uint64_t offset, const std::string& payload, uint32_t length, std::string* data = nullptr) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd ours(sv[0]), theirs(sv[1]);
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = static_cast<uint16_t>(type);
  h.length = length;
  h.tag = uint64_t{7} << 32 | 1;
  h.grant = grant;
  h.offset = offset;
  if (type == FrameType::kWrite) {
    EXPECT_EQ(::write(theirs.get(), payload.data(), payload.size()), static_cast<ssize_t>(payload.size()));
    EXPECT_TRUE(late.BeginWrite({node, 1, TransferOfTag(h.tag)}));  // as the data server registers a write
  }
  auto writer = std::make_shared<ConnWriter>(ours.get());
  EXPECT_TRUE(owner.ServeGrantFrame(writer, ours.get(), h, node, 1).ok());
  FrameHeader a{};
  EXPECT_TRUE(ReadFull(theirs.get(), &a, sizeof(a)).ok());
  if (a.type == static_cast<uint16_t>(FrameType::kData) && data != nullptr) {
    data->resize(a.length);
    EXPECT_TRUE(ReadFull(theirs.get(), data->data(), a.length).ok());
  }
  writer->Close();
  return a;
}

TEST_F(RegionOwnerTest, ServesFramesOnItsGrantsAndNobodyElses) {
  auto owner = MakeOwner("self");
  absl::StatusOr<pb::OpenRegionResponse> r = Open(*owner, "node-a", RequestOf("node-a", "p1"));
  ASSERT_TRUE(r.ok());
  const std::string bytes(4096, 'w');
  FrameHeader a = Serve(*owner, late_, "node-a", FrameType::kWrite, r->grant(), 8192, bytes, bytes.size());
  EXPECT_EQ(a.type, static_cast<uint16_t>(FrameType::kAck));
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(std::memcmp(export_->bytes + 8192, bytes.data(), bytes.size()), 0);
  EXPECT_EQ(export_->bytes[8191], 0x11);
  EXPECT_EQ(export_->bytes[8192 + 4096], 0x11);
  std::string got;
  a = Serve(*owner, late_, "node-a", FrameType::kRead, r->grant(), 8190, "", 8, &got);
  EXPECT_EQ(a.type, static_cast<uint16_t>(FrameType::kData));
  EXPECT_EQ(got, std::string("\x11\x11wwwwww", 8));
  EXPECT_EQ(owner->counters().bytes_written_in.load(), 4096u);
  EXPECT_EQ(owner->counters().bytes_read_out.load(), 8u);

  // Another node's frames on node-a's grant, a range past the export, and a write whose pages are gone: refused,
  // and the export is untouched.
  const std::string poison(64, 'x');
  a = Serve(*owner, late_, "node-b", FrameType::kWrite, r->grant(), 0, poison, poison.size());
  EXPECT_EQ(a.status, static_cast<int32_t>(absl::StatusCode::kNotFound));
  a = Serve(*owner, late_, "node-a", FrameType::kWrite, r->grant(), kSize - 32, poison, poison.size());
  EXPECT_EQ(a.status, static_cast<int32_t>(absl::StatusCode::kOutOfRange));
  ASSERT_EQ(::fallocate(export_->fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
  a = Serve(*owner, late_, "node-a", FrameType::kWrite, r->grant(), 0, poison, poison.size());
  EXPECT_NE(a.status, 0);
  for (uint64_t i = 0; i < kSize; ++i) {
    ASSERT_NE(export_->bytes[i], 'x') << "a refused frame landed at " << i;
  }
  a = Serve(*owner, late_, "node-a", FrameType::kNotify, r->grant(), 99, "", 0);
  EXPECT_EQ(a.status, 0);
  EXPECT_EQ(host_.notified, std::vector<uint64_t>{99});
}

TEST_F(RegionOwnerTest, RelaysAClaimedOpenThroughTheImporterAndGrantsItsOwn) {
  auto relay = MakeOwner("relay");
  pb::OpenRegionRequest req = RequestOf("node-a", "p1");
  Route(&req, "node-a", {"relay"}, "dest");
  absl::StatusOr<pb::OpenRegionResponse> r = Open(*relay, "node-a", req);
  ASSERT_TRUE(r.ok()) << r.status();
  {
    absl::MutexLock l(&mu_);
    // On to the destination at the addresses its origin signed, the route still signed, no relay after this one.
    ASSERT_EQ(hops_.size(), 1u);
    EXPECT_EQ(hops_[0], "dest 10.9.0.4/24:7446 to dest relays 0 routed");
  }
  EXPECT_NE(r->grant(), 777u);  // the relay's own grant, never the next node's
  EXPECT_EQ(r->instance(), 4242u);
  EXPECT_EQ(relay->counters().relayed_opens.load(), 1u);
  EXPECT_EQ(relay->grants().counts().relayed, 1u);
  EXPECT_TRUE(host_.asked.empty());  // a relay asks no policy of its own: the destination decides
  // No export of this node is behind a relay's grant.
  EXPECT_EQ(relay->GrantedExport("node-a", r->grant()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(relay->grants().counts().relayed, 1u);

  // The claim must come from the hop before this one, be fresh, and be signed by its origin.
  absl::StatusOr<pb::OpenRegionResponse> bad = Open(*relay, "self", req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "is not the hop before")) << bad.status();
  pb::OpenRegionRequest stale = RequestOf("node-a", "p1");
  Route(&stale, "node-a", {"relay"}, "dest", /*issued_ago_s=*/600);
  bad = Open(*relay, "node-a", stale);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "stale")) << bad.status();
  pb::OpenRegionRequest forged = RequestOf("node-a", "p1");
  Route(&forged, "node-a", {"relay"}, "dest", 0, /*signer=*/"self");
  EXPECT_EQ(Open(*relay, "node-a", forged).status().code(), absl::StatusCode::kPermissionDenied);
  // A relay after this one must be known here (routing's hook knows none).
  pb::OpenRegionRequest longer = RequestOf("node-a", "p1");
  Route(&longer, "node-a", {"relay", "elsewhere"}, "dest");
  bad = Open(*relay, "node-a", longer);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "does not know node elsewhere")) << bad.status();
  absl::MutexLock l(&mu_);
  EXPECT_EQ(hops_.size(), 1u);
}

TEST_F(RegionOwnerTest, ASealedGrantsFramesLandInItsWindowNeverInTheExport) {
  auto owner = MakeOwner("self");
  pb::OpenRegionRequest req = RequestOf("node-a", "p1");
  Route(&req, "node-a", {"relay"}, "self");
  absl::StatusOr<pb::OpenRegionResponse> r = Open(*owner, "relay", req);  // the last relay calls the owner
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->seal_key().size(), 32u);
  EXPECT_NE(r->window_bytes(), 0u);
  EXPECT_FALSE(r->owner_answer().empty());  // signed for the origin to check
  ASSERT_EQ(host_.asked.size(), 1u);
  EXPECT_EQ(host_.asked[0], "mesh:node-a via relay");
  // The relay writes what it likes into the window: nothing of it reaches the export unverified.
  const std::string junk(512, 'j');
  FrameHeader a = Serve(*owner, late_, "relay", FrameType::kWrite, r->grant(), 0, junk, junk.size());
  EXPECT_EQ(a.type, static_cast<uint16_t>(FrameType::kAck));
  for (uint64_t i = 0; i < kSize; ++i) ASSERT_EQ(export_->bytes[i], 0x11) << "an unsealed frame landed at " << i;
  a = Serve(*owner, late_, "relay", FrameType::kNotify, r->grant(), 5, "", 0);
  EXPECT_EQ(a.status, static_cast<int32_t>(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(host_.notified.empty());
}

TEST_F(RegionOwnerTest, TheGrantsOfAnImportingPodTheApiServerSaysIsGoneAreDropped) {
  auto owner = MakeOwner("self");
  pb::OpenRegionRequest reader = RequestOf("node-a", "reader"), writer = RequestOf("node-a", "writer");
  reader.mutable_importer()->set_pod_uid("uid-reader");
  writer.mutable_importer()->set_pod_uid("uid-writer");
  absl::StatusOr<pb::OpenRegionResponse> r = Open(*owner, "node-a", reader);
  absl::StatusOr<pb::OpenRegionResponse> w = Open(*owner, "node-a", writer);
  ASSERT_TRUE(r.ok() && w.ok());
  host_.gone_uids = {"uid-reader"};
  owner->DropGrantsOfGonePods();  // this node does not follow other nodes' pods: nothing is dropped
  EXPECT_EQ(owner->grants().counts().grants, 2u);
  host_.tracks = true;
  owner->DropGrantsOfGonePods();
  EXPECT_EQ(owner->grants().counts().grants, 1u);
  EXPECT_EQ(owner->counters().gone_pod_grants_dropped.load(), 1u);
  EXPECT_EQ(owner->GrantedExport("node-a", r->grant()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(owner->GrantedExport("node-a", w->grant()).ok());
}

TEST_F(RegionOwnerTest, NothingIsGrantedOnceStopping) {
  auto owner = MakeOwner("relay");
  ASSERT_TRUE(Open(*owner, "node-a", RequestOf("node-a", "p1")).ok());
  owner->BeginStop();
  std::map<uint64_t, Grant> held = owner->CloseAll();
  EXPECT_EQ(held.size(), 1u);
  absl::StatusOr<pb::OpenRegionResponse> r = Open(*owner, "node-a", RequestOf("node-a", "p2"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  pb::OpenRegionRequest req = RequestOf("node-a", "p1");
  Route(&req, "node-a", {"relay"}, "dest");
  r = Open(*owner, "node-a", req);  // a relay's open: the next hop answered, but no grant is installed
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(owner->grants().counts().grants, 0u);
}

}  // namespace
}  // namespace podlink::mesh
