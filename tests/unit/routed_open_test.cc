// An open through a relay, its trust chain end to end without gRPC or sockets: the origin's RouteSigner
// (daemon/mesh/importer/routed.h) signs the claim, the relay's RegionOwner checks it and opens onward through its
// importer hook (here: straight into the owner's RegionOwner), the owner checks the claim, decides by its own policy
// and signs its answer, and the origin checks that answer before it makes the sealed route. A relay that alters the
// claim on the way, or the owner's answer on the way back, is caught by the owner or the origin.
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/mesh/importer/routed.h"
#include "daemon/mesh/owner/region_owner.h"
#include "daemon/mesh/seal/seal_crypto.h"
#include "tests/common/memfd_export.h"
#include "tests/common/test_ca.h"

namespace podlink::mesh {
namespace {

namespace pb = podlink::mesh::v1;
using podlink::testing::Sh;
using podlink::testing::TestCa;

class OneExport final : public MeshHost {
 public:
  std::shared_ptr<const ExportRecord> record;
  std::vector<std::string> asked;  // who, as the owner's policy was told
  absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(const PodInfo& pod,
                                                                      const pb::OpenRegionRequest& req) override {
    asked.push_back(absl::StrCat(pod.source, " ", pod.Ref(), " export ", req.export_id()));
    if (req.export_id() != record->id) return absl::NotFoundError("no such export");
    return record;
  }
  bool ExportLive(const ExportRecord&) const override { return true; }
  absl::Status NotifyOwner(const ExportRecord&, uint64_t) override { return absl::OkStatus(); }
};

class RoutedOpen : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Sh("openssl version") != 0) GTEST_SKIP() << "needs the openssl CLI";
    dir_ = absl::StrCat("/tmp/podlink-routed-open-", ::getpid());
    ASSERT_EQ(Sh("rm -rf " + dir_), 0);
    TestCa ca(dir_ + "/ca");
    for (const char* n : {"node-a", "relay", "node-d"}) {
      ca.Issue(n, dir_ + "/" + n);
      creds_[n] = std::make_unique<NodeCredentials>(dir_ + "/" + n, absl::Hours(1));
      ASSERT_TRUE(creds_[n]->Load().ok());
    }
    export_ = podlink::testing::MakeMemfdExport(5, 1 << 20, 0);
    host_.record = export_->record;
    owner_ = std::make_unique<RegionOwner>(RegionOwner::Options{.node_name = "node-d", .instance = 44}, &host_,
                                           creds_["node-d"].get(), &liveness_, &late_, RegionOwner::Rooms{});
    RegionOwner::Rooms rooms;
    // The relay's importer: the next hop's OpenRegion, as node-d's control service would get it from the relay.
    rooms.open_through = [this](const RemoteTarget& hop, pb::OpenRegionRequest req, const std::string& destination,
                                size_t, std::function<void(absl::StatusOr<RegionOwner::Carried>)> got) {
      EXPECT_EQ(hop.node_name, "node-d");
      EXPECT_EQ(destination, "node-d");
      if (alter_claim_) alter_claim_(req);
      owner_->OpenRegionFor("relay", req, [&](absl::StatusOr<pb::OpenRegionResponse> r) {
        if (!r.ok()) return got(r.status());
        if (alter_answer_) alter_answer_(*r);
        got(RegionOwner::Carried{carrier_, *std::move(r)});
      });
    };
    relay_ = std::make_unique<RegionOwner>(RegionOwner::Options{.node_name = "relay", .instance = 33}, &host_,
                                           creds_["relay"].get(), &liveness_, &late_, std::move(rooms));
  }
  void TearDown() override {
    carrier_->Stop();
    Sh("rm -rf " + dir_);
  }

  // node-a's pod team/reader opens export 5 of node-d through the relay; what the relay answered.
  absl::StatusOr<pb::OpenRegionResponse> OpenThroughRelay(uint64_t* nonce, std::shared_ptr<seal::EphemeralKey>* key) {
    RouteSigner origin("node-a", creds_["node-a"].get());
    pb::OpenRegionRequest req;
    pb::ForwardedIdentity* who = req.mutable_importer();
    who->set_node("node-a");
    who->set_key("key-reader");
    who->set_namespace_("team");
    who->set_pod_name("reader");
    req.set_export_id(5);
    RemoteTarget target;
    target.node_name = "node-d";
    target.addresses = {"10.9.0.4/24"};
    target.port = 7446;
    target.export_id = 5;
    absl::Status signed_ok = origin.SignRoute(target, {"relay"}, &req, nonce, key);
    if (!signed_ok.ok()) return signed_ok;
    absl::StatusOr<pb::OpenRegionResponse> out = absl::UnknownError("never answered");
    relay_->OpenRegionFor("node-a", req, [&](absl::StatusOr<pb::OpenRegionResponse> r) { out = std::move(r); });
    return out;
  }
  absl::StatusOr<std::shared_ptr<seal::SealedLinks>> Seal(uint64_t nonce, const seal::EphemeralKey& key,
                                                           const pb::OpenRegionResponse& resp) {
    RouteSigner origin("node-a", creds_["node-a"].get());
    return origin.SealRoute(
        "node-d", nonce, key, [] { return std::shared_ptr<DataLinks>(); },
        [](std::function<void()>) { return false; }, resp);
  }

  std::string dir_;
  std::map<std::string, std::unique_ptr<NodeCredentials>> creds_;
  std::unique_ptr<podlink::testing::MemfdExport> export_;
  OneExport host_;
  Liveness liveness_{absl::Minutes(10), absl::Seconds(1), absl::Seconds(5)};
  LateCopies late_;
  std::shared_ptr<Peer> carrier_ = std::make_shared<Peer>("node-d", /*tcp=*/true);
  std::unique_ptr<RegionOwner> owner_, relay_;
  std::function<void(pb::OpenRegionRequest&)> alter_claim_;
  std::function<void(pb::OpenRegionResponse&)> alter_answer_;
};

TEST_F(RoutedOpen, AnOpenThroughARelayIsSealedEndToEnd) {
  uint64_t nonce = 0;
  std::shared_ptr<seal::EphemeralKey> key;
  absl::StatusOr<pb::OpenRegionResponse> r = OpenThroughRelay(&nonce, &key);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(nonce, 0u);
  EXPECT_EQ(r->instance(), 33u);  // the relay's grant, on which the origin's frames go
  EXPECT_EQ(r->export_id(), 5u);
  // The owner's policy saw the origin's pod, by way of the relay.
  ASSERT_EQ(host_.asked.size(), 1u);
  EXPECT_EQ(host_.asked[0], "mesh:node-a via relay team/reader export 5");
  absl::StatusOr<std::shared_ptr<seal::SealedLinks>> sealed = Seal(nonce, *key, *r);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_NE(*sealed, nullptr);
  EXPECT_EQ(relay_->grants().counts().relayed, 1u);
  EXPECT_EQ(owner_->grants().counts().grants, 1u);
}

TEST_F(RoutedOpen, AnAnswerTheRelayAlteredOrOfAnotherClaimIsRefusedByTheOrigin) {
  uint64_t nonce = 0;
  std::shared_ptr<seal::EphemeralKey> key;
  absl::StatusOr<pb::OpenRegionResponse> r = OpenThroughRelay(&nonce, &key);
  ASSERT_TRUE(r.ok()) << r.status();
  // The relay puts its own seal key in the owner's place, to read what the origin seals.
  absl::StatusOr<seal::EphemeralKey> mine = seal::EphemeralKey::Generate();
  ASSERT_TRUE(mine.ok());
  pb::OpenRegionResponse swapped = *r;
  swapped.set_seal_key(mine->public_key());
  EXPECT_EQ(Seal(nonce, *key, swapped).status().code(), absl::StatusCode::kPermissionDenied);
  // Or a smaller window, or another size of the export.
  pb::OpenRegionResponse window = *r;
  window.set_window_bytes(r->window_bytes() / 2);
  EXPECT_FALSE(Seal(nonce, *key, window).ok());
  pb::OpenRegionResponse size = *r;
  size.set_size(r->size() * 2);
  EXPECT_EQ(Seal(nonce, *key, size).status().code(), absl::StatusCode::kPermissionDenied);
  // An answer the owner gave another claim (replayed by the relay) is not this one's.
  EXPECT_EQ(Seal(nonce + 1, *key, *r).status().code(), absl::StatusCode::kPermissionDenied);
  // The genuine answer still passes.
  EXPECT_TRUE(Seal(nonce, *key, *r).ok());
}

TEST_F(RoutedOpen, AClaimTheRelayAlteredIsRefusedByTheOwner) {
  alter_claim_ = [](pb::OpenRegionRequest& req) {
    pb::OriginClaim claim;
    ASSERT_TRUE(claim.ParseFromString(req.route().claim()));
    claim.mutable_importer()->set_pod_name("another-pod");  // speak for another pod of node-a
    claim.SerializeToString(req.mutable_route()->mutable_claim());
  };
  uint64_t nonce = 0;
  std::shared_ptr<seal::EphemeralKey> key;
  absl::StatusOr<pb::OpenRegionResponse> r = OpenThroughRelay(&nonce, &key);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_TRUE(host_.asked.empty()) << "the owner's policy was asked for an altered claim";
  EXPECT_EQ(owner_->grants().counts().grants, 0u);
  EXPECT_EQ(relay_->grants().counts().grants, 0u);
}

}  // namespace
}  // namespace podlink::mesh
